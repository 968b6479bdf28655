//! Helpers shared by the C API tests and the Python package tests
//! (crates/hotprobe-py/tests includes this file).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

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
    hotprobe_testkit::compile("gcc", src, out, flags, &[])
}

#[allow(unused_imports)] // each test binary uses its own subset
pub use hotprobe_testkit::{run_ok, text};

/// The test program (tests/programs/compute.c), built into `dir`.
pub fn compute(dir: &Path, flags: &[&str]) -> PathBuf {
    let src = root().join("crates/hotprobe-capi/tests/programs/compute.c");
    let mut f = vec!["-O1", "-g"];
    f.extend_from_slice(flags);
    gcc(&src, &dir.join("compute"), &f)
}
