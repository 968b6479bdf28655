//! Probe overhead taken out of recorded times (issue 23's "true timings").
//!
//! A probe's hit costs the traced thread time: a few ns on the fast path,
//! microseconds on a trap. The recorder calibrates each mechanism's cost
//! per hit when it starts and writes it, with the mechanism of every
//! probe, to `costs.tsv`. A [`crate::ThreadStream`] of a trace that has the
//! file then reads its records on a per-thread clock that leaves those
//! costs out (docs/ANALYSIS.md, "Probe costs"):
//!
//! - A call costs its thread two hits, `2h`: an enclosing call loses
//!   `2h` for each call inside it, whole.
//! - Of that, a call holds some between its own two stamps, `i`: how much
//!   depends on where in its hit each mechanism takes its stamp (an
//!   in-process trap stamps late in its entry, so most of the cost falls
//!   before the call). `i` is `h` capped by the shortest leaf call
//!   measured on the mechanism ([`LeafScan`]): no call can hold more than
//!   the shortest whole call measured.
//! - So an entry's time moves back by everything spent before it plus
//!   `2h - i`, an exit's plus `i`, a mid-function hit's plus `h`: a call
//!   loses `i`, the gap before it (its caller's self time) the rest.
//! - A time the correction would put before the record ahead of it (a
//!   calibration too high for the times measured: one made on a loaded
//!   machine) is held there, and what the gap could not hold is dropped,
//!   not carried on to later times. Such hits are counted
//!   ([`HeldCalls`]); the reader warns when they are more than 1 %
//!   ([`crate::TraceReader::correction_warning`]).
//!
//! Every reader of the streams (report, replay, the exports, queries)
//! sees the corrected times; the reader says so
//! ([`crate::TraceReader::overhead_corrected`]), and
//! [`crate::TraceReader::set_overhead_correction`] turns it off.
//!
//! `costs.tsv` (trace format version 6): a header line, one `mechanism`
//! line per mechanism (label, ns per hit, the calibration's own words),
//! one `uncalibrated` line per mechanism whose calibration was refused
//! (label, why: its hits stay in the times), then one `probe` line per
//! probe id with its mechanism's label.

use crate::error::{Result, TraceError};
use std::collections::HashMap;
use std::path::Path;

/// Name of the cost file in a trace directory.
pub const COSTS_FILE: &str = "costs.tsv";
const COSTS_HEADER: &str = "#hotprobe probe costs v2";
/// The header of the first form (no `uncalibrated` lines), still read.
const COSTS_HEADER_V1: &str = "#hotprobe probe costs v1";

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

/// A mechanism whose calibration was refused (a figure beyond what it can
/// cost, a run that failed): its hits' costs stay in the times, and the
/// other mechanisms' are taken out.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UncalibratedMechanism {
    /// The mechanism as placements name it.
    pub label: String,
    /// Why its calibration was refused.
    pub why: String,
}

/// The calibrated costs of a trace's mechanisms and the mechanism of each
/// of its probes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProbeCosts {
    /// Each mechanism used and calibrated, once.
    pub mechanisms: Vec<MechanismCost>,
    /// Probe id → index into `mechanisms`.
    pub probes: HashMap<u32, usize>,
    /// Each mechanism used whose calibration was refused, once.
    pub uncalibrated: Vec<UncalibratedMechanism>,
    /// Probe id → index into `uncalibrated` (their hits cost nothing on
    /// the corrected clock: measured times).
    pub uncalibrated_probes: HashMap<u32, usize>,
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

    /// Adds (or finds) a mechanism whose calibration was refused and
    /// returns its index into `uncalibrated`.
    pub fn uncalibrated(&mut self, m: UncalibratedMechanism) -> usize {
        match self.uncalibrated.iter().position(|u| u.label == m.label) {
            Some(i) => i,
            None => {
                self.uncalibrated.push(m);
                self.uncalibrated.len() - 1
            }
        }
    }

    /// The mechanism label of `probe`, calibrated or not, and whether it
    /// was calibrated (`None`: not listed).
    pub fn label_of(&self, probe: u32) -> Option<(&str, bool)> {
        if let Some(m) = self.mechanism_of(probe) {
            return Some((&m.label, true));
        }
        self.uncalibrated_probes
            .get(&probe)
            .and_then(|&i| self.uncalibrated.get(i))
            .map(|u| (u.label.as_str(), false))
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
        for u in &self.uncalibrated {
            text.push_str(&format!(
                "uncalibrated\t{}\t{}\n",
                clean(&u.label),
                clean(&u.why)
            ));
        }
        let mut ids: Vec<(u32, &str)> = self
            .probes
            .iter()
            .map(|(&id, &i)| (id, self.mechanisms[i].label.as_str()))
            .chain(
                self.uncalibrated_probes
                    .iter()
                    .map(|(&id, &i)| (id, self.uncalibrated[i].label.as_str())),
            )
            .collect();
        ids.sort();
        for (id, label) in ids {
            text.push_str(&format!("probe\t{id}\t{}\n", clean(label)));
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
                if line != COSTS_HEADER && line != COSTS_HEADER_V1 {
                    return Err(err(1, format!("expected header {COSTS_HEADER:?}")));
                }
                continue;
            }
            let listed = |c: &ProbeCosts, label: &str| {
                c.mechanisms.iter().any(|m| m.label == label)
                    || c.uncalibrated.iter().any(|u| u.label == label)
            };
            let f: Vec<&str> = line.split('\t').collect();
            match f[..] {
                ["mechanism", label, ns, how] => {
                    let ns: f64 = ns
                        .parse()
                        .ok()
                        .filter(|v: &f64| v.is_finite() && *v >= 0.0 && *v < 1e9)
                        .ok_or_else(|| err(n, format!("bad cost {ns:?}")))?;
                    if listed(&c, label) {
                        return Err(err(n, format!("mechanism {label:?} listed twice")));
                    }
                    c.mechanisms.push(MechanismCost {
                        label: label.into(),
                        ns_per_hit: ns,
                        how: how.into(),
                    });
                }
                ["uncalibrated", label, why] => {
                    if listed(&c, label) {
                        return Err(err(n, format!("mechanism {label:?} listed twice")));
                    }
                    c.uncalibrated.push(UncalibratedMechanism {
                        label: label.into(),
                        why: why.into(),
                    });
                }
                ["probe", id, label] => {
                    let id: u32 = id
                        .parse()
                        .map_err(|_| err(n, format!("bad probe id {id:?}")))?;
                    if c.probes.contains_key(&id) || c.uncalibrated_probes.contains_key(&id) {
                        return Err(err(n, format!("probe {id} listed twice")));
                    }
                    if let Some(i) = c.mechanisms.iter().position(|m| m.label == label) {
                        c.probes.insert(id, i);
                    } else if let Some(i) = c.uncalibrated.iter().position(|u| u.label == label) {
                        c.uncalibrated_probes.insert(id, i);
                    } else {
                        return Err(err(n, format!("mechanism {label:?} not listed")));
                    }
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

/// One probe's costs on the corrected clock, in ns (see the module doc).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct HitCosts {
    /// Before an entry's time stamp: twice the cost a hit, less `exit`.
    entry: u64,
    /// Before an exit's time stamp: what a call holds between its stamps
    /// (the cost a hit, at most the mechanism's shortest call).
    exit: u64,
    /// Before a mid-function hit's stamp: the cost a hit.
    mid: u64,
}

/// One thread's clock without the probes' costs (see the module doc).
#[derive(Clone, Debug)]
pub(crate) struct OverheadClock {
    /// Costs by probe id (0 for a probe not listed): one table for every
    /// stream of a reader ([`OverheadClock::table`]).
    cost: std::sync::Arc<Vec<HitCosts>>,
    /// What the thread spent in hits so far, as taken out.
    spent: u64,
    /// The last corrected time given (corrected times never go back).
    last: u64,
    /// Whether the last time given was held at `last` (the correction
    /// would have put it before the record ahead of it) by more than
    /// [`HELD_SLACK_NS`] and a quarter of the cost taken out there.
    held: bool,
}

/// A time held by this much at most (or by a quarter of the cost taken
/// out at its hit) is not counted held: a calibrated cost is a low figure
/// of many calls, and a call a few ns cheaper than it is no sign of a
/// calibration too high.
pub(crate) const HELD_SLACK_NS: u64 = 50;

impl OverheadClock {
    /// The costs of each probe id of `costs`, as the clocks of a reader's
    /// streams share them: each mechanism's calibrated cost a hit `h`,
    /// and what lies between a call's stamps, `h` capped by `shortest`
    /// (by mechanism index: its shortest leaf call measured,
    /// [`LeafScan`]; `None`: no cap).
    pub(crate) fn table(
        costs: &ProbeCosts,
        shortest: &[Option<u64>],
    ) -> std::sync::Arc<Vec<HitCosts>> {
        // Probe ids are dense from 0 (symbols.tsv caps them at 2^24).
        let bound = costs.probes.keys().max().map_or(0, |&m| m as usize + 1);
        let mut cost = vec![HitCosts::default(); bound.min(1 << 24)];
        for (&p, &i) in &costs.probes {
            if let Some(c) = cost.get_mut(p as usize) {
                let h = costs.ns_per_hit(p).round() as u64;
                let inside = match shortest.get(i).copied().flatten() {
                    Some(cap) => h.min(cap),
                    None => h,
                };
                *c = HitCosts {
                    entry: h.saturating_mul(2) - inside,
                    exit: inside,
                    mid: h,
                };
            }
        }
        std::sync::Arc::new(cost)
    }

    /// A thread's clock over the costs in `table`.
    pub(crate) fn new(table: std::sync::Arc<Vec<HitCosts>>) -> OverheadClock {
        OverheadClock {
            cost: table,
            spent: 0,
            last: 0,
            held: false,
        }
    }

    fn costs(&self, probe: u32) -> HitCosts {
        self.cost.get(probe as usize).copied().unwrap_or_default()
    }

    /// The corrected time of an entry of `probe` stamped at `ts` (ns).
    pub(crate) fn entry(&mut self, ts: u64, probe: u32) -> u64 {
        let c = self.costs(probe).entry;
        self.after(ts, c)
    }

    /// The corrected time of an exit of `probe` stamped at `ts` (ns).
    pub(crate) fn exit(&mut self, ts: u64, probe: u32) -> u64 {
        let c = self.costs(probe).exit;
        self.after(ts, c)
    }

    /// The corrected time of a mid-function hit of `probe` at `ts` (ns).
    pub(crate) fn mid(&mut self, ts: u64, probe: u32) -> u64 {
        let c = self.costs(probe).mid;
        self.after(ts, c)
    }

    /// The corrected time of something that is no hit (a loss marker).
    pub(crate) fn plain(&mut self, ts: u64) -> u64 {
        self.after(ts, 0)
    }

    /// Whether the last time given was held (see [`OverheadClock::held`]'s
    /// field).
    pub(crate) fn was_held(&self) -> bool {
        self.held
    }

    /// `ts` less everything spent up to it, `cost` ns more now. A time
    /// that would go before the last one given is held there, and the
    /// excess is not carried on: what the gap could not hold is dropped,
    /// so that one too-high cost shortens one gap, never every later
    /// time.
    fn after(&mut self, ts: u64, cost: u64) -> u64 {
        self.spent = self.spent.saturating_add(cost);
        let t = ts.saturating_sub(self.spent);
        if t < self.last {
            self.held = self.last - t > HELD_SLACK_NS.max(cost / 4);
            self.spent = ts.saturating_sub(self.last);
        } else {
            self.held = false;
            self.last = t;
        }
        self.last
    }
}

/// How many records [`LeafScan`] reads at most, over all threads: beyond,
/// a longer trace's shortest calls are those of its first records (a cap
/// then too high shows in the held calls, [`HeldCalls`]).
pub(crate) const SCAN_BUDGET: u64 = 1 << 24;

/// Finds each mechanism's shortest leaf call as measured: an entry and
/// its exit with nothing recorded between. Such a call holds one whole
/// hit's cost (half of its entry's, half of its exit's) and its body, so
/// no hit on that mechanism can cost more: the correction's cap (see
/// docs/ANALYSIS.md, "Probe costs").
pub(crate) struct LeafScan<'a> {
    costs: &'a ProbeCosts,
    /// By mechanism index.
    shortest: Vec<Option<u64>>,
    /// The entry just read: probe and time.
    open: Option<(u32, u64)>,
    records: u64,
}

impl<'a> LeafScan<'a> {
    /// A scan over the mechanisms of `costs`.
    pub(crate) fn new(costs: &'a ProbeCosts) -> LeafScan<'a> {
        LeafScan {
            costs,
            shortest: vec![None; costs.mechanisms.len()],
            open: None,
            records: 0,
        }
    }

    /// A new thread's records follow.
    pub(crate) fn thread(&mut self) {
        self.open = None;
    }

    /// Whether the scan has read its budget ([`SCAN_BUDGET`]).
    pub(crate) fn full(&self) -> bool {
        self.records >= SCAN_BUDGET
    }

    /// The next record of the thread (times in ns, as measured).
    pub(crate) fn record(&mut self, r: &crate::event::Record) {
        use crate::event::Record;
        self.records += 1;
        match *r {
            Record::Call { dur, probe, .. } => {
                self.open = None;
                self.leaf(probe, dur);
            }
            Record::Entry { ts, probe, .. } => self.open = Some((probe, ts)),
            Record::Exit {
                ts, probe, unwound, ..
            } => {
                if let Some((p, t0)) = self.open.take() {
                    if p == probe && !unwound {
                        self.leaf(probe, ts.saturating_sub(t0));
                    }
                }
            }
            Record::Hit { .. } | Record::Lost { .. } => self.open = None,
        }
    }

    fn leaf(&mut self, probe: u32, dur: u64) {
        let Some(&i) = self.costs.probes.get(&probe) else {
            return;
        };
        if let Some(s) = self.shortest.get_mut(i) {
            *s = Some(s.map_or(dur, |m| m.min(dur)));
        }
    }

    /// Each mechanism's shortest leaf call (ns), by mechanism index.
    pub(crate) fn finish(self) -> Vec<Option<u64>> {
        self.shortest
    }
}

/// Hits read on the corrected clock, and those whose time the correction
/// held (it would have gone before the record ahead of it), by thread:
/// each stream's counts when it ends, the largest of its readings (a
/// stream read twice counts once).
#[derive(Clone, Debug, Default)]
pub(crate) struct HeldCalls(std::sync::Arc<std::sync::Mutex<HashMap<u32, (u64, u64)>>>);

impl HeldCalls {
    /// Thread `tid`'s stream read `hits` hits, `held` of them held.
    pub(crate) fn note(&self, tid: u32, hits: u64, held: u64) {
        // A poisoned lock: a reader panicked while noting; the counts
        // are plain numbers, still whole.
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let e = m.entry(tid).or_insert((0, 0));
        *e = (e.0.max(hits), e.1.max(held));
    }

    /// (hits, held) over every thread read so far.
    pub(crate) fn totals(&self) -> (u64, u64) {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        m.values().fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
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
    fn a_call_loses_its_inner_part_and_every_inner_hit() {
        // outer (jump, 10 ns a hit) calls inner (trap, 1000 ns a hit)
        // once: outer entry at t0, inner entry at t0 + 1000, inner exit
        // 1200 later (200 ns of its own work + 1000 of its hits' costs
        // between its stamps), outer exit at t0 + 3000.
        let t0 = 1_000_000;
        let mut k = OverheadClock::new(OverheadClock::table(&costs(), &[]));
        let oe = k.entry(t0, 1);
        let ie = k.entry(t0 + 1000, 2);
        let ix = k.exit(t0 + 2200, 2);
        let ox = k.exit(t0 + 3000, 1);
        assert_eq!(oe, t0 - 10);
        assert_eq!(ix - ie, 1200 - 1000, "inner: its inner part out");
        // outer: 3000 measured, minus its inner part (10) and both of
        // inner's hits (2000).
        assert_eq!(ox - oe, 3000 - 10 - 2000);
        assert!(!k.was_held());
        // A loss marker after them moves by what was spent.
        assert_eq!(k.plain(t0 + 3500), t0 + 3500 - 2020);
    }

    #[test]
    fn the_inner_part_is_capped_and_the_whole_cost_still_taken_out() {
        // The trap's shortest call measured 300 ns: a call loses 300, its
        // caller both hits' 2000.
        let t0 = 1_000_000;
        let table = OverheadClock::table(&costs(), &[Some(300), None]);
        let mut k = OverheadClock::new(table);
        let oe = k.entry(t0, 1);
        let ie = k.entry(t0 + 1800, 2);
        let ix = k.exit(t0 + 2150, 2);
        let ox = k.exit(t0 + 3000, 1);
        assert_eq!(ix - ie, 350 - 300);
        assert_eq!(ox - oe, 3000 - 10 - 2000);
        assert!(!k.was_held());
    }

    #[test]
    fn corrected_times_never_go_back_nor_carry_the_excess() {
        let mut k = OverheadClock::new(OverheadClock::table(&costs(), &[]));
        let a = k.entry(1_000_000, 2);
        // 10 ns measured where 1000 were expected: held at the last time.
        let b = k.exit(1_000_010, 2);
        assert_eq!(a, 1_000_000 - 1000);
        assert_eq!(b, a);
        assert!(k.was_held());
        // What the gap could not hold is dropped: the next call loses its
        // own 1000, not the 990 left over too.
        let c = k.entry(1_010_000, 2);
        let d = k.exit(1_011_500, 2);
        assert!(!k.was_held());
        assert_eq!(d - c, 500);
        // The gap since the held exit (9990 ns) loses the entry's 1000 only.
        assert_eq!(c - b, 9_990 - 1000);
    }
}
