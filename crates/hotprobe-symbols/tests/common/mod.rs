//! Helpers shared by the integration tests: compile small programs into a
//! fresh temporary folder, ask binutils about them, run them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// A temporary folder removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "hotprobe-symbols-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Write `src` to `dir/name` and compile it with `compiler` to `dir/out`.
pub fn compile(
    dir: &Path,
    compiler: &str,
    name: &str,
    src: &str,
    out: &str,
    flags: &[&str],
) -> PathBuf {
    let src_path = dir.join(name);
    std::fs::write(&src_path, src).unwrap();
    let out_path = dir.join(out);
    let o = Command::new(compiler)
        .args(flags)
        .arg("-o")
        .arg(&out_path)
        .arg(&src_path)
        .current_dir(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler}: {e}"));
    assert!(
        o.status.success(),
        "{compiler} {flags:?} {name} failed:\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    out_path
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
