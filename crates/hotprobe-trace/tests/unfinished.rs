//! A trace its writer never finished (killed: no end record, no final
//! info.json) cut at every byte of its stream: the reader takes it up to
//! its last whole block (compressed) or record (plain), says so, and the
//! records it yields are exactly the first ones written.

mod common;

use common::*;
use hotprobe_trace::*;

/// Writes `events` of thread 1 in chunks, each flushed as whole blocks,
/// without finishing; returns the stream's bytes, its size after each
/// flush and the records read back whole.
fn unfinished(dir: &std::path::Path, compress: bool) -> (Vec<u8>, Vec<u64>, Vec<Record>) {
    // main, then 150 calls of a leaf (with an argument), every 10th
    // with a nested leaf and a hit.
    let mut events = vec![TraceEvent::entry(1_000, 1, MAIN)];
    let mut ts = 1_000;
    for i in 0..150u64 {
        ts += 7 + i % 5;
        events.push(TraceEvent::entry(ts, 1, 3).with_args(&[i]));
        if i % 10 == 0 {
            events.push(TraceEvent::entry(ts + 1, 1, 4));
            events.push(TraceEvent::hit(ts + 2, 1, HIT));
            events.push(TraceEvent::exit(ts + 3, 1, 4));
        }
        ts += 5 + i % 3;
        events.push(TraceEvent::exit(ts, 1, 3).with_ret(i));
    }
    let mut w = TraceWriter::create(dir, TraceMeta::new("killed", symbols(true))).unwrap();
    w.compress(compress);
    let stream = dir.join(stream_file_name(1));
    let mut flushed = Vec::new();
    for chunk in events.chunks(13) {
        for e in chunk {
            w.write_event(e).unwrap();
        }
        w.flush();
        flushed.push(std::fs::metadata(&stream).unwrap().len());
    }
    // Killed: the writer is never finished.
    drop(w);
    let r = TraceReader::open(dir).unwrap();
    assert!(!r.info().complete);
    let cut = r.cut_short();
    assert_eq!(cut.len(), 1, "{cut:?}");
    let bytes = std::fs::read(&stream).unwrap();
    assert_eq!(cut[0].bytes_read, bytes.len() as u64);
    assert_eq!(cut[0].file_bytes, bytes.len() as u64);
    let recs = read_thread(&r, 1);
    assert_eq!(cut[0].records, recs.len() as u64);
    assert!(recs.len() > 20, "{} records", recs.len());
    eprintln!(
        "{} bytes, {} records, {} flushes",
        bytes.len(),
        recs.len(),
        flushed.len()
    );
    (bytes, flushed, recs)
}

fn every_cut(compress: bool) {
    let src = tempfile::tempdir().unwrap();
    let (bytes, flushed, all) = unfinished(src.path(), compress);
    let work = tempfile::tempdir().unwrap();
    for name in [INFO_FILE, SYMBOLS_FILE] {
        std::fs::copy(src.path().join(name), work.path().join(name)).unwrap();
    }
    let stream = work.path().join(stream_file_name(1));
    let mut last = 0;
    for len in 0..=bytes.len() {
        std::fs::write(&stream, &bytes[..len]).unwrap();
        let r = TraceReader::open(work.path())
            .unwrap_or_else(|e| panic!("cut at {len} of {}: {e}", bytes.len()));
        let cut = &r.cut_short()[0];
        let recs = read_thread(&r, 1);
        assert_eq!(cut.records, recs.len() as u64, "cut at {len}");
        assert_eq!(cut.file_bytes, len as u64);
        assert!(cut.bytes_read <= len as u64, "cut at {len}: {cut:?}");
        // A prefix of what was written, growing with the cut.
        assert_eq!(recs[..], all[..recs.len()], "cut at {len}");
        assert!(recs.len() >= last, "cut at {len}");
        last = recs.len();
        if compress {
            // Whole blocks: a cut at a flush point loses nothing before it,
            // and the bytes read end at a block boundary.
            if flushed.contains(&(len as u64)) {
                assert_eq!(cut.bytes_read, len as u64, "cut at {len}");
            }
            assert!(
                cut.bytes_read == 20 * u64::from(len >= 20) || flushed.contains(&cut.bytes_read),
                "cut at {len}: read up to {} (not a block boundary)",
                cut.bytes_read
            );
        } else if len >= 20 {
            // Whole records: at most one record's bytes are left unread.
            assert!(len as u64 - cut.bytes_read < 100, "cut at {len}: {cut:?}");
        }
        // The analyses read it too (at every 16th cut: they are slow).
        if len % 16 == 0 {
            report(&r, None).unwrap();
            replay(&r, &mut std::io::sink(), None).unwrap();
            summarize(&r, None).unwrap();
        }
    }
    assert_eq!(last, all.len());
}

#[test]
fn unfinished_compressed_stream_cut_at_every_byte_reads_up_to_its_last_whole_block() {
    every_cut(true);
}

#[test]
fn unfinished_plain_stream_cut_at_every_byte_reads_up_to_its_last_whole_record() {
    every_cut(false);
}

#[test]
fn a_finished_trace_cut_short_is_still_an_error() {
    let dir = tempfile::tempdir().unwrap();
    standard_trace(dir.path(), true);
    let p = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "hpt"))
        .unwrap();
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() - 1]).unwrap();
    let e = TraceReader::open(dir.path()).unwrap_err();
    assert!(matches!(e, TraceError::Truncated { .. }), "{e}");
}

#[test]
fn a_loss_stamped_0_reads_under_a_tsc_time_base_a_call_before_ns_0_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut meta = TraceMeta::new("lost first", symbols(false));
    // 3 GHz; tick 1,000,000 is ns 1,000.
    meta.time_base = TimeBase::Tsc {
        tsc0: 1_000_000,
        ns0: 1_000,
        tsc1: 4_000_000,
        ns1: 1_001_000,
    };
    let mut w = TraceWriter::create(dir.path(), meta).unwrap();
    // The recorder stamps a loss before its thread's first event 0.
    w.note_lost(1, 0, 5).unwrap();
    w.write_event(&TraceEvent::entry(2_000_000, 1, 3)).unwrap();
    w.write_event(&TraceEvent::exit(2_000_300, 1, 3)).unwrap();
    // A call before ns 0 on thread 2: not this time base's.
    w.write_event(&TraceEvent::entry(10, 2, 3)).unwrap();
    w.write_event(&TraceEvent::exit(20, 2, 3)).unwrap();
    w.finish().unwrap();
    let r = TraceReader::open(dir.path()).unwrap();
    let recs = read_thread(&r, 1);
    assert_eq!(recs[0], Record::Lost { ts: 0, count: 5 });
    assert!(
        matches!(
            recs[1],
            Record::Call {
                ts: 334_333,
                dur: 100,
                ..
            }
        ),
        "{recs:?}"
    );
    let e = r.thread(2).unwrap().next().unwrap().unwrap_err();
    assert!(e.to_string().contains("corrupt time base?"), "{e}");
}
