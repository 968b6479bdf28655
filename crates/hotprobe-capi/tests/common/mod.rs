//! Helpers shared by the C API tests and the Python package tests
//! (crates/hotprobe-py/tests includes this file).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root (both crates are in crates/).
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A scratch directory of its own for `name` under the target's tmp dir.
pub fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("capi-{name}"));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("scratch dir");
    d
}

/// The directory the libraries and hotprobe.pc were built into
/// (target/<profile>): the test binary is in its deps/.
pub fn lib_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(|d| d.parent())
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// Compile `src` with gcc into `out`.
pub fn gcc(src: &Path, out: &Path, flags: &[&str]) -> PathBuf {
    let o = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(out)
        .arg(src)
        .output()
        .expect("run gcc");
    assert!(
        o.status.success(),
        "gcc {}: {}",
        src.display(),
        text(&o.stderr)
    );
    out.to_path_buf()
}

/// Lossy UTF-8.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// The test program (tests/programs/compute.c), built into `dir`.
pub fn compute(dir: &Path, flags: &[&str]) -> PathBuf {
    let src = root().join("crates/hotprobe-capi/tests/programs/compute.c");
    let mut f = vec!["-O1", "-g"];
    f.extend_from_slice(flags);
    gcc(&src, &dir.join("compute"), &f)
}

/// Run `cmd`, asserting it succeeded; its output.
pub fn run_ok(cmd: &mut Command) -> Output {
    let o = cmd.output().expect("run command");
    assert!(
        o.status.success(),
        "{cmd:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        o.status,
        text(&o.stdout),
        text(&o.stderr)
    );
    o
}
