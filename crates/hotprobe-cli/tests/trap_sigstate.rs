//! Issue 22: a program that blocks or ignores `SIGTRAP`, probed through
//! the ptrace trap (`--mechanism trap`, a static program, a return
//! probe). The kernel's `int3` trap takes `SIGTRAP` out of a blocking
//! thread's mask and resets an ignored (or, in a blocking thread, caught)
//! `SIGTRAP` to `SIG_DFL`: before, the program read back a changed mask
//! and disposition, and the `SIGTRAP` it raised itself killed it (exit
//! 133). Now its output — masks, dispositions, pending and handled
//! signals, read back after the probed calls and after its own `raise` —
//! and exit status are the native run's, and every call is counted.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, program_output, text, CountTable};

const LIMIT: Duration = Duration::from_secs(120);

fn program(statik: bool) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/trap_sigstate.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("trap-sigstate");
    std::fs::create_dir_all(&dir).unwrap();
    if statik {
        gcc(&src, &dir.join("trap_sigstate_static"), &["-O1", "-static"])
    } else {
        gcc(&src, &dir.join("trap_sigstate"), &["-O1"])
    }
}

/// The calls `how` makes to `probed`.
fn calls(how: &str) -> u64 {
    if how == "ignore" {
        200
    } else {
        300
    }
}

/// `hotprobe count ARGS PROBES -- BIN HOW`: the program's output and exit
/// status are the native run's, each probe counts every call on the ptrace
/// trap.
fn check(bin: &Path, how: &str, args: &[&str], probes: &[&str]) {
    check_on(bin, how, args, probes, "trap");
}

/// [`check`], each probe's execution starting with `exec`.
fn check_on(bin: &Path, how: &str, args: &[&str], probes: &[&str], exec: &str) {
    let native = Command::new(bin).arg(how).output().unwrap();
    assert_eq!(native.status.code(), Some(5), "{how} natively");
    let want = text(&native.stdout);
    let mut a = vec!["count"];
    a.extend_from_slice(args);
    a.extend_from_slice(probes);
    a.extend(["--", bin.to_str().unwrap(), how]);
    let o = hotprobe_within(&a, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    let ctx = format!("{a:?}\n{out}\n{err}");
    assert_eq!(o.status.code(), Some(5), "{ctx}");
    assert!(err.contains("exited with code 5"), "{ctx}");
    assert_eq!(program_output(&out), want, "{ctx}");
    let t = CountTable::parse(&out, &err);
    for p in probes {
        assert!(t.execution(p).starts_with(exec), "{p}: {ctx}");
        assert_eq!(t.hits(p), calls(how), "{p}: {ctx}");
    }
}

#[test]
fn a_thread_blocking_sigtrap_keeps_its_mask_under_the_trap() {
    let bin = program(false);
    check(&bin, "block", &["--mechanism", "trap"], &["probed"]);
    check(&bin, "inherit", &["--mechanism", "trap"], &["probed"]);
}

/// A program with a SIGTRAP handler of its own that raises SIGTRAP in one
/// thread while another creates threads: glibc's pthread_create blocks
/// every signal around its clone (`mov eax, 14; lea rsi, [rip+d];
/// syscall`: a site with an instruction between, not seen before), so the
/// creator and each new thread trapped at a site with SIGTRAP blocked,
/// and the kernel reset the handler to SIG_DFL under the raiser's feet:
/// killed by SIGTRAP in 8 runs of 8. Now such a thread's SIGTRAP is
/// blocked in the program's view only (`sigtrap.rs`, "Lifted"): every
/// raise is handled, the 300 calls counted. The main thread creates each
/// thread once the raiser has raised again: on a loaded machine the
/// raiser was at times not run at all before the last creation (raised 0,
/// printed `handled=0`; in the native run too, 3 of 4 failures seen).
#[test]
fn sigtrap_raised_while_threads_start_meets_the_programs_handler() {
    let bin = program(false);
    check(&bin, "race", &["--mechanism", "trap"], &["probed"]);
}

/// Where SIGTRAP is blocked in the program's view only (lifted), what
/// the program sees of it stays as without hotprobe (found by review):
/// a forked child's own mask (it inherited the lifted one: the child read
/// SIGTRAP unblocked, with and without -f); a kill() of the process, which
/// a worker not blocking SIGTRAP takes (it stayed with the lifted main
/// thread: the worker never saw it); a value queued with SIGTRAP to a
/// thread blocking it (it was sent again by the tracer: value 0,
/// SI_TKILL), on the trap and in a static program (no agent, the default
/// mechanism).
#[test]
fn a_lifted_sigtrap_mask_is_the_programs_in_children_and_queued_signals() {
    let bin = program(false);
    for how in ["fork", "prockill", "sigqueue"] {
        check(&bin, how, &["--mechanism", "trap"], &["probed"]);
    }
    check(&bin, "fork", &["-f", "--mechanism", "trap"], &["probed"]);
    let statik = program(true);
    check(&statik, "sigqueue", &[], &["probed"]);
}

#[test]
fn an_ignored_sigtrap_stays_ignored_under_the_trap() {
    let bin = program(false);
    check(&bin, "ignore", &["--mechanism", "trap"], &["probed"]);
}

/// A blocking thread's trap resets even a handler: it is put back, and
/// the program's own `raise` in the main thread reaches it.
#[test]
fn a_handler_survives_a_trap_in_a_thread_that_blocks_sigtrap() {
    let bin = program(false);
    check(&bin, "blockh", &["--mechanism", "trap"], &["probed"]);
}

/// Return probes (a second trap per call, at the return address) and a
/// static program (no agent: traps only), each case.
#[test]
fn a_static_program_with_entry_and_return_probes_keeps_its_signal_state() {
    let bin = program(true);
    for how in ["block", "ignore", "blockh", "inherit"] {
        check(&bin, how, &[], &["probed", "probed%return"]);
    }
}

/// With the agent (the default mechanisms), which keeps `SIGTRAP` out of
/// the kernel's masks: a `SIGTRAP` the program raises while it believes
/// it blocked is held, shown by `sigpending`, and delivered when it
/// unblocks (before, it went to the default action at once: exit 133).
#[test]
fn with_the_agent_a_sigtrap_raised_while_blocked_stays_pending() {
    let bin = program(false);
    for how in ["block", "ignore", "blockh", "inherit"] {
        check_on(&bin, how, &[], &["probed"], "jump");
    }
}
