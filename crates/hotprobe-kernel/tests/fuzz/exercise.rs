//! What the fuzz pass does with one input, shared by the bounded pass of
//! `tests/fuzz.rs` and the cargo-fuzz target `perf_ring` of `fuzz/`
//! (included there by path). Depends on hotprobe-kernel and std only.
#![allow(dead_code)]

use hotprobe_kernel::records::{parse_records, KernelRecord, RawLayout};
use hotprobe_kernel::{pair, tracefs::parse_format};

/// The layout the seeds are encoded with.
pub fn layout() -> RawLayout {
    RawLayout::standard(443, 442)
}

/// First byte even: the rest is a ring's bytes, parsed and paired (every
/// span must end at or after its start); odd: a tracepoint `format` file.
pub fn perf_ring(data: &[u8]) -> bool {
    let Some((&which, rest)) = data.split_first() else {
        return true;
    };
    if which % 2 == 1 {
        if let Ok(f) = parse_format(&String::from_utf8_lossy(rest)) {
            for (name, offset, size) in &f.fields {
                assert!(f.field(name, *size).is_some());
                assert!(offset + size <= 4096);
            }
        }
        return true;
    }
    let mut records: Vec<KernelRecord> = Vec::new();
    let _ = parse_records(rest, &layout(), &mut |r| records.push(r));
    let (spans, _) = pair(&mut records);
    assert!(spans.iter().all(|s| s.end_ns >= s.start_ns));
    true
}
