//! Issue 24's smaller gaps: a mistyped subcommand or flag gets clap's
//! suggestion on the one error line (exit 2); `record` says how the
//! program ended once; `replay -f` columns; colours in `replay` and
//! `report`.

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

/// A trace of mix.c's 3 iterations (main, then mix 3 times), recorded once.
fn mix_trace() -> std::path::PathBuf {
    static DIR: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let bin = mix_program();
        let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("replay-fields");
        let _ = std::fs::remove_dir_all(&dir);
        let out = hotprobe(&[
            "record",
            "-o",
            dir.to_str().unwrap(),
            "main",
            "mix",
            "--",
            bin.to_str().unwrap(),
            "3",
        ]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        dir
    })
    .clone()
}

/// The lines of `hotprobe ARGS` (checked to succeed).
fn lines_of(args: &[&str]) -> Vec<String> {
    let out = hotprobe(args);
    assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
    text(&out.stdout).lines().map(str::to_string).collect()
}

#[test]
fn replay_prints_the_columns_asked_for() {
    let dir = mix_trace();
    let d = dir.to_str().unwrap();
    let plain = lines_of(&["replay", d]);
    assert_eq!(plain[0], "# DURATION     TID     FUNCTION");
    // The calls as replay shows them, without columns.
    let tree = |lines: &[String]| -> Vec<String> {
        lines[1..]
            .iter()
            .map(|l| l.split_once(" | ").unwrap().1.to_string())
            .collect()
    };
    let calls = tree(&plain);
    assert_eq!(
        calls.iter().filter(|c| c.starts_with("  mix(")).count(),
        3,
        "{plain:?}"
    );

    let timed = lines_of(&["replay", d, "-f", "time,duration,tid"]);
    assert_eq!(timed[0], "#    TIMESTAMP     DURATION     TID     FUNCTION");
    assert_eq!(tree(&timed), calls);
    let mut last = 0.0f64;
    for (l, p) in timed[1..].iter().zip(&plain[1..]) {
        let (cols, _) = l.split_once(" | ").unwrap();
        let ts: f64 = cols.split_whitespace().next().unwrap().parse().unwrap();
        assert!(ts >= last, "time goes back: {timed:?}");
        last = ts;
        // Duration and tid as without -f, after the time stamp.
        let plain_cols = p.split_once(" | ").unwrap().0;
        assert!(cols.ends_with(plain_cols), "{l:?} vs {p:?}");
    }

    let bare = lines_of(&["replay", d, "-f", "none"]);
    assert_eq!(bare[0], "#  FUNCTION");
    assert!(bare[1..].iter().all(|l| l.starts_with(" | ")), "{bare:?}");
    assert_eq!(tree(&bare), calls);

    let bad = hotprobe(&["replay", d, "-f", "time,bogus"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        text(&bad.stderr).contains(
            "-f time,bogus: unknown field \"bogus\": the fields are time, delta, elapsed, duration, tid, or none"
        ),
        "{}",
        text(&bad.stderr)
    );
}

#[test]
fn colour_in_replay_and_report_only_when_asked() {
    let dir = mix_trace();
    let d = dir.to_str().unwrap();
    for cmd in ["replay", "report"] {
        let on = lines_of(&["--color", "always", cmd, d]).join("\n");
        assert!(on.contains("\x1b[1mmix\x1b[0m"), "{cmd}: {on:?}");
        let off = lines_of(&["--color", "never", cmd, d]).join("\n");
        assert!(!off.contains('\x1b'), "{cmd}: {off:?}");
        // Not a terminal: auto is off.
        assert!(!lines_of(&[cmd, d]).join("\n").contains('\x1b'));
    }
}

#[test]
fn count_hides_pattern_rows_without_hits_unless_all() {
    let bin = mix_program();
    let b = bin.to_str().unwrap();
    let rows = |extra: &[&str]| -> (Vec<String>, String) {
        let mut a = vec!["count", "libc.so.6:str*"];
        a.extend_from_slice(extra);
        a.extend_from_slice(&["--", b, "3"]);
        let out = hotprobe(&a);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{stderr}");
        let table: Vec<String> = stdout
            .lines()
            .skip_while(|l| !l.starts_with("PROBE "))
            .skip(1)
            .map(str::to_string)
            .collect();
        (table, stderr)
    };
    let hits = |r: &String| r.split_whitespace().nth(2).unwrap().parse::<u64>().unwrap();
    let (shown, stderr) = rows(&[]);
    assert!(shown.iter().all(|r| hits(r) > 0), "{shown:?}");
    // "hotprobe: N probes of patterns had no hit and are not shown …"
    let hidden: usize = stderr
        .lines()
        .find(|l| l.contains(" probes of patterns had no hit and are not shown (--all shows them)"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stderr}"));
    let (all, stderr) = rows(&["--all"]);
    assert!(!stderr.contains("not shown"), "{stderr}");
    assert_eq!(all.len(), shown.len() + hidden, "{all:?}");
    assert_eq!(all.iter().filter(|r| hits(r) == 0).count(), hidden);
}

#[test]
fn a_pattern_whose_library_never_loads_is_named_at_the_end() {
    let bin = mix_program();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("never-armed");
    let out = hotprobe(&[
        "record",
        "-o",
        dir.to_str().unwrap(),
        "--force",
        "mix",
        "libz.so.1:deflate*",
        "--",
        bin.to_str().unwrap(),
        "3",
    ]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let line = stderr
        .lines()
        .find(|l| l.starts_with("  never armed: "))
        .unwrap_or_else(|| panic!("{stderr}"));
    assert!(
        line.ends_with(" probes on libz.so.1: the program never loaded it"),
        "{line}"
    );
    assert!(!line.contains(": 0 probes"), "{line}");
}
