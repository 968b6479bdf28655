//! Builds the calibration target (calibration/target.c) that
//! `hotprobe::calibration` embeds: a small C program, compiled with the C
//! compiler that links Rust programs here (`$CC`, else `cc`).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let src = PathBuf::from("calibration/target.c");
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-env-changed=CC");
    let out =
        PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR")).join("hotprobe-calibration");
    let cc = std::env::var_os("CC").unwrap_or_else(|| "cc".into());
    let status = Command::new(&cc)
        .args(["-O2", "-g0", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run the C compiler {cc:?} for {}: {e}",
                src.display()
            )
        });
    assert!(status.success(), "{cc:?} failed on {}", src.display());
}
