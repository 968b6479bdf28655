//! Folded stacks (`a;b;c VALUE` lines) for flamegraph.pl and inferno.

use std::collections::BTreeMap;
use std::io::Write;

use crate::analysis::{visit_threads, Progress, Step};
use crate::error::{Result, TraceError};
use crate::query::CompiledQuery;
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
    progress: Progress<'_>,
) -> Result<u64> {
    export_folded_filtered(reader, &CompiledQuery::all(), out, opts, progress)
}

/// [`export_folded`] of the calls `query` keeps.
pub fn export_folded_filtered(
    reader: &TraceReader,
    query: &CompiledQuery,
    out: &mut impl Write,
    opts: FoldedOptions,
    progress: Progress<'_>,
) -> Result<u64> {
    let acc = folded_stacks(reader, query, opts, progress)?;
    let mut n = 0;
    for (k, v) in acc {
        writeln!(out, "{k} {v}").map_err(|e| TraceError::io("<folded output>", e))?;
        n += 1;
    }
    Ok(n)
}

/// The folded stacks of the calls `query` keeps: stack (`a;b;c`, `;` in
/// names replaced by `:`) → value, values of 0 left out. A function probed
/// through a trap (the trace's `costs.tsv`) has its mechanism after its
/// name, `s1 [in-process trap]`, as `report` marks its row `*`: its hits
/// cost µs each (a suffix flamegraph.pl and inferno keep as part of the
/// frame's name).
pub fn folded_stacks(
    reader: &TraceReader,
    query: &CompiledQuery,
    opts: FoldedOptions,
    progress: Progress<'_>,
) -> Result<BTreeMap<String, u64>> {
    let syms = reader.symbols();
    let frame = |probe: u32| {
        let name = syms.name(probe).replace(';', ":");
        match reader.trap_of(probe) {
            Some(label) => format!("{name} [{label}]"),
            None => name,
        }
    };
    let mut acc: BTreeMap<String, u64> = BTreeMap::new();
    let mut names: Vec<String> = Vec::new();
    let mut cur: Option<u32> = None;
    let mut base = 0;
    visit_threads(reader, query, progress, |tid, s| {
        if cur != Some(tid) {
            cur = Some(tid);
            names.clear();
            if opts.per_thread {
                names.push(format!("tid-{tid}"));
            }
            base = names.len();
        }
        match s {
            Step::Enter { probe, .. } => names.push(frame(probe)),
            Step::Leave {
                probe,
                self_ns,
                leaf,
                ..
            } => {
                if leaf {
                    names.push(frame(probe));
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
        }
    })?;
    acc.retain(|_, v| *v > 0);
    Ok(acc)
}
