//! Aggregations in the target: which probes aggregate, and their tables
//! read back from the agent's shared memory (see `hotprobe_abi::agg`).

use super::*;
use crate::agg::AggTable;
use hotprobe_fastpath::agg;

/// The returns counter `c` of the fast path aggregated the values of,
/// when it aggregates return values (no counter counts those returns).
pub(super) fn returns_aggregated(fp: &FastPath, c: u32) -> Option<u64> {
    let slot = agg::find_rule(fp.shm(), c)?;
    (agg::rule_of(slot).source == agg::AGG_SRC_RETVAL).then(|| agg::rule_hits(fp.shm(), slot, c))
}

impl Session {
    /// Which `Record` probes added from now on aggregate in the target
    /// instead of writing events, on the fast path (patch or jump): a
    /// function the chooser gives a rule is placed counting, with each
    /// hit (each return, for a rule of return values) added into its
    /// histogram or key table there ([`Session::aggregation`] reads it).
    /// Functions other mechanisms take record events as before. The
    /// chooser sees `%return` specs too.
    pub fn set_aggregate(&mut self, chooser: Option<AggChooser>) {
        self.aggregate = chooser;
    }

    /// The table probe `id` aggregated in the target (`None`: it does not
    /// aggregate there), over every place it was armed and every followed
    /// child (they share the memory). Exact once the target's threads are
    /// quiescent.
    pub fn aggregation(&self, id: ProbeId) -> Option<AggTable> {
        let root = self.slots.get((id.0 >> TARGET_SHIFT) as usize)?;
        let fp = root.agent.fast_path()?;
        let shm = fp.shm();
        let mut out: Option<AggTable> = None;
        for (c, _) in root.agent.counters.get(&id)? {
            let Some(slot) = agg::find_rule(shm, *c) else {
                continue;
            };
            let t = out.get_or_insert_with(|| AggTable::new(agg::rule_of(slot)));
            for (b, v) in t.buckets.iter_mut().zip(agg::buckets(shm, slot)) {
                *b += v.load(std::sync::atomic::Ordering::Relaxed);
            }
            agg::for_each_key(shm, *c, |k0, k1, n| t.add_key(k0, k1, n));
            t.uncounted += slot.uncounted.load(std::sync::atomic::Ordering::Relaxed)
                + agg::claimed_hits(shm, *c);
        }
        out
    }
}

impl Session {
    /// Notes the process of a thread target `i` saw created, for
    /// [`Session::process_of_thread`].
    pub(super) fn note_thread_process(&mut self, i: usize, ev: &TargetEvent) {
        if let (TargetEvent::ThreadCreated(t), Some(pid)) =
            (ev, self.slots.get(i).and_then(|s| s.pid))
        {
            self.thread_pids.insert(t.0 as u32, pid);
        }
    }

    /// The process (of those the session traces or traced) that thread
    /// `tid` belongs to: a process's main thread is its own, another was
    /// seen created in it. `None` for a thread the session never saw
    /// start (one of a process attached to, started before).
    pub fn process_of_thread(&self, tid: u32) -> Option<i32> {
        // A process's own id first: a vfork child is seen start as a
        // thread of its parent's before it is a process of its own.
        self.slots
            .iter()
            .filter_map(|s| s.pid)
            .find(|p| *p as u32 == tid)
            .or_else(|| self.thread_pids.get(&tid).copied())
    }
}
