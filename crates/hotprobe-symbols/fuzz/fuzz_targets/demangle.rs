#![no_main]
//! Demangling never panics on any name, Rust (legacy and v0) or C++.

use hotprobe_symbols::demangle;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let raw = String::from_utf8_lossy(data);
    let _ = demangle(&raw);
    // The mangling prefixes, so that every input reaches a demangler.
    for prefix in ["_Z", "_ZN", "_R"] {
        let _ = demangle(&format!("{prefix}{raw}"));
    }
});
