#![no_main]
//! The perf ring's records and tracepoint `format` files on arbitrary
//! bytes: records or an error, never a panic. The check is shared with
//! the bounded pass in `tests/fuzz.rs`.

#[path = "../../tests/fuzz/exercise.rs"]
mod exercise;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    exercise::perf_ring(data);
});
