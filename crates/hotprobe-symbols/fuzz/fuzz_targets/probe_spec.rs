#![no_main]
//! Probe specs: parsing never panics, and what parses round-trips.

use hotprobe_symbols::ProbeSpec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(spec) = text.parse::<ProbeSpec>() {
        let shown = spec.to_string();
        let again: ProbeSpec = shown
            .parse()
            .unwrap_or_else(|e| panic!("{spec:?} displays as {shown:?}, which fails: {e}"));
        assert_eq!(again, spec, "round trip via {shown:?}");
    }
});
