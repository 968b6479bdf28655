//! `hotprobe record` runs for the tests of unusual stacks and signal
//! state (issue 22): the program's output and status as its own, and what
//! `info` says of the trace.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{hotprobe_within, text};

/// What `hotprobe info` says of a trace.
#[derive(Debug, PartialEq, Eq)]
pub struct Info {
    /// Calls (entry and exit both seen).
    pub calls: u64,
    /// Records (calls, plus entries without an exit).
    pub records: u64,
    /// Lost events.
    pub lost: u64,
}

/// A fresh trace directory `tag` under the test's target tmpdir.
pub fn trace_dir(tag: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("{tag}.trace"));
    let _ = std::fs::remove_dir_all(&d);
    d
}

/// `hotprobe record -o DIR PROBES -- CMD`: asserts hotprobe succeeded and
/// the program exited 0; returns the program's stdout (record prints only
/// the program's) and stderr.
pub fn record(dir: &Path, probes: &[&str], cmd: &[&str], limit: Duration) -> (String, String) {
    let mut a = vec!["record", "-o", dir.to_str().unwrap()];
    a.extend_from_slice(probes);
    a.push("--");
    a.extend_from_slice(cmd);
    let o = hotprobe_within(&a, limit);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(
        o.status.success(),
        "record {probes:?} {cmd:?}: {out}\n{err}"
    );
    assert!(err.contains("exited with code 0"), "{err}");
    (out, err)
}

/// `hotprobe info DIR`'s events line: calls, records, lost.
pub fn info(dir: &Path, limit: Duration) -> Info {
    let o = hotprobe_within(&["info", dir.to_str().unwrap()], limit);
    let out = text(&o.stdout);
    assert!(o.status.success(), "info: {}", text(&o.stderr));
    // "# events:        N function events, C calls, R records, L lost"
    let line = out
        .lines()
        .find(|l| l.starts_with("# events:"))
        .unwrap_or_else(|| panic!("no events line in {out}"));
    let w: Vec<&str> = line.split_whitespace().collect();
    let before = |word: &str| -> u64 {
        let i = w
            .iter()
            .position(|x| x.trim_end_matches(',') == word)
            .unwrap_or_else(|| panic!("no {word} in {line}"));
        w[i - 1].parse().unwrap()
    };
    Info {
        calls: before("calls"),
        records: before("records"),
        lost: before("lost"),
    }
}
