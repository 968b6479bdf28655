//! tests/programs/two_sessions.c: a process two sessions (or a session
//! and a tracer of another kind) meet on, driven line by line through
//! pipes (issue 22: attach_refusals.rs, foreign_tracer.rs).

use super::line_reader;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

/// How long a step the test waits for may take on a loaded machine.
pub const WAIT: Duration = Duration::from_secs(60);
/// Calls of `tiny` and `work` per round.
pub const N: u64 = 1000;

/// two_sessions.c built with gcc -O1 -falign-functions=1.
pub fn program() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/two_sessions.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("two_sessions");
    std::fs::create_dir_all(&dir).unwrap();
    super::gcc(
        &src,
        &dir.join("two_sessions"),
        &["-O1", "-falign-functions=1"],
    )
}

/// The line a round of `n` calls prints (what the program computes).
pub fn round_line(n: u64) -> String {
    let tiny: u64 = (0..n).sum();
    let work: u64 = (0..n)
        .map(|i| (0..(i & 7) + 1).map(|j| j * i).sum::<u64>())
        .sum();
    format!("round {n} tiny {tiny} work {work}")
}

/// The program, started by the test or by a session: its stdin, its
/// output lines, its pid (from its "ready" line).
pub struct Program {
    /// Its stdin.
    pub stdin: ChildStdin,
    /// Its output lines.
    pub lines: Receiver<String>,
    /// Its pid.
    pub pid: u32,
}

impl Program {
    /// Past the "ready PID" line on `out`.
    pub fn new(stdin: ChildStdin, out: impl std::io::Read + Send + 'static) -> Program {
        let lines = line_reader(out);
        let ready = lines.recv_timeout(WAIT).expect("the program's ready line");
        let pid = ready
            .strip_prefix("ready ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("not a ready line: {ready}"));
        Program { stdin, lines, pid }
    }

    /// Writes `line` to its stdin.
    pub fn say(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// One round of `N` calls each; asserts its line.
    pub fn round(&mut self) {
        self.say(&format!("round {N}"));
        let l = self.lines.recv_timeout(WAIT).expect("the round's line");
        assert_eq!(l, round_line(N));
    }
}

/// The program, started by the test (no session holds it yet), past its
/// ready line.
pub fn started() -> (Child, Program) {
    let mut child = Command::new(program())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let p = Program::new(child.stdin.take().unwrap(), child.stdout.take().unwrap());
    (child, p)
}

/// Ends the program with status 3 and asserts it (its own exit).
pub fn exit_3(mut child: Child, mut p: Program) {
    p.say("exit 3");
    assert_eq!(child.wait().unwrap().code(), Some(3));
    assert!(p.lines.recv_timeout(WAIT).is_err(), "nothing more printed");
}

/// The tracer of `pid`'s main thread, as its process (0: none).
pub fn tracer_of(pid: u32) -> i32 {
    let field = |path: String, key: &str| -> i32 {
        let st = std::fs::read_to_string(path).unwrap_or_default();
        st.lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    match field(format!("/proc/{pid}/status"), "TracerPid:") {
        0 => 0,
        t => field(format!("/proc/{t}/status"), "Tgid:"),
    }
}

/// `hotprobe count tiny work -- two_sessions`, started: hotprobe, its
/// stderr lines past the "started" line (which says `tiny` took the
/// in-process trap, `work` a jump), and the program past its ready line.
pub fn under_count() -> (Child, Receiver<String>, Program) {
    let bin = program();
    let mut hp = Command::new(super::HOTPROBE)
        .args(["count", "tiny", "work", "--", bin.to_str().unwrap()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = line_reader(hp.stderr.take().unwrap());
    let started = err.recv_timeout(WAIT).expect("hotprobe says it started");
    assert!(
        started.ends_with("2 probes (in-process 1, jump 1)"),
        "{started}"
    );
    let p = Program::new(hp.stdin.take().unwrap(), hp.stdout.take().unwrap());
    (hp, err, p)
}
