#![no_main]
//! /proc/PID/maps parsing never panics; parsed mappings are well formed.
//! The check is shared with the bounded pass in `tests/fuzz.rs`.

#[path = "../../tests/fuzz/exercise.rs"]
mod exercise;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    exercise::maps(data);
});
