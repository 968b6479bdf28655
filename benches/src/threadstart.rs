//! `hotprobe-bench threadstart` (issue 23): an 8-thread program's start
//! (benches/programs/threadstart.c: from before the first
//! `pthread_create` until every thread made its first call of `work`,
//! timed by the program itself, so the tracers' own start-up and exit are
//! left out) natively, under `hotprobe count work`, `hotprobe record work`
//! and `uftrace record -P work`, one round of every row at a time, medians
//! of `runs`. The hotprobe binary is target/release/hotprobe.

use anyhow::{bail, Context, Result};
use std::process::{Command, Stdio};

use crate::median;

/// The program's `start_ns` and `total_ns` from its output line
/// `threads N start_ns S total_ns T`.
fn times(out: &str) -> Result<(f64, f64)> {
    for line in out.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 6 && f[0] == "threads" && f[2] == "start_ns" && f[4] == "total_ns" {
            return Ok((f[3].parse()?, f[5].parse()?));
        }
    }
    bail!("no timing line in output: {out:?}")
}

fn run(cmd: &mut Command) -> Result<(f64, f64)> {
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

/// Prints one Markdown table: start and whole-loop times per row, and
/// the start as a multiple of native.
pub fn run_all(threads: u32, calls: u64, runs: usize) -> Result<()> {
    let hp = crate::hotprobe_bin()?;
    let bin = crate::build("threadstart", &["-O1", "-g", "-pthread"])?;
    let dir = bin.parent().context("bench-programs dir")?.to_path_buf();
    let trace = dir.join("threadstart-trace");
    let utrace = dir.join("threadstart-uftrace");
    let args = [threads.to_string(), calls.to_string()];
    let rows = [
        "native",
        "hotprobe count",
        "hotprobe record",
        "uftrace record -P work",
    ];
    let mut start: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    let mut total: Vec<Vec<f64>> = vec![Vec::new(); rows.len()];
    for _ in 0..runs {
        let mut cmds = [
            Command::new(&bin),
            Command::new(&hp),
            Command::new(&hp),
            Command::new("uftrace"),
        ];
        cmds[0].args(&args);
        cmds[1].args(["count", "work", "--"]).arg(&bin).args(&args);
        cmds[2]
            .args(["record", "--force", "-o"])
            .arg(&trace)
            .args(["work", "--"])
            .arg(&bin)
            .args(&args);
        cmds[3]
            .args(["record", "-d"])
            .arg(&utrace)
            .args(["-P", "work"])
            .arg(&bin)
            .args(&args);
        for (i, c) in cmds.iter_mut().enumerate() {
            let (s, t) = run(c)?;
            start[i].push(s);
            total[i].push(t);
        }
    }
    println!("| {threads} threads × {calls} calls | start ms | start × native | all joined ms |");
    println!("|---|---:|---:|---:|");
    let native = median(start[0].clone());
    for (i, name) in rows.iter().enumerate() {
        let s = median(start[i].clone());
        let t = median(total[i].clone());
        println!(
            "| {name} | {:.3} | {:.2} | {:.3} |",
            s / 1e6,
            s / native,
            t / 1e6
        );
    }
    Ok(())
}
