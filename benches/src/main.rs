//! The hotprobe benchmark harness: the iProbe micro-benchmark (a loop
//! calling an empty function N times, timed by the program itself) under
//! each mechanism, next to the peers installed on this machine, in one run.
//!
//! ```text
//! cargo run --release -p hotprobe-bench -- trap            # trap mechanism vs native, naive ptrace, gdb, bpftrace
//! cargo run --release -p hotprobe-bench -- trap --cpu 0    # pin tracer and target to CPU 0
//! cargo run --release -p hotprobe-bench -- record-trap     # recording through a trap vs counting through one, jump, native
//! cargo build --release -p hotprobe-cli && \
//!   cargo run --release -p hotprobe-bench -- typed          # record -a vs --args 2 vs uftrace -a
//! cargo run --release -p hotprobe-bench -- sqlite           # every function of SQLite: count, record, uftrace
//! cargo run --release -p hotprobe-bench -- handlers         # Rust, C, Python handlers vs Frida's JS
//! cargo run --release -p hotprobe-bench -- scale --n 1000,10000,100000   # issue 14: N probes
//! cargo run --release -p hotprobe-bench -- handlerwait      # issue 22: ptrace stops beside a shared-memory handler
//! ```
//!
//! Prints a markdown table: ns per hit and × native. Not a test: timing
//! never goes in the test suite.

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use hotprobe::{Probe, RunEnd, Session, SpawnOptions};
use hotprobe_target::{ResumeMode, Target, TargetEvent};
use std::path::{Path, PathBuf};
use std::process::Command;

mod inproc;
mod scale;
mod sqlite;
mod stacks;

#[derive(Parser)]
#[command(about = "hotprobe benchmarks, peers side by side")]
struct Cli {
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// The cost per hit of `--stacks`: a jump counting a function 12
    /// frames deep, with and without the agent's stack walk, vs native.
    Stacks {
        /// Pin this process and every tracee to one CPU.
        #[arg(long)]
        cpu: Option<usize>,
        /// Calls per run.
        #[arg(long, default_value_t = 1_000_000)]
        calls: u64,
        /// Runs per row (the median is reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// Trap probes (boosted, single-stepped) vs native, naive ptrace, gdb, bpftrace.
    Trap {
        /// Pin this process and every tracee to one CPU (tracer and target on one core).
        #[arg(long)]
        cpu: Option<usize>,
        /// Hits per traced run.
        #[arg(long, default_value_t = 20_000)]
        hits: u64,
        /// Runs per row (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// `Record` through the trap mechanism (entry + return stop per call,
    /// events drained while the target runs) vs `Count` through a trap,
    /// `Record` through jump, and native.
    RecordTrap {
        /// Calls per traced run.
        #[arg(long, default_value_t = 5_000)]
        calls: u64,
        /// Runs per row (the median is reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// In-process traps and shared-memory handlers vs ptrace traps and a
    /// kernel uprobe, on a 2-byte function (no patch or jump fits it).
    Inproc {
        /// Pin this process and every tracee to one CPU.
        #[arg(long)]
        cpu: Option<usize>,
        /// Hits per traced run.
        #[arg(long, default_value_t = 20_000)]
        hits: u64,
        /// Runs per row (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// Typed arguments: `hotprobe record -a` next to `record --args 2` and
    /// `uftrace record -a`, per kind of value (integers, a string, a double).
    Typed {
        /// Calls per traced run.
        #[arg(long, default_value_t = 20_000)]
        calls: u64,
        /// Runs per row (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Another hotprobe binary (an earlier build) whose `record -a`
        /// runs alternate with this one's, as a column of its own, for a
        /// before/after comparison in the same run.
        #[arg(long)]
        baseline: Option<PathBuf>,
    },
    /// SQLite (amalgamation) inserting rows, every function: native,
    /// `hotprobe count '*'`, `hotprobe record`, `uftrace record` (issue 14).
    Sqlite {
        /// Rows inserted.
        #[arg(long, default_value_t = 200_000)]
        rows: u64,
        /// Runs per row of the table (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// One pre probe with a counting handler in Rust, C (the C API) and
    /// Python (the hotprobe package in .venv), next to Frida's Interceptor
    /// with a JS onEnter handler (.cache/peers-venv), on the same function.
    Handlers {
        /// Pin this process and every tracee to one CPU.
        #[arg(long)]
        cpu: Option<usize>,
        /// Hits per traced run.
        #[arg(long, default_value_t = 20_000)]
        hits: u64,
        /// Runs per row (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// Every function of a generated N-function program probed: arm and
    /// detach time, tracer RSS, slowdown, per each mechanism, next to
    /// uftrace and bpftrace (issue 14).
    Scale {
        /// Function counts, comma-separated.
        #[arg(
            long,
            value_delimiter = ',',
            default_value = "1000,10000,100000,200000"
        )]
        n: Vec<usize>,
        /// Runs per hotprobe and uftrace row (the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Seconds after which a run is killed and reported as cut off.
        #[arg(long, default_value_t = 120)]
        cutoff: u64,
        /// bpftrace only up to this many probes (it takes minutes past that).
        #[arg(long, default_value_t = 1000)]
        bpftrace_max: usize,
    },
    /// Debian's sqlite3 and jq, every library function: native, `hotprobe
    /// count`, `hotprobe record`, `uftrace record -P .@LIB`, whole runs
    /// (issue 23).
    Stock {
        /// Rows of the sqlite3 database (the jq input has half as many
        /// objects).
        #[arg(long, default_value_t = 200_000)]
        rows: u64,
        /// Runs per row (the median is reported).
        #[arg(long, default_value_t = 5)]
        runs: usize,
    },
    /// An 8-thread program's start natively, under `hotprobe count`,
    /// `hotprobe record` and `uftrace record` (issue 23: within 1.5×
    /// native).
    Threadstart {
        /// Threads the program starts.
        #[arg(long, default_value_t = 8)]
        threads: u32,
        /// Calls of `work` per thread.
        #[arg(long, default_value_t = 1000)]
        calls: u64,
        /// Rounds (one run of every row each; quartiles are reported).
        #[arg(long, default_value_t = 9)]
        runs: usize,
        /// Another hotprobe binary (an earlier build) whose `count` and
        /// `record` rows run in the same rounds, for a before/after
        /// comparison side by side.
        #[arg(long)]
        baseline: Option<PathBuf>,
        /// Adds a native row whose `work` first busy-waits this many TSC
        /// cycles: what a per-call cost alone does to the start.
        #[arg(long)]
        spin: Option<u64>,
    },
    /// `report`'s times with the probes' costs taken out against the
    /// program's own measure (issue 23, true timings).
    Truetimes {
        /// Recordings (the median is reported).
        #[arg(long, default_value_t = 9)]
        runs: usize,
    },
    /// Serving handler calls of a traced process (issue 22): a C tool (the
    /// C API) with a shared-memory pre handler on `h` and a ptrace-trap
    /// return probe on `t`: µs a call of `t`, of `t` then `h`, and the
    /// tool's context switches while the target sleeps.
    Handlerwait {
        /// Calls of `t` alone, then iterations of `t` and `h`, per run.
        #[arg(long, default_value_t = 2000)]
        calls: u64,
        /// Rounds (one run of every row each; the median is reported).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// The window (ms) over which the tool's context switches are
        /// counted; the target sleeps 0.5 s more on each side of it.
        #[arg(long, default_value_t = 1000)]
        idle_ms: u64,
        /// The directory of another build's `libhotprobe_c.so` (an earlier
        /// commit): the same tool linked against it, runs alternating, for
        /// a before/after comparison.
        #[arg(long)]
        baseline_lib: Option<PathBuf>,
    },
    /// One measurement of `scale`, in a process of its own (internal).
    #[command(hide = true)]
    ScaleOne {
        bin: PathBuf,
        mechanism: String,
        #[arg(long)]
        limit: Option<usize>,
    },
}

mod handlers;
mod handlerwait;
mod stock;
mod threadstart;
mod truetimes;

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.what {
        What::Trap { cpu, hits, runs } => trap(cpu, hits, runs),
        What::Stacks { cpu, calls, runs } => stacks::run(cpu, calls, runs),
        What::RecordTrap { calls, runs } => record_trap(calls, runs),
        What::Inproc { cpu, hits, runs } => inproc::run(cpu, hits, runs),
        What::Typed {
            calls,
            runs,
            baseline,
        } => typed(calls, runs, baseline.as_deref()),
        What::Sqlite { rows, runs } => sqlite::sqlite(rows, runs),
        What::Stock { rows, runs } => stock::run_all(rows, runs),
        What::Threadstart {
            threads,
            calls,
            runs,
            baseline,
            spin,
        } => threadstart::run_all(threads, calls, runs, baseline.as_deref(), spin),
        What::Truetimes { runs } => truetimes::run_all(runs),
        What::Handlers { cpu, hits, runs } => handlers::run(cpu, hits, runs),
        What::Handlerwait {
            calls,
            runs,
            idle_ms,
            baseline_lib,
        } => handlerwait::run(calls, runs, idle_ms, baseline_lib.as_deref()),
        What::Scale {
            n,
            runs,
            cutoff,
            bpftrace_max,
        } => scale::run(
            &n,
            runs,
            std::time::Duration::from_secs(cutoff),
            bpftrace_max,
        ),
        What::ScaleOne {
            bin,
            mechanism,
            limit,
        } => scale::one(&bin, &mechanism, limit),
    }
}

/// Build benches/programs/NAME.c with gcc flags into the target dir.
pub(crate) fn build(name: &str, flags: &[&str]) -> Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    build_source(&root.join("programs").join(format!("{name}.c")), flags)
}

/// Build the C file `src` (of this repository) with gcc flags into the
/// target dir, named after the file and the flags.
pub(crate) fn build_source(src: &Path, flags: &[&str]) -> Result<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let name = src
        .file_stem()
        .and_then(|n| n.to_str())
        .context("a C file's name")?;
    let dir = root.join("../target/bench-programs");
    std::fs::create_dir_all(&dir)?;
    let tag: String = flags
        .join("")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    let out = dir.join(format!("{name}-{tag}"));
    let st = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(src)
        .status()
        .context("running gcc")?;
    if !st.success() {
        bail!("gcc failed on {}", src.display());
    }
    Ok(out)
}

/// The loop's own time from its output line `calls N ns T`.
pub(crate) fn loop_ns(output: &str) -> Result<f64> {
    for line in output.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 4 && f[0] == "calls" && f[2] == "ns" {
            let n: f64 = f[1].parse()?;
            let ns: f64 = f[3].parse()?;
            return Ok(ns / n);
        }
    }
    bail!("no timing line in output: {output:?}")
}

pub(crate) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

pub(crate) fn pin(cpu: usize) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!("sched_setaffinity: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
}

pub(crate) fn run_native(bin: &Path, n: u64) -> Result<f64> {
    let out = Command::new(bin).arg(n.to_string()).output()?;
    loop_ns(&String::from_utf8_lossy(&out.stdout))
}

/// hotprobe trap probe on `empty`: null pre handler (boosted) or null post
/// handler (single-stepped).
fn run_hotprobe(bin: &Path, n: u64, func: &str, post: bool) -> Result<(f64, &'static str)> {
    let out = std::env::temp_dir().join(format!("hotprobe-bench-{}", std::process::id()));
    let f = std::fs::File::create(&out)?;
    let mut s = Session::new();
    let args = [n.to_string().into(), func.into()];
    let t = s.spawn_with(
        bin,
        &args,
        &SpawnOptions {
            stdout: Some(f),
            ..Default::default()
        },
    )?;
    let probe = if post {
        Probe::new().post(|_| {})
    } else {
        Probe::new().pre(|_| {})
    };
    let id = s.probe(t, func, probe)?;
    let exec = if post {
        "stepped"
    } else {
        s.execution_of(id).unwrap_or("?")
    };
    s.start()?;
    if s.run()? != RunEnd::AllExited {
        bail!("run ended early");
    }
    let hits = s.stats(id).map(|st| st.hits).unwrap_or(0);
    if hits != n {
        bail!("expected {n} hits, saw {hits}");
    }
    let text = std::fs::read_to_string(&out)?;
    let _ = std::fs::remove_file(&out);
    Ok((loop_ns(&text)?, exec))
}

/// The naive peer: int3, on each hit put the byte back, step, re-insert.
fn run_naive_ptrace(bin: &Path, n: u64) -> Result<f64> {
    let out = std::env::temp_dir().join(format!("hotprobe-bench-naive-{}", std::process::id()));
    let f = std::fs::File::create(&out)?;
    let mut t = hotprobe_process::ProcessTarget::spawn_with(
        bin,
        &[n.to_string().into()],
        &SpawnOptions {
            stdout: Some(f),
            ..Default::default()
        },
    )?;
    let syms = hotprobe_symbols::ProcessSymbols::for_pid(t.pid() as u32)?;
    let addr = syms.resolve(&"empty".parse()?)?.remove(0).addr;
    t.insert_breakpoint(addr)?;
    t.resume_all()?;
    loop {
        match t.wait(None)? {
            TargetEvent::Breakpoint { thread, regs, .. } => {
                t.remove_breakpoint(addr)?;
                t.set_registers(thread, &regs)?;
                t.resume(thread, ResumeMode::Step)?;
            }
            TargetEvent::Stepped { thread, .. } => {
                t.insert_breakpoint(addr)?;
                t.resume(thread, ResumeMode::Continue)?;
            }
            TargetEvent::ModulesChanged { thread } => t.resume(thread, ResumeMode::Continue)?,
            TargetEvent::Exited(_) => break,
            _ => {}
        }
    }
    let text = std::fs::read_to_string(&out)?;
    let _ = std::fs::remove_file(&out);
    loop_ns(&text)
}

fn run_gdb(bin: &Path, n: u64) -> Result<f64> {
    let script = std::env::temp_dir().join(format!("hotprobe-bench-{}.gdb", std::process::id()));
    std::fs::write(
        &script,
        "set pagination off\nbreak empty\ncommands\nsilent\ncontinue\nend\nrun\nquit\n",
    )?;
    let out = Command::new("gdb")
        .arg("-batch")
        .arg("-x")
        .arg(&script)
        .arg("--args")
        .arg(bin)
        .arg(n.to_string())
        .output()?;
    let _ = std::fs::remove_file(&script);
    loop_ns(&String::from_utf8_lossy(&out.stdout))
}

fn run_bpftrace(bin: &Path, n: u64) -> Result<f64> {
    let prog = format!("uprobe:{}:empty {{ @hits = count(); }}", bin.display());
    let out = Command::new("bpftrace")
        .arg("-e")
        .arg(&prog)
        .arg("-c")
        .arg(format!("{} {n}", bin.display()))
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !text.contains(&format!("@hits: {n}")) {
        bail!(
            "bpftrace did not count {n} hits: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .next()
                .unwrap_or("")
        );
    }
    loop_ns(&text)
}

pub(crate) fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn trap(cpu: Option<usize>, hits: u64, runs: usize) -> Result<()> {
    if let Some(c) = cpu {
        pin(c)?;
    }
    let bin = build("loop", &["-O2"])?;
    let native = median(
        (0..runs)
            .map(|_| run_native(&bin, 100_000_000))
            .collect::<Result<_>>()?,
    );
    let mut rows: Vec<(String, u64, f64)> = vec![("native call".into(), 100_000_000, native)];
    for (func, post, what) in [
        ("empty", false, "`empty` (a `ret`), null pre handler"),
        ("body", false, "`body` (`lea`), null pre handler"),
        ("body", true, "`body` (`lea`), null post handler"),
    ] {
        let mut exec = "";
        let v = median(
            (0..runs)
                .map(|_| {
                    let (v, e) = run_hotprobe(&bin, hits, func, post)?;
                    exec = e;
                    Ok(v)
                })
                .collect::<Result<_>>()?,
        );
        let name = format!("hotprobe trap on {what}: {exec}");
        eprintln!("{name}: {v:.0} ns/hit");
        rows.push((name, hits, v));
    }
    let mut row = |name: String, n: u64, f: &mut dyn FnMut() -> Result<f64>| -> Result<()> {
        let v = median((0..runs).map(|_| f()).collect::<Result<_>>()?);
        eprintln!("{name}: {v:.0} ns/hit");
        rows.push((name, n, v));
        Ok(())
    };
    row(
        "naive ptrace breakpoint + single-step".into(),
        hits,
        &mut || run_naive_ptrace(&bin, hits),
    )?;
    if have("gdb") {
        let n = (hits / 10).max(100);
        row("gdb breakpoint, silent continue".into(), n, &mut || {
            run_gdb(&bin, n)
        })?;
    }
    if have("bpftrace") {
        let n = hits * 10;
        row("bpftrace uprobe, count()".into(), n, &mut || {
            run_bpftrace(&bin, n)
        })?;
    }
    println!(
        "Trap mechanism, iProbe micro-benchmark (loop calling an empty function), {}, median of {runs} runs",
        match cpu {
            Some(c) => format!("tracer and target pinned to CPU {c}"),
            None => "not pinned".into(),
        }
    );
    println!();
    println!("| mechanism | calls | ns per call | × native |");
    println!("|---|---:|---:|---:|");
    for (name, n, v) in rows {
        println!("| {name} | {n} | {v:.1} | {:.0} |", v / native);
    }
    Ok(())
}

/// Counts the events a session hands over.
struct CountingSink(u64);

impl hotprobe::EventSink for CountingSink {
    fn event(&mut self, _ev: &hotprobe::RecordedEvent) -> Result<(), hotprobe::SinkError> {
        self.0 += 1;
        Ok(())
    }

    fn lost(&mut self, tid: u32, _ts: u64, count: u64) -> Result<(), hotprobe::SinkError> {
        Err(hotprobe::SinkError(
            format!("thread {tid} lost {count} events: the figure would be wrong").into(),
        ))
    }
}

/// `func` (`body` or `mix`) called `n` times under a session probe doing `action` on
/// `mechanism`: ns per call (the loop's own time), after checking every
/// call was seen (hits, or an entry and an exit event each).
fn run_session(
    bin: &Path,
    n: u64,
    action: hotprobe::Action,
    mechanism: hotprobe::MechanismChoice,
    func: &str,
) -> Result<f64> {
    let out = std::env::temp_dir().join(format!("hotprobe-bench-rt-{}", std::process::id()));
    let f = std::fs::File::create(&out)?;
    let record = matches!(action, hotprobe::Action::Record);
    let mut s = Session::with_config(hotprobe::SessionConfig {
        mechanism,
        record_traps: true,
        // As `record`: 2^20 events a thread (the jump row's events fit
        // even if the drain falls behind on a loaded machine).
        fast_path: hotprobe::FastPathConfig {
            ring_capacity: 1 << 20,
            ..Default::default()
        },
        ..Default::default()
    });
    let args = [n.to_string().into(), func.into()];
    let t = s.spawn_with(
        bin,
        &args,
        &SpawnOptions {
            stdout: Some(f),
            ..Default::default()
        },
    )?;
    let added = s.add(t, func, action)?;
    let p = &added.placements[0];
    let id = p.id;
    if (mechanism == hotprobe::MechanismChoice::Trap) != (p.mechanism == hotprobe::Mechanism::Trap)
    {
        bail!("{func} is on {}, not what the row measures", p.mechanism);
    }
    s.start()?;
    let mut sink = CountingSink(0);
    let stop = std::sync::atomic::AtomicBool::new(false);
    let end = if record {
        s.run_with(&stop, Some(&mut sink))?
    } else {
        s.run()?
    };
    if end != RunEnd::AllExited {
        bail!("run ended early");
    }
    let seen = if record {
        sink.0 / 2
    } else {
        s.stats(id).map(|st| st.hits).unwrap_or(0)
    };
    if seen != n {
        bail!("expected {n} calls, saw {seen}");
    }
    let text = std::fs::read_to_string(&out)?;
    let _ = std::fs::remove_file(&out);
    loop_ns(&text)
}

fn record_trap(calls: u64, runs: usize) -> Result<()> {
    use hotprobe::{Action, MechanismChoice};
    let bin = build("loop", &["-O2"])?;
    let native = median(
        (0..runs)
            .map(|_| {
                let out = Command::new(&bin).args(["100000000", "mix"]).output()?;
                loop_ns(&String::from_utf8_lossy(&out.stdout))
            })
            .collect::<Result<_>>()?,
    );
    let mut rows: Vec<(String, u64, f64)> = vec![("native call".into(), 100_000_000, native)];
    for (name, action, mech, n) in [
        (
            "hotprobe `Record` on jump (entry + exit events)",
            0,
            MechanismChoice::Auto,
            calls * 20,
        ),
        (
            "hotprobe `Count` on a trap (entry stop)",
            1,
            MechanismChoice::Trap,
            calls,
        ),
        (
            "hotprobe `Record` on a trap (entry + return stops, rings drained)",
            0,
            MechanismChoice::Trap,
            calls,
        ),
    ] {
        let v = median(
            (0..runs)
                .map(|_| {
                    let a = if action == 0 {
                        Action::Record
                    } else {
                        Action::Count
                    };
                    run_session(&bin, n, a, mech, "mix")
                })
                .collect::<Result<_>>()?,
        );
        eprintln!("{name}: {v:.0} ns/call");
        rows.push((name.into(), n, v));
    }
    println!(
        "Recording through a trap (`mix` called in a loop), not pinned, median of {runs} runs"
    );
    println!();
    println!("| probe | calls | ns per call | × native |");
    println!("|---|---:|---:|---:|");
    for (name, n, v) in rows {
        println!("| {name} | {n} | {v:.1} | {:.0} |", v / native);
    }
    Ok(())
}

/// The release `hotprobe` binary (built by `cargo build --release -p hotprobe-cli`).
fn hotprobe_bin() -> Result<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release/hotprobe");
    if !p.exists() {
        bail!(
            "{} missing: cargo build --release -p hotprobe-cli",
            p.display()
        );
    }
    Ok(p)
}

/// Runs `cmd` and returns the loop's ns per call from its stdout.
fn timed(cmd: &mut Command) -> Result<f64> {
    let out = cmd.output().context("running the traced program")?;
    if !out.status.success() {
        bail!("{:?} failed: {}", cmd, String::from_utf8_lossy(&out.stderr));
    }
    loop_ns(&String::from_utf8_lossy(&out.stdout))
}

fn typed(calls: u64, runs: usize, baseline: Option<&Path>) -> Result<()> {
    let hp = hotprobe_bin()?;
    let bin = build("typed", &["-O2", "-g"])?;
    let pg = build("typed", &["-O2", "-g", "-pg"])?;
    let dir = std::env::temp_dir().join(format!("hotprobe-bench-typed-{}", std::process::id()));
    let n = calls.to_string();
    println!("Typed arguments ({calls} calls per run, median of {runs} runs; ns per call of the loop as the program measures it)");
    if let Some(b) = baseline {
        println!(
            "baseline (its `record -a` runs alternate with this build's): {}",
            b.display()
        );
    }
    println!();
    println!(
        "| function | native | hotprobe record --args 2 | hotprobe record -a |{} uftrace record -a |",
        if baseline.is_some() { " baseline record -a |" } else { "" }
    );
    println!(
        "|---|---:|---:|---:|{}---:|",
        if baseline.is_some() { "---:|" } else { "" }
    );
    for (mode, func) in [("int", "add"), ("str", "slen"), ("dbl", "scale")] {
        let med = |f: &mut dyn FnMut() -> Result<f64>| -> Result<f64> {
            Ok(median((0..runs).map(|_| f()).collect::<Result<_>>()?))
        };
        let native = med(&mut || timed(Command::new(&bin).args([n.as_str(), mode])))?;
        let record = |hp: &Path, extra: &str| {
            timed(
                Command::new(hp)
                    .args(["record", "--force", "-o"])
                    .arg(&dir)
                    .args(extra.split(' '))
                    .arg(func)
                    .arg("--")
                    .arg(&bin)
                    .args([n.as_str(), mode]),
            )
        };
        let raw = med(&mut || record(&hp, "--args 2"))?;
        // This build's and the baseline's runs alternate.
        let (mut autos, mut bases) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            autos.push(record(&hp, "-a")?);
            if let Some(b) = baseline {
                bases.push(record(b, "-a")?);
            }
        }
        let auto = median(autos);
        let base = if baseline.is_some() {
            let v = median(bases);
            format!(" {v:.0} ({:.0}×) |", v / native)
        } else {
            String::new()
        };
        let uft = if have("uftrace") {
            let v = med(&mut || {
                timed(
                    Command::new("uftrace")
                        .args(["record", "--no-libcall", "-a", "-d"])
                        .arg(dir.join("uftrace.data"))
                        .args(["-F", func])
                        .arg(&pg)
                        .args([n.as_str(), mode]),
                )
            })?;
            format!("{v:.0} ({:.0}×)", v / native)
        } else {
            "–".into()
        };
        println!(
            "| `{func}` ({mode}) | {native:.1} | {raw:.0} ({:.0}×) | {auto:.0} ({:.0}×) |{base} {uft} |",
            raw / native,
            auto / native
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
