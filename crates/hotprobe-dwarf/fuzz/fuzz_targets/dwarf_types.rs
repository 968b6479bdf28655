#![no_main]
//! DWARF types, signatures and argument plans never panic on any ELF bytes.
//! The check is shared with the bounded pass in `tests/fuzz.rs`.

#[path = "../../tests/fuzz/exercise.rs"]
mod exercise;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    exercise::dwarf_types(data);
});
