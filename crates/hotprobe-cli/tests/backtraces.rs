//! Issue 22: glibc's `backtrace()` in a function whose callers' returns
//! are hooked (`record`: the return trampoline's address in their return
//! slots) sees the program's own frames: before, the walk stopped at
//! `hotprobe_agent_return_trampoline` (3 frames, natively 8). The
//! program prints its backtrace's function names; they equal the native
//! run's, and every call is recorded.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;
use common::gcc;
use common::record::{info, record, trace_dir};

#[path = "../../hotprobe/tests/nonlocal_support/mod.rs"]
mod nonlocal_support;
use nonlocal_support::native_output;

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn backtrace_under_return_probes_names_the_native_frames() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/bt.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("backtraces");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = gcc(&src, &dir.join("bt"), &["-O1", "-rdynamic"]);
    let want = native_output(&bin, &[]);
    assert!(
        want.contains("round 2 frames=8: leaf c3 c2 c1 main"),
        "{want}"
    );
    let trace = trace_dir("backtraces");
    let (out, err) = record(&trace, &["c1", "c2", "c3"], &[bin.to_str().unwrap()], LIMIT);
    assert_eq!(out, want, "{err}");
    assert!(!out.contains("hotprobe_agent"), "{out}");
    let i = info(&trace, LIMIT);
    assert_eq!((i.calls, i.lost), (9, 0), "{i:?}");
}
