//! The dynamic loader's rendezvous: spawn stops before constructors,
//! dlopen/dlclose come back as `ModulesChanged`, detach leaves the loader's
//! code as it was. The C programs are built with gcc at test time.

use hotprobe_process::{ProcessTarget, SpawnOptions};
use hotprobe_target::{ExitStatus, ResumeMode, RuntimeAddr, Target, TargetEvent, ThreadId};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

const LIB_C: &str = r#"
#include <unistd.h>
int lib_ready;
__attribute__((constructor)) static void lib_ctor(void) {
    lib_ready = 1;
    write(1, "lib-ctor\n", 9);
}
int lib_fn(int x) { return x + lib_ready; }
"#;

/// Linked against the library: both constructors write a line.
const CTOR_C: &str = r#"
#include <stdio.h>
#include <unistd.h>
int lib_fn(int);
__attribute__((constructor)) static void main_ctor(void) { write(1, "main-ctor\n", 10); }
int main(void) { printf("main %d\n", lib_fn(1)); return 0; }
"#;

/// dlopen, call, dlclose, dlopen again; with a second argument, waits for
/// a byte on stdin before each dlopen (saying "ready" on stderr).
const DLOPEN_C: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
static int call(const char *path, const char *what) {
    void *h = dlopen(path, RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    int (*f)(int) = (int (*)(int))dlsym(h, "lib_fn");
    printf("%s %d\n", what, f(1));
    fflush(stdout);
    if (dlclose(h) != 0) return 1;
    printf("closed\n");
    fflush(stdout);
    return 0;
}
static int wait_byte(int argc) {
    char c;
    if (argc <= 2) return 0;
    write(2, "ready\n", 6);
    return read(0, &c, 1) != 1;
}
int main(int argc, char **argv) {
    if (wait_byte(argc) || call(argv[1], "first")) return 1;
    if (wait_byte(argc) || call(argv[1], "second")) return 2;
    return 0;
}
"#;

/// Runs argv[1] with the remaining arguments.
const EXEC_C: &str = r#"
#include <unistd.h>
int main(int argc, char **argv) { (void)argc; execv(argv[1], argv + 1); return 127; }
"#;

/// The child of a fork dlopens the library (with the parent's breakpoints
/// gone from its memory).
const FORK_C: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
    (void)argc;
    pid_t c = fork();
    if (c == 0) {
        void *h = dlopen(argv[1], RTLD_NOW);
        _exit(h ? 0 : 1);
    }
    int st = 0;
    waitpid(c, &st, 0);
    printf("child %s\n", WIFEXITED(st) && WEXITSTATUS(st) == 0 ? "ok" : "failed");
    return 0;
}
"#;

/// dlmopen into a new namespace (its own r_debug, chained by r_next).
const DLMOPEN_C: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    (void)argc;
    void *h = dlmopen(LM_ID_NEWLM, argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 1; }
    int (*f)(int) = (int (*)(int))dlsym(h, "lib_fn");
    printf("ns %d\n", f(1));
    fflush(stdout);
    return dlclose(h) != 0;
}
"#;

struct Built {
    lib: PathBuf,
    ctor: PathBuf,
    ctor_static: PathBuf,
    dlopen: PathBuf,
    exec: PathBuf,
    fork: PathBuf,
    dlmopen: PathBuf,
}

/// Compile `src` (written beside `out`) with `pre` before the source and
/// `post` after it (libraries); `false` if gcc fails.
fn gcc(pre: &[&str], src: &str, post: &[&str], out: &Path) -> bool {
    let c = out.with_extension("c");
    std::fs::write(&c, src).unwrap();
    hotprobe_testkit::try_compile("gcc", &c, out, pre, post).is_ok()
}

fn built() -> &'static Built {
    static B: OnceLock<Built> = OnceLock::new();
    B.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("loader-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let d = dir.to_str().unwrap();
        let lib = dir.join("libhpctor.so");
        assert!(gcc(&["-shared", "-fPIC", "-g"], LIB_C, &[], &lib));
        let ctor = dir.join("ctor");
        let link = [
            format!("-L{d}"),
            format!("-Wl,-rpath,{d}"),
            "-lhpctor".into(),
        ];
        let link: Vec<&str> = link.iter().map(String::as_str).collect();
        assert!(gcc(&["-g"], CTOR_C, &link, &ctor));
        let ctor_static = dir.join("ctor-static");
        // libc6-dev's libc.a (setup.sh installs it).
        assert!(gcc(
            &["-static"],
            &format!("{LIB_C}\n{CTOR_C}"),
            &[],
            &ctor_static,
        ));
        let dlopen = dir.join("dlopen");
        assert!(gcc(&["-g"], DLOPEN_C, &["-ldl"], &dlopen));
        let exec = dir.join("exec");
        assert!(gcc(&["-g"], EXEC_C, &[], &exec));
        let fork = dir.join("fork");
        assert!(gcc(&["-g"], FORK_C, &["-ldl"], &fork));
        let dlmopen = dir.join("dlmopen");
        assert!(gcc(&["-g"], DLMOPEN_C, &["-ldl"], &dlmopen));
        Built {
            lib,
            ctor,
            ctor_static,
            dlopen,
            exec,
            fork,
            dlmopen,
        }
    })
}

/// A pipe: the read end (non-blocking) and the write end for the child.
fn pipe() -> (File, File) {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid 2-element array.
    let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    assert_eq!(r, 0);
    // SAFETY: valid descriptor just made, owned from here on.
    unsafe { libc::fcntl(fds[0], libc::F_SETFL, libc::O_NONBLOCK) };
    // SAFETY: both descriptors are fresh and owned by nobody else.
    unsafe {
        (
            File::from(OwnedFd::from_raw_fd(fds[0])),
            File::from(OwnedFd::from_raw_fd(fds[1])),
        )
    }
}

/// Everything readable from a non-blocking pipe now.
fn drain(r: &mut File, into: &mut String) {
    let mut buf = [0u8; 4096];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => into.push_str(&String::from_utf8_lossy(&buf[..n])),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => panic!("read: {e}"),
        }
    }
}

fn maps(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap()
}

fn spawn(prog: &Path, args: &[&str], stop_at_entry: bool) -> (ProcessTarget, File) {
    let (r, w) = pipe();
    let args: Vec<std::ffi::OsString> = args.iter().map(Into::into).collect();
    let t = ProcessTarget::spawn_with(
        prog,
        &args,
        &SpawnOptions {
            stdout: Some(w),
            stop_at_entry,
            ..Default::default()
        },
    )
    .expect("spawn");
    (t, r)
}

/// Resume everything and run to the end, resuming every stopped thread;
/// returns the `ModulesChanged` count.
fn run_to_exit(t: &mut ProcessTarget) -> (ExitStatus, usize) {
    t.resume_all().unwrap();
    let mut changes = 0;
    loop {
        match t.wait(Some(Duration::from_secs(30))).unwrap() {
            TargetEvent::Exited(st) => return (st, changes),
            TargetEvent::ModulesChanged { thread } => {
                changes += 1;
                t.resume(thread, ResumeMode::Continue).unwrap();
            }
            TargetEvent::Breakpoint { thread, .. } | TargetEvent::Stepped { thread, .. } => {
                t.resume(thread, ResumeMode::Continue).unwrap()
            }
            TargetEvent::Timeout => panic!("the program did not end"),
            _ => {}
        }
    }
}

#[test]
fn spawn_stops_before_constructors() {
    let b = built();
    let (mut t, mut out) = spawn(&b.ctor, &[], false);
    assert!(t.stopped_before_constructors());
    let bp = t.rendezvous_breakpoint().expect("the loader's rendezvous");
    let regs = t.registers(ThreadId(t.pid() as u64)).unwrap();
    assert_eq!(regs.rip, bp.0, "stopped at _dl_debug_state");
    let mut text = String::new();
    drain(&mut out, &mut text);
    assert_eq!(text, "", "no constructor ran yet");
    let m = maps(t.pid());
    for name in ["libhpctor.so", "libc.so.6", "/ctor\n"] {
        assert!(m.contains(name), "{name} not mapped:\n{m}");
    }
    // Masked for readers: the original code.
    let mut code = [0u8; 1];
    t.read_memory(bp, &mut code).unwrap();
    assert_ne!(code[0], 0xcc);
    let (st, changes) = run_to_exit(&mut t);
    assert_eq!(st, ExitStatus::Code(0));
    assert_eq!(changes, 0, "no dlopen in this program");
    drain(&mut out, &mut text);
    assert_eq!(text, "lib-ctor\nmain-ctor\nmain 2\n");
}

#[test]
fn stop_at_entry_keeps_the_old_stop() {
    let b = built();
    let (mut t, mut out) = spawn(&b.ctor, &[], true);
    assert!(!t.stopped_before_constructors());
    assert!(t.rendezvous_breakpoint().is_some(), "armed all the same");
    let mut text = String::new();
    drain(&mut out, &mut text);
    // Libraries' constructors ran; the program's own run from its entry
    // point (__libc_start_main).
    assert_eq!(text, "lib-ctor\n", "library constructors ran");
    let (st, _) = run_to_exit(&mut t);
    assert_eq!(st, ExitStatus::Code(0));
    drain(&mut out, &mut text);
    assert_eq!(text, "lib-ctor\nmain-ctor\nmain 2\n");
}

#[test]
fn static_program_runs_to_entry() {
    let b = built();
    let prog = &b.ctor_static;
    let (mut t, mut out) = spawn(prog, &[], false);
    assert!(!t.stopped_before_constructors());
    assert!(t.rendezvous_breakpoint().is_none());
    let (st, changes) = run_to_exit(&mut t);
    assert_eq!(st, ExitStatus::Code(0));
    assert_eq!(changes, 0);
    let mut text = String::new();
    drain(&mut out, &mut text);
    assert_eq!(text, "lib-ctor\nmain-ctor\nmain 2\n");
}

/// `lib_ready` of the library mapped in `pid`, if it is mapped.
fn lib_ready(t: &mut ProcessTarget, lib: &Path) -> Option<i32> {
    let syms = hotprobe_symbols::ProcessSymbols::for_pid(t.pid() as u32).unwrap();
    let m = syms.modules().iter().find(|m| m.path == lib)?;
    let sym = hotprobe_symbols::data_symbol(lib, "lib_ready")
        .unwrap()
        .expect("lib_ready");
    let mut b = [0u8; 4];
    t.read_memory(m.runtime(sym.addr), &mut b).unwrap();
    Some(i32::from_le_bytes(b))
}

#[test]
fn dlopen_and_dlclose_are_reported() {
    let b = built();
    let lib = b.lib.to_str().unwrap();
    let expected = Command::new(&b.dlopen).arg(lib).output().unwrap();
    assert!(expected.status.success());
    let expected = String::from_utf8(expected.stdout).unwrap();
    assert_eq!(
        expected,
        "lib-ctor\nfirst 2\nclosed\nlib-ctor\nsecond 2\nclosed\n"
    );

    let (mut t, mut out) = spawn(&b.dlopen, &[lib], false);
    assert!(t.stopped_before_constructors());
    assert_eq!(lib_ready(&mut t, &b.lib), None);
    t.resume_all().unwrap();
    let mut seen = Vec::new();
    let mut text = String::new();
    let status = loop {
        match t.wait(Some(Duration::from_secs(30))).unwrap() {
            TargetEvent::ModulesChanged { thread } => {
                assert_eq!(
                    t.registers(thread).unwrap().rip,
                    t.rendezvous_breakpoint().unwrap().0
                );
                drain(&mut out, &mut text);
                let mapped = maps(t.pid()).contains("libhpctor.so");
                let ready = lib_ready(&mut t, &b.lib);
                seen.push((mapped, ready, text.matches("lib-ctor").count()));
                t.resume(thread, ResumeMode::Continue).unwrap();
            }
            TargetEvent::Exited(st) => break st,
            TargetEvent::Timeout => panic!("the program did not end; seen {seen:?}"),
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(status, ExitStatus::Code(0));
    drain(&mut out, &mut text);
    assert_eq!(text, expected, "the program's output is unchanged");
    // After each dlopen: mapped, its constructor not run (global still 0,
    // nothing printed by it yet); after each dlclose: unmapped.
    assert_eq!(
        seen,
        vec![
            (true, Some(0), 0),
            (false, None, 1),
            (true, Some(0), 1),
            (false, None, 2),
        ]
    );
}

/// The bytes of `addr` in `pid`'s memory as the mapped file has them.
fn file_bytes(pid: i32, addr: u64, len: usize) -> Vec<u8> {
    let maps = hotprobe_symbols::read_maps(pid as u32).unwrap();
    let m = maps.iter().find(|m| m.contains(RuntimeAddr(addr))).unwrap();
    let f = File::open(m.path.as_ref().unwrap()).unwrap();
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, addr - m.start.0 + m.offset)
        .unwrap();
    b
}

fn raw_mem(pid: i32, addr: u64, len: usize) -> Vec<u8> {
    let f = File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, addr).unwrap();
    b
}

#[test]
fn attach_reports_dlopen_and_detach_restores_the_loader() {
    let b = built();
    let lib = b.lib.to_str().unwrap();
    let mut child = Command::new(&b.dlopen)
        .args([lib, "wait"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    // Past the loader's start-up, at its read.
    let mut ready = [0u8; 6];
    child
        .stderr
        .as_mut()
        .unwrap()
        .read_exact(&mut ready)
        .unwrap();
    assert_eq!(&ready, b"ready\n");
    let mut t = ProcessTarget::attach(pid).unwrap();
    assert!(!t.stopped_before_constructors());
    let bp = t
        .rendezvous_breakpoint()
        .expect("rendezvous found at attach")
        .0;
    let orig = file_bytes(pid, bp, 8);
    assert_eq!(raw_mem(pid, bp, 1), [0xcc]);
    let mut seen = vec![0u8; 8];
    t.read_memory(RuntimeAddr(bp), &mut seen).unwrap();
    assert_eq!(seen, orig, "reads mask the int3");

    t.resume_all().unwrap();
    child.stdin.as_mut().unwrap().write_all(b"g").unwrap();
    // The first dlopen is reported.
    let thread = match t.wait(Some(Duration::from_secs(30))).unwrap() {
        TargetEvent::ModulesChanged { thread } => thread,
        other => panic!("expected ModulesChanged, got {other:?}"),
    };
    assert!(maps(pid).contains("libhpctor.so"));
    assert_eq!(t.registers(thread).unwrap().rip, bp);
    // Detach with the thread still stopped at the rendezvous.
    t.detach().unwrap();
    drop(t);
    // The program waits before its second dlopen: still there to be read.
    assert_eq!(raw_mem(pid, bp, 8), orig, "detach restores _dl_debug_state");
    child.stdin.as_mut().unwrap().write_all(b"g").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        "lib-ctor\nfirst 2\nclosed\nlib-ctor\nsecond 2\nclosed\n"
    );
}

#[test]
fn exec_rearms_the_rendezvous() {
    let b = built();
    let (mut t, mut out) = spawn(&b.exec, &[b.ctor.to_str().unwrap()], false);
    assert!(t.stopped_before_constructors());
    let before = t.rendezvous_breakpoint();
    t.resume_all().unwrap();
    let mut text = String::new();
    let mut after_exec = None;
    let status = loop {
        match t.wait(Some(Duration::from_secs(30))).unwrap() {
            TargetEvent::Exec => {
                assert!(
                    t.rendezvous_breakpoint().is_some(),
                    "armed at the exec stop"
                );
                after_exec = Some(Vec::new());
                for th in t.threads() {
                    t.resume(th, ResumeMode::Continue).unwrap();
                }
            }
            TargetEvent::ModulesChanged { thread } => {
                // The new image's libraries, before their constructors.
                drain(&mut out, &mut text);
                let m = maps(t.pid());
                after_exec.as_mut().expect("after the exec").push((
                    m.contains("libhpctor.so"),
                    m.contains("/ctor\n"),
                    text.clone(),
                ));
                t.resume(thread, ResumeMode::Continue).unwrap();
            }
            TargetEvent::Exited(st) => break st,
            TargetEvent::Timeout => panic!("the program did not end"),
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(status, ExitStatus::Code(0));
    assert!(before.is_some());
    assert_eq!(after_exec, Some(vec![(true, true, String::new())]));
    drain(&mut out, &mut text);
    assert_eq!(text, "lib-ctor\nmain-ctor\nmain 2\n");
}

#[test]
fn forked_child_runs_the_loader_untouched() {
    let b = built();
    let (mut t, mut out) = spawn(&b.fork, &[b.lib.to_str().unwrap()], false);
    t.resume_all().unwrap();
    let status = loop {
        match t.wait(Some(Duration::from_secs(30))).unwrap() {
            TargetEvent::Forked { thread, child } => {
                t.release_fork_child(child, &[]).unwrap();
                t.resume(thread, ResumeMode::Continue).unwrap();
            }
            TargetEvent::Exited(st) => break st,
            TargetEvent::Timeout => panic!("the program did not end"),
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(status, ExitStatus::Code(0));
    let mut text = String::new();
    drain(&mut out, &mut text);
    assert_eq!(text, "lib-ctor\nchild ok\n");
}

#[test]
fn engine_breakpoint_at_the_rendezvous_is_shared() {
    let b = built();
    let lib = b.lib.to_str().unwrap();
    let (mut t, mut out) = spawn(&b.dlopen, &[lib], false);
    let bp = t.rendezvous_breakpoint().unwrap();
    t.insert_breakpoint(bp).unwrap();
    assert!(t.insert_breakpoint(bp).is_err(), "inserted once");
    let leader = ThreadId(t.pid() as u64);
    // Resuming from the spawn stop runs into the engine's breakpoint first.
    t.resume(leader, ResumeMode::Continue).unwrap();
    let mut events = String::new();
    let status = loop {
        match t.wait(Some(Duration::from_secs(30))).unwrap() {
            TargetEvent::ModulesChanged { thread } => {
                events.push('M');
                t.resume(thread, ResumeMode::Continue).unwrap();
            }
            TargetEvent::Breakpoint { thread, addr, regs } => {
                assert_eq!(addr, bp);
                events.push('B');
                // Do what the engine would: run the `ret` itself.
                let mut r = regs;
                r.rip = t.read_u64(RuntimeAddr(regs.rsp)).unwrap();
                r.rsp += 8;
                t.set_registers(thread, &r).unwrap();
                t.resume(thread, ResumeMode::Continue).unwrap();
                if events.len() == 7 {
                    // Removing the engine's breakpoint keeps the internal one.
                    t.remove_breakpoint(bp).unwrap();
                    assert!(t.remove_breakpoint(bp).is_err());
                }
            }
            TargetEvent::Exited(st) => break st,
            TargetEvent::Timeout => panic!("the program did not end: {events}"),
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(status, ExitStatus::Code(0));
    // The spawn stop (B), then for the first dlopen and dlclose: RT_ADD or
    // RT_DELETE (B), RT_CONSISTENT (M then B); after the removal, the
    // second dlopen and dlclose: M alone.
    assert_eq!(events, "BBMBBMBMM");
    let mut text = String::new();
    drain(&mut out, &mut text);
    assert_eq!(
        text,
        "lib-ctor\nfirst 2\nclosed\nlib-ctor\nsecond 2\nclosed\n"
    );
}

#[test]
fn dlmopen_namespace_changes_are_reported() {
    let b = built();
    let (mut t, mut out) = spawn(&b.dlmopen, &[b.lib.to_str().unwrap()], false);
    t.resume_all().unwrap();
    let mut seen = Vec::new();
    let mut text = String::new();
    let status = loop {
        match t.wait(Some(Duration::from_secs(30))).unwrap() {
            TargetEvent::ModulesChanged { thread } => {
                drain(&mut out, &mut text);
                seen.push((maps(t.pid()).contains("libhpctor.so"), text.clone()));
                t.resume(thread, ResumeMode::Continue).unwrap();
            }
            TargetEvent::Exited(st) => break st,
            TargetEvent::Timeout => panic!("the program did not end"),
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(status, ExitStatus::Code(0));
    assert_eq!(
        seen,
        vec![(true, String::new()), (false, "lib-ctor\nns 2\n".into())]
    );
}
