//! What `count`, `trace`, `record` and `demo` share: a
//! [`hotprobe::Session`] opened on a spawned or attached process, probe
//! specs added with an action (the session picks each site's mechanism),
//! the run until the target exits, Ctrl-C or `--duration`, and the exit
//! status. Everything else is the library's.

use crate::out::errln;
use crate::signals::{self, StopReason};
use anyhow::{bail, Context, Result};
use hotprobe::trace::{fmt_duration, Histogram};
use hotprobe::{
    Action, EventSink, ExitStatus, Placement, RunEnd, Session, SessionConfig, TargetId,
};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

/// How long a spawned command gets to exit by itself after Ctrl-C (the
/// terminal sent it the same SIGINT) before hotprobe detaches from it.
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);

/// A process under a session.
pub struct Traced {
    /// The session holding the target.
    pub session: Session,
    /// The target's id in the session.
    pub target: TargetId,
    /// Its process id.
    pub pid: i32,
    /// Started by us (`-- CMD`) rather than attached (`-p PID`).
    pub spawned: bool,
    /// ptrace stops the process took between the start of [`Traced::run`]
    /// and the end of its event loop (set by `run`).
    pub run_stops: Option<u64>,
    /// The caller prints how the process ended itself (`record`'s
    /// summary): the session's notice saying the same is not printed.
    pub end_said_later: bool,
    /// Matches of patterns that were not probed, with why: listed at the
    /// end ([`Traced::print_skipped`]).
    pub skipped: Vec<hotprobe::Skipped>,
    /// Patterns each of whose matches was skipped (`--no-traps`, a forced
    /// mechanism): the other specs run ([`Traced::check_placed`]).
    pub unplaced: Vec<String>,
    /// `--exe`/`--comm`: no process of its own; every matching process,
    /// running or started later, is taken ([`Traced::waiting`]).
    pub waiting: Option<hotprobe::ProcessMatch>,
}

impl Traced {
    /// Attach to `pid`, or start `cmd` stopped before its code runs.
    pub fn open(config: SessionConfig, pid: Option<i32>, cmd: &[OsString]) -> Result<Traced> {
        let mut session = Session::with_config(config);
        let target = match (pid, cmd.split_first()) {
            (Some(pid), None) => session.attach(pid)?,
            (None, Some((prog, args))) => session.spawn(Path::new(prog), args)?,
            _ => bail!("give either -p PID or -- CMD ARGS"),
        };
        let pid = session.pid(target).unwrap_or(0);
        let spawned = session.is_spawned(target);
        for n in session.take_notices() {
            errln!("hotprobe: {n}");
        }
        Ok(Traced {
            session,
            target,
            pid,
            spawned,
            run_stops: None,
            end_said_later: false,
            skipped: Vec::new(),
            unplaced: Vec::new(),
            waiting: None,
        })
    }

    /// `--exe PATH` / `--comm NAME`: a session that takes each matching
    /// process, those running when [`Traced::run`] starts and those that
    /// start later, until Ctrl-C or `--duration`. Needs root.
    pub fn waiting(config: SessionConfig, what: hotprobe::ProcessMatch) -> Result<Traced> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            bail!(crate::UsageError(
                "--exe and --comm need root: new processes are held at their exec through \
                 fanotify (CAP_SYS_ADMIN) and seized with ptrace"
                    .into()
            ));
        }
        Ok(Traced {
            session: Session::with_config(config),
            target: TargetId(usize::MAX),
            pid: 0,
            spawned: false,
            run_stops: None,
            end_said_later: false,
            skipped: Vec::new(),
            unplaced: Vec::new(),
            waiting: Some(what),
        })
    }

    /// Leave the target as it was after a failure: an attached one is
    /// detached (code restored, running on); a spawned one is killed when
    /// the session drops.
    pub fn abandon(mut self) {
        if !self.spawned {
            let _ = self.session.detach();
        }
        self.print_skipped();
        self.print_notices();
    }

    /// Adds every spec with the action `action(spec)` makes; matches of a
    /// pattern that cannot be probed are skipped with a warning. A
    /// progress bar shows when there are many.
    pub fn add_all(
        &mut self,
        specs: &[String],
        mut action: impl FnMut(&str) -> Action,
    ) -> Result<Vec<Placement>> {
        if self.waiting.is_some() {
            return self.add_for_new_processes(specs, action);
        }
        let bar = progress(specs.len() as u64, "placing probes");
        let mut placed = Vec::new();
        for spec in specs {
            bar.set_message(spec.clone());
            let added = match self.session.add(self.target, spec, action(spec)) {
                Ok(a) => a,
                Err(e) => {
                    bar.suspend(|| self.print_skipped());
                    return Err(match e {
                        // Says which spec already.
                        e @ (hotprobe::EngineError::RefusedSpec { .. }
                        | hotprobe::EngineError::Symbol(
                            hotprobe::SymbolError::Unprobeable { .. },
                        )) => e.into(),
                        e => anyhow::Error::from(e).context(format!("cannot probe {spec}")),
                    });
                }
            };
            let some_skipped = !added.skipped.is_empty();
            self.skipped.extend(added.skipped);
            if added.placements.is_empty() {
                bar.suspend(|| self.print_skipped());
                if !some_skipped {
                    bail!("no function matching `{spec}` can be probed");
                }
                // Its matches are listed with their reasons: the other
                // specs' probes run (issue 23: `--no-traps` or a forced
                // mechanism does not end the run at the first pattern
                // it leaves empty).
                self.unplaced.push(spec.clone());
            }
            placed.extend(added.placements);
            bar.inc(1);
        }
        bar.finish_and_clear();
        Ok(placed)
    }

    /// After every spec was added: an error when nothing at all was
    /// placed and some pattern had every match skipped, else a line per
    /// such pattern saying the run goes on without it.
    pub fn check_placed(&self, placed: &[Placement]) -> Result<()> {
        if let (true, Some(spec)) = (placed.is_empty(), self.unplaced.first()) {
            bail!("no function matching `{spec}` can be probed");
        }
        for spec in &self.unplaced {
            errln!(
                "hotprobe: no function matching `{spec}` can be probed (reasons above): left out"
            );
        }
        Ok(())
    }

    /// [`Traced::add_all`] with `--exe`/`--comm`: each spec is placed in
    /// every process taken; a placeholder placement stands for it.
    fn add_for_new_processes(
        &mut self,
        specs: &[String],
        mut action: impl FnMut(&str) -> Action,
    ) -> Result<Vec<Placement>> {
        let mut placed = Vec::new();
        for (k, spec) in specs.iter().enumerate() {
            let record = matches!(action(spec), Action::Record);
            self.session
                .add_for_new_processes(spec, record)
                .with_context(|| format!("cannot probe {spec}"))?;
            placed.push(Placement {
                id: hotprobe::ProbeId(u32::MAX - k as u32),
                label: spec.clone(),
                addr: hotprobe::RuntimeAddr(0),
                function: None,
                module: String::new(),
                is_return: spec.ends_with("%return"),
                mechanism: hotprobe::Mechanism::Pending,
                reason: "placed in each process taken".into(),
                execution: "at exec".into(),
                entry_only: None,
            });
        }
        Ok(placed)
    }

    /// Lists (on stderr) the matches of patterns that were not probed,
    /// one `hotprobe: skipping LABEL: REASON` line each, and forgets them.
    pub fn print_skipped(&mut self) {
        for s in self.skipped.drain(..) {
            errln!("hotprobe: skipping {}: {}", s.label, s.reason);
        }
    }

    /// Lets the target run with its probes, handling events (and handing
    /// recorded ones to `sink`) until it exits, a signal arrives or
    /// `duration` elapses; then ends the run (see [`Session::finish`]) and
    /// prints what happened on stderr. The recorded events reach `sink`
    /// even when this fails.
    pub fn run(
        &mut self,
        placed: &[Placement],
        duration: Option<Duration>,
        mut sink: Option<&mut dyn EventSink>,
    ) -> Result<()> {
        if let Some(what) = self.waiting.clone() {
            for pid in self.session.take_new_processes(what.clone())? {
                let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
                errln!("hotprobe: attached to pid {pid} ({})", comm.trim_end());
            }
            let which = match &what {
                hotprobe::ProcessMatch::Exe(p) => format!("running {}", p.display()),
                hotprobe::ProcessMatch::Comm(c) => format!(
                    "named {c} (held at their exec when their program's file is named so; \
                     one run through a link of another name is not)"
                ),
            };
            errln!("hotprobe: waiting for processes {which} (Ctrl-C or --duration ends)");
        }
        self.session.start()?;
        let verb = if self.spawned {
            "started"
        } else {
            "attached to"
        };
        if self.waiting.is_none() {
            errln!(
                "hotprobe: {verb} pid {}: {} probes ({})",
                self.pid,
                placed.len(),
                mechanism_summary(placed)
            );
        }
        for p in placed {
            if let Some(why) = &p.entry_only {
                errln!(
                    "hotprobe: {}: entries only, no return hooked ({why})",
                    p.label
                );
            }
        }
        // What the start said (a target without the agent, whose int3s a
        // hotprobe killed with SIGKILL would leave in) is said now, not
        // after the run a SIGKILL never reaches.
        self.print_notices();
        if let Some(d) = duration {
            signals::stop_after(d);
            // The timer's signal may come just before the loop blocks: no
            // wait goes past the end.
            self.session
                .set_wait_deadline(Some(std::time::Instant::now() + d));
        }
        // An attached process is let go when the output's reader goes
        // away (it runs on by itself); a command hotprobe started runs to
        // its end under its probes, as it would with its output unread.
        if !self.spawned {
            signals::stop_when_output_closes();
        }
        // A tracer come to a process with in-process traps is said at once.
        self.session.set_urgent_notices(|n| errln!("hotprobe: {n}"));
        let stops = self.session.ptrace_stops(self.target);
        let end = self.session.run_with(&signals::STOP, sink.as_deref_mut());
        // The end's own waits (a grace for the program, detach) are not
        // cut to 1 ms by the run's deadline.
        self.session.set_wait_deadline(None);
        self.run_stops = stops
            .zip(self.session.ptrace_stops(self.target))
            .map(|(a, b)| b.saturating_sub(a));
        let end = match end {
            Ok(end) => end,
            Err(e) => {
                let _ = self.session.finish(Duration::ZERO, sink);
                self.print_notices();
                return Err(e).context("the event loop failed; detached");
            }
        };
        if end != RunEnd::AllExited {
            let reason = signals::stop_reason();
            let grace = match reason {
                Some(StopReason::Signal(libc::SIGINT)) if self.spawned => INTERRUPT_GRACE,
                _ => Duration::ZERO,
            };
            let finished = self.session.finish(grace, sink);
            if self.waiting.is_some() {
                errln!(
                    "hotprobe: {}: stopped waiting; the processes still running run on with \
                     their code restored",
                    match reason {
                        Some(StopReason::Timer) => "duration elapsed",
                        _ => "interrupted",
                    }
                );
            } else if let Some(ExitStatus::Disconnected(_)) | None = self.status() {
                let why = match reason {
                    Some(StopReason::Timer) => "duration elapsed".to_string(),
                    Some(StopReason::OutputClosed) => "the output's reader went away".to_string(),
                    Some(StopReason::Signal(libc::SIGINT)) => "interrupted".to_string(),
                    Some(StopReason::Signal(s)) => format!("signal {s}"),
                    None => "stopped".to_string(),
                };
                if self.spawned {
                    errln!(
                        "hotprobe: {why}: detached from pid {} (started by hotprobe), \
                         which runs on without probes",
                        self.pid
                    );
                } else {
                    errln!(
                        "hotprobe: {why}: detached from pid {}, which runs on with its code restored",
                        self.pid
                    );
                }
            }
            // What the detach found is said even when it failed.
            self.print_notices();
            finished.with_context(|| format!("cannot detach from pid {}", self.pid))?;
        }
        self.print_notices();
        Ok(())
    }

    /// How the target ended, if it did.
    pub fn status(&self) -> Option<ExitStatus> {
        self.session.exit_status(self.target)
    }

    /// hotprobe's exit code: the command's own, 128+N when it died of
    /// signal N (as `time` and `strace` do); 130 when hotprobe was
    /// interrupted and detached from a command still running; else 0.
    pub fn exit_code(&self) -> u8 {
        match self.status() {
            // Attached and detached: the process runs on, nothing failed.
            Some(ExitStatus::Disconnected(_)) | None if !self.spawned => 0,
            st => exit_code(st.as_ref()),
        }
    }

    /// Prints the session's notices gathered since the last call.
    pub fn print_notices(&mut self) {
        let end = match self.status() {
            Some(st) if self.end_said_later => Some(format!("pid {} {st}", self.pid)),
            _ => None,
        };
        for n in self.session.take_notices() {
            if Some(&n) != end.as_ref() {
                errln!("hotprobe: {n}");
            }
        }
    }
}

/// See [`Traced::exit_code`].
pub fn exit_code(status: Option<&ExitStatus>) -> u8 {
    match status {
        Some(ExitStatus::Code(c)) => (*c & 0xff) as u8,
        Some(ExitStatus::Signal(s)) => (128 + *s).clamp(0, 255) as u8,
        _ if signals::stop_reason() == Some(StopReason::Signal(libc::SIGINT)) => 130,
        _ => 0,
    }
}

/// `patch 3, jump 1, trap 2`.
pub fn mechanism_summary(placed: &[Placement]) -> String {
    let mut by: std::collections::BTreeMap<String, usize> = Default::default();
    for p in placed {
        let m = p.mechanism.to_string();
        let m = m.split(' ').next().unwrap_or("").to_string();
        *by.entry(m).or_default() += 1;
    }
    by.iter()
        .map(|(m, n)| format!("{m} {n}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Most functions on a trap [`print_mechanisms`] names one by one.
const TRAPS_LISTED: usize = 20;

/// `count`'s closing lines on stderr (after the run, pending probes as
/// armed): the probes per mechanism as `record`'s summary gives them
/// ([`mechanism_summary`]), then each probe left on a trap (ptrace or
/// in-process) with its execution and why, as the table's rows give
/// them, the first [`TRAPS_LISTED`] of
/// them by name and the rest as a number.
pub fn print_mechanisms(placed: &[Placement]) {
    errln!(
        "hotprobe: {} probes by mechanism: {}",
        placed.len(),
        mechanism_summary(placed)
    );
    let traps: Vec<&Placement> = placed.iter().filter(|p| p.mechanism.is_trap()).collect();
    for p in traps.iter().take(TRAPS_LISTED) {
        errln!(
            "hotprobe: on a trap: {} ({}): {}",
            p.label,
            p.execution,
            p.reason
        );
    }
    if traps.len() > TRAPS_LISTED {
        errln!(
            "hotprobe: on a trap: {} more (the table's EXECUTION and WHY, with --all, give each)",
            traps.len() - TRAPS_LISTED
        );
    }
}

/// What `count` adds to the table of [`print_table_with`].
#[derive(Default)]
pub struct TableExtras<'a> {
    /// Hits to show instead of the session's, per probe id (`count` with
    /// conditions or `--hist`: the entries the recording sink saw).
    pub hits: Option<&'a HashMap<u32, u64>>,
    /// Hits per (probe id, pid) to show in the rows of each process
    /// (`count -f` with conditions or `--hist`).
    pub process_hits: Option<&'a HashMap<(u32, i32), u64>>,
    /// The condition of a probe id (`PROBE if CONDITION`).
    pub conditions: Option<&'a HashMap<u32, String>>,
    /// Call durations per probe id (`count --hist`).
    pub hists: Option<&'a HashMap<u32, Histogram>>,
    /// One JSON array of row objects instead of the text table.
    pub json: bool,
    /// The guest of each probe id (`guest count` with several guests): a
    /// GUEST column after PROBE (`guest` in JSON).
    pub guests: Option<&'a HashMap<u32, String>>,
    /// The aggregation of each probe id as JSON (`count --json` with
    /// `--hist=VALUE`, `--lhist`, `--by`): on the probe's first row.
    pub aggregations: Option<&'a HashMap<u32, serde_json::Value>>,
    /// The command name of the image each probe id was placed in (`-f`
    /// across exec): a COMM column after PID (`comm` in JSON).
    pub comms: Option<&'a HashMap<u32, String>>,
    /// Probe ids whose hits were not counted (`count` with a condition
    /// that did not compile where the probe was placed): HITS `-` and a
    /// footnote (`hits` null and `not_counted` true in JSON), not 0.
    pub not_counted: Option<&'a std::collections::HashSet<u32>>,
}

/// Print the per-probe table on stdout: spec, address, hits (returns for a
/// `%return` probe), nmissed, execution, and why
/// that mechanism; with `per_process`, a PID column and a row per probe and
/// process that hit it (the first process always).
pub fn print_table(session: &Session, placed: &[Placement], per_process: bool) {
    print_table_with(session, placed, per_process, &TableExtras::default());
}

/// [`print_table`] with `count`'s extras: hits from a recording sink,
/// histograms after the table, or the rows as JSON (one line: an array of
/// objects with the fields `probe`, `pid` (with `per_process`), `address`,
/// `hits`, `nmissed` (null but for return probes), `execution`, `why`, and
/// `condition` and `histogram` when there are).
pub fn print_table_with(
    session: &Session,
    placed: &[Placement],
    per_process: bool,
    x: &TableExtras<'_>,
) {
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut json_rows: Vec<serde_json::Value> = Vec::new();
    let mut aggregated = std::collections::HashSet::new();
    let mut footnote = false;
    for p in placed {
        note_vfork_uncounted(session, p);
        let by = session.stats_by_process(p.id).unwrap_or_default();
        let by: Vec<(i32, hotprobe::ProbeStats)> = if per_process {
            by.into_iter()
                .enumerate()
                .filter(|(i, (_, st))| *i == 0 || st.hits + st.returns + st.nmissed > 0)
                .map(|(_, x)| x)
                .collect()
        } else {
            vec![(0, session.stats(p.id).unwrap_or_default())]
        };
        for (pid, st) in by {
            // NMISSED: calls not followed (return probes), hits not handled
            // (trap re-entry), events the fast path could not write.
            let (mut hits, mut missed) = if p.is_return {
                (st.returns, st.nmissed.to_string())
            } else {
                (st.hits, st.nmissed.to_string())
            };
            if let Some(h) = x.hits {
                hits = h.get(&p.id.0).copied().unwrap_or(0);
                missed = "-".to_string();
            }
            if let (true, Some(h)) = (per_process, x.process_hits) {
                hits = h.get(&(p.id.0, pid)).copied().unwrap_or(0);
            }
            let uncounted = x.not_counted.is_some_and(|n| n.contains(&p.id.0));
            footnote |= uncounted;
            if x.json {
                let mut o = serde_json::json!({
                    "probe": p.label,
                    "address": format!("{:#x}", p.addr.0),
                    "hits": Some(hits).filter(|_| !uncounted),
                    "nmissed": missed.parse::<u64>().ok(),
                    "execution": p.execution,
                    "why": p.reason,
                });
                if per_process {
                    o["pid"] = pid.into();
                }
                if uncounted {
                    o["not_counted"] = true.into();
                }
                if let Some(c) = x.comms.and_then(|c| c.get(&p.id.0)) {
                    o["comm"] = c.as_str().into();
                }
                if let Some(g) = x.guests.and_then(|g| g.get(&p.id.0)) {
                    o["guest"] = g.as_str().into();
                }
                if let Some(c) = x.conditions.and_then(|c| c.get(&p.id.0)) {
                    o["condition"] = c.as_str().into();
                }
                if let Some(h) = x.hists.and_then(|h| h.get(&p.id.0)) {
                    o["histogram"] = serde_json::to_value(h).unwrap_or_default();
                }
                // Over every process: once, on the probe's first row.
                if let Some(a) = x.aggregations.and_then(|a| a.get(&p.id.0)) {
                    if aggregated.insert(p.id) {
                        o["aggregation"] = a.clone();
                    }
                }
                json_rows.push(o);
            }
            let mut row = vec![p.label.clone()];
            if let Some(g) = x.guests {
                row.push(g.get(&p.id.0).cloned().unwrap_or_default());
            }
            if per_process {
                row.push(pid.to_string());
            }
            if let Some(c) = x.comms {
                row.push(c.get(&p.id.0).cloned().unwrap_or_default());
            }
            row.extend([
                format!("{:#x}", p.addr.0),
                if uncounted {
                    "-".to_string()
                } else {
                    hits.to_string()
                },
                missed,
                p.execution.clone(),
                p.reason.clone(),
            ]);
            rows.push(row);
        }
    }
    if x.json {
        let line = serde_json::Value::Array(json_rows).to_string();
        crate::out::line(format_args!("{line}"));
        return;
    }
    let mut head = vec!["PROBE"];
    if x.guests.is_some() {
        head.push("GUEST");
    }
    if per_process {
        head.push("PID");
    }
    if x.comms.is_some() {
        head.push("COMM");
    }
    head.extend(["ADDRESS", "HITS", "NMISSED", "EXECUTION", "WHY"]);
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    // Numbers right-aligned, text left; the last column unpadded.
    let numeric = |h: &str| matches!(h, "PID" | "GUEST" | "HITS" | "NMISSED");
    let line = |c: &[String]| {
        let mut l = String::new();
        for (i, cell) in c.iter().enumerate() {
            if i + 1 == c.len() {
                l.push_str(cell);
            } else if numeric(head[i]) {
                l.push_str(&format!("{cell:>width$}  ", width = w[i]));
            } else {
                l.push_str(&format!("{cell:<width$}  ", width = w[i]));
            }
        }
        l.trim_end().to_string()
    };
    let mut out = String::new();
    // A terminal echoed `^C` where the cursor was: start on a line of our own.
    if signals::stop_reason() == Some(StopReason::Signal(libc::SIGINT))
        && std::io::IsTerminal::is_terminal(&std::io::stdout())
    {
        out.push('\n');
    }
    let head_cells: Vec<String> = head.iter().map(|h| h.to_string()).collect();
    out.push_str(&line(&head_cells));
    out.push('\n');
    for r in &rows {
        out.push_str(&line(r));
        out.push('\n');
    }
    if footnote {
        out.push_str(
            "\nHITS -: not counted: the probe's condition does not compile where it was placed \
             (said on stderr)\n",
        );
    }
    if let Some(hists) = x.hists {
        out.push('\n');
        for p in placed {
            let Some(h) = hists.get(&p.id.0) else {
                continue;
            };
            let name = p.label.trim_end_matches("%return");
            out.push_str(&format!(
                "\n# {name}: {} calls, avg {}, min {}, max {}\n",
                h.count(),
                fmt_duration(h.avg_ns()).trim(),
                fmt_duration(h.min_ns()).trim(),
                fmt_duration(h.max_ns()).trim()
            ));
            out.push_str(&h.to_text());
        }
    }
    crate::out::line(format_args!("{}", out.trim_end()));
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if let Ok(style) =
        ProgressStyle::with_template(&format!("{{spinner}} {what} {{pos}}/{{len}} {{wide_msg}}"))
    {
        bar.set_style(style);
    }
    bar
}

/// Says on stderr the hits of probe `p` by vfork children that are in no
/// row: without `-f`, a vfork child runs in its parent's memory, probes
/// included, and its hits are neither counted nor the parent's. One line
/// per probe: the child's pid, or how many children.
fn note_vfork_uncounted(session: &Session, p: &Placement) {
    let by = session.vfork_uncounted(p.id);
    let n: u64 = by.iter().map(|(_, n)| n).sum();
    let hits = if n == 1 { "hit" } else { "hits" };
    match by.as_slice() {
        [] => {}
        [(pid, _)] => errln!(
            "hotprobe: {}: {n} {hits} in vfork child {pid} not counted (-f counts them as its own)",
            p.label
        ),
        more => errln!(
            "hotprobe: {}: {n} {hits} in {} vfork children not counted (-f counts them as their own)",
            p.label,
            more.len()
        ),
    }
}

/// Says on stderr the events of vfork children not recorded (without
/// `-f`: see [`hotprobe::Session::vfork_unrecorded`]), one line.
pub fn note_vfork_unrecorded(session: &Session) {
    let by = session.vfork_unrecorded();
    let n: u64 = by.iter().map(|(_, n)| n).sum();
    match by.as_slice() {
        [] => {}
        [(pid, _)] => errln!(
            "hotprobe: {n} events of vfork child {pid} not recorded (-f records them as its own)"
        ),
        more => errln!(
            "hotprobe: {n} events of {} vfork children not recorded (-f records them as their own)",
            more.len()
        ),
    }
}

/// Says on stderr which functions `-a` has no DWARF for, and how they are
/// `shown`: by name when few, else how many.
pub fn note_untyped(typing: &hotprobe::typed::Typing, shown: &str) {
    let u = typing.untyped();
    match u.len() {
        0 => {}
        1..=5 => errln!(
            "hotprobe: no DWARF for {} (build with -g): {shown}",
            u.join(", ")
        ),
        n => errln!(
            "hotprobe: no DWARF for {n} functions (e.g. {}): {shown}",
            u[..3].join(", ")
        ),
    }
}

/// With exec followed (`-f`): `placed` without the specs that waited for
/// an exec (each said on stderr when no program executed had it), then the
/// probes placed in each program a followed process executed (those of a
/// pattern's match added to `from_pattern`), and the command name of each
/// probe's image for a COMM column. Unchanged when no process executed a
/// program under probes.
pub fn with_exec_rows(
    session: &Session,
    placed: Vec<Placement>,
    from_pattern: &mut std::collections::HashSet<u32>,
) -> (Vec<Placement>, Option<HashMap<u32, String>>) {
    // Pending probes armed since: where they went.
    let placed = session.as_armed(placed);
    let images = session.exec_images();
    let waiting =
        |p: &Placement| p.mechanism == hotprobe::Mechanism::Pending && p.execution == "at exec";
    for p in placed.iter().filter(|p| waiting(p)) {
        if !images.iter().any(|i| !i.missing.contains(&p.label)) {
            errln!(
                "hotprobe: {}: no followed process executed a program that has it",
                p.label
            );
        }
    }
    if images.is_empty() {
        return (placed, None);
    }
    let specs: std::collections::HashSet<String> = placed.iter().map(|p| p.label.clone()).collect();
    let mut rows: Vec<Placement> = placed.into_iter().filter(|p| !waiting(p)).collect();
    for img in images {
        for p in &img.placements {
            if !specs.contains(&p.label) {
                from_pattern.insert(p.id.0);
            }
            rows.push(p.clone());
        }
    }
    let rows = session.as_armed(rows);
    let comms = rows
        .iter()
        .filter_map(|p| Some((p.id.0, session.comm_of(p.id)?)))
        .collect();
    (rows, Some(comms))
}
