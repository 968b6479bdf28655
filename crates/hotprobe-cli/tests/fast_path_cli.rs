//! The fast path through the `hotprobe` binary, on the fast path's test
//! program `loop.c` compiled here with gcc: `--mechanism patch` on a
//! patchable-entry build and `auto` (a jump) on a plain build count every
//! call; a function too short for a jump or jumped into falls back to a
//! trap and says why; a ColdPatch'd binary runs as the original and is
//! probed through its probe list; a lone copy of `hotprobe` uses its
//! embedded agent, and a missing `HOTPROBE_AGENT` override is an error.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

mod common;
use common::{hotprobe, text, HOTPROBE};

mod cli_support;
use cli_support::{assert_error, hits, repo_root, row};

/// Compile the fast path's test program `loop.c` (threads calling `work`;
/// `tiny`, shorter than 5 bytes; `backjump`, with a jump into its first
/// 5 bytes) with `flags`.
fn loop_program(tag: &str, flags: &[&str]) -> PathBuf {
    let src = repo_root().join("crates/hotprobe-fastpath/tests/programs/loop.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli-fast");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(tag);
    hotprobe_testkit::compile("gcc", &src, &out, flags, &["-lpthread"])
}

fn loop_output(n: u64, threads: u64) -> String {
    let total: u64 = (0..threads)
        .map(|id| (0..n).map(|i| id * 2 + (i & 7)).sum::<u64>())
        .sum();
    format!("total {total} fact 120 tiny 0 backjump 100\n")
}

#[test]
fn count_mechanism_patch_is_exact_on_a_patchable_entry_build() {
    let bin = loop_program("loop-pfe", &["-O2", "-fpatchable-function-entry=5"]);
    let out = hotprobe(&[
        "count",
        "--mechanism",
        "patch",
        "work",
        "--",
        bin.to_str().unwrap(),
        "1000000",
        "4",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.starts_with(&loop_output(1_000_000, 4)), "{stdout}");
    assert_eq!(hits(&stdout, "work"), 4_000_000, "{stdout}");
    let r = row(&stdout, "work");
    assert_eq!(r[4..6], ["patch", "(patchable"], "{stdout}");
}

#[test]
fn count_auto_picks_jump_on_a_plain_build_and_is_exact() {
    let bin = loop_program("loop-plain", &["-O2"]);
    let out = hotprobe(&["count", "work", "--", bin.to_str().unwrap(), "1000000", "4"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.starts_with(&loop_output(1_000_000, 4)), "{stdout}");
    assert_eq!(hits(&stdout, "work"), 4_000_000, "{stdout}");
    assert_eq!(row(&stdout, "work")[4], "jump", "{stdout}");
}

#[test]
fn short_or_jumped_into_functions_fall_back_to_trap_and_say_why() {
    let bin = loop_program("loop-plain-trap", &["-O2"]);
    let out = hotprobe(&[
        "count",
        "tiny",
        "backjump",
        "--",
        bin.to_str().unwrap(),
        "10",
        "1",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(hits(&stdout, "tiny"), 1, "{stdout}");
    assert_eq!(hits(&stdout, "backjump"), 1, "{stdout}");
    let line = |l: &str| {
        stdout
            .lines()
            .find(|x| x.starts_with(l))
            .unwrap()
            .to_string()
    };
    // A trap taken in the process by the agent's SIGTRAP handler (no
    // ptrace stop): the execution column reads `in-process trap (boosted)`.
    assert_eq!(row(&stdout, "tiny")[4], "in-process", "{stdout}");
    assert!(
        line("tiny ").contains("function shorter than 5 bytes"),
        "{stdout}"
    );
    assert_eq!(row(&stdout, "backjump")[4], "in-process", "{stdout}");
    assert!(
        line("backjump ").contains("a jump lands inside the first 5 bytes"),
        "{stdout}"
    );
    // Forcing jump on it is an error that says why, in one line.
    let out = hotprobe(&[
        "count",
        "--mechanism",
        "jump",
        "tiny",
        "--",
        bin.to_str().unwrap(),
    ]);
    assert_error(&out, 1, "function shorter than 5 bytes");
}

#[test]
fn coldpatch_round_trip() {
    let inst = loop_program("loop-inst", &["-O2", "-finstrument-functions"]);
    let cold = inst.with_file_name("loop-cold");
    let out = hotprobe(&[
        "coldpatch",
        inst.to_str().unwrap(),
        "-o",
        cold.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let list = std::fs::read_to_string(format!("{}.probes", cold.display())).unwrap();
    assert!(list.contains("work"), "{list}");
    // Runs exactly like the original.
    let run = |b: &Path| text(&Command::new(b).args(["1000", "3"]).output().unwrap().stdout);
    assert_eq!(run(&cold), run(&inst));
    assert_eq!(run(&cold), loop_output(1000, 3));
    // `list` and `count` use its placeholders through the probe list.
    let out = hotprobe(&["list", cold.to_str().unwrap(), "work"]);
    let stdout = text(&out.stdout);
    assert!(stdout.contains("patch (coldpatch)"), "{stdout}");
    let out = hotprobe(&["count", "work", "--", cold.to_str().unwrap(), "100000", "4"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(hits(&stdout, "work"), 400_000, "{stdout}");
    assert_eq!(
        row(&stdout, "work")[4..6],
        ["patch", "(coldpatch)"],
        "{stdout}"
    );
}

/// A copy of `hotprobe` alone in an empty folder, far from the build tree
/// (no agent library beside it, none under `target/`).
fn lone_hotprobe(tag: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("lone-{tag}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let exe = dir.join("hotprobe");
    std::fs::copy(HOTPROBE, &exe).unwrap();
    exe
}

/// `exe ARGS` run from its own folder, without `HOTPROBE_AGENT`.
fn run_lone(exe: &Path, args: &[&str]) -> Output {
    Command::new(exe)
        .args(args)
        .current_dir(exe.parent().unwrap())
        .env_remove("HOTPROBE_AGENT")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

#[test]
fn a_lone_copy_of_hotprobe_uses_its_embedded_agent() {
    let exe = lone_hotprobe("embedded");
    assert_eq!(
        std::fs::read_dir(exe.parent().unwrap()).unwrap().count(),
        1,
        "the copy is alone"
    );
    for (mechanism, tag, flags) in [
        (
            "patch",
            "lone-pfe",
            &["-O2", "-fpatchable-function-entry=5"][..],
        ),
        ("jump", "lone-plain", &["-O2"][..]),
    ] {
        let bin = loop_program(tag, flags);
        let out = run_lone(
            &exe,
            &[
                "count",
                "--mechanism",
                mechanism,
                "work",
                "--",
                bin.to_str().unwrap(),
                "100000",
                "3",
            ],
        );
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{mechanism}: {}", text(&out.stderr));
        assert!(stdout.starts_with(&loop_output(100_000, 3)), "{stdout}");
        assert_eq!(hits(&stdout, "work"), 300_000, "{stdout}");
        assert_eq!(row(&stdout, "work")[4], mechanism, "{stdout}");
    }
    // The agent, loaded from the memfd, is still recognised: its code is
    // blacklisted.
    let bin = loop_program("lone-plain-bl", &["-O2"]);
    let out = run_lone(
        &exe,
        &[
            "count",
            "work",
            "hotprobe_agent_version",
            "--",
            bin.to_str().unwrap(),
            "10",
            "1",
        ],
    );
    assert_error(&out, 1, "blacklisted: the hotprobe agent");
}

#[test]
fn a_missing_hotprobe_agent_override_is_an_error() {
    let bin = loop_program("override-plain", &["-O2"]);
    for args in [
        &["count", "work", "--", bin.to_str().unwrap(), "10", "1"][..],
        &[
            "count",
            "--mechanism",
            "jump",
            "work",
            "--",
            bin.to_str().unwrap(),
            "10",
            "1",
        ][..],
    ] {
        let out = Command::new(HOTPROBE)
            .args(args)
            .env("HOTPROBE_AGENT", "/nonexistent/libhotprobe_agent.so")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert_error(
            &out,
            2,
            "HOTPROBE_AGENT=/nonexistent/libhotprobe_agent.so: No such file or directory",
        );
        assert!(text(&out.stdout).is_empty(), "{}", text(&out.stdout));
    }
}
