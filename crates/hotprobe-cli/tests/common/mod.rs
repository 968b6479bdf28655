//! Helpers shared by the CLI's integration tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{channel, Receiver};

/// The `hotprobe` binary under test.
pub const HOTPROBE: &str = env!("CARGO_BIN_EXE_hotprobe");

/// Runs `hotprobe ARGS` with stdin closed, to completion.
pub fn hotprobe(args: &[&str]) -> Output {
    Command::new(HOTPROBE)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("hotprobe runs")
}

/// Lossy UTF-8 of a process's output.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Lines read by a thread, so a test never blocks forever.
pub fn line_reader(r: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Compiles C `src` into `out` with gcc, `flags`, `-g` and `-lpthread`,
/// unless `out` is newer than `src`; writes aside and renames, since tests
/// compile concurrently.
pub fn gcc(src: &Path, out: &Path, flags: &[&str]) -> PathBuf {
    let fresh = out.metadata().and_then(|m| m.modified()).ok()
        >= src.metadata().and_then(|m| m.modified()).ok();
    if out.exists() && fresh {
        return out.to_path_buf();
    }
    static N: AtomicUsize = AtomicUsize::new(0);
    let part = out.with_extension(format!(
        "{}.{}.part",
        std::process::id(),
        N.fetch_add(1, Relaxed)
    ));
    let st = Command::new("gcc")
        .args(flags)
        .arg("-g")
        .arg("-o")
        .arg(&part)
        .arg(src)
        .arg("-lpthread")
        .status()
        .expect("gcc runs");
    assert!(st.success(), "gcc failed on {}", src.display());
    std::fs::rename(&part, out).unwrap();
    out.to_path_buf()
}
