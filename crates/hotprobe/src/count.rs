//! Conditional counts and call-duration histograms: an [`EventSink`] that
//! aggregates recorded events instead of keeping them.
//!
//! Probes placed with [`crate::Action::Record`] write an entry event (with
//! the argument registers) at each call and an exit event at each return.
//! A [`CountSink`] counts, per probe, the entries whose [`Cond`] holds
//! (every entry for a probe without one) and, when asked, builds a log2
//! histogram of the durations of those calls, matching each exit to the
//! innermost open entry of the same probe on the same thread.
//!
//! ```no_run
//! use hotprobe::{CountSink, Session};
//! use std::sync::atomic::AtomicBool;
//! let mut s = Session::new();
//! let t = s.spawn("./prog".as_ref(), &[]).unwrap();
//! let mut sink = CountSink::new(false);
//! // Records entries and follows their probes in the sink, as
//! // `s.add(t, "compute", Action::Record)` then `sink.add(id, Some(cond))`.
//! let added = sink.place(&mut s, t, "compute", Some("arg0 > 256")).unwrap();
//! s.start().unwrap();
//! s.run_with(&AtomicBool::new(false), Some(&mut sink)).unwrap();
//! let id = added.placements[0].id;
//! println!("{} calls with arg0 > 256", sink.hits(id).unwrap());
//! ```
//!
//! The command line's `count 'PROBE if CONDITION'` and `count --hist`, the
//! C API's `hotprobe_count_if` and Python's `Session.count(..., cond=...)`
//! all aggregate here.

use crate::cond::{named_cond, Cond, CondError, DeferredCond, NamedCondError};
use crate::typed::Typing;
use crate::{
    Action, Added, EngineError, EventSink, ProbeId, RecordedEvent, Session, SinkError, TargetId,
    KIND_ENTRY, KIND_EXIT, KIND_HIT,
};
use hotprobe_trace::Histogram;
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

/// Why [`CountSink::place`] placed nothing.
#[derive(Debug, thiserror::Error)]
pub enum CountError {
    /// The condition does not parse.
    #[error("the condition: {0}")]
    Cond(#[from] CondError),
    /// The condition names parameters, and does not compile for a
    /// function the spec named (nothing is left placed).
    #[error(transparent)]
    Named(#[from] NamedCondError),
    /// The condition names parameters, and the target is no process
    /// (parameter names come from the DWARF of the process's modules).
    #[error("the condition names parameters: the target is not a process (use arg0 to arg5)")]
    NamesNeedAProcess,
    /// Conditions and histograms follow function entries, not returns.
    #[error("{spec}: conditions and histograms work on function entries (no %return)")]
    Return {
        /// The spec as given.
        spec: String,
    },
    /// The session follows forks: recorded counts do not, yet.
    #[error("conditions and histograms do not work with follow_forks yet")]
    FollowForks,
    /// The session records fewer argument registers than the condition
    /// compares ([`crate::FastPathConfig::record_args`]).
    #[error("the condition compares arg{} and the session records {recorded} argument registers", .needed - 1)]
    TooFewArgs {
        /// Argument registers the condition needs.
        needed: u8,
        /// Argument registers the session records.
        recorded: u8,
    },
    /// The session could not place the probes.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// The aggregating sink of conditional counts and histograms.
#[derive(Debug, Default)]
pub struct CountSink {
    /// Condition per probe id (none: every entry counts).
    conds: HashMap<u32, Cond>,
    hist: bool,
    /// Entries whose condition held, per probe id.
    hits: HashMap<u32, u64>,
    /// The same, per (probe id, thread): rows per process under
    /// `follow_forks` ([`Session::process_of_thread`]).
    thread_hits: HashMap<(u32, u32), u64>,
    /// Durations of those calls in nanoseconds, per probe id.
    hists: HashMap<u32, Histogram>,
    /// Per thread: open calls (probe, entry TSC, condition held).
    stacks: HashMap<u32, Vec<(u32, u64, bool)>>,
    ticks_per_ns: f64,
    /// Events the rings dropped.
    lost: u64,
    /// Probes on USDT markers whose condition compares the marker's
    /// arguments, captured at the hit ([`CountSink::add_usdt`]).
    usdt: std::collections::HashSet<u32>,
    /// Their hits whose condition names an argument that could not be read.
    usdt_unread: u64,
    /// Probes whose condition could not be compiled for what they were
    /// placed on ([`CountSink::add_uncountable`]).
    uncountable: std::collections::HashSet<u32>,
    /// Their hits: not counted.
    uncountable_hits: u64,
    /// Pending probes whose condition names parameters: compiled when
    /// armed, with the argument registers the session records.
    deferred: HashMap<u32, (DeferredCond, u8)>,
    /// Why a deferred condition did not compile, not taken yet.
    notices: Vec<String>,
    /// The same, by probe id (the last arming's).
    not_compiled: HashMap<u32, String>,
}

impl CountSink {
    /// An empty sink; `hist` builds a histogram of call durations per
    /// probe (measuring the time stamp counter's rate takes 10 ms).
    pub fn new(hist: bool) -> CountSink {
        CountSink {
            hist,
            ticks_per_ns: if hist { tsc_ticks_per_ns() } else { 1.0 },
            ..CountSink::default()
        }
    }

    /// A sink for these conditions (raw probe id → condition) and these
    /// probes (those without a condition count every entry).
    pub fn with_conditions(conds: HashMap<u32, Cond>, hist: bool, probes: &[u32]) -> CountSink {
        let mut s = CountSink::new(hist);
        for &p in probes {
            s.add(ProbeId(p), conds.get(&p).cloned());
        }
        s.conds.extend(conds);
        s
    }

    /// Follows probe `id`: its entries count when `cond` holds for their
    /// arguments (every entry with `None`). Adding a probe again replaces
    /// its condition and keeps its count.
    pub fn add(&mut self, id: ProbeId, cond: Option<Cond>) {
        self.hits.entry(id.0).or_default();
        if self.hist {
            self.hists.entry(id.0).or_default();
        }
        match cond {
            Some(c) => self.conds.insert(id.0, c),
            None => self.conds.remove(&id.0),
        };
        self.uncountable.remove(&id.0);
    }

    /// Places recording probes on every address `spec` names in target
    /// `t` and follows them: their entries count when `cond` (the
    /// [`crate::cond`] grammar: `arg0`…`arg5`, and the names of the
    /// function's parameters from its DWARF) holds, every entry without
    /// one. Hand this sink to [`Session::run_with`] to count.
    /// Refused before anything is placed: a condition that does not
    /// parse, a `%return` spec, a session following forks, a condition
    /// comparing arguments the session does not record. A condition
    /// naming parameters compiles per function once placed ([`named_cond`]):
    /// when it does not for one of them (no DWARF, no such parameter),
    /// the probes just placed are removed again and the error says why.
    pub fn place(
        &mut self,
        session: &mut Session,
        t: TargetId,
        spec: &str,
        cond: Option<&str>,
    ) -> Result<Added, CountError> {
        let named = match cond {
            Some(text) => Cond::names_parameters(text)?,
            None => false,
        };
        if spec.trim_end().ends_with("%return") {
            return Err(CountError::Return {
                spec: spec.to_string(),
            });
        }
        if session.config().follow_forks {
            return Err(CountError::FollowForks);
        }
        let cond = match cond {
            Some(text) if named => return self.place_named(session, t, spec, text),
            c => c.map(Cond::parse).transpose()?,
        };
        let recorded = session.config().fast_path.record_args.min(6);
        let needed = cond.as_ref().map_or(0, Cond::args_needed);
        if needed > recorded {
            return Err(CountError::TooFewArgs { needed, recorded });
        }
        let added = session.add(t, spec, Action::Record)?;
        for p in &added.placements {
            self.add(p.id, cond.clone());
        }
        Ok(added)
    }

    /// [`CountSink::place`] for a condition naming parameters (checked
    /// already: it parses, the spec is no `%return`, the session follows
    /// no forks): the probes are placed with a chooser that notes each
    /// function's parameters, then the condition compiles per function.
    fn place_named(
        &mut self,
        session: &mut Session,
        t: TargetId,
        spec: &str,
        text: &str,
    ) -> Result<Added, CountError> {
        let pid = session.pid(t).ok_or(CountError::NamesNeedAProcess)?;
        let typing = Rc::new(Typing::new(pid));
        session.set_capture(Some(typing.name_chooser()));
        let added = session.add(t, spec, Action::Record);
        session.set_capture(None);
        let added = added?;
        let recorded = session.config().fast_path.record_args.min(6);
        // A probe on a library not loaded yet: compiled when it is.
        let (pending, now): (Vec<_>, Vec<_>) = added
            .placements
            .iter()
            .partition(|p| p.mechanism == crate::Mechanism::Pending);
        let compiled: Result<Vec<Cond>, CountError> = now
            .iter()
            .map(|p| {
                let c = named_cond(&typing, p, text)?;
                let needed = c.args_needed();
                if needed > recorded {
                    return Err(CountError::TooFewArgs { needed, recorded });
                }
                Ok(c)
            })
            .collect();
        match compiled {
            Ok(conds) => {
                for (p, c) in now.iter().zip(conds) {
                    self.add(p.id, Some(c));
                }
                for p in pending {
                    let c = DeferredCond::new(text, typing.clone());
                    self.add_pending_named(p.id, c, recorded);
                }
                Ok(added)
            }
            Err(e) => {
                // Nothing stays placed for a refused condition. A probe
                // that cannot be removed is the worse news: that error
                // is the one returned.
                let mut removing = Ok(());
                for p in &added.placements {
                    let r = session.remove_probe(p.id);
                    if removing.is_ok() {
                        removing = r;
                    }
                }
                removing?;
                Err(e)
            }
        }
    }

    /// Follows probe `id` on a USDT marker: its hits count when `cond`
    /// ([`crate::cond::usdt_cond`]) holds for the marker's arguments,
    /// which the probe captures at each hit
    /// ([`crate::typed::usdt_capture`] as its capture).
    pub fn add_usdt(&mut self, id: ProbeId, cond: Cond) {
        self.add(id, Some(cond));
        self.usdt.insert(id.0);
    }

    /// Follows probe `id` whose condition could not be compiled for the
    /// function or marker it was placed on (a program a followed process
    /// executed, without DWARF or without the parameter the condition
    /// names): whether a hit satisfies it cannot be told, so its hits are
    /// not counted, and [`CountSink::uncountable_hits`] says how many.
    pub fn add_uncountable(&mut self, id: ProbeId) {
        self.add(id, None);
        self.uncountable.insert(id.0);
    }

    /// Follows pending probe `id` (its module not loaded yet) whose
    /// condition `cond` names parameters: compiled when the probe is armed
    /// ([`EventSink::pending_armed`]), from the module's DWARF, comparing
    /// at most the `recorded` argument registers the session records.
    /// Until then, and where it does not compile (no DWARF, no such
    /// parameter: said in [`CountSink::take_notices`]), its hits are not
    /// counted ([`CountSink::uncountable_hits`]).
    pub fn add_pending_named(&mut self, id: ProbeId, cond: DeferredCond, recorded: u8) {
        self.add_uncountable(id);
        self.deferred.insert(id.0, (cond, recorded));
    }

    /// Why conditions of pending probes did not compile when they were
    /// armed (each a line that names the probe, the condition and the
    /// reason), since the last call.
    pub fn take_notices(&mut self) -> Vec<String> {
        std::mem::take(&mut self.notices)
    }

    /// Why the condition of pending probe `id` did not compile when it
    /// was last armed ([`CountSink::add_pending_named`]): its hits are not
    /// counted. `None` when it compiled, or was not armed yet.
    pub fn not_compiled(&self, id: ProbeId) -> Option<&str> {
        self.not_compiled.get(&id.0).map(String::as_str)
    }

    /// Hits of probes followed with [`CountSink::add_uncountable`]: not
    /// counted.
    pub fn uncountable_hits(&self) -> u64 {
        self.uncountable_hits
    }

    /// Hits of USDT probes whose condition named an argument that could
    /// not be read (memory not mapped): not counted.
    pub fn usdt_unread(&self) -> u64 {
        self.usdt_unread
    }

    /// Counts an entry or hit whose condition is evaluated on `args`.
    fn count_entry(&mut self, ev: &RecordedEvent, args: &[u64], unread: bool) {
        let ok = !unread && self.conds.get(&ev.probe_id).is_none_or(|c| c.eval(args));
        if ok {
            *self.hits.entry(ev.probe_id).or_default() += 1;
            *self.thread_hits.entry((ev.probe_id, ev.tid)).or_default() += 1;
        }
        if self.hist && ev.kind == KIND_ENTRY {
            self.stacks
                .entry(ev.tid)
                .or_default()
                .push((ev.probe_id, ev.tsc, ok));
        }
    }

    /// Whether probe `id` is followed ([`CountSink::add`]).
    pub fn follows(&self, id: ProbeId) -> bool {
        self.hits.contains_key(&id.0)
    }

    /// The entries of probe `id` whose condition held so far (`None` for
    /// a probe not followed).
    pub fn hits(&self, id: ProbeId) -> Option<u64> {
        self.hits.get(&id.0).copied()
    }

    /// Every followed probe's count, by raw probe id.
    pub fn all_hits(&self) -> &HashMap<u32, u64> {
        &self.hits
    }

    /// Every followed probe's count per thread, by (raw probe id, thread
    /// id): only (probe, thread) pairs with a counted entry.
    pub fn thread_hits(&self) -> &HashMap<(u32, u32), u64> {
        &self.thread_hits
    }

    /// Every followed probe's count per process, by (raw probe id, pid),
    /// each thread's counts given to `process_of(tid)` (a thread it does
    /// not know: counted as a process of its own id, as a main thread is).
    pub fn process_hits(
        &self,
        process_of: impl Fn(u32) -> Option<i32>,
    ) -> HashMap<(u32, i32), u64> {
        let mut out: HashMap<(u32, i32), u64> = HashMap::new();
        for ((probe, tid), n) in &self.thread_hits {
            let pid = process_of(*tid).unwrap_or(*tid as i32);
            *out.entry((*probe, pid)).or_default() += n;
        }
        out
    }

    /// The histogram (nanoseconds) of the durations of probe `id`'s
    /// counted calls; `None` without `hist` or for a probe not followed.
    pub fn histogram(&self, id: ProbeId) -> Option<&Histogram> {
        self.hists.get(&id.0)
    }

    /// Every followed probe's histogram, by raw probe id (empty without
    /// `hist`).
    pub fn all_histograms(&self) -> &HashMap<u32, Histogram> {
        &self.hists
    }

    /// Events lost in full rings: the counts are low by up to this many.
    pub fn lost_events(&self) -> u64 {
        self.lost
    }
}

impl EventSink for CountSink {
    /// A pending probe with a deferred condition
    /// ([`CountSink::add_pending_named`]) was armed: its condition
    /// compiles for the function it is on now, or its hits stay not
    /// counted and a notice says why.
    fn pending_armed(&mut self, armed: &crate::ArmedPending) -> Result<(), SinkError> {
        let id = armed.placement.id;
        let Some((cond, recorded)) = self.deferred.get(&id.0).cloned() else {
            return Ok(());
        };
        let compiled = cond.compile(armed).map_err(CountError::from).and_then(|c| {
            let needed = c.args_needed();
            if needed > recorded {
                return Err(CountError::TooFewArgs { needed, recorded });
            }
            Ok(c)
        });
        match compiled {
            Ok(c) => {
                self.add(id, Some(c));
                self.not_compiled.remove(&id.0);
            }
            Err(e) => {
                self.add_uncountable(id);
                let why = format!(
                    "pid {}: `{} if {}`: {e}; its hits are not counted",
                    armed.pid,
                    armed.placement.label,
                    cond.text()
                );
                self.not_compiled.insert(id.0, why.clone());
                self.notices.push(why);
            }
        }
        Ok(())
    }

    fn event(&mut self, ev: &RecordedEvent) -> Result<(), SinkError> {
        match ev.kind {
            KIND_ENTRY | KIND_HIT if self.uncountable.contains(&ev.probe_id) => {
                self.uncountable_hits += 1;
                self.count_entry(ev, &[], true);
            }
            KIND_ENTRY | KIND_HIT if self.usdt.contains(&ev.probe_id) => {
                // The marker's arguments come with the captured bytes
                // (`event_data`): without them, none could be read.
                self.usdt_unread += 1;
                self.count_entry(ev, &[], true);
            }
            KIND_ENTRY | KIND_HIT => {
                let n = (ev.nargs as usize).min(ev.args.len());
                let args = ev.args;
                self.count_entry(ev, &args[..n], false);
            }
            KIND_EXIT if self.hist => {
                let stack = self.stacks.entry(ev.tid).or_default();
                // Frames left without an exit (longjmp) are dropped with it.
                if let Some(i) = stack.iter().rposition(|f| f.0 == ev.probe_id) {
                    let (probe, t0, ok) = stack[i];
                    stack.truncate(i);
                    if ok {
                        let ns = ev.tsc.saturating_sub(t0) as f64 / self.ticks_per_ns;
                        self.hists.entry(probe).or_default().add(ns as u64);
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn event_data(&mut self, ev: &RecordedEvent, data: &[u8]) -> Result<(), SinkError> {
        let usdt = self.usdt.contains(&ev.probe_id) && !self.uncountable.contains(&ev.probe_id);
        if !(usdt && matches!(ev.kind, KIND_ENTRY | KIND_HIT)) {
            return self.event(ev);
        }
        let values = crate::cond::usdt_values(data);
        let read: Vec<u64> = values.iter().map(|v| v.unwrap_or(0)).collect();
        // An argument the condition names that could not be read: the
        // condition cannot be told (not counted, said).
        let unread = self
            .conds
            .get(&ev.probe_id)
            .is_some_and(|c| names_unread(c, &values));
        if unread {
            self.usdt_unread += 1;
        }
        self.count_entry(ev, &read, unread);
        Ok(())
    }

    fn lost(&mut self, _tid: u32, _ts: u64, count: u64) -> Result<(), SinkError> {
        self.lost += count;
        Ok(())
    }
}

/// Whether condition `c` compares a value of `values` that is `None`.
fn names_unread(c: &Cond, values: &[Option<u64>]) -> bool {
    use crate::cond::Operand;
    let missing = |o: &Operand| match *o {
        Operand::Arg(k) | Operand::Param { reg: k, .. } => {
            values.get(usize::from(k)).copied().flatten().is_none()
        }
        Operand::Const(_) => false,
    };
    match c {
        Cond::Cmp(a, _, b) => missing(a) || missing(b),
        Cond::And(a, b) | Cond::Or(a, b) => names_unread(a, values) || names_unread(b, values),
        Cond::Not(a) => names_unread(a, values),
    }
}

/// The time stamp counter's ticks per nanosecond, measured over 10 ms (the
/// fast path's events carry TSC time stamps).
pub fn tsc_ticks_per_ns() -> f64 {
    let pair = || {
        let t0 = std::time::Instant::now();
        // SAFETY: rdtsc has no preconditions on x86-64.
        let tsc = unsafe { core::arch::x86_64::_rdtsc() };
        (tsc, t0)
    };
    let (a, t0) = pair();
    std::thread::sleep(Duration::from_millis(10));
    let (b, t1) = pair();
    let ns = t1.duration_since(t0).as_nanos().max(1) as f64;
    (b.wrapping_sub(a) as f64 / ns).max(1e-3)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(kind: u8, probe: u32, tid: u32, tsc: u64, args: &[u64]) -> RecordedEvent {
        let mut e = RecordedEvent {
            kind,
            probe_id: probe,
            tid,
            tsc,
            nargs: args.len() as u8,
            ..RecordedEvent::default()
        };
        e.args[..args.len()].copy_from_slice(args);
        e
    }

    #[test]
    fn counts_the_entries_whose_condition_holds() {
        let mut s = CountSink::new(false);
        s.add(ProbeId(1), Some(Cond::parse("arg0 > 256").unwrap()));
        s.add(ProbeId(2), None);
        for (i, a) in [0u64, 100, 300, 1000, 256, 257, u64::MAX]
            .iter()
            .enumerate()
        {
            s.event(&ev(KIND_ENTRY, 1, 7, i as u64, &[*a])).unwrap();
            s.event(&ev(KIND_ENTRY, 2, 7, i as u64, &[*a])).unwrap();
        }
        assert_eq!(s.hits(ProbeId(1)), Some(3), "300, 1000, 257 (-1 is signed)");
        assert_eq!(s.hits(ProbeId(2)), Some(7));
        assert_eq!(s.hits(ProbeId(3)), None);
        assert!(s.follows(ProbeId(2)) && !s.follows(ProbeId(3)));
        s.event(&ev(KIND_ENTRY, 1, 9, 9, &[500])).unwrap();
        s.event(&ev(KIND_ENTRY, 1, 10, 9, &[1])).unwrap();
        assert_eq!(s.thread_hits()[&(1, 7)], 3);
        assert_eq!(s.thread_hits()[&(1, 9)], 1);
        assert!(!s.thread_hits().contains_key(&(1, 10)), "condition false");
        // Threads 7 and 9 in process 7.
        let by = s.process_hits(|t| (t == 9).then_some(7));
        assert_eq!(by[&(1, 7)], 4);
        assert_eq!(by[&(2, 7)], 7);
        assert_eq!(by.len(), 2);
        assert!(s.histogram(ProbeId(1)).is_none());
        s.lost(7, 0, 4).unwrap();
        assert_eq!(s.lost_events(), 4);
    }

    #[test]
    fn hits_of_an_uncountable_probe_are_not_counted_and_said() {
        let mut s = CountSink::new(false);
        s.add_uncountable(ProbeId(3));
        s.add(ProbeId(4), Some(Cond::parse("arg0 > 1").unwrap()));
        for a in [0u64, 5, 9] {
            s.event(&ev(KIND_ENTRY, 3, 7, 0, &[a])).unwrap();
            s.event(&ev(KIND_ENTRY, 4, 7, 0, &[a])).unwrap();
        }
        s.event_data(&ev(KIND_ENTRY, 3, 7, 0, &[1]), &[]).unwrap();
        assert_eq!(s.hits(ProbeId(3)), Some(0));
        assert_eq!(s.uncountable_hits(), 4);
        assert_eq!(s.hits(ProbeId(4)), Some(2));
        assert!(s.thread_hits().keys().all(|(p, _)| *p == 4));
    }

    #[test]
    fn histograms_match_exits_per_thread() {
        let mut s = CountSink::with_conditions(
            HashMap::from([(1, Cond::parse("arg0 == 1").unwrap())]),
            true,
            &[1],
        );
        // Thread 7: a counted call; thread 8: one not counted, interleaved.
        s.event(&ev(KIND_ENTRY, 1, 7, 1000, &[1])).unwrap();
        s.event(&ev(KIND_ENTRY, 1, 8, 1000, &[2])).unwrap();
        s.event(&ev(KIND_EXIT, 1, 8, 2000, &[])).unwrap();
        s.event(&ev(KIND_EXIT, 1, 7, 5000, &[])).unwrap();
        // An exit without an entry is ignored.
        s.event(&ev(KIND_EXIT, 1, 9, 5000, &[])).unwrap();
        assert_eq!(s.hits(ProbeId(1)), Some(1));
        assert_eq!(s.histogram(ProbeId(1)).unwrap().count(), 1);
    }
}
