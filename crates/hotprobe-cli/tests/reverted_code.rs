//! Issue 22: code that changes under a probe. A program that drops its
//! own text pages with `MADV_DONTNEED` gets the file's code back over
//! hotprobe's jump: the probe counts nothing from then on, and hotprobe says so
//! by name while the program runs (the ledger is walked once a second)
//! instead of leaving the count silently short.

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
fn sites_whose_pages_were_dropped_are_named_and_count_only_before() {
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
        // Counted up to the drop, not after: and said so, by name.
        let t = CountTable::parse(&stdout, &stderr);
        assert_eq!(t.hits("work"), 1000, "{mechanism}: {}\n{stderr}", t.all);
        assert!(
            stderr.contains(
                "1 probe site holds the original code again (the text was mapped \
                             again, or its pages dropped with MADV_DONTNEED): work [dropped_text] at 0x"
            ),
            "{mechanism}: {stderr}"
        );
    }
}
