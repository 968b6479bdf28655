//! What the fuzz pass does with one input, shared by the bounded pass of
//! `tests/fuzz.rs` and the cargo-fuzz target of `fuzz/` (included there by
//! path). Depends on hotprobe-process and std only.

use hotprobe_process::{find_free_gap, parse_maps_lines};

/// `parse_maps_lines`, then `find_free_gap` near what it parsed: gaps are
/// page aligned. True if a line parsed.
pub fn maps_lines(data: &[u8]) -> bool {
    let lines = parse_maps_lines(&String::from_utf8_lossy(data));
    let mut nears = vec![0, 0x5555_5555_5000, u64::MAX];
    nears.extend(lines.iter().take(4).flat_map(|l| [l.start, l.end]));
    for near in nears {
        for len in [0, 0x1000, 0x10000, 1 << 40, u64::MAX] {
            if let Some(a) = find_free_gap(&lines, near, len) {
                assert_eq!(a & 0xfff, 0, "{a:#x} not page aligned");
            }
        }
    }
    !lines.is_empty()
}
