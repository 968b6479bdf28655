//! `hotprobe guest`: `count` and `trace` on VM guest kernels through their
//! GDB stubs (QEMU `-gdb`), one or several guests in one session.
//!
//! ```text
//! hotprobe guest --gdb HOST:PORT|unix:PATH --symbols FILE [--ram FILE] \
//!                [--gdb ... --symbols ... [--ram ...]] (count|trace) PROBE... [--duration S]
//! ```
//! `--symbols` is the guest's `/proc/kallsyms` (read as root), its
//! `System.map`, or its vmlinux. `--ram` is QEMU's shared
//! `memory-backend-file` (`mem-path=`), to read guest memory without the
//! stub. A guest whose stub closes is dropped with a notice; the others go
//! on. Ctrl-C (or `--duration`) detaches: breakpoints removed, out-of-line
//! area restored, every guest running on.

use crate::count::print_table;
use crate::session::{progress, Placed};
use crate::signals::{self, StopReason};
use crate::trace::{call_tree_retprobe, emit, Printer, HEADER};
use anyhow::{bail, Context, Result};
use hotprobe::{Probe, ProbeSpec, RetProbe, RunEnd, Session, TargetId};
use hotprobe_guest::{load_symbols, open_guest, GuestConfig, StubAddr};
use hotprobe_symbols::KernelSymbols;
use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::time::Duration;

/// One guest from the command line.
pub struct GuestSpec {
    /// `HOST:PORT` or `unix:PATH`.
    pub gdb: String,
    /// kallsyms / System.map / vmlinux.
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
    if let Action::Trace { args: Some(n), .. } = o.action {
        if n > 6 {
            bail!("--args {n}: at most 6 argument registers (rdi, rsi, rdx, rcx, r8, r9)");
        }
    }
    let mut session = Session::new();
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
    if matches!(o.action, Action::Trace { .. }) {
        emit(format_args!("{HEADER}"));
    }
    run_loop(&mut session, &guests, placed.len(), o.duration)?;
    match o.action {
        Action::Count { .. } => print_table(&session, &placed),
        Action::Trace { summary: true, .. } => {
            println!();
            print_table(&session, &placed);
        }
        Action::Trace { .. } => {}
    }
    Ok(())
}

fn place(session: &mut Session, guests: &[Connected], o: &GuestOptions<'_>) -> Result<Vec<Placed>> {
    let bar = progress((o.probes.len() * guests.len()) as u64, "placing probes");
    let mut placed = Vec::new();
    for g in guests {
        let printer = Rc::new(RefCell::new(Printer::new(match o.action {
            Action::Trace { args, .. } => args,
            Action::Count { .. } => None,
        })));
        for spec in o.probes {
            bar.inc(1);
            let parsed: ProbeSpec = spec.parse()?;
            let resolved = session
                .resolve(g.id, spec)
                .with_context(|| format!("guest {}", g.name))?;
            let many = resolved.len() > 1;
            for r in resolved {
                let is_return = parsed.is_return();
                // A pattern: each match under its own name.
                let name = match (&r.function, many) {
                    (Some(f), true) if is_return => format!("{f}%return"),
                    (Some(f), true) => f.clone(),
                    _ => spec.clone(),
                };
                let label = if guests.len() > 1 {
                    format!("{name} [{}]", g.name)
                } else {
                    name
                };
                let id = match &o.action {
                    Action::Count { maxactive } => {
                        if is_return {
                            if r.offset != 0 {
                                bail!(
                                    "cannot probe {spec}: a return probe goes on a function's \
                                     first instruction, and {:#x} is {} bytes into {}",
                                    r.addr.0,
                                    r.offset,
                                    r.function.as_deref().unwrap_or("its function")
                                );
                            }
                            session.retprobe_addr(g.id, r.addr, RetProbe::new(*maxactive))?
                        } else {
                            session.probe_addr(g.id, r.addr, Probe::new())?
                        }
                    }
                    Action::Trace { maxactive, .. } => {
                        let rp = call_tree_retprobe(&printer, spec, &r, *maxactive)?;
                        session.retprobe_addr(g.id, r.addr, rp)?
                    }
                };
                let execution = match session.execution_of(id) {
                    Some(e) => format!("trap ({e})"),
                    None => "trap".into(),
                };
                let tracing = matches!(o.action, Action::Trace { .. });
                placed.push(Placed {
                    label: if tracing {
                        label.replace("%return", "")
                    } else {
                        label
                    },
                    id,
                    addr: r.addr.0,
                    is_return: is_return || tracing,
                    execution,
                });
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
) -> Result<()> {
    session.start()?;
    let names: Vec<&str> = guests.iter().map(|g| g.name.as_str()).collect();
    eprintln!(
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
    let end = match session.run_until(&signals::STOP) {
        Ok(end) => end,
        Err(e) => {
            let _ = session.detach();
            print_notices(session);
            return Err(e).context("the event loop failed; detached");
        }
    };
    match end {
        RunEnd::AllExited => eprintln!("hotprobe: every guest is gone"),
        RunEnd::Interrupted | RunEnd::Stopped => {
            session.detach().context("cannot detach from the guests")?;
            let why = match signals::stop_reason() {
                Some(StopReason::Timer) => "duration elapsed".to_string(),
                Some(StopReason::Signal(libc::SIGINT)) => "interrupted".to_string(),
                Some(StopReason::Signal(s)) => format!("signal {s}"),
                None => "stopped".to_string(),
            };
            eprintln!(
                "hotprobe: {why}: detached from the guests, which run on with their kernel text restored"
            );
        }
    }
    print_notices(session);
    Ok(())
}

fn print_notices(session: &mut Session) {
    for n in session.take_notices() {
        eprintln!("hotprobe: {n}");
    }
}
