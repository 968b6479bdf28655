//! The SQLite workload of issue 14, every function probed: native,
//! `hotprobe count '*'` and `hotprobe record` (patchable build),
//! `uftrace record` (`-pg` build), in one run, medians of `runs`.
//!
//! The program is benches/programs/sqlite_insert.c (N rows inserted into an
//! in-memory table in one transaction, then read back) linked with SQLite's
//! amalgamation, `sqlite3.c` of the `libsqlite3-sys` crate (its `bundled`
//! copy, fetched into ~/.cargo/registry by `cargo fetch`; Debian ships no
//! amalgamation: libsqlite3-dev has headers and libraries only), built with
//! `-O2 -g -DSQLITE_THREADSAFE=0 -DSQLITE_OMIT_LOAD_EXTENSION` plus
//! `-fpatchable-function-entry=5` or `-pg`. The hotprobe binary is
//! target/release/hotprobe (`cargo build --release -p hotprobe-cli`).

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The `sqlite3` directory of the newest `libsqlite3-sys` in the cargo
/// registry.
fn amalgamation() -> Result<PathBuf> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .context("no CARGO_HOME or HOME")?;
    let mut found = Vec::new();
    for index in std::fs::read_dir(home.join("registry/src"))? {
        for krate in std::fs::read_dir(index?.path())? {
            let p = krate?.path();
            let name = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .into_owned();
            if name.starts_with("libsqlite3-sys-") && p.join("sqlite3/sqlite3.c").exists() {
                found.push(p.join("sqlite3"));
            }
        }
    }
    found.sort();
    found.pop().context(
        "no libsqlite3-sys with a bundled sqlite3.c in ~/.cargo/registry: run `cargo fetch` \
         in a crate depending on libsqlite3-sys = { version = \"0.30\", features = [\"bundled\"] }",
    )
}

/// The driver linked with the amalgamation, both built with `flags`
/// (cached under target/bench-programs).
fn build(flags: &[&str], tag: &str) -> Result<PathBuf> {
    let sq = amalgamation()?;
    let dir = root().join("target/bench-programs");
    std::fs::create_dir_all(&dir)?;
    let obj = dir.join(format!("sqlite3-{tag}.o"));
    let exe = dir.join(format!("sqlite_insert-{tag}"));
    let base = [
        "-O2",
        "-g",
        "-DSQLITE_THREADSAFE=0",
        "-DSQLITE_OMIT_LOAD_EXTENSION",
    ];
    let inc = format!("-I{}", sq.display());
    if !obj.exists() {
        eprintln!("building {} ({tag}), a few minutes", obj.display());
        let st = Command::new("gcc")
            .args(base)
            .args(flags)
            .arg(&inc)
            .arg("-c")
            .arg(sq.join("sqlite3.c"))
            .arg("-o")
            .arg(&obj)
            .status()?;
        if !st.success() {
            bail!("gcc failed on sqlite3.c");
        }
    }
    let st = Command::new("gcc")
        .args(base)
        .args(flags)
        .arg(&inc)
        .arg(root().join("benches/programs/sqlite_insert.c"))
        .arg(&obj)
        .arg("-o")
        .arg(&exe)
        .arg("-lm")
        .status()?;
    if !st.success() {
        bail!("gcc failed on sqlite_insert.c");
    }
    Ok(exe)
}

/// Runs `cmd` with `args` in `cwd`, stdout captured; (seconds, stdout, stderr).
fn timed(cmd: &Path, args: &[String], cwd: &Path) -> Result<(f64, String, String)> {
    let t = Instant::now();
    let out = Command::new(cmd)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("running {}", cmd.display()))?;
    let secs = t.elapsed().as_secs_f64();
    let (o, e) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    if !out.status.success() {
        bail!("{} {args:?}: {}\n{e}", cmd.display(), out.status);
    }
    Ok((secs, o, e))
}

/// The first number after `key` in `text`.
fn number_after(text: &str, key: &str) -> Option<u64> {
    let rest = &text[text.find(key)? + key.len()..];
    let digits: String = rest
        .trim_start()
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// Bytes of the files under `dir` whose name ends with `ext`.
fn bytes_of(dir: &Path, ext: &str) -> Result<u64> {
    let mut n = 0;
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        if e.file_name().to_string_lossy().ends_with(ext) {
            n += e.metadata()?.len();
        }
    }
    Ok(n)
}

struct Row {
    what: String,
    secs: Vec<f64>,
    lost: String,
    bytes_per_call: String,
}

/// The benchmark: `rows` rows, `runs` runs of each row of the table.
pub fn sqlite(rows: u64, runs: usize) -> Result<()> {
    let hotprobe = root().join("target/release/hotprobe");
    if !hotprobe.exists() {
        bail!(
            "no {}: cargo build --release -p hotprobe-cli",
            hotprobe.display()
        );
    }
    let pfe = build(&["-fpatchable-function-entry=5"], "pfe")?;
    let pg = build(&["-pg"], "pg")?;
    let work = std::env::temp_dir().join(format!("hotprobe-bench-sqlite-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let n = rows.to_string();
    let (_, expected, _) = timed(&pfe, std::slice::from_ref(&n), &work)?;
    let mut table = [
        Row {
            what: "native (patchable build)".into(),
            secs: vec![],
            lost: "—".into(),
            bytes_per_call: "—".into(),
        },
        Row {
            what: "native (-pg build)".into(),
            secs: vec![],
            lost: "—".into(),
            bytes_per_call: "—".into(),
        },
        Row {
            what: "`hotprobe count '*'`".into(),
            secs: vec![],
            lost: "—".into(),
            bytes_per_call: "—".into(),
        },
        Row {
            what: "`hotprobe record`".into(),
            secs: vec![],
            lost: String::new(),
            bytes_per_call: String::new(),
        },
        Row {
            what: "`uftrace record`".into(),
            secs: vec![],
            lost: String::new(),
            bytes_per_call: String::new(),
        },
    ];
    let mut calls = 0u64;
    for run in 0..runs {
        eprintln!("run {}/{runs}", run + 1);
        let (s, _, _) = timed(&pfe, std::slice::from_ref(&n), &work)?;
        table[0].secs.push(s);
        let (s, _, _) = timed(&pg, std::slice::from_ref(&n), &work)?;
        table[1].secs.push(s);

        let args: Vec<String> = ["count", "--json", "*", "--"]
            .iter()
            .map(|s| s.to_string())
            .chain([pfe.display().to_string(), n.clone()])
            .collect();
        let (s, out, _) = timed(&hotprobe, &args, &work)?;
        if !out.starts_with(&expected) {
            bail!("count changed the program's output");
        }
        // Every call counted: the sum of the hits.
        let json = &out[expected.len()..];
        calls = json
            .split("\"hits\":")
            .skip(1)
            .filter_map(|p| {
                p.split(|c: char| !c.is_ascii_digit())
                    .next()?
                    .parse::<u64>()
                    .ok()
            })
            .sum();
        table[2].secs.push(s);

        let trace = work.join("hotprobe.data");
        let _ = std::fs::remove_dir_all(&trace);
        let args: Vec<String> = ["record", "-o"]
            .iter()
            .map(|s| s.to_string())
            .chain([
                trace.display().to_string(),
                "--".into(),
                pfe.display().to_string(),
                n.clone(),
            ])
            .collect();
        let (s, out, err) = timed(&hotprobe, &args, &work)?;
        if out != expected {
            bail!("record changed the program's output");
        }
        let events = number_after(&err, "events:").context("no events: line")?;
        let drops = number_after(&err, "drops:").context("no drops: line")?;
        let bytes = bytes_of(&trace, ".hpt")?;
        table[3].secs.push(s);
        table[3].lost = format!("{drops} of {events} events");
        table[3].bytes_per_call = format!("{:.2}", bytes as f64 / (events as f64 / 2.0));

        let udata = work.join("uftrace.data");
        let _ = std::fs::remove_dir_all(&udata);
        let args: Vec<String> = vec![
            "record".into(),
            "-d".into(),
            udata.display().to_string(),
            pg.display().to_string(),
            n.clone(),
        ];
        let (s, out, err) = timed(Path::new("uftrace"), &args, &work)?;
        if out != expected {
            bail!("uftrace changed the program's output");
        }
        let lost: u64 = err
            .lines()
            .filter(|l| l.contains("LOST"))
            .filter_map(|l| number_after(l, "LOST"))
            .sum();
        table[4].secs.push(s);
        table[4].lost = format!("{lost} (LOST records reported)");
        table[4].bytes_per_call = format!(
            "{:.2}",
            bytes_of(&udata, ".dat")? as f64 / calls.max(1) as f64
        );
    }
    // Every ratio is over the patchable build run natively: the program
    // without any tracer (a -pg build runs glibc's gprof `mcount` even
    // natively, and writes gmon.out).
    let native = super::median(table[0].secs.clone());
    println!(
        "SQLite insert of {rows} rows, every function ({calls} calls counted), median of {runs}:\n"
    );
    println!("| run | wall time | × native | events lost | bytes per call |");
    println!("|---|---:|---:|---|---:|");
    for r in &table {
        let m = super::median(r.secs.clone());
        println!(
            "| {} | {m:.3} s | {:.2} | {} | {} |",
            r.what,
            m / native,
            r.lost,
            r.bytes_per_call
        );
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(())
}
