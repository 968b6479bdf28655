//! Issue 22: threads made by a raw `clone(CLONE_VM | CLONE_THREAD | …)`
//! without `CLONE_SETTLS` share their creator's thread pointer, and with
//! it the agent's per-thread block. The agent's interposed `clone` marks
//! it shared before the threads exist, and their hits count with locked
//! adds: every call is counted (before: a few hundred to a thousand of
//! 4,001,000 lost, in some runs), and the program's output is its own.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, program_output, text, CountTable};

#[path = "../../hotprobe/tests/nonlocal_support/mod.rs"]
mod nonlocal_support;
use nonlocal_support::{field, native_output};

const LIMIT: Duration = Duration::from_secs(120);

#[test]
fn threads_of_a_raw_clone_without_tls_are_counted_exactly() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/rawclone.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("raw-threads");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = gcc(&src, &dir.join("rawclone"), &["-O1"]);
    let b = bin.to_str().unwrap();
    let want = native_output(&bin, &["1000000"]);
    let calls = field(&want, "calls");
    assert_eq!(calls, 4_001_000);
    // Whether two threads' increments collide is the scheduler's: five runs.
    for run in 0..5 {
        let o = hotprobe_within(&["count", "work", "--", b, "1000000"], LIMIT);
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert!(o.status.success(), "{out}\n{err}");
        assert!(err.contains("exited with code 0"), "{err}");
        assert_eq!(program_output(&out), want, "run {run}");
        let t = CountTable::parse(&out, &err);
        assert_eq!(t.hits("work"), calls, "run {run}: {}", t.all);
    }
}
