//! `record`'s closing summary: what was probed, skipped and drained,
//! and what the traps cost.

use super::*;

/// Why functions could not be probed, grouped by reason.
#[derive(Default)]
pub(super) struct Skipped {
    /// Function names by reason.
    pub(super) by_reason: BTreeMap<String, Vec<String>>,
}

impl Skipped {
    /// Notes `name` as not probeable for `why`.
    pub(super) fn add(&mut self, name: &str, why: String) {
        self.by_reason
            .entry(why)
            .or_default()
            .push(name.to_string());
    }
    /// How many functions.
    pub(super) fn count(&self) -> usize {
        self.by_reason.values().map(Vec::len).sum()
    }
}

/// Cost of one ptrace stop (a trap hit: entry or return) on an idle
/// machine (docs/PERFORMANCE.md, "Trap mechanism"), for the summary's
/// estimate; a loaded machine pays more ("Recording through a trap").
const TRAP_STOP_COST: Duration = Duration::from_micros(10);

/// What recording through traps cost: the functions on the trap
/// mechanism and the ptrace stops their calls took.
#[derive(Default)]
pub(super) struct TrapCost {
    /// Functions recorded through a trap.
    pub(super) functions: usize,
    /// Calls entered through a trap.
    pub(super) entries: u64,
    /// Returns taken through a trap.
    pub(super) returns: u64,
    /// Functions recorded through an in-process trap (no ptrace stop).
    pub(super) inproc_functions: usize,
    /// Calls entered through an in-process trap.
    pub(super) inproc_entries: u64,
    /// ptrace stops while the target ran (None: not known).
    pub(super) run_stops: Option<u64>,
}

impl TrapCost {
    /// The trap costs of `placed` so far.
    pub(super) fn of(session: &hotprobe::Session, placed: &[hotprobe::Placement]) -> TrapCost {
        let mut c = TrapCost::default();
        for p in placed
            .iter()
            .filter(|p| p.mechanism == hotprobe::Mechanism::Trap)
        {
            c.functions += 1;
            if let Some(st) = session.stats(p.id) {
                c.entries += st.hits;
                c.returns += st.returns;
            }
        }
        for p in placed
            .iter()
            .filter(|p| p.mechanism == hotprobe::Mechanism::InProcessTrap)
        {
            c.inproc_functions += 1;
            c.inproc_entries += session.stats(p.id).map_or(0, |st| st.hits);
        }
        c
    }

    /// Every stop: an entry and a return per call.
    fn stops(&self) -> u64 {
        self.entries + self.returns
    }
}

/// What the summary prints.
pub(super) struct Summary<'a> {
    pub(super) how: &'a str,
    pub(super) out: &'a Path,
    pub(super) stats: &'a WriteStats,
    pub(super) drain: &'a DrainStats,
    pub(super) probed: usize,
    /// `patch 3, jump 1`.
    pub(super) mechanisms: &'a str,
    pub(super) left_out: usize,
    pub(super) skipped: &'a Skipped,
    pub(super) traps: &'a TrapCost,
    /// Functions recorded without their returns: they do not return.
    pub(super) entry_only: &'a [&'a str],
    pub(super) elapsed: Duration,
}

/// The one summary `record` prints (on stderr, after the target's output).
pub(super) fn print_summary(s: &Summary<'_>) {
    let st = s.stats;
    let f = &st.filtered;
    errln!("hotprobe: {}; trace in {}", s.how, s.out.display());
    errln!(
        "  probes:   {} functions ({}); {} left out by the patterns (not probed); {} not probeable",
        s.probed,
        s.mechanisms,
        s.left_out,
        s.skipped.count()
    );
    for (why, names) in &s.skipped.by_reason {
        let mut list = names[..names.len().min(5)].join(", ");
        if names.len() > 5 {
            list.push_str(&format!(", … ({} more)", names.len() - 5));
        }
        errln!("            not probed ({why}): {list}");
    }
    if !s.entry_only.is_empty() {
        let names = s.entry_only;
        let mut list = names[..names.len().min(8)].join(", ");
        if names.len() > 8 {
            list.push_str(&format!(", … ({} more)", names.len() - 8));
        }
        errln!(
            "            entry only ({} that do not return: no return hooked): {list}",
            names.len()
        );
    }
    let tc = s.traps;
    if tc.functions > 0 {
        let est = TRAP_STOP_COST.as_secs_f64() * tc.stops() as f64;
        errln!(
            "  traps:    {} functions recorded through a trap (a ptrace stop per call and per \
             return): {} calls, {} stops, ≈ {} of the run at ~{} µs a stop, more on a \
             loaded machine (--no-traps leaves them out)",
            tc.functions,
            tc.entries,
            tc.stops(),
            if est >= 1.0 {
                format!("{est:.2} s")
            } else {
                format!("{:.1} ms", est * 1e3)
            },
            TRAP_STOP_COST.as_micros()
        );
    }
    if tc.inproc_functions > 0 {
        errln!(
            "  in-process: {} functions recorded through in-process traps (an int3 the agent's \
             SIGTRAP handler takes, no ptrace stop): {} calls; ptrace stops while running: {}",
            tc.inproc_functions,
            tc.inproc_entries,
            tc.run_stops.map_or("?".to_string(), |n| n.to_string())
        );
    }
    let bpe = if st.events_out == 0 {
        "-".to_string()
    } else {
        format!("{:.2}", st.bytes_per_event())
    };
    errln!(
        "  events:   {} recorded ({} records, {} threads) of {} drained in {:.2} s; \
         {} bytes of event streams, {bpe} bytes/event",
        st.events_out,
        st.records,
        st.threads,
        s.drain.events,
        s.elapsed.as_secs_f64(),
        st.bytes
    );
    let d = s.drain;
    errln!(
        "  drops:    {} (full rings {}, refused on re-entry {}, both written as lost records; \
         threads without a ring slot {}){}",
        d.ring_drops + d.refused + d.no_slot,
        d.ring_drops,
        d.refused,
        d.no_slot,
        if d.unknown > 0 {
            format!("; {} events of an unknown kind ignored", d.unknown)
        } else {
            String::new()
        }
    );
    errln!(
        "  filtered in the writer (events): depth {}, duration {}, sampling {}, pattern {}; \
         short calls kept around nested records {}, orphan exits {}, clamped timestamps {}",
        f.depth,
        f.duration,
        f.sampling,
        f.pattern,
        f.kept_short,
        f.orphan_exits,
        f.clamped
    );
}

/// Each mechanism's cost per hit, calibrated now, with the mechanism of
/// each probe (`None`, with a warning, when it cannot be measured: the
/// trace then keeps measured times).
pub(super) fn calibrate_costs(
    placed: &[hotprobe::Placement],
) -> Option<hotprobe::trace::ProbeCosts> {
    let costs = hotprobe::calibration::probe_costs(placed)
        .map_err(|e| {
            errln!(
                "hotprobe: warning: cannot calibrate the probes' costs ({e}): the trace keeps \
                 measured times"
            )
        })
        .ok()
        .flatten()?;
    // A class refused stands alone: the others' costs are taken out.
    for u in &costs.uncalibrated {
        errln!(
            "hotprobe: warning: the {} was not calibrated ({}): its hits' cost stays in the \
             times",
            u.label,
            u.why
        );
    }
    Some(costs)
}
