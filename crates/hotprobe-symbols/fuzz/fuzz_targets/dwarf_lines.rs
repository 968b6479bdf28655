#![no_main]
//! DWARF line tables never panic: `file:LINE` to addresses and addresses to `file:line`.
//! The check is shared with the bounded pass in `tests/fuzz.rs`.

#[path = "../../tests/fuzz/exercise.rs"]
mod exercise;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    exercise::dwarf_lines(data);
});
