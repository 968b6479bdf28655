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
