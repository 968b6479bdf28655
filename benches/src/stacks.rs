//! `hotprobe-bench stacks`: the cost per hit of `--stacks` (issue 24). A
//! jump counting `leaf` (`benches/programs/stacks.c`, `-O2
//! -fomit-frame-pointer`, 12 frames deep) with and without the stack walk
//! (the agent's generic trampoline, the walk over the `.eh_frame` rows,
//! the stack table), against native; each run checks that every hit was
//! counted and, with stacks, that all of them have the one stack.

use anyhow::{bail, Result};
use hotprobe::{Action, FastPathConfig, RunEnd, Session, SessionConfig, SpawnOptions};
use std::path::Path;

use crate::{build, loop_ns, median, pin, run_native};

fn run_one(bin: &Path, n: u64, stacks: bool) -> Result<f64> {
    let out = std::env::temp_dir().join(format!("hotprobe-bench-stacks-{}", std::process::id()));
    let f = std::fs::File::create(&out)?;
    let mut s = Session::with_config(SessionConfig {
        fast_path: FastPathConfig {
            stacks,
            ..FastPathConfig::default()
        },
        ..Default::default()
    });
    let t = s.spawn_with(
        bin,
        &[n.to_string().into()],
        &SpawnOptions {
            stdout: Some(f),
            ..Default::default()
        },
    )?;
    let a = s.add(t, "leaf", Action::Count)?;
    let id = a.placements[0].id;
    s.start()?;
    if s.run_with(&std::sync::atomic::AtomicBool::new(false), None)? != RunEnd::AllExited {
        bail!("run ended early");
    }
    let hits = s.stats(id).map(|st| st.hits).unwrap_or(0);
    if hits != n {
        bail!("expected {n} hits, saw {hits}");
    }
    if stacks {
        let Some((st, totals)) = s.stacks(id) else {
            bail!("no stacks region");
        };
        let want = ["c8", "c7", "c6", "c5", "c4", "c3", "c2", "c1", "main"];
        if st.len() != 1
            || st[0].count != n
            || st[0].frames.get(..9) != Some(&want.map(String::from)[..])
        {
            bail!("expected one stack of {n} hits through c8..c1, main: {st:?} {totals:?}");
        }
    }
    let text = std::fs::read_to_string(&out)?;
    let _ = std::fs::remove_file(&out);
    loop_ns(&text)
}

/// Runs the benchmark: `runs` runs of each row, `n` calls each; prints
/// a Markdown table (median ns per call, and per hit over native).
pub fn run(cpu: Option<usize>, n: u64, runs: usize) -> Result<()> {
    if let Some(c) = cpu {
        pin(c)?;
    }
    let bin = build("stacks", &["-O2", "-fomit-frame-pointer"])?;
    let mut rows: Vec<(&str, Vec<f64>)> = vec![
        ("native", Vec::new()),
        ("jump, count (stub)", Vec::new()),
        ("jump, count --stacks (agent walk)", Vec::new()),
    ];
    // Interleaved: a slow moment of the machine spreads over every row.
    for _ in 0..runs {
        rows[0].1.push(run_native(&bin, n)?);
        rows[1].1.push(run_one(&bin, n, false)?);
        rows[2].1.push(run_one(&bin, n, true)?);
    }
    let native = median(rows[0].1.clone());
    println!("stacks: {n} calls of leaf, 12 frames deep, median of {runs} runs");
    println!("| run | ns/call | spread | over native (ns) |");
    println!("|---|---:|---|---:|");
    for (name, v) in rows {
        let m = median(v.clone());
        let lo = v.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = v.iter().cloned().fold(0.0, f64::max);
        println!("| {name} | {m:.2} | {lo:.2}–{hi:.2} | {:.2} |", m - native);
    }
    Ok(())
}
