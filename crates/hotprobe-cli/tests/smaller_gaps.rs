//! Issue 24's smaller gaps: a mistyped subcommand or flag gets clap's
//! suggestion on the one error line (exit 2); `record` says how the
//! program ended once.

mod common;
use common::{hotprobe, mix_program, text};

#[test]
fn mistyped_subcommands_and_flags_get_a_suggestion() {
    for (args, line) in [
        (
            &["cuont", "x"][..],
            "hotprobe: error: unrecognized subcommand 'cuont'; did you mean 'count'? (see hotprobe --help)",
        ),
        (
            &["count", "--mechansim", "trap", "x"][..],
            "hotprobe: error: unexpected argument '--mechansim' found; did you mean '--mechanism'? (see hotprobe count --help)",
        ),
        (
            &["reprot", "t"][..],
            "hotprobe: error: unrecognized subcommand 'reprot'; did you mean 'export' or 'report'? (see hotprobe --help)",
        ),
    ] {
        let out = hotprobe(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        assert_eq!(text(&out.stderr), format!("{line}\n"), "{args:?}");
    }
}

#[test]
fn record_says_how_the_program_ended_once() {
    let bin = mix_program();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("record-end-once");
    let _ = std::fs::remove_dir_all(&dir);
    let out = hotprobe(&[
        "record",
        "-o",
        dir.to_str().unwrap(),
        "mix",
        "--",
        bin.to_str().unwrap(),
        "3",
    ]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let ends: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("exited with code 0"))
        .collect();
    assert_eq!(ends.len(), 1, "{stderr}");
    assert!(
        ends[0].ends_with(&format!("; trace in {}", dir.display())),
        "{stderr}"
    );
}
