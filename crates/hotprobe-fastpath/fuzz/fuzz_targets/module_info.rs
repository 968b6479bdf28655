#![no_main]
//! `ModuleInfo::from_bytes` and `plan` on an arbitrary ELF file and probe
//! list (first byte: which list; see `tests/fuzz/exercise.rs`) never
//! panic. The check is shared with the bounded pass in `tests/fuzz.rs`.

#[path = "../../tests/fuzz/exercise.rs"]
mod exercise;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    exercise::module_info(data);
});
