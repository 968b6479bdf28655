#![no_main]
//! `Shm::attach` on arbitrary memory: an error, or a view whose every
//! accessor stays inside the mapping, never a panic. The check is shared
//! with the bounded pass in `tests/fuzz.rs`.

#[path = "../../tests/fuzz/exercise.rs"]
mod exercise;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    exercise::shm_attach(data);
});
