//! `-p PID` refusals, each one error line (exit code 1) saying why, before
//! anything is done to the process: init, hotprobe itself, the shell that
//! waits for it (`-p $$`), kernel threads, zombies, processes another
//! tracer holds.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{gcc, hotprobe_within, output_within, text, HOTPROBE};

const LIMIT: Duration = Duration::from_secs(60);

fn status_field(pid: i32, key: &str) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == key).then(|| v.split_whitespace().next().unwrap_or("").to_string())
    })
}

/// Exit code 1 and exactly this one line on stderr, nothing on stdout.
fn assert_refused(o: &Output, message: &str) {
    assert_eq!(
        o.status.code(),
        Some(1),
        "stdout:\n{}\nstderr:\n{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    assert_eq!(text(&o.stderr), format!("hotprobe: error: {message}\n"));
    assert_eq!(text(&o.stdout), "");
}

#[test]
fn init_is_refused() {
    for cmd in ["count", "trace"] {
        let o = hotprobe_within(&[cmd, "getpid", "-p", "1"], LIMIT);
        assert_refused(&o, "pid 1 is init: hotprobe does not attach to it");
    }
    assert_eq!(status_field(1, "TracerPid").as_deref(), Some("0"));
}

#[test]
fn hotprobe_itself_and_the_shell_waiting_for_it_are_refused() {
    // `exec`: the shell's $$ becomes hotprobe's own pid.
    let mut c = Command::new("sh");
    c.args(["-c", "exec \"$0\" count getpid -p $$", HOTPROBE]);
    let o = output_within(c, LIMIT);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("hotprobe: error: pid ")
            && err.ends_with(" is hotprobe itself: it cannot probe its own process\n"),
        "{err}"
    );
    // Without exec, $$ is the shell, blocked until hotprobe exits.
    let mut c = Command::new("sh");
    c.args([
        "-c",
        "\"$0\" count getpid -p $$; echo \"rc=$? shell=$$\"",
        HOTPROBE,
    ]);
    let o = output_within(c, LIMIT);
    let out = text(&o.stdout);
    let shell = out
        .trim()
        .strip_prefix("rc=1 shell=")
        .unwrap_or_else(|| panic!("{out}\n{}", text(&o.stderr)));
    assert_eq!(
        text(&o.stderr),
        format!(
            "hotprobe: error: pid {shell} is hotprobe's parent, waiting for hotprobe to exit \
             (a shell's $$?): hotprobe does not attach to it; give the pid of the program to \
             probe\n"
        )
    );
}

#[test]
fn kernel_threads_are_refused() {
    assert!(
        std::fs::read_to_string("/proc/2/comm").is_ok_and(|c| c.trim() == "kthreadd"),
        "no kthreadd at pid 2: this test needs the host's pid namespace"
    );
    let o = hotprobe_within(&["count", "getpid", "-p", "2"], LIMIT);
    assert_refused(
        &o,
        "pid 2 is a kernel thread (kthreadd): only user processes can be probed",
    );
    let child = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|&p| p > 2 && status_field(p, "PPid").as_deref() == Some("2"))
        .expect("a kernel thread besides kthreadd");
    let pid = child.to_string();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("refusals-record");
    for args in [
        vec!["count", "getpid", "-p", &pid],
        vec!["trace", "getpid", "-p", &pid],
        vec!["record", "-o", dir.to_str().unwrap(), "-p", &pid],
        vec!["list", "-p", &pid, "--blacklist"],
    ] {
        let o = hotprobe_within(&args, LIMIT);
        assert_refused(
            &o,
            &format!(
                "pid {child} is a kernel thread (kthreadd's child): only user processes can be \
                 probed"
            ),
        );
    }
    assert!(!dir.exists(), "record wrote nothing");
}

#[test]
fn zombies_are_refused() {
    let me = std::process::id();
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    let t0 = Instant::now();
    while status_field(pid, "State").as_deref() != Some("Z") {
        assert!(t0.elapsed() < Duration::from_secs(10), "no zombie");
        std::thread::sleep(Duration::from_millis(10));
    }
    let o = hotprobe_within(&["count", "getpid", "-p", &pid.to_string()], LIMIT);
    assert_refused(
        &o,
        &format!("pid {pid} is a zombie (exited, not yet reaped by its parent {me})"),
    );
    assert!(child.wait().unwrap().success());
}

fn tracer() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/tracer.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli-programs");
    std::fs::create_dir_all(&dir).unwrap();
    gcc(&src, &dir.join("tracer"), &["-O2"])
}

#[test]
fn a_process_another_tracer_holds_is_refused() {
    let mut tracee = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = tracee.id() as i32;
    let mut tr = Command::new(tracer())
        .arg(pid.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(tr.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), format!("seized {pid}"));
    let o = hotprobe_within(&["count", "getpid", "-p", &pid.to_string()], LIMIT);
    assert_refused(
        &o,
        &format!(
            "pid {pid} is already traced by pid {} (tracer): detach that tracer first",
            tr.id()
        ),
    );
    // Still the other tracer's, still running.
    assert_eq!(status_field(pid, "TracerPid"), Some(tr.id().to_string()));
    assert_eq!(status_field(pid, "State").as_deref(), Some("S"));
    drop(tr.stdin.take());
    assert!(tr.wait().unwrap().success());
    tracee.kill().unwrap();
    let _ = tracee.wait();
}
