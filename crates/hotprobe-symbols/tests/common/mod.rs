//! Helpers shared by the integration tests: compile small programs into a
//! fresh temporary folder, ask binutils about them, run them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

pub use hotprobe_testkit::TempDir;

/// Write `src` to `dir/name` and compile it with `compiler` to `dir/out`.
pub fn compile(
    dir: &Path,
    compiler: &str,
    name: &str,
    src: &str,
    out: &str,
    flags: &[&str],
) -> PathBuf {
    let src_path = hotprobe_testkit::write_source(dir, name, src);
    hotprobe_testkit::compile(compiler, &src_path, &dir.join(out), flags, &[])
}

/// The address `nm` reports for a symbol (by raw name).
pub fn nm_addr(file: &Path, raw: &str) -> u64 {
    let o = Command::new("nm").arg(file).output().expect("nm");
    let text = String::from_utf8_lossy(&o.stdout);
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 3 && f[2] == raw {
            return u64::from_str_radix(f[0], 16).unwrap();
        }
    }
    panic!("nm does not list {raw} in {}:\n{text}", file.display());
}

/// `addr2line -e file addr` as (file name, line).
pub fn addr2line(file: &Path, addr: u64) -> (String, u32) {
    let o = Command::new("addr2line")
        .arg("-e")
        .arg(file)
        .arg(format!("{addr:#x}"))
        .output()
        .expect("addr2line");
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text.lines().next().unwrap_or("").to_string();
    let (f, l) = line.rsplit_once(':').unwrap();
    let l = l.split_whitespace().next().unwrap_or("0");
    (f.to_string(), l.parse().unwrap_or(0))
}

/// The 1-based line of `src` containing `marker`.
pub fn line_of(src: &str, marker: &str) -> u32 {
    src.lines().position(|l| l.contains(marker)).unwrap() as u32 + 1
}
