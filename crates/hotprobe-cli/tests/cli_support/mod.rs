//! What cli.rs and fast_path_cli.rs share: the repository's root, the
//! count table's rows read by label, the one-line error check.

#![allow(dead_code)]

use std::process::Output;

use crate::common::text;

/// The repository's root.
pub use hotprobe_testkit::repo_root;

/// The table row whose first column is `label`: its columns.
pub fn row<'a>(out: &'a str, label: &str) -> Vec<&'a str> {
    out.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|c| c.first() == Some(&label) && c.len() >= 5)
        .unwrap_or_else(|| panic!("no row {label} in:\n{out}"))
}

/// HITS of the row `label`.
pub fn hits(out: &str, label: &str) -> u64 {
    row(out, label)[2].parse().unwrap()
}

/// Exactly one line on stderr, `hotprobe: error: ...`, exit code `code`.
pub fn assert_error(out: &Output, code: i32, needle: &str) {
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("hotprobe: error: "), "{err}");
    assert!(err.contains(needle), "expected {needle:?} in: {err}");
}
