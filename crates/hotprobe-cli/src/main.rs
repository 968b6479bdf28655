//! `hotprobe`: dynamic probes on running Linux processes, from the shell.
//!
//! ```text
//! hotprobe list   (BINARY | -p PID) [PATTERN] [--blacklist]
//! hotprobe count  PROBE... (-p PID | -- CMD ARGS) [--duration SECS] [--mechanism auto|patch|jump|trap]
//! hotprobe coldpatch IN -o OUT
//! hotprobe trace  PROBE... (-p PID | -- CMD ARGS) [--args N] [--maxactive N]
//! hotprobe demo
//! hotprobe record -o DIR [PATTERN]... [--exclude GLOB]... [--phase FUNC]... [--max-depth N]
//!                 [--min-duration DUR] [--sample N] [--args N] [--mechanism auto|patch|jump]
//!                 [--no-aggregate] [--duration SECS] (-p PID | -- CMD ARGS)
//! hotprobe replay DIR
//! hotprobe report DIR [--phases] [--marker FUNC]...
//! hotprobe export DIR --format chrome|ctf|folded [-o OUT]
//! hotprobe guest  --gdb HOST:PORT|unix:PATH --symbols FILE [--ram FILE] (count|trace) PROBE... [--duration SECS]
//! hotprobe guest  (count|trace|record) PROBE... --symbols FILE [--sync] -- qemu-system-x86_64 ARGS...
//! PROBE: [module:]function[+offset] | [module:]0xADDR | file.c:LINE, optionally %return
//! ```
//! Every error is one line on stderr, `hotprobe: error: <what and why>`,
//! with exit code 1 (2 for a usage error); the target is left as it was.

mod analyse;
mod coldpatch;
mod count;
mod demo;
mod guest;
mod list;
mod record;
mod session;
mod signals;
mod trace;

use clap::{ArgGroup, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Dynamic probes (Kprobes-style trap probes) on Linux processes.
#[derive(Parser, Debug)]
#[command(name = "hotprobe", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// List the functions of a binary or a process (name, address, size,
    /// module, and the mechanism a probe on its entry gets), or its blacklist.
    List {
        /// `BINARY [PATTERN]`, or with -p only `[PATTERN]`: an ELF
        /// executable or shared library, and a glob (`*`, `?`) over
        /// function names.
        #[arg(value_name = "BINARY|PATTERN", num_args = 0..=2)]
        args: Vec<String>,
        /// A running process (all its modules).
        #[arg(short, long, value_name = "PID")]
        pid: Option<i32>,
        /// List the address ranges where probes are refused instead.
        #[arg(long)]
        blacklist: bool,
    },
    /// Count hits of probes (fast path where a function entry allows it,
    /// else trap; see --mechanism); print a table when the target exits,
    /// on Ctrl-C, or after --duration.
    #[command(group(ArgGroup::new("target").required(true).args(["pid", "cmd"])))]
    Count {
        /// Probe specs: [module:]function[+off] | [module:]0xADDR | file.c:LINE,
        /// with %return to count returns; `*` in a function name expands.
        #[arg(required = true, value_name = "PROBE")]
        probes: Vec<String>,
        /// Attach to this running process.
        #[arg(short, long, value_name = "PID")]
        pid: Option<i32>,
        /// Stop (and detach) after this many seconds.
        #[arg(long, value_name = "SECS")]
        duration: Option<f64>,
        /// Live calls followed at once per %return probe (more count as nmissed).
        #[arg(long, default_value_t = 64, value_name = "N")]
        maxactive: usize,
        /// How function entries are probed: auto (patch, then jump, else
        /// trap), or force one.
        #[arg(long, value_enum, default_value_t = MechanismArg::Auto)]
        mechanism: MechanismArg,
        /// Follow forked children (counts per process, their events in the trace);
        /// by default they run without probes.
        #[arg(short = 'f', long)]
        follow_forks: bool,
        /// The command to start (after `--`).
        #[arg(last = true, value_name = "CMD")]
        cmd: Vec<OsString>,
    },
    /// ColdPatch: rewrite the -finstrument-functions (or -pg) calls of a
    /// binary into NOPs; writes OUT and its probe list OUT.probes.
    Coldpatch {
        /// The instrumented binary.
        #[arg(value_name = "IN")]
        input: PathBuf,
        /// The binary to write.
        #[arg(short, long, value_name = "OUT")]
        output: PathBuf,
    },
    /// Show a live call tree of the given functions (like `uftrace replay`).
    #[command(group(ArgGroup::new("target").required(true).args(["pid", "cmd"])))]
    Trace {
        /// Function specs: [module:]function | [module:]0xADDR; `*` expands.
        #[arg(required = true, value_name = "PROBE")]
        probes: Vec<String>,
        /// Attach to this running process.
        #[arg(short, long, value_name = "PID")]
        pid: Option<i32>,
        /// Show the first N argument registers (0-6) and the return value.
        #[arg(long, value_name = "N")]
        args: Option<usize>,
        /// Live calls followed at once per function (more count as nmissed).
        #[arg(long, default_value_t = 64, value_name = "N")]
        maxactive: usize,
        /// Stop (and detach) after this many seconds.
        #[arg(long, value_name = "SECS")]
        duration: Option<f64>,
        /// Print the per-function count table at the end.
        #[arg(long)]
        summary: bool,
        /// How probes run: auto picks patch, then jump, then trap per
        /// function; the others force one.
        #[arg(long, value_enum, default_value_t = MechanismArg::Auto)]
        mechanism: MechanismArg,
        /// Follow forked children (counts per process, their events in the trace);
        /// by default they run without probes.
        #[arg(short = 'f', long)]
        follow_forks: bool,
        /// The command to start (after `--`).
        #[arg(last = true, value_name = "CMD")]
        cmd: Vec<OsString>,
    },
    /// Record a function trace of a command into a trace directory.
    ///
    /// The fast path: the agent logs entries and exits into per-thread
    /// rings, drained while the target runs. Patterns and --exclude act at
    /// the source (functions left out are not probed and cost nothing);
    /// --max-depth, --min-duration and --sample run in the recorder on the
    /// drained events, before anything is written (the target still pays
    /// for those events). Prints a summary: events, bytes, bytes/event,
    /// drops, and what each filter removed.
    #[command(group(ArgGroup::new("target").required(true).args(["pid", "cmd"])))]
    Record {
        /// The trace directory to write (created; earlier streams in it are
        /// removed).
        #[arg(short, long, value_name = "DIR")]
        output: PathBuf,
        /// Probe only the functions of the main executable matching these
        /// globs (`*`, `?`); default: every function of the main
        /// executable except the C runtime's start-up code.
        #[arg(value_name = "PATTERN")]
        patterns: Vec<String>,
        /// Same as a PATTERN (repeatable).
        #[arg(short = 'F', long = "filter", value_name = "GLOB")]
        filter: Vec<String>,
        /// Do not probe functions matching this glob (repeatable).
        #[arg(short = 'N', long, value_name = "GLOB")]
        exclude: Vec<String>,
        /// Probe FUNC as a phase marker: each of its calls starts a phase
        /// (`report --phases`); repeatable. Markers are never removed by
        /// depth, duration or sampling.
        #[arg(long, value_name = "FUNC")]
        phase: Vec<String>,
        /// Keep calls nested at most N deep (outermost recorded = 1); in the
        /// recorder.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        max_depth: Option<u32>,
        /// Keep only calls lasting at least DUR (e.g. 10ms, 2.5us, 500ns);
        /// in the recorder.
        #[arg(long, value_name = "DUR", value_parser = record::parse_duration)]
        min_duration: Option<u64>,
        /// Keep one call in N per function and thread; in the recorder.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        sample: Option<u32>,
        /// Keep the first N argument registers (0-6) of each entry, and the
        /// return values when N > 0.
        #[arg(long, value_name = "N", default_value_t = 0,
              value_parser = clap::value_parser!(u8).range(0..=6))]
        args: u8,
        /// How function entries are probed: auto (patch, else jump), or
        /// force one. Functions neither fits are not recorded (listed in
        /// the summary).
        #[arg(long, value_enum, default_value_t = RecordMechanism::Auto)]
        mechanism: RecordMechanism,
        /// Follow forked children (counts per process, their events in the trace);
        /// by default they run without probes.
        #[arg(short = 'f', long)]
        follow_forks: bool,
        /// Write every entry and exit as its own record (to measure what
        /// merging an entry and its exit into one call record saves).
        #[arg(long)]
        no_aggregate: bool,
        /// Events per thread ring (a power of two); a full ring drops events
        /// (reported, and marked in the trace). Shared memory per thread
        /// that records: N × 32 bytes (--args 0–2; 32 MiB at the default
        /// 2^20), N × 64 with more arguments.
        #[arg(long, value_name = "N", default_value_t = 1 << 20)]
        ring_events: u32,
        /// Threads that get a ring (events of later threads are dropped,
        /// and counted).
        #[arg(long, value_name = "N", default_value_t = 64,
              value_parser = clap::value_parser!(u32).range(1..=4096))]
        max_threads: u32,
        /// Stop after recording this many seconds (counted from when the
        /// probes are in): the probes are removed and the target runs on
        /// untraced.
        #[arg(long, value_name = "SECS")]
        duration: Option<f64>,
        /// Attach to this running process (the agent is loaded into it;
        /// calls already running when recording starts show only their
        /// exits, counted as orphan exits). Ctrl-C or --duration detach.
        #[arg(short, long, value_name = "PID")]
        pid: Option<i32>,
        /// The command to start (after `--`).
        #[arg(last = true, value_name = "CMD")]
        cmd: Vec<OsString>,
    },
    /// Print the call tree of a recorded trace (like `uftrace replay`).
    Replay {
        /// A trace directory written by `hotprobe record`.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
    },
    /// Per-function calls, total and self time of a recorded trace.
    Report {
        /// A trace directory written by `hotprobe record`.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
        /// One table per phase (phases start at each call of a marker:
        /// `record --phase`, or --marker).
        #[arg(long)]
        phases: bool,
        /// Also split phases at calls of this function (repeatable; implies
        /// --phases).
        #[arg(long, value_name = "FUNC")]
        marker: Vec<String>,
    },
    /// Convert a recorded trace: Chrome Trace Event JSON, CTF 1.8 or folded
    /// stacks.
    Export {
        /// A trace directory written by `hotprobe record`.
        #[arg(value_name = "DIR")]
        dir: PathBuf,
        /// The output format.
        #[arg(long, value_enum)]
        format: analyse::ExportFormat,
        /// Output file (chrome, folded; default stdout) or directory (ctf;
        /// default DIR/ctf).
        #[arg(short, long, value_name = "OUT")]
        output: Option<PathBuf>,
        /// Folded: count calls instead of self time in ns.
        #[arg(long)]
        calls: bool,
        /// Folded: start each stack with its thread (`tid-N`).
        #[arg(long)]
        per_thread: bool,
    },
    /// Build the bundled demo program (tests/programs/demo.c) and trace it.
    Demo,
    /// Count, trace or record probes on VM guest kernels: a guest hotprobe
    /// starts with its QEMU plugin (`guest count PROBE... --symbols FILE --
    /// qemu-system-x86_64 ARGS`), or running guests through their GDB stubs
    /// (QEMU -gdb; repeat --gdb/--symbols (and --ram) for more guests).
    Guest {
        /// A guest's GDB stub: HOST:PORT or unix:PATH.
        #[arg(long, value_name = "HOST:PORT|unix:PATH")]
        gdb: Vec<String>,
        /// The guest kernel's symbols: /proc/kallsyms, System.map or vmlinux
        /// (one per --gdb, in the same order).
        #[arg(long, value_name = "FILE")]
        symbols: Vec<PathBuf>,
        /// QEMU's shared memory-backend-file of the guest's RAM, to read
        /// guest memory directly (none, or one per --gdb in the same order).
        #[arg(long, value_name = "FILE")]
        ram: Vec<PathBuf>,
        #[command(subcommand)]
        action: GuestCmd,
    },
}

/// What `hotprobe guest` does.
#[derive(Subcommand, Debug)]
enum GuestCmd {
    /// Count hits of the probes; print a table on Ctrl-C, after --duration,
    /// or when every guest is gone.
    Count {
        /// Probe specs: [module:]function[+off] | 0xADDR, with %return to
        /// count returns.
        #[arg(required = true, value_name = "PROBE")]
        probes: Vec<String>,
        /// Stop (and detach) after this many seconds.
        #[arg(long, value_name = "SECS")]
        duration: Option<f64>,
        /// Live calls followed at once per %return probe.
        #[arg(long, default_value_t = 64, value_name = "N")]
        maxactive: usize,
        /// The guest kernel's symbols (with a QEMU command line).
        #[arg(long, value_name = "FILE")]
        symbols: Option<PathBuf>,
        /// A QEMU command line to start with hotprobe's plugin.
        #[arg(last = true, value_name = "QEMU")]
        qemu: Vec<OsString>,
    },
    /// Show a live call tree of the given kernel functions.
    Trace {
        /// Function specs: [module:]function | 0xADDR.
        #[arg(required = true, value_name = "PROBE")]
        probes: Vec<String>,
        /// Show the first N argument registers (0-6) and the return value.
        #[arg(long, value_name = "N")]
        args: Option<usize>,
        /// Live calls followed at once per function.
        #[arg(long, default_value_t = 64, value_name = "N")]
        maxactive: usize,
        /// Stop (and detach) after this many seconds.
        #[arg(long, value_name = "SECS")]
        duration: Option<f64>,
        /// Print the per-function count table at the end.
        #[arg(long)]
        summary: bool,
        /// Synchronous delivery (a started guest): each vCPU waits until
        /// hotprobe has its event (nothing is dropped).
        #[arg(long)]
        sync: bool,
        /// The guest kernel's symbols (with a QEMU command line).
        #[arg(long, value_name = "FILE")]
        symbols: Option<PathBuf>,
        /// A QEMU command line to start with hotprobe's plugin.
        #[arg(last = true, value_name = "QEMU")]
        qemu: Vec<OsString>,
    },
    /// Record a trace of the given kernel functions (entries with their
    /// arguments, returns) from a guest hotprobe starts with its plugin.
    Record {
        /// Function specs: [module:]function | 0xADDR.
        #[arg(required = true, value_name = "PROBE")]
        probes: Vec<String>,
        /// The trace directory.
        #[arg(short = 'o', long, value_name = "DIR")]
        output: PathBuf,
        /// Argument registers recorded (0-6).
        #[arg(long, default_value_t = 2, value_name = "N")]
        args: usize,
        /// Live calls followed at once per function.
        #[arg(long, default_value_t = 64, value_name = "N")]
        maxactive: usize,
        /// Stop after this many seconds.
        #[arg(long, value_name = "SECS")]
        duration: Option<f64>,
        /// Synchronous delivery: each vCPU waits until hotprobe has its event.
        #[arg(long)]
        sync: bool,
        /// The guest kernel's symbols.
        #[arg(long, value_name = "FILE")]
        symbols: Option<PathBuf>,
        /// The QEMU command line to start with hotprobe's plugin.
        #[arg(last = true, required = true, value_name = "QEMU")]
        qemu: Vec<OsString>,
    },
}

/// `--mechanism` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum MechanismArg {
    Auto,
    Patch,
    Jump,
    Trap,
}

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

/// `record --mechanism` values (the fast path's; no trap recording).
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum RecordMechanism {
    Auto,
    Patch,
    Jump,
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

/// A command line that parsed but does not make sense (exit code 2).
#[derive(Debug)]
struct UsageError(String);

impl std::fmt::Display for UsageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (see hotprobe --help)", self.0)
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
            })
            .map(|()| 0)
        }
        Cmd::Count {
            probes,
            pid,
            duration: secs,
            maxactive,
            mechanism,
            follow_forks,
            cmd,
        } => {
            let duration = duration(secs)?;
            signals::install()?;
            count::run(&count::CountOptions {
                follow_forks,
                probes: &probes,
                pid,
                cmd: &cmd,
                duration,
                maxactive: maxactive.max(1),
                mechanism: mechanism.into(),
            })
        }
        Cmd::Coldpatch { input, output } => coldpatch::run(&input, &output).map(|()| 0),
        Cmd::Trace {
            probes,
            pid,
            args,
            maxactive,
            duration: secs,
            summary,
            mechanism,
            follow_forks,
            cmd,
        } => {
            let duration = duration(secs)?;
            signals::install()?;
            trace::run(&trace::TraceOptions {
                follow_forks,
                probes: &probes,
                pid,
                cmd: &cmd,
                args,
                maxactive: maxactive.max(1),
                duration,
                summary,
                mechanism: mechanism.into(),
            })
        }
        Cmd::Record {
            output,
            mut patterns,
            filter,
            exclude,
            phase,
            max_depth,
            min_duration,
            sample,
            args,
            mechanism,
            follow_forks,
            no_aggregate,
            ring_events,
            max_threads,
            duration: secs,
            pid,
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
                out: &output,
                include: &patterns,
                exclude: &exclude,
                phases: &phase,
                max_depth,
                min_duration_ns: min_duration,
                sample,
                args,
                mechanism: mechanism.into(),
                aggregate: !no_aggregate,
                ring_events,
                max_threads,
                duration,
                pid,
                cmd: &cmd,
            })
        }
        Cmd::Replay { dir } => analyse::replay_cmd(&dir).map(|()| 0),
        Cmd::Report {
            dir,
            phases,
            marker,
        } => analyse::report_cmd(&dir, phases, &marker).map(|()| 0),
        Cmd::Export {
            dir,
            format,
            output,
            calls,
            per_thread,
        } => analyse::export_cmd(&analyse::ExportOptions {
            dir: &dir,
            format,
            out: output.as_deref(),
            calls,
            per_thread,
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
                GuestCmd::Record { .. } => unreachable!("record needs a QEMU command line"),
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
        } => (
            qemu,
            probes,
            symbols,
            *duration,
            *maxactive,
            *sync,
            guest::LaunchedAction::Record {
                out: output,
                args: *args,
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
    let symbols = sub_symbols.clone().or_else(|| symbols.first().cloned());
    let duration = duration(secs)?;
    signals::install()?;
    Ok(Some(guest::run_launched(&guest::LaunchedOptions {
        qemu,
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

/// One line, whatever the message holds.
fn one_line(s: &str) -> String {
    s.trim()
        .lines()
        .map(str::trim)
        .collect::<Vec<_>>()
        .join("; ")
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return ExitCode::from(2);
            }
            // clap says `error: <what>`, maybe continued on indented
            // lines, then a usage block: keep what it says, on one line.
            let rendered = e.to_string();
            let what: Vec<&str> = rendered
                .lines()
                .take_while(|l| !l.starts_with("Usage:") && !l.starts_with("For more"))
                .map(|l| l.trim().trim_start_matches("error: "))
                .filter(|l| !l.is_empty() && !l.starts_with("tip:"))
                .collect();
            eprintln!("hotprobe: error: {} (see hotprobe --help)", what.join(" "));
            return ExitCode::from(2);
        }
    };
    match run(cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("hotprobe: error: {}", one_line(&message(&e)));
            if e.downcast_ref::<UsageError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}
