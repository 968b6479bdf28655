//! Probe overhead taken out of recorded times (issue 23's "true timings").
//!
//! A probe's hit costs the traced thread time: a few ns on the fast path,
//! microseconds on a trap. The recorder calibrates each mechanism's cost
//! per hit when it starts and writes it, with the mechanism of every
//! probe, to `costs.tsv`. A [`crate::ThreadStream`] of a trace that has the
//! file then reads its records on a per-thread clock that leaves those
//! costs out: each hit's time stamp is taken in the middle of its cost, so
//! a record's time is moved back by everything the thread spent in earlier
//! hits plus half of its own. A call's duration then loses half of its
//! entry's and half of its exit's cost, and every hit inside it; the
//! caller's self time loses the other halves. Every reader of the streams
//! (report, replay, the exports, queries) sees the corrected times; the
//! reader says so ([`crate::TraceReader::overhead_corrected`]), and
//! [`crate::TraceReader::set_overhead_correction`] turns it off.
//!
//! `costs.tsv`: a header line, one `mechanism` line per mechanism (label,
//! ns per hit, the calibration's own words), then one `probe` line per
//! probe id with its mechanism's label.

use crate::error::{Result, TraceError};
use std::collections::HashMap;
use std::path::Path;

/// Name of the cost file in a trace directory.
pub const COSTS_FILE: &str = "costs.tsv";
const COSTS_HEADER: &str = "#hotprobe probe costs v1";

/// One mechanism's calibrated cost.
#[derive(Clone, Debug, PartialEq)]
pub struct MechanismCost {
    /// The mechanism as placements name it ("jump", "in-process trap", ...).
    pub label: String,
    /// What one hit (an entry, an exit or a mid-function hit) costs the
    /// thread, in ns.
    pub ns_per_hit: f64,
    /// How it was measured (shown by `info`).
    pub how: String,
}

/// The calibrated costs of a trace's mechanisms and the mechanism of each
/// of its probes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProbeCosts {
    /// Each mechanism used, once.
    pub mechanisms: Vec<MechanismCost>,
    /// Probe id → index into `mechanisms`.
    pub probes: HashMap<u32, usize>,
}

impl ProbeCosts {
    /// Adds (or finds) a mechanism and returns its index.
    pub fn mechanism(&mut self, cost: MechanismCost) -> usize {
        match self.mechanisms.iter().position(|m| m.label == cost.label) {
            Some(i) => i,
            None => {
                self.mechanisms.push(cost);
                self.mechanisms.len() - 1
            }
        }
    }

    /// The cost of a hit of `probe` in ns (0 for a probe not listed).
    pub fn ns_per_hit(&self, probe: u32) -> f64 {
        self.probes
            .get(&probe)
            .and_then(|&i| self.mechanisms.get(i))
            .map_or(0.0, |m| m.ns_per_hit)
    }

    /// The mechanism of `probe`, if listed.
    pub fn mechanism_of(&self, probe: u32) -> Option<&MechanismCost> {
        self.probes
            .get(&probe)
            .and_then(|&i| self.mechanisms.get(i))
    }

    /// Writes `costs.tsv`.
    pub fn write(&self, path: &Path) -> Result<()> {
        let mut text = format!("{COSTS_HEADER}\n");
        for m in &self.mechanisms {
            text.push_str(&format!(
                "mechanism\t{}\t{:.3}\t{}\n",
                clean(&m.label),
                m.ns_per_hit,
                clean(&m.how)
            ));
        }
        let mut ids: Vec<(&u32, &usize)> = self.probes.iter().collect();
        ids.sort();
        for (id, &i) in ids {
            text.push_str(&format!(
                "probe\t{id}\t{}\n",
                clean(&self.mechanisms[i].label)
            ));
        }
        std::fs::write(path, text).map_err(|e| TraceError::io(path, e))
    }

    /// Parses `costs.tsv` (`path` names the file in errors): every line
    /// checked, never a panic.
    pub fn parse(text: &str, path: &Path) -> Result<ProbeCosts> {
        let err = |line: usize, what: String| TraceError::Symbols {
            path: path.to_path_buf(),
            line,
            what,
        };
        if !text.ends_with('\n') {
            return Err(err(text.lines().count(), "last line not terminated".into()));
        }
        let mut c = ProbeCosts::default();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            if i == 0 {
                if line != COSTS_HEADER {
                    return Err(err(1, format!("expected header {COSTS_HEADER:?}")));
                }
                continue;
            }
            let f: Vec<&str> = line.split('\t').collect();
            match f[..] {
                ["mechanism", label, ns, how] => {
                    let ns: f64 = ns
                        .parse()
                        .ok()
                        .filter(|v: &f64| v.is_finite() && *v >= 0.0 && *v < 1e9)
                        .ok_or_else(|| err(n, format!("bad cost {ns:?}")))?;
                    if c.mechanisms.iter().any(|m| m.label == label) {
                        return Err(err(n, format!("mechanism {label:?} listed twice")));
                    }
                    c.mechanisms.push(MechanismCost {
                        label: label.into(),
                        ns_per_hit: ns,
                        how: how.into(),
                    });
                }
                ["probe", id, label] => {
                    let id: u32 = id
                        .parse()
                        .map_err(|_| err(n, format!("bad probe id {id:?}")))?;
                    let i = c
                        .mechanisms
                        .iter()
                        .position(|m| m.label == label)
                        .ok_or_else(|| err(n, format!("mechanism {label:?} not listed")))?;
                    c.probes.insert(id, i);
                }
                _ => return Err(err(n, format!("unknown line {line:?}"))),
            }
        }
        Ok(c)
    }
}

/// A cost a hit, as reports show it: ns below 1 µs, else µs.
pub(crate) fn fmt_cost(ns: f64) -> String {
    if ns < 1000.0 {
        format!("{ns:.0} ns")
    } else {
        format!("{:.2} µs", ns / 1000.0)
    }
}

/// Tabs and newlines would break the file's lines.
fn clean(s: &str) -> String {
    s.replace(['\t', '\n'], " ")
}

/// One thread's clock without the probes' costs (see the module doc).
#[derive(Clone, Debug)]
pub(crate) struct OverheadClock {
    /// ns per hit, by probe id (0 for a probe not listed): one table for
    /// every stream of a reader ([`OverheadClock::table`]).
    cost: std::sync::Arc<Vec<u64>>,
    /// What the thread spent in hits so far.
    spent: u64,
    /// The last corrected time given (corrected times never go back).
    last: u64,
}

impl OverheadClock {
    /// The ns per hit of each probe id of `costs`, as the clocks of a
    /// reader's streams share it.
    pub(crate) fn table(costs: &ProbeCosts) -> std::sync::Arc<Vec<u64>> {
        // Probe ids are dense from 0 (symbols.tsv caps them at 2^24).
        let bound = costs.probes.keys().max().map_or(0, |&m| m as usize + 1);
        let mut cost = vec![0; bound.min(1 << 24)];
        for &p in costs.probes.keys() {
            if let Some(c) = cost.get_mut(p as usize) {
                *c = costs.ns_per_hit(p).round() as u64;
            }
        }
        std::sync::Arc::new(cost)
    }

    /// A thread's clock over the costs in `table`.
    pub(crate) fn new(table: std::sync::Arc<Vec<u64>>) -> OverheadClock {
        OverheadClock {
            cost: table,
            spent: 0,
            last: 0,
        }
    }

    /// The corrected time of a hit of `probe` stamped at `ts` (ns).
    pub(crate) fn hit(&mut self, ts: u64, probe: u32) -> u64 {
        let h = self.cost.get(probe as usize).copied().unwrap_or(0);
        let t = ts.saturating_sub(self.spent.saturating_add(h / 2));
        self.spent = self.spent.saturating_add(h);
        self.monotonic(t)
    }

    /// The corrected time of something that is no hit (a loss marker).
    pub(crate) fn plain(&mut self, ts: u64) -> u64 {
        let t = ts.saturating_sub(self.spent);
        self.monotonic(t)
    }

    fn monotonic(&mut self, t: u64) -> u64 {
        self.last = self.last.max(t);
        self.last
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs() -> ProbeCosts {
        let mut c = ProbeCosts::default();
        let trap = c.mechanism(MechanismCost {
            label: "in-process trap".into(),
            ns_per_hit: 1000.0,
            how: "calibrated".into(),
        });
        let jump = c.mechanism(MechanismCost {
            label: "jump".into(),
            ns_per_hit: 10.0,
            how: "calibrated".into(),
        });
        c.probes.insert(1, jump);
        c.probes.insert(2, trap);
        c
    }

    #[test]
    fn round_trip_and_bad_files() {
        let dir = std::env::temp_dir().join(format!("hp-costs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join(COSTS_FILE);
        costs().write(&p).unwrap();
        let text = std::fs::read_to_string(&p).unwrap();
        assert_eq!(ProbeCosts::parse(&text, &p).unwrap(), costs());
        for bad in [
            "",
            "x\n",
            "#hotprobe probe costs v1\nmechanism\tjump\tNaN\tx\n",
            "#hotprobe probe costs v1\nmechanism\tjump\t-1\tx\n",
            "#hotprobe probe costs v1\nprobe\t1\tjump\n",
            "#hotprobe probe costs v1\nprobe\tx\tjump\n",
            "#hotprobe probe costs v1\nmechanism\tjump\t1\tx\nmechanism\tjump\t1\tx\n",
            "#hotprobe probe costs v1\nwhat\n",
            "#hotprobe probe costs v1",
        ] {
            assert!(ProbeCosts::parse(bad, &p).is_err(), "{bad:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_call_loses_its_own_halves_and_every_inner_hit() {
        // outer (jump, 10 ns a hit) calls inner (trap, 1000 ns a hit)
        // once: outer entry at t0, inner entry at t0 + 1000, inner exit
        // 1200 later (200 ns of its own work + 1000 of its hits' halves),
        // outer exit at t0 + 3000.
        let t0 = 1_000_000;
        let mut k = OverheadClock::new(OverheadClock::table(&costs()));
        let oe = k.hit(t0, 1);
        let ie = k.hit(t0 + 1000, 2);
        let ix = k.hit(t0 + 2200, 2);
        let ox = k.hit(t0 + 3000, 1);
        assert_eq!(oe, t0 - 5);
        assert_eq!(ix - ie, 1200 - 1000, "inner: its own halves out");
        // outer: 3000 measured, minus its own halves (10) and both of
        // inner's hits (2000).
        assert_eq!(ox - oe, 3000 - 10 - 2000);
        // A loss marker after them moves by what was spent.
        assert_eq!(k.plain(t0 + 3500), t0 + 3500 - 2020);
    }

    #[test]
    fn corrected_times_never_go_back() {
        let mut k = OverheadClock::new(OverheadClock::table(&costs()));
        let a = k.hit(1_000_000, 2);
        // 10 ns measured where 1000 were expected: held at the last time.
        let b = k.hit(1_000_010, 2);
        assert_eq!(a, 1_000_000 - 500);
        assert_eq!(b, a);
    }
}
