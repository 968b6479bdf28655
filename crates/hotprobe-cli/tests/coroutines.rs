//! Issue 22: swapcontext coroutines under return probes. Three coroutines
//! on stacks of their own call `step`, which swaps back to main from
//! inside; main's `resume` swaps into a coroutine from inside: returns
//! interleave across the stacks, and each must find its own entry in the
//! agent's shadow stack (before: SIGABRT, 3 of 2,000 calls kept). The
//! program's output and status stay its own, and every entry and exit is
//! recorded and traced.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;
use common::record::{info, record, trace_dir};
use common::{gcc, hotprobe_within, text};

#[path = "../../hotprobe/tests/nonlocal_support/mod.rs"]
mod nonlocal_support;
use nonlocal_support::{field, native_output};

const LIMIT: Duration = Duration::from_secs(120);

fn coro() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/coro.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("coroutines");
    std::fs::create_dir_all(&dir).unwrap();
    gcc(&src, &dir.join("coro"), &["-O1"])
}

#[test]
fn coroutines_under_record_keep_their_output_and_every_entry_and_exit() {
    let bin = coro();
    let want = native_output(&bin, &["500"]);
    assert_eq!((field(&want, "step"), field(&want, "resume")), (1500, 1503));
    let dir = trace_dir("coroutines");
    let (out, err) = record(
        &dir,
        &["step", "resume"],
        &[bin.to_str().unwrap(), "500"],
        LIMIT,
    );
    assert_eq!(out, want, "{err}");
    assert!(err.contains("drops:    0 "), "{err}");
    let o = hotprobe_within(&["info", dir.to_str().unwrap()], LIMIT);
    let i = text(&o.stdout);
    // Every entry and every exit: 2 × (1500 + 1503) events, none lost.
    assert!(
        i.contains("# events:        6006 function events, 3003 calls"),
        "{i}"
    );
    assert_eq!(info(&dir, LIMIT).lost, 0);
}

#[test]
fn coroutines_under_trace_keep_their_output_and_show_every_call() {
    let bin = coro();
    let want = native_output(&bin, &["500"]);
    let o = hotprobe_within(
        &[
            "trace",
            "step",
            "resume",
            "--",
            bin.to_str().unwrap(),
            "500",
        ],
        LIMIT,
    );
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert!(err.contains("exited with code 0"), "{err}");
    let own: String = out
        .lines()
        .filter(|l| !l.contains('|') && !l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(own, want);
    let n = |pat: &str| out.lines().filter(|l| l.contains(pat)).count();
    assert_eq!(
        (
            n("step() {"),
            n("} /* step */"),
            n("resume() {"),
            n("} /* resume */")
        ),
        (1500, 1500, 1503, 1503),
        "{err}"
    );
}
