//! A whole trace directory with one file replaced by the input (first byte:
//! which of info.json, symbols.tsv, tid-1.hpt, types.tsv, values-1.hpv; its
//! high bit marks the trace unfinished), read through every analysis
//! and exporter: errors, never a panic. The check is shared with the
//! bounded pass in `tests/fuzz.rs`.
#![no_main]

use std::sync::OnceLock;

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/fuzz/exercise.rs"]
mod exercise;

fn trace_dir() -> &'static exercise::TraceDir {
    static DIR: OnceLock<exercise::TraceDir> = OnceLock::new();
    DIR.get_or_init(|| {
        let base = std::env::temp_dir().join(format!("hotprobe-fuzz-trace-{}", std::process::id()));
        let (src, work, ctf) = (base.join("src"), base.join("work"), base.join("ctf"));
        for d in [&src, &work, &ctf] {
            std::fs::create_dir_all(d).unwrap();
        }
        exercise::TraceDir::new(&src, &work, &ctf)
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    trace_dir().check(data);
});
