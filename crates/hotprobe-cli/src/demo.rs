//! `hotprobe demo`: build the bundled C program (tests/programs/demo.c)
//! with gcc into a cache directory and show a live trace of it, then the
//! count summary.

use crate::out::errln;
use crate::trace::{self, TraceOptions};
use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The demo's source, embedded so the binary works from anywhere.
const DEMO_C: &str = include_str!("../../../tests/programs/demo.c");

/// Functions of the demo that are traced.
const TRACED: &[&str] = &["parse", "compute", "square", "fib"];

/// Candidate cache directories, best first: next to the binary (the cargo
/// target directory when run through cargo), `$XDG_CACHE_HOME/hotprobe`,
/// `~/.cache/hotprobe`, then the temporary directory.
fn cache_dirs() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
    {
        v.push(dir.join("hotprobe-demo"));
    }
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        v.push(PathBuf::from(x).join("hotprobe"));
    }
    if let Some(h) = std::env::var_os("HOME").filter(|x| !x.is_empty()) {
        v.push(PathBuf::from(h).join(".cache/hotprobe"));
    }
    // SAFETY: getuid cannot fail and has no preconditions.
    let uid = unsafe { libc::getuid() };
    v.push(std::env::temp_dir().join(format!("hotprobe-demo-{uid}")));
    v
}

/// Write the source into the first usable cache directory and compile it
/// (again only when the source changed).
pub fn build() -> Result<PathBuf> {
    let mut last_err = None;
    for dir in cache_dirs() {
        match build_in(&dir) {
            Ok(bin) => return Ok(bin),
            Err(e) if e.downcast_ref::<std::io::Error>().is_some() => last_err = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last_err.unwrap_or_else(|| anyhow::anyhow!("no cache directory")))
        .context("cannot find a writable cache directory for the demo program")
}

fn build_in(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let src = dir.join("demo.c");
    let bin = dir.join("demo");
    if std::fs::read_to_string(&src).ok().as_deref() != Some(DEMO_C) {
        std::fs::write(&src, DEMO_C)?;
        let _ = std::fs::remove_file(&bin);
    }
    if bin.exists() {
        return Ok(bin);
    }
    let tmp = dir.join(format!("demo.{}.tmp", std::process::id()));
    errln!("hotprobe demo: building {}", bin.display());
    let out = Command::new("gcc")
        .args(["-O1", "-g", "-fno-inline", "-o"])
        .arg(&tmp)
        .arg(&src)
        .output()
        .map_err(|e| {
            anyhow::anyhow!(
                "cannot run gcc to build the demo program: {e} (install gcc: scripts/setup.sh)"
            )
        })?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        bail!(
            "gcc failed to build {}: {}",
            src.display(),
            String::from_utf8_lossy(&out.stderr)
                .trim()
                .replace('\n', "; ")
        );
    }
    std::fs::rename(&tmp, &bin)?;
    Ok(bin)
}

/// Run `demo`.
pub fn run() -> Result<u8> {
    let bin = build()?;
    errln!(
        "hotprobe demo: the same as `hotprobe trace --args 2 {} -- {}`",
        TRACED.join(" "),
        bin.display()
    );
    let probes: Vec<String> = TRACED.iter().map(|s| s.to_string()).collect();
    let cmd = [OsString::from(bin)];
    trace::run(&TraceOptions {
        probes: &probes,
        pid: None,
        cmd: &cmd,
        args: Some(2),
        auto_args: false,
        maxactive: 64,
        duration: None,
        summary: true,
        stacks: false,
        mechanism: hotprobe::MechanismChoice::Auto,
        no_traps: false,
        follow_forks: false,
        follow_exec: false,
        new_processes: None,
        force: false,
    })
}
