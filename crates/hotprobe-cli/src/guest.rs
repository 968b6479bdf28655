//! `hotprobe guest`: `count` and `trace` on VM guest kernels through their
//! GDB stubs (QEMU `-gdb`), one or several guests in one session.
//!
//! ```text
//! hotprobe guest --gdb HOST:PORT|unix:PATH --symbols FILE [--ram FILE] \
//!                [--gdb ... --symbols ... [--ram ...]] (count|trace) PROBE... [--duration S]
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
use hotprobe::{EventSink, FastPathConfig, Placement, RunEnd, Session, SessionConfig, TargetId};
use hotprobe_guest::{load_symbols, open_guest, GuestConfig, StubAddr};
use hotprobe_symbols::KernelSymbols;
use std::path::PathBuf;
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
