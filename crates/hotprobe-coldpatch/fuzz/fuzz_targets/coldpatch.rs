#![no_main]
//! ColdPatch on arbitrary bytes: an error or a same-size output whose
//! listed sites lie inside it, never a panic. The check is shared with the
//! bounded pass in `tests/fuzz.rs`.

#[path = "../../tests/fuzz/exercise.rs"]
mod exercise;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    exercise::coldpatch(data);
});
