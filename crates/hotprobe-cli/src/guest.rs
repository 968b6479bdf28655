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
//! ```
//! `--symbols` is the guest's `/proc/kallsyms` (read as root), its
//! `System.map`, its vmlinux, or the bzImage QEMU boots with `-kernel`
//! (recognised by its boot header, `HdrS`: the symbols are recovered from
//! the kernel's own kallsyms tables and cached, see
//! `hotprobe_guest::symbols_from_kernel_image`; boot the guest with
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
use hotprobe::{
    EventSink, FastPathConfig, Placement, PluginOptions, RunEnd, Session, SessionConfig, TargetId,
};
use hotprobe_guest::{load_symbols, open_guest, GuestConfig, LaunchOptions, StubAddr};
use hotprobe_qemu::Delivery;
use hotprobe_symbols::KernelSymbols;
use hotprobe_trace::{Filter, ProbeKind, Symbol, TimeBase, TraceMeta, TraceWriter};
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

fn print_notices(session: &mut Session) {
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
        /// Argument registers recorded.
        args: usize,
        /// Boot phases: the kernel's boot milestones and initcall levels
        /// recorded as phase markers ([`BOOT_MILESTONES`]).
        boot: bool,
    },
}

/// Kernel functions `record --boot` records as phase markers, in boot
/// order: the kernel's start, the end of the initcalls (init memory freed),
/// and the first user process.
pub const BOOT_MILESTONES: [&str; 3] = ["start_kernel", "free_initmem", "run_init_process"];

/// The kernel function each initcall level starts with (its argument: the
/// level's name): `do_initcall_level` is inlined, this one is `noinline`.
pub const INITCALL_LEVEL_FN: &str = "trace_initcall_level";

/// The initcall levels' names as the kernel passes them
/// (`initcall_level_names`, and `early` from `do_pre_smp_initcalls`).
pub const INITCALL_LEVELS: [&str; 9] = [
    "early", "pure", "core", "postcore", "arch", "subsys", "fs", "device", "late",
];

/// The marker probes of `record --boot`.
#[derive(Default)]
struct BootMarkers {
    /// Milestone probes: their entries become marker hits.
    milestones: std::collections::HashSet<u32>,
    /// The probe on [`INITCALL_LEVEL_FN`].
    level_probe: Option<u32>,
    /// The id of the first level marker (`initcall:early`); the others
    /// follow in [`INITCALL_LEVELS`] order.
    level_base: u32,
}

/// Rewrites the boot markers' events into marker hits (a level's hit under
/// its own marker symbol, `initcall:LEVEL`), the rest unchanged.
struct BootSink<'a> {
    inner: &'a mut TraceWriter,
    m: &'a BootMarkers,
}

impl EventSink for BootSink<'_> {
    fn event(&mut self, ev: &hotprobe::RecordedEvent) -> Result<(), hotprobe::SinkError> {
        self.event_data(ev, &[])
    }

    fn event_data(
        &mut self,
        ev: &hotprobe::RecordedEvent,
        data: &[u8],
    ) -> Result<(), hotprobe::SinkError> {
        let hit = |probe_id| hotprobe::RecordedEvent {
            probe_id,
            kind: hotprobe::KIND_HIT,
            nargs: 0,
            ..*ev
        };
        if self.m.milestones.contains(&ev.probe_id) {
            if ev.kind == hotprobe::KIND_ENTRY {
                self.inner.event(&hit(ev.probe_id))?;
            }
            return Ok(());
        }
        if Some(ev.probe_id) == self.m.level_probe {
            if ev.kind == hotprobe::KIND_ENTRY {
                if let Some(i) = INITCALL_LEVELS.iter().position(|l| l.as_bytes() == data) {
                    self.inner.event(&hit(self.m.level_base + i as u32))?;
                }
            }
            return Ok(());
        }
        self.inner.event(ev)
    }

    fn lost(&mut self, tid: u32, ts: u64, count: u64) -> Result<(), hotprobe::SinkError> {
        self.inner.lost(tid, ts, count)
    }
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

/// A guest hotprobe started: its number on the command line (from 1), its
/// QEMU and its target in the session.
struct Started {
    n: usize,
    qemu: hotprobe_qemu::QemuProcess,
    t: TargetId,
}

/// QEMU's exit status as a shell shows it (128 + signal when killed).
fn exit_code(st: std::process::ExitStatus) -> u8 {
    st.code()
        .map_or_else(|| 128 + st.signal().unwrap_or(0) as u8, |c| c as u8)
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
    let mut session = Session::with_config(SessionConfig {
        maxactive: o.maxactive,
        fast_path: FastPathConfig {
            record_args: nargs as u8,
            ..FastPathConfig::default()
        },
        ..SessionConfig::default()
    });
    let mut started: Vec<Started> = Vec::new();
    let kill_all = |started: &mut Vec<Started>| {
        for g in started.iter_mut() {
            g.qemu.kill();
        }
    };
    for (i, qemu) in o.qemus.iter().enumerate() {
        let n = i + 1;
        let who = if several {
            format!("guest {n}: ")
        } else {
            String::new()
        };
        let Some(sym_path) = o.symbols.clone().or_else(|| kernel_image(qemu)) else {
            kill_all(&mut started);
            bail!(
                "{who}give --symbols FILE (the guest kernel's /proc/kallsyms, System.map or \
                 vmlinux) or boot the guest with -kernel IMAGE"
            );
        };
        let launched = load_symbols(&sym_path)
            .with_context(|| format!("{who}guest symbols {}", sym_path.display()))
            .and_then(|(symbols, _)| {
                hotprobe_guest::launch(qemu, symbols, LaunchOptions::default()).with_context(|| {
                    format!("{who}cannot start the guest with hotprobe's QEMU plugin")
                })
            });
        let launched = match launched {
            Ok(l) => l,
            Err(e) => {
                kill_all(&mut started);
                return Err(e);
            }
        };
        errln!(
            "hotprobe: {who}started QEMU (pid {}) with hotprobe's plugin",
            launched.qemu.pid()
        );
        let t = session.add_plugin_guest(
            Box::new(launched.target),
            Some(Box::new(launched.resolver)),
            launched.plugin,
        );
        started.push(Started {
            n,
            qemu: launched.qemu,
            t,
        });
    }
    // The guest of each probe (several guests: the GUEST column, one call
    // tree each).
    let mut guest_of = std::collections::HashMap::new();
    let mut index_of = std::collections::HashMap::new();
    let mut placed = Vec::new();
    for i in 0..started.len() {
        let (n, t) = (started[i].n, started[i].t);
        match place_launched(&mut session, t, o) {
            Ok(p) => {
                for pl in &p {
                    guest_of.insert(pl.id.0, n.to_string());
                    index_of.insert(pl.id.0, i);
                }
                placed.extend(p);
            }
            Err(e) => {
                kill_all(&mut started);
                return Err(if several {
                    e.context(format!("guest {n}"))
                } else {
                    e
                });
            }
        }
    }
    let t = started[0].t;
    let (placed, markers) = if boot {
        match place_boot_markers(&mut session, t, o, placed) {
            Ok(p) => p,
            Err(e) => {
                kill_all(&mut started);
                return Err(e);
            }
        }
    } else {
        (placed, BootMarkers::default())
    };
    let mut writer = None;
    if let LaunchedAction::Record { out, .. } = o.action {
        match record_writer(out, o, &placed, started[0].qemu.pid(), nargs, &markers) {
            Ok(w) => writer = Some(w),
            Err(e) => {
                kill_all(&mut started);
                return Err(e);
            }
        }
    }
    let mut tree = match o.action {
        LaunchedAction::Trace { args, .. } => {
            outln!("{HEADER}");
            Some(GuestTrees::new(&placed, &index_of, started.len(), args))
        }
        _ => None,
    };
    // Without --boot the markers are empty: every event passes unchanged.
    let mut boot_sink = writer.as_mut().map(|w| BootSink {
        inner: w,
        m: &markers,
    });
    let sink: Option<&mut dyn EventSink> = match (&mut tree, &mut boot_sink) {
        (Some(t), _) => Some(t),
        (None, Some(b)) => Some(b),
        (None, None) => None,
    };
    let ran = run_launched_loop(&mut session, placed.len(), started.len(), o.duration, sink);
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
    print_notices(&mut session);
    ran?;
    // The guests powered off, or Ctrl-C reached QEMU too; else they run on.
    let mut status = 0;
    for g in &mut started {
        let who = if several {
            format!("guest {}: ", g.n)
        } else {
            String::new()
        };
        match g.qemu.wait_timeout(Duration::from_secs(3)) {
            Some(st) => {
                let code = exit_code(st);
                if several {
                    match st.signal() {
                        Some(s) => errln!(
                            "hotprobe: {who}QEMU (pid {}) was killed by signal {s}",
                            g.qemu.pid()
                        ),
                        None => errln!(
                            "hotprobe: {who}QEMU (pid {}) exited with status {code}",
                            g.qemu.pid()
                        ),
                    }
                }
                if status == 0 {
                    status = code;
                }
            }
            None => {
                errln!(
                    "hotprobe: {who}QEMU (pid {}) runs on without probes",
                    g.qemu.pid()
                );
            }
        }
    }
    Ok(status)
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
        delivery: if o.sync {
            Delivery::Sync
        } else {
            Delivery::Async
        },
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

/// `record --boot`: the boot milestones and the initcall levels as phase
/// markers (a milestone the kernel lacks is skipped with a notice).
fn place_boot_markers(
    session: &mut Session,
    t: TargetId,
    o: &LaunchedOptions<'_>,
    mut placed: Vec<Placement>,
) -> Result<(Vec<Placement>, BootMarkers)> {
    let delivery = if o.sync {
        Delivery::Sync
    } else {
        Delivery::Async
    };
    let mut m = BootMarkers::default();
    let level_opts = PluginOptions {
        delivery,
        values: Some(vec![hotprobe_qemu::Fetch::Reg(hotprobe_qemu::Reg::Rdi)]),
        string: Some(hotprobe_qemu::StringFetch {
            index: 0,
            max_len: 16,
        }),
        ..PluginOptions::default()
    };
    let plain = PluginOptions {
        delivery,
        values: Some(Vec::new()),
        ..PluginOptions::default()
    };
    let mut add = |name: &str, opts: &PluginOptions| -> Option<Placement> {
        match session.add_plugin(t, name, hotprobe::Action::Record, opts) {
            Ok(a) => a.placements.into_iter().next(),
            Err(e) => {
                errln!("hotprobe: boot phases: no marker {name}: {e}");
                None
            }
        }
    };
    for name in BOOT_MILESTONES {
        if let Some(p) = add(name, &plain) {
            m.milestones.insert(p.id.0);
            placed.push(p);
        }
    }
    if let Some(p) = add(INITCALL_LEVEL_FN, &level_opts) {
        m.level_probe = Some(p.id.0);
        placed.push(p);
    }
    m.level_base = placed.iter().map(|p| p.id.0 + 1).max().unwrap_or(0);
    if m.milestones.is_empty() && m.level_probe.is_none() {
        bail!("--boot: none of the kernel's boot milestones can be probed");
    }
    Ok((placed, m))
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
    let mut symbols: Vec<Symbol> = placed
        .iter()
        .filter(|p| Some(p.id.0) != markers.level_probe)
        .map(|p| {
            let marker = markers.milestones.contains(&p.id.0);
            Symbol {
                id: p.id.0,
                name: p.function.clone().unwrap_or_else(|| p.label.clone()),
                module: p.module.clone(),
                addr: p.addr.0,
                kind: if marker {
                    ProbeKind::Marker
                } else {
                    ProbeKind::Function
                },
                nargs: if marker { 0 } else { nargs as u8 },
                retval: !marker,
            }
        })
        .collect();
    if let Some(lp) = markers.level_probe {
        let addr = placed.iter().find(|p| p.id.0 == lp).map_or(0, |p| p.addr.0);
        for (i, l) in INITCALL_LEVELS.iter().enumerate() {
            symbols.push(Symbol {
                id: markers.level_base + i as u32,
                name: format!("initcall:{l}"),
                module: "kernel".into(),
                addr,
                kind: ProbeKind::Marker,
                nargs: 0,
                retval: false,
            });
        }
    }
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

fn run_launched_loop(
    session: &mut Session,
    nprobes: usize,
    nguests: usize,
    duration: Option<Duration>,
    mut sink: Option<&mut dyn EventSink>,
) -> Result<()> {
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
    match end {
        RunEnd::AllExited if nguests == 1 => errln!("hotprobe: the guest is gone"),
        RunEnd::AllExited => errln!("hotprobe: every guest is gone"),
        RunEnd::Interrupted | RunEnd::Stopped => {
            // Ctrl-C reached QEMU too: it may be on its way out.
            session
                .finish(Duration::from_secs(2), sink)
                .context("cannot detach from the guests")?;
        }
    }
    Ok(())
}

/// `hotprobe guest syscalls [--pid N | --comm NAME] -- qemu-system-x86_64 ARGS`.
pub struct SyscallsOptions<'a> {
    /// QEMU's command line.
    pub qemu: &'a [OsString],
    /// The guest kernel's symbols (default: its `-kernel` image).
    pub symbols: Option<PathBuf>,
    /// Only this guest thread id.
    pub pid: Option<u32>,
    /// Only tasks with this name (its first 8 bytes, in the plugin).
    pub comm: Option<String>,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Synchronous delivery.
    pub sync: bool,
    /// Write the calls to this file instead of standard output (which the
    /// guest's console may share).
    pub output: Option<PathBuf>,
}

/// The `-kernel IMAGE` of a QEMU command line.
fn kernel_image(qemu: &[OsString]) -> Option<PathBuf> {
    qemu.windows(2)
        .find(|w| w[0] == "-kernel")
        .map(|w| PathBuf::from(&w[1]))
}

/// One system-call probe: its name and how many arguments its entry
/// events carry before the task fields.
struct SyscallProbe {
    name: String,
    nargs: usize,
}

/// Prints system calls as strace -f does: `[pid N] name(args) = ret`, an
/// entry whose exit comes after another task's event as `<unfinished ...>`
/// and its exit as `<... name resumed>`.
struct SyscallPrinter {
    probes: std::collections::HashMap<u32, SyscallProbe>,
    /// The last entry printed without its result: (pid, line).
    pending: Option<(u64, String)>,
    lost: u64,
    calls: u64,
    /// `--output`, else standard output.
    file: Option<std::io::BufWriter<std::fs::File>>,
}

impl SyscallPrinter {
    fn line(&mut self, l: std::fmt::Arguments<'_>) {
        use std::io::Write;
        match &mut self.file {
            Some(f) => {
                // A failed write is reported once at the end (flush).
                let _ = writeln!(f, "{l}");
            }
            None => {
                outln!("{l}");
            }
        }
    }

    fn flush_pending(&mut self) {
        if let Some((_, line)) = self.pending.take() {
            self.line(format_args!("{line} <unfinished ...>"));
        }
    }
}

impl EventSink for SyscallPrinter {
    fn event(&mut self, ev: &hotprobe::RecordedEvent) -> Result<(), hotprobe::SinkError> {
        self.event_data(ev, &[])
    }

    fn event_data(
        &mut self,
        ev: &hotprobe::RecordedEvent,
        data: &[u8],
    ) -> Result<(), hotprobe::SinkError> {
        let Some(p) = self.probes.get(&ev.probe_id) else {
            return Ok(());
        };
        let name = p.name.clone();
        if ev.kind == hotprobe::KIND_EXIT {
            // Exit events: rax, rdx, rsp, pid.
            let pid = ev.args[3];
            let ret = hotprobe_guest::syscalls::format_return(&name, ev.args[0]);
            match self.pending.take() {
                Some((ppid, line)) if ppid == pid => {
                    self.line(format_args!("{line} = {ret}"));
                }
                other => {
                    self.pending = other;
                    self.flush_pending();
                    self.line(format_args!("[pid {pid}] <... {name} resumed>) = {ret}"));
                }
            }
            return Ok(());
        }
        self.calls += 1;
        let n = p.nargs.min(ev.args.len());
        let pid = ev.args.get(n).copied().unwrap_or(0);
        let path = (!data.is_empty()).then_some(data);
        let line = format!(
            "[pid {pid}] {}",
            hotprobe_guest::syscalls::format_call(&name, &ev.args[..n], path)
        );
        self.flush_pending();
        if matches!(name.as_str(), "exit" | "exit_group") {
            // Never returns.
            self.line(format_args!("{line} = ?"));
        } else {
            self.pending = Some((pid, line));
        }
        Ok(())
    }

    fn lost(&mut self, _tid: u32, _ts: u64, count: u64) -> Result<(), hotprobe::SinkError> {
        self.lost += count;
        Ok(())
    }
}

/// Starts QEMU with hotprobe's plugin, puts a recording return probe on
/// every `__x64_sys_*` wrapper (arguments read from the `pt_regs` rdi points
/// to, the path read in the plugin, the task's pid (and name) read through
/// the kernel's current-task pointer, filtered in the plugin) and prints
/// each call as strace does. Returns QEMU's exit code.
pub fn run_syscalls(o: &SyscallsOptions<'_>) -> Result<u8> {
    use hotprobe_guest::syscalls;
    let image = kernel_image(o.qemu);
    let Some(sym_path) = o.symbols.clone().or_else(|| image.clone()) else {
        bail!("give --symbols FILE or boot the guest with -kernel IMAGE");
    };
    let (symbols, _) =
        load_symbols(&sym_path).with_context(|| format!("guest symbols {}", sym_path.display()))?;
    let task = match &image {
        Some(img) => match hotprobe_guest::task_layout_from_kernel_image(img) {
            Ok(l) => Some(l),
            Err(e) if o.pid.is_some() || o.comm.is_some() => {
                return Err(e).context("--pid/--comm need the kernel's task layout (its BTF)")
            }
            Err(e) => {
                errln!("hotprobe: {e}: pids are shown as 0");
                None
            }
        },
        None if o.pid.is_some() || o.comm.is_some() => {
            bail!("--pid/--comm need the kernel's BTF: boot the guest with -kernel IMAGE")
        }
        None => None,
    };
    // Every wrapper once (aliases share an address).
    let mut names: Vec<String> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for s in symbols.symbols() {
        // Not the compiler's parts (`.cold`, `.isra.0`, ...).
        if let Some(n) = s
            .name
            .strip_prefix("__x64_sys_")
            .filter(|n| !n.contains('.'))
        {
            if seen.insert(s.addr.0) {
                names.push(n.to_string());
            }
        }
    }
    if names.is_empty() {
        bail!(
            "no __x64_sys_* functions in {}: not an x86-64 Linux kernel?",
            sym_path.display()
        );
    }
    let opts = LaunchOptions {
        plugin: hotprobe_qemu::PluginConfig {
            max_probes: (names.len() as u32 + 16).next_power_of_two(),
            ..hotprobe_qemu::PluginConfig::default()
        },
        task_layout: task,
        ..LaunchOptions::default()
    };
    let launched = hotprobe_guest::launch(o.qemu, symbols, opts)
        .context("cannot start the guest with hotprobe's QEMU plugin")?;
    let mut qemu = launched.qemu;
    errln!(
        "hotprobe: started QEMU (pid {}) with hotprobe's plugin",
        qemu.pid()
    );
    let mut session = Session::with_config(SessionConfig {
        maxactive: 64,
        ..SessionConfig::default()
    });
    let t = session.add_plugin_guest(
        Box::new(launched.target),
        Some(Box::new(launched.resolver)),
        launched.plugin,
    );
    let file = match &o.output {
        Some(p) => match std::fs::File::create(p) {
            Ok(f) => Some(std::io::BufWriter::new(f)),
            Err(e) => {
                qemu.kill();
                return Err(e).with_context(|| format!("cannot create {}", p.display()));
            }
        },
        None => None,
    };
    let mut printer = SyscallPrinter {
        probes: Default::default(),
        pending: None,
        lost: 0,
        calls: 0,
        file,
    };
    let placed = (|| -> Result<usize> {
        for name in &names {
            let (values, string) = syscalls::arg_fetches(name, o.comm.is_some());
            let nargs = values.len() - 1 - o.comm.is_some() as usize;
            let filter_value = match (&o.pid, &o.comm) {
                (Some(pid), _) => Some((nargs as u8, *pid as u64)),
                (None, Some(c)) => Some((nargs as u8 + 1, syscalls::comm_word(c))),
                _ => None,
            };
            let popts = PluginOptions {
                delivery: if o.sync {
                    Delivery::Sync
                } else {
                    Delivery::Async
                },
                values: Some(values),
                string,
                filter_value,
                ..PluginOptions::default()
            };
            let spec = format!("__x64_sys_{name}");
            let added = session
                .add_plugin(t, &spec, hotprobe::Action::Record, &popts)
                .with_context(|| format!("guest: cannot probe {spec}"))?;
            for p in added.placements {
                printer.probes.insert(
                    p.id.0,
                    SyscallProbe {
                        name: name.clone(),
                        nargs,
                    },
                );
            }
        }
        Ok(printer.probes.len())
    })();
    let placed = match placed {
        Ok(n) => n,
        Err(e) => {
            qemu.kill();
            return Err(e);
        }
    };
    let ran = run_launched_loop(&mut session, placed, 1, o.duration, Some(&mut printer));
    printer.flush_pending();
    if let (Some(f), Some(p)) = (printer.file.take(), &o.output) {
        use std::io::Write;
        f.into_inner()
            .map_err(|e| e.into_error())
            .and_then(|mut f| f.flush())
            .with_context(|| format!("cannot write {}", p.display()))?;
    }
    errln!("hotprobe: {} system calls traced", printer.calls);
    if printer.lost > 0 {
        errln!(
            "hotprobe: {} events lost (full rings): the trace has gaps",
            printer.lost
        );
    }
    if let Some(ps) = session.plugin_stats(t) {
        if ps.sync_timeouts + ps.orphaned + ps.read_errors > 0 {
            errln!(
                "hotprobe: plugin: {} synchronous events released by the timeout, {} not \
                 delivered, {} guest memory reads failed",
                ps.sync_timeouts,
                ps.orphaned,
                ps.read_errors
            );
        }
    }
    print_notices(&mut session);
    ran?;
    let status = qemu.wait_timeout(Duration::from_secs(3));
    Ok(match status {
        Some(st) => st
            .code()
            .map_or_else(|| 128 + st.signal().unwrap_or(0) as u8, |c| c as u8),
        None => {
            errln!("hotprobe: QEMU (pid {}) runs on without probes", qemu.pid());
            0
        }
    })
}
