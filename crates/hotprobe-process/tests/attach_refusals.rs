//! Processes `ProcessTarget::attach` refuses, each with its own error and
//! before any ptrace call: init, hotprobe's own process (and threads),
//! kernel threads, zombies, processes another tracer holds. The refused
//! processes run on as they were.

use hotprobe_process::{ProcessError, ProcessTarget};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A field of `/proc/PID/status` (its first word).
fn status_field(pid: i32, key: &str) -> Option<String> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        (k == key).then(|| v.split_whitespace().next().unwrap_or("").to_string())
    })
}

fn wait_for(what: &str, mut ok: impl FnMut() -> bool) {
    let t0 = Instant::now();
    while !ok() {
        assert!(t0.elapsed() < Duration::from_secs(10), "{what}: timed out");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn refusal(pid: i32) -> ProcessError {
    match ProcessTarget::attach(pid) {
        Ok(_) => panic!("attached to pid {pid}"),
        Err(e) => e,
    }
}

#[test]
fn init_is_refused() {
    let e = refusal(1);
    assert!(matches!(e, ProcessError::IsInit { pid: 1 }), "{e:?}");
    assert_eq!(
        e.to_string(),
        "pid 1 is init: hotprobe does not attach to it"
    );
    assert_eq!(status_field(1, "TracerPid").as_deref(), Some("0"));
}

#[test]
fn own_process_and_threads_are_refused() {
    let me = std::process::id() as i32;
    let e = refusal(me);
    assert!(
        matches!(e, ProcessError::IsSelf { pid } if pid == me),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!("pid {me} is hotprobe itself: it cannot probe its own process")
    );
    // One of its threads.
    let (tx, rx) = std::sync::mpsc::channel();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let th = std::thread::spawn(move || {
        // SAFETY: gettid has no preconditions.
        tx.send(unsafe { libc::gettid() }).unwrap();
        let _ = done_rx.recv();
    });
    let tid = rx.recv().unwrap();
    assert_ne!(tid, me);
    let e = refusal(tid);
    assert!(
        matches!(e, ProcessError::IsSelf { pid } if pid == tid),
        "{e:?}"
    );
    done_tx.send(()).unwrap();
    th.join().unwrap();
}

#[test]
fn kernel_threads_are_refused() {
    // In a pid namespace there is no kthreadd to try: that is said with
    // HOTPROBE_SKIP_KTHREADD=1, never passed over in silence.
    let skip = std::env::var_os("HOTPROBE_SKIP_KTHREADD").is_some();
    let comm = std::fs::read_to_string("/proc/2/comm").unwrap_or_default();
    if comm.trim() != "kthreadd" {
        assert!(
            skip,
            "pid 2 is {comm:?}, not kthreadd (a pid namespace?): set HOTPROBE_SKIP_KTHREADD=1 \
             to skip this test"
        );
        eprintln!("pid 2 is {comm:?}, not kthreadd: skipped (HOTPROBE_SKIP_KTHREADD)");
        return;
    }
    let e = refusal(2);
    assert!(
        matches!(&e, ProcessError::KernelThread { pid: 2, what } if what == "kthreadd"),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        "pid 2 is a kernel thread (kthreadd): only user processes can be probed"
    );
    // A child of kthreadd.
    let child = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .find(|&p| p > 2 && status_field(p, "PPid").as_deref() == Some("2"))
        .expect("a kernel thread besides kthreadd");
    let e = refusal(child);
    assert!(
        matches!(&e, ProcessError::KernelThread { pid, what }
            if *pid == child && what == "kthreadd's child"),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "pid {child} is a kernel thread (kthreadd's child): only user processes can be probed"
        )
    );
}

#[test]
fn zombies_are_refused() {
    let me = std::process::id() as i32;
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id() as i32;
    wait_for("the child to be a zombie", || {
        status_field(pid, "State").as_deref() == Some("Z")
    });
    let e = refusal(pid);
    assert!(
        matches!(e, ProcessError::Zombie { pid: p, parent } if p == pid && parent == me),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!("pid {pid} is a zombie (exited, not yet reaped by its parent {me})")
    );
    // Still ours to reap, as it ended.
    assert!(child.wait().unwrap().success());
}

/// tests/programs/tracer.c, built once.
fn tracer() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/tracer.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("attach-refusals");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join("tracer");
    hotprobe_testkit::compile("gcc", &src, &out, &["-O2"], &[])
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
    let tracer_pid = tr.id() as i32;
    let mut line = String::new();
    BufReader::new(tr.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), format!("seized {pid}"));
    assert_eq!(status_field(pid, "TracerPid"), Some(tracer_pid.to_string()));

    let e = refusal(pid);
    assert!(
        matches!(&e, ProcessError::AlreadyTraced { pid: p, tracer, tracer_name }
            if *p == pid && *tracer == tracer_pid && tracer_name == "tracer"),
        "{e:?}"
    );
    assert_eq!(
        e.to_string(),
        format!(
            "pid {pid} is already traced by pid {tracer_pid} (tracer): detach that tracer first"
        )
    );
    // Untouched: still held by its tracer, and sleeping (not stopped: a
    // seize that got through would leave it in a ptrace stop, `t`). Read
    // until it sleeps: just spawned, `sleep` may still be running on its
    // way into nanosleep (`R`, seen once).
    assert_eq!(status_field(pid, "TracerPid"), Some(tracer_pid.to_string()));
    wait_for("sleep to sleep", || {
        let state = status_field(pid, "State");
        assert_ne!(state.as_deref(), Some("t"), "stopped by the refused attach");
        state.as_deref() == Some("S")
    });

    // Once the tracer is gone, attaching works.
    drop(tr.stdin.take());
    assert!(tr.wait().unwrap().success());
    wait_for("the tracer's detach", || {
        status_field(pid, "TracerPid").as_deref() == Some("0")
    });
    let t = ProcessTarget::attach(pid).expect("attach once untraced");
    drop(t);
    tracee.kill().unwrap();
    let _ = tracee.wait();
}
