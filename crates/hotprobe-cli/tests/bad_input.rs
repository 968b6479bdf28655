//! Bad input (issue 22): one clear error line and exit code 2, never a
//! panic, a stack overflow or a hang, and the program not started.

mod common;

use common::{gcc, hotprobe_within, output_within, text, HOTPROBE};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// A program that says it ran (`CALL` lines): consts.c at -O0.
fn program() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/consts.c");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bad-input/consts");
    gcc(&src, &out, &["-O0"])
}

/// Exit code 2, exactly `line` on stderr, nothing on stdout, the program
/// not run.
fn assert_bad_input(o: &Output, line: &str) {
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(
        o.status.code(),
        Some(2),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert_eq!(stderr, format!("{line}\n"));
    assert_eq!(stdout, "");
}

#[test]
fn a_condition_20000_parentheses_deep_is_refused() {
    let prog = program();
    let deep = format!("{}arg0 == 1{}", "(".repeat(20_000), ")".repeat(20_000));
    let spec = format!("off if {deep}");
    let o = hotprobe_within(&["count", &spec, "--", prog.to_str().unwrap()], LIMIT);
    assert_bad_input(
        &o,
        &format!(
            "hotprobe: error: `off if {}...`: the condition: column 65: the condition nests \
             deeper than 64 levels (parentheses and `!`) (see hotprobe count --help)",
            "(".repeat(73)
        ),
    );
    // 64 levels are fine.
    let ok = format!("off if {}arg0 > 0{}", "(".repeat(64), ")".repeat(64));
    let o = hotprobe_within(&["count", &ok, "--", prog.to_str().unwrap()], LIMIT);
    assert!(o.status.success(), "{}", text(&o.stderr));
    // A chain of 5,000 comparisons: too long, not a deep recursion (one
    // argument holds at most 128 KiB).
    let spec = format!("off if {}", vec!["arg0 == 1"; 5_000].join(" && "));
    let o = hotprobe_within(&["count", &spec, "--", prog.to_str().unwrap()], LIMIT);
    // The 257th comparison starts after 256 of `arg0 == 1 && `.
    let column = 256 * "arg0 == 1 && ".len() + 1;
    assert_bad_input(
        &o,
        &format!(
            "hotprobe: error: `{}...`: the condition: column {column}: the condition has more \
             than 256 comparisons (see hotprobe count --help)",
            &spec[..80]
        ),
    );
}

#[test]
fn negative_and_zero_line_numbers_are_refused() {
    let prog = program();
    for (spec, why) in [
        ("prog.c:-1", "bad line number -1: line numbers start at 1"),
        (
            "consts.c:-20",
            "bad line number -20: line numbers start at 1",
        ),
        ("consts.c:+3", "bad line number +3: line numbers start at 1"),
        ("consts.c:0", "line numbers start at 1"),
    ] {
        let o = hotprobe_within(&["count", spec, "--", prog.to_str().unwrap()], LIMIT);
        assert_bad_input(
            &o,
            &format!(
                "hotprobe: error: cannot probe {spec}: bad probe spec \"{spec}\": {why} \
                 (expected [module:]function[+offset], [module:]0xADDR or file.c:LINE, \
                 optionally followed by %return)"
            ),
        );
    }
}

#[test]
fn hotprobe_agent_must_be_an_x86_64_shared_object() {
    let prog = program();
    let run = |agent: &Path| {
        let mut c = Command::new(HOTPROBE);
        c.args(["count", "off", "--", prog.to_str().unwrap()])
            .env("HOTPROBE_AGENT", agent);
        output_within(c, LIMIT)
    };
    let o = run(Path::new("/etc/passwd"));
    assert_bad_input(
        &o,
        "hotprobe: error: HOTPROBE_AGENT=/etc/passwd: not an ELF file (the agent is an ELF \
         shared object)",
    );
    // An executable (a PIE is ET_DYN too).
    let o = run(&prog);
    assert_bad_input(
        &o,
        &format!(
            "hotprobe: error: HOTPROBE_AGENT={}: a position-independent executable (DF_1_PIE), \
             not a shared object",
            prog.display()
        ),
    );
    // A relocatable object.
    let obj = prog.with_extension("o");
    let st = Command::new("gcc")
        .args(["-c", "-o"])
        .arg(&obj)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/consts.c"))
        .status()
        .expect("gcc runs");
    assert!(st.success());
    let o = run(&obj);
    assert_bad_input(
        &o,
        &format!(
            "hotprobe: error: HOTPROBE_AGENT={}: a relocatable object (ET_REL), not a shared \
             object (ET_DYN)",
            obj.display()
        ),
    );
}
