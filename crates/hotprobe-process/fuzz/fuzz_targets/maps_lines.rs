#![no_main]
//! The scratch-page view of /proc/PID/maps never panics, nor does placing
//! a gap in what it parsed. The check is shared with the bounded pass in
//! `tests/fuzz.rs`.

#[path = "../../tests/fuzz/exercise.rs"]
mod exercise;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    exercise::maps_lines(data);
});
