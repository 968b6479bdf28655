//! The command line of `hotprobe` (clap derive), in a module of its own so
//! that the build script (`build.rs`, through `#[path]`) can render the
//! man pages and shell completions from the same definition. Only `clap`
//! and `std` here: nothing of the binary's other modules.

use clap::{ArgGroup, Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;

/// The trace directory `record` writes and `replay`, `report` and
/// `export` read when none is given (as uftrace's `uftrace.data`).
pub const DEFAULT_DIR: &str = "hotprobe.data";

/// Dynamic probes (Kprobes-style trap probes) on Linux processes.
#[derive(Parser, Debug)]
#[command(name = "hotprobe", version, about, propagate_version = true)]
pub struct Cli {
    /// Do not pipe the output of list, replay and report through $PAGER
    /// (default `less -FRX`; only when stdout is a terminal).
    #[arg(long, global = true)]
    pub no_pager: bool,
    /// Colours: auto (on a terminal, unless NO_COLOR is set), always or
    /// never.
    #[arg(long, global = true, value_enum, value_name = "WHEN",
          default_value_t = ColorWhen::Auto)]
    pub color: ColorWhen,
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
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
        /// Only the number of functions per mechanism (patch, jump,
        /// in-process trap, trap) and, for the traps, per reason (BINARY only).
        #[arg(long, conflicts_with_all = ["pid", "blacklist"])]
        summary: bool,
        /// List the USDT markers (`.note.stapsdt`) instead: the spec that
        /// probes each (`usdt:PROVIDER:NAME`), its address, semaphore and
        /// arguments; PATTERN matches `PROVIDER:NAME`.
        #[arg(long, conflicts_with_all = ["blacklist", "summary"])]
        usdt: bool,
    },
    /// Count hits of probes (fast path where a function entry allows it,
    /// else trap; see --mechanism); print a table when the target exits,
    /// on Ctrl-C, or after --duration.
    #[command(group(ArgGroup::new("target").required(true).args(["pid", "cmd", "exe", "comm"])))]
    Count {
        /// Probe specs: [module:]function[+off] | [module:]0xADDR | file.c:LINE
        /// | usdt:[MODULE:]PROVIDER:NAME (a USDT/SDT marker of the program
        /// or a library; `list --usdt` lists them), with %return to count
        /// returns (functions only); `*` in a function name expands.
        ///
        /// `'SPEC if CONDITION'` counts only the hits whose arguments satisfy
        /// CONDITION: comparisons (== != < <= > >=) of two operands, joined
        /// with && and ||, negated with !, grouped with parentheses;
        /// compared as signed 64-bit integers. An operand is an integer
        /// (decimal, or 0x hex; a leading - for negative), arg0..arg5 (the
        /// argument registers rdi, rsi, rdx, rcx, r8, r9 at the function's
        /// entry), a parameter name of the function from its DWARF (-g;
        /// compared with its own size and signedness), or, on a usdt:
        /// probe, arg1..argN (the marker's operands, as `list --usdt` shows
        /// them). Examples: 'libc:malloc if arg0 >= 4096', 'greet if n > 2
        /// && n != 7', 'usdt:demo:tick if arg1 > 3'.
        #[arg(required = true, value_name = "PROBE")]
        probes: Vec<String>,
        /// Attach to this running process.
        #[arg(short, long, value_name = "PID")]
        pid: Option<i32>,
        #[command(flatten)]
        later: NewProcessArgs,
        /// Stop (and detach) after this many seconds.
        #[arg(long, value_name = "SECS")]
        duration: Option<f64>,
        /// Live calls followed at once per %return probe (more count as nmissed).
        #[arg(long, default_value_t = 64, value_name = "N")]
        maxactive: usize,
        /// How function entries are probed: auto (patch, then jump, else
        /// trap), or force one (with a pattern, the functions
        /// it cannot take are listed with the reason, the rest probed).
        #[arg(long, value_enum, default_value_t = MechanismArg::Auto)]
        mechanism: MechanismArg,
        /// Leave out every function that needs a trap (ptrace or
        /// in-process: neither patch nor jump can take it) instead of
        /// probing it through one; they are listed with the reason at the end.
        #[arg(long)]
        no_traps: bool,
        /// Follow forked children (counts per process, their events in the trace);
        /// by default they run without probes.
        #[arg(short = 'f', long)]
        follow_forks: bool,
        /// With -f: a process that executes another program is not probed
        /// in it (by default the probes are placed again in each program
        /// a followed process executes).
        #[arg(long, requires = "follow_forks")]
        no_follow_exec: bool,
        /// Alone: also a latency histogram of each function's calls (log2
        /// buckets; records entries and exits instead of counting).
        /// `--hist=VALUE`: a log2 histogram of VALUE at each call instead
        /// (arg0..arg5 or a parameter name), computed in the target on
        /// the fast path.
        #[arg(long, value_name = "VALUE", num_args = 0..=1, require_equals = true)]
        hist: Option<Option<String>>,
        /// A linear histogram of VALUE (arg0..arg5 or a parameter name):
        /// buckets of STEP from MIN to MAX, and one below and one above.
        #[arg(long, value_name = "VALUE:MIN:MAX:STEP", conflicts_with = "hist")]
        lhist: Option<String>,
        /// Count the calls per KEY: arg0..arg5, a parameter name, tid or comm.
        #[arg(long, value_name = "KEY", conflicts_with_all = ["hist", "lhist"])]
        by: Option<String>,
        /// With --by: only the N keys with the most calls.
        #[arg(long, value_name = "N", requires = "by")]
        top: Option<usize>,
        /// Print the table as JSON (one line; docs/JSON.md).
        #[arg(long)]
        json: bool,
        /// Also the rows of a pattern's functions that nothing hit (left
        /// out of the table by default, and counted under it; --json has
        /// every row).
        #[arg(long)]
        all: bool,
        /// Probe addresses not shown to start an instruction (no symbol or
        /// .eh_frame entry before them, as in a stripped binary): skips the
        /// instruction-boundary check only, never the blacklist.
        #[arg(long)]
        force: bool,
        /// Also count the user stacks at each function entry (callers,
        /// walked in the target with .eh_frame tables and frame pointers),
        /// printed symbolized, most frequent first.
        #[arg(long)]
        stacks: bool,
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
    /// Watch a variable: one line per write (or read, with --read) with
    /// the time, thread, instruction and old -> new value, through the
    /// CPU's debug registers (at most 4 per process); counts per thread at
    /// the end.
    #[command(group(ArgGroup::new("target").required(true).args(["pid", "cmd"])))]
    Watch {
        /// `SYMBOL[:LEN]` (a global variable, `[module:]name`) or
        /// `0xADDR[:LEN]`; LEN is 1, 2, 4 or 8 (default: the variable's
        /// size, or the address's alignment), the address aligned to it.
        #[arg(required = true, value_name = "ADDR|SYMBOL[:LEN]")]
        watches: Vec<String>,
        /// Reads too (the CPU watches reads and writes together).
        #[arg(long)]
        read: bool,
        /// Executions of the instruction at the address (a function or
        /// `function+off`, or `0xADDR`) instead: a line before each.
        #[arg(long, conflicts_with = "read")]
        exec: bool,
        /// Attach to this running process.
        #[arg(short, long, value_name = "PID")]
        pid: Option<i32>,
        /// Stop (and detach) after this many seconds.
        #[arg(long, value_name = "SECS")]
        duration: Option<f64>,
        /// The command to start (after `--`).
        #[arg(last = true, value_name = "CMD")]
        cmd: Vec<OsString>,
    },
    /// Show a live call tree of the given functions (like `uftrace replay`).
    #[command(group(ArgGroup::new("target").required(true).args(["pid", "cmd", "exe", "comm"])))]
    Trace {
        /// Function specs: [module:]function | [module:]0xADDR | usdt:PROVIDER:NAME; `*` expands.
        #[arg(required = true, value_name = "PROBE")]
        probes: Vec<String>,
        /// Attach to this running process.
        #[arg(short, long, value_name = "PID")]
        pid: Option<i32>,
        #[command(flatten)]
        later: NewProcessArgs,
        /// Show the first N argument registers (0-6) and the return value.
        #[arg(long, value_name = "N")]
        args: Option<usize>,
        /// Show every parameter and the return value, typed from DWARF
        /// (-g): integers, chars, bools, enums by name, floats and doubles
        /// (xmm registers), strings read at the hit, pointers. Typed
        /// functions stay on patch or jump: strings, fields and stack
        /// arguments are copied in the target, with no ptrace stop (no
        /// DWARF: raw registers). A PROBE may also name its arguments:
        /// `func(a, b)` or 'func name:string p->len'.
        #[arg(short = 'a', long)]
        auto_args: bool,
        /// Live calls followed at once per function (more count as nmissed).
        #[arg(long, default_value_t = 64, value_name = "N")]
        maxactive: usize,
        /// Stop (and detach) after this many seconds.
        #[arg(long, value_name = "SECS")]
        duration: Option<f64>,
        /// Print the per-function count table at the end.
        #[arg(long)]
        summary: bool,
        /// At the end, the user stacks at each function entry, counted
        /// (walked in the target, as `count --stacks`), most frequent first.
        #[arg(long)]
        stacks: bool,
        /// How probes run: auto picks patch, then jump, then trap per
        /// function; the others force one (with a pattern,
        /// the functions it cannot take are listed with the reason).
        #[arg(long, value_enum, default_value_t = MechanismArg::Auto)]
        mechanism: MechanismArg,
        /// Leave out every function that needs a trap (ptrace or
        /// in-process: neither patch nor jump can take it) instead of
        /// probing it through one; they are listed with the reason at the end.
        #[arg(long)]
        no_traps: bool,
        /// Follow forked children (counts per process, their events in the trace);
        /// by default they run without probes.
        #[arg(short = 'f', long)]
        follow_forks: bool,
        /// With -f: a process that executes another program is not probed
        /// in it (by default the probes are placed again in each program
        /// a followed process executes).
        #[arg(long, requires = "follow_forks")]
        no_follow_exec: bool,
        /// Probe addresses not shown to start an instruction (no symbol or
        /// .eh_frame entry before them, as in a stripped binary): skips the
        /// instruction-boundary check only, never the blacklist.
        #[arg(long)]
        force: bool,
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
    #[command(group(ArgGroup::new("target").required(true).args(["pid", "cmd", "exe", "comm"])))]
    Record {
        /// The trace directory to write (created). A directory holding a
        /// trace is replaced only with --force.
        #[arg(short, long, value_name = "DIR", default_value = DEFAULT_DIR)]
        output: PathBuf,
        /// Replace the trace in DIR: its whole content (streams, exports)
        /// is removed first. A directory that holds no trace (no
        /// info.json) is never replaced.
        #[arg(long)]
        force: bool,
        /// Probe only the functions matching these globs (`*`, `?`): a
        /// bare glob names functions of the main executable (a bare name
        /// not found there: of any loaded library), `MODULE:GLOB` those of
        /// a library (`'libz.so.1:*'`, `'libsqlite3.so.0:sqlite3_*'`);
        /// default: every function of the main executable except the C
        /// runtime's start-up code.
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
        #[arg(long, value_name = "DUR", value_parser = parse_duration)]
        min_duration: Option<u64>,
        /// Keep one call in N per function and thread; in the recorder.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        sample: Option<u32>,
        /// Keep the first N argument registers (0-6) of each entry, and the
        /// return values when N > 0.
        #[arg(long, value_name = "N", default_value_t = 0,
              value_parser = clap::value_parser!(u8).range(0..=6))]
        args: u8,
        /// Keep every parameter and the return value, typed from DWARF
        /// (-g; as `trace -a`): functions stay on the fast path, strings
        /// (up to 128 bytes), fields through pointers and stack arguments
        /// copied in the target at the hit, floats from xmm registers;
        /// DWARF expressions take the trap. `replay` prints them.
        /// Functions without DWARF keep their raw registers.
        #[arg(short = 'a', long)]
        auto_args: bool,
        /// How function entries are probed: auto (patch, else jump, else
        /// a trap), or force one.
        #[arg(long, value_enum, default_value_t = RecordMechanism::Auto)]
        mechanism: RecordMechanism,
        /// Leave out (and list) the functions that neither patch nor jump
        /// can take instead of recording them through a trap (a ptrace stop
        /// per call and per return, ~10 µs each, or an in-process trap,
        /// ~2.6 µs; the summary says how many hits went through traps).
        #[arg(long)]
        no_traps: bool,
        /// Follow forked children (counts per process, their events in the trace);
        /// by default they run without probes.
        #[arg(short = 'f', long)]
        follow_forks: bool,
        /// With -f: a process that executes another program is not probed
        /// in it (by default the probes are placed again in each program
        /// a followed process executes).
        #[arg(long, requires = "follow_forks")]
        no_follow_exec: bool,
        /// Also record the host kernel's events of the traced threads and
        /// of the threads and processes they create: syscalls (name, return
        /// value, duration) and off-CPU time, through perf tracepoints
        /// (needs root and tracefs mounted).
        #[arg(long)]
        kernel: bool,
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
        /// Cap on threads alive at once that get a ring (slots grow 1,024 at
        /// a time as threads start, given back at thread exit; a thread past
        /// the cap has its events counted as lost).
        #[arg(long, value_name = "N", default_value_t = 16384,
              value_parser = clap::value_parser!(u32).range(1..=16384))]
        max_threads: u32,
        /// Capture the user stack at each function entry and write the
        /// stacks, counted and symbolized, into the trace (stacks.tsv, and
        /// each call's in call_stacks.tsv): `report --callers`, `export
        /// --format folded|svg|html` and `report --flame` read them.
        #[arg(long)]
        stacks: bool,
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
        #[command(flatten)]
        later: NewProcessArgs,
        /// The command to start (after `--`).
        #[arg(last = true, value_name = "CMD")]
        cmd: Vec<OsString>,
    },
    /// Print the call tree of a recorded trace (like `uftrace replay`).
    Replay {
        /// A trace directory written by `hotprobe record`.
        #[arg(value_name = "DIR", default_value = DEFAULT_DIR)]
        dir: PathBuf,
        #[command(flatten)]
        query: QueryArgs,
        /// The columns before each function, in order: time (the trace's
        /// clock), delta (since the previous line), elapsed (since the
        /// trace's start), duration, tid; or none.
        #[arg(
            short = 'f',
            long = "output-fields",
            value_name = "FIELDS",
            default_value = "duration,tid"
        )]
        fields: String,
    },
    /// Per-function calls, total and self time of a recorded trace.
    Report {
        /// A trace directory written by `hotprobe record`.
        #[arg(value_name = "DIR", default_value = DEFAULT_DIR)]
        dir: PathBuf,
        /// One table per phase (phases start at each call of a marker:
        /// `record --phase`, or --marker).
        #[arg(long)]
        phases: bool,
        /// Also split phases at calls of this function (repeatable; implies
        /// --phases).
        #[arg(long, value_name = "FUNC")]
        marker: Vec<String>,
        #[command(flatten)]
        opts: ReportArgs,
    },
    /// What a recorded trace holds: target, command, pid, time base, start
    /// time, duration, threads, events, symbols, filters, format version.
    Info {
        /// A trace directory written by `hotprobe record`.
        #[arg(value_name = "DIR", default_value = DEFAULT_DIR)]
        dir: PathBuf,
        /// Print JSON (one line; docs/JSON.md).
        #[arg(long)]
        json: bool,
    },
    /// Convert a recorded trace: Chrome Trace Event JSON, CTF 1.8, folded
    /// stacks, a flame graph (SVG, HTML), Parquet, or send it as
    /// OpenTelemetry spans and metrics (OTLP/HTTP).
    Export {
        /// A trace directory written by `hotprobe record`.
        #[arg(value_name = "DIR", default_value = DEFAULT_DIR)]
        dir: PathBuf,
        /// The output format.
        #[arg(long, value_enum)]
        format: ExportFormat,
        /// Output file (chrome, folded, svg, html: default stdout; parquet:
        /// required) or directory (ctf; default DIR/ctf); `-` is standard
        /// output (all but ctf).
        #[arg(short, long, value_name = "OUT")]
        output: Option<PathBuf>,
        /// Folded, svg, html: count calls instead of self time in ns (the
        /// captured stacks of `record --stacks`: always in calls).
        #[arg(long)]
        calls: bool,
        /// Folded, svg, html: start each stack with its thread (`tid-N`).
        #[arg(long)]
        per_thread: bool,
        /// Otlp: the OTLP/HTTP receiver, http://HOST[:PORT][/PREFIX] (port
        /// 4318 by default); POSTs to PREFIX/v1/traces and /v1/metrics.
        #[arg(long, value_name = "URL")]
        endpoint: Option<String>,
        /// Which calls go out (replay's filters, uftrace's semantics).
        #[command(flatten)]
        query: QueryArgs,
    },
    /// Build the bundled demo program (tests/programs/demo.c) and trace it.
    Demo,
    /// Count, trace or record probes on VM guest kernels: a guest hotprobe
    /// starts with its QEMU plugin (`guest count PROBE... [--symbols FILE] --
    /// qemu-system-x86_64 ARGS`; `count` and `trace` take several guests,
    /// one `--` block each), or running guests through their GDB stubs
    /// (QEMU -gdb; repeat --gdb/--symbols (and --ram) for more guests).
    Guest {
        /// A guest's GDB stub: HOST:PORT or unix:PATH.
        #[arg(long, value_name = "HOST:PORT|unix:PATH")]
        gdb: Vec<String>,
        /// The guest kernel's symbols: /proc/kallsyms, System.map, vmlinux,
        /// or the bzImage booted with -kernel (symbols recovered from it;
        /// boot with nokaslr) (one per --gdb, in the same order).
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
pub enum GuestCmd {
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
        /// The guest kernel's symbols (with a QEMU command line; default:
        /// recovered from each guest's -kernel image).
        #[arg(long, value_name = "FILE")]
        symbols: Option<PathBuf>,
        /// A QEMU command line to start with hotprobe's plugin; several
        /// guests: one `--` block each (`-- qemu-system-x86_64 ARGS --
        /// qemu-system-x86_64 ARGS`), counted in one table with a GUEST
        /// column (1, 2, ... in command-line order). A guest that powers
        /// off or dies ends its own counting; the others go on. Exit status:
        /// 0 if every QEMU exited 0, else the first failing guest's
        /// (128 + signal if it was killed).
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
        /// The guest kernel's symbols (with a QEMU command line; default:
        /// recovered from each guest's -kernel image).
        #[arg(long, value_name = "FILE")]
        symbols: Option<PathBuf>,
        /// A QEMU command line to start with hotprobe's plugin; several
        /// guests: one `--` block each, each its own call tree, guest N's
        /// functions shown as `[gN] name` (exit status as for count).
        #[arg(last = true, value_name = "QEMU")]
        qemu: Vec<OsString>,
    },
    /// Trace the guest's system calls like strace, from the host: every
    /// `__x64_sys_*` entry with its decoded arguments (paths read in the
    /// plugin) and its return value, in call order, for one task if asked.
    Syscalls {
        /// Only this guest thread id (filtered in the plugin).
        #[arg(long, value_name = "PID", conflicts_with = "comm")]
        pid: Option<u32>,
        /// Only tasks with this name (filtered in the plugin on its first 8
        /// bytes).
        #[arg(long, value_name = "NAME")]
        comm: Option<String>,
        /// Write the calls to FILE (default: standard output, which the
        /// guest's console may share).
        #[arg(short = 'o', long, value_name = "FILE")]
        output: Option<PathBuf>,
        /// Stop after this many seconds.
        #[arg(long, value_name = "SECS")]
        duration: Option<f64>,
        /// Synchronous delivery: each vCPU waits until hotprobe has its event.
        #[arg(long)]
        sync: bool,
        /// The guest kernel's symbols (default: recovered from its -kernel
        /// image).
        #[arg(long, value_name = "FILE")]
        symbols: Option<PathBuf>,
        /// The QEMU command line to start with hotprobe's plugin.
        #[arg(last = true, required = true, value_name = "QEMU")]
        qemu: Vec<OsString>,
    },
    /// Record a trace of the given kernel functions (entries with their
    /// arguments, returns) from a guest hotprobe starts with its plugin.
    Record {
        /// Function specs: [module:]function | 0xADDR.
        #[arg(required_unless_present = "boot", value_name = "PROBE")]
        probes: Vec<String>,
        /// Record the guest's boot phases: the kernel's start, each
        /// initcall level, the end of the initcalls and the first user
        /// process as phase markers (`report --phases`), armed from the
        /// guest's first instruction.
        #[arg(long)]
        boot: bool,
        /// The trace directory.
        #[arg(short = 'o', long, value_name = "DIR")]
        output: PathBuf,
        /// Replace the trace already in the -o directory (refused without).
        #[arg(long)]
        force: bool,
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
        /// The guest kernel's symbols (default: recovered from its -kernel
        /// image).
        #[arg(long, value_name = "FILE")]
        symbols: Option<PathBuf>,
        /// The QEMU command line to start with hotprobe's plugin.
        #[arg(last = true, required = true, value_name = "QEMU")]
        qemu: Vec<OsString>,
    },
}

/// `--mechanism` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum MechanismArg {
    Auto,
    Patch,
    Jump,
    Trap,
}

/// `record --mechanism` values (the fast path's; `auto` falls back to a
/// trap unless `--no-traps`).
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum RecordMechanism {
    Auto,
    Patch,
    Jump,
}

/// `export --format` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExportFormat {
    /// Chrome Trace Event JSON (Perfetto UI, chrome://tracing).
    Chrome,
    /// CTF 1.8 (babeltrace2, Trace Compass): a directory.
    Ctf,
    /// Folded stacks (flamegraph.pl, inferno).
    Folded,
    /// A flame graph, SVG (inferno).
    Svg,
    /// A flame graph in an HTML page (interactive in a browser).
    Html,
    /// OpenTelemetry spans and metrics over OTLP/HTTP to --endpoint.
    Otlp,
    /// Parquet, one row per call (DuckDB, ClickHouse, pandas); needs -o.
    Parquet,
}

/// `--color` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColorWhen {
    /// On a terminal, unless NO_COLOR is set.
    Auto,
    /// Always, even into a pipe or a file.
    Always,
    /// Never.
    Never,
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

/// The filters of `replay` and `report` (uftrace's semantics).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct QueryArgs {
    /// Keep only calls of functions matching GLOB and their callees
    /// (repeatable).
    #[arg(short = 'F', long = "filter", value_name = "GLOB")]
    pub filter: Vec<String>,
    /// Leave out calls of functions matching GLOB and their callees
    /// (repeatable).
    #[arg(short = 'N', long = "notrace", value_name = "GLOB")]
    pub notrace: Vec<String>,
    /// Keep calls nested less than N deep in what is kept (1: the
    /// outermost only; with -F, counted from the matching call).
    #[arg(short = 'D', long = "depth", value_name = "N",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub depth: Option<u32>,
    /// Keep only calls lasting at least DUR (e.g. 10us, 1.5ms; bare: ns).
    #[arg(short = 't', long = "min-duration", value_name = "DUR",
          value_parser = parse_duration)]
    pub min_duration: Option<u64>,
    /// Keep only this thread (repeatable).
    #[arg(long = "tid", value_name = "TID")]
    pub tid: Vec<u32>,
    /// Keep only calls starting at least DUR after the trace start (its
    /// first record).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub since: Option<u64>,
    /// Keep only calls starting less than DUR after the trace start.
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub until: Option<u64>,
    /// Times as measured, the probes' costs in them (by default a trace
    /// whose recording calibrated them reads without them).
    #[arg(long)]
    pub raw_times: bool,
}

/// `report -s` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortArg {
    /// Total time (recursive calls once).
    #[default]
    Total,
    /// Self time.
    #[value(name = "self")]
    SelfTime,
    /// Calls.
    Calls,
    /// Average call.
    Avg,
    /// Longest call.
    Max,
}

/// The options of `report` besides `--phases`/`--marker`.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct ReportArgs {
    /// Filters.
    #[command(flatten)]
    pub query: QueryArgs,
    /// Sort by this column, descending (default total; --diff: by its change; --callers: by calls, or their calls' total, self, avg or max; --graph: each node's callees, else in order of first call; --hist: the histograms, else by name).
    #[arg(short = 's', long = "sort", value_enum)]
    pub sort: Option<SortArg>,
    /// One table per thread (with --callers: the callers per thread).
    #[arg(long, visible_alias = "per-thread", conflicts_with_all = ["phases", "diff", "hist", "flame"])]
    pub task: bool,
    /// Compare with the trace in DIR2: per function, calls, total and self
    /// time of both and the change (DIR2 − DIR).
    #[arg(long, value_name = "DIR2", conflicts_with_all = ["phases", "hist", "flame"])]
    pub diff: Option<PathBuf>,
    /// A latency histogram (log2 buckets) of the calls of FUNC (a glob:
    /// one per matching function).
    #[arg(long, value_name = "FUNC", conflicts_with_all = ["phases", "flame"])]
    pub hist: Option<String>,
    /// Write a flame graph of the kept calls to DIR/flame.svg and print its
    /// path (instead of the table).
    #[arg(long, conflicts_with = "phases")]
    pub flame: bool,
    /// Print JSON (one line) instead of the table (docs/JSON.md).
    #[arg(long)]
    pub json: bool,
    /// The callers of FUNC (a glob), from the stacks `record --stacks`
    /// captured: each direct caller with its calls, and the full stacks
    /// through it; of the calls the filters keep (-F, -N, -D, -t, --tid,
    /// --since, --until), per thread with --task, as JSON with --json.
    #[arg(long, value_name = "FUNC", conflicts_with_all = ["phases", "diff", "hist", "flame", "graph"])]
    pub callers: Option<String>,
    /// The call graph below FUNC (a glob) from the recorded call tree, as
    /// `uftrace graph` shows it: calls and total time of each callee path.
    #[arg(long, value_name = "FUNC", conflicts_with_all = ["phases", "diff", "hist", "flame", "task"])]
    pub graph: Option<String>,
}

/// `--exe PATH` / `--comm NAME` of count, trace and record.
#[derive(clap::Args, Debug)]
pub struct NewProcessArgs {
    /// Take every process that runs this program, those running now and
    /// those that start later (each held at its exec, before its first
    /// instruction), until Ctrl-C or --duration. Needs root.
    #[arg(long, value_name = "PATH")]
    pub exe: Option<PathBuf>,
    /// As --exe, for the processes whose command name (the kernel's
    /// 15-character comm) is NAME.
    #[arg(long, value_name = "NAME")]
    pub comm: Option<String>,
}
