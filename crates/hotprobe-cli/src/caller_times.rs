//! `report --callers FUNC -s total|self|avg|max` and `report --graph FUNC
//! -s KEY`: the times that order them. A caller's times are those of the
//! calls it made, each call found by its own stack (call_stacks.tsv: the
//! `n`-th entry of its thread) and its duration in the thread's records;
//! a graph node's are summed along its path already.

use crate::cli::SortArg;
use hotprobe::trace::call_stacks::CallStacks;
use hotprobe::trace::graph::GraphNode;
use hotprobe::trace::stacks::Callers;
use hotprobe::trace::{CallStack, Record, Step, TraceReader};
use std::collections::HashMap;

/// The times of a set of calls (those without their exit add none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct CallTimes {
    /// Calls with their exit.
    pub finished: u64,
    /// Their durations summed (ns; a recursive call's lies inside its
    /// caller's too).
    pub total_ns: u64,
    /// Their self times summed (ns: minus their recorded callees').
    pub self_ns: u64,
    /// The longest (ns).
    pub max_ns: u64,
}

impl CallTimes {
    fn add(&mut self, o: &CallTimes) {
        self.finished += o.finished;
        self.total_ns += o.total_ns;
        self.self_ns += o.self_ns;
        self.max_ns = self.max_ns.max(o.max_ns);
    }

    /// The average call (ns).
    pub fn avg_ns(&self) -> u64 {
        self.total_ns.checked_div(self.finished).unwrap_or(0)
    }

    /// The value `sort` orders by (ns); 0 for calls (not a time).
    pub fn key(&self, sort: SortArg) -> u64 {
        match sort {
            SortArg::Total => self.total_ns,
            SortArg::SelfTime => self.self_ns,
            SortArg::Avg => self.avg_ns(),
            SortArg::Max => self.max_ns,
            SortArg::Calls => 0,
        }
    }
}

/// The column a time key prints.
pub fn key_title(sort: SortArg) -> &'static str {
    match sort {
        SortArg::Total => "TOTAL",
        SortArg::SelfTime => "SELF",
        SortArg::Avg => "AVG",
        SortArg::Max => "MAX",
        SortArg::Calls => "CALLS",
    }
}

/// (thread, function, callers innermost first, truncated) → the times of
/// the calls with that stack.
pub type StackTimes = HashMap<(u32, String, Vec<String>, bool), CallTimes>;

/// The times of the calls `calls` gives a stack (the kept calls of the
/// trace `r`), per thread and stack. Entries are numbered as
/// call_stacks.tsv numbers them (from 1, over the thread's entry and call
/// records in stream order); each closes in the thread's raw call tree.
pub fn stack_times(r: &TraceReader, calls: &CallStacks) -> anyhow::Result<StackTimes> {
    let mut out = StackTimes::new();
    let mut tids: Vec<u32> = calls.calls.keys().map(|(t, _)| *t).collect();
    tids.sort_unstable();
    tids.dedup();
    for tid in tids {
        let mut raw = CallStack::new();
        let mut n = 0u64;
        // (entry time, probe) → entry numbers of the open calls with a
        // stack, innermost last.
        let mut open: HashMap<(u64, u32), Vec<u64>> = HashMap::new();
        let mut close = |s: Step, open: &mut HashMap<(u64, u32), Vec<u64>>| {
            let Step::Leave {
                probe,
                start,
                end,
                self_ns,
                unfinished,
                ..
            } = s
            else {
                return;
            };
            let Some(n) = open.get_mut(&(start, probe)).and_then(Vec::pop) else {
                return;
            };
            let Some((function, callers, truncated)) = calls
                .calls
                .get(&(tid, n))
                .and_then(|id| calls.stacks.get(id))
            else {
                return;
            };
            let t = out
                .entry((tid, function.clone(), callers.clone(), *truncated))
                .or_default();
            if !unfinished {
                let d = end.saturating_sub(start);
                t.add(&CallTimes {
                    finished: 1,
                    total_ns: d,
                    self_ns,
                    max_ns: d,
                });
            }
        };
        for rec in r.thread(tid)? {
            let rec = rec?;
            if let Record::Entry { ts, probe, .. } | Record::Call { ts, probe, .. } = rec {
                n += 1;
                if calls.calls.contains_key(&(tid, n)) {
                    open.entry((ts, probe)).or_default().push(n);
                }
            }
            raw.feed(&rec, |s| close(s, &mut open));
        }
        raw.finish(|s| close(s, &mut open));
    }
    Ok(out)
}

/// The times of one group's callers (thread `tid`, or all threads).
pub struct GroupTimes {
    /// (function, callers, truncated) → times.
    paths: HashMap<(String, Vec<String>, bool), CallTimes>,
}

impl GroupTimes {
    /// The times of thread `tid`'s calls (all threads' for `None`).
    pub fn of(times: &StackTimes, tid: Option<u32>) -> GroupTimes {
        let mut paths: HashMap<(String, Vec<String>, bool), CallTimes> = HashMap::new();
        for ((t, f, c, tr), v) in times {
            if tid.is_none_or(|want| want == *t) {
                paths.entry((f.clone(), c.clone(), *tr)).or_default().add(v);
            }
        }
        GroupTimes { paths }
    }

    /// The times of `function`'s calls through `path` (callers, truncated).
    pub fn path(&self, function: &str, path: &(Vec<String>, bool, u64)) -> CallTimes {
        self.paths
            .get(&(function.to_string(), path.0.clone(), path.1))
            .copied()
            .unwrap_or_default()
    }

    /// The times of a caller's calls: its paths'.
    pub fn caller(&self, c: &Callers) -> CallTimes {
        let mut t = CallTimes::default();
        for p in &c.paths {
            t.add(&self.path(&c.function, p));
        }
        t
    }

    /// Sorts `callers`, and each one's paths, by `sort` (descending;
    /// ties: calls, then as they were).
    pub fn sort(&self, callers: &mut [Callers], sort: SortArg) {
        for c in callers.iter_mut() {
            let f = c.function.clone();
            c.paths
                .sort_by_cached_key(|p| std::cmp::Reverse((self.path(&f, p).key(sort), p.2)));
        }
        callers.sort_by_cached_key(|c| std::cmp::Reverse((self.caller(c).key(sort), c.count)));
    }
}

/// Sorts each node's callees (and the roots) by `sort`, descending, ties
/// in order of first call; `-s max` has no value here (a node sums its
/// calls: the caller refuses it).
pub fn sort_graph(nodes: &mut [GraphNode], sort: SortArg) {
    for n in nodes.iter_mut() {
        sort_graph(&mut n.children, sort);
    }
    nodes.sort_by_cached_key(|n| std::cmp::Reverse(graph_key(n, sort)));
}

/// A graph node's value for `sort`: its calls, total time, self time (its
/// total minus its callees' totals) or average (over its finished calls).
fn graph_key(n: &GraphNode, sort: SortArg) -> u64 {
    match sort {
        SortArg::Calls => n.calls,
        SortArg::Total | SortArg::Max => n.total_ns,
        SortArg::SelfTime => {
            let below: u64 = n.children.iter().map(|c| c.total_ns).sum();
            n.total_ns.saturating_sub(below)
        }
        SortArg::Avg => n
            .total_ns
            .checked_div(n.calls.saturating_sub(n.unfinished))
            .unwrap_or(0),
    }
}
