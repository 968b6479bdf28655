//! Issue 22: `hotprobe count -p PID` (the ptrace trap, and the fast
//! path) on a running program that installed its own `SIGTRAP` handler
//! (and, in a second case, blocks `SIGTRAP`). Attaching injects the agent, whose own `SIGTRAP` handler
//! (for a tracer that dies) then holds the kernel's disposition: before,
//! the program read back the agent's handler and flags through
//! `sigaction` while attached and lost its handler's `sa_mask` after the
//! detach; where it blocked `SIGTRAP`, the injection's traps unblocked it
//! and reset its handler to `SIG_DFL` for good.
//!
//! Now the program's own report — its handler, flags and `sa_mask` as
//! `sigaction` reads them back, whether `SIGTRAP` is blocked, the
//! `SIGTRAP`s its handler took (and that `SIGUSR1`, in its `sa_mask`, was
//! blocked inside it) — is the same before, during and after the session,
//! and every line it prints is the native run's. `/proc/PID/status`'s
//! `SigBlk`, `SigIgn` and `SigCgt` are the same too (the program's
//! handler keeps `SIGTRAP` caught anyway; a program with `SIGTRAP` at
//! `SIG_DFL` would see it caught while attached: see the agent's
//! `progtrap`). Every call made while attached is counted.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Instant;

mod common;
use common::{kill_group, line_reader, CountTable, HOTPROBE};

mod sigtrap_own_support;
use sigtrap_own_support::{build, Own, LIMIT};

/// The commands before the attach, while attached, after the detach.
/// Each part raises SIGTRAP once: it reaches the program's handler, or
/// stays pending where the program blocks SIGTRAP.
fn script() -> [Vec<&'static str>; 3] {
    [
        vec!["report", "sig 20", "raise", "report"],
        vec!["report", "call 100", "sig 200", "raise", "report"],
        vec!["report", "sig 50", "call 10", "raise", "report"],
    ]
}

/// The native run: every answer.
fn native(bin: &std::path::Path, args: &[&str]) -> Vec<String> {
    let mut p = Own::start(bin, args);
    let mut out = Vec::new();
    for part in script() {
        for c in part {
            out.push(p.ask(c));
        }
    }
    let (last, status) = p.quit();
    out.push(last);
    assert_eq!(status, Some(5), "natively: {out:?}");
    out
}

/// `hotprobe count -p PID MECH probed` on the program started with `args`
/// (see the module docs); the probe's execution starts with `exec`.
fn check(args: &[&str], mech: &[&str], exec: &str) {
    let bin = build(false);
    let want = native(&bin, args);
    let [before, during, after] = script();
    let mut p = Own::start(&bin, args);
    let mut got = Vec::new();
    for c in before {
        got.push(p.ask(c));
    }
    let masks = p.proc_masks();
    let pid = p.pid.to_string();
    let mut hp_args = vec!["count", "-p", &pid];
    hp_args.extend_from_slice(mech);
    hp_args.push("probed");
    let mut hp = Command::new(HOTPROBE)
        .args(&hp_args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let group = hp.id() as i32;
    let errs = line_reader(hp.stderr.take().unwrap());
    let mut said = Vec::new();
    let deadline = Instant::now() + LIMIT;
    while !said.iter().any(|l: &String| l.contains("attached to pid")) {
        match errs.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) => said.push(l),
            Err(e) => {
                kill_group(group);
                panic!("{args:?}: not attached ({e}): {said:?}");
            }
        }
    }
    let ctx = |said: &[String]| format!("{args:?} {mech:?}: hotprobe said {said:?}");
    // The case of the issue: the agent is injected.
    assert!(p.has_agent(), "{}", ctx(&said));
    for c in during {
        got.push(p.ask(c));
    }
    assert_eq!(p.proc_masks(), masks, "while attached: {}", ctx(&said));
    // SAFETY: a plain syscall on the child this test started.
    unsafe { libc::kill(hp.id() as i32, libc::SIGINT) };
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut hp.stdout.take().unwrap(), &mut stdout).unwrap();
    let status = hp.wait().unwrap();
    said.extend(errs.iter());
    kill_group(group);
    assert!(status.success(), "{status:?}: {}", ctx(&said));
    assert!(
        !p.has_agent(),
        "the agent stays after the detach: {}",
        ctx(&said)
    );
    assert_eq!(p.proc_masks(), masks, "after the detach: {}", ctx(&said));
    for c in after {
        got.push(p.ask(c));
    }
    let (last, code) = p.quit();
    got.push(last);
    assert_eq!(code, Some(5), "{}", ctx(&said));
    assert_eq!(got, want, "the program's own lines: {}", ctx(&said));
    let t = CountTable::parse(&stdout, &said.join("\n"));
    assert_eq!(t.hits("probed"), 100, "{stdout}\n{}", ctx(&said));
    assert!(t.execution("probed").starts_with(exec), "{stdout}");
}

/// With the ptrace trap: the agent is injected all the same, and its
/// handler holds the disposition.
#[test]
fn a_programs_own_sigtrap_handler_is_what_it_sees_before_during_and_after_an_attach() {
    check(&[], &["--mechanism", "trap"], "trap");
}

#[test]
fn a_program_blocking_sigtrap_keeps_its_mask_and_handler_through_an_attach() {
    check(&["block"], &["--mechanism", "trap"], "trap");
}

/// With the fast path (a jump: no ptrace breakpoint, no signal-state
/// site): the agent's `sigaction` and `signal` are bound into the
/// program's GOT (the agent's `gotbind`).
#[test]
fn under_the_fast_path_the_program_sees_its_own_sigtrap_handler_and_mask() {
    check(&[], &[], "jump");
    check(&["block"], &[], "jump");
}

/// The native answers of the script hold what the tests compare: the
/// handler's own view, and a raise handled (or pending where blocked).
#[test]
fn the_script_reports_the_programs_own_view() {
    let bin = build(false);
    let open = native(&bin, &[]);
    assert_eq!(
        open[0],
        "handler=on_trap flags=0x14000004 usr1_in_mask=1 trap_blocked=0 handled=0 usr1_inside=-1"
    );
    assert!(open.contains(&"raised handled=3".to_string()), "{open:?}");
    assert!(open.contains(&"handler=on_trap flags=0x14000004 usr1_in_mask=1 trap_blocked=0 handled=3 usr1_inside=1".to_string()), "{open:?}");
    assert_eq!(open.last().unwrap(), "done calls=110", "{open:?}");
    let blocked = native(&bin, &["block"]);
    assert!(
        blocked[0].contains("trap_blocked=1 handled=0"),
        "{blocked:?}"
    );
    assert!(
        blocked.contains(&"raised handled=0".to_string()),
        "{blocked:?}"
    );
}
