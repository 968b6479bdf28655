#![no_main]
//! Probe lists: parsing never panics, and what parses is written back to a
//! list that parses. The check is shared with the bounded pass in
//! `tests/fuzz.rs`.

#[path = "../../tests/fuzz/exercise.rs"]
mod exercise;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    exercise::probelist(data);
});
