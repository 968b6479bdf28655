//! `watch -p PID --duration` on a process creating and ending threads all
//! the time (tests/programs/churn.c): every run ends after its duration
//! with exit code 0 and the summary, never "waitpid failed … Interrupted
//! system call" (a blocking waitpid interrupted by a signal is retried).

use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, line_reader, ready_pid, text};

const LIMIT: Duration = Duration::from_secs(60);

#[test]
fn watch_with_a_duration_under_thread_churn_ends_cleanly_five_times() {
    let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/churn.c");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("watch-churn");
    let bin = gcc(&src, &dir.join("churn"), &["-O0", "-pthread"]);
    let mut prog = Command::new(&bin)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = line_reader(prog.stdout.take().unwrap());
    let pid = ready_pid(&out, LIMIT).to_string();
    let mut failures = Vec::new();
    for run in 0..5 {
        let o = hotprobe_within(
            &["watch", "counter:4", "-p", &pid, "--duration", "0.5"],
            LIMIT,
        );
        let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
        if !o.status.success() || stderr.contains("error") || !stdout.contains("counter:4: ") {
            failures.push(format!(
                "run {run}: {}\nstderr:\n{stderr}\nstdout (end):\n{}",
                o.status,
                &stdout[stdout.len().saturating_sub(500)..]
            ));
        }
    }
    // SAFETY: a signal to the program this test started.
    unsafe { libc::kill(prog.id() as i32, libc::SIGKILL) };
    let _ = prog.wait();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
