#![no_main]
//! Probe specs: parsing never panics, and what parses round-trips.
//! The check is shared with the bounded pass in `tests/fuzz.rs`.

#[path = "../../tests/fuzz/exercise.rs"]
mod exercise;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    exercise::probe_spec(data);
});
