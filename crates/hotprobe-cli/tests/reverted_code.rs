//! Issue 22: code that changes under a probe. A program that drops its
//! own text pages with `MADV_DONTNEED` gets the file's code back over
//! hotprobe's jump. The ledger is walked once a second while the program
//! runs: the site is found, armed again ("text mapped again is re-armed"),
//! and named, with the calls in between said to be uncounted, instead of
//! leaving the count silently short.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, program_output, text, CountTable};

fn dropped_text() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("reverted");
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/dropped_text.c");
    gcc(&src, &dir.join("dropped_text"), &["-O1"])
}

#[test]
fn sites_whose_pages_were_dropped_are_armed_again_and_named() {
    let bin = dropped_text();
    let b = bin.to_str().unwrap();
    let native = std::process::Command::new(&bin)
        .arg("1000")
        .output()
        .unwrap();
    assert!(native.status.success());
    let want = text(&native.stdout);
    assert_eq!(want, "before 1000\nafter 1 sum=1\n");
    for mechanism in ["auto", "jump"] {
        let out = hotprobe_within(
            &["count", "--mechanism", mechanism, "work", "--", b, "1000"],
            Duration::from_secs(60),
        );
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{mechanism}: {stderr}");
        assert_eq!(program_output(&stdout), want, "{mechanism}: {stderr}");
        // Counted up to the drop, then again once armed again (the calls
        // in between are not: said so, by name).
        let after: u64 = stderr
            .lines()
            .find_map(|l| l.strip_prefix("dropped_text: calls after the drop "))
            .unwrap_or_else(|| panic!("{stderr}"))
            .parse()
            .unwrap();
        let t = CountTable::parse(&stdout, &stderr);
        let hits = t.hits("work");
        assert!(
            hits > 1000 && hits < 1000 + after,
            "{mechanism}: {hits} hits, 1000 + {after} calls: {}\n{stderr}",
            t.all
        );
        assert!(
            stderr.contains(
                "1 probe site held the original code again (the text was mapped again, or its \
                 pages dropped with MADV_DONTNEED) and is armed again: work [dropped_text] at 0x"
            ),
            "{mechanism}: {stderr}"
        );
        assert!(
            stderr.contains("; calls made in between (up to 1 s) were not counted"),
            "{mechanism}: {stderr}"
        );
    }
}
