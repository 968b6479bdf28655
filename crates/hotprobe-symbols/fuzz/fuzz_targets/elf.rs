#![no_main]
//! ELF parsing never panics on arbitrary bytes: symbols, lookups, PLT and
//! segment queries, load biases.
//! The check is shared with the bounded pass in `tests/fuzz.rs`.

#[path = "../../tests/fuzz/exercise.rs"]
mod exercise;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    exercise::elf(data);
});
