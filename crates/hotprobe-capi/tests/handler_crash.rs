//! Issue 22, item 4: "an int3 left by a crashed handler is removed, or its
//! probe is said to be disabled" (before: after a C handler crashed, its
//! `int3` stayed in the text for good, every call then costing 3–4 µs).
//!
//! A C API host compiled here (tests/programs/crash_host.c) attaches to a
//! program the test started (tests/programs/steps.c), or starts it
//! itself, and puts a probe with a pre handler on `work`; the handler
//! crashes the host with SIGSEGV at its 3rd call. The program runs on:
//! its own output and exit status are those of a run without hotprobe,
//! the handler ran for exactly the calls work(0), work(1), work(2), and
//! once the host is gone and the program made 1,000 more calls, its text
//! is the file's, byte for byte (the agent put the code back when the
//! host's hang-up pipe closed, see hotprobe-agent's `undo`). Attached:
//! with the default mechanisms (the handler served through shared memory)
//! and with ptrace traps; started by the host: with the default
//! mechanisms. (A program the host started with ptrace traps only has no
//! agent to put its code back: it dies with its tracer,
//! `PTRACE_O_EXITKILL`, see docs/DESIGN.md "C and Python APIs".)

mod common;
use common::*;
use hotprobe_c::{HOTPROBE_MECH_AUTO, HOTPROBE_MECH_TRAP};
use hotprobe_testkit::Killed;
use hotprobe_testkit::{code_mappings, line_reader, text_differences};
use std::io::Write;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// A program the host started, the test's once the host is gone (the
/// test is a child subreaper): killed and reaped when dropped.
struct Orphan(i32);

impl Orphan {
    /// Waits for it: its exit code (or 128 + the signal).
    fn wait(&mut self) -> i32 {
        let mut st = 0;
        // SAFETY: a plain syscall on a process this test reaps.
        let r = unsafe { libc::waitpid(self.0, &mut st, 0) };
        assert_eq!(r, self.0, "waitpid {}", self.0);
        self.0 = 0;
        if libc::WIFEXITED(st) {
            libc::WEXITSTATUS(st)
        } else {
            128 + libc::WTERMSIG(st)
        }
    }
}

impl Drop for Orphan {
    fn drop(&mut self) {
        if self.0 > 0 {
            // SAFETY: plain syscalls on a process this test reaps.
            unsafe {
                libc::kill(self.0, libc::SIGKILL);
                libc::waitpid(self.0, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// The next line of `lines` within 30 s.
fn next_line(lines: &Receiver<String>, what: &str) -> String {
    lines
        .recv_timeout(Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("{what}: no line in 30 s ({e:?})"))
}

/// The steps program's input: 10 calls (the handler crashes at the 3rd),
/// 1,000 more once the host is gone, then the end.
const INPUT: [&str; 3] = ["10", "1000", "0"];

/// How the host gets the program.
#[derive(Clone, Copy, Debug)]
enum How {
    /// The test starts it, the host attaches.
    Attach,
    /// The host starts it.
    Spawn,
}

/// One case: the host crashes at its handler's 3rd call, the program runs
/// on its own code to its end. Its output lines after "ready".
fn crash_case(steps: &Path, host: &Path, how: How, mechanism: u32) -> Vec<String> {
    let name = format!("{how:?}, mechanism {mechanism}");
    let mut host_cmd = Command::new(host);
    host_cmd
        .arg(mechanism.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let (mut h, out, mut input, pid, mut target) = match how {
        How::Attach => {
            let mut prog = Killed(
                Command::new(steps)
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
            let input = prog.0.stdin.take().unwrap();
            let out = line_reader(prog.0.stdout.take().unwrap());
            let pid = prog.0.id();
            assert_eq!(next_line(&out, &name), format!("ready {pid}"));
            host_cmd.arg("attach").arg(pid.to_string());
            let h = Killed(host_cmd.stdin(Stdio::null()).spawn().unwrap());
            (h, out, input, pid, Ok(prog))
        }
        How::Spawn => {
            host_cmd.arg("spawn").arg(steps);
            let mut h = Killed(
                host_cmd
                    .stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .spawn()
                    .unwrap(),
            );
            let input: ChildStdin = h.0.stdin.take().unwrap();
            let out = line_reader(h.0.stdout.take().unwrap());
            let ready = next_line(&out, &name);
            let pid: u32 = ready
                .strip_prefix("ready ")
                .and_then(|p| p.parse().ok())
                .unwrap_or_else(|| panic!("{name}: {ready:?}"));
            (h, out, input, pid, Err(Orphan(pid as i32)))
        }
    };
    let host_lines = line_reader(h.0.stderr.take().unwrap());
    let mut said = vec![next_line(&host_lines, &name)];
    assert_eq!(said, ["probed"], "{name}");
    // The probe is in the text (the check below can see it).
    let file_len = std::fs::metadata(steps).unwrap().len() as usize;
    assert!(!code_mappings(pid, steps, file_len).is_empty());
    let probed = text_differences(pid, steps);
    assert!(!probed.is_empty(), "{name}: no probe in the text");
    writeln!(input, "{}", INPUT[0]).unwrap();
    // Everything the host printed, to its end.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match host_lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) => said.push(l),
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => panic!("{name}: the host runs on: {said:?}"),
        }
    }
    let status = h.0.wait().unwrap();
    assert_eq!(
        status.signal(),
        Some(libc::SIGSEGV),
        "{name}: host {status}: {said:?}"
    );
    // The handler ran for the first three calls, the third its last.
    assert_eq!(
        said,
        ["probed", "pre 1 arg 0", "pre 2 arg 1", "pre 3 arg 2"],
        "{name}"
    );
    let mut got = vec![next_line(&out, &name)];
    writeln!(input, "{}", INPUT[1]).unwrap();
    got.push(next_line(&out, &name));
    // 1,000 calls since the host died: the code is the file's again.
    let diffs = text_differences(pid, steps);
    assert!(
        diffs.is_empty(),
        "{name}: the text differs from the file after the host crashed: \
         (address, in memory, in the file) {diffs:x?}"
    );
    writeln!(input, "{}", INPUT[2]).unwrap();
    drop(input);
    for l in out.iter() {
        got.push(l);
    }
    let code = match &mut target {
        Ok(prog) => prog.0.wait().unwrap().code().unwrap_or(-1),
        Err(orphan) => orphan.wait(),
    };
    assert_eq!(code, 7, "{name}: {got:?}");
    eprintln!(
        "{name}: {} bytes of probe in the text; the host crashed at the handler's 3rd call; \
         the program ran on its own code: {got:?}",
        probed.len()
    );
    got
}

#[test]
fn a_crashed_c_handler_leaves_the_program_running_its_own_code() {
    // A program the host started is the test's to reap once the host died.
    // SAFETY: a plain prctl on this test process.
    assert_eq!(unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) }, 0);
    let dir = scratch("handler-crash");
    let programs = root().join("crates/hotprobe-capi/tests/programs");
    let steps = gcc(&programs.join("steps.c"), &dir.join("steps"), &["-O1"]);
    let host = c_api_program(&programs.join("crash_host.c"), &dir.join("crash_host"));
    // The program alone.
    let mut native = Command::new(&steps)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = native.stdin.take().unwrap();
    for l in INPUT {
        writeln!(input, "{l}").unwrap();
    }
    drop(input);
    let native = native.wait_with_output().unwrap();
    assert_eq!(native.status.code(), Some(7));
    let want: Vec<String> = text(&native.stdout)
        .lines()
        .skip(1)
        .map(String::from)
        .collect();
    // Sum of 3i + 1 for i in 0..1010.
    assert_eq!(
        want,
        [
            "calls 10 total 145",
            "calls 1010 total 1529645",
            "end calls 1010 total 1529645"
        ]
    );
    for (how, mechanism) in [
        (How::Attach, HOTPROBE_MECH_AUTO),
        (How::Attach, HOTPROBE_MECH_TRAP),
        (How::Spawn, HOTPROBE_MECH_AUTO),
    ] {
        let got = crash_case(&steps, &host, how, mechanism);
        assert_eq!(got, want, "{how:?}, mechanism {mechanism}");
    }
}
