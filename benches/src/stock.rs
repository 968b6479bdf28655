//! Debian's own binaries, every library function (issue 23): `sqlite3`
//! with `'libsqlite3.so.0:*'` on a 200,000-row database and `jq` with
//! `'libjq.so.1:*'` on a generated JSON array, each run natively, under
//! `hotprobe count`, `hotprobe record` and `uftrace record -P
//! '.@LIB'`, in one run, one after the other per round (so that a
//! change in the machine's load touches every row alike), whole-run wall
//! times, medians of `runs`. Each run's output is checked against the
//! native one. The hotprobe binary is target/release/hotprobe.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// One workload: the program, its arguments, the library pattern.
struct Workload {
    name: &'static str,
    program: &'static str,
    args: Vec<String>,
    lib: &'static str,
}

fn sqlite_db(dir: &Path, rows: u64) -> Result<PathBuf> {
    let db = dir.join(format!("stock-{rows}.db"));
    if db.exists() {
        return Ok(db);
    }
    let tmp = dir.join(format!("stock-{rows}.db.tmp"));
    let _ = std::fs::remove_file(&tmp);
    let sql = format!(
        "CREATE TABLE t(a INTEGER, b TEXT); WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL \
         SELECT x + 1 FROM c WHERE x < {rows}) INSERT INTO t SELECT x, hex(x * 7919) FROM c;"
    );
    let st = Command::new("sqlite3").arg(&tmp).arg(sql).status()?;
    if !st.success() {
        bail!("sqlite3 could not build {}", tmp.display());
    }
    std::fs::rename(&tmp, &db)?;
    Ok(db)
}

fn jq_input(dir: &Path, n: u64) -> Result<PathBuf> {
    let p = dir.join(format!("stock-{n}.json"));
    if p.exists() {
        return Ok(p);
    }
    let mut s = String::from("[");
    for i in 0..n {
        if i > 0 {
            s.push(',');
        }
        s.push_str(&format!(
            "{{\"a\":{i},\"b\":\"item{}\",\"c\":[{},{}]}}",
            i * 7,
            i % 13,
            i % 17
        ));
    }
    s.push(']');
    std::fs::write(&p, s)?;
    Ok(p)
}

/// Wall time of one run of `cmd`, its stdout.
fn run(cmd: &mut Command) -> Result<(f64, Vec<u8>)> {
    let t0 = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .with_context(|| format!("{cmd:?}"))?;
    let secs = t0.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", out.status);
    }
    Ok((secs, out.stdout))
}

/// `hotprobe-bench stock`: prints one Markdown table.
pub fn run_all(rows: u64, runs: usize) -> Result<()> {
    let hp = crate::hotprobe_bin()?;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/bench-programs");
    std::fs::create_dir_all(&dir)?;
    let db = sqlite_db(&dir, rows)?;
    let json = jq_input(&dir, rows / 2)?;
    let workloads = [
        Workload {
            name: "sqlite3",
            program: "sqlite3",
            args: vec![
                db.display().to_string(),
                "SELECT count(*), sum(a), max(b) FROM t WHERE b LIKE '%A%'; \
                 SELECT a, b FROM t ORDER BY b DESC LIMIT 3;"
                    .into(),
            ],
            lib: "libsqlite3.so.0",
        },
        Workload {
            name: "jq",
            program: "jq",
            args: vec![
                "[.[] | select(.a % 3 == 0) | {k: .b, s: (.c | add)}] | length".into(),
                json.display().to_string(),
            ],
            lib: "libjq.so.1",
        },
    ];
    let trace = dir.join("stock-trace");
    let utrace = dir.join("stock-uftrace");
    println!(
        "| workload | native s | hotprobe count s | hotprobe record s | uftrace record s | \
         record / uftrace |"
    );
    println!("|---|---|---|---|---|---|");
    for w in &workloads {
        let native_out = run(Command::new(w.program).args(&w.args))?.1;
        let pattern = format!("{}:*", w.lib);
        let mut t = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
        for _ in 0..runs {
            let mut cmds = [
                Command::new(w.program),
                Command::new(&hp),
                Command::new(&hp),
                Command::new("uftrace"),
            ];
            cmds[0].args(&w.args);
            cmds[1]
                .args(["count", &pattern, "--", w.program])
                .args(&w.args);
            cmds[2]
                .args(["record", "--force", "-o"])
                .arg(&trace)
                .args([&pattern, "--", w.program])
                .args(&w.args);
            cmds[3]
                .args(["record", "--force", "-d"])
                .arg(&utrace)
                .arg("-P")
                .arg(format!(".@{}", w.lib))
                .arg(w.program)
                .args(&w.args);
            for (i, c) in cmds.iter_mut().enumerate() {
                let (secs, out) = run(c)?;
                // count prints its table after the program's output.
                if !out.starts_with(&native_out) {
                    bail!("{}: row {i} changed the program's output", w.name);
                }
                t[i].push(secs);
            }
        }
        let m: Vec<f64> = t.iter().map(|v| crate::median(v.clone())).collect();
        println!(
            "| {} ({}) | {:.3} | {:.3} | {:.3} | {:.3} | {:.2} |",
            w.name,
            w.lib,
            m[0],
            m[1],
            m[2],
            m[3],
            m[2] / m[3]
        );
    }
    let _ = std::fs::remove_dir_all(&trace);
    let _ = std::fs::remove_dir_all(&utrace);
    Ok(())
}
