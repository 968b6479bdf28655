//! Per-hit cost of a handler written in Rust, C and Python on the same
//! probe (a pre probe on `body` of the iProbe loop, `lea; ret`, the
//! handler counting hits), next to Frida's Interceptor with a JS `onEnter`
//! handler, in one run. Each handler's count is checked against the calls
//! made. (`empty`, a lone `ret`, is too short for Frida's Interceptor.)

use crate::{build, loop_ns, median, pin};
use anyhow::{bail, Context, Result};
use hotprobe::{Action, Probe, RunEnd, Session, SpawnOptions};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::rc::Rc;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Rust handler: a closure counting hits, placed as the C and Python
/// APIs place theirs (`Session::add` with `Action::Handler`: the cheapest
/// mechanism), or on the ptrace trap (`Session::probe`).
fn rust(bin: &Path, n: u64, ptrace: bool) -> Result<f64> {
    let out = std::env::temp_dir().join(format!("hotprobe-bench-h-{}", std::process::id()));
    let f = std::fs::File::create(&out)?;
    let mut s = Session::new();
    let args = [n.to_string().into(), "body".into()];
    let t = s.spawn_with(
        bin,
        &args,
        &SpawnOptions {
            stdout: Some(f),
            ..Default::default()
        },
    )?;
    let hits = Rc::new(Cell::new(0u64));
    let h = hits.clone();
    let probe = Probe::new().pre(move |_| h.set(h.get() + 1));
    if ptrace {
        s.probe(t, "body", probe)?;
    } else {
        s.add(t, "body", Action::Handler(probe))?;
    }
    s.start()?;
    if s.run()? != RunEnd::AllExited {
        bail!("run ended early");
    }
    if hits.get() != n {
        bail!("Rust handler: expected {n} hits, saw {}", hits.get());
    }
    let text = std::fs::read_to_string(&out)?;
    let _ = std::fs::remove_file(&out);
    loop_ns(&text)
}

/// A driver printing the loop's line and `hits N`: ns per hit, the count
/// checked.
fn driver(mut cmd: Command, n: u64, what: &str) -> Result<f64> {
    let o = cmd.output().with_context(|| format!("running {what}"))?;
    let text = String::from_utf8_lossy(&o.stdout);
    if !o.status.success() {
        bail!(
            "{what} failed: {}\n{text}{}",
            o.status,
            String::from_utf8_lossy(&o.stderr)
        );
    }
    let hits = text
        .lines()
        .find_map(|l| l.strip_prefix("hits "))
        .and_then(|v| v.trim().parse::<u64>().ok());
    if hits != Some(n) {
        bail!("{what}: expected hits {n}, output {text:?}");
    }
    loop_ns(&text)
}

/// Builds the C API library in release (`cargo build --release -p
/// hotprobe-capi`) and returns the directory of `libhotprobe_c.so`.
pub(crate) fn build_capi() -> Result<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let st = Command::new(cargo)
        .args(["build", "--release", "--locked", "-p", "hotprobe-capi"])
        .current_dir(root())
        .status()
        .context("cargo build -p hotprobe-capi")?;
    if !st.success() {
        bail!("cargo build --release -p hotprobe-capi failed");
    }
    Ok(root().join("target/release"))
}

/// The C driver (benches/programs/c_handler.c) built against the release
/// libhotprobe_c through pkg-config.
fn build_c() -> Result<PathBuf> {
    build_capi()?;
    let pc = Command::new("pkg-config")
        .args(["--cflags", "--libs", "hotprobe"])
        .env("PKG_CONFIG_PATH", root().join("target/release"))
        .output()
        .context("pkg-config")?;
    if !pc.status.success() {
        bail!(
            "pkg-config hotprobe: {}",
            String::from_utf8_lossy(&pc.stderr)
        );
    }
    let flags = String::from_utf8_lossy(&pc.stdout).into_owned();
    let out = root().join("target/bench-programs/c_handler");
    std::fs::create_dir_all(out.parent().unwrap())?;
    let st = Command::new("gcc")
        .args(["-O2", "-o"])
        .arg(&out)
        .arg(root().join("benches/programs/c_handler.c"))
        .args(flags.split_whitespace())
        .status()?;
    if !st.success() {
        bail!("gcc c_handler.c failed");
    }
    Ok(out)
}

/// The untraced loop calling `body`.
fn run_native_body(bin: &Path, n: u64) -> Result<f64> {
    let out = Command::new(bin).arg(n.to_string()).arg("body").output()?;
    loop_ns(&String::from_utf8_lossy(&out.stdout))
}

fn python_ok(py: &Path, module: &str) -> bool {
    Command::new(py)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

pub fn run(cpu: Option<usize>, hits: u64, runs: usize) -> Result<()> {
    if let Some(c) = cpu {
        pin(c)?;
    }
    let bin = build("loop", &["-O2"])?;
    let cdrv = build_c()?;
    let native = median(
        (0..runs)
            .map(|_| run_native_body(&bin, 100_000_000))
            .collect::<Result<_>>()?,
    );
    let mut rows: Vec<(String, f64)> = vec![("native call".into(), native)];
    let mut row = |name: &str, f: &mut dyn FnMut() -> Result<f64>| -> Result<f64> {
        let v = median((0..runs).map(|_| f()).collect::<Result<_>>()?);
        eprintln!("{name}: {v:.0} ns/hit");
        rows.push((name.into(), v));
        Ok(v)
    };
    let n = hits.to_string();
    row("hotprobe, Rust handler (closure)", &mut || {
        rust(&bin, hits, false)
    })?;
    row(
        "hotprobe, Rust handler on the ptrace trap (`Session::probe`)",
        &mut || rust(&bin, hits, true),
    )?;
    row("hotprobe, C handler (C API)", &mut || {
        let mut c = Command::new(&cdrv);
        c.arg("body").arg(&bin).arg(&n).arg("body");
        driver(c, hits, "c_handler")
    })?;
    let py = root().join(".venv/bin/python");
    let mut py_ns = None;
    if python_ok(&py, "hotprobe") {
        py_ns = Some(row(
            "hotprobe, Python handler (hotprobe package)",
            &mut || {
                let mut c = Command::new(&py);
                c.arg(root().join("benches/programs/py_handler.py"))
                    .arg("body")
                    .arg(&bin)
                    .args([n.as_str(), "body"]);
                driver(c, hits, "py_handler.py")
            },
        )?);
    } else {
        eprintln!("no hotprobe package in .venv (./scripts/setup.sh): Python row left out");
    }
    let fpy = root().join(".cache/peers-venv/bin/python3");
    let mut frida_ns = None;
    if python_ok(&fpy, "frida") {
        // Frida finds `body` through the symbol table (DebugSymbol).
        frida_ns = Some(row("Frida Interceptor, JS onEnter handler", &mut || {
            let mut c = Command::new(&fpy);
            c.arg(root().join("benches/programs/frida_handler.py"))
                .arg("body")
                .arg(&bin)
                .args([n.as_str(), "body"]);
            driver(c, hits, "frida_handler.py")
        })?);
    } else {
        eprintln!("no frida in .cache/peers-venv (./scripts/setup.sh): Frida row left out");
    }
    println!(
        "Handlers, iProbe micro-benchmark (loop calling `body`: `lea; ret`), a probe whose \
         handler counts hits, {hits} hits, {}, median of {runs} runs",
        match cpu {
            Some(c) => format!("tracer and target pinned to CPU {c}"),
            None => "not pinned".into(),
        }
    );
    println!();
    println!("| handler on `body` | ns per hit | × native |");
    println!("|---|---:|---:|");
    for (name, v) in &rows {
        println!("| {name} | {v:.1} | {:.0} |", v / native);
    }
    if let (Some(p), Some(f)) = (py_ns, frida_ns) {
        println!();
        println!(
            "Python handler / Frida JS handler: {:.1}× (goal ≤ 2×)",
            p / f
        );
    }
    Ok(())
}
