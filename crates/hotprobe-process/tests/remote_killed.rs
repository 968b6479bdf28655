//! Issue 22 item 3: a tracer SIGKILLed in the midst of a remote system
//! call (the agent's injection, trampoline pages, the detach's last
//! `munmap`) or a remote function call (the injection's `dlopen`, `dlsym`
//! and the agent's attach) leaves the thread as it was. The thread's
//! registers are borrowed for the call; the signal frame under its stack
//! gives them back (`remote_frame.rs`), and the call's stops are
//! system-call stops, which a tracer's death ends without a signal (a
//! single-step's SIGTRAP stop sends the program that SIGTRAP).
//!
//! The program (tests/programs/vector_state.c) holds a pattern in the
//! upper halves of two AVX registers and checks it on every round of its
//! loop, which makes a `poll` system call each time. A tracer (this test
//! binary run again, as [`remote_call_loop`]) attaches and makes remote
//! calls on it without end, printing a line after each: `getpid` system
//! calls, or calls of libc's `usleep(300)` (which sleeps in a system call:
//! most kills land inside the function) and `strnlen` (an AVX2 function
//! in glibc, ending in `vzeroupper`) in turn. The test kills it with
//! SIGKILL after a number of lines drawn from a seed it prints
//! (`HOTPROBE_KILL_SEED` repeats it), ten times over one program. The
//! program must run on, keep its pattern, and end with its own output and
//! status.

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use hotprobe_testkit::{compile, line_reader, shared_programs, SeededMoments, TempDir};

/// The variable that makes [`remote_call_loop`] the tracer of a pid.
const LOOP_PID: &str = "HOTPROBE_REMOTE_LOOP_PID";
/// The variable that says which calls [`remote_call_loop`] makes:
/// `syscalls` or `functions`.
const LOOP_CALLS: &str = "HOTPROBE_REMOTE_LOOP_CALLS";
/// Tracers killed per run of the test.
const KILLS: u64 = 10;
/// The longest a step here may take; longer is a hang.
const LIMIT: Duration = Duration::from_secs(30);

fn program(dir: &TempDir) -> PathBuf {
    compile(
        "gcc",
        &shared_programs().join("vector_state.c"),
        &dir.path().join("vector_state"),
        &["-O1", "-mno-avx"],
        &[],
    )
}

/// Not a test alone: the tracer the tests below run and kill. Attaches to
/// `$HOTPROBE_REMOTE_LOOP_PID` and makes remote calls (`$HOTPROBE_REMOTE_LOOP_CALLS`)
/// until killed, each checked, with a line after each.
#[test]
#[ignore = "the tracer of the tests of this file, which run it"]
fn remote_call_loop() {
    let pid: i32 = std::env::var(LOOP_PID)
        .expect("run by a test of this file, which sets the pid")
        .parse()
        .expect("a pid");
    let functions = match std::env::var(LOOP_CALLS).as_deref() {
        Ok("syscalls") => false,
        Ok("functions") => true,
        other => panic!("{LOOP_CALLS}: {other:?}"),
    };
    let syms = hotprobe_symbols::ProcessSymbols::for_pid(pid as u32).expect("the maps");
    let libc = syms
        .modules()
        .iter()
        .find(|m| m.name.starts_with("libc.so"))
        .expect("libc in the program");
    let libc_fn = |n: &str| libc.runtime(libc.module.find(n).expect(n).addr).0;
    let (usleep, strnlen_resolver) = (libc_fn("usleep"), libc_fn("strnlen"));
    let mut t = hotprobe_process::ProcessTarget::attach(pid).expect("attach");
    let mut out = std::io::stdout().lock();
    use hotprobe_process::remote_call::{remote_call, remote_syscall};
    let timeout = Duration::from_secs(10);
    // glibc's `strnlen` is an IFUNC: its symbol's code is the resolver,
    // which returns the implementation for this CPU (AVX2 or EVEX).
    let strnlen = match functions {
        true => remote_call(&mut t, strnlen_resolver, &[], timeout).expect("strnlen's resolver"),
        false => 0,
    };
    assert!(
        !functions || (strnlen != 0 && strnlen != strnlen_resolver),
        "strnlen's resolver gave {strnlen:#x}"
    );
    for i in 0u64.. {
        if !functions {
            let r = remote_syscall(&mut t, libc::SYS_getpid as u64, &[]).expect("remote getpid");
            assert_eq!(r, pid as u64, "remote getpid");
        } else if i % 2 == 0 {
            let r = remote_call(&mut t, usleep, &[300], timeout).expect("remote usleep");
            assert_eq!(r as u32, 0, "remote usleep");
        } else {
            // The first bytes of usleep's code, none of them 0 in 3.
            let r = remote_call(&mut t, strnlen, &[usleep, 3], timeout).expect("remote strnlen");
            assert_eq!(r, 3, "remote strnlen");
        }
        writeln!(out, "call {i}").unwrap();
        out.flush().unwrap();
    }
}

#[test]
fn a_tracer_killed_during_remote_system_calls_leaves_the_program_as_it_was() {
    killed_during("syscalls");
}

#[test]
fn a_tracer_killed_during_remote_function_calls_leaves_the_program_as_it_was() {
    killed_during("functions");
}

/// Runs the program, and the tracer making `calls` on it killed
/// [`KILLS`] times (see the module docs).
fn killed_during(calls: &str) {
    let dir = TempDir::new("remote-killed");
    let prog = program(&dir);
    let mut moments = SeededMoments::from_env("HOTPROBE_KILL_SEED", "kill moments");
    let seed = moments.seed();
    let mut child = Command::new(&prog)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let ready = lines.next().unwrap().unwrap();
    let pid = ready.strip_prefix("ready ").expect("ready PID").to_string();
    for kill in 0..KILLS {
        let calls_before_kill = moments.in_range(1..400);
        let ctx = format!(
            "kill {kill} (HOTPROBE_KILL_SEED={seed}): after {calls_before_kill} remote {calls}"
        );
        let mut tracer = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "remote_call_loop", "--ignored", "--nocapture"])
            .env(LOOP_PID, &pid)
            .env(LOOP_CALLS, calls)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let said = line_reader(tracer.stdout.take().unwrap());
        let complaints = line_reader(tracer.stderr.take().unwrap());
        let mut calls = 0;
        while calls < calls_before_kill {
            let Ok(l) = said.recv_timeout(LIMIT) else {
                let why: Vec<String> = complaints.try_iter().take(3).collect();
                let _ = tracer.kill();
                let program = child.wait();
                panic!("{ctx}: the tracer stopped after {calls} calls: {why:#?}; the program: {program:?}")
            };
            if l.starts_with("call ") {
                calls += 1;
            }
        }
        tracer.kill().unwrap();
        tracer.wait().unwrap();
        if let Some(status) = child.try_wait().unwrap() {
            panic!("{ctx}: the program ended with {status}");
        }
    }
    // A program killed meanwhile reads nothing: its status says it below.
    let _ = child.stdin.take().unwrap().write_all(b"stop\n");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let out: Vec<String> = lines.map_while(Result::ok).collect();
        let status = child.wait();
        let _ = tx.send((out, status));
    });
    let (out, status) = rx.recv_timeout(LIMIT).expect("the program never ended");
    let status = status.unwrap();
    assert!(
        status.success(),
        "HOTPROBE_KILL_SEED={seed}: the program ended with {status}, printing {out:?}"
    );
    assert_eq!(
        out,
        vec!["checks>0 1 changed 0".to_string()],
        "HOTPROBE_KILL_SEED={seed}: the program's output (its AVX registers' upper halves kept)"
    );
}
