//! Bounded fuzz pass (hotprobe-fuzzcheck): `WatchSpec::parse` (`hotprobe
//! watch ADDR|SYMBOL[:LEN]`) never panics, and what it parses round-trips
//! through `Display` (docs/FUZZING.md).

#[path = "fuzz/exercise.rs"]
mod exercise;

use hotprobe_fuzzcheck::Fuzz;

#[test]
fn fuzz_watch_spec() {
    let report = Fuzz::new("watch_spec")
        .seeds([
            "counter",
            "counter:4",
            "libfoo.so:var:2",
            "0x601040:8",
            "0X10",
            "x :1",
            "lib:",
        ])
        .tokens([":", "0x", "0X", ":8", ":3", " ", "\n", "9999999999", "é"])
        .iterations(30_000)
        .run(exercise::watch_spec);
    assert!(report.accepted > 0, "{report:?}");
}
