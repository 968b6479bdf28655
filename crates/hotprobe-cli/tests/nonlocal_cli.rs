//! `hotprobe count` with trap return probes on programs whose probed
//! frames are left without returning: a C++ exception thrown through
//! `leaf` and caught two frames up, `longjmp` out of a recursion; and the
//! refusals: Go functions, functions that return twice. The programs
//! (crates/hotprobe/tests/programs) print their own counts; the table must
//! equal them and their output must be what they print on their own.

use std::time::Duration;

mod common;
use common::{hotprobe_within, program_output, text, CountTable};

#[path = "../../hotprobe/tests/nonlocal_support/mod.rs"]
mod nonlocal_support;
use nonlocal_support::*;

/// The longest any run here may take; one still going is a hang.
const LIMIT: Duration = Duration::from_secs(120);

/// HITS and NMISSED of the one row of `probe`.
fn hits_and_missed(t: &CountTable, probe: &str) -> (u64, u64) {
    let r = t.row(probe);
    let n = |c: &str| r[t.col(c)].parse::<u64>().unwrap();
    (n("HITS"), n("NMISSED"))
}

#[test]
fn count_returns_of_a_function_a_cpp_exception_goes_through() {
    let bin = throw_cc();
    let b = bin.to_str().unwrap();
    let want = native_output(&bin, &["300"]);
    let out = hotprobe_within(
        &[
            "count",
            "--mechanism",
            "trap",
            "leaf",
            "leaf%return",
            "mid%return",
            "top%return",
            "--",
            b,
            "300",
        ],
        LIMIT,
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(program_output(&stdout), want, "{stderr}");
    let t = CountTable::parse(&stdout, &stderr);
    assert_eq!(t.hits("leaf"), field(&want, "leaf_calls"));
    let normal = (field(&want, "leaf_returns"), 0);
    assert_eq!(hits_and_missed(&t, "leaf%return"), normal);
    assert_eq!(
        hits_and_missed(&t, "mid%return"),
        (field(&want, "mid_returns"), 0)
    );
    assert_eq!(
        hits_and_missed(&t, "top%return"),
        (field(&want, "top_returns"), 0)
    );
}

#[test]
fn count_returns_through_longjmp() {
    let bin = nonlocal_c("-O2");
    let b = bin.to_str().unwrap();
    let want = native_output(&bin, &["longjmp", "100"]);
    assert_eq!(want, "deep calls=800 returns=300\n");
    let out = hotprobe_within(
        &["count", "deep", "deep%return", "--", b, "longjmp", "100"],
        LIMIT,
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(program_output(&stdout), want, "{stderr}");
    let t = CountTable::parse(&stdout, &stderr);
    assert_eq!(t.hits("deep"), 800);
    assert_eq!(hits_and_missed(&t, "deep%return"), (300, 0));
}

#[test]
fn return_probes_on_go_functions_are_refused() {
    let bin = go_program("gofunc", "");
    let b = bin.to_str().unwrap();
    let want = native_output(&bin, &["500"]);
    let out = hotprobe_within(&["count", "main.leaf%return", "--", b, "500"], LIMIT);
    let stderr = text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(stderr.contains(GO_REASON), "{stderr}");
    // Entry probes are fine: the program runs as it does on its own.
    let out = hotprobe_within(
        &["count", "--mechanism", "trap", "main.leaf", "--", b, "500"],
        LIMIT,
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(program_output(&stdout), want, "{stderr}");
    // At least every call: a Go entry runs again after morestack.
    assert!(CountTable::parse(&stdout, &stderr).hits("main.leaf") >= 500);
}

#[test]
fn return_probes_on_setjmp_are_refused() {
    let bin = nonlocal_c("-O2");
    let b = bin.to_str().unwrap();
    for spec in ["setjmp%return", "_setjmp%return", "__sigsetjmp%return"] {
        let out = hotprobe_within(&["count", spec, "--", b, "setjmp", "10"], LIMIT);
        let stderr = text(&out.stderr);
        assert!(!out.status.success(), "{spec}: {stderr}");
        assert!(stderr.contains("returns twice"), "{spec}: {stderr}");
    }
}
