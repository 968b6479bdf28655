//! Bounded fuzz passes (hotprobe-fuzzcheck): the trace reader never panics,
//! on a corrupt stream or on a corrupt trace directory (info.json,
//! symbols.tsv, a stream) run through every analysis and exporter. The
//! longer runs are the cargo-fuzz targets `read_stream` and `trace_dir` in
//! `fuzz/` (docs/FUZZING.md).

mod common;

use common::*;
use hotprobe_fuzzcheck::Fuzz;
use hotprobe_trace::*;

/// A small recorded trace (two threads, a few nested calls each, with
/// arguments and return values): small enough to be read thousands of
/// times in a few seconds.
fn small_trace(dir: &std::path::Path) {
    let lists: Vec<_> = (0..2)
        .map(|t| thread_events(0x77 + t as u64, 1 + t, 8, true))
        .collect();
    let events = interleave(lists, 3);
    let mut meta = TraceMeta::new("fuzz", symbols(true));
    meta.start_unix_ns = 1;
    write_trace(dir, meta, &events);
}

#[test]
fn fuzz_read_stream() {
    let src = tempfile::tempdir().unwrap();
    small_trace(src.path());
    let mut seeds = Vec::new();
    for tid in [1, 2] {
        seeds.push(std::fs::read(src.path().join(stream_file_name(tid))).unwrap());
    }
    Fuzz::new("read_stream")
        .seeds(seeds)
        .tokens([
            &b"HPTS"[..],
            b"\x01\x00",
            b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
        ])
        .iterations(20_000)
        .run(|data| {
            let Ok(mut dec) = format::Decoder::new(data, "fuzz.hpt") else {
                return false;
            };
            let _ = (dec.tid(), dec.base(), dec.offset());
            let mut stack = CallStack::new();
            let mut n = 0u64;
            let ok = loop {
                match dec.next_record() {
                    Ok(Some(r)) => {
                        let _ = (r.ts(), r.probe(), r.event_count());
                        stack.feed(&r, |_| {});
                        n += 1;
                        assert!(n <= data.len() as u64, "more records than bytes");
                    }
                    Ok(None) => break true,
                    Err(_) => break false,
                }
            };
            stack.finish(|_| {});
            let _ = dec.counts().events();
            ok
        });
}

/// The files of a trace directory; the fuzz input replaces one of them.
const FILES: [&str; 3] = [INFO_FILE, SYMBOLS_FILE, "tid-1.hpt"];

/// Everything a reader of a whole trace does.
fn read_everything(dir: &std::path::Path, out: &std::path::Path) -> bool {
    let Ok(r) = TraceReader::open(dir) else {
        return false;
    };
    let _ = (r.time_base().hz(), r.total_bytes(), r.symbols().id_bound());
    let _ = r.symbols().name(u32::MAX);
    let mut ok = true;
    if let Ok(threads) = r.threads() {
        for st in threads {
            for rec in st {
                ok &= rec.is_ok();
            }
        }
    }
    ok &= replay(&r, &mut std::io::sink(), None).is_ok();
    ok &= report(&r, None).map(|rep| rep.to_text()).is_ok();
    ok &= report_phases(&r, &PhaseSpec::from_trace(&r), None)
        .map(|p| p.to_text())
        .is_ok();
    ok &= export_chrome(&r, &mut std::io::sink(), None).is_ok();
    for value in [FoldedValue::Calls, FoldedValue::SelfNs] {
        let opts = FoldedOptions {
            value,
            per_thread: true,
        };
        ok &= export_folded(&r, &mut std::io::sink(), opts, None).is_ok();
    }
    ok &= export_ctf(&r, out, None).is_ok();
    ok
}

#[test]
fn fuzz_trace_dir() {
    let src = tempfile::tempdir().unwrap();
    small_trace(src.path());
    let originals: Vec<(std::path::PathBuf, Vec<u8>)> = std::fs::read_dir(src.path())
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            let bytes = std::fs::read(&p).unwrap();
            (p.file_name().unwrap().into(), bytes)
        })
        .collect();
    let original = |name: &str| {
        originals
            .iter()
            .find(|(n, _)| n.as_os_str() == name)
            .map(|(_, b)| b.clone())
            .unwrap()
    };
    let seeds: Vec<Vec<u8>> = FILES
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let mut s = vec![i as u8];
            s.extend(original(f));
            s
        })
        .collect();
    let work = tempfile::tempdir().unwrap();
    let ctf = tempfile::tempdir().unwrap();
    Fuzz::new("trace_dir")
        .seeds(seeds)
        .tokens([
            &b"\"complete\":"[..],
            b"false",
            b"true",
            b"null",
            b"\"time_base\":",
            b"\"tsc_hz\":",
            b"\"phase_markers\":[\"main\"]",
            b"\t",
            b"\n",
            b"hit",
            b"function",
            b"-1",
            b"1e999",
        ])
        .iterations(5_000)
        .run(|data| {
            let Some((&which, content)) = data.split_first() else {
                return false;
            };
            let replaced = FILES[usize::from(which) % FILES.len()];
            for (name, bytes) in &originals {
                let bytes = if name.as_os_str() == replaced {
                    content
                } else {
                    bytes
                };
                std::fs::write(work.path().join(name), bytes).unwrap();
            }
            read_everything(work.path(), ctf.path())
        });
}
