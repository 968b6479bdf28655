//! Trace size and recording speed: `hotprobe record` (with and without
//! aggregation) next to `uftrace record` on the same workloads, in one run.
//!
//! Workloads (sources in `examples/bench_trace/`, built here with gcc -O2;
//! `-fpatchable-function-entry=5` for hotprobe's patch mechanism, `-pg`
//! for uftrace):
//! * `loop`: the iProbe loop, an empty function called N times (`--n`,
//!   default 10^7) — every function of the program recorded;
//! * `calc`: an expression generator, tokenizer, recursive-descent parser
//!   and tree evaluator over `--exprs` expressions (default 20 000, ≈ 4.6 M
//!   calls of 15 functions nested up to ≈ 20 deep) — every function recorded.
//!
//! Per row: function events recorded, bytes of the event streams (hotprobe:
//! `tid-*.hpt`; uftrace: its per-thread `.dat` files), bytes per event,
//! events per second of wall time of the whole `record` command (start-up,
//! probes, calibration and finishing included), the workload's own time per
//! call (timed inside the program, so tracer start-up is not in it) and
//! drops. Nothing is pinned: the tracer and the target share the 2+ CPUs.
//!
//! Command (from the workspace root; needs gcc and uftrace):
//!
//! ```text
//! cargo build --release -p hotprobe-cli && \
//!   cargo run --release -p hotprobe-cli --example bench_trace -- [--n 10000000] [--exprs 20000] [--reps 3]
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn work_dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("hotprobe-bench-trace-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn compile(d: &Path, src: &str, tag: &str, flags: &[&str]) -> Res<PathBuf> {
    let out = d.join(format!("{src}-{tag}"));
    let st = Command::new("gcc")
        .args(flags)
        .arg(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("examples/bench_trace")
                .join(format!("{src}.c")),
        )
        .arg("-o")
        .arg(&out)
        .status()?;
    if !st.success() {
        return Err(format!("gcc {flags:?} {src}.c failed").into());
    }
    Ok(out)
}

/// `target/<profile>/hotprobe`, beside `target/<profile>/examples/`.
fn hotprobe_bin() -> Res<PathBuf> {
    let exe = std::env::current_exe()?;
    let p = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("hotprobe"))
        .ok_or("no parent directory")?;
    if !p.is_file() {
        return Err(format!(
            "{} not found: build it first (cargo build --release -p hotprobe-cli)",
            p.display()
        )
        .into());
    }
    Ok(p)
}

/// The program's own time per unit (`<ns> ns/...`).
fn own_ns(out: &str) -> Option<f64> {
    out.lines()
        .find(|l| l.contains(" ns/"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

struct Row {
    workload: String,
    tracer: String,
    events: u64,
    bytes: u64,
    /// Median over the runs of events / wall seconds.
    rate: f64,
    own_ns: f64,
    drops: String,
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn native(bin: &Path, arg: &str, reps: usize) -> Res<f64> {
    let mut ns = Vec::new();
    for _ in 0..reps {
        let o = Command::new(bin).arg(arg).output()?;
        ns.push(own_ns(&String::from_utf8_lossy(&o.stdout)).ok_or("no timing")?);
    }
    Ok(median(&mut ns))
}

fn hotprobe(
    hp: &Path,
    bin: &Path,
    arg: &str,
    aggregate: bool,
    reps: usize,
    d: &Path,
) -> Res<(u64, u64, f64, f64, String)> {
    let dir = d.join("hp.trace");
    let (mut rates, mut ns) = (Vec::new(), Vec::new());
    let mut last = (0, 0, String::new());
    for _ in 0..reps {
        let _ = std::fs::remove_dir_all(&dir);
        let mut c = Command::new(hp);
        c.arg("record").arg("-o").arg(&dir);
        if !aggregate {
            c.arg("--no-aggregate");
        }
        let t0 = Instant::now();
        let o = c.arg("--").arg(bin).arg(arg).output()?;
        let wall = t0.elapsed().as_secs_f64();
        let err = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() {
            return Err(format!("hotprobe record failed: {err}").into());
        }
        ns.push(own_ns(&String::from_utf8_lossy(&o.stdout)).ok_or("no timing")?);
        let info: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("info.json"))?)?;
        let st = &info["stats"];
        let drops = err
            .lines()
            .find_map(|l| l.trim().strip_prefix("drops:"))
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or("?")
            .to_string();
        last = (
            st["events_out"].as_u64().ok_or("no events_out")?,
            st["bytes"].as_u64().ok_or("no bytes")?,
            drops,
        );
        rates.push(last.0 as f64 / wall);
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok((last.0, last.1, median(&mut rates), median(&mut ns), last.2))
}

fn uftrace(bin: &Path, arg: &str, reps: usize, d: &Path) -> Res<(u64, u64, f64, f64, String)> {
    let dir = d.join("uftrace.data");
    let (mut rates, mut ns) = (Vec::new(), Vec::new());
    let mut last = (0, 0);
    for _ in 0..reps {
        let _ = std::fs::remove_dir_all(&dir);
        let t0 = Instant::now();
        let o = Command::new("uftrace")
            .args(["record", "--no-libcall", "-d"])
            .arg(&dir)
            .arg(bin)
            .arg(arg)
            .output()?;
        let wall = t0.elapsed().as_secs_f64();
        if !o.status.success() {
            return Err(format!(
                "uftrace record failed: {}",
                String::from_utf8_lossy(&o.stderr)
            )
            .into());
        }
        ns.push(own_ns(&String::from_utf8_lossy(&o.stdout)).ok_or("no timing")?);
        // Per-thread event files are `<TID>.dat` (perf-cpu*.dat hold
        // kernel scheduling events, left out).
        let mut bytes = 0;
        for e in std::fs::read_dir(&dir)? {
            let p = e?.path();
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            if name.ends_with(".dat") && name.starts_with(|c: char| c.is_ascii_digit()) {
                bytes += std::fs::metadata(&p)?.len();
            }
        }
        // Events: calls in `uftrace report` (its own functions, not
        // `linux:` scheduling entries), an entry and an exit each.
        let rep = Command::new("uftrace")
            .args(["report", "-d"])
            .arg(&dir)
            .output()?;
        let mut calls = 0u64;
        for l in String::from_utf8_lossy(&rep.stdout).lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() >= 2 && !f[f.len() - 1].starts_with("linux:") {
                if let Ok(c) = f[f.len() - 2].parse::<u64>() {
                    calls += c;
                }
            }
        }
        last = (2 * calls, bytes);
        rates.push(last.0 as f64 / wall);
    }
    let _ = std::fs::remove_dir_all(&dir);
    let v = Command::new("uftrace")
        .arg("--version")
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .nth(1)
                .unwrap_or("")
                .to_string()
        })
        .unwrap_or_default();
    Ok((last.0, last.1, median(&mut rates), median(&mut ns), v))
}

fn arg_of(args: &[String], name: &str, default: u64) -> Res<u64> {
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(args.get(i + 1).ok_or("missing value")?.parse()?),
        None => Ok(default),
    }
}

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let n = arg_of(&args, "--n", 10_000_000)?;
    let exprs = arg_of(&args, "--exprs", 20_000)?;
    let reps = arg_of(&args, "--reps", 1)?.max(1) as usize;
    let hp = hotprobe_bin()?;
    let d = work_dir();
    let mut rows = Vec::new();
    for (src, arg, unit) in [
        ("loop", n.to_string(), "call"),
        ("calc", exprs.to_string(), "expr"),
    ] {
        let plain = compile(&d, src, "pfe", &["-O2", "-fpatchable-function-entry=5"])?;
        let pg = compile(&d, src, "pg", &["-O2", "-pg"])?;
        let label = format!("{src} {arg}");
        let nat = native(&plain, &arg, reps)?;
        rows.push(Row {
            workload: label.clone(),
            tracer: "native (no tracing)".into(),
            events: 0,
            bytes: 0,
            rate: 0.0,
            own_ns: nat,
            drops: "-".into(),
        });
        for aggregate in [true, false] {
            let (events, bytes, rate, own, drops) =
                hotprobe(&hp, &plain, &arg, aggregate, reps, &d)?;
            rows.push(Row {
                workload: label.clone(),
                tracer: format!(
                    "hotprobe record{}",
                    if aggregate { "" } else { " --no-aggregate" }
                ),
                events,
                bytes,
                rate,
                own_ns: own,
                drops,
            });
        }
        let (events, bytes, rate, own, v) = uftrace(&pg, &arg, reps, &d)?;
        rows.push(Row {
            workload: label.clone(),
            tracer: format!("uftrace {v} record --no-libcall (-pg)"),
            events,
            bytes,
            rate,
            own_ns: own,
            drops: "-".into(),
        });
        eprintln!("{src}: done ({unit})");
    }
    let _ = std::fs::remove_dir_all(&d);
    println!(
        "| workload | tracer | events | stream bytes | bytes/event | events/s (wall of `record`) | workload's own ns per call/expr | drops |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let (bpe, eps) = if r.events == 0 {
            ("-".to_string(), "-".to_string())
        } else {
            (
                format!("{:.2}", r.bytes as f64 / r.events as f64),
                format!("{:.2} M", r.rate / 1e6),
            )
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {:.1} | {} |",
            r.workload,
            r.tracer,
            if r.events == 0 {
                "-".into()
            } else {
                r.events.to_string()
            },
            if r.bytes == 0 {
                "-".into()
            } else {
                r.bytes.to_string()
            },
            bpe,
            eps,
            r.own_ns,
            r.drops
        );
    }
    println!(
        "\nevents/s and the workload's own time: median of {reps} run(s); events, bytes and \
         drops: the last run. Command: cargo build --release -p hotprobe-cli && \
         cargo run --release -p hotprobe-cli --example bench_trace -- --n {n} --exprs {exprs} --reps {reps}"
    );
    Ok(())
}
