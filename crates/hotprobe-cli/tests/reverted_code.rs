//! Issue 22: code that changes under a probe. A program that drops its
//! own text pages with `MADV_DONTNEED`, or maps its text again from its
//! file with `mmap(MAP_FIXED)`, gets the file's code back over hotprobe's
//! jump, or over a ptrace trap's `int3` (before, the trap probe silently
//! counted nothing from then on: 1000 hits, no word). The
//! sites are walked once a second while the program runs: the site is
//! found, armed again ("text mapped again is re-armed"), and named, with
//! the calls in between said to be uncounted, instead of leaving the
//! count silently short.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, program_output, text, CountTable};

/// How a program takes hotprobe's bytes out of its text: the test program
/// (tests/programs/NAME.c) and the start of the stderr line where it says
/// how many calls it made after that.
#[derive(Clone, Copy)]
struct Reverter {
    name: &'static str,
    calls_after: &'static str,
}

/// `MADV_DONTNEED` on the page of `work`.
const DROPPED: Reverter = Reverter {
    name: "dropped_text",
    calls_after: "dropped_text: calls after the drop ",
};

/// `mmap(MAP_FIXED)` of the page of `work` from the program's file.
const MAPPED: Reverter = Reverter {
    name: "mapped_text",
    calls_after: "mapped_text: calls after the mapping ",
};

fn program(r: Reverter) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("reverted");
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(format!("{}.c", r.name));
    gcc(&src, &dir.join(r.name), &["-O1"])
}

/// `count --mechanism MECHANISM PROBE` on the program of `r`: its output
/// as without hotprobe, the hits counted up to the change and again once
/// the site is armed again (the calls in between are not: said so, by
/// name); the count table.
fn count_rearmed(r: Reverter, mechanism: &str, probe: &str) -> CountTable {
    count_rearmed_with(r, mechanism, probe, &[]).0
}

/// As [`count_rearmed`], the program given `extra` arguments after its
/// count; also hotprobe's stderr.
fn count_rearmed_with(
    r: Reverter,
    mechanism: &str,
    probe: &str,
    extra: &[&str],
) -> (CountTable, String) {
    let bin = program(r);
    let b = bin.to_str().unwrap();
    let native = std::process::Command::new(&bin)
        .arg("1000")
        .output()
        .unwrap();
    assert!(native.status.success());
    let want = text(&native.stdout);
    assert_eq!(want, "before 1000\nafter 1 sum=1\n");
    let what = format!("{} {mechanism} {probe}", r.name);
    let out = hotprobe_within(
        &[
            &["count", "--mechanism", mechanism, probe, "--", b, "1000"],
            extra,
        ]
        .concat(),
        Duration::from_secs(60),
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{what}: {stderr}");
    assert_eq!(program_output(&stdout), want, "{what}: {stderr}");
    let after: u64 = stderr
        .lines()
        .find_map(|l| l.strip_prefix(r.calls_after))
        .unwrap_or_else(|| panic!("{stderr}"))
        .parse()
        .unwrap();
    let t = CountTable::parse(&stdout, &stderr);
    let hits = t.hits(probe);
    assert!(
        hits > 1000 && hits < 1000 + after,
        "{what}: {hits} hits, 1000 + {after} calls: {}",
        t.all
    );
    let named = format!(
        "1 probe site held the original code again (the text was mapped again, or its pages \
         dropped with MADV_DONTNEED) and is armed again: work [{}] at 0x",
        r.name
    );
    assert!(stderr.contains(&named), "{what}: {stderr}");
    assert!(
        stderr.contains("; calls made in between (up to 1 s) were not counted"),
        "{what}: {stderr}"
    );
    (t, stderr)
}

/// The fast path's sites: armed again, and the process, taken back for
/// that, runs untraced again (before, it stayed traced for good, in
/// silence).
#[test]
fn sites_whose_pages_were_dropped_are_armed_again_and_named() {
    for mechanism in ["auto", "jump"] {
        let (_, stderr) = count_rearmed_with(DROPPED, mechanism, "work", &["untraced"]);
        assert!(
            stderr.contains("dropped_text: armed again and untraced\n"),
            "{mechanism}: {stderr}"
        );
    }
}

#[test]
fn trap_sites_whose_page_was_dropped_are_armed_again_and_named() {
    for probe in ["work", "work%return"] {
        let t = count_rearmed(DROPPED, "trap", probe);
        assert!(t.execution(probe).starts_with("trap"), "{}", t.all);
    }
}

/// The text mapped again from the file (`mmap(MAP_FIXED)` over the page
/// of `work`): the fast path's sites and the trap's `int3`s alike.
#[test]
fn sites_whose_text_was_mapped_again_are_armed_again_and_named() {
    for mechanism in ["auto", "jump"] {
        count_rearmed(MAPPED, mechanism, "work");
    }
    for probe in ["work", "work%return"] {
        let t = count_rearmed(MAPPED, "trap", probe);
        assert!(t.execution(probe).starts_with("trap"), "{}", t.all);
    }
}
