//! `count -p` on a program that makes threads all the time
//! (tests/programs/thread_rounds.c), attached and detached five times: the
//! program runs on unchanged — it exits 0 at SIGTERM with 4,000 calls a
//! round, no thread lost or started twice — and every run ends cleanly.
//! Before, the remote calls of attach and detach could run on a thread
//! parked inside its clone3 call, which then returned -ENOSYS to glibc:
//! "remote mmap failed: errno 38" at attach, SIGSEGV after detach (a
//! thread started again with clone on the same stack), about 1 run in 5.
//! And a program holding values in the upper halves of its AVX registers
//! finds them unchanged after attach and detach.

use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, line_reader, ready_pid, text};

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn attach_and_detach_under_thread_churn_leave_the_program_unchanged() {
    let src =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/thread_rounds.c");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("attach-churn");
    let bin = gcc(&src, &dir.join("thread_rounds"), &["-O2", "-pthread"]);
    let mut prog = Command::new(&bin)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = line_reader(prog.stdout.take().unwrap());
    let pid = ready_pid(&out, LIMIT).to_string();
    let mut failures = Vec::new();
    for run in 0..5 {
        let o = hotprobe_within(&["count", "-p", &pid, "work", "--duration", "0.3"], LIMIT);
        let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
        let row = stdout
            .lines()
            .find(|l| l.starts_with("work "))
            .unwrap_or("");
        if !o.status.success() || !row.contains(" jump ") {
            failures.push(format!("run {run}: {}\n{stderr}\n{stdout}", o.status));
        }
    }
    // SAFETY: a signal to the program this test started.
    unsafe { libc::kill(prog.id() as i32, libc::SIGTERM) };
    let status = prog.wait().unwrap();
    let last = out.recv_timeout(LIMIT).expect("the program's last line");
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    assert!(status.success(), "the program ended with {status}: {last}");
    let f: Vec<&str> = last.split_whitespace().collect();
    assert_eq!(f.len(), 4, "{last}");
    let (rounds, calls): (u64, u64) = (f[1].parse().unwrap(), f[3].parse().unwrap());
    assert_eq!(calls, rounds * 4000, "{last}");
}

/// tests/programs/vector_state.c holds a pattern in the upper halves of
/// ymm0 and ymm9 while hotprobe attaches, counts `work` and detaches,
/// under the trap and the jump: the pattern never changes. Before, the
/// remote calls of attach and the detach's release code gave back the
/// x87/SSE state only ("changed 1": glibc's AVX code they run ends with
/// `vzeroupper`).
#[test]
fn attach_and_detach_keep_the_upper_halves_of_the_vector_registers() {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap();
    assert!(
        cpuinfo.split_whitespace().any(|w| w == "avx"),
        "this test needs a processor with AVX"
    );
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/programs/vector_state.c");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("attach-churn");
    let bin = gcc(&src, &dir.join("vector_state"), &["-O1", "-mno-avx"]);
    for mechanism in ["trap", "jump"] {
        let mut prog = Command::new(&bin)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = line_reader(prog.stdout.take().unwrap());
        let pid = ready_pid(&out, LIMIT).to_string();
        let o = hotprobe_within(
            &[
                "count",
                "-p",
                &pid,
                "work",
                "--mechanism",
                mechanism,
                "--duration",
                "0.3",
            ],
            LIMIT,
        );
        let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
        assert!(o.status.success(), "{mechanism}: {stdout}\n{stderr}");
        let row = stdout
            .lines()
            .find(|l| l.starts_with("work "))
            .unwrap_or("");
        let execution = row.split_whitespace().nth(4).unwrap_or("");
        assert_eq!(execution, mechanism, "{stdout}");
        // Its stdin closed: the program ends its loop.
        drop(prog.stdin.take());
        let last = out.recv_timeout(LIMIT).expect("the program's last line");
        assert!(prog.wait().unwrap().success());
        assert_eq!(last, "checks>0 1 changed 0", "{mechanism}");
    }
}
