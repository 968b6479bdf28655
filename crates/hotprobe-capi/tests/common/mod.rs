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

/// The C program `src` built with gcc into `out` against the build tree's
/// libhotprobe_c through `pkg-config --cflags --libs hotprobe` (warnings
/// are errors). `cargo test` leaves libhotprobe_c.so in target/<profile>/deps
/// (only `cargo build` copies it to the .pc's libdir, target/<profile>):
/// the library is taken where this test's own build put it.
pub fn c_api_program(src: &Path, out: &Path) -> PathBuf {
    use std::process::Command;
    let deps = std::env::current_exe()
        .unwrap()
        .parent()
        .unwrap()
        .to_path_buf();
    let pc = Command::new("pkg-config")
        .arg(format!("--define-variable=libdir={}", deps.display()))
        .args(["--cflags", "--libs", "hotprobe"])
        .env("PKG_CONFIG_PATH", lib_dir())
        .output()
        .expect("run pkg-config");
    assert!(
        pc.status.success(),
        "pkg-config hotprobe (PKG_CONFIG_PATH={}): {}",
        lib_dir().display(),
        text(&pc.stderr)
    );
    let flags = text(&pc.stdout);
    let flags: Vec<&str> = flags.split_whitespace().collect();
    assert!(flags.contains(&"-lhotprobe_c"), "{flags:?}");
    let o = Command::new("gcc")
        .args(["-Wall", "-Werror", "-O1", "-o"])
        .arg(out)
        .arg(src)
        .args(&flags)
        .output()
        .expect("run gcc");
    assert!(o.status.success(), "gcc: {}", text(&o.stderr));
    out.to_path_buf()
}
