//! Bounded fuzz pass (hotprobe-fuzzcheck): the scratch-page view of
//! /proc/PID/maps never panics, nor does placing a gap in what it parsed.
//! The longer run is the cargo-fuzz target `maps_lines` in `fuzz/`
//! (docs/FUZZING.md).

#[path = "fuzz/exercise.rs"]
mod exercise;

use hotprobe_fuzzcheck::Fuzz;

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
        .run(exercise::maps_lines);
}
