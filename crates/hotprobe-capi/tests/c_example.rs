//! examples/c/count_and_patch.c, built with gcc against the build tree's
//! libhotprobe_c through `pkg-config --cflags --libs hotprobe`, counts the
//! calls of `compute` in a program compiled here and changes what one call
//! returns: the program's own printed sum changes by exactly that.

mod common;
use common::*;
use std::process::Command;

fn build_example(dir: &std::path::Path) -> std::path::PathBuf {
    let src = root().join("examples/c/count_and_patch.c");
    c_api_program(&src, &dir.join("count_and_patch"))
}

#[test]
fn c_example_counts_calls_and_changes_a_return_value() {
    let dir = scratch("c-example");
    let prog = compute(&dir, &[]);
    let example = build_example(&dir);

    // Untraced: sum of squares 0..99 = 328350.
    let plain = run_ok(Command::new(&prog).arg("100"));
    assert_eq!(text(&plain.stdout), "sum 328350 last 99 twice 200\n");

    // compute(7) returns 1000 instead of 49: the sum grows by 951.
    let mut cmd = Command::new(&example);
    cmd.args(["compute", "7", "1000"]).arg(&prog).arg("100");
    let o = run_ok(&mut cmd);
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "sum 329301 last 99 twice 200",
            "calls 100 arg_sum 4950 patched 1",
            "probe hits 100 nmissed 0",
            "retprobe hits 100 returns 100 nmissed 0",
            "end exited exit 0",
        ],
        "stderr: {}",
        text(&o.stderr)
    );

    // An argument no call has: counted the same, nothing changed.
    let mut cmd = Command::new(&example);
    cmd.args(["compute", "5000", "1"]).arg(&prog).arg("100");
    let out = text(&run_ok(&mut cmd).stdout);
    assert!(
        out.starts_with("sum 328350 last 99 twice 200\ncalls 100 arg_sum 4950 patched 0\n"),
        "{out}"
    );
}

#[test]
fn c_example_reports_a_missing_function() {
    let dir = scratch("c-example-missing");
    let prog = compute(&dir, &[]);
    let example = build_example(&dir);
    let o = Command::new(&example)
        .args(["no_such_function", "1", "1"])
        .arg(&prog)
        .arg("3")
        .output()
        .expect("run example");
    assert_eq!(o.status.code(), Some(1));
    let err = text(&o.stderr);
    assert!(
        err.starts_with("count_and_patch: probe: ") && err.contains("no_such_function"),
        "{err}"
    );
    // The program was never let run: nothing printed by it.
    assert_eq!(text(&o.stdout), "");
}
