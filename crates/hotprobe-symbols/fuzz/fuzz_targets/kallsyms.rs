#![no_main]
//! kallsyms / System.map parsing never panics; lookups agree with symbolize.

use hotprobe_symbols::KernelSymbols;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Ok(k) = KernelSymbols::parse(&text) {
        assert!(!k.is_empty());
        let syms = k.symbols().to_vec();
        for s in syms.iter().take(16) {
            let found = k.lookup(&s.name).expect("every symbol can be looked up");
            let _ = k.module_of(found);
            let (hit, off) = k.symbolize(s.addr.0).expect("a symbol's start symbolizes");
            assert_eq!(hit.addr.0 + off, s.addr.0);
        }
        let _ = k.symbolize(u64::MAX);
        let _ = k.lookup("");
    }
});
