//! Bounded fuzz passes (hotprobe-fuzzcheck): the trace reader never panics,
//! on a corrupt stream or on a corrupt trace directory (info.json,
//! symbols.tsv, a stream) run through every analysis and exporter. The
//! longer runs are the cargo-fuzz targets `read_stream` and `trace_dir` in
//! `fuzz/` (docs/FUZZING.md), which take the same inputs.

mod common;
#[path = "fuzz/exercise.rs"]
mod exercise;

use exercise::{small_trace, TraceDir, FILES};
use hotprobe_fuzzcheck::Fuzz;
use hotprobe_trace::stream_file_name;

#[test]
fn fuzz_read_stream() {
    let src = tempfile::tempdir().unwrap();
    small_trace(src.path());
    let mut seeds = Vec::new();
    for tid in [1, 2] {
        seeds.push(std::fs::read(src.path().join(stream_file_name(tid))).unwrap());
    }
    Fuzz::new("read_stream")
        .seeds(seeds)
        .tokens([
            &b"HPTS"[..],
            b"\x01\x00",
            b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
        ])
        .iterations(20_000)
        .run(exercise::read_stream);
}

#[test]
fn fuzz_trace_dir() {
    let (src, work, ctf) = (
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
        tempfile::tempdir().unwrap(),
    );
    let t = TraceDir::new(src.path(), work.path(), ctf.path());
    Fuzz::new("trace_dir")
        // Each file replaced, in a finished trace and in one marked
        // unfinished (the first byte's high bit).
        .seeds((0..2 * FILES.len()).map(|i| {
            let mut s = t.seed(i % FILES.len());
            s[0] |= if i >= FILES.len() { 0x80 } else { 0 };
            s
        }))
        .tokens([
            &b"\"complete\":"[..],
            b"false",
            b"true",
            b"null",
            b"\"time_base\":",
            b"\"tsc_hz\":",
            b"\"phase_markers\":[\"main\"]",
            b"\t",
            b"\n",
            b"hit",
            b"function",
            b"-1",
            b"1e999",
        ])
        .iterations(5_000)
        .run(|data| t.check(data));
}
