#![no_main]
//! Name patterns: compiling and matching never panic (first line: the
//! pattern; the others: names).
//! The check is shared with the bounded pass in `tests/fuzz.rs`.

#[path = "../../tests/fuzz/exercise.rs"]
mod exercise;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    exercise::name_pattern(data);
});
