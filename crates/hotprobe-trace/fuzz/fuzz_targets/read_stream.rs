//! Feeds arbitrary bytes to the thread-stream decoder: it must return
//! records or an error, never panic, loop or allocate without bound. The
//! check is shared with the bounded pass in `tests/fuzz.rs`.
#![no_main]

#[path = "../../tests/common/mod.rs"]
mod common;
#[path = "../../tests/fuzz/exercise.rs"]
mod exercise;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    exercise::read_stream(data);
});
