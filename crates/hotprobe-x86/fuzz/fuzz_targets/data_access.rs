#![no_main]
//! `data_access` (the instruction a watchpoint trapped after) never panics
//! on arbitrary code, registers and addresses. The check is shared with
//! the bounded pass in `tests/fuzz.rs`.

#[path = "../../tests/fuzz/exercise.rs"]
mod exercise;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    exercise::data_access_input(data);
});
