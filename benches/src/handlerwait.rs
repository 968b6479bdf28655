//! `hotprobe-bench handlerwait` (issue 22, left over): serving handler
//! calls of a traced process. A C tool on the C API
//! (`benches/programs/handlerwait_tool.c`) spawns
//! `benches/programs/handlerwait_target.c`, puts a C pre handler on `h` (2
//! bytes: the in-process trap, its handler calls served through shared
//! memory) and a return probe on `t` (the engine's ptrace trap: a stop at
//! the entry and one at the return). While the session waits for handler
//! calls, a ptrace stop of the same process must end that wait at once
//! (DESIGN.md, "Serving handler calls of a traced process"); before, the
//! wait was cut into 1 ms slices, so each stop waited out up to a slice
//! and the idle tracer woke 1,000 times a second.
//!
//! Each run: the target calls `h` once, prints `idle T` and sleeps; the
//! harness samples the tool's context switches (every thread's
//! `voluntary_ctxt_switches + nonvoluntary_ctxt_switches` in
//! `/proc/PID/task/*/status`) 0.5 s into the sleep and `--idle-ms` later,
//! both checked to fall inside the sleep by the target's own `idle` and
//! `awake` timestamps; then the target times N calls of `t` alone and N
//! of `t` and `h` in turn (its own CLOCK_MONOTONIC figures). Every run
//! checks the handler runs against the calls the target counted (N + 1
//! `h`, 2 N `t` returns), the target's exit 0 and the tool's.
//!
//! Rows: this build; with `--baseline-lib DIR`, the same tool linked
//! against DIR's `libhotprobe_c.so` (an earlier build), runs alternating;
//! and a reference, this build's tool without the probe on `h` (the
//! ptrace-trap probe alone, no shared-memory handler in the process).

use crate::handlers::build_capi;
use crate::{build, median};
use anyhow::{bail, Context, Result};
use hotprobe::{Action, Mechanism, Probe, RetProbe, RunEnd, Session, SpawnOptions};
use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// The first sample, after the target's `idle` line (ms).
const LEAD_MS: u64 = 500;
/// Left of the target's sleep after the second sample (ms).
const TAIL_MS: u64 = 500;
/// How long the harness waits for the `idle` line, then for the rest of
/// a run, before it kills the tool and fails.
const RUN_CUTOFF: Duration = Duration::from_secs(600);

/// One kind of run: which tool, whether `h` is probed.
struct Variant {
    label: String,
    tool: PathBuf,
    with_h: bool,
}

/// What one run measured.
struct Figures {
    /// `t` alone, µs a call.
    t_us: f64,
    /// `t` then `h`, µs an iteration.
    th_us: f64,
    /// The tool's context switches over the window.
    switches: u64,
    /// The same by thread: `name +delta`, …
    by_thread: String,
}

/// CLOCK_MONOTONIC in ns, the clock of the target's timestamps.
fn mono_ns() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec * 1_000_000_000 + ts.tv_nsec
}

/// Sleeps until CLOCK_MONOTONIC reads `at` (ns).
fn sleep_until(at: i64) {
    let left = at - mono_ns();
    if left > 0 {
        std::thread::sleep(Duration::from_nanos(left as u64));
    }
}

/// Every thread of `pid`: its name (`main` for the main thread) and
/// voluntary + nonvoluntary context switches, by thread id.
fn switches(pid: u32) -> Result<BTreeMap<u32, (String, u64)>> {
    let mut out = BTreeMap::new();
    let dir = format!("/proc/{pid}/task");
    for e in std::fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        let e = e?;
        let Ok(tid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        // A thread that ended since the listing is left out.
        let Ok(text) = std::fs::read_to_string(e.path().join("status")) else {
            continue;
        };
        let (mut name, mut n) = (String::new(), 0u64);
        for line in text.lines() {
            if let Some(v) = line.strip_prefix("Name:") {
                name = v.trim().to_string();
            } else if let Some(v) = line
                .strip_prefix("voluntary_ctxt_switches:")
                .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
            {
                n += v.trim().parse::<u64>()?;
            }
        }
        if tid == pid {
            name = "main".into();
        }
        out.insert(tid, (name, n));
    }
    Ok(out)
}

/// The words after `key` on the first line starting with it.
fn words<'a>(lines: &'a [String], key: &str) -> Result<Vec<&'a str>> {
    lines
        .iter()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            (w.next() == Some(key)).then(|| w.collect())
        })
        .with_context(|| format!("no `{key}` line in the output: {lines:?}"))
}

/// The number at `words[i]`.
fn num<T: std::str::FromStr>(words: &[&str], i: usize) -> Result<T> {
    words
        .get(i)
        .and_then(|w| w.parse().ok())
        .with_context(|| format!("no number at {i} in {words:?}"))
}

/// Builds `handlerwait_tool.c` against the `libhotprobe_c.so` in `lib`
/// (its rpath), with this repository's header, as `name`.
fn build_tool(lib: &Path, name: &str) -> Result<PathBuf> {
    if !lib.join("libhotprobe_c.so").exists() {
        bail!("no libhotprobe_c.so in {}", lib.display());
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = root.join("target/bench-programs").join(name);
    std::fs::create_dir_all(out.parent().context("a parent")?)?;
    let mut rpath = std::ffi::OsString::from("-Wl,-rpath,");
    rpath.push(lib);
    let st = Command::new("gcc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&out)
        .arg(root.join("benches/programs/handlerwait_tool.c"))
        .arg("-I")
        .arg(root.join("crates/hotprobe-capi/include"))
        .arg("-L")
        .arg(lib)
        .arg(rpath)
        .args(["-lhotprobe_c", "-lpthread", "-ldl", "-lm"])
        .status()
        .context("running gcc")?;
    if !st.success() {
        bail!("gcc handlerwait_tool.c against {} failed", lib.display());
    }
    Ok(out)
}

/// Checks, in a Rust session doing what the tool does through the C API
/// (`Session::add` with `Action::Handler` on `h`, `Action::Return` on
/// `t`), that `h` is on the in-process trap and `t` on the ptrace trap,
/// and counts the ptrace stops of a short run: returns a line saying so.
fn placement_check(target: &Path) -> Result<String> {
    let n = 50u64;
    let mut s = Session::new();
    let t = s.spawn_with(
        target,
        &["0".into(), n.to_string().into()],
        &SpawnOptions {
            stdout: Some(std::fs::File::create("/dev/null")?),
            ..Default::default()
        },
    )?;
    let ah = s.add(t, "h", Action::Handler(Probe::new().pre(|_| {})))?;
    let at = s.add(t, "t", Action::Return(RetProbe::new(1).ret(|_| {})))?;
    let (ph, pt) = (&ah.placements[0], &at.placements[0]);
    if ph.mechanism != Mechanism::InProcessTrap {
        bail!(
            "`h` is on {} ({}), not the in-process trap",
            ph.mechanism,
            ph.reason
        );
    }
    if pt.mechanism != Mechanism::Trap {
        bail!(
            "`t` is on {} ({}), not the ptrace trap",
            pt.mechanism,
            pt.reason
        );
    }
    let line = format!(
        "`h`: {} ({}); `t`: {} ({})",
        ph.mechanism, ph.execution, pt.mechanism, pt.execution
    );
    let id = pt.id;
    s.start()?;
    let before = s.ptrace_stops(t).context("ptrace stops")?;
    if s.run()? != RunEnd::AllExited {
        bail!("placement check: the run ended early");
    }
    let stops = s.ptrace_stops(t).context("ptrace stops")? - before;
    let returns = s.stats(id).map(|st| st.returns).unwrap_or(0);
    if returns != 2 * n {
        bail!(
            "placement check: {returns} returns of `t` for {} calls",
            2 * n
        );
    }
    if stops < 4 * n {
        bail!(
            "placement check: {stops} ptrace stops for {} calls of `t` (2 a call expected)",
            2 * n
        );
    }
    Ok(format!(
        "{line}; {stops} ptrace stops for {} calls of `t` and {} of `h` (2 a call of `t`; \
         the SIGTRAP of `h`'s in-process trap stops a traced process too)",
        2 * n,
        n + 1
    ))
}

/// One run of `v`: the figures, after every check.
fn one(v: &Variant, target: &Path, calls: u64, window_ms: u64) -> Result<Figures> {
    let sleep_ms = LEAD_MS + window_ms + TAIL_MS;
    let mut cmd = Command::new(&v.tool);
    if !v.with_h {
        cmd.arg("--no-h");
    }
    cmd.arg(target)
        .arg(sleep_ms.to_string())
        .arg(calls.to_string())
        .stdout(Stdio::piped());
    let mut child = cmd
        .spawn()
        .with_context(|| format!("running {}", v.tool.display()))?;
    let pid = child.id();
    let stdout = child.stdout.take().context("the tool's stdout")?;
    let (tx, rx) = mpsc::channel::<String>();
    let reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let idle_at = loop {
        match rx.recv_timeout(RUN_CUTOFF) {
            Ok(l) => {
                let at = l
                    .strip_prefix("idle ")
                    .and_then(|v| v.trim().parse::<i64>().ok());
                lines.push(l);
                if let Some(at) = at {
                    break at;
                }
            }
            Err(e) => {
                let _ = child.kill();
                let st = child.wait()?;
                bail!("{}: no `idle` line ({e}), {st}, output {lines:?}", v.label);
            }
        }
    };
    let s1_at = idle_at + LEAD_MS as i64 * 1_000_000;
    let s2_at = s1_at + window_ms as i64 * 1_000_000;
    sleep_until(s1_at);
    let s1_from = mono_ns();
    let first = switches(pid)?;
    sleep_until(s2_at);
    let second = switches(pid)?;
    let s2_to = mono_ns();
    // The rest of the output, to the end of the tool (killed past the
    // cut-off: a run that hangs fails instead of holding the harness).
    let cutoff = std::time::Instant::now() + RUN_CUTOFF;
    loop {
        let left = cutoff.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) => lines.push(l),
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                bail!(
                    "{}: no end after {} s, killed; output {lines:?}",
                    v.label,
                    RUN_CUTOFF.as_secs()
                );
            }
        }
    }
    let st = child.wait()?;
    let _ = reader.join();
    if !st.success() {
        bail!("{}: the tool failed ({st}), output {lines:?}", v.label);
    }
    let awake_at: i64 = num(&words(&lines, "awake")?, 0)?;
    if s2_to > awake_at {
        bail!(
            "{}: the second sample ended {:.0} ms after the target woke: the machine \
             is too loaded for this run (nothing measured the idle sleep)",
            v.label,
            (s2_to - awake_at) as f64 / 1e6
        );
    }
    if s1_from < idle_at {
        bail!("{}: the first sample came before the sleep", v.label);
    }
    let t = words(&lines, "t")?;
    let th = words(&lines, "th")?;
    let made = words(&lines, "calls")?;
    if num::<u64>(&t, 1)? != calls || num::<u64>(&th, 1)? != calls {
        bail!(
            "{}: the target did not make {calls} calls: {lines:?}",
            v.label
        );
    }
    let (h_calls, t_calls): (u64, u64) = (num(&made, 1)?, num(&made, 3)?);
    if h_calls != calls + 1 || t_calls != 2 * calls {
        bail!(
            "{}: the target counted {h_calls} `h` and {t_calls} `t`",
            v.label
        );
    }
    let h_runs: u64 = num(&words(&lines, "h_runs")?, 0)?;
    let want_h = if v.with_h { h_calls } else { 0 };
    if h_runs != want_h {
        bail!("{}: {h_runs} `h` handler runs, {want_h} expected", v.label);
    }
    let t_returns: u64 = num(&words(&lines, "t_returns")?, 0)?;
    let stats = words(&lines, "t_stats")?;
    let (hits, returns, missed): (u64, u64, u64) =
        (num(&stats, 1)?, num(&stats, 3)?, num(&stats, 5)?);
    if t_returns != t_calls || hits != t_calls || returns != t_calls || missed != 0 {
        bail!(
            "{}: {t_returns} return-handler runs, stats {stats:?}, for {t_calls} calls of `t`",
            v.label
        );
    }
    let exit = words(&lines, "target_exit")?;
    if exit != ["1", "0"] {
        bail!(
            "{}: the target did not exit 0: target_exit {exit:?}",
            v.label
        );
    }
    let mut total = 0;
    let mut by_thread = Vec::new();
    for (tid, (name, n)) in &second {
        let d = n - first.get(tid).map_or(0, |f| f.1);
        total += d;
        by_thread.push(format!("{name} {d}"));
    }
    let gone = first.keys().filter(|k| !second.contains_key(k)).count();
    if gone > 0 {
        by_thread.push(format!("({gone} ended)"));
    }
    Ok(Figures {
        t_us: num::<f64>(&t, 3)? / calls as f64 / 1e3,
        th_us: num::<f64>(&th, 3)? / calls as f64 / 1e3,
        switches: total,
        by_thread: by_thread.join(", "),
    })
}

/// The 1-, 5- and 15-minute load averages.
fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// The subcommand: `runs` rounds of every variant, the table of each run
/// and the medians.
pub fn run(calls: u64, runs: usize, window_ms: u64, baseline: Option<&Path>) -> Result<()> {
    if calls == 0 || runs == 0 || window_ms == 0 {
        bail!("--calls, --runs and --idle-ms must be at least 1");
    }
    let target = build("handlerwait_target", &["-O1", "-g"])?;
    let tool = build_tool(&build_capi()?, "handlerwait_tool")?;
    let mut variants = vec![Variant {
        label: "this build".into(),
        tool: tool.clone(),
        with_h: true,
    }];
    if let Some(b) = baseline {
        variants.push(Variant {
            label: "baseline".into(),
            tool: build_tool(b, "handlerwait_tool-baseline")?,
            with_h: true,
        });
    }
    variants.push(Variant {
        label: "this build, no probe on `h` (reference)".into(),
        tool,
        with_h: false,
    });
    let placed = placement_check(&target)?;
    let load_start = loadavg();
    let mut figs: Vec<Vec<Figures>> = variants.iter().map(|_| Vec::new()).collect();
    for r in 0..runs {
        // Each round starts with the next variant: no row always first.
        for k in 0..variants.len() {
            let i = (k + r) % variants.len();
            let f = one(&variants[i], &target, calls, window_ms)?;
            eprintln!(
                "run {} {}: t {:.1} µs, t+h {:.1} µs, {} switches ({})",
                r + 1,
                variants[i].label,
                f.t_us,
                f.th_us,
                f.switches,
                f.by_thread
            );
            figs[i].push(f);
        }
    }
    let load_end = loadavg();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "Serving handler calls of a traced process (issue 22): a C tool on the C API, \
         a pre handler on `h` and a return probe on `t`; {calls} calls, {runs} rounds \
         (the rows' runs alternate), the tool's context switches over {window_ms} ms of \
         the target's idle sleep; load average {load_start} at the start, {load_end} at \
         the end, {cpus} CPUs"
    );
    if let Some(b) = baseline {
        println!("baseline: the same tool linked against {}", b.display());
    }
    println!("placement (checked in a Rust session doing the same adds): {placed}");
    println!(
        "checked in every run: {} `h` handler runs for {} calls (0 in the reference), \
         {} `t` return-handler runs for {} calls, target and tool exit 0",
        calls + 1,
        calls + 1,
        2 * calls,
        2 * calls
    );
    println!();
    println!(
        "| run | tool | `t` alone, µs a call | `t` then `h`, µs an iteration | \
         tool's switches over the idle {window_ms} ms | by thread |"
    );
    println!("|---|---|---:|---:|---:|---|");
    for (v, fs) in variants.iter().zip(&figs) {
        for (r, f) in fs.iter().enumerate() {
            println!(
                "| {} | {} | {:.1} | {:.1} | {} | {} |",
                r + 1,
                v.label,
                f.t_us,
                f.th_us,
                f.switches,
                f.by_thread
            );
        }
    }
    let med = |fs: &[Figures]| {
        (
            median(fs.iter().map(|f| f.t_us).collect()),
            median(fs.iter().map(|f| f.th_us).collect()),
            median(fs.iter().map(|f| f.switches as f64).collect()),
        )
    };
    for (v, fs) in variants.iter().zip(&figs) {
        let (t, th, sw) = med(fs);
        println!(
            "| **median** | {} | {t:.1} | {th:.1} | {sw:.0} | |",
            v.label
        );
    }
    let (t, th, _) = med(&figs[0]);
    let (rt, rth, _) = med(&figs[variants.len() - 1]);
    println!();
    println!(
        "this build against the reference (no handler on `h`): `t` {:.2}×, `t` then `h` {:.2}×",
        t / rt,
        th / rth
    );
    if baseline.is_some() {
        let (bt, bth, bsw) = med(&figs[1]);
        println!(
            "this build against the baseline: `t` {:.3}×, `t` then `h` {:.3}×, switches {:.0} against {bsw:.0}",
            t / bt,
            th / bth,
            med(&figs[0]).2
        );
    }
    Ok(())
}
