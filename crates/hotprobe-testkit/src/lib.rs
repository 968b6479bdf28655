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

/// `go`, from PATH or where Go's installer and Debian put it.
pub fn go_tool() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("go"))
        .chain(["/usr/local/go/bin/go".into(), "/usr/lib/go/bin/go".into()])
        .find(|p| p.is_file())
        .expect("no go toolchain (scripts/setup.sh installs golang-go)")
}

/// `go build -ldflags LDFLAGS` of the Go package in folder `package`
/// (its own `go.mod`, the standard library only) into `out` through
/// [`build`] (fresh while `out` is newer than every file of the package),
/// with cgo on or off. HOME, GOCACHE and GOPATH are under `cache` (in the
/// target directory): a clean clone builds offline, with no module
/// download and nothing written outside the target directory.
pub fn go_build(package: &Path, out: &Path, cache: &Path, ldflags: &str, cgo: bool) -> PathBuf {
    let newest = std::fs::read_dir(package)
        .unwrap_or_else(|e| panic!("{}: {e}", package.display()))
        .filter_map(|e| {
            let e = e.ok()?;
            Some((e.metadata().ok()?.modified().ok()?, e.path()))
        })
        .max()
        .map(|(_, p)| p)
        .unwrap_or_else(|| panic!("{}: no file", package.display()));
    build(&newest, out, |part| {
        let mut c = Command::new(go_tool());
        c.current_dir(package)
            .args(["build", "-ldflags", ldflags, "-o"])
            .arg(part)
            .arg(".")
            .env("HOME", cache.join("home"))
            .env("GOCACHE", cache.join("cache"))
            .env("GOPATH", cache.join("path"))
            .env("GOFLAGS", "-mod=mod")
            .env("GOTOOLCHAIN", "local")
            .env("CGO_ENABLED", if cgo { "1" } else { "0" });
        c
    })
}

/// The workspace's root (canonical).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// `tests/programs` at the workspace's root: the programs the tests of
/// several crates share.
pub fn shared_programs() -> PathBuf {
    repo_root().join("tests/programs")
}

/// The program that unloads a library and loads it again
/// (tests/programs/reloads.c: `reloads LIB [wait]`, 5 calls of each
/// function before the unload, 7 after, exit status 7) and its library
/// (tests/programs/reload_lib.c, every entry patchable), built into
/// `dir` with `-O2 -g`: (program, library), canonical paths.
pub fn reloading_program(dir: &Path) -> (PathBuf, PathBuf) {
    let programs = shared_programs();
    let lib = compile(
        "gcc",
        &programs.join("reload_lib.c"),
        &dir.join("libreload.so"),
        &[
            "-O2",
            "-g",
            "-shared",
            "-fPIC",
            "-fpatchable-function-entry=5",
        ],
        &[],
    );
    let prog = compile(
        "gcc",
        &programs.join("reloads.c"),
        &dir.join("reloads"),
        &["-O2", "-g"],
        &["-ldl"],
    );
    (prog.canonicalize().unwrap(), lib.canonicalize().unwrap())
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

/// A child process killed and reaped when dropped (also when the test
/// panics): the program a test runs beside hotprobe.
#[derive(Debug)]
pub struct Killed(pub std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
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

/// The pid a program says first, in its line `ready PID`, read from
/// `lines` (a [`line_reader`]'s) within `limit`.
pub fn ready_pid(lines: &Receiver<String>, limit: Duration) -> u32 {
    let l = lines
        .recv_timeout(limit)
        .expect("the program's `ready PID` line");
    l.strip_prefix("ready ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("not a `ready PID` line: {l:?}"))
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

/// A process group killed ([`kill_group`]) when dropped (also when the
/// test panics).
#[derive(Debug)]
pub struct GroupKilled(pub i32);

impl Drop for GroupKilled {
    fn drop(&mut self) {
        kill_group(self.0);
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

/// The `/proc` directory that shows process `pid`'s memory and maps:
/// `/proc/PID`, or a live thread's `/proc/PID/task/TID` when its leader
/// exited while other threads run on (the symbol layer's own,
/// [`hotprobe_symbols::proc_dir`]).
pub use hotprobe_symbols::proc_dir;

/// The executable mappings of `file` (of `file_len` bytes) in `pid`:
/// (start address, file offset, length within the file) of each.
pub fn code_mappings(pid: u32, file: &Path, file_len: usize) -> Vec<(u64, usize, usize)> {
    let maps = std::fs::read_to_string(proc_dir(pid).join("maps")).unwrap();
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

/// What `/proc/PID/stat` says of process `pid`: "state R", "state Z
/// (ended, not reaped yet)", or "gone (reaped)".
pub fn process_state(pid: u32) -> String {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return "gone (reaped)".into();
    };
    match stat
        .rsplit_once(')')
        .and_then(|(_, r)| r.split_whitespace().next())
    {
        Some("Z") => "state Z (ended, not reaped yet)".into(),
        Some(s) => format!("state {s}"),
        None => format!("unreadable stat {stat:?}"),
    }
}

/// Where each thread of process `pid` is, for a test that timed out: its
/// state and tracer (`/proc/PID/task/TID/status`), the kernel function it
/// sleeps in (`wchan`) and its system call (`syscall`: number, arguments).
pub fn threads_at(pid: u32, what: &str) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("{what} (pid {pid}) is gone");
    };
    let mut out = format!("{what} (pid {pid}):");
    for t in tasks.filter_map(Result::ok) {
        let read = |f: &str| std::fs::read_to_string(t.path().join(f)).unwrap_or_default();
        let status = read("status");
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .unwrap_or("?")
                .trim()
                .to_string()
        };
        out += &format!(
            " [tid {} {} tracer {} wchan {} syscall {}]",
            t.file_name().to_string_lossy(),
            field("State:"),
            field("TracerPid:"),
            read("wchan"),
            read("syscall").trim()
        );
    }
    out
}

/// The bytes of every executable mapping of `file` in process `pid` that
/// differ from the file: (address, in memory, in the file).
pub fn text_differences(pid: u32, file: &Path) -> Vec<(u64, u8, u8)> {
    use std::io::{Read, Seek, SeekFrom};
    let bytes = std::fs::read(file).unwrap();
    let path = proc_dir(pid).join("mem");
    // An ended process's `mem` cannot be opened (ESRCH, even for root,
    // while it waits to be reaped): say so rather than "No such process".
    let mut mem = std::fs::File::open(&path).unwrap_or_else(|e| {
        panic!(
            "cannot open {}: {e}; process {pid}: {}",
            path.display(),
            process_state(pid)
        )
    });
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

/// The moments of a test that kills or starves something at random
/// (a tracer's SIGKILL, a disk that fills): numbers drawn from a seed the
/// test prints, so that a failing run can be repeated. The seed is the
/// environment variable the test names (e.g. `HOTPROBE_KILL_SEED`) when it
/// is set to a number, else the clock's. A small xorshift64* generator: no
/// statistics wanted, only a spread of moments and their repetition.
#[derive(Debug)]
pub struct SeededMoments {
    seed: u64,
    state: u64,
}

impl SeededMoments {
    /// The seed from `$var`, or from the clock when `$var` is unset (a
    /// value that is not a number is a mistake: panics); prints
    /// "`what` from seed N (`var`=N repeats them)" on stderr.
    pub fn from_env(var: &str, what: &str) -> SeededMoments {
        let seed = match std::env::var(var) {
            Ok(s) => s
                .trim()
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{var}={s:?}: not a number")),
            Err(_) => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("the clock is past 1970")
                .as_nanos() as u64,
        };
        eprintln!("{what} from seed {seed} ({var}={seed} repeats them)");
        SeededMoments::new(seed)
    }

    /// The moments of `seed`.
    pub fn new(seed: u64) -> SeededMoments {
        // Every bit of the seed mixed in (splitmix64's finalizer), and a
        // state that is not 0 (xorshift never leaves 0).
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        SeededMoments {
            seed,
            state: if z == 0 { 1 } else { z },
        }
    }

    /// The seed (for the messages of a failed run).
    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// The next number.
    pub fn next_u64(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `range` (`lo..hi`, `hi > lo`).
    pub fn in_range(&mut self, range: std::ops::Range<u64>) -> u64 {
        assert!(range.end > range.start, "empty range {range:?}");
        range.start + self.next_u64() % (range.end - range.start)
    }
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

    #[test]
    fn seeded_moments_repeat_with_their_seed() {
        let draw = |seed| {
            let mut m = SeededMoments::new(seed);
            (0..20).map(|_| m.in_range(10..20)).collect::<Vec<_>>()
        };
        assert_eq!(draw(42), draw(42));
        assert_ne!(draw(42), draw(43));
        assert!(draw(7).iter().all(|v| (10..20).contains(v)));
        std::env::set_var("HOTPROBE_TESTKIT_SEED", "77");
        let m = SeededMoments::from_env("HOTPROBE_TESTKIT_SEED", "unit test moments");
        assert_eq!(m.seed(), 77);
    }
}
