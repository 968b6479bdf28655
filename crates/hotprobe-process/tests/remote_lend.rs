//! A remote call that runs long lends the other threads (`lend.rs`) and
//! lifts the loader's rendezvous `int3` meanwhile: once it returns, the
//! `int3` is back, with or without threads to lend. Before, a long call in
//! a one-thread process lifted it for good: the loads that followed were
//! never reported (a pending probe of a library the program loaded was
//! never armed) and the process could not be released. And a detach
//! hook's call lends a thread held at the rendezvous with its event taken.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::process::{ChildStdout, Command, Stdio};
use std::time::Duration;

use hotprobe_testkit::{compile, shared_programs, Killed, TempDir};

/// The byte at `_dl_debug_state` in `pid`'s memory, as the process sees it
/// (not through the target, which shows the bytes under its `int3`s).
fn rendezvous_byte(pid: u32) -> u8 {
    let syms = hotprobe_symbols::ProcessSymbols::for_pid(pid).expect("the maps");
    let ld = syms
        .modules()
        .iter()
        .find(|m| m.name.starts_with("ld-linux"))
        .expect("the loader");
    let at = ld.runtime(
        ld.module
            .find("_dl_debug_state")
            .expect("_dl_debug_state")
            .addr,
    );
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut b = [0u8];
    mem.read_exact_at(&mut b, at.0).unwrap();
    b[0]
}

/// libc's `usleep` in `pid`.
fn usleep_of(pid: u32) -> u64 {
    libc_function(pid, "usleep")
}

/// The address of libc's function `name` in `pid`.
fn libc_function(pid: u32, name: &str) -> u64 {
    let syms = hotprobe_symbols::ProcessSymbols::for_pid(pid).expect("the maps");
    let libc = syms
        .modules()
        .iter()
        .find(|m| m.name.starts_with("libc.so"))
        .expect("libc");
    libc.runtime(libc.module.find(name).expect(name).addr).0
}

/// Attaches to the program `args` starts (past its ready line), makes a
/// 300 ms remote call of `usleep`, and checks the rendezvous `int3` before
/// and after; the program then ends as it does alone.
fn long_call_keeps_the_rendezvous(prog: &std::path::Path, args: &[&str], end: &str) {
    let (child, mut out, pid) = started(prog, args);
    let mut t = hotprobe_process::ProcessTarget::attach(pid as i32).expect("attach");
    assert_eq!(rendezvous_byte(pid), 0xcc, "armed at attach");
    let r = hotprobe_process::remote_call::remote_call(
        &mut t,
        usleep_of(pid),
        &[300_000],
        Duration::from_secs(10),
    )
    .expect("remote usleep");
    assert_eq!(r as u32, 0, "usleep's result");
    assert_eq!(rendezvous_byte(pid), 0xcc, "back after the call");
    hotprobe_target::Target::detach(&mut t).expect("detach");
    assert_ne!(rendezvous_byte(pid), 0xcc, "taken out at detach");
    ends_as(child, &mut out, end);
}

/// tests/programs/threads.c, built in `dir`: 8 threads calling `work`,
/// started on a line read (`ITERS wait`).
fn threads_program(dir: &TempDir) -> std::path::PathBuf {
    compile(
        "gcc",
        &shared_programs().join("threads.c"),
        &dir.path().join("threads"),
        &["-O1"],
        &["-lpthread"],
    )
}

/// The program `args` starts, past its ready line: the child, its
/// stdout, its pid.
fn started(prog: &std::path::Path, args: &[&str]) -> (Killed, BufReader<ChildStdout>, u32) {
    let mut child = Killed(
        Command::new(prog)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id();
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut ready = String::new();
    out.read_line(&mut ready).unwrap();
    assert_eq!(ready.trim_end(), format!("ready {pid}"));
    (child, out, pid)
}

/// Sends the program its "go", and checks that the rest of its output is
/// `end` and that it exits 0.
fn ends_as(mut child: Killed, out: &mut BufReader<ChildStdout>, end: &str) {
    let mut stdin = child.0.stdin.take().unwrap();
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    let mut rest = String::new();
    std::io::Read::read_to_string(out, &mut rest).unwrap();
    assert_eq!(rest, end);
    assert!(child.0.wait().unwrap().success());
}

#[test]
fn a_long_remote_call_in_a_one_thread_process_puts_the_rendezvous_back() {
    let dir = TempDir::new("remote-lend-one");
    let prog = compile(
        "gcc",
        &shared_programs().join("vector_state.c"),
        &dir.path().join("vector_state"),
        &["-O1", "-mno-avx"],
        &[],
    );
    long_call_keeps_the_rendezvous(&prog, &[], "checks>0 1 changed 0\n");
}

#[test]
fn a_long_remote_call_that_lends_threads_puts_the_rendezvous_back() {
    let dir = TempDir::new("remote-lend-threads");
    let prog = threads_program(&dir);
    // 8 threads × 1000 calls of work(i) = i + 1, i < 1000.
    long_call_keeps_the_rendezvous(
        &prog,
        &["1000", "wait"],
        "threads 8 iters 1000 calls 8000 total 4004000\n",
    );
}

/// A remote call that does not return in time fails with what the other
/// threads did meanwhile (one of them may hold the lock it waited for: a
/// plugin loader's detach failed so, "did not finish within 10s", with
/// nothing to tell why): how many were let run, and each one left stopped
/// with why. The thread is brought back, and the program ends as alone.
#[test]
fn a_remote_call_that_times_out_says_which_threads_ran_meanwhile() {
    let dir = TempDir::new("remote-lend-timeout");
    let prog = threads_program(&dir);
    let (child, mut out, pid) = started(&prog, &["1000", "wait"]);
    let mut t = hotprobe_process::ProcessTarget::attach(pid as i32).expect("attach");
    let threads = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count();
    let e = hotprobe_process::remote_call::remote_call(
        &mut t,
        usleep_of(pid),
        &[5_000_000],
        Duration::from_millis(400),
    )
    .expect_err("a 5 s usleep within 400 ms");
    let why = e.to_string();
    assert!(
        why.contains(&format!(
            "did not return within 400ms ({} other threads let run; not run: none)",
            threads - 1
        )),
        "{why}"
    );
    hotprobe_target::Target::detach(&mut t).expect("detach");
    ends_as(
        child,
        &mut out,
        "threads 8 iters 1000 calls 8000 total 4004000\n",
    );
}

/// A program whose one loader thread `dlopen`s and `dlclose`s a plugin
/// without end; the main thread prints "ready PID", reads its stdin to
/// its end, then stops the loader and prints "loads>0 1".
const LOADER: &str = r#"
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
static const char *plugin;
static volatile int stop;
static long loads;
static void *loader(void *arg) {
    (void)arg;
    while (!stop) {
        void *h = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
        if (h) { dlclose(h); loads++; }
    }
    return 0;
}
int main(int argc, char **argv) {
    (void)argc;
    plugin = argv[1];
    pthread_t t;
    pthread_create(&t, 0, loader, 0);
    printf("ready %d\n", getpid());
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {}
    stop = 1;
    pthread_join(t, 0);
    printf("loads>0 %d\n", loads > 0);
    return 0;
}
"#;

/// A thread stopped at the loader's rendezvous inside its `dlopen` (the
/// loader's lock held), whose event the caller took and never handled,
/// is lent by a detach hook's remote call that needs the lock. Before,
/// only a thread whose event was still queued was lent: the agent's
/// `dlclose` at detach waited out its timeout, and the agent stayed
/// (hotprobe-cli's plugin_loader test under load).
#[test]
fn a_detach_hooks_remote_call_lends_a_thread_held_at_the_rendezvous() {
    let dir = TempDir::new("remote-lend-rendezvous");
    let src = hotprobe_testkit::write_source(dir.path(), "loader.c", LOADER);
    let plugin_src = hotprobe_testkit::write_source(
        dir.path(),
        "plugin.c",
        "int plugin_value(void) { return 42; }\n",
    );
    let plugin = compile(
        "gcc",
        &plugin_src,
        &dir.path().join("libplugin.so"),
        &["-O1", "-shared", "-fPIC"],
        &[],
    );
    let prog = compile(
        "gcc",
        &src,
        &dir.path().join("loader"),
        &["-O1"],
        &["-ldl", "-lpthread"],
    );
    let (child, mut out, pid) = started(&prog, &[plugin.to_str().unwrap()]);
    let mut t = hotprobe_process::ProcessTarget::attach(pid as i32).expect("attach");
    use hotprobe_target::{Target, TargetEvent};
    t.resume_all().unwrap();
    // The loader's next load stops at the rendezvous: its event is taken
    // here and never handled.
    let held = match t.wait(Some(Duration::from_secs(30))).expect("wait") {
        TargetEvent::ModulesChanged { thread } => thread,
        TargetEvent::Timeout => panic!("no load within 30 s"),
        e => panic!("unexpected event {e:?}"),
    };
    assert_ne!(held.0 as u32, pid, "the loader thread, not main");
    t.stop_all().unwrap();
    let dlopen = libc_function(pid, "dlopen");
    // `dlopen(NULL)` takes the loader's lock, as the agent's `dlclose` does.
    let (tx, rx) = std::sync::mpsc::channel();
    t.on_detach(move |t| {
        let r = hotprobe_process::remote_call::remote_call(
            t,
            dlopen,
            &[0, libc::RTLD_NOW as u64],
            Duration::from_secs(10),
        );
        tx.send(r.map_err(|e| e.to_string())).unwrap();
    });
    t.detach().expect("detach");
    let handle = rx.recv().unwrap().expect("the hook's dlopen(NULL)");
    assert_ne!(handle, 0, "dlopen(NULL) returned NULL");
    ends_as(child, &mut out, "loads>0 1\n");
}
