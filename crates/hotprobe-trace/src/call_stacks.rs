//! `call_stacks.tsv` (format version 5): the user stack of each recorded
//! call, for a trace recorded with `--stacks` where the agent walked the
//! stacks (an entry event carries its stack's id). Two kinds of lines
//! after a header:
//!
//! ```text
//! s<TAB>id<TAB>truncated<TAB>function<TAB>caller;caller's caller;…
//! c<TAB>tid<TAB>entry<TAB>id
//! ```
//!
//! `s` names a distinct stack; `c` gives the `entry`-th entry of thread
//! `tid`'s stream (counted from 1 over its entry and call records, in
//! stream order) stack `id`. `replay` shows each call's stack, `report
//! --callers` and `export --format folded` count calls from them. The file
//! is untrusted input: a malformed line is an error naming it, never a
//! panic.

use std::collections::HashMap;
use std::path::Path;

use crate::analysis::{CallStack, Progress, Step};
use crate::error::{Result, TraceError};
use crate::event::Record;
use crate::query::{CompiledQuery, QueryStack};
use crate::reader::TraceReader;
use crate::stacks::CapturedStack;
use crate::stacks_tsv::{format_stack, parse_number, parse_stack, read_tsv, write_tsv};

/// The file's name in a trace directory.
pub const CALL_STACKS_FILE: &str = "call_stacks.tsv";
const HEADER: &str = "kind\tfields";

/// The stacks of a trace's recorded calls.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallStacks {
    /// Stack id → the function called, its callers (innermost first),
    /// truncated.
    pub stacks: HashMap<u32, (String, Vec<String>, bool)>,
    /// (thread, entry number from 1) → stack id.
    pub calls: HashMap<(u32, u64), u32>,
}

impl CallStacks {
    /// The stack of the `entry`-th entry of thread `tid`: function,
    /// callers, truncated.
    pub fn of_call(&self, tid: u32, entry: u64) -> Option<&(String, Vec<String>, bool)> {
        self.stacks.get(self.calls.get(&(tid, entry))?)
    }

    /// The stacks counted in calls, most calls first (as `stacks.tsv`
    /// has them), for `report --callers` and folding.
    pub fn counted(&self) -> Vec<CapturedStack> {
        self.count(self.calls.values())
    }

    /// [`CallStacks::counted`] per thread, in tid order.
    pub fn counted_by_thread(&self) -> Vec<(u32, Vec<CapturedStack>)> {
        let mut by: std::collections::BTreeMap<u32, Vec<&u32>> = Default::default();
        for ((tid, _), id) in &self.calls {
            by.entry(*tid).or_default().push(id);
        }
        by.into_iter()
            .map(|(tid, ids)| (tid, self.count(ids.into_iter())))
            .collect()
    }

    fn count<'a>(&self, ids: impl Iterator<Item = &'a u32>) -> Vec<CapturedStack> {
        let mut n: HashMap<u32, u64> = HashMap::new();
        for id in ids {
            *n.entry(*id).or_default() += 1;
        }
        let mut out: Vec<CapturedStack> = n
            .into_iter()
            .filter_map(|(id, count)| {
                let (function, callers, truncated) = self.stacks.get(&id)?;
                Some(CapturedStack {
                    function: function.clone(),
                    callers: callers.clone(),
                    truncated: *truncated,
                    count,
                })
            })
            .collect();
        out.sort_by(|a, b| {
            b.count
                .cmp(&a.count)
                .then_with(|| a.function.cmp(&b.function))
                .then_with(|| a.callers.cmp(&b.callers))
        });
        out
    }

    /// The calls of `reader`'s trace (whose call stacks these are) that
    /// `query` keeps, with their stacks: the function, depth, duration,
    /// thread and time filters of `replay` and `report`, with their
    /// semantics (a call kept under `-F f` is one `replay -F f` shows).
    pub fn kept(
        &self,
        reader: &TraceReader,
        query: &CompiledQuery,
        mut progress: Progress<'_>,
    ) -> Result<CallStacks> {
        if query.keeps_all() {
            return Ok(self.clone());
        }
        let mut out = CallStacks {
            stacks: HashMap::new(),
            calls: HashMap::new(),
        };
        let total = reader.total_bytes();
        let mut done = 0;
        for s in reader.streams() {
            done += s.bytes;
            if query.keeps_thread(s.tid) && self.calls.keys().any(|(t, _)| *t == s.tid) {
                for n in kept_entries(reader, s.tid, query)? {
                    if let Some(id) = self.calls.get(&(s.tid, n)) {
                        out.calls.insert((s.tid, n), *id);
                    }
                }
            }
            if let Some(p) = progress.as_mut() {
                p(done, total);
            }
        }
        for id in out.calls.values() {
            if let Some(st) = self.stacks.get(id) {
                out.stacks.insert(*id, st.clone());
            }
        }
        Ok(out)
    }
}

/// The entry numbers (from 1, over the thread's entry and call records
/// in stream order, as `call_stacks.tsv` numbers them) of the calls of
/// thread `tid` that `query` keeps. The raw call tree is rebuilt beside
/// the filtered one: a call the query keeps closes in both at the same
/// record, so the raw one names its entry.
fn kept_entries(reader: &TraceReader, tid: u32, query: &CompiledQuery) -> Result<Vec<u64>> {
    let mut raw = CallStack::new();
    let mut kept = QueryStack::new(query);
    // (entry time, probe) → entry numbers of the open calls, innermost last.
    let mut open: HashMap<(u64, u32), Vec<u64>> = HashMap::new();
    let mut closed: Vec<(u64, u32, u64)> = Vec::new();
    let mut n = 0u64;
    let mut out = Vec::new();
    let mut take = |s: Step, closed: &mut Vec<(u64, u32, u64)>| {
        if let Step::Leave { probe, start, .. } = s {
            if let Some(i) = closed
                .iter()
                .rposition(|(ts, p, _)| *ts == start && *p == probe)
            {
                out.push(closed.remove(i).2);
            }
        }
    };
    fn close(s: Step, open: &mut HashMap<(u64, u32), Vec<u64>>, closed: &mut Vec<(u64, u32, u64)>) {
        if let Step::Leave { probe, start, .. } = s {
            if let Some(n) = open.get_mut(&(start, probe)).and_then(Vec::pop) {
                closed.push((start, probe, n));
            }
        }
    }
    for r in reader.thread(tid)? {
        let r = r?;
        if let Record::Entry { ts, probe, .. } | Record::Call { ts, probe, .. } = r {
            n += 1;
            open.entry((ts, probe)).or_default().push(n);
        }
        closed.clear();
        raw.feed(&r, |s| close(s, &mut open, &mut closed));
        kept.feed(&r, |s| take(s, &mut closed));
    }
    closed.clear();
    raw.finish(|s| close(s, &mut open, &mut closed));
    kept.finish(|s| take(s, &mut closed));
    Ok(out)
}

/// Writes `calls` to `dir/call_stacks.tsv`.
pub fn write_call_stacks(dir: &Path, calls: &CallStacks) -> Result<()> {
    let mut s = String::new();
    let mut ids: Vec<&u32> = calls.stacks.keys().collect();
    ids.sort();
    for id in ids {
        let (function, callers, truncated) = &calls.stacks[id];
        s.push_str(&format!(
            "s\t{id}\t{}\n",
            format_stack(function, callers, *truncated)
        ));
    }
    let mut list: Vec<(&(u32, u64), &u32)> = calls.calls.iter().collect();
    list.sort();
    for ((tid, entry), id) in list {
        s.push_str(&format!("c\t{tid}\t{entry}\t{id}\n"));
    }
    write_tsv(&dir.join(CALL_STACKS_FILE), HEADER, &s)
}

/// The call stacks of the trace in `dir`; `None` when it has none
/// (recorded without `--stacks`, by a version before 5, or with writer
/// filters, which leave entries out).
pub fn read_call_stacks(dir: &Path) -> Result<Option<CallStacks>> {
    let path = dir.join(CALL_STACKS_FILE);
    let mut out = CallStacks::default();
    let found = read_tsv(&path, HEADER, |f, bad| {
        let id32 = |s: &str, what: &str| -> Result<u32> {
            let n: u64 = parse_number(s, &format!("{what} is not a number"), bad)?;
            u32::try_from(n).map_err(|_| bad(&format!("{what} is not a 32-bit number")))
        };
        match *f {
            ["s", id, trunc, function, callers] => {
                let id = id32(id, "id")?;
                out.stacks
                    .insert(id, parse_stack(trunc, function, callers, bad)?);
            }
            ["c", tid, entry, id] => {
                let tid = id32(tid, "tid")?;
                let entry = parse_number(entry, "entry is not a number", bad)?;
                out.calls.insert((tid, entry), id32(id, "id")?);
            }
            _ => return Err(bad("not an `s` line of 5 fields or a `c` line of 4")),
        }
        Ok(())
    })?;
    if !found {
        return Ok(None);
    }
    if let Some(id) = out.calls.values().find(|id| !out.stacks.contains_key(id)) {
        return Err(TraceError::Symbols {
            path,
            line: 0,
            what: format!("a call names stack {id}, which no `s` line gives"),
        });
    }
    Ok(Some(out))
}
