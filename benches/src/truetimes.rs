//! `hotprobe-bench truetimes` (issue 23, "true timings"): how close the
//! times `report` gives, with the calibrated probe costs taken out, come
//! to what the program measured itself. crates/hotprobe-cli/tests/
//! programs/true_times.c spins in busy_a and busy_b for durations it
//! measures (printing `spun busy_a NS`), with short functions s1 (3 bytes) and s2 (1 byte)
//! (only the in-process trap takes them) called between spins. Per run:
//! `hotprobe record`, then `report --json` and `report --json
//! --raw-times`; the table gives the medians of the busy functions' self
//! time against the program's own measure (the bound: within
//! 15 %) and of the short functions' average (the bound: within 1 µs of
//! native, a few ns). The hotprobe binary is target/release/hotprobe.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;

use crate::median;

/// `report --json` of `trace`: function → (self ns, avg ns).
fn report(hp: &Path, trace: &Path, raw: bool) -> Result<Vec<(String, f64, f64)>> {
    let mut c = Command::new(hp);
    c.args(["report", "--json"]).arg(trace);
    if raw {
        c.arg("--raw-times");
    }
    let out = c.output().context("hotprobe report")?;
    if !out.status.success() {
        bail!("report failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let rows = v["rows"].as_array().context("no rows")?;
    Ok(rows
        .iter()
        .filter_map(|r| {
            Some((
                r["function"].as_str()?.to_string(),
                r["self_ns"].as_f64()?,
                r["avg_ns"].as_f64()?,
            ))
        })
        .collect())
}

fn row<'a>(rows: &'a [(String, f64, f64)], f: &str) -> Result<&'a (String, f64, f64)> {
    rows.iter()
        .find(|r| r.0 == f)
        .with_context(|| format!("no row of {f}"))
}

/// Prints one Markdown table of medians over `runs` recordings.
pub fn run_all(runs: usize) -> Result<()> {
    let hp = crate::hotprobe_bin()?;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = root.join("../crates/hotprobe-cli/tests/programs/true_times.c");
    let bin = crate::build_source(&src, &["-O2", "-g", "-falign-functions=1"])?;
    let trace = bin.with_file_name("true_times-trace");
    // Per function: (measured by the program, corrected, raw) per run.
    let funcs = ["busy_a", "busy_b", "s1", "s2"];
    let mut got: Vec<[Vec<f64>; 3]> = vec![Default::default(); funcs.len()];
    for _ in 0..runs {
        let out = Command::new(&hp)
            .args(["record", "--force", "-o"])
            .arg(&trace)
            .arg("--")
            .arg(&bin)
            .output()
            .context("hotprobe record")?;
        if !out.status.success() {
            bail!("record failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let corrected = report(&hp, &trace, false)?;
        let raw = report(&hp, &trace, true)?;
        for (i, f) in funcs.iter().enumerate() {
            let busy = f.starts_with("busy");
            let spun = text
                .lines()
                .find_map(|l| l.strip_prefix(&format!("spun {f} ")))
                .map(str::parse::<f64>)
                .transpose()?;
            let (c, r) = (row(&corrected, f)?, row(&raw, f)?);
            // Busy functions: self time; short ones: the average call.
            let pick = |x: &(String, f64, f64)| if busy { x.1 } else { x.2 };
            got[i][0].push(spun.unwrap_or(0.0));
            got[i][1].push(pick(c));
            got[i][2].push(pick(r));
        }
    }
    println!("| function (medians of {runs}) | what | program measured | report | × measured | report --raw-times |");
    println!("|---|---|---:|---:|---:|---:|");
    for (i, f) in funcs.iter().enumerate() {
        let [m, c, r] = &got[i];
        let (m, c, r) = (median(m.clone()), median(c.clone()), median(r.clone()));
        if f.starts_with("busy") {
            println!(
                "| {f} | self µs | {:.1} | {:.1} | {:.3} | {:.1} |",
                m / 1e3,
                c / 1e3,
                c / m,
                r / 1e3
            );
        } else {
            println!("| {f} | avg ns a call | - | {c:.0} | - | {r:.0} |");
        }
    }
    Ok(())
}
