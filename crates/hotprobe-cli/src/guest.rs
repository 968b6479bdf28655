//! `hotprobe guest`: `count` and `trace` on VM guest kernels through their
//! GDB stubs (QEMU `-gdb`), one or several guests in one session; or
//! `count`, `trace` and `record` on a guest hotprobe starts itself with its
//! QEMU TCG plugin (no stop of the VM per hit).
//!
//! ```text
//! hotprobe guest --gdb HOST:PORT|unix:PATH --symbols FILE [--ram FILE] \
//!                [--gdb ... --symbols ... [--ram ...]] (count|trace) PROBE... [--duration S]
//! hotprobe guest (count|trace|record) PROBE... --symbols FILE [--sync] \
//!                -- qemu-system-x86_64 ARGS...
//! hotprobe guest count PROBE... [--symbols FILE] -- qemu-system-x86_64 ARGS... \
//!                [-- qemu-system-x86_64 ARGS...]...     (one `--` block per guest)
//! hotprobe guest record --boot [PROBE...] -o DIR -- qemu-system-x86_64 ARGS...
//! hotprobe guest syscalls [--pid N | --comm NAME] [-o FILE] -- qemu-system-x86_64 ARGS...
//!                (crate::guest_syscalls)
//! ```
//! `--symbols` is the guest's `/proc/kallsyms` (read as root), its
//! `System.map`, its vmlinux, or the bzImage QEMU boots with `-kernel`
//! (recognised by its boot header, `HdrS`: the symbols are recovered from
//! the kernel's own kallsyms tables and cached, see
//! `hotprobe::guest::symbols_from_kernel_image`; boot the guest with
//! `nokaslr`). `--ram` is QEMU's shared
//! `memory-backend-file` (`mem-path=`), to read guest memory without the
//! stub. A guest whose stub closes is dropped with a notice; the others go
//! on. Ctrl-C (or `--duration`) detaches: breakpoints removed, out-of-line
//! area restored, every guest running on.

use crate::out::{errln, outln};
use crate::session::{print_table, progress};
use crate::signals::{self, StopReason};
use crate::trace::{LiveTree, HEADER};
use anyhow::{bail, Context, Result};
use hotprobe::guest::{
    kernel_image, load_symbols, open_guest, shell_exit_code, GuestConfig, GuestFleet,
    LaunchOptions, StubAddr,
};
use hotprobe::guest_boot::{BootError, BootMarkers};
use hotprobe::qemu::Delivery;
use hotprobe::symbols::KernelSymbols;
use hotprobe::trace::{Filter, TimeBase, TraceMeta, TraceWriter};
use hotprobe::{
    EventSink, FastPathConfig, Placement, PluginOptions, RunEnd, Session, SessionConfig, TargetId,
};
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// One guest from the command line.
pub struct GuestSpec {
    /// `HOST:PORT` or `unix:PATH`.
    pub gdb: String,
    /// kallsyms / System.map / vmlinux / bzImage.
    pub symbols: PathBuf,
    /// QEMU's shared RAM file, if given.
    pub ram: Option<PathBuf>,
}

/// What to do with the probes.
pub enum Action {
    /// Count hits (returns for `%return`).
    Count {
        /// Live calls followed at once per `%return` probe.
        maxactive: usize,
    },
    /// Print a live call tree.
    Trace {
        /// Argument registers to show (and the return value).
        args: Option<usize>,
        /// Live calls followed at once per function.
        maxactive: usize,
        /// Print the count table at the end.
        summary: bool,
    },
}

/// What `guest` needs from the command line.
pub struct GuestOptions<'a> {
    /// The guests.
    pub guests: Vec<GuestSpec>,
    /// Probe specs (placed on every guest).
    pub probes: &'a [String],
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// count or trace.
    pub action: Action,
}

/// Parse `HOST:PORT` or `unix:PATH`.
pub fn stub_addr(s: &str) -> Result<StubAddr> {
    if let Some(p) = s.strip_prefix("unix:") {
        if p.is_empty() {
            bail!("--gdb {s}: give a socket path after unix:");
        }
        return Ok(StubAddr::Unix(PathBuf::from(p)));
    }
    match s.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.parse::<u16>().is_ok() => Ok(StubAddr::Tcp(s.into())),
        _ => bail!("--gdb {s}: expected HOST:PORT or unix:PATH"),
    }
}

struct Connected {
    id: TargetId,
    name: String,
}

/// Connects to a guest's stub and adds it to `session` with its resolver;
/// instructions the engine cannot run out of line (privileged ones) are
/// single-stepped in place by the stub. The VM stays stopped until
/// `Session::start`.
fn connect_guest(
    session: &mut Session,
    config: GuestConfig,
    symbols: KernelSymbols,
) -> Result<TargetId, hotprobe::EngineError> {
    let (target, resolver) = open_guest(config, symbols)?;
    let id = session.add_target(Box::new(target), Some(Box::new(resolver)));
    session.engine(id)?.set_step_unsupported_in_place(true);
    Ok(id)
}

/// Run `hotprobe guest ...`.
pub fn run(o: &GuestOptions<'_>) -> Result<()> {
    let (args, maxactive) = match o.action {
        Action::Trace {
            args, maxactive, ..
        } => (args, maxactive),
        Action::Count { maxactive } => (None, maxactive),
    };
    if let Some(n) = args {
        if n > 6 {
            bail!("--args {n}: at most 6 argument registers (rdi, rsi, rdx, rcx, r8, r9)");
        }
    }
    let mut session = Session::with_config(SessionConfig {
        maxactive,
        fast_path: FastPathConfig {
            record_args: args.unwrap_or(0) as u8,
            ..FastPathConfig::default()
        },
        ..SessionConfig::default()
    });
    let mut guests = Vec::new();
    for g in &o.guests {
        let stub = stub_addr(&g.gdb)?;
        let (symbols, text) = load_symbols(&g.symbols)
            .with_context(|| format!("guest symbols {}", g.symbols.display()))?;
        let mut cfg = GuestConfig::new(stub);
        cfg.ram_file = g.ram.clone();
        cfg.kernel_text = text;
        let id = match connect_guest(&mut session, cfg, symbols) {
            Ok(id) => id,
            Err(e) => {
                let _ = session.detach();
                return Err(e).with_context(|| format!("cannot connect to the stub at {}", g.gdb));
            }
        };
        guests.push(Connected {
            id,
            name: g.gdb.clone(),
        });
    }
    let placed = match place(&mut session, &guests, o) {
        Ok(p) => p,
        Err(e) => {
            let _ = session.detach();
            return Err(e);
        }
    };
    let mut tree = match o.action {
        Action::Trace { .. } => {
            outln!("{HEADER}");
            Some(LiveTree::new(&placed, args))
        }
        Action::Count { .. } => None,
    };
    let ran = run_loop(
        &mut session,
        &guests,
        placed.len(),
        o.duration,
        tree.as_mut().map(|t| t as &mut dyn EventSink),
    );
    match o.action {
        Action::Count { .. } => print_table(&session, &placed, false),
        Action::Trace { summary: true, .. } => {
            outln!();
            print_table(&session, &placed, false);
        }
        Action::Trace { .. } => {}
    }
    ran
}

fn place(
    session: &mut Session,
    guests: &[Connected],
    o: &GuestOptions<'_>,
) -> Result<Vec<Placement>> {
    let bar = progress((o.probes.len() * guests.len()) as u64, "placing probes");
    let mut placed = Vec::new();
    for g in guests {
        for spec in o.probes {
            bar.inc(1);
            let action = match o.action {
                Action::Count { .. } => hotprobe::Action::Count,
                Action::Trace { .. } => hotprobe::Action::Record,
            };
            let added = session
                .add(g.id, spec, action)
                .with_context(|| format!("guest {}: cannot probe {spec}", g.name))?;
            for s in &added.skipped {
                bar.suspend(|| errln!("hotprobe: skipping {}: {}", s.label, s.reason));
            }
            for mut p in added.placements {
                if guests.len() > 1 {
                    p.label = format!("{} [{}]", p.label, g.name);
                }
                placed.push(p);
            }
        }
    }
    bar.finish_and_clear();
    Ok(placed)
}

fn run_loop(
    session: &mut Session,
    guests: &[Connected],
    nprobes: usize,
    duration: Option<Duration>,
    mut sink: Option<&mut dyn EventSink>,
) -> Result<()> {
    session.start()?;
    let names: Vec<&str> = guests.iter().map(|g| g.name.as_str()).collect();
    errln!(
        "hotprobe: attached to {} guest{} ({}): {nprobes} probes",
        guests.len(),
        if guests.len() == 1 { "" } else { "s" },
        names.join(", ")
    );
    if let Some(d) = duration {
        signals::stop_after(d);
    }
    // A guest that dies is dropped by the session (its notice is printed at
    // the end); the loop goes on with the others. Ctrl-C interrupts the
    // stub read (no SA_RESTART) and raises STOP.
    let end = match session.run_with(&signals::STOP, sink.as_deref_mut()) {
        Ok(end) => end,
        Err(e) => {
            let _ = session.finish(Duration::ZERO, sink);
            print_notices(session);
            return Err(e).context("the event loop failed; detached");
        }
    };
    match end {
        RunEnd::AllExited => errln!("hotprobe: every guest is gone"),
        RunEnd::Interrupted | RunEnd::Stopped => {
            session
                .finish(Duration::ZERO, sink)
                .context("cannot detach from the guests")?;
            let why = match signals::stop_reason() {
                Some(StopReason::Timer) => "duration elapsed".to_string(),
                Some(StopReason::OutputClosed) => "the output's reader went away".to_string(),
                Some(StopReason::Signal(libc::SIGINT)) => "interrupted".to_string(),
                Some(StopReason::Signal(s)) => format!("signal {s}"),
                None => "stopped".to_string(),
            };
            errln!(
                "hotprobe: {why}: detached from the guests, which run on with their kernel text restored"
            );
        }
    }
    print_notices(session);
    Ok(())
}

pub(crate) fn print_notices(session: &mut Session) {
    for n in session.take_notices() {
        errln!("hotprobe: {n}");
    }
}

/// What `hotprobe guest (count|trace|record) PROBE... -- QEMU ARGS` does.
pub enum LaunchedAction<'a> {
    /// Count hits (returns for `%return`).
    Count,
    /// Print a live call tree.
    Trace {
        /// Argument registers shown.
        args: Option<usize>,
        /// Print the count table at the end.
        summary: bool,
    },
    /// Record a trace into a directory.
    Record {
        /// The trace directory.
        out: &'a Path,
        /// Replace a trace already in `out`.
        force: bool,
        /// Argument registers recorded.
        args: usize,
        /// Boot phases: the kernel's boot milestones and initcall levels
        /// recorded as phase markers
        /// ([`hotprobe::guest_boot::BOOT_MILESTONES`]).
        boot: bool,
    },
}

/// `hotprobe guest ... -- qemu-system-x86_64 ARGS [-- qemu-system-x86_64 ARGS]...`:
/// guests hotprobe starts with its QEMU plugin, one per `--` block.
pub struct LaunchedOptions<'a> {
    /// QEMU's command lines, one per guest (several only for `count`).
    pub qemus: &'a [Vec<OsString>],
    /// The guest kernel's symbols (every guest's); default: each guest's
    /// own `-kernel` image.
    pub symbols: Option<PathBuf>,
    /// Probe specs (placed on every guest).
    pub probes: &'a [String],
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Live calls followed at once per function.
    pub maxactive: usize,
    /// Synchronous delivery (the vCPU waits until hotprobe has each event).
    pub sync: bool,
    /// count, trace or record.
    pub action: LaunchedAction<'a>,
}

/// A guest hotprobe started: its number on the command line (from 1) and
/// its target in the session (its QEMU is in the [`GuestFleet`]).
struct Started {
    n: usize,
    t: TargetId,
    /// The target's own name in notices (`guest SOCKET`).
    name: String,
}

/// Starts QEMU with hotprobe's plugin (and a GDB stub of hotprobe's) for
/// each guest, places the probes on every guest's plugin (the stub for what
/// the plugin cannot take), lets the guests run, and reports when every
/// guest has powered off (a guest that exits first ends its own stream; the
/// others go on), on Ctrl-C or after `--duration`. Returns QEMU's exit
/// code; with several guests, 0 if every QEMU exited 0, else the code of the
/// first guest (in command-line order) that did not (128 + signal for a
/// killed QEMU).
pub fn run_launched(o: &LaunchedOptions<'_>) -> Result<u8> {
    let nargs = match o.action {
        LaunchedAction::Trace { args, .. } => args.unwrap_or(0),
        LaunchedAction::Record { args, .. } => args,
        LaunchedAction::Count => 0,
    };
    let boot = matches!(o.action, LaunchedAction::Record { boot: true, .. });
    if nargs > 6 {
        bail!("--args {nargs}: at most 6 argument registers (rdi, rsi, rdx, rcx, r8, r9)");
    }
    let several = o.qemus.len() > 1;
    if o.qemus.is_empty() || (several && matches!(o.action, LaunchedAction::Record { .. })) {
        bail!("several guests (one -- block each) are for guest count and trace only");
    }
    // The trace directory is checked before any QEMU starts.
    let out_dir = match o.action {
        LaunchedAction::Record { out, force, .. } => {
            Some(crate::record::check_out_dir(out, force)?)
        }
        _ => None,
    };
    let mut session = Session::with_config(SessionConfig {
        maxactive: o.maxactive,
        fast_path: FastPathConfig {
            record_args: nargs as u8,
            ..FastPathConfig::default()
        },
        ..SessionConfig::default()
    });
    // Until the probes are placed, an error kills every QEMU started
    // (the fleet drops).
    let mut fleet = GuestFleet::new();
    let mut started: Vec<Started> = Vec::new();
    for (i, qemu) in o.qemus.iter().enumerate() {
        let n = i + 1;
        let who = if several {
            format!("guest {n}: ")
        } else {
            String::new()
        };
        let Some(sym_path) = o.symbols.clone().or_else(|| kernel_image(qemu)) else {
            bail!(
                "{who}give --symbols FILE (the guest kernel's /proc/kallsyms, System.map or \
                 vmlinux) or boot the guest with -kernel IMAGE"
            );
        };
        let launched = load_symbols(&sym_path)
            .with_context(|| format!("{who}guest symbols {}", sym_path.display()))
            .and_then(|(symbols, _)| {
                fleet
                    .launch(qemu, symbols, LaunchOptions::default())
                    .with_context(|| {
                        format!("{who}cannot start the guest with hotprobe's QEMU plugin")
                    })
            })?;
        errln!(
            "hotprobe: {who}started QEMU (pid {}) with hotprobe's plugin",
            launched.pid
        );
        let name = hotprobe::Target::describe(&launched.target);
        let t = session.add_plugin_guest(
            Box::new(launched.target),
            Some(Box::new(launched.resolver)),
            launched.plugin,
        );
        started.push(Started { n, t, name });
    }
    // The guest of each probe (several guests: the GUEST column, one call
    // tree each).
    let mut guest_of = std::collections::HashMap::new();
    let mut index_of = std::collections::HashMap::new();
    let mut placed = Vec::new();
    for (i, &Started { n, t, .. }) in started.iter().enumerate() {
        match place_launched(&mut session, t, o) {
            Ok(p) => {
                for pl in &p {
                    guest_of.insert(pl.id.0, n.to_string());
                    index_of.insert(pl.id.0, i);
                }
                placed.extend(p);
            }
            Err(e) => {
                return Err(if several {
                    e.context(format!("guest {n}"))
                } else {
                    e
                });
            }
        }
    }
    let t = started[0].t;
    let markers = if boot {
        // The boot milestones and the initcall levels as phase markers (a
        // milestone the kernel lacks is skipped with a notice).
        let m = BootMarkers::place(&mut session, t, delivery(o.sync), &mut placed);
        let skipped = match &m {
            Ok(m) => &m.skipped,
            Err(BootError::NoMilestone { skipped }) => skipped,
        };
        for s in skipped {
            errln!("hotprobe: boot phases: no marker {}: {}", s.label, s.reason);
        }
        m.map_err(|e| anyhow::anyhow!("--boot: {e}"))?
    } else {
        BootMarkers::default()
    };
    let mut writer = None;
    if let LaunchedAction::Record { out, .. } = o.action {
        if out_dir == Some(crate::record::OutDir::Replace) {
            crate::record::clear_trace_dir(out)?;
        }
        let pid = fleet.pid(0).unwrap_or(0);
        writer = Some(record_writer(out, o, &placed, pid, nargs, &markers)?);
    }
    let mut tree = match o.action {
        LaunchedAction::Trace { args, .. } => {
            outln!("{HEADER}");
            Some(GuestTrees::new(&placed, &index_of, started.len(), args))
        }
        _ => None,
    };
    // Without --boot the markers are empty: every event passes unchanged.
    let mut boot_sink = writer
        .as_mut()
        .map(|w| markers.sink(w as &mut dyn EventSink));
    let sink: Option<&mut dyn EventSink> = match (&mut tree, &mut boot_sink) {
        (Some(t), _) => Some(t),
        (None, Some(b)) => Some(b),
        (None, None) => None,
    };
    let ran = run_launched_loop(&mut session, placed.len(), started.len(), o.duration, sink);
    // Detached: the guests run on after hotprobe unless they powered off.
    let mut qemus = fleet.release();
    if let Some(w) = writer {
        let st = w.finish().context("cannot finish the trace")?;
        errln!(
            "hotprobe: {} events written to {}",
            st.events_in,
            match o.action {
                LaunchedAction::Record { out, .. } => out.display().to_string(),
                _ => String::new(),
            }
        );
    }
    let extras = crate::session::TableExtras {
        guests: several.then_some(&guest_of),
        ..Default::default()
    };
    match o.action {
        LaunchedAction::Count => {
            crate::session::print_table_with(&session, &placed, false, &extras)
        }
        LaunchedAction::Trace { summary: true, .. } => {
            outln!();
            crate::session::print_table_with(&session, &placed, false, &extras)
        }
        _ => {}
    }
    for g in &started {
        let who = if several {
            format!("guest {}: ", g.n)
        } else {
            String::new()
        };
        if let Some(ps) = session.plugin_stats(g.t) {
            if ps.ring_drops + ps.sync_timeouts + ps.orphaned > 0 {
                errln!(
                    "hotprobe: {who}plugin: {} events dropped (full rings), {} synchronous \
                     events released by the timeout, {} not delivered",
                    ps.ring_drops,
                    ps.sync_timeouts,
                    ps.orphaned
                );
            }
        }
    }
    let notices = session.take_notices();
    let end = match ran {
        Ok(end) => end,
        Err(e) => {
            print_end_notices(notices, &[]);
            return Err(e);
        }
    };
    // The guests powered off, or Ctrl-C reached QEMU too; else they run on.
    let mut status = 0;
    let mut normal_ends = Vec::new();
    for (g, qemu) in started.iter().zip(&mut qemus) {
        let who = if several {
            format!("guest {}: ", g.n)
        } else {
            String::new()
        };
        match qemu.wait_timeout(Duration::from_secs(3)) {
            Some(st) => {
                let code = shell_exit_code(st);
                match st.signal() {
                    Some(s) => errln!(
                        "hotprobe: {who}QEMU (pid {}) was killed by signal {s}",
                        qemu.pid()
                    ),
                    // Several guests: each one's end is said (a column of
                    // the run); one guest that powered off ends silently.
                    None if code != 0 || several => errln!(
                        "hotprobe: {who}QEMU (pid {}) exited with status {code}",
                        qemu.pid()
                    ),
                    None => {}
                }
                if st.signal().is_none() && code == 0 {
                    // Its stub's disconnection is no news then.
                    normal_ends.push(g.name.as_str());
                }
                if status == 0 {
                    status = code;
                }
            }
            None => {
                errln!(
                    "hotprobe: {who}QEMU (pid {}) runs on without probes",
                    qemu.pid()
                );
            }
        }
    }
    print_end_notices(notices, &normal_ends);
    if matches!(end, RunEnd::AllExited) && normal_ends.len() < started.len() {
        errln!(
            "hotprobe: {}",
            if several {
                "every guest is gone"
            } else {
                "the guest is gone"
            }
        );
    }
    Ok(status)
}

/// Prints the session's notices at the end of a launched run, but not the
/// stub disconnection of a guest whose QEMU exited 0 (`normal_ends`: the
/// targets' names): a guest that powered off ends silently.
pub(crate) fn print_end_notices(notices: Vec<String>, normal_ends: &[&str]) {
    for n in notices {
        let routine = normal_ends
            .iter()
            .any(|name| n.starts_with(&format!("{name} disconnected")));
        if !routine {
            errln!("hotprobe: {n}");
        }
    }
}

/// The live call trees of `guest trace`: one per guest (each its own
/// stacks: guests' task ids overlap), the functions of guest N shown as
/// `[gN] name` when there are several guests.
struct GuestTrees {
    trees: Vec<LiveTree>,
    /// The tree (guest index) of each probe id.
    index_of: std::collections::HashMap<u32, usize>,
}

impl GuestTrees {
    fn new(
        placed: &[Placement],
        index_of: &std::collections::HashMap<u32, usize>,
        guests: usize,
        args: Option<usize>,
    ) -> GuestTrees {
        let trees = (0..guests)
            .map(|i| {
                let mine: Vec<Placement> = placed
                    .iter()
                    .filter(|p| index_of.get(&p.id.0) == Some(&i))
                    .map(|p| {
                        let mut p = p.clone();
                        if guests > 1 {
                            let name = p
                                .function
                                .clone()
                                .unwrap_or_else(|| p.label.trim_end_matches("%return").into());
                            p.function = Some(format!("[g{}] {name}", i + 1));
                        }
                        p
                    })
                    .collect();
                LiveTree::new(&mine, args)
            })
            .collect();
        GuestTrees {
            trees,
            index_of: index_of.clone(),
        }
    }
}

impl EventSink for GuestTrees {
    fn event(&mut self, ev: &hotprobe::RecordedEvent) -> Result<(), hotprobe::SinkError> {
        self.event_data(ev, &[])
    }

    fn event_data(
        &mut self,
        ev: &hotprobe::RecordedEvent,
        data: &[u8],
    ) -> Result<(), hotprobe::SinkError> {
        let i = self.index_of.get(&ev.probe_id).copied().unwrap_or(0);
        match self.trees.get_mut(i) {
            Some(t) => t.event_data(ev, data),
            None => Ok(()),
        }
    }

    fn lost(&mut self, tid: u32, ts: u64, count: u64) -> Result<(), hotprobe::SinkError> {
        // A loss names no probe: shown once, in the first guest's tree.
        match self.trees.first_mut() {
            Some(t) => t.lost(tid, ts, count),
            None => Ok(()),
        }
    }
}

fn place_launched(
    session: &mut Session,
    t: TargetId,
    o: &LaunchedOptions<'_>,
) -> Result<Vec<Placement>> {
    let opts = PluginOptions {
        delivery: delivery(o.sync),
        ..PluginOptions::default()
    };
    let action = || match o.action {
        LaunchedAction::Count => hotprobe::Action::Count,
        _ => hotprobe::Action::Record,
    };
    let mut placed = Vec::new();
    for spec in o.probes {
        let added = session
            .add_plugin(t, spec, action(), &opts)
            .with_context(|| format!("guest: cannot probe {spec}"))?;
        for s in &added.skipped {
            errln!("hotprobe: skipping {}: {}", s.label, s.reason);
        }
        placed.extend(added.placements);
    }
    Ok(placed)
}

fn record_writer(
    out: &Path,
    o: &LaunchedOptions<'_>,
    placed: &[Placement],
    pid: u32,
    nargs: usize,
    markers: &BootMarkers,
) -> Result<TraceWriter> {
    let clock = || {
        // SAFETY: rdtsc has no preconditions on x86-64.
        let tsc = unsafe { core::arch::x86_64::_rdtsc() };
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: a valid timespec.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        (tsc, ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
    };
    let (tsc0, ns0) = clock();
    std::thread::sleep(Duration::from_millis(50));
    let (tsc1, ns1) = clock();
    let symbols = markers.symbols(placed, nargs as u8);
    let meta = TraceMeta {
        target: "guest kernel".into(),
        command: o.qemus[0]
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        pid: Some(pid),
        time_base: TimeBase::Tsc {
            tsc0,
            ns0,
            tsc1,
            ns1,
        },
        start_unix_ns: 0,
        phase_markers: Vec::new(),
        symbols,
        filter: Filter::default(),
        aggregate: true,
    };
    TraceWriter::create(out, meta)
        .with_context(|| format!("cannot create the trace in {}", out.display()))
}

/// The plugin's delivery: synchronous with `--sync`.
pub(crate) fn delivery(sync: bool) -> Delivery {
    if sync {
        Delivery::Sync
    } else {
        Delivery::Async
    }
}

pub(crate) fn run_launched_loop(
    session: &mut Session,
    nprobes: usize,
    nguests: usize,
    duration: Option<Duration>,
    mut sink: Option<&mut dyn EventSink>,
) -> Result<RunEnd> {
    session.start()?;
    if nguests == 1 {
        errln!("hotprobe: the guest runs: {nprobes} probes");
    } else {
        errln!("hotprobe: {nguests} guests run: {nprobes} probes");
    }
    if let Some(d) = duration {
        signals::stop_after(d);
    }
    let end = match session.run_with(&signals::STOP, sink.as_deref_mut()) {
        Ok(end) => end,
        Err(e) => {
            let _ = session.finish(Duration::ZERO, sink);
            return Err(e).context("the event loop failed; detached");
        }
    };
    // An end of every guest is said by the caller once QEMU's exit status
    // is known (a guest that powered off ends silently).
    if let RunEnd::Interrupted | RunEnd::Stopped = end {
        // Ctrl-C reached QEMU too: it may be on its way out.
        session
            .finish(Duration::from_secs(2), sink)
            .context("cannot detach from the guests")?;
    }
    Ok(end)
}
