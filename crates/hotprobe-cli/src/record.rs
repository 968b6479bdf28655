//! `hotprobe record`: a function trace of a spawned program into a trace
//! directory (docs/TRACE_FORMAT.md), through the fast path.
//!
//! The target starts with the hotprobe agent preloaded; every selected
//! function (of the main executable, or of a library named by a
//! `MODULE:GLOB` pattern) gets a record probe with exit events (patch or
//! jump mechanism; a trap where neither fits, unless `--no-traps`). The
//! agent writes events into per-thread shared-memory rings; this process
//! drains them while the target runs, converts them
//! ([`TraceEvent::from_abi`]) and feeds a [`TraceWriter`].
//!
//! Where each filter acts:
//! * include/exclude patterns act at the source: functions they leave out
//!   are not probed at all (and cost nothing);
//! * `--max-depth`, `--min-duration`, `--sample` run in the writer, on the
//!   drained events, before anything is written: the target still pays for
//!   every event of the probed functions.

use crate::out::errln;
use crate::session::{mechanism_summary, progress, Traced};
use anyhow::{bail, Context, Result};
use hotprobe::pending::{add_pending_pattern, module_pattern, PendingError};
use hotprobe::symbols::pattern;
use hotprobe::trace::{
    Filter, ProbeKind, Symbol, TimeBase, TraceMeta, TraceWriter, WriteStats, INFO_FILE,
};
use hotprobe::typed;
use hotprobe::{Action, DrainStats, ExitStatus, FastPathConfig, MechanismChoice, SessionConfig};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod summary;
use summary::{calibrate_costs, print_summary, Skipped, Summary, TrapCost};

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
    /// `--stacks`: capture the stacks at entries into stacks.tsv.
    pub stacks: bool,
    /// `--force`: replace the trace already in `out`.
    pub force: bool,
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
    /// `-a`: every parameter and the return value, typed (see `crate::typed`).
    pub auto_args: bool,
    /// `--mechanism`.
    pub mechanism: MechanismChoice,
    /// Record functions neither patch nor jump can take through a trap
    /// (false: `--no-traps`, they are left out and listed).
    pub traps: bool,
    /// `-f`: follow forked children.
    pub follow_forks: bool,
    /// `-f` without `--no-follow-exec`: probes placed again in each
    /// program a followed process executes.
    pub follow_exec: bool,
    /// `--kernel`: the host kernel's events too (syscalls, off-CPU).
    pub kernel: bool,
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
    /// Or `--exe`/`--comm`: every matching process, running or started
    /// later.
    pub new_processes: Option<hotprobe::ProcessMatch>,
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

/// What is in the directory `record` is asked to write.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum OutDir {
    /// Nothing yet (missing, or an empty directory).
    Fresh,
    /// A trace, to be replaced (`--force`).
    Replace,
}

/// Checks, before anything runs, that `dir` may be written: a missing or
/// empty directory may; a trace (it has `info.json`) only with `force`;
/// anything else never.
pub(crate) fn check_out_dir(dir: &Path, force: bool) -> Result<OutDir> {
    let d = dir.display();
    let entries = match std::fs::read_dir(dir) {
        Ok(rd) => rd.count(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(OutDir::Fresh),
        Err(_) if dir.exists() && !dir.is_dir() => {
            bail!("{d} exists and is not a directory: give another -o DIR")
        }
        Err(e) => return Err(e).with_context(|| format!("cannot read {d}")),
    };
    if entries == 0 {
        return Ok(OutDir::Fresh);
    }
    if !dir.join(INFO_FILE).is_file() {
        bail!(
            "{d} is not a trace directory (no {INFO_FILE}) and is not empty: \
             not writing into it, even with --force; give another -o DIR"
        );
    }
    if !force {
        bail!("{d} already holds a trace: give --force to replace it, or another -o DIR");
    }
    Ok(OutDir::Replace)
}

/// Removes everything in the trace directory `dir` (streams, exports).
pub(crate) fn clear_trace_dir(dir: &Path) -> Result<()> {
    let ctx = || format!("cannot remove the old trace in {}", dir.display());
    for ent in std::fs::read_dir(dir).with_context(ctx)? {
        let ent = ent.with_context(ctx)?;
        let path = ent.path();
        if ent.file_type().with_context(ctx)?.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        }
        .with_context(|| format!("cannot remove {}", path.display()))?;
    }
    Ok(())
}

/// Run `record`; returns hotprobe's exit code (the command's).
pub fn run(o: &RecordOptions<'_>) -> Result<u8> {
    let exe = match (o.pid, o.cmd.first()) {
        _ if o.new_processes.is_some() => match &o.new_processes {
            Some(hotprobe::ProcessMatch::Exe(p)) => p.clone(),
            Some(hotprobe::ProcessMatch::Comm(c)) => PathBuf::from(format!("comm {c}")),
            None => PathBuf::new(),
        },
        (Some(pid), None) => {
            // A clear refusal (init, a kernel thread, a zombie...) first.
            hotprobe::ProcessTarget::check_attachable(pid)?;
            std::fs::read_link(format!("/proc/{pid}/exe"))
                .with_context(|| format!("no process {pid} (or not permitted to read it)"))?
        }
        (None, Some(prog)) => resolve_program(Path::new(prog))
            .with_context(|| format!("{}: not found (nor in PATH)", Path::new(prog).display()))?,
        _ => {
            return Err(crate::UsageError("give either -p PID or -- CMD ARGS".into()).into());
        }
    };
    let out_dir = check_out_dir(o.out, o.force)?;
    for p in o.phases {
        if o.exclude.iter().any(|x| pattern::matches(x, p)) {
            return Err(crate::UsageError(format!(
                "--phase {p}: the marker is excluded by --exclude"
            ))
            .into());
        }
    }
    if o.kernel {
        crate::kernel::check()?;
    }
    let (tsc0, ns0) = clock_pair();
    let defaults = FastPathConfig::default();
    let config = SessionConfig {
        mechanism: o.mechanism,
        fast_path: FastPathConfig {
            // Entry and (with exit placeholders) exit counters per function.
            max_probes: defaults.max_probes,
            ring_capacity: o.ring_events,
            max_threads: o.max_threads,
            // Up to 2 arguments: 32-byte event slots (faster to write and
            // drain than the 64-byte ones all 6 need).
            // -a: typed values in integer registers come from the
            // recorded ones (all six argument registers).
            record_args: if o.auto_args { 6 } else { o.args },
            stacks: o.stacks,
            ..defaults
        },
        // A trap costs a ptrace stop per hit (docs/DESIGN.md, "Library
        // functions in record"): recorded unless --no-traps, the cost said
        // in the summary.
        record_traps: o.traps,
        no_traps: !o.traps,
        follow_forks: o.follow_forks,
        follow_exec: o.follow_exec,
        ..SessionConfig::default()
    };
    let mut t = match &o.new_processes {
        Some(what) => Traced::waiting(config, what.clone())?,
        None => Traced::open(config, o.pid, o.cmd)?,
    };
    // The summary says how the process ended.
    t.end_said_later = true;
    let pid = t.pid;
    // Probes: the phase markers, then what the patterns select (every
    // function of the main executable when there are none) minus the
    // excluded ones, the C runtime's and the markers.
    let mut symbols = Vec::new();
    let mut placed = Vec::new();
    let mut skipped = Skipped::default();
    let mut left_out = 0;
    let module_path = exe.display().to_string();
    let mut taken: HashSet<String> = HashSet::new();
    // The functions each include that is a name (not a pattern) placed:
    // the writer matches by those names (`ns::f` placed `ns::f(int)` and
    // `ns::f(double)`, `memcpy` placed `memcpy@@GLIBC_2.14`).
    let mut named: HashMap<String, Vec<String>> = HashMap::new();
    let selections: Vec<(&str, bool)> = o
        .phases
        .iter()
        .map(|p| (p.as_str(), true))
        .chain(if o.include.is_empty() {
            vec![("*", false)]
        } else {
            o.include.iter().map(|p| (p.as_str(), false)).collect()
        })
        .collect();
    let typing = std::rc::Rc::new(typed::Typing::new(pid));
    let bar = progress(selections.len() as u64, "placing probes");
    for (spec, marker) in selections {
        bar.inc(1);
        let keep = |name: &str| {
            let runtime = o.include.is_empty() && RUNTIME_FUNCTIONS.contains(&name);
            let excluded = o.exclude.iter().any(|x| pattern::matches(x, name));
            marker || !(taken.contains(name) || excluded || runtime)
        };
        // A USDT marker's arguments are always recorded: its note types them.
        let auto = (o.auto_args || spec.starts_with(hotprobe::symbols::USDT_PREFIX)) && !marker;
        t.session
            .set_xmm_layout(typing.xmm_chooser_for(Vec::new(), auto));
        t.session
            .set_fast_capture(typing.fast_chooser_for(Vec::new(), auto));
        t.session.set_capture(typing.chooser_for(Vec::new(), auto));
        if t.waiting.is_some() {
            // Placed in each process taken (its symbols join the trace then).
            if let Err(e) = t.session.add_for_new_processes(spec, true) {
                return Err(crate::UsageError(format!("{spec}: {e}")).into());
            }
            continue;
        }
        let added = t
            .session
            .add_filtered(t.target, spec, Action::Record, &keep);
        // (Cleared after the pending pattern below: its probes keep the
        // choosers for their arming, typed as those placed now.)
        let added = match added {
            Ok(a) => a,
            // A pattern on a library not loaded yet: one pending probe per
            // function of the library's file it matches.
            Err(hotprobe::EngineError::Symbol(
                hotprobe::symbols::SymbolError::ModuleNotFound { name, loaded },
            )) if !marker && module_pattern(spec).is_some() => {
                let pending = add_pending_pattern(
                    &mut t.session,
                    t.target,
                    spec,
                    &name,
                    exe.parent(),
                    &|| Action::Record,
                    &keep,
                );
                match pending {
                    Ok(a) => a,
                    Err(e) => {
                        t.abandon();
                        let e = match e {
                            PendingError::NoLibrary => hotprobe::EngineError::Symbol(
                                hotprobe::symbols::SymbolError::ModuleNotFound { name, loaded },
                            )
                            .to_string(),
                            e => e.to_string(),
                        };
                        return Err(crate::UsageError(format!("{spec}: {e}")).into());
                    }
                }
            }
            Err(e) => {
                t.abandon();
                let what = if marker { "--phase " } else { "" };
                if let hotprobe::EngineError::Symbol(_) = e {
                    // The resolver names where it looked (the main
                    // executable, the loaded modules, the module given).
                    return Err(crate::UsageError(format!("{what}{spec}: {}", reason_of(e))).into());
                }
                bail!("{what}{spec}: cannot record it: {}", reason_of(e));
            }
        };
        t.session.set_capture(None);
        t.session.set_xmm_layout(None);
        t.session.set_fast_capture(None);
        left_out += added.left_out;
        for sk in added.skipped {
            skipped.add(&sk.label, sk.reason);
        }
        for p in added.placements {
            let usdt = p.label.starts_with(hotprobe::symbols::USDT_PREFIX);
            let name = trace_name(&p);
            // A typed function's events keep the index of their captured
            // values (hotprobe-trace's values files).
            // A pending one typed (-a) when its library is loaded.
            let typed =
                typing.is_typed(p.addr.0) || (auto && p.mechanism == hotprobe::Mechanism::Pending);
            symbols.push(Symbol {
                id: p.id.0,
                name: name.clone(),
                // Set below from the module mapping the address.
                module: p.module.clone(),
                addr: p.addr.0,
                kind: if marker {
                    ProbeKind::Marker
                } else if usdt {
                    ProbeKind::Hit
                } else {
                    ProbeKind::Function
                },
                // -a on a function without type information (or pending:
                // not known yet): its raw argument registers (all six are
                // recorded) and return value, as `trace -a` shows them. A
                // typed event keeps one, its values' index.
                nargs: if typing.is_typed(p.addr.0) {
                    1
                } else if auto && !usdt {
                    6
                } else {
                    o.args
                },
                retval: typed || auto || o.args > 0,
            });
            if !marker && !pattern::is_pattern(spec) {
                named
                    .entry(spec.to_string())
                    .or_default()
                    .push(name.clone());
            }
            taken.insert(name);
            placed.push(p);
        }
    }
    bar.finish_and_clear();
    // Each function's module, as a path (the main executable's as before:
    // the program's path); a module's file name if its mapping is gone.
    let modules = hotprobe::symbols::ProcessSymbols::for_pid(pid as u32).ok();
    let main_path = modules
        .as_ref()
        .and_then(|m| m.main_module())
        .map(|m| m.path.clone());
    // `symbols` and `placed` are pushed together.
    for (s, p) in symbols.iter_mut().zip(&placed) {
        let m = modules
            .as_ref()
            .and_then(|m| m.modules().iter().find(|m| m.contains(p.addr)));
        s.module = match m {
            Some(m) if Some(&m.path) == main_path.as_ref() => module_path.clone(),
            Some(m) => m.path.display().to_string(),
            None if s.module.is_empty() => module_path.clone(),
            None => std::mem::take(&mut s.module),
        };
    }
    if symbols.is_empty() && t.waiting.is_none() {
        t.abandon();
        bail!(
            "none of the selected functions can be recorded (e.g. {}): nothing to record",
            skipped
                .by_reason
                .iter()
                .next()
                .map_or(String::new(), |(why, f)| format!("{}: {why}", f[0]))
        );
    }

    // Each mechanism's cost per hit, measured now (a trace with
    // host-kernel events keeps measured times: none then).
    let costs = if o.kernel {
        None
    } else {
        calibrate_costs(&placed)
    };
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
        // The writer matches function names: a `MODULE:GLOB` pattern
        // gives its GLOB (its module was chosen at the source).
        // A name gives the names of what it placed (none: its own, for a
        // pending probe or one taken in each new process).
        filter.include = o
            .include
            .iter()
            .flat_map(|p| match named.get(p.as_str()) {
                Some(names) => names.clone(),
                None => vec![function_glob(p)],
            })
            .collect();
        filter.include.extend(o.phases.iter().cloned());
    }
    let meta = TraceMeta {
        target: exe.display().to_string(),
        command: o
            .cmd
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        pid: (t.waiting.is_none()).then_some(pid as u32),
        time_base,
        start_unix_ns: 0,
        phase_markers: o.phases.to_vec(),
        symbols,
        filter,
        aggregate: o.aggregate,
    };
    let nprobes = meta.symbols.len();
    if out_dir == OutDir::Replace {
        if let Err(e) = clear_trace_dir(o.out) {
            t.abandon();
            return Err(e);
        }
    }
    crate::session::note_untyped(
        &typing,
        "recorded with its raw argument registers and return value",
    );
    let sources_at_start = crate::trace::note_type_sources(&typing, 0);
    let types = typed::TypedShapes::new(&typing, &placed).value_types();
    let mut writer = match TraceWriter::create(o.out, meta)
        .and_then(|mut w| w.set_value_types(&types).map(|()| w))
        .and_then(|mut w| match &costs {
            Some(c) => w.set_probe_costs(c).map(|()| w),
            None => Ok(w),
        }) {
        Ok(w) => w,
        Err(e) => {
            t.abandon();
            return Err(e)
                .with_context(|| format!("cannot create the trace in {}", o.out.display()));
        }
    };
    if t.waiting.is_some() {
        errln!(
            "hotprobe: recording into {}: the functions of each process taken",
            o.out.display()
        );
    } else {
        errln!(
            "hotprobe: recording {nprobes} functions into {}",
            o.out.display()
        );
    }
    // The drain competes for the CPUs with the target (and whatever else
    // runs): asleep for longer than a ring lasts (2^20 events: 30–100 ms
    // at 10–36 M events/s), it loses events. Ask for a higher priority
    // for this thread (Linux: per thread; the target keeps its own), best
    // effort: without CAP_SYS_NICE it stays as it is.
    // SAFETY: plain syscall on the calling thread, no pointers.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -10) };
    let started = Instant::now();
    // The kernel's events: an observer of the session, started while the
    // target is stopped (children inherit them).
    let kernel = o.kernel.then(|| {
        let k = std::rc::Rc::new(std::cell::RefCell::new(
            hotprobe::kernel_source::KernelSource::following(o.follow_forks),
        ));
        t.session.observe(k.clone());
        k
    });
    // Whatever happens to the run, the trace is finished: every event
    // drained before the end stays readable.
    // -f across exec: the functions of each program executed join the
    // trace's symbols, the processes its info.json.
    let first_id = placed.iter().map(|p| p.id.0 + 1).max().unwrap_or(0);
    let mut exec_sink = hotprobe::ExecTraceSink::new(&mut writer, first_id, o.args, o.args > 0);
    let names = o.stacks.then(|| t.session.stack_names());
    let mut call_sink = crate::stacks::CallStackSink::new(&mut exec_sink, names, &placed);
    // In front: it is told of pending probes armed during the run
    // (`EventSink::pending_armed`), to type their registers then.
    let mut typed_sink = typed::RegisterTyped::new(&mut call_sink, &typing, &placed);
    let untyped_at_start = typing.untyped().len();
    let ran = t.run(&placed, o.duration, Some(&mut typed_sink));
    let calls = call_sink.finish();
    // Pending probes armed during the run (their library loaded later)
    // were typed then: their shapes join types.tsv, written again.
    let mut shapes = typed::TypedShapes::new(&typing, &placed);
    let mut armed_typed = false;
    for a in t.session.armed_pending() {
        armed_typed |= shapes.note_armed(&typing, a);
    }
    if armed_typed {
        writer
            .set_value_types(&shapes.value_types())
            .with_context(|| format!("cannot write the value types in {}", o.out.display()))?;
    }
    crate::trace::note_untyped_armed(
        &typing,
        untyped_at_start,
        "recorded with its raw argument registers and return value",
    );
    crate::trace::note_type_sources(&typing, sources_at_start);
    let kernel = kernel.map(|k| k.borrow_mut().finish(&mut writer));
    let stats = writer.finish().context("cannot finish the trace")?;
    if o.stacks {
        crate::stacks::write_trace_stacks(&t.session, &placed, o.out, &calls, &stats)?;
    }
    if let Some(e) = &stats.write_error {
        errln!(
            "hotprobe: warning: {e}: stopped writing the trace there and let the program run \
             to its end; {} events were not written (the trace ends with a lost record \
             counting them)",
            stats.dropped
        );
    }
    ran?;
    let how = match t.status() {
        _ if t.waiting.is_some() => format!("took {} processes", t.session.exec_images().len()),
        Some(st @ (ExitStatus::Code(_) | ExitStatus::Signal(_))) => format!("pid {pid} {st}"),
        _ => format!("detached from pid {pid}"),
    };
    let drain = t.session.drain_stats(t.target);
    let mut traps = TrapCost::of(&t.session, &placed);
    traps.run_stops = t.run_stops;
    print_summary(&Summary {
        how: &how,
        out: o.out,
        stats: &stats,
        drain: &drain,
        probed: nprobes,
        mechanisms: &mechanism_summary(&placed),
        left_out,
        skipped: &skipped,
        traps: &traps,
        entry_only: &placed
            .iter()
            .filter(|p| p.entry_only.is_some())
            .map(|p| p.label.as_str())
            .collect::<Vec<_>>(),
        elapsed: started.elapsed(),
    });
    for (module, n) in never_armed(&t.session, &placed) {
        errln!("  never armed: {n} probes on {module}: the program never loaded it");
    }
    crate::session::note_vfork_unrecorded(&t.session);
    if let Some(k) = kernel.transpose()?.flatten() {
        errln!("{}", crate::kernel::summary(&k));
    }
    Ok(t.exit_code())
}

/// Pending probes that were never armed (their library never loaded), per
/// module of their label (`libz.so.1:deflate` → `libz.so.1`).
pub fn never_armed(
    session: &hotprobe::Session,
    placed: &[hotprobe::Placement],
) -> std::collections::BTreeMap<String, usize> {
    let mut by = std::collections::BTreeMap::new();
    for p in placed.iter().filter(|p| session.never_armed(p.id)) {
        let module = p.label.split_once(':').map_or(p.label.as_str(), |(m, _)| m);
        *by.entry(module.to_string()).or_insert(0) += 1;
    }
    by
}

/// The function-name glob of a probe spec (`libz.so.1:deflate*` →
/// `deflate*`); the spec itself when it names no function.
/// The name a placed probe's calls have in the trace (its symbols, and
/// the function of its calls' stacks in call_stacks.tsv).
pub(crate) fn trace_name(p: &hotprobe::Placement) -> String {
    // A pending probe (its library not loaded yet) has no function yet:
    // the name its spec gives.
    match (&p.function, p.mechanism) {
        // A USDT marker is named by its spec, not the function it sits in.
        _ if p.label.starts_with(hotprobe::symbols::USDT_PREFIX) => p.label.clone(),
        (Some(f), _) => f.clone(),
        (None, hotprobe::Mechanism::Pending) => function_glob(&p.label),
        (None, _) => p.label.clone(),
    }
}

fn function_glob(spec: &str) -> String {
    match spec.parse::<hotprobe::symbols::ProbeSpec>() {
        Ok(hotprobe::symbols::ProbeSpec::Function { name, .. }) => name,
        _ => spec.to_string(),
    }
}

/// The reason inside a refusal, without the spec the caller already names.
fn reason_of(e: hotprobe::EngineError) -> String {
    match e {
        hotprobe::EngineError::RefusedSpec { reason, .. } => reason,
        e => e.to_string(),
    }
}
