//! `hotprobe-bench threadstart` (issue 23): an 8-thread program's start
//! (benches/programs/threadstart.c: from before the first
//! `pthread_create` until every thread made its first call of `work`,
//! timed by the program itself, so the tracers' own start-up and exit are
//! left out) natively, under `hotprobe count work`, `hotprobe record work`
//! and `uftrace record -P work`, one round of every row at a time,
//! quartiles of `runs` rounds. The hotprobe binary is
//! target/release/hotprobe; `--baseline PATH` adds the `count` and
//! `record` rows of another build in the same rounds; `--spin N` a native
//! row whose `work` first busy-waits N TSC cycles (a per-call cost alone:
//! with more threads than CPUs, the first threads' calls delay the later
//! ones' start).

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::{Command, Stdio};

/// What one run of the program printed (ns): start, all joined, the
/// threads' CPU time until their first call and in all, and main's CPU
/// time in its `pthread_create` loop.
struct Times {
    start: f64,
    total: f64,
    cpu_first: f64,
    cpu_all: f64,
    main_cpu: f64,
}

/// The program's line `threads N start_ns S total_ns T cpu_first_ns F
/// cpu_all_ns A main_cpu_ns M`.
fn times(out: &str) -> Result<Times> {
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 12
            && f[0] == "threads"
            && f[2] == "start_ns"
            && f[4] == "total_ns"
            && f[6] == "cpu_first_ns"
            && f[8] == "cpu_all_ns"
            && f[10] == "main_cpu_ns"
        {
            return Ok(Times {
                start: f[3].parse()?,
                total: f[5].parse()?,
                cpu_first: f[7].parse()?,
                cpu_all: f[9].parse()?,
                main_cpu: f[11].parse()?,
            });
        }
    }
    bail!("no timing line in output: {out:?}")
}

fn run(cmd: &mut Command) -> Result<Times> {
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .with_context(|| format!("{cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", out.status);
    }
    times(&String::from_utf8_lossy(&out.stdout))
}

/// Makes one row's command, afresh for each round.
type CommandFor<'a> = Box<dyn Fn() -> Command + 'a>;

/// The first quartile, median and third quartile of `v`.
fn quartiles(mut v: Vec<f64>) -> [f64; 3] {
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: usize| v[(v.len() - 1) * q / 4];
    [at(1), at(2), at(3)]
}

/// Prints one Markdown table: the start's quartiles per row, the
/// quartiles as multiples of native's in the same rounds, the median
/// whole-loop time, and the threads' CPU time (summed over the threads)
/// until their first call and in all, which a load changes little. Every round runs each row once, in turn, so a load
/// that comes and goes falls on every row alike; the first quartile is
/// the least disturbed figure. With `baseline` (another hotprobe binary)
/// its `count` and `record` rows run in the same rounds.
pub fn run_all(
    threads: u32,
    calls: u64,
    runs: usize,
    baseline: Option<&Path>,
    spin: Option<u64>,
) -> Result<()> {
    let hp = crate::hotprobe_bin()?;
    let bin = crate::build("threadstart", &["-O1", "-g", "-pthread"])?;
    let spun = spin
        .map(|n| {
            crate::build(
                "threadstart",
                &["-O1", "-g", "-pthread", &format!("-DSPIN={n}")],
            )
        })
        .transpose()?;
    let dir = bin.parent().context("bench-programs dir")?.to_path_buf();
    let trace = dir.join("threadstart-trace");
    let utrace = dir.join("threadstart-uftrace");
    let args = [threads.to_string(), calls.to_string()];
    let count = |hp: &Path| {
        let mut c = Command::new(hp);
        c.args(["count", "work", "--"]).arg(&bin).args(&args);
        c
    };
    let record = |hp: &Path| {
        let mut c = Command::new(hp);
        c.args(["record", "--force", "-o"])
            .arg(&trace)
            .args(["work", "--"])
            .arg(&bin)
            .args(&args);
        c
    };
    let native = |b: &Path| {
        let mut c = Command::new(b);
        c.args(&args);
        c
    };
    let mut rows: Vec<(String, CommandFor)> = vec![("native".into(), Box::new(|| native(&bin)))];
    if let (Some(n), Some(spun)) = (spin, &spun) {
        rows.push((
            format!("native, work + {n} TSC cycles"),
            Box::new(move || native(spun)),
        ));
    }
    rows.push(("hotprobe count".into(), Box::new(|| count(&hp))));
    rows.push(("hotprobe record".into(), Box::new(|| record(&hp))));
    if let Some(base) = baseline {
        rows.push(("baseline count".into(), Box::new(move || count(base))));
        rows.push(("baseline record".into(), Box::new(move || record(base))));
    }
    rows.push((
        "uftrace record -P work".into(),
        Box::new(|| {
            let mut c = Command::new("uftrace");
            c.args(["record", "-d"])
                .arg(&utrace)
                .args(["-P", "work"])
                .arg(&bin)
                .args(&args);
            c
        }),
    ));
    let mut runs_of: Vec<Vec<Times>> = (0..rows.len()).map(|_| Vec::new()).collect();
    for _ in 0..runs {
        for (i, (_, cmd)) in rows.iter().enumerate() {
            runs_of[i].push(run(&mut cmd())?);
        }
    }
    if let Some(base) = baseline {
        println!("baseline: {}", base.display());
    }
    println!(
        "| {threads} threads × {calls} calls, {runs} rounds | start ms q1 / median / q3 | × native q1 / median | all joined ms, median | threads' CPU µs to the first call / in all, medians | main's CPU µs creating them, median |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    let of = |i: usize, f: fn(&Times) -> f64| quartiles(runs_of[i].iter().map(f).collect());
    let native = of(0, |t| t.start);
    for (i, (name, _)) in rows.iter().enumerate() {
        let q = of(i, |t| t.start);
        println!(
            "| {name} | {:.3} / {:.3} / {:.3} | {:.2} / {:.2} | {:.3} | {:.0} / {:.0} | {:.0} |",
            q[0] / 1e6,
            q[1] / 1e6,
            q[2] / 1e6,
            q[0] / native[0],
            q[1] / native[1],
            of(i, |t| t.total)[1] / 1e6,
            of(i, |t| t.cpu_first)[1] / 1e3,
            of(i, |t| t.cpu_all)[1] / 1e3,
            of(i, |t| t.main_cpu)[1] / 1e3,
        );
    }
    Ok(())
}
