//! Issue 22: code that changes under a ptrace trap probe. A program that
//! drops its own text page with `MADV_DONTNEED` gets the file's byte back
//! over the trap's `int3`; before, the probe silently counted nothing
//! from then on (1000 hits, no word). The target knows which `int3`s it
//! holds: the once-a-second walk finds the byte reverted, writes the
//! `int3` again and names the site, with the calls in between said to be
//! uncounted (as for the agent's sites, `reverted_code.rs`).

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, program_output, text, CountTable};

fn dropped_text() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("reverted-trap");
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/dropped_text.c");
    gcc(&src, &dir.join("dropped_text"), &["-O1"])
}

#[test]
fn trap_sites_whose_page_was_dropped_are_armed_again_and_named() {
    let bin = dropped_text();
    let b = bin.to_str().unwrap();
    let native = std::process::Command::new(&bin)
        .arg("1000")
        .output()
        .unwrap();
    assert!(native.status.success());
    let want = text(&native.stdout);
    assert_eq!(want, "before 1000\nafter 1 sum=1\n");
    for probe in ["work", "work%return"] {
        let out = hotprobe_within(
            &["count", "--mechanism", "trap", probe, "--", b, "1000"],
            Duration::from_secs(60),
        );
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{probe}: {stderr}");
        assert_eq!(program_output(&stdout), want, "{probe}: {stderr}");
        let after: u64 = stderr
            .lines()
            .find_map(|l| l.strip_prefix("dropped_text: calls after the drop "))
            .unwrap_or_else(|| panic!("{stderr}"))
            .parse()
            .unwrap();
        let t = CountTable::parse(&stdout, &stderr);
        assert!(t.execution(probe).starts_with("trap"), "{}", t.all);
        // Counted up to the drop, then again once armed again.
        let hits = t.hits(probe);
        assert!(
            hits > 1000 && hits < 1000 + after,
            "{probe}: {hits} hits, 1000 + {after} calls: {}",
            t.all
        );
        assert!(
            stderr.contains(
                "1 probe site held the original code again (the text was mapped again, or its \
                 pages dropped with MADV_DONTNEED) and is armed again: work [dropped_text] at 0x"
            ),
            "{probe}: {stderr}"
        );
        assert!(
            stderr.contains("; calls made in between (up to 1 s) were not counted"),
            "{probe}: {stderr}"
        );
    }
}
