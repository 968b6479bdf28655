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
use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use crate::error::{Result, TraceError};
use crate::files::{check_regular, open_regular};
use crate::stacks::CapturedStack;

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

/// A name as one field: no tab, newline or `;` (the separators).
fn clean(s: &str) -> String {
    s.replace(['\t', '\n', '\r', ';'], " ")
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
        let mut n: HashMap<u32, u64> = HashMap::new();
        for id in self.calls.values() {
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
}

/// Writes `calls` to `dir/call_stacks.tsv`.
pub fn write_call_stacks(dir: &Path, calls: &CallStacks) -> Result<()> {
    let path = dir.join(CALL_STACKS_FILE);
    let mut s = String::from(HEADER);
    s.push('\n');
    let mut ids: Vec<&u32> = calls.stacks.keys().collect();
    ids.sort();
    for id in ids {
        let (function, callers, truncated) = &calls.stacks[id];
        let callers: Vec<String> = callers.iter().map(|c| clean(c)).collect();
        s.push_str(&format!(
            "s\t{id}\t{}\t{}\t{}\n",
            u8::from(*truncated),
            clean(function),
            callers.join(";")
        ));
    }
    let mut list: Vec<(&(u32, u64), &u32)> = calls.calls.iter().collect();
    list.sort();
    for ((tid, entry), id) in list {
        s.push_str(&format!("c\t{tid}\t{entry}\t{id}\n"));
    }
    let mut f = std::fs::File::create(&path).map_err(|e| TraceError::io(&path, e))?;
    f.write_all(s.as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(|e| TraceError::io(&path, e))
}

/// The call stacks of the trace in `dir`; `None` when it has none
/// (recorded without `--stacks`, by a version before 5, or with writer
/// filters, which leave entries out).
pub fn read_call_stacks(dir: &Path) -> Result<Option<CallStacks>> {
    let path = dir.join(CALL_STACKS_FILE);
    if !check_regular(&path)? {
        return Ok(None);
    }
    let f = open_regular(&path)?;
    let mut out = CallStacks::default();
    for (i, line) in BufReader::new(f).lines().enumerate() {
        let line = line.map_err(|e| TraceError::io(&path, e))?;
        let bad = |what: &str| TraceError::Symbols {
            path: path.clone(),
            line: i + 1,
            what: what.to_string(),
        };
        if i == 0 {
            if line != HEADER {
                return Err(bad("not the header of call_stacks.tsv"));
            }
            continue;
        }
        let f: Vec<&str> = line.split('\t').collect();
        let num = |s: &str, what: &str| s.parse::<u64>().map_err(|_| bad(what));
        match f[..] {
            ["s", id, trunc, function, callers] => {
                let id = u32::try_from(num(id, "id is not a number")?)
                    .map_err(|_| bad("id is not a 32-bit number"))?;
                let truncated = match trunc {
                    "0" => false,
                    "1" => true,
                    _ => return Err(bad("truncated is not 0 or 1")),
                };
                if function.is_empty() {
                    return Err(bad("no function"));
                }
                let callers = match callers {
                    "" => Vec::new(),
                    c => c.split(';').map(str::to_string).collect(),
                };
                out.stacks
                    .insert(id, (function.to_string(), callers, truncated));
            }
            ["c", tid, entry, id] => {
                let tid = u32::try_from(num(tid, "tid is not a number")?)
                    .map_err(|_| bad("tid is not a 32-bit number"))?;
                let entry = num(entry, "entry is not a number")?;
                let id = u32::try_from(num(id, "id is not a number")?)
                    .map_err(|_| bad("id is not a 32-bit number"))?;
                out.calls.insert((tid, entry), id);
            }
            _ => return Err(bad("not an `s` line of 5 fields or a `c` line of 4")),
        }
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
