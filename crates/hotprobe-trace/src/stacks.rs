//! `stacks.tsv` (format version 4): the user stacks `record --stacks`
//! captured at function entries, counted in the target and symbolized by
//! the recorder — one line per distinct stack of a function:
//!
//! ```text
//! count<TAB>truncated<TAB>function<TAB>caller;caller's caller;…
//! ```
//!
//! (`truncated` is 0 or 1; callers innermost first; a header line first).
//! `report --callers` and `export --format folded` read them. The file is
//! untrusted input: a malformed line is an error naming it, never a panic.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::Result;
use crate::stacks_tsv::{format_stack, parse_number, parse_stack, read_tsv, write_tsv};

/// The file's name in a trace directory.
pub const STACKS_FILE: &str = "stacks.tsv";
const HEADER: &str = "count\ttruncated\tfunction\tcallers";

/// One distinct stack of a function, as captured.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapturedStack {
    /// The probed function.
    pub function: String,
    /// Its callers, innermost first.
    pub callers: Vec<String>,
    /// The walk stopped before the outermost frame.
    pub truncated: bool,
    /// Calls with this stack.
    pub count: u64,
}

/// Writes `stacks` to `dir/stacks.tsv`.
pub fn write_stacks(dir: &Path, stacks: &[CapturedStack]) -> Result<()> {
    let mut s = String::new();
    for st in stacks {
        s.push_str(&format!(
            "{}\t{}\n",
            st.count,
            format_stack(&st.function, &st.callers, st.truncated)
        ));
    }
    write_tsv(&dir.join(STACKS_FILE), HEADER, &s)
}

/// The stacks of the trace in `dir`; `None` when it has none (recorded
/// without `--stacks`, or by a version before 4).
pub fn read_stacks(dir: &Path) -> Result<Option<Vec<CapturedStack>>> {
    let mut out = Vec::new();
    let found = read_tsv(&dir.join(STACKS_FILE), HEADER, |f, bad| {
        let [count, trunc, function, callers] = f else {
            return Err(bad("not 4 tab-separated fields"));
        };
        let count = parse_number(count, "count is not a number", bad)?;
        let (function, callers, truncated) = parse_stack(trunc, function, callers, bad)?;
        out.push(CapturedStack {
            function,
            callers,
            truncated,
            count,
        });
        Ok(())
    })?;
    Ok(found.then_some(out))
}

/// The stacks in folded form (`outermost;…;caller;function count`, one
/// line each, lines sorted), as flame graph tools read it; stacks whose
/// names are equal are added up. A truncated stack starts with
/// `[truncated]`.
pub fn folded_stacks(stacks: &[CapturedStack]) -> String {
    folded_map(stacks, None)
        .into_iter()
        .map(|(k, n)| format!("{k} {n}\n"))
        .collect()
}

/// [`folded_stacks`] as a map from the folded stack to its count, each
/// stack starting with `prefix` (`tid-N`) when one is given; what a
/// flame graph of the stacks draws.
pub fn folded_map(stacks: &[CapturedStack], prefix: Option<&str>) -> BTreeMap<String, u64> {
    let mut lines: BTreeMap<String, u64> = BTreeMap::new();
    for s in stacks {
        let mut frames: Vec<&str> = Vec::new();
        frames.extend(prefix);
        if s.truncated {
            frames.push("[truncated]");
        }
        frames.extend(s.callers.iter().rev().map(String::as_str));
        frames.push(&s.function);
        *lines.entry(frames.join(";")).or_default() += s.count;
    }
    lines
}

/// The direct callers of `function` (a glob, see [`crate::filter`]'s
/// patterns) with their call counts, most calls first; each with the
/// distinct call paths below it (callers innermost first, and their counts).
pub fn callers_of(stacks: &[CapturedStack], matches: impl Fn(&str) -> bool) -> Vec<Callers> {
    let mut by: Vec<Callers> = Vec::new();
    for s in stacks.iter().filter(|s| matches(&s.function)) {
        let caller = s
            .callers
            .first()
            .cloned()
            .unwrap_or_else(|| "[unknown]".into());
        let i = match by
            .iter()
            .position(|c| c.function == s.function && c.caller == caller)
        {
            Some(i) => i,
            None => {
                by.push(Callers {
                    function: s.function.clone(),
                    caller,
                    count: 0,
                    paths: Vec::new(),
                });
                by.len() - 1
            }
        };
        let c = &mut by[i];
        c.count += s.count;
        match c
            .paths
            .iter_mut()
            .find(|(p, t, _)| *p == s.callers && *t == s.truncated)
        {
            Some(p) => p.2 += s.count,
            None => c.paths.push((s.callers.clone(), s.truncated, s.count)),
        }
    }
    for c in &mut by {
        c.paths
            .sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(&b.0)));
    }
    by.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| a.function.cmp(&b.function))
            .then_with(|| a.caller.cmp(&b.caller))
    });
    by
}

/// One direct caller of a function, from captured stacks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Callers {
    /// The function called.
    pub function: String,
    /// The caller.
    pub caller: String,
    /// Calls from it.
    pub count: u64,
    /// The full stacks through it: callers innermost first, truncated,
    /// count.
    pub paths: Vec<(Vec<String>, bool, u64)>,
}
