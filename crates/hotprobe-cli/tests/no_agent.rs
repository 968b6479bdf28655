//! Issue 22: where no agent is loaded (a static program), nothing in the
//! program could take hotprobe's int3s out if hotprobe were killed: a
//! notice at the start says so, and the counts and output stay exact.

use std::path::PathBuf;

mod common;
use common::{hotprobe_within, program_output, text, CountTable, MIX};

#[test]
fn a_static_program_is_told_that_a_killed_hotprobe_leaves_its_int3s() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no-agent");
    std::fs::create_dir_all(&dir).unwrap();
    let src = hotprobe_testkit::write_source(&dir, "mix.c", MIX);
    let bin = hotprobe_testkit::compile(
        "gcc",
        &src,
        &dir.join("mix-static"),
        &["-O1", "-g", "-static"],
        &[],
    );
    let b = bin.to_str().unwrap();
    let out = hotprobe_within(
        &["count", "mix", "--", b, "5"],
        std::time::Duration::from_secs(60),
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(program_output(&stdout), "argc=2\niterations=5 sum=23\n");
    assert_eq!(CountTable::parse(&stdout, &stderr).hits("mix"), 5);
    let notice = stderr
        .lines()
        .find(|l| l.contains("no agent in the target"))
        .unwrap_or_else(|| panic!("no notice: {stderr}"));
    assert!(
        notice.ends_with(
            ": a hotprobe killed with SIGKILL would leave its int3s in the program (Ctrl-C, \
             --duration and the program's exit take them out)"
        ),
        "{notice}"
    );
}
