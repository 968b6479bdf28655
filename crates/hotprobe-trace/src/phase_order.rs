//! The phase of each call by the order of its thread's records, not by
//! time alone (`report --marker`): with the probes' costs taken out,
//! calls close together can share a time stamp, and so can several of a
//! marker's calls, whose phases then collapsed into the last of them (4
//! calls of `path_b` in one phase, 3 phases empty). Fed every record of a
//! thread just before the call stack is ([`crate::analysis::CallStack`]),
//! it follows the stack's opening and closing of calls, so that each
//! `Leave` the stack gives (or a query's subset of them, in the same
//! order) gets the number of the thread's markers seen when its call
//! started: 0 before the first, `k` from the `k`-th marker's own call on.

use std::collections::VecDeque;

use std::collections::HashMap;

use crate::Record;
use crate::SymbolTable;

/// See the module docs.
#[derive(Debug, Default)]
pub(crate) struct PhaseOrder {
    /// Markers seen so far in the thread.
    seen: usize,
    /// The open calls as the call stack holds them: (probe, phase).
    open: Vec<(u32, usize)>,
    /// The calls the record just fed closes, innermost first.
    closing: VecDeque<(u32, usize)>,
}

impl PhaseOrder {
    /// Takes record `r`, before the call stack does.
    pub(crate) fn before(&mut self, r: &Record, marker: impl Fn(u32) -> bool) {
        self.closing.clear();
        match *r {
            Record::Entry { probe, .. } => {
                self.seen += usize::from(marker(probe));
                self.open.push((probe, self.seen));
            }
            Record::Call { probe, .. } | Record::Hit { probe, .. } => {
                self.seen += usize::from(marker(probe));
            }
            Record::Exit { probe, .. } => {
                // As the call stack closes: up to the innermost open call
                // of the probe, the ones inside it unfinished.
                if let Some(pos) = self.open.iter().rposition(|o| o.0 == probe) {
                    self.closing.extend(self.open.drain(pos..).rev());
                }
            }
            _ => {}
        }
    }

    /// Before the call stack's `finish`: every open call closes.
    pub(crate) fn finish(&mut self) {
        self.closing.clear();
        self.closing.extend(self.open.drain(..).rev());
    }

    /// The phase (markers seen at its start) of the call a `Leave` of
    /// `probe` ends (`leaf`: from a call record, just fed).
    pub(crate) fn of_leave(&mut self, probe: u32, leaf: bool) -> usize {
        if leaf {
            return self.seen;
        }
        while let Some((p, phase)) = self.closing.pop_front() {
            if p == probe {
                return phase;
            }
        }
        self.seen
    }
}

/// The name of each marker call in `markers` (time, probe), in order:
/// the probe's name, `#n` from its second call on.
pub(crate) fn phase_names(markers: &[(u64, u32)], syms: &SymbolTable) -> Vec<(String, u64)> {
    let mut seen: HashMap<u32, u32> = HashMap::new();
    markers
        .iter()
        .map(|&(ts, probe)| {
            let n = seen.entry(probe).or_insert(0);
            *n += 1;
            let name = syms.name(probe);
            let name = if *n == 1 {
                name.into_owned()
            } else {
                format!("{name}#{n}")
            };
            (name, ts)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::{CallStack, Step};
    use crate::Args;

    fn entry(probe: u32, ts: u64) -> Record {
        Record::Entry {
            ts,
            probe,
            args: Args::EMPTY,
        }
    }

    fn exit(probe: u32, ts: u64) -> Record {
        Record::Exit {
            ts,
            probe,
            ret: None,
            unwound: false,
        }
    }

    /// Probe 1 is the marker; every call at time 10 (its cost taken out):
    /// 2 inside the first marker call, 1 (the second marker) and 2 after.
    #[test]
    fn calls_sharing_a_time_stamp_keep_their_phases() {
        let records = [
            entry(2, 10),
            exit(2, 10),
            entry(1, 10),
            entry(2, 10),
            exit(2, 10),
            exit(1, 10),
            entry(1, 10),
            exit(1, 10),
            entry(2, 10),
        ];
        let mut order = PhaseOrder::default();
        let mut cs = CallStack::new();
        let mut got = Vec::new();
        for r in &records {
            order.before(r, |p| p == 1);
            cs.feed(r, |s| {
                if let Step::Leave { probe, leaf, .. } = s {
                    got.push((probe, order.of_leave(probe, leaf)));
                }
            });
        }
        order.finish();
        cs.finish(|s| {
            if let Step::Leave { probe, leaf, .. } = s {
                got.push((probe, order.of_leave(probe, leaf)));
            }
        });
        assert_eq!(got, vec![(2, 0), (2, 1), (1, 1), (1, 2), (2, 2)]);
    }
}
