//! Massive probe counts (issue 14): a generated program with N distinct
//! functions, every one probed, for each mechanism (patch on a
//! `-fpatchable-function-entry=5` build, jump and trap on a plain build),
//! next to uftrace (`record -P .` on the patchable build, `record` of a
//! `-pg` build) and bpftrace (wildcard uprobe) in the same run.
//!
//! Per row: arm time (`Session::add` of `f_*`), detach time (every site
//! restored, the target stopped at its entry), the tracer's peak RSS over
//! the native one, the program's slowdown (its own timing of one call of
//! every function, `(i % 3) + 1` calls of `f_i`), and the cost of a hit of
//! one hot function with all N probes in (the program times 2,000,000
//! calls of `f_0`) — to compare with the same at N = 10. Each hotprobe
//! measurement runs in a child process of its own (`scale-one`), so that
//! its peak RSS is its own.

use anyhow::{bail, Context, Result};
use hotprobe::{Action, MechanismChoice, RunEnd, Session, SessionConfig, SpawnOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Calls of the hot function the program times (its first argument).
const HOT_CALLS: u64 = 2_000_000;
/// The same under the trap mechanism (a ptrace stop per call).
const HOT_CALLS_TRAP: u64 = 20_000;

/// The program's C source for `n` functions.
fn source(n: usize) -> String {
    let mut s = String::from(
        "#include <stdio.h>\n#include <stdlib.h>\n#include <time.h>\nvolatile unsigned long sink;\ntypedef void (*fn)(unsigned long);\n",
    );
    for i in 0..n {
        s.push_str(&format!(
            "__attribute__((noinline)) void f_{i}(unsigned long x) {{ sink += x ^ {i}u; }}\n"
        ));
    }
    s.push_str("static fn const table[] = {\n");
    for i in 0..n {
        s.push_str(&format!("f_{i},\n"));
    }
    s.push_str(&format!(
        r#"}};
static double now(void) {{ struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec * 1e9 + t.tv_nsec; }}
int main(int argc, char **argv) {{
  unsigned long calls = 0, hot_calls = argc > 1 ? strtoul(argv[1], 0, 10) : {HOT_CALLS};
  double t0 = now();
  for (unsigned long i = 0; i < {n}; i++)
    for (unsigned long j = 0; j <= i % 3; j++) {{ table[i](j); calls++; }}
  double t1 = now();
  fn volatile hot = table[0];
  for (unsigned long k = 0; k < hot_calls; k++) hot(k);
  double t2 = now();
  printf("calls %lu sink %lu\nall_ns %.0f\nhot_ns %.3f\n", calls, sink, t1 - t0, (t2 - t1) / hot_calls);
  return 0;
}}
"#
    ));
    s
}

/// The three builds of the program for `n` functions: (patchable, plain,
/// -pg), compiled side by side once (-O1, no debug information: minutes
/// otherwise at 200,000 functions).
fn programs(n: usize) -> Result<(PathBuf, PathBuf, PathBuf)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-programs");
    std::fs::create_dir_all(&dir)?;
    let src = dir.join(format!("scale{n}.c"));
    let body = source(n);
    if std::fs::read_to_string(&src).ok().as_deref() != Some(&body) {
        std::fs::write(&src, &body)?;
    }
    let builds = [
        ("pfe", &["-O1", "-fpatchable-function-entry=5"][..]),
        ("plain", &["-O1"][..]),
        ("pg", &["-O1", "-pg"][..]),
    ];
    let mut jobs = Vec::new();
    let mut outs = Vec::new();
    for (tag, flags) in builds {
        let out = dir.join(format!("scale{n}-{tag}"));
        outs.push(out.clone());
        let fresh = out.metadata().and_then(|m| m.modified()).ok()
            >= src.metadata().and_then(|m| m.modified()).ok();
        if out.exists() && fresh {
            continue;
        }
        eprintln!("compiling {}", out.display());
        jobs.push((
            Command::new("gcc")
                .args(flags)
                .arg("-o")
                .arg(&out)
                .arg(&src)
                .spawn()?,
            out,
        ));
    }
    for (mut j, out) in jobs {
        if !j.wait()?.success() {
            bail!("gcc failed for {}", out.display());
        }
    }
    Ok((outs[0].clone(), outs[1].clone(), outs[2].clone()))
}

/// What the program printed: (all_ns, hot_ns).
fn timings(out: &str) -> Result<(f64, f64)> {
    let get = |k: &str| -> Result<f64> {
        out.lines()
            .find_map(|l| l.strip_prefix(k))
            .context(format!("no {k} in the program's output: {out}"))?
            .trim()
            .parse()
            .context("a number")
    };
    Ok((get("all_ns ")?, get("hot_ns ")?))
}

/// Peak RSS (VmHWM) of this process, KiB.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// One measurement, in this (child) process: arms `f_*` (or the first
/// `limit` functions) on `bin` with `mech`, detaches at once (timed) in a
/// first session; arms again and runs to completion in a second one,
/// checking every count. Prints one line `arm_s detach_s rss_kib all_ns
/// hot_ns probes`.
pub fn one(bin: &Path, mech: &str, limit: Option<usize>) -> Result<()> {
    let mechanism = match mech {
        "patch" => MechanismChoice::Patch,
        "jump" => MechanismChoice::Jump,
        "trap" => MechanismChoice::Trap,
        _ => bail!("mechanism patch, jump or trap"),
    };
    let spec = "f_*";
    let hot_calls = if mech == "trap" {
        HOT_CALLS_TRAP
    } else {
        HOT_CALLS
    };
    let keep = |name: &str| match limit {
        None => true,
        Some(l) => name
            .strip_prefix("f_")
            .and_then(|i| i.parse::<usize>().ok())
            .is_some_and(|i| i < l),
    };
    let config = || SessionConfig {
        mechanism,
        ..SessionConfig::default()
    };
    let out_path = std::env::temp_dir().join(format!("hotprobe-scale-{}", std::process::id()));
    let spawn = |s: &mut Session| {
        let f = std::fs::File::create(&out_path)?;
        s.spawn_with(
            bin,
            &[hot_calls.to_string().into()],
            &SpawnOptions {
                stdout: Some(f),
                ..Default::default()
            },
        )
        .context("spawn")
    };
    // 1. Arm and detach, the target stopped at its entry throughout.
    let mut s = Session::with_config(config());
    let t = spawn(&mut s)?;
    let t0 = Instant::now();
    let added = s.add_filtered(t, spec, Action::Count, &keep)?;
    let arm = t0.elapsed();
    let probes = added.placements.len();
    if !added.skipped.is_empty() {
        bail!(
            "{} functions skipped, e.g. {:?}",
            added.skipped.len(),
            added.skipped[0]
        );
    }
    let t1 = Instant::now();
    s.detach()?;
    let detach = t1.elapsed();
    drop(s);
    // 2. Armed again, run to completion; every count checked.
    let mut s = Session::with_config(config());
    let t = spawn(&mut s)?;
    let added = s.add_filtered(t, spec, Action::Count, &keep)?;
    s.start()?;
    if s.run()? != RunEnd::AllExited {
        bail!("the run ended early");
    }
    for p in &added.placements {
        let f = p.function.as_deref().unwrap_or("");
        let i: u64 = f
            .strip_prefix("f_")
            .and_then(|i| i.parse().ok())
            .unwrap_or(0);
        let want = i % 3 + 1 + if i == 0 { hot_calls } else { 0 };
        let got = s.stats(p.id).map_or(0, |st| st.hits);
        if got != want {
            bail!("{f}: {got} hits, {want} calls");
        }
    }
    let rss = peak_rss_kib();
    let text = std::fs::read_to_string(&out_path)?;
    let _ = std::fs::remove_file(&out_path);
    let (all, hot) = timings(&text)?;
    println!(
        "{:.4} {:.4} {rss} {all} {hot} {probes}",
        arm.as_secs_f64(),
        detach.as_secs_f64()
    );
    Ok(())
}

/// A row of the table.
struct Row {
    n: usize,
    who: String,
    arm_s: Option<f64>,
    detach_s: Option<f64>,
    total_s: Option<f64>,
    rss_mib: Option<f64>,
    slowdown: Option<f64>,
    hot_ns: Option<f64>,
    note: String,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Runs `cmd` with a time limit; `None` when it was killed at the limit.
fn timed(mut cmd: Command, limit: Duration) -> Result<Option<(f64, String)>> {
    let t0 = Instant::now();
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null())
        .env("RUST_BACKTRACE", "0")
        .spawn()?;
    let out = child.stdout.take().context("stdout")?;
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = std::io::Read::read_to_string(&mut { out }, &mut s);
        s
    });
    loop {
        if let Some(st) = child.try_wait()? {
            let text = reader.join().unwrap_or_default();
            if !st.success() {
                let mut e = String::new();
                if let Some(mut er) = child.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut er, &mut e);
                }
                let first = e.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
                bail!("{:?} failed: {first}", cmd.get_args().collect::<Vec<_>>());
            }
            return Ok(Some((t0.elapsed().as_secs_f64(), text)));
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The whole benchmark: for each N, native, hotprobe's mechanisms,
/// uftrace and bpftrace; prints a markdown table.
pub fn run(ns: &[usize], runs: usize, cutoff: Duration, bpftrace_max: usize) -> Result<()> {
    let me = std::env::current_exe()?;
    let mut rows = Vec::new();
    for &n in ns {
        let (pfe, plain, pg) = programs(n)?;
        let native: Vec<(f64, f64, f64)> = (0..runs)
            .map(|_| -> Result<(f64, f64, f64)> {
                let (wall, out) = timed(Command::new(&plain), cutoff)?.context("native")?;
                let (all, hot) = timings(&out)?;
                Ok((wall, all, hot))
            })
            .collect::<Result<_>>()?;
        let native_all = median(native.iter().map(|x| x.1).collect());
        let native_hot = median(native.iter().map(|x| x.2).collect());
        rows.push(Row {
            n,
            who: "native (plain build)".into(),
            arm_s: None,
            detach_s: None,
            total_s: Some(median(native.iter().map(|x| x.0).collect())),
            rss_mib: None,
            slowdown: Some(1.0),
            hot_ns: Some(native_hot),
            note: String::new(),
        });
        // The per-hit cost with 10 probes, for the O(1) check.
        let mut cases: Vec<(&str, &Path, Option<usize>)> = vec![
            ("patch", &pfe, None),
            ("jump", &plain, None),
            ("trap", &plain, None),
        ];
        if n == ns[0] {
            cases.insert(0, ("patch", &pfe, Some(10)));
        }
        for (mech, bin, limit) in cases {
            let mut got = Vec::new();
            let mut note = String::new();
            for _ in 0..runs {
                let mut c = Command::new(&me);
                c.arg("scale-one").arg(bin).arg(mech);
                if let Some(l) = limit {
                    c.arg("--limit").arg(l.to_string());
                }
                match timed(c, cutoff) {
                    Err(e) => {
                        note = format!("{e:#}");
                        break;
                    }
                    Ok(None) => {
                        note = format!("cut off after {} s", cutoff.as_secs());
                        break;
                    }
                    Ok(Some((wall, out))) => {
                        let w: Vec<f64> = out
                            .split_whitespace()
                            .filter_map(|x| x.parse().ok())
                            .collect();
                        if w.len() != 6 {
                            bail!("scale-one printed {out:?}");
                        }
                        got.push((w, wall));
                    }
                }
            }
            let m =
                |k: usize| (!got.is_empty()).then(|| median(got.iter().map(|g| g.0[k]).collect()));
            rows.push(Row {
                n,
                who: format!(
                    "hotprobe {mech}{}",
                    limit.map_or(String::new(), |l| format!(" ({l} probes)"))
                ),
                arm_s: m(0),
                detach_s: m(1),
                total_s: (!got.is_empty()).then(|| median(got.iter().map(|g| g.1).collect())),
                rss_mib: m(2).map(|k| k / 1024.0),
                slowdown: m(3).map(|a| a / native_all),
                hot_ns: m(4),
                note,
            });
        }
        // uftrace: dynamic patching of the patchable build, and the -pg build.
        for (who, args, bin) in [
            ("uftrace record -P . (patchable)", vec!["-P", "."], &pfe),
            ("uftrace record (-pg build)", vec![], &pg),
        ] {
            let dir = std::env::temp_dir().join(format!("uftrace-scale-{}", std::process::id()));
            let mut walls = Vec::new();
            let mut slow = Vec::new();
            let mut note = String::new();
            for _ in 0..runs {
                let _ = std::fs::remove_dir_all(&dir);
                let mut c = Command::new("uftrace");
                c.arg("record").arg("-d").arg(&dir).args(&args).arg(bin);
                match timed(c, cutoff) {
                    Ok(Some((wall, out))) => {
                        walls.push(wall);
                        if let Ok((all, _)) = timings(&out) {
                            slow.push(all / native_all);
                        }
                    }
                    Ok(None) => {
                        note = format!("cut off after {} s", cutoff.as_secs());
                        break;
                    }
                    Err(e) => {
                        note = format!("failed: {e}");
                        break;
                    }
                }
            }
            let _ = std::fs::remove_dir_all(&dir);
            rows.push(Row {
                n,
                who: who.into(),
                arm_s: None,
                detach_s: None,
                total_s: (!walls.is_empty()).then(|| median(walls.clone())),
                rss_mib: None,
                slowdown: (!slow.is_empty()).then(|| median(slow.clone())),
                hot_ns: None,
                note,
            });
        }
        // bpftrace: one wildcard uprobe, BPFTRACE_MAX_PROBES raised; once,
        // and only up to `bpftrace_max` probes: past that it does not start
        // within minutes, and a bpftrace killed while the kernel attaches
        // or detaches its uprobes cannot be reaped before the kernel is done
        // (≈ 100 s per 1,000 uprobes here).
        if n > bpftrace_max {
            rows.push(Row {
                n,
                who: "bpftrace uprobe f_*".into(),
                arm_s: None,
                detach_s: None,
                total_s: None,
                rss_mib: None,
                slowdown: None,
                hot_ns: None,
                note: format!("not run: above --bpftrace-max {bpftrace_max}"),
            });
            continue;
        }
        let prog = format!("uprobe:{}:f_* {{ @ = count(); }}", plain.display());
        let mut c = Command::new("bpftrace");
        c.env("BPFTRACE_MAX_PROBES", (n + 16).to_string())
            .arg("-e")
            .arg(&prog)
            .arg("-c")
            .arg(&plain);
        let (total, slowdown, hot, note) = match timed(c, cutoff) {
            Ok(Some((wall, out))) => match timings(&out) {
                Ok((all, hot)) => (Some(wall), Some(all / native_all), Some(hot), String::new()),
                Err(_) => (Some(wall), None, None, "no program output".into()),
            },
            Ok(None) => (
                None,
                None,
                None,
                format!(
                    "cut off after {} s (not started or not finished)",
                    cutoff.as_secs()
                ),
            ),
            Err(e) => (None, None, None, format!("failed: {e}")),
        };
        rows.push(Row {
            n,
            who: "bpftrace uprobe f_*".into(),
            arm_s: None,
            detach_s: None,
            total_s: total,
            rss_mib: None,
            slowdown,
            hot_ns: hot,
            note,
        });
    }
    let f = |v: Option<f64>, d: usize| v.map_or("–".to_string(), |x| format!("{x:.d$}"));
    println!("| N | who | arm s | detach s | whole run s | tracer peak RSS MiB | all-functions pass × native | hot hit ns | note |");
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in rows {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.n,
            r.who,
            f(r.arm_s, 3),
            f(r.detach_s, 3),
            f(r.total_s, 2),
            f(r.rss_mib, 1),
            f(r.slowdown, 1),
            f(r.hot_ns, 2),
            r.note
        );
    }
    Ok(())
}
