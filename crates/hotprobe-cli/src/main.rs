//! `hotprobe`: dynamic probes on running Linux processes, from the shell.
//!
//! ```text
//! hotprobe list   (BINARY | -p PID) [PATTERN] [--blacklist]
//! hotprobe count  PROBE... (-p PID | -- CMD ARGS) [--duration SECS] [--mechanism auto|patch|jump|trap]
//! hotprobe coldpatch IN -o OUT
//! hotprobe trace  PROBE... (-p PID | -- CMD ARGS) [--args N] [--maxactive N]
//! hotprobe demo
//! hotprobe record [-o DIR] [--force] [PATTERN]... [--exclude GLOB]... [--phase FUNC]... [--max-depth N]
//!                 [--min-duration DUR] [--sample N] [--args N] [--mechanism auto|patch|jump]
//!                 [--no-aggregate] [--duration SECS] (-p PID | -- CMD ARGS)
//! hotprobe replay [DIR]
//! hotprobe report [DIR] [--phases] [--marker FUNC]...
//! hotprobe export [DIR] --format chrome|ctf|folded [-o OUT]
//! hotprobe guest  --gdb HOST:PORT|unix:PATH --symbols FILE [--ram FILE] (count|trace) PROBE... [--duration SECS]
//! hotprobe guest  (count|trace|record [--boot]) PROBE... [--symbols FILE] -- qemu-system-x86_64 ARGS
//! hotprobe guest  count PROBE... [--symbols FILE] -- qemu-system-x86_64 ARGS -- qemu-system-x86_64 ARGS...  (one -- block per guest)
//! hotprobe guest  syscalls [--pid N | --comm NAME] [-o FILE] -- qemu-system-x86_64 ARGS
//! PROBE: [module:]function[+offset] | [module:]0xADDR | file.c:LINE, optionally %return
//! DIR: a trace directory, hotprobe.data by default
//! ```
//! Every error is one line on stderr, `hotprobe: error: <what and why>`,
//! with exit code 1 (2 for a usage error, pointing at the subcommand's
//! --help, and for other bad input: a malformed probe spec or condition,
//! `HOTPROBE_AGENT` naming no x86-64 ELF shared object); the target is left
//! as it was. Global options: `--no-pager`,
//! `--color auto|always|never`.

mod analyse;
mod caller_times;
mod cli;
mod coldpatch;
mod count;
mod demo;
mod guest;
mod guest_syscalls;
mod kernel;
mod list;
mod option_rules;
mod out;
mod pager;
mod record;
mod report_text;
mod session;
mod signals;
mod stacks;
mod trace;
mod usage;
mod watch;

use clap::Parser;
use cli::{Cli, Cmd, GuestCmd, MechanismArg, RecordMechanism};
use hotprobe::cond;
use out::errln;
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

impl From<MechanismArg> for hotprobe::MechanismChoice {
    fn from(m: MechanismArg) -> Self {
        match m {
            MechanismArg::Auto => Self::Auto,
            MechanismArg::Patch => Self::Patch,
            MechanismArg::Jump => Self::Jump,
            MechanismArg::Trap => Self::Trap,
        }
    }
}

impl From<RecordMechanism> for hotprobe::MechanismChoice {
    fn from(m: RecordMechanism) -> Self {
        match m {
            RecordMechanism::Auto => Self::Auto,
            RecordMechanism::Patch => Self::Patch,
            RecordMechanism::Jump => Self::Jump,
        }
    }
}

/// A command line that parsed but does not make sense (exit code 2; the
/// message points at the subcommand's --help).
#[derive(Debug)]
struct UsageError(String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UsageError {}

fn duration(secs: Option<f64>) -> anyhow::Result<Option<Duration>> {
    match secs {
        None => Ok(None),
        Some(s) if s.is_finite() && s > 0.0 && s < 1e9 => Ok(Some(Duration::from_secs_f64(s))),
        Some(s) => {
            Err(UsageError(format!("--duration {s}: give a positive number of seconds")).into())
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<u8> {
    match cli.command {
        Cmd::List {
            args,
            pid,
            blacklist,
            summary,
            usdt,
        } => {
            let (binary, pattern) = match (pid, args.as_slice()) {
                (Some(_), []) => (None, None),
                (Some(_), [p]) => (None, Some(p.as_str())),
                (None, [b]) => (Some(PathBuf::from(b)), None),
                (None, [b, p]) => (Some(PathBuf::from(b)), Some(p.as_str())),
                (Some(_), _) => {
                    return Err(
                        UsageError("with -p PID give at most a PATTERN, no BINARY".into()).into(),
                    )
                }
                (None, _) => return Err(UsageError("give a BINARY or -p PID".into()).into()),
            };
            let binary = binary.as_deref().map(list::check_binary).transpose()?;
            list::run(&list::ListOptions {
                binary: binary.as_deref(),
                pid,
                pattern,
                blacklist,
                summary,
                usdt,
            })
            .map(|()| 0)
        }
        Cmd::Count {
            probes,
            pid,
            later,
            duration: secs,
            maxactive,
            mechanism,
            no_traps,
            follow_forks,
            no_follow_exec,
            hist,
            lhist,
            by,
            top,
            json,
            all,
            force,
            stacks,
            cmd,
        } => {
            let duration = duration(secs)?;
            signals::install()?;
            let agg = count::agg_spec(hist.as_ref(), lhist.as_deref(), by.as_deref())?;
            count::run(&count::CountOptions {
                hist: matches!(hist, Some(None)),
                agg,
                top,
                stacks,
                json,
                all,
                force,
                follow_forks,
                follow_exec: follow_forks && !no_follow_exec,
                new_processes: new_processes(later)?,
                probes: &probes,
                pid,
                cmd: &cmd,
                duration,
                maxactive: maxactive.max(1),
                mechanism: mechanism.into(),
                no_traps,
            })
        }
        Cmd::Coldpatch { input, output } => coldpatch::run(&input, &output).map(|()| 0),
        Cmd::Watch {
            watches,
            read,
            exec,
            pid,
            duration: secs,
            cmd,
        } => {
            let duration = duration(secs)?;
            signals::install()?;
            watch::run(&watch::WatchOptions {
                watches: &watches,
                read,
                exec,
                pid,
                cmd: &cmd,
                duration,
            })
        }
        Cmd::Trace {
            probes,
            pid,
            later,
            args,
            auto_args,
            maxactive,
            duration: secs,
            summary,
            stacks,
            mechanism,
            no_traps,
            follow_forks,
            no_follow_exec,
            force,
            cmd,
        } => {
            let duration = duration(secs)?;
            signals::install()?;
            trace::run(&trace::TraceOptions {
                stacks,
                follow_forks,
                follow_exec: follow_forks && !no_follow_exec,
                new_processes: new_processes(later)?,
                force,
                probes: &probes,
                pid,
                cmd: &cmd,
                args,
                auto_args,
                maxactive: maxactive.max(1),
                duration,
                summary,
                mechanism: mechanism.into(),
                no_traps,
            })
        }
        Cmd::Record {
            output,
            force,
            mut patterns,
            filter,
            exclude,
            phase,
            max_depth,
            min_duration,
            sample,
            args,
            auto_args,
            mechanism,
            follow_forks,
            no_follow_exec,
            kernel,
            no_aggregate,
            no_traps,
            ring_events,
            max_threads,
            stacks,
            duration: secs,
            pid,
            later,
            cmd,
        } => {
            let duration = duration(secs)?;
            if !ring_events.is_power_of_two() || !(64..=1 << 26).contains(&ring_events) {
                return Err(UsageError(format!(
                    "--ring-events {ring_events}: give a power of two between 64 and 2^26"
                ))
                .into());
            }
            patterns.extend(filter);
            signals::install()?;
            record::run(&record::RecordOptions {
                follow_forks,
                follow_exec: follow_forks && !no_follow_exec,
                new_processes: new_processes(later)?,
                kernel,
                out: &output,
                force,
                include: &patterns,
                exclude: &exclude,
                phases: &phase,
                max_depth,
                min_duration_ns: min_duration,
                sample,
                args,
                auto_args,
                mechanism: mechanism.into(),
                traps: !no_traps,
                aggregate: !no_aggregate,
                ring_events,
                max_threads,
                stacks,
                duration,
                pid,
                cmd: &cmd,
            })
        }
        Cmd::Replay { dir, query, fields } => {
            analyse::replay_cmd(&dir, &query, &fields).map(|()| 0)
        }
        Cmd::Report {
            dir,
            phases,
            marker,
            opts,
        } => analyse::report_cmd(&dir, phases, &marker, &opts).map(|()| 0),
        Cmd::Info { dir, json } => analyse::info_cmd(&dir, json).map(|()| 0),
        Cmd::Export {
            dir,
            format,
            output,
            calls,
            per_thread,
            endpoint,
            query,
        } => analyse::export_cmd(&analyse::ExportOptions {
            dir: &dir,
            format,
            out: output.as_deref(),
            calls,
            per_thread,
            endpoint: endpoint.as_deref(),
            query: &query,
        })
        .map(|()| 0),
        Cmd::Demo => {
            signals::install()?;
            demo::run()
        }
        Cmd::Guest {
            gdb,
            symbols,
            ram,
            action,
        } => {
            if let GuestCmd::Syscalls {
                pid,
                comm,
                output,
                duration: secs,
                sync,
                symbols: sub_symbols,
                qemu,
            } = &action
            {
                if !gdb.is_empty() || !ram.is_empty() {
                    return Err(UsageError(
                        "guest syscalls starts the guest itself: no --gdb/--ram".into(),
                    )
                    .into());
                }
                let symbols = sub_symbols.clone().or_else(|| symbols.first().cloned());
                let duration = duration(*secs)?;
                signals::install()?;
                return guest_syscalls::run_syscalls(&guest_syscalls::SyscallsOptions {
                    qemu,
                    symbols,
                    pid: *pid,
                    comm: comm.clone(),
                    duration,
                    sync: *sync,
                    output: output.clone(),
                });
            }
            if let Some(launched) = launched_guest(&gdb, &symbols, &ram, &action)? {
                return launched;
            }
            if gdb.is_empty() {
                return Err(UsageError(
                    "give a QEMU command line after -- (hotprobe starts the guest with its \
                     plugin), or --gdb HOST:PORT|unix:PATH --symbols FILE for a running guest"
                        .into(),
                )
                .into());
            }
            if symbols.len() != gdb.len() {
                return Err(UsageError(format!(
                    "give one --symbols per --gdb ({} --gdb, {} --symbols)",
                    gdb.len(),
                    symbols.len()
                ))
                .into());
            }
            if !ram.is_empty() && ram.len() != gdb.len() {
                return Err(UsageError(format!(
                    "give no --ram, or one per --gdb ({} --gdb, {} --ram)",
                    gdb.len(),
                    ram.len()
                ))
                .into());
            }
            for g in &gdb {
                guest::stub_addr(g).map_err(|e| UsageError(e.to_string()))?;
            }
            let guests = gdb
                .into_iter()
                .zip(symbols)
                .enumerate()
                .map(|(i, (gdb, symbols))| guest::GuestSpec {
                    gdb,
                    symbols,
                    ram: ram.get(i).cloned(),
                })
                .collect();
            let (probes, secs, action) = match action {
                GuestCmd::Count {
                    probes,
                    duration,
                    maxactive,
                    ..
                } => (
                    probes,
                    duration,
                    guest::Action::Count {
                        maxactive: maxactive.max(1),
                    },
                ),
                GuestCmd::Trace {
                    probes,
                    args,
                    maxactive,
                    duration,
                    summary,
                    ..
                } => (
                    probes,
                    duration,
                    guest::Action::Trace {
                        args,
                        maxactive: maxactive.max(1),
                        summary,
                    },
                ),
                GuestCmd::Record { .. } | GuestCmd::Syscalls { .. } => {
                    unreachable!("record and syscalls need a QEMU command line")
                }
            };
            let duration = duration(secs)?;
            signals::install()?;
            guest::run(&guest::GuestOptions {
                guests,
                probes: &probes,
                duration,
                action,
            })
            .map(|()| 0)
        }
    }
}

/// `hotprobe guest (count|trace|record) ... -- QEMU ARGS`: the guest is
/// started with hotprobe's plugin. `None` for the `--gdb` form.
fn launched_guest(
    gdb: &[String],
    symbols: &[PathBuf],
    ram: &[PathBuf],
    action: &GuestCmd,
) -> anyhow::Result<Option<anyhow::Result<u8>>> {
    let (qemu, probes, sub_symbols, secs, maxactive, sync, what) = match action {
        GuestCmd::Syscalls { .. } => return Ok(None),
        GuestCmd::Count {
            qemu,
            probes,
            symbols,
            duration,
            maxactive,
        } => (
            qemu,
            probes,
            symbols,
            *duration,
            *maxactive,
            false,
            guest::LaunchedAction::Count,
        ),
        GuestCmd::Trace {
            qemu,
            probes,
            symbols,
            duration,
            maxactive,
            args,
            summary,
            sync,
        } => (
            qemu,
            probes,
            symbols,
            *duration,
            *maxactive,
            *sync,
            guest::LaunchedAction::Trace {
                args: *args,
                summary: *summary,
            },
        ),
        GuestCmd::Record {
            qemu,
            probes,
            symbols,
            duration,
            maxactive,
            args,
            sync,
            output,
            force,
            boot,
        } => (
            qemu,
            probes,
            symbols,
            *duration,
            *maxactive,
            *sync,
            guest::LaunchedAction::Record {
                out: output,
                force: *force,
                args: *args,
                boot: *boot,
            },
        ),
    };
    if qemu.is_empty() {
        return Ok(None);
    }
    if !gdb.is_empty() || !ram.is_empty() {
        return Err(UsageError(
            "--gdb/--ram name a running guest; with a QEMU command line hotprobe starts the \
             guest (and its own stub)"
                .into(),
        )
        .into());
    }
    if symbols.len() > 1 {
        return Err(UsageError("one --symbols for a started guest".into()).into());
    }
    // One guest per `--` block (a bare `--` is never a QEMU argument).
    let qemus: Vec<Vec<std::ffi::OsString>> = qemu
        .split(|a| a == "--")
        .map(<[std::ffi::OsString]>::to_vec)
        .collect();
    if qemus.iter().any(Vec::is_empty) {
        return Err(UsageError("an empty QEMU command line: give one after each --".into()).into());
    }
    if qemus.len() > 1 && matches!(what, guest::LaunchedAction::Record { .. }) {
        return Err(UsageError(
            "several guests (one -- block each) are for guest count and trace only".into(),
        )
        .into());
    }
    // Without --symbols, the kernel's own kallsyms tables in the image
    // each QEMU boots (`-kernel IMG`) name its functions.
    let symbols = sub_symbols.clone().or_else(|| symbols.first().cloned());
    let duration = duration(secs)?;
    signals::install()?;
    Ok(Some(guest::run_launched(&guest::LaunchedOptions {
        qemus: &qemus,
        symbols,
        probes,
        duration,
        maxactive: maxactive.max(1),
        sync,
        action: what,
    })))
}

/// The error and its causes, joined with `: `, leaving out a cause whose
/// text the message already holds (errors that print their source inline).
fn message(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

/// Whether `e` comes from bad input (exit code 2, as a usage error): a
/// malformed probe spec, or `HOTPROBE_AGENT` naming no usable agent.
fn bad_input(e: &anyhow::Error) -> bool {
    use hotprobe::fastpath::FastPathError;
    use hotprobe::symbols::SymbolError;
    e.chain().any(|c| {
        // A permission `record --kernel` lacks (said in the message).
        matches!(c.downcast_ref::<hotprobe::kernel::KernelError>(), Some(k) if k.is_permission())
            || matches!(c.downcast_ref(), Some(SymbolError::BadSpec { .. }))
            || matches!(c.downcast_ref(), Some(FastPathError::AgentOverride { .. }))
            || matches!(
                c.downcast_ref(),
                Some(hotprobe::EngineError::Symbol(SymbolError::BadSpec { .. }))
                    | Some(hotprobe::EngineError::FastPath(
                        FastPathError::AgentOverride { .. }
                    ))
            )
    })
}

/// One line, whatever the message holds.
fn one_line(s: &str) -> String {
    s.trim()
        .lines()
        .map(str::trim)
        .collect::<Vec<_>>()
        .join("; ")
}

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(e) => return usage::parse_error(e, &args),
    };
    out::init_colors(cli.color);
    let paged = !cli.no_pager
        && matches!(
            cli.command,
            Cmd::List { .. } | Cmd::Replay { .. } | Cmd::Report { .. } | Cmd::Info { .. }
        );
    let pager = if paged { pager::start() } else { None };
    let result = run(cli);
    // A reader that went away is no failure (see `out`); tell before the
    // pager's end makes stdout /dev/null.
    let quiet = matches!(&result, Err(e) if out::is_closed_stdout(e));
    if let Some(p) = pager {
        p.finish();
    }
    let result = match (result, out::write_error()) {
        (Ok(_), Some(e)) => Err(anyhow::Error::new(e).context("cannot write the output")),
        (r, _) => r,
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(_) if quiet => ExitCode::SUCCESS,
        Err(e) => {
            let usage = e.downcast_ref::<UsageError>().is_some();
            let see = if usage {
                format!(" (see {} --help)", usage::subcommand_path(&args).join(" "))
            } else {
                String::new()
            };
            errln!("{} {}{see}", out::error_prefix(), one_line(&message(&e)));
            ExitCode::from(if usage || bad_input(&e) { 2 } else { 1 })
        }
    }
}

/// `--exe PATH` / `--comm NAME`: which processes to take.
fn new_processes(later: cli::NewProcessArgs) -> anyhow::Result<Option<hotprobe::ProcessMatch>> {
    match (later.exe, later.comm) {
        (Some(p), None) => {
            let p = std::fs::canonicalize(&p)
                .map_err(|e| UsageError(format!("--exe {}: {e}", p.display())))?;
            Ok(Some(hotprobe::ProcessMatch::Exe(p)))
        }
        (None, Some(c)) if c.is_empty() || c.len() > 15 => Err(UsageError(format!(
            "--comm {c}: a command name has 1 to 15 bytes (the kernel's comm)"
        ))
        .into()),
        (None, Some(c)) => Ok(Some(hotprobe::ProcessMatch::Comm(c))),
        _ => Ok(None),
    }
}
