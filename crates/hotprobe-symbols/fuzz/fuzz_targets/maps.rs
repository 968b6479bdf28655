#![no_main]
//! /proc/PID/maps parsing never panics; parsed mappings are well formed.

use hotprobe_symbols::parse_maps;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(maps) = parse_maps(&text) {
        for m in &maps {
            assert!(m.start <= m.end);
            let _ = m.perms.to_string();
        }
    }
});
