//! `hotprobe record`: a function trace of a spawned program into a trace
//! directory (docs/TRACE_FORMAT.md), through the fast path.
//!
//! The target starts with the hotprobe agent preloaded; every selected
//! function of the main executable gets a record probe with exit events
//! (patch or jump mechanism). The agent writes events into per-thread
//! shared-memory rings; this process drains them while the target runs,
//! converts them ([`TraceEvent::from_abi`]) and feeds a [`TraceWriter`].
//!
//! Where each filter acts:
//! * include/exclude patterns act at the source: functions they leave out
//!   are not probed at all (and cost nothing);
//! * `--max-depth`, `--min-duration`, `--sample` run in the writer, on the
//!   drained events, before anything is written: the target still pays for
//!   every event of the probed functions.

use crate::glob;
use crate::session::progress;
use crate::signals::{self, StopReason};
use anyhow::{bail, Context, Result};
use hotprobe::{ProcessTarget, ResumeMode, SpawnOptions, Target, TargetEvent};
use hotprobe_fastpath::{
    find_agent, Action, FastPath, FastPathConfig, Mechanism, MechanismChoice, RecordedEvent,
};
use hotprobe_symbols::ElfModule;
use hotprobe_trace::{
    Filter, ProbeKind, Symbol, TimeBase, TraceEvent, TraceMeta, TraceWriter, WriteStats,
};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Functions of the C runtime's start-up and tear-down code, never probed
/// by default (not the program's own code; `_start` is where the target
/// stands when probes go in).
const RUNTIME_FUNCTIONS: &[&str] = &[
    "_start",
    "_init",
    "_fini",
    "frame_dummy",
    "register_tm_clones",
    "deregister_tm_clones",
    "__do_global_dtors_aux",
    "__libc_csu_init",
    "__libc_csu_fini",
    "_dl_relocate_static_pie",
];

/// What `record` needs from the command line.
pub struct RecordOptions<'a> {
    /// The trace directory to write.
    pub out: &'a Path,
    /// Include globs (empty: every function of the main executable).
    pub include: &'a [String],
    /// Exclude globs.
    pub exclude: &'a [String],
    /// Phase marker functions.
    pub phases: &'a [String],
    /// `--max-depth`.
    pub max_depth: Option<u32>,
    /// `--min-duration`, in ns.
    pub min_duration_ns: Option<u64>,
    /// `--sample`.
    pub sample: Option<u32>,
    /// Argument registers kept per entry (0–6); >0 also keeps return values.
    pub args: u8,
    /// `--mechanism`.
    pub mechanism: MechanismChoice,
    /// Merge entry+exit pairs into call records.
    pub aggregate: bool,
    /// Events per thread ring.
    pub ring_events: u32,
    /// Thread slots (rings).
    pub max_threads: u32,
    /// Stop after recording this long.
    pub duration: Option<Duration>,
    /// Attach to this running process.
    pub pid: Option<i32>,
    /// Or start this command.
    pub cmd: &'a [OsString],
}

/// A (TSC, CLOCK_MONOTONIC ns) pair taken now.
fn clock_pair() -> (u64, u64) {
    // SAFETY: rdtsc has no preconditions on x86-64.
    let tsc = unsafe { core::arch::x86_64::_rdtsc() };
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (tsc, ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// `prog` as spawn would find it: a path, or the first executable of that
/// name in `$PATH`.
fn resolve_program(prog: &Path) -> Option<PathBuf> {
    if prog.as_os_str().to_string_lossy().contains('/') {
        return Some(prog.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

/// A function chosen to be probed.
struct Chosen {
    name: String,
    marker: bool,
}

/// The functions to probe: those of the main executable that the patterns
/// select (every one when there are none), minus the excluded ones and
/// the C runtime's; plus the phase markers. Returns them and how many
/// functions the patterns left out.
fn choose(o: &RecordOptions<'_>, module: &ElfModule) -> Result<(Vec<Chosen>, usize)> {
    let mut names: Vec<&str> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for f in module.functions() {
        if f.name.is_empty() || f.addr.0 == 0 || !seen.insert(f.name.as_str()) {
            continue;
        }
        names.push(&f.name);
    }
    for p in o.include {
        if !glob::is_pattern(p) && !names.contains(&p.as_str()) {
            return Err(
                crate::UsageError(format!("no function `{p}` in the main executable")).into(),
            );
        }
    }
    for p in o.phases {
        if !names.contains(&p.as_str()) {
            return Err(crate::UsageError(format!(
                "--phase {p}: no function `{p}` in the main executable"
            ))
            .into());
        }
        if o.exclude.iter().any(|x| glob::matches(x, p)) {
            return Err(crate::UsageError(format!(
                "--phase {p}: the marker is excluded by --exclude"
            ))
            .into());
        }
    }
    let mut chosen = Vec::new();
    let mut left_out = 0;
    for name in names {
        let marker = o.phases.iter().any(|p| p == name);
        let included = if o.include.is_empty() {
            !RUNTIME_FUNCTIONS.contains(&name)
        } else {
            o.include.iter().any(|p| glob::matches(p, name))
        };
        let excluded = o.exclude.iter().any(|p| glob::matches(p, name));
        if marker || (included && !excluded) {
            chosen.push(Chosen {
                name: name.to_string(),
                marker,
            });
        } else {
            left_out += 1;
        }
    }
    if chosen.is_empty() {
        bail!("no function of the main executable to probe (check the patterns)");
    }
    Ok((chosen, left_out))
}

/// Why functions could not be probed, grouped by reason.
#[derive(Default)]
struct Skipped {
    by_reason: BTreeMap<String, Vec<String>>,
}

impl Skipped {
    fn add(&mut self, name: &str, why: String) {
        self.by_reason
            .entry(why)
            .or_default()
            .push(name.to_string());
    }
    fn count(&self) -> usize {
        self.by_reason.values().map(Vec::len).sum()
    }
}

/// The drain side: rings → writer, counting everything.
struct Drain {
    writer: TraceWriter,
    /// Per ring slot: events already noted as lost, and the time of the
    /// ring's last event (where a lost record goes).
    seen_drops: Vec<u64>,
    last_ts: Vec<u64>,
    drained: u64,
    unknown: u64,
    /// Drops written as lost records, in all.
    ring_drops: u64,
    /// Events copied out of a ring found over a quarter full (at most a
    /// ring's worth: 72 bytes an event, 72 MiB with 2^20-event rings).
    backlog: Vec<RecordedEvent>,
}

/// What one [`Drain::pass`] found.
struct PassStats {
    /// Events drained from all rings.
    events: u64,
    /// The fullest ring, as found by the pass (events it held).
    max_fill: u64,
}

impl Drain {
    fn new(writer: TraceWriter) -> Drain {
        Drain {
            writer,
            seen_drops: Vec::new(),
            last_ts: Vec::new(),
            drained: 0,
            unknown: 0,
            ring_drops: 0,
            backlog: Vec::new(),
        }
    }

    /// Drains every ring into the writer, each one until it holds less
    /// than `low` events (at most a ring's capacity per ring and pass, so
    /// that one busy thread cannot starve the others).
    fn pass(&mut self, fp: &FastPath, low: u64) -> Result<PassStats> {
        let shm = fp.shm();
        let slots = shm.threads_in_use();
        let cap = u64::from(shm.layout().params.ring_capacity);
        if self.last_ts.len() < slots as usize {
            self.last_ts.resize(slots as usize, 0);
            self.seen_drops.resize(slots as usize, 0);
        }
        let mut st = PassStats {
            events: 0,
            max_fill: 0,
        };
        let mut err = None;
        for slot in 0..slots {
            let mut from_ring = 0u64;
            let mut first = true;
            while let Some(mut c) = shm.consumer(slot) {
                let writer = &mut self.writer;
                let unknown = &mut self.unknown;
                let last = &mut self.last_ts[slot as usize];
                let mut write = |ev: &RecordedEvent| match TraceEvent::from_abi(ev) {
                    Some(te) => {
                        *last = te.ts;
                        if err.is_none() {
                            if let Err(e) = writer.write_event(&te) {
                                err = Some(e);
                            }
                        }
                    }
                    None => *unknown += 1,
                };
                // A ring frees its slots only at the end of a drain. A ring
                // found over a quarter full (the drain was held up: asleep,
                // descheduled) is copied out first, which frees it in a few
                // ms, and written afterwards: written straight from the
                // ring, it would stay full (and drop) for the whole write.
                // Otherwise straight (one ring is one thread: the writer's
                // thread lookup stays on its one-entry cache).
                let fill = shm.ring_ctl(slot).map_or(0, |ctl| {
                    let head = ctl.head.load(std::sync::atomic::Ordering::Relaxed);
                    head.wrapping_sub(ctl.tail.load(std::sync::atomic::Ordering::Relaxed))
                });
                let r = if fill >= cap / 4 {
                    let backlog = &mut self.backlog;
                    backlog.clear();
                    let r = c.drain(|ev| backlog.push(*ev));
                    backlog.iter().for_each(&mut write);
                    r
                } else {
                    c.drain(write)
                };
                // A corrupt ring (head past tail + capacity: not our agent's
                // doing) was resynchronised by the consumer; go on.
                let got = r.map_or(0, |s| s.read);
                if first {
                    st.max_fill = st.max_fill.max(got);
                    first = false;
                }
                from_ring += got;
                if got < low || from_ring >= cap {
                    break;
                }
            }
            st.events += from_ring;
        }
        if let Some(e) = err {
            return Err(e).context("cannot write the trace");
        }
        self.drained += st.events;
        self.note_drops(fp)?;
        Ok(st)
    }

    /// Writes a `lost` record into the stream of every thread whose ring
    /// dropped events since the last pass.
    fn note_drops(&mut self, fp: &FastPath) -> Result<()> {
        let shm = fp.shm();
        let slots = shm.threads_in_use();
        if self.seen_drops.len() < slots as usize {
            self.seen_drops.resize(slots as usize, 0);
            self.last_ts.resize(slots as usize, 0);
        }
        for slot in 0..slots {
            let Some(ctl) = shm.ring_ctl(slot) else {
                continue;
            };
            let dropped = ctl.dropped.load(std::sync::atomic::Ordering::Relaxed);
            let seen = &mut self.seen_drops[slot as usize];
            if dropped > *seen {
                let tid = ctl.owner_tid.load(std::sync::atomic::Ordering::Relaxed);
                let ts = self.last_ts[slot as usize];
                self.writer
                    .note_lost(tid, ts, dropped - *seen)
                    .context("cannot write the trace")?;
                self.ring_drops += dropped - *seen;
                *seen = dropped;
            }
        }
        Ok(())
    }
}

/// A spinner with the events drained and the rate (drawn only when stderr
/// is a terminal).
fn spinner() -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    if let Ok(style) = ProgressStyle::with_template("{spinner} recording {wide_msg}") {
        bar.set_style(style);
    }
    bar
}

/// Run `record`.
pub fn run(o: &RecordOptions<'_>) -> Result<()> {
    let exe = match (o.pid, o.cmd.first()) {
        (Some(pid), None) => std::fs::read_link(format!("/proc/{pid}/exe"))
            .with_context(|| format!("no process {pid} (or not permitted to read it)"))?,
        (None, Some(prog)) => resolve_program(Path::new(prog))
            .with_context(|| format!("{}: not found (nor in PATH)", Path::new(prog).display()))?,
        _ => {
            return Err(crate::UsageError("give either -p PID or -- CMD ARGS".into()).into());
        }
    };
    let module = ElfModule::open(&exe).with_context(|| format!("cannot read {}", exe.display()))?;
    let (chosen, left_out) = choose(o, &module)?;
    drop(module);
    let agent = find_agent().context("record needs the agent library")?;
    let (tsc0, ns0) = clock_pair();

    let config = FastPathConfig {
        // Entry and (with exit placeholders) exit counters per function.
        max_probes: (chosen.len() as u32 * 2 + 64).next_power_of_two(),
        ring_capacity: o.ring_events,
        max_threads: o.max_threads,
        // Up to 2 arguments: 32-byte event slots (faster to write and
        // drain than the 64-byte ones all 6 need).
        record_args: o.args,
        ..FastPathConfig::default()
    };
    let p = Prepared {
        exe,
        chosen,
        left_out,
        tsc0,
        ns0,
        spawned: o.pid.is_none(),
    };
    match (o.pid, o.cmd.split_first()) {
        (Some(pid), _) => {
            let mut t = ProcessTarget::attach(pid)?;
            let mut fp = match FastPath::inject(&mut t, &agent, config) {
                Ok(fp) => fp,
                Err(e) => {
                    let _ = t.detach();
                    return Err(e).context("cannot load the agent into the target");
                }
            };
            let r = record(o, &p, &mut t, &mut fp);
            if r.is_err() {
                // Leave the target as it was: code restored, running on.
                let _ = fp.detach(&mut t);
                let _ = t.detach();
            }
            r
        }
        (None, Some((prog, args))) => {
            let mut opts = SpawnOptions::default();
            let pending = FastPath::for_spawn(&mut opts, &agent, config)?;
            // On an error the target is killed when `t` drops.
            let mut t = ProcessTarget::spawn_with(Path::new(prog), args, &opts)?;
            let mut fp = pending.attach(&mut t)?;
            record(o, &p, &mut t, &mut fp)
        }
        (None, None) => Err(crate::UsageError("give either -p PID or -- CMD ARGS".into()).into()),
    }
}

/// What `run` found before the target was opened.
struct Prepared {
    exe: PathBuf,
    chosen: Vec<Chosen>,
    left_out: usize,
    tsc0: u64,
    ns0: u64,
    spawned: bool,
}

/// Places the probes, records until the target exits or a stop is asked
/// for, and prints the summary.
fn record(
    o: &RecordOptions<'_>,
    p: &Prepared,
    t: &mut ProcessTarget,
    fp: &mut FastPath,
) -> Result<()> {
    let pid = t.pid();
    let (exe, chosen, left_out, tsc0, ns0) = (&p.exe, &p.chosen, p.left_out, p.tsc0, p.ns0);
    // Probes.
    let bar = progress(chosen.len() as u64, "placing probes");
    let action = Action::record().with_exit();
    let mut symbols = Vec::new();
    let mut skipped = Skipped::default();
    let mut mechanisms: BTreeMap<String, usize> = BTreeMap::new();
    let mut module_path = String::new();
    for c in chosen {
        bar.inc(1);
        match fp.add(t, &c.name, action, o.mechanism) {
            Ok(info) if info.mechanism == Mechanism::Trap => {
                if c.marker {
                    bail!(
                        "--phase {}: the fast path cannot probe it ({})",
                        c.name,
                        info.reason
                    );
                }
                skipped.add(&c.name, info.reason);
            }
            Ok(info) => {
                let mech = match info.mechanism {
                    Mechanism::Patch(_) => "patch",
                    Mechanism::Jump => "jump",
                    Mechanism::Trap => "trap",
                };
                *mechanisms.entry(mech.to_string()).or_default() += 1;
                if module_path.is_empty() {
                    module_path = exe.display().to_string();
                }
                symbols.push(Symbol {
                    id: info.probe_id,
                    name: c.name.clone(),
                    module: module_path.clone(),
                    addr: info.addr,
                    kind: if c.marker {
                        ProbeKind::Marker
                    } else {
                        ProbeKind::Function
                    },
                    nargs: o.args,
                    retval: o.args > 0,
                });
            }
            Err(e) if !c.marker => skipped.add(&c.name, e.to_string()),
            Err(e) => return Err(e).with_context(|| format!("--phase {}", c.name)),
        }
    }
    bar.finish_and_clear();
    if symbols.is_empty() {
        bail!(
            "none of the {} selected functions can be probed by the fast path \
             (e.g. {}): nothing to record",
            chosen.len(),
            skipped
                .by_reason
                .iter()
                .next()
                .map_or(String::new(), |(why, f)| format!("{}: {why}", f[0]))
        );
    }

    // The time base: two (TSC, ns) pairs at least 50 ms apart.
    let since = Duration::from_nanos(clock_pair().1.saturating_sub(ns0));
    if since < Duration::from_millis(50) {
        std::thread::sleep(Duration::from_millis(50) - since);
    }
    let (tsc1, ns1) = clock_pair();
    let time_base = TimeBase::Tsc {
        tsc0,
        ns0,
        tsc1,
        ns1,
    };
    let mut filter = Filter {
        include: Vec::new(),
        exclude: o.exclude.to_vec(),
        max_depth: o.max_depth,
        min_duration_ns: o.min_duration_ns,
        sample_every: o.sample,
    };
    if !o.include.is_empty() {
        // The include patterns already chose what is probed; the writer
        // gets them (and the markers) so that info.json records them.
        filter.include = o.include.to_vec();
        filter.include.extend(o.phases.iter().cloned());
    }
    let meta = TraceMeta {
        target: exe.display().to_string(),
        command: o
            .cmd
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        pid: Some(pid as u32),
        time_base,
        start_unix_ns: 0,
        phase_markers: o.phases.to_vec(),
        symbols,
        filter,
        aggregate: o.aggregate,
    };
    let nprobes = meta.symbols.len();
    let writer = TraceWriter::create(o.out, meta)
        .with_context(|| format!("cannot create the trace in {}", o.out.display()))?;
    let mut d = Drain::new(writer);
    eprintln!(
        "hotprobe: {} pid {pid}: recording {nprobes} functions into {}",
        if p.spawned { "started" } else { "attached to" },
        o.out.display()
    );

    // Run: drain while waiting on the target's events.
    if let Some(d) = o.duration {
        signals::stop_after(d);
    }
    // The drain competes for the CPUs with the target (and whatever else
    // runs): asleep for longer than a ring lasts (2^20 events: 30–100 ms
    // at 10–36 M events/s), it loses events. Ask for a higher priority
    // for this thread (Linux: per thread; the target keeps its own), best
    // effort: without CAP_SYS_NICE it stays as it is.
    // SAFETY: plain syscall on the calling thread, no pointers.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -10) };
    t.resume_all()?;
    let spin = spinner();
    let started = Instant::now();
    let mut shown = Instant::now();
    // Drain thresholds: a ring is drained again while a drain of it
    // returned at least `low` events, and the loop naps only when no ring
    // held that many (then the producer is ≥ `low` slots ahead of the
    // drain, which does not pull the cache lines it is writing away from
    // it). 1/64 of a ring: 4096 events (128 KiB of 32-byte slots) with the
    // default 2^18-event rings.
    let low = u64::from(o.ring_events / 64).max(64);
    let end = loop {
        let got = d.pass(fp, low)?;
        if shown.elapsed() >= Duration::from_millis(100) {
            let secs = started.elapsed().as_secs_f64().max(1e-9);
            spin.set_message(format!(
                "{} events, {:.0} events/s",
                d.drained,
                d.drained as f64 / secs
            ));
            spin.tick();
            shown = Instant::now();
        }
        if signals::STOP.load(std::sync::atomic::Ordering::SeqCst) {
            break None;
        }
        // Never nap while a ring fills: nap (briefly) only when every ring
        // was nearly empty, longer when nothing came at all. A nap lets
        // the rings fill to batches: a drain right behind the producer
        // pulls the ring's cache lines away from the target's thread while
        // it is still writing them, slowing it down.
        let nap = if got.events == 0 {
            Duration::from_millis(1)
        } else if got.max_fill < low {
            Duration::from_micros(100)
        } else {
            Duration::ZERO
        };
        match t.wait(Some(nap))? {
            TargetEvent::Exited(st) => break Some(st),
            TargetEvent::ModulesChanged { thread } => t.resume(thread, ResumeMode::Continue)?,
            TargetEvent::Breakpoint { thread, .. } | TargetEvent::Stepped { thread, .. } => {
                t.resume(thread, ResumeMode::Continue)?
            }
            TargetEvent::Forked { child, .. } => {
                // The child inherits the patched code and the agent; its
                // events (same thread slots) are not separated from the
                // parent's: say so.
                spin.suspend(|| {
                    eprintln!(
                        "hotprobe: pid {pid} forked {child}; the child runs with the probes \
                         and may write into the parent's rings"
                    )
                });
                t.release_fork_child(child, &[])?;
            }
            TargetEvent::Exec => spin.suspend(|| {
                eprintln!("hotprobe: pid {pid} executed a new program: its probes are gone")
            }),
            _ => {}
        }
    };
    // Last events, then the bytes restored if the target still runs.
    d.pass(fp, 1)?;
    spin.finish_and_clear();
    let how = match &end {
        Some(st) => format!("pid {pid} {st}"),
        None => {
            fp.detach(t)
                .with_context(|| format!("cannot remove the probes from pid {pid}"))?;
            d.pass(fp, 1)?;
            t.detach()
                .with_context(|| format!("cannot detach from pid {pid}"))?;
            let why = match signals::stop_reason() {
                Some(StopReason::Timer) => "duration elapsed".to_string(),
                Some(StopReason::Signal(libc::SIGINT)) => "interrupted".to_string(),
                Some(StopReason::Signal(s)) => format!("signal {s}"),
                _ => "stopped".to_string(),
            };
            if p.spawned {
                format!(
                    "{why}: detached from pid {pid} (started by hotprobe), which runs on \
                     without probes"
                )
            } else {
                format!("{why}: detached from pid {pid}, which runs on with its code restored")
            }
        }
    };
    let total_drops = fp.drops();
    let no_slot = total_drops.saturating_sub(d.ring_drops);
    let drained = d.drained;
    let unknown = d.unknown;
    let stats = d.writer.finish().context("cannot finish the trace")?;
    print_summary(&Summary {
        how: &how,
        out: o.out,
        stats: &stats,
        drained,
        unknown,
        ring_drops: d.ring_drops,
        no_slot,
        probed: nprobes,
        mechanisms: &mechanisms,
        left_out,
        skipped: &skipped,
        elapsed: started.elapsed(),
    });
    Ok(())
}

struct Summary<'a> {
    how: &'a str,
    out: &'a Path,
    stats: &'a WriteStats,
    drained: u64,
    unknown: u64,
    ring_drops: u64,
    no_slot: u64,
    probed: usize,
    mechanisms: &'a BTreeMap<String, usize>,
    left_out: usize,
    skipped: &'a Skipped,
    elapsed: Duration,
}

/// The one summary `record` prints (on stderr, after the target's output).
fn print_summary(s: &Summary<'_>) {
    let st = s.stats;
    let f = &st.filtered;
    let mechs: Vec<String> = s
        .mechanisms
        .iter()
        .map(|(m, n)| format!("{m} {n}"))
        .collect();
    eprintln!("hotprobe: {}; trace in {}", s.how, s.out.display());
    eprintln!(
        "  probes:   {} functions ({}); {} left out by the patterns (not probed); {} not probeable",
        s.probed,
        mechs.join(", "),
        s.left_out,
        s.skipped.count()
    );
    for (why, names) in &s.skipped.by_reason {
        let mut list = names[..names.len().min(5)].join(", ");
        if names.len() > 5 {
            list.push_str(&format!(", … ({} more)", names.len() - 5));
        }
        eprintln!("            not probed ({why}): {list}");
    }
    let bpe = if st.events_out == 0 {
        "-".to_string()
    } else {
        format!("{:.2}", st.bytes_per_event())
    };
    eprintln!(
        "  events:   {} recorded ({} records, {} threads) of {} drained in {:.2} s; \
         {} bytes of event streams, {bpe} bytes/event",
        st.events_out,
        st.records,
        st.threads,
        s.drained,
        s.elapsed.as_secs_f64(),
        st.bytes
    );
    eprintln!(
        "  drops:    {} (full rings {}, written as lost records; threads without a ring slot {}){}",
        s.ring_drops + s.no_slot,
        s.ring_drops,
        s.no_slot,
        if s.unknown > 0 {
            format!("; {} events of an unknown kind ignored", s.unknown)
        } else {
            String::new()
        }
    );
    eprintln!(
        "  filtered in the writer (events): depth {}, duration {}, sampling {}, pattern {}; \
         short calls kept around nested records {}, orphan exits {}, clamped timestamps {}",
        f.depth, f.duration, f.sampling, f.pattern, f.kept_short, f.orphan_exits, f.clamped
    );
}

/// Parses a duration: a number with a unit `ns`, `us`, `ms` or `s` (a bare
/// number is ns, as uftrace's time filter). Returns ns.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let mult = match unit.trim() {
        "" | "ns" => 1.0,
        "us" | "µs" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        u => return Err(format!("unknown unit `{u}` (ns, us, ms, s)")),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration (e.g. 10ms, 1.5us, 200ns)"))?;
    let ns = v * mult;
    if !ns.is_finite() || !(0.0..1.8e19).contains(&ns) {
        return Err(format!("`{s}` is out of range"));
    }
    Ok(ns.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::parse_duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("10ms"), Ok(10_000_000));
        assert_eq!(parse_duration("1.5us"), Ok(1_500));
        assert_eq!(parse_duration("200"), Ok(200));
        assert_eq!(parse_duration("2s"), Ok(2_000_000_000));
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("10 parsecs").is_err());
        assert!(parse_duration("").is_err());
        assert!(parse_duration("1e400s").is_err());
    }
}
