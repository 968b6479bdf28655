//! Folded stacks (`a;b;c VALUE` lines) for flamegraph.pl and inferno.

use std::collections::BTreeMap;
use std::io::Write;

use crate::analysis::{CallStack, Progress, Step};
use crate::error::{Result, TraceError};
use crate::reader::TraceReader;

/// What each folded line counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FoldedValue {
    /// Self time in ns of the calls with that stack (a time flame graph).
    #[default]
    SelfNs,
    /// Number of calls with that stack.
    Calls,
}

/// Options of [`export_folded`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FoldedOptions {
    /// The value.
    pub value: FoldedValue,
    /// Start each stack with `tid-<TID>`.
    pub per_thread: bool,
}

/// Writes one `frame;frame;… VALUE` line per distinct stack, sorted; lines
/// whose value is 0 are left out. Returns the number of lines.
pub fn export_folded(
    reader: &TraceReader,
    out: &mut impl Write,
    opts: FoldedOptions,
    mut progress: Progress<'_>,
) -> Result<u64> {
    let syms = reader.symbols();
    let mut acc: BTreeMap<String, u64> = BTreeMap::new();
    let total = reader.total_bytes();
    let mut done = 0;
    for st in reader.threads()? {
        let path = st.path().to_path_buf();
        let mut names: Vec<String> = Vec::new();
        if opts.per_thread {
            names.push(format!("tid-{}", st.tid()));
        }
        let base = names.len();
        let mut cs = CallStack::new();
        let mut visit = |s: Step| match s {
            Step::Enter { probe, .. } => names.push(syms.name(probe).replace(';', ":")),
            Step::Leave {
                probe,
                self_ns,
                leaf,
                ..
            } => {
                if leaf {
                    names.push(syms.name(probe).replace(';', ":"));
                }
                let v = match opts.value {
                    FoldedValue::SelfNs => self_ns,
                    FoldedValue::Calls => 1,
                };
                *acc.entry(names.join(";")).or_insert(0) += v;
                if names.len() > base {
                    names.pop();
                }
            }
            _ => {}
        };
        for r in st {
            cs.feed(&r?, &mut visit);
        }
        cs.finish(&mut visit);
        done += std::fs::metadata(&path).map_or(0, |m| m.len());
        if let Some(p) = progress.as_mut() {
            p(done, total);
        }
    }
    let mut n = 0;
    for (k, v) in acc {
        if v == 0 {
            continue;
        }
        writeln!(out, "{k} {v}").map_err(|e| TraceError::io("<folded output>", e))?;
        n += 1;
    }
    Ok(n)
}
