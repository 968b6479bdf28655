#![no_main]
//! kallsyms / System.map parsing never panics; lookups agree with symbolize.
//! The check is shared with the bounded pass in `tests/fuzz.rs`.

#[path = "../../tests/fuzz/exercise.rs"]
mod exercise;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    exercise::kallsyms(data);
});
