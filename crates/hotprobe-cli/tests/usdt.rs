//! USDT markers (issue 24): `usdt:[MODULE:]PROVIDER:NAME` probes the
//! marker's instruction and raises its semaphore while placed, so the
//! program runs the code that reaches it; counts equal the program's own,
//! on a `<sys/sdt.h>` program and on Debian's python3.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, program_output, text, CountTable};

const LIMIT: Duration = Duration::from_secs(120);

fn sdt_demo() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("usdt");
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/sdt_demo.c");
    gcc(&src, &dir.join("sdt_demo"), &["-O1"])
}

#[test]
fn a_marker_with_a_semaphore_counts_every_pass() {
    let bin = sdt_demo();
    let b = bin.to_str().unwrap();
    let native = std::process::Command::new(&bin).arg("7").output().unwrap();
    assert_eq!(text(&native.stdout), "acc=21\n");
    // Alone, the semaphore is 0: the guarded block never runs.
    assert_eq!(text(&native.stderr), "guarded=0\n");

    let out = hotprobe_within(
        &["count", "usdt:demo:tick", "usdt:demo:done", "--", b, "7"],
        LIMIT,
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert_eq!(program_output(&stdout), "acc=21\n");
    // The probe raised the semaphore: every pass reached the marker.
    assert!(stderr.contains("guarded=7\n"), "{stderr}");
    let t = CountTable::parse(&stdout, &stderr);
    assert_eq!(t.hits("usdt:demo:tick"), 7, "{}", t.all);
    assert_eq!(t.hits("usdt:demo:done"), 1, "{}", t.all);

    // A marker that does not exist, or a %return, is refused.
    let out = hotprobe_within(&["count", "usdt:demo:nosuch", "--", b], LIMIT);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("no USDT marker demo:nosuch in any loaded module"),
        "{}",
        text(&out.stderr)
    );
    let out = hotprobe_within(&["count", "usdt:demo:tick%return", "--", b], LIMIT);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
}

#[test]
fn python_gc_start_counts_every_collection() {
    let out = hotprobe_within(
        &[
            "count",
            "usdt:python:gc__start",
            "--",
            // Debian's own (a `python3` on PATH may be a pyenv shim).
            "/usr/bin/python3",
            "-c",
            "import gc\nfor _ in range(50): gc.collect()\nprint('done')",
        ],
        LIMIT,
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert_eq!(program_output(&stdout), "done\n");
    let t = CountTable::parse(&stdout, &stderr);
    assert!(t.hits("usdt:python:gc__start") >= 50, "{}\n{stderr}", t.all);
}
