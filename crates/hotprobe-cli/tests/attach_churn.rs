//! `count -p` on a program that makes threads all the time
//! (tests/programs/thread_rounds.c), attached and detached five times: the
//! program runs on unchanged — it exits 0 at SIGTERM with 4,000 calls a
//! round, no thread lost or started twice — and every run ends cleanly.
//! Before, the remote calls of attach and detach could run on a thread
//! parked inside its clone3 call, which then returned -ENOSYS to glibc:
//! "remote mmap failed: errno 38" at attach, SIGSEGV after detach (a
//! thread started again with clone on the same stack), about 1 run in 5.

use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, line_reader, text};

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
    let ready = out.recv_timeout(LIMIT).expect("the program's ready line");
    let pid = ready.strip_prefix("ready ").expect("ready PID").to_string();
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
