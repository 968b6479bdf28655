//! Feeds arbitrary bytes to the thread-stream decoder: it must return
//! records or an error, never panic, loop or allocate without bound.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(mut dec) = hotprobe_trace::format::Decoder::new(data, "fuzz.hpt") else {
        return;
    };
    let mut n = 0u64;
    loop {
        match dec.next_record() {
            Ok(Some(r)) => {
                // Exercise the accessors on whatever came out.
                let _ = (r.ts(), r.probe(), r.event_count());
                n += 1;
                assert!(n <= data.len() as u64, "more records than bytes");
            }
            Ok(None) | Err(_) => break,
        }
    }
});
