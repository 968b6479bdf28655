//! A program whose main thread calls `pthread_exit` while its workers run
//! on (tests/programs/zombie_leader.c): its leader is a zombie (State Z)
//! while the process lives. ptrace never reports such a leader stopped,
//! cannot seize or detach it, and its `/proc/PID/{exe,mem,maps}` are gone.
//! Spawned and counted, spawned and detached with `--duration` (no call
//! made while held, none counted, the program running on), and attached
//! to with `-p` and detached, under the trap and the default mechanism:
//! the counts are the program's own, its output and exit status are
//! unchanged, no stop or detach hangs (every hotprobe run is bounded), and
//! after a detach its text is the file's.

mod common;

use common::{hotprobe_within, line_reader, program_output, text, CountTable, HOTPROBE};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

/// Calls of `work` per thread (main and each worker).
const N: u64 = 1000;
/// How long a step the test waits for may take on a loaded machine.
const WAIT: Duration = Duration::from_secs(120);

/// The mechanisms tried: `--mechanism trap`, and the default (the agent;
/// the process runs untraced once its probes are in).
const MECHANISMS: [&[&str]; 2] = [&["--mechanism", "trap"], &[]];

fn program() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/zombie_leader.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("zombie_leader");
    std::fs::create_dir_all(&dir).unwrap();
    common::gcc(&src, &dir.join("zombie_leader"), &["-O1"])
}

/// The lines of `out`, sorted (the two workers print in either order).
fn sorted_lines(out: &str) -> Vec<String> {
    let mut v: Vec<String> = out.lines().map(String::from).collect();
    v.sort();
    v
}

/// The `round` line of 2 workers × `N` calls of `work(i + id * 1000)`.
fn round_line() -> String {
    let sum: u64 = (0..2u64)
        .map(|id| (0..N).map(|i| (i + id * 1000) * 3 + 1).sum::<u64>())
        .sum();
    format!("round total {sum} calls {}", 2 * N)
}

/// The state letter of task `tid` of `pid` (`/proc/PID/task/TID/status`).
fn task_state(pid: u32, tid: u32) -> Option<char> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("State:"))
        .and_then(|v| v.trim().chars().next())
}

/// The `TracerPid` of every task of `pid`.
fn tracers(pid: u32) -> Vec<(u32, u32)> {
    let mut v: Vec<(u32, u32)> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|e| {
            let tid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            let s = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
            let tracer = s
                .lines()
                .find_map(|l| l.strip_prefix("TracerPid:"))?
                .trim()
                .parse()
                .ok()?;
            Some((tid, tracer))
        })
        .collect();
    v.sort_unstable();
    v
}

/// hotprobe's exit status, once it exited within [`WAIT`]; else it is
/// killed and the test fails (a detach that hangs).
fn wait_within(mut hp: std::process::Child) -> std::process::ExitStatus {
    let pid = hp.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(hp.wait());
    });
    match rx.recv_timeout(WAIT) {
        Ok(status) => status.unwrap(),
        Err(_) => {
            // SAFETY: a signal to our own child, still running.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("hotprobe (pid {pid}) still running after {WAIT:?}: killed");
        }
    }
}

#[test]
fn a_spawned_program_whose_main_thread_exits_is_counted_exactly_with_its_status() {
    let bin = program();
    let bin = bin.to_str().unwrap();
    let n = N.to_string();
    let native = Command::new(bin).args(["run", &n]).output().unwrap();
    assert_eq!(native.status.code(), Some(7));
    let native_out = text(&native.stdout);
    assert_eq!(native_out.lines().count(), 3, "{native_out}");
    for mech in MECHANISMS {
        let mut args = vec!["count"];
        args.extend(mech);
        args.extend(["work", "--", bin, "run", &n]);
        let out = hotprobe_within(&args, WAIT);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(7), "{mech:?}: {stderr}");
        assert!(stderr.contains("exited with code 7"), "{mech:?}: {stderr}");
        assert_eq!(
            sorted_lines(program_output(&stdout)),
            sorted_lines(&native_out),
            "{mech:?}: {stderr}"
        );
        // main's N calls, then each worker's N once main's task is a zombie.
        let t = CountTable::parse(&stdout, &stderr);
        assert_eq!(t.hits("work"), 3 * N, "{mech:?}: {}", t.all);
    }
}

/// The `serve` program (its stdin, its output's lines, its pid), and the
/// end of it when the test is done or fails.
struct Served {
    stdin: std::process::ChildStdin,
    lines: Receiver<String>,
    pid: u32,
}

impl Served {
    fn say(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn next_line(&self) -> String {
        self.lines
            .recv_timeout(WAIT)
            .expect("a line of the program")
    }

    /// Reads the `ready PID` line; the leader is a zombie from then on.
    fn ready(&mut self) {
        let ready = self.next_line();
        let pid = ready
            .strip_prefix("ready ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("not a ready line: {ready}"));
        self.pid = pid;
        assert_eq!(task_state(pid, pid), Some('Z'), "main's task");
    }

    /// One round, and its line.
    fn round(&mut self) -> String {
        self.say("round");
        self.next_line()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if self.pid != 0 {
            // SAFETY: a signal to the test's own program (a no-op once it ended).
            unsafe { libc::kill(self.pid as i32, libc::SIGKILL) };
        }
    }
}

/// The exit status of `pid`, a child of this test process (an orphan it
/// reaps as the subreaper it made itself).
fn reap(pid: u32) -> i32 {
    let mut st = 0;
    // SAFETY: waits for one child of ours; `st` lives across the call.
    let r = unsafe { libc::waitpid(pid as i32, &mut st, 0) };
    assert_eq!(r, pid as i32, "waitpid {pid}");
    st
}

/// Whether process `pid`, a child of this test process (an orphan it
/// reaps as the subreaper it made itself), is still running: not exited,
/// not killed (`waitpid` with `WNOHANG` finds nothing to reap).
fn running(pid: u32) -> bool {
    let mut st = 0;
    // SAFETY: polls one child of ours; `st` lives across the call.
    let r = unsafe { libc::waitpid(pid as i32, &mut st, libc::WNOHANG) };
    assert!(r == 0 || r == pid as i32, "waitpid {pid}: {r}");
    r == 0
}

/// `--duration` ends the session, never the program: the program, once
/// its leader is a zombie (its `ready` line, read through the pipe of its
/// stdout), makes no call until told, so the session ends by the duration
/// with the program blocked on its stdin whatever the machine's load. No
/// time margin is asserted: only that hotprobe said the duration elapsed
/// and detached, exited 0 with a table of every call made while it held
/// the program (none), and that the program is still running (not
/// reaped), untraced, its text the file's, and serves a round and exits
/// with its own status afterwards.
#[test]
fn duration_detaches_from_a_spawned_program_whose_leader_is_a_zombie() {
    // The program outlives hotprobe: this process reaps it, to see its
    // exit status.
    // SAFETY: prctl with integer arguments only.
    let subreaper = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    assert_eq!(subreaper, 0);
    let bin = program();
    let file = bin.clone();
    for mech in MECHANISMS {
        let mut hp = Command::new(HOTPROBE);
        hp.arg("count")
            .args(mech)
            // Its length decides nothing asserted here: only how long the
            // session holds the program, its leader a zombie after the
            // first milliseconds.
            .args(["--duration", "2", "work", "--"])
            .arg(&bin)
            .args(["serve", &N.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut hp = hp.spawn().unwrap();
        let mut s = Served {
            stdin: hp.stdin.take().unwrap(),
            lines: line_reader(hp.stdout.take().unwrap()),
            pid: 0,
        };
        let err = line_reader(hp.stderr.take().unwrap());
        s.ready();
        let status = wait_within(hp);
        // Up to the detach's line: the program, running on, holds the
        // stream it shares with hotprobe open.
        let detached = format!(
            "hotprobe: duration elapsed: detached from pid {} (started by hotprobe), which runs \
             on without probes",
            s.pid
        );
        let mut stderr = Vec::new();
        while !stderr.contains(&detached) {
            match err.recv_timeout(WAIT) {
                Ok(l) => stderr.push(l),
                Err(e) => panic!("{mech:?}: {e}, no detach line in {stderr:?}"),
            }
        }
        assert!(status.success(), "{mech:?}: {stderr:?}");
        // Ended by the duration, not by the program: it runs on.
        assert!(running(s.pid), "{mech:?}: the program ended: {stderr:?}");
        // The table on the same stdout: the program made no call while
        // hotprobe held it.
        let mut table = String::new();
        loop {
            let l = s.next_line();
            table.push_str(&l);
            table.push('\n');
            if l.starts_with("work ") {
                break;
            }
        }
        let t = CountTable::parse(&table, &stderr.join("\n"));
        assert_eq!(t.hits("work"), 0, "{mech:?}: {}", t.all);
        // Untraced, its text the file's, and it runs on as before.
        assert!(
            tracers(s.pid).iter().all(|(_, tracer)| *tracer == 0),
            "{mech:?}: {:?}",
            tracers(s.pid)
        );
        assert_eq!(
            hotprobe_testkit::text_differences(s.pid, &file),
            vec![],
            "{mech:?}"
        );
        assert_eq!(s.round(), round_line(), "{mech:?}: after the detach");
        assert!(running(s.pid), "{mech:?}");
        s.say("exit 7");
        let st = reap(s.pid);
        s.pid = 0;
        assert!(
            libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 7,
            "{mech:?}: {st:#x}"
        );
    }
}

#[test]
fn attach_and_detach_of_a_process_whose_leader_is_a_zombie() {
    let bin = program();
    for mech in MECHANISMS {
        let mut child = Command::new(&bin)
            .args(["serve", &N.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut s = Served {
            stdin: child.stdin.take().unwrap(),
            lines: line_reader(child.stdout.take().unwrap()),
            pid: 0,
        };
        s.ready();
        assert_eq!(s.pid, child.id());
        assert_eq!(s.round(), round_line(), "{mech:?}: before");
        let pid = s.pid.to_string();
        let mut hp = Command::new(HOTPROBE);
        hp.arg("count")
            .args(mech)
            .args(["work", "-p", &pid])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut hp = hp.spawn().unwrap();
        let out = hotprobe_testkit::reader(hp.stdout.take().unwrap());
        let err = line_reader(hp.stderr.take().unwrap());
        let first = err.recv_timeout(WAIT).expect("hotprobe's first line");
        assert!(
            first.starts_with(&format!("hotprobe: attached to pid {pid}: 1 probes")),
            "{mech:?}: {first}"
        );
        assert_eq!(s.round(), round_line(), "{mech:?}: attached");
        assert_eq!(s.round(), round_line(), "{mech:?}: attached");
        // SAFETY: a signal to our own child.
        assert_eq!(unsafe { libc::kill(hp.id() as i32, libc::SIGINT) }, 0);
        let status = wait_within(hp);
        let stdout = text(&out.join().unwrap());
        let stderr: Vec<String> = err.iter().collect();
        assert!(status.success(), "{mech:?}: {status:?} {stderr:?}");
        assert!(
            stderr.iter().any(|l| l.contains(&format!(
                "interrupted: detached from pid {pid}, which runs on with its code restored"
            ))),
            "{mech:?}: {stderr:?}"
        );
        let t = CountTable::parse(&stdout, &stderr.join("\n"));
        assert_eq!(t.hits("work"), 4 * N, "{mech:?}: {}", t.all);
        // Nothing of hotprobe's is left: no tracer, the text is the file's.
        assert!(
            tracers(s.pid).iter().all(|(_, tracer)| *tracer == 0),
            "{mech:?}: {:?}",
            tracers(s.pid)
        );
        assert_eq!(
            hotprobe_testkit::text_differences(s.pid, &bin),
            vec![],
            "{mech:?}"
        );
        assert_eq!(s.round(), round_line(), "{mech:?}: after the detach");
        s.say("exit 7");
        assert_eq!(child.wait().unwrap().code(), Some(7), "{mech:?}");
        s.pid = 0;
    }
}
