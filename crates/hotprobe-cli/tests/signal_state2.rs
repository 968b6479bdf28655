//! Issue 22, signal state round 2: small alternate signal stacks (an
//! in-process trap hit inside an `SA_ONSTACK` handler) and signal state
//! changed by raw system calls. Each program runs as it does alone (its
//! output and exit status) and every call is counted, or the probe is
//! placed on the ptrace trap with the reason.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;
use common::record::{info, record, trace_dir, Info};
use common::{gcc, hotprobe_within, program_output, text, CountTable};

#[path = "../../hotprobe/tests/nonlocal_support/mod.rs"]
mod nonlocal_support;
use nonlocal_support::{field, native_output};

const LIMIT: Duration = Duration::from_secs(120);

/// The agent's `AGENT_FRAME` (crates/hotprobe-agent/src/altstack.rs): the
/// stack its `SIGTRAP` handler may use beyond a trivial handler's.
const AGENT_FRAME: u64 = 4096;

fn program(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/programs/{name}.c"));
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("signal-state2");
    std::fs::create_dir_all(&dir).unwrap();
    // -no-pie: its 4-byte functions stay on the in-process trap these
    // tests are about (in a PIE they take a punned jump; a non-PIE's
    // punned-jump copies would fall below address 0).
    gcc(&src, &dir.join(name), &["-O1", "-no-pie"])
}

/// `hotprobe count PROBE -- BIN ARGS`: the program's output (hotprobe and
/// the program succeeded) and the table.
fn count(probe: &str, bin: &Path, args: &[&str]) -> (String, CountTable) {
    let mut a = vec!["count", probe, "--", bin.to_str().unwrap()];
    a.extend_from_slice(args);
    let out = hotprobe_within(&a, LIMIT);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{args:?}: {stdout}\n{stderr}");
    assert!(stderr.contains("exited with code 0"), "{args:?}: {stderr}");
    (
        program_output(&stdout).to_string(),
        CountTable::parse(&stdout, &stderr),
    )
}

#[test]
fn an_in_process_trap_hit_on_a_small_alternate_stack_is_counted_and_recorded() {
    let bin = program("altstack");
    for size in ["4096", "6000"] {
        let args = ["onstack", size];
        let want = native_output(&bin, &args);
        assert_eq!(field(&want, "handler"), 1000, "{want}");
        assert_eq!(field(&want, "shown"), 1, "{want}");
        let (got, t) = count("tiny", &bin, &args);
        assert_eq!(got, want, "{}", t.all);
        assert_eq!(t.execution("tiny"), "in-process", "{}", t.all);
        assert_eq!(
            (t.hits("tiny"), t.row("tiny")[t.col("NMISSED")].as_str()),
            (2000, "0"),
            "{}",
            t.all
        );
        // Recorded: the return hooked inside the handler too.
        let dir = trace_dir(&format!("altstack-{size}"));
        let (out, _) = record(
            &dir,
            &["tiny"],
            &[bin.to_str().unwrap(), "onstack", size],
            LIMIT,
        );
        assert_eq!(out, want);
        assert_eq!(
            info(&dir, LIMIT),
            Info {
                calls: 2000,
                records: 2000,
                lost: 0
            }
        );
    }
}

/// The agent's room on an alternate stack is measured, not guessed: a
/// program paints its stack and finds how deep a hit writes, against a
/// signal with a trivial handler.
#[test]
fn the_agent_handler_uses_no_more_stack_than_it_reserves() {
    let bin = program("altstack");
    let native = native_output(&bin, &["depth"]);
    assert_eq!(field(&native, "probed"), 0, "{native}");
    let (got, t) = count("tiny", &bin, &["depth"]);
    assert_eq!(t.hits("tiny"), 1, "{}", t.all);
    let extra = field(&got, "probed").saturating_sub(field(&got, "trivial"));
    assert!(extra > 0 && extra <= AGENT_FRAME, "{got}");
    // Recording, with the thread's first hit (its registration) inside.
    let dir = trace_dir("altstack-depth");
    let (got, _) = record(&dir, &["tiny"], &[bin.to_str().unwrap(), "depth"], LIMIT);
    let extra = field(&got, "probed").saturating_sub(field(&got, "trivial"));
    assert!(extra > 0 && extra <= AGENT_FRAME, "{got}");
}

fn rawsys(inline: bool) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/rawsys.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("signal-state2");
    std::fs::create_dir_all(&dir).unwrap();
    match inline {
        false => gcc(&src, &dir.join("rawsys"), &["-O1", "-no-pie"]),
        true => gcc(
            &src,
            &dir.join("rawsys_inline"),
            &["-O1", "-no-pie", "-DINLINE_SYSCALL"],
        ),
    }
}

/// `syscall(SYS_rt_sigprocmask)` blocking every signal in four threads,
/// `syscall(SYS_rt_sigaction)` ignoring SIGTRAP: libc's `syscall()` is
/// the agent's too, so the in-process trap stays and counts every call;
/// the program reads back what it set.
#[test]
fn signal_state_set_through_libc_syscall_keeps_the_in_process_trap() {
    let bin = rawsys(false);
    for (mode, calls) in [("mask", 4000), ("ignore", 1000)] {
        let want = native_output(&bin, &[mode]);
        let (got, t) = count("tiny", &bin, &[mode]);
        assert_eq!(got, want, "{}", t.all);
        assert_eq!(t.execution("tiny"), "in-process", "{}", t.all);
        assert_eq!(
            (t.hits("tiny"), t.row("tiny")[t.col("NMISSED")].as_str()),
            (calls, "0"),
            "{}",
            t.all
        );
    }
    assert_eq!(
        native_output(&bin, &["mask"]),
        "calls=4000 result=6002000\n"
    );
    assert_eq!(
        native_output(&bin, &["ignore"]),
        "calls=1000 sum=500500 blocked=1 ignored=1\n"
    );
}

/// Seccomp strict mode entered with `syscall(SYS_seccomp)`: counted
/// exactly; recorded up to it, the calls after it counted lost (the
/// thread may not read the clock): before, the agent's `rdtsc` killed it.
#[test]
fn seccomp_strict_mode_entered_through_libc_syscall_is_counted_and_its_losses_reported() {
    let bin = rawsys(false);
    let want = native_output(&bin, &["strict"]);
    assert_eq!(want, "before=1000 after=1000 sum=1001000\n");
    let (got, t) = count("tiny", &bin, &["strict"]);
    assert_eq!(got, want);
    assert_eq!(t.hits("tiny"), 2000, "{}", t.all);
    let dir = trace_dir("rawsys-strict");
    let (out, _) = record(&dir, &["tiny"], &[bin.to_str().unwrap(), "strict"], LIMIT);
    assert_eq!(out, want);
    let i = info(&dir, LIMIT);
    assert_eq!((i.calls, i.lost), (1000, 2000), "{i:?}");
}

/// A `syscall` instruction of the program's own (inline assembly blocking
/// every signal): the agent cannot see it, so the process gets no
/// in-process trap, the placement says why, and the ptrace trap counts.
#[test]
fn a_program_with_its_own_syscall_instruction_gets_no_in_process_trap() {
    let bin = rawsys(true);
    let want = native_output(&bin, &["mask"]);
    assert_eq!(want, "calls=4000 result=6002000\n");
    let (got, t) = count("tiny", &bin, &["mask"]);
    assert_eq!(got, want, "{}", t.all);
    assert!(t.execution("tiny").starts_with("trap"), "{}", t.all);
    assert!(
        t.all.contains(
            "in-process trap: rawsys_inline has a `syscall` instruction of its own at 0x"
        ) && t
            .all
            .contains("(rt_sigprocmask): signal masks, handlers and threads"),
        "{}",
        t.all
    );
    assert_eq!(t.hits("tiny"), 4000, "{}", t.all);
}
