//! Bounded fuzz pass (hotprobe-fuzzcheck): the scratch-page view of
//! /proc/PID/maps never panics, nor does placing a gap in what it parsed.
//! The longer run is the cargo-fuzz target `maps_lines` in `fuzz/`
//! (docs/FUZZING.md).

use hotprobe_fuzzcheck::Fuzz;
use hotprobe_process::{find_free_gap, parse_maps_lines};

#[test]
fn fuzz_maps_lines() {
    let synthetic = "555555554000-555555555000 r--p 00000000 fe:01 123 /tmp/prog\n\
                     555555559000-55555557a000 rw-p 00000000 00:00 0 [heap]\n\
                     7ffff7da8000-7ffff7f3d000 r-xp 00028000 fe:01 99 /usr/lib/libc.so.6\n\
                     7ffffffde000-7ffffffff000 rw-p 00000000 00:00 0 [stack]\n\
                     ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]\n";
    Fuzz::new("maps_lines")
        .seed_file("/proc/self/maps")
        .seed(synthetic)
        .tokens([
            "-",
            " ",
            "\n",
            "r-xp",
            "[heap]",
            "[stack]",
            "ffffffffffffffff",
            "0",
        ])
        .iterations(20_000)
        .run(|data| {
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
        });
}
