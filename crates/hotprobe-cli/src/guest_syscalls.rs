//! `hotprobe guest syscalls`: every system call of a guest hotprobe starts
//! with its QEMU plugin, printed as strace does.

use crate::guest::{delivery, print_end_notices, run_launched_loop};
use crate::out::{errln, outln};
use anyhow::{bail, Context, Result};
use hotprobe::guest::{kernel_image, load_symbols, shell_exit_code, GuestFleet, LaunchOptions};
use hotprobe::{EventSink, PluginOptions, Session, SessionConfig};
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

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
            let ret = hotprobe::guest::syscalls::format_return(&name, ev.args[0]);
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
            hotprobe::guest::syscalls::format_call(&name, &ev.args[..n], path)
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
    use hotprobe::guest::syscalls;
    let image = kernel_image(o.qemu);
    let Some(sym_path) = o.symbols.clone().or_else(|| image.clone()) else {
        bail!("give --symbols FILE or boot the guest with -kernel IMAGE");
    };
    let (symbols, _) =
        load_symbols(&sym_path).with_context(|| format!("guest symbols {}", sym_path.display()))?;
    let task = match &image {
        Some(img) => match hotprobe::guest::task_layout_from_kernel_image(img) {
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
        plugin: hotprobe::qemu::PluginConfig {
            max_probes: (names.len() as u32 + 16).next_power_of_two(),
            ..hotprobe::qemu::PluginConfig::default()
        },
        task_layout: task,
        ..LaunchOptions::default()
    };
    // Until the probes are placed, an error kills QEMU (the fleet drops).
    let mut fleet = GuestFleet::new();
    let launched = fleet
        .launch(o.qemu, symbols, opts)
        .context("cannot start the guest with hotprobe's QEMU plugin")?;
    errln!(
        "hotprobe: started QEMU (pid {}) with hotprobe's plugin",
        launched.pid
    );
    let mut session = Session::with_config(SessionConfig {
        maxactive: 64,
        ..SessionConfig::default()
    });
    let name = hotprobe::Target::describe(&launched.target);
    let t = session.add_plugin_guest(
        Box::new(launched.target),
        Some(Box::new(launched.resolver)),
        launched.plugin,
    );
    let file = match &o.output {
        Some(p) => match std::fs::File::create(p) {
            Ok(f) => Some(std::io::BufWriter::new(f)),
            Err(e) => return Err(e).with_context(|| format!("cannot create {}", p.display())),
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
                delivery: delivery(o.sync),
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
    let ran = run_launched_loop(&mut session, placed?, 1, o.duration, Some(&mut printer));
    // Detached: the guest runs on after hotprobe unless it powered off.
    let mut qemu = fleet.release().remove(0);
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
    let notices = session.take_notices();
    let end = match ran {
        Ok(end) => end,
        Err(e) => {
            print_end_notices(notices, &[]);
            return Err(e);
        }
    };
    let status = qemu.wait_timeout(Duration::from_secs(3));
    let code = match status {
        Some(st) => shell_exit_code(st),
        None => {
            errln!("hotprobe: QEMU (pid {}) runs on without probes", qemu.pid());
            0
        }
    };
    let normal = status.is_some() && code == 0;
    let ended = [name.as_str()];
    print_end_notices(notices, if normal { &ended } else { &[] });
    if matches!(end, hotprobe::RunEnd::AllExited) && !normal {
        errln!("hotprobe: the guest is gone (QEMU's status {code})");
    }
    Ok(code)
}
