//! Pairing the ring's records into spans: a syscall's enter with its exit,
//! a switch out with the next switch in, per thread.

use std::collections::HashMap;

use crate::records::{KernelRecord, Stamp};

/// What a [`KernelSpan`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpanKind {
    /// The thread was in a system call.
    Syscall {
        /// Syscall number (x86-64).
        nr: u32,
        /// Its return value (negative errno on failure).
        ret: i64,
    },
    /// The thread was off the CPU (blocked, or preempted).
    OffCpu {
        /// Preempted while runnable rather than blocked.
        preempted: bool,
    },
}

/// An interval of one thread in the kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelSpan {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// Start, CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// End, CLOCK_MONOTONIC ns (≥ start).
    pub end_ns: u64,
    /// What it is.
    pub kind: SpanKind,
}

/// Counts of what [`pair`] could not make a span of.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PairCounts {
    /// Exits without their enter (the call started before recording did,
    /// or its enter was lost), and enters followed by another enter.
    pub unpaired: u64,
    /// Calls still open at the end (`exit_group`, `execve` of a thread
    /// that went away, or the recording ended inside them).
    pub unfinished: u64,
}

/// Pairs `records` (any order: they are sorted by time first, each CPU's
/// ring being in order but not the rings between them) into spans, in
/// order of their start.
pub fn pair(records: &mut [KernelRecord]) -> (Vec<KernelSpan>, PairCounts) {
    let time = |r: &KernelRecord| match r {
        KernelRecord::Enter { at, .. }
        | KernelRecord::Exit { at, .. }
        | KernelRecord::SwitchOut { at, .. }
        | KernelRecord::SwitchIn { at } => at.time,
        KernelRecord::Lost { .. } => 0,
    };
    records.sort_by_key(time);
    let mut counts = PairCounts::default();
    let mut spans = Vec::new();
    let mut in_call: HashMap<u32, (Stamp, i64)> = HashMap::new();
    let mut off: HashMap<u32, (Stamp, bool)> = HashMap::new();
    for r in records.iter() {
        match *r {
            KernelRecord::Enter { at, nr } => {
                if in_call.insert(at.tid, (at, nr)).is_some() {
                    counts.unpaired += 1;
                }
            }
            KernelRecord::Exit { at, nr, ret } => match in_call.remove(&at.tid) {
                Some((start, n)) if n == nr => spans.push(KernelSpan {
                    pid: at.pid,
                    tid: at.tid,
                    start_ns: start.time,
                    end_ns: at.time.max(start.time),
                    kind: SpanKind::Syscall {
                        nr: u32::try_from(nr).unwrap_or(u32::MAX),
                        ret,
                    },
                }),
                _ => counts.unpaired += 1,
            },
            KernelRecord::SwitchOut { at, preempted } => {
                off.insert(at.tid, (at, preempted));
            }
            KernelRecord::SwitchIn { at } => {
                if let Some((out, preempted)) = off.remove(&at.tid) {
                    spans.push(KernelSpan {
                        pid: at.pid,
                        tid: at.tid,
                        start_ns: out.time,
                        end_ns: at.time.max(out.time),
                        kind: SpanKind::OffCpu { preempted },
                    });
                }
            }
            KernelRecord::Lost { .. } => {}
        }
    }
    counts.unfinished = in_call.len() as u64;
    spans.sort_by_key(|s| (s.start_ns, s.tid));
    (spans, counts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(tid: u32, time: u64) -> Stamp {
        Stamp { pid: 1, tid, time }
    }

    #[test]
    fn pairs_per_thread_across_rings_and_counts_what_does_not_pair() {
        // Two threads; thread 2's read blocks (out at 12, in at 40) and
        // its exit comes from another CPU's ring, drained first.
        let mut recs = vec![
            KernelRecord::SwitchIn { at: at(2, 40) },
            KernelRecord::Exit {
                at: at(2, 41),
                nr: 0,
                ret: 5,
            },
            KernelRecord::Exit {
                at: at(3, 2),
                nr: 7,
                ret: 0,
            },
            KernelRecord::Enter {
                at: at(2, 10),
                nr: 0,
            },
            KernelRecord::SwitchOut {
                at: at(2, 12),
                preempted: false,
            },
            KernelRecord::Enter {
                at: at(3, 20),
                nr: 231,
            },
        ];
        let (spans, counts) = pair(&mut recs);
        assert_eq!(
            spans,
            vec![
                KernelSpan {
                    pid: 1,
                    tid: 2,
                    start_ns: 10,
                    end_ns: 41,
                    kind: SpanKind::Syscall { nr: 0, ret: 5 }
                },
                KernelSpan {
                    pid: 1,
                    tid: 2,
                    start_ns: 12,
                    end_ns: 40,
                    kind: SpanKind::OffCpu { preempted: false }
                },
            ]
        );
        assert_eq!(
            counts,
            PairCounts {
                unpaired: 1,
                unfinished: 1
            }
        );
    }
}
