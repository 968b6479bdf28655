//! Helpers shared by the integration tests of every hotprobe crate: compile
//! the programs a test traces (gcc, g++, rustc, go — any compiler told
//! where to write), run commands with a time limit and kill what they
//! leave behind, temporary folders.
//!
//! Dev-only (a `[dev-dependencies]` entry); it panics with the compiler's
//! or command's output instead of returning errors, as a test wants.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

/// Why a build failed (for the few tests that accept a failed build, such
/// as a toolchain lacking an option).
#[derive(Debug)]
pub struct BuildFailed {
    /// The command line that ran.
    pub command: String,
    /// What the compiler printed (stdout then stderr).
    pub output: String,
}

impl std::fmt::Display for BuildFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} failed:\n{}", self.command, self.output)
    }
}

/// Runs the compiler command `cmd(part)` that writes `out`'s content to
/// the path `part`, then renames `part` to `out` (tests compile
/// concurrently: nobody sees a half-written binary). Skips the build when
/// `out` is newer than `src` and was built by the same command line (kept
/// in `out` + `.cmd`). Panics with the compiler's output on failure.
pub fn build(src: &Path, out: &Path, cmd: impl FnOnce(&Path) -> Command) -> PathBuf {
    try_build(src, out, cmd).unwrap_or_else(|e| panic!("{e}"))
}

/// [`build`], returning the failure instead of panicking.
pub fn try_build(
    src: &Path,
    out: &Path,
    cmd: impl FnOnce(&Path) -> Command,
) -> Result<PathBuf, BuildFailed> {
    static N: AtomicUsize = AtomicUsize::new(0);
    if let Some(dir) = out.parent() {
        std::fs::create_dir_all(dir).unwrap();
    }
    let part = part_path(out, N.fetch_add(1, Relaxed));
    let mut c = cmd(&part);
    let line = format!("{c:?}").replace(&*part.to_string_lossy(), &out.to_string_lossy());
    let stamp = with_suffix(out, ".cmd");
    let fresh = out.metadata().and_then(|m| m.modified()).ok()
        >= src.metadata().and_then(|m| m.modified()).ok();
    if out.exists() && fresh && std::fs::read_to_string(&stamp).ok().as_deref() == Some(&*line) {
        return Ok(out.to_path_buf());
    }
    let o = c.output().map_err(|e| BuildFailed {
        command: line.clone(),
        output: format!("cannot run it: {e}"),
    })?;
    if !o.status.success() {
        let _ = std::fs::remove_file(&part);
        return Err(BuildFailed {
            command: line,
            output: format!("{}{}", text(&o.stdout), text(&o.stderr)),
        });
    }
    std::fs::rename(&part, out).unwrap();
    std::fs::write(&stamp, &line).unwrap();
    Ok(out.to_path_buf())
}

/// `TOOL FLAGS -o OUT SRC LIBS` through [`build`] (libraries after the
/// source, where the linker wants them).
pub fn compile(tool: &str, src: &Path, out: &Path, flags: &[&str], libs: &[&str]) -> PathBuf {
    try_compile(tool, src, out, flags, libs).unwrap_or_else(|e| panic!("{e}"))
}

/// [`compile`], returning the failure instead of panicking.
pub fn try_compile(
    tool: &str,
    src: &Path,
    out: &Path,
    flags: &[&str],
    libs: &[&str],
) -> Result<PathBuf, BuildFailed> {
    try_build(src, out, |part| {
        let mut c = Command::new(tool);
        c.args(flags).arg("-o").arg(part).arg(src).args(libs);
        c
    })
}

/// Runs `cmd` to completion (a compiler or linker given all its
/// arguments, several sources, `-c`…); panics with its output unless it
/// succeeds.
pub fn run_ok(cmd: &mut Command) -> Output {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed:\n{}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    o
}

/// Writes `source` to `dir/name` (only when it differs, so that a cached
/// build stays fresh) and returns the path.
pub fn write_source(dir: &Path, name: &str, source: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let p = dir.join(name);
    if std::fs::read_to_string(&p).ok().as_deref() != Some(source) {
        std::fs::write(&p, source).unwrap();
    }
    p
}

fn with_suffix(p: &Path, suffix: &str) -> PathBuf {
    let mut s: OsString = p.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

fn part_path(out: &Path, n: usize) -> PathBuf {
    with_suffix(out, &format!(".{}.{n}.part", std::process::id()))
}

/// A temporary folder, removed on drop.
pub struct TempDir(PathBuf);

impl TempDir {
    /// A new empty folder under the system's temporary directory, its name
    /// made of `tag`, the test process's pid and a counter.
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "hotprobe-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    /// The folder.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Lossy UTF-8 of a process's output.
pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Everything `r` yields, read by a thread.
pub fn reader(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut v = Vec::new();
        let _ = r.read_to_end(&mut v);
        v
    })
}

/// Lines read by a thread, so a test never blocks forever.
pub fn line_reader(r: impl Read + Send + 'static) -> Receiver<String> {
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

/// SIGKILL to every process of group `pgid` (none left is fine), unless
/// it is the test's own group.
pub fn kill_group(pgid: i32) {
    assert!(pgid > 1, "process group {pgid}");
    // SAFETY: plain syscalls on a process group the test started.
    unsafe {
        if pgid != libc::getpgrp() {
            libc::kill(-pgid, libc::SIGKILL);
        }
    }
}

/// CPU time process `pid` used so far, in clock ticks (utime + stime of
/// /proc/PID/stat).
pub fn cpu_ticks(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &s[s.rfind(')').unwrap() + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

/// Waits until process `pid` used `ticks` clock ticks of CPU (a program
/// that loops from its start is then past its loader and in its loop);
/// panics after 30 s.
pub fn wait_cpu_ticks(pid: u32, ticks: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while cpu_ticks(pid) < ticks {
        assert!(
            std::time::Instant::now() < deadline,
            "pid {pid} never ran {ticks} ticks"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Runs `cmd` (stdin closed, stdout and stderr captured) in a process
/// group of its own, to completion; if it is still running after `limit`,
/// kills the whole group (the command and whatever it started) and panics
/// with what it printed so far. Once the command exited, whatever is left
/// in its group (a child it left running) is killed too, so that its
/// output ends.
pub fn output_within(mut cmd: Command, limit: Duration) -> Output {
    use std::os::unix::process::CommandExt;
    let what = format!("{cmd:?}");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {what}: {e}"));
    let pgid = child.id() as i32;
    let out = reader(child.stdout.take().unwrap());
    let err = reader(child.stderr.take().unwrap());
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait());
    });
    let status = rx.recv_timeout(limit);
    kill_group(pgid);
    let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
    match status {
        Ok(status) => Output {
            status: status.expect("wait"),
            stdout,
            stderr,
        },
        Err(_) => panic!(
            "{what} still running after {limit:?}: killed\nstdout:\n{}\nstderr:\n{}",
            text(&stdout),
            text(&stderr)
        ),
    }
}

/// The handler a test installs with [`install_counting_handler`]: counts
/// its calls in [`HANDLER_CALLS`].
pub static HANDLER_CALLS: AtomicUsize = AtomicUsize::new(0);

extern "C" fn counting_handler(_sig: libc::c_int) {
    HANDLER_CALLS.fetch_add(1, Relaxed);
}

/// What `sigaction` says is installed for a signal: the handler's address
/// and the flags (to compare before and after the code under test).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignalAction {
    /// `sa_sigaction` (or `SIG_DFL`, `SIG_IGN`).
    pub handler: usize,
    /// `sa_flags`.
    pub flags: i32,
}

/// The action installed for `sig` now.
pub fn signal_action(sig: i32) -> SignalAction {
    // SAFETY: a zeroed sigaction is a valid out value; a null new action
    // only reads the current one.
    let old = unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        assert_eq!(libc::sigaction(sig, std::ptr::null(), &mut old), 0);
        old
    };
    SignalAction {
        handler: old.sa_sigaction,
        flags: old.sa_flags,
    }
}

/// Installs for `sig` a handler that counts its calls in
/// [`HANDLER_CALLS`] (`SA_RESTART`); returns what is installed now.
pub fn install_counting_handler(sig: i32) -> SignalAction {
    // SAFETY: a zeroed sigaction with a handler that only bumps an atomic
    // (async-signal-safe).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = counting_handler as extern "C" fn(libc::c_int) as libc::sighandler_t;
        sa.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(sig, &sa, std::ptr::null_mut()), 0);
    }
    signal_action(sig)
}

/// `SIGRTMIN() + n`, the real-time signal numbers as the C library gives
/// them.
pub fn sigrtmin_plus(n: i32) -> i32 {
    libc::SIGRTMIN() + n
}

/// The executable mappings of `file` (of `file_len` bytes) in `pid`:
/// (start address, file offset, length within the file) of each.
pub fn code_mappings(pid: u32, file: &Path, file_len: usize) -> Vec<(u64, usize, usize)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let name = file.to_str().unwrap();
    maps.lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.len() < 6 || w[5] != name || !w[1].contains('x') {
                return None;
            }
            let (s, e) = w[0].split_once('-').unwrap();
            let (s, e) = (
                u64::from_str_radix(s, 16).unwrap(),
                u64::from_str_radix(e, 16).unwrap(),
            );
            let off = u64::from_str_radix(w[2], 16).unwrap() as usize;
            Some((s, off, ((e - s) as usize).min(file_len.saturating_sub(off))))
        })
        .collect()
}

/// The bytes of every executable mapping of `file` in process `pid` that
/// differ from the file: (address, in memory, in the file).
pub fn text_differences(pid: u32, file: &Path) -> Vec<(u64, u8, u8)> {
    use std::io::{Read, Seek, SeekFrom};
    let bytes = std::fs::read(file).unwrap();
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut diffs = Vec::new();
    for (s, off, len) in code_mappings(pid, file, bytes.len()) {
        let mut m = vec![0u8; len];
        mem.seek(SeekFrom::Start(s)).unwrap();
        mem.read_exact(&mut m).unwrap();
        for (i, (a, b)) in m.iter().zip(&bytes[off..off + len]).enumerate() {
            if a != b {
                diffs.push((s + i as u64, *a, *b));
            }
        }
    }
    diffs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_is_reused_only_for_the_same_command_and_a_failure_says_why() {
        let d = TempDir::new("testkit");
        let src = write_source(d.path(), "p.c", "int main(void){return 3;}\n");
        let out = d.path().join("p");
        compile("gcc", &src, &out, &["-O0"], &[]);
        let first = out.metadata().unwrap().modified().unwrap();
        compile("gcc", &src, &out, &["-O0"], &[]);
        assert_eq!(out.metadata().unwrap().modified().unwrap(), first);
        compile("gcc", &src, &out, &["-O1"], &[]);
        let stamp = std::fs::read_to_string(with_suffix(&out, ".cmd")).unwrap();
        assert!(stamp.contains("-O1"), "{stamp}");
        let st = Command::new(&out).status().unwrap();
        assert_eq!(st.code(), Some(3));
        let bad = write_source(d.path(), "bad.c", "int main(void){ return x; }\n");
        let e = try_compile("gcc", &bad, &d.path().join("bad"), &[], &[]).unwrap_err();
        assert!(e.output.contains("undeclared"), "{e}");
        assert!(!d.path().join("bad").exists());
    }

    #[test]
    fn output_within_kills_a_command_that_runs_too_long() {
        let mut c = Command::new("sleep");
        c.arg("30");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            output_within(c, Duration::from_millis(200))
        }));
        assert!(r.is_err());
        let mut c = Command::new("sh");
        c.args(["-c", "echo out; echo err >&2; exit 4"]);
        let o = output_within(c, Duration::from_secs(20));
        assert_eq!(
            (text(&o.stdout), text(&o.stderr), o.status.code()),
            ("out\n".into(), "err\n".into(), Some(4))
        );
    }
}
