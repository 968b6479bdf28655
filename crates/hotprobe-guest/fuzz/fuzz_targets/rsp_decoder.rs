//! Feeds random bytes, split into random chunks, to the RSP streaming decoder
//! and every reply parser: none may panic, and whole-buffer and chunked
//! decoding must agree. The check is shared with the bounded pass in
//! `tests/fuzz.rs`.
#![no_main]

#[path = "../../tests/fuzz/exercise.rs"]
mod exercise;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    exercise::rsp_decoder(data);
});
