//! Writer/reader round trips, aggregation sizes, filters, phases, analyses
//! and truncation.

mod common;

use common::*;
use hotprobe_trace::*;

fn by_thread(events: &[TraceEvent]) -> std::collections::BTreeMap<u32, Vec<TraceEvent>> {
    let mut m = std::collections::BTreeMap::<u32, Vec<TraceEvent>>::new();
    for e in events {
        m.entry(e.tid).or_default().push(*e);
    }
    m
}

#[test]
fn round_trip_multithreaded_nested_with_recursion() {
    let dir = tempfile::tempdir().unwrap();
    let (stats, events) = standard_trace(dir.path(), true);
    assert_eq!(stats.events_in, events.len() as u64);
    assert_eq!(stats.events_out, events.len() as u64, "nothing filtered");
    assert!(stats.kinds.calls > 0 && stats.kinds.entries > 0 && stats.kinds.hits > 0);
    let r = TraceReader::open(dir.path()).unwrap();
    assert!(r.info().complete);
    assert_eq!(r.streams().len(), 4);
    for (tid, evs) in by_thread(&events) {
        let recs = read_thread(&r, tid);
        assert_eq!(expand(tid, &recs), evs, "thread {tid}");
    }
    // Recursion really happened: fib inside fib.
    let rep = report(&r, None).unwrap();
    let fib = rep.row("fib").unwrap();
    assert!(fib.calls > 10);
}

#[test]
fn round_trip_tsc_time_base() {
    let dir = tempfile::tempdir().unwrap();
    let events = thread_events(7, 1, 200, true);
    let mut meta = TraceMeta::new("tsc", symbols(true));
    meta.time_base = TimeBase::tsc_hz(3_000_000_000);
    write_trace(dir.path(), meta, &events);
    let r = TraceReader::open(dir.path()).unwrap();
    assert_eq!(r.time_base().hz(), Some(3_000_000_000));
    let raw: Vec<Record> = r.thread(1).unwrap().raw().collect::<Result<_>>().unwrap();
    assert_eq!(expand(1, &raw), events);
    // In ns: times divided by 3.
    let ns = read_thread(&r, 1);
    assert_eq!(ns[0].ts(), raw[0].ts() / 3);
}

#[test]
fn abi_events_convert() {
    let e = hotprobe_abi::Event {
        tsc: 5,
        probe_id: 3,
        tid: 9,
        kind: hotprobe_abi::KIND_EXIT,
        nargs: 2,
        reserved: 0,
        reserved2: 0,
        args: [42, 1, 0, 0, 0, 0],
    };
    let t = TraceEvent::from_abi(&e).unwrap();
    assert_eq!(
        (t.kind, t.ret, t.tid, t.probe),
        (EventKind::Exit, Some(42), 9, 3)
    );
    let u = TraceEvent::from_abi(&hotprobe_abi::Event {
        reserved: hotprobe_abi::EXIT_UNWOUND,
        ..e
    })
    .unwrap();
    assert!(u.unwound && u.ret.is_none());
}

/// A loop calling an empty function (the iProbe micro-benchmark), with TSC
/// timestamps at 3 GHz: ≈ 25 ns per call and ≈ 15 ns between calls.
fn leaf_loop(n: u64, rng: &mut Rng) -> Vec<TraceEvent> {
    let mut ts = 1 << 40;
    let mut v = Vec::with_capacity(2 * n as usize + 2);
    v.push(TraceEvent::entry(ts, 1, MAIN));
    for _ in 0..n {
        ts += rng.range(30, 60);
        v.push(TraceEvent::entry(ts, 1, 5));
        ts += rng.range(60, 90);
        v.push(TraceEvent::exit(ts, 1, 5));
    }
    ts += 50;
    v.push(TraceEvent::exit(ts, 1, MAIN));
    v
}

#[test]
fn aggregation_leaf_loop_at_most_4_bytes_per_event() {
    let dir = tempfile::tempdir().unwrap();
    let events = leaf_loop(100_000, &mut Rng(3));
    let mut meta = TraceMeta::new("iprobe loop", symbols(false));
    meta.time_base = TimeBase::tsc_hz(3_000_000_000);
    let s = write_trace(dir.path(), meta.clone(), &events);
    assert_eq!(s.events_out, 200_002);
    assert_eq!(s.kinds.calls, 100_000);
    let bpe = s.bytes_per_event();
    eprintln!(
        "leaf loop: {} events, {} bytes, {bpe:.3} bytes/event (aggregated)",
        s.events_out, s.bytes
    );
    assert!(bpe <= 4.0, "{bpe} bytes/event");
    // The file size on disk is what the stats say.
    let r = TraceReader::open(dir.path()).unwrap();
    assert_eq!(r.total_bytes(), s.bytes);

    // Without aggregation, for the record.
    let dir2 = tempfile::tempdir().unwrap();
    meta.aggregate = false;
    let s2 = write_trace(dir2.path(), meta, &events);
    eprintln!(
        "leaf loop: {:.3} bytes/event without aggregation",
        s2.bytes_per_event()
    );
    assert_eq!(s2.kinds.calls, 0);
    assert!(s2.bytes > s.bytes);
    let r2 = TraceReader::open(dir2.path()).unwrap();
    let raw: Vec<Record> = r2.thread(1).unwrap().raw().collect::<Result<_>>().unwrap();
    assert!(expand(1, &raw) == events);
}

#[test]
fn nested_workload_bytes_per_event() {
    // Not a limit, a figure: the synthetic nested workload (recursion,
    // fan-out, 37 functions, gaps of 1–300 ticks) without arguments.
    let lists: Vec<_> = (0..4)
        .map(|t| thread_events(0x99 + t as u64, 10 + t, 2_000, false))
        .collect();
    let events = interleave(lists, 5);
    let dir = tempfile::tempdir().unwrap();
    let mut meta = TraceMeta::new("nested", symbols(false));
    meta.time_base = TimeBase::tsc_hz(3_000_000_000);
    let s = write_trace(dir.path(), meta, &events);
    eprintln!(
        "synthetic nested: {} events, {} records ({} calls), {:.3} bytes/event",
        s.events_out,
        s.records,
        s.kinds.calls,
        s.bytes_per_event()
    );
    assert!(s.bytes_per_event() < 6.0);
}

/// main → a(dur) calls with known durations; `b` nested in long `a`s.
fn known_durations() -> (Vec<TraceEvent>, Vec<u64>) {
    let durs = vec![5, 100, 7, 250, 99, 100, 101, 1, 1000];
    let mut v = vec![TraceEvent::entry(0, 1, MAIN)];
    let mut ts = 10;
    for &d in &durs {
        v.push(TraceEvent::entry(ts, 1, 3));
        if d >= 250 {
            // A nested short call and a nested long call.
            v.push(TraceEvent::entry(ts + 1, 1, 4));
            v.push(TraceEvent::exit(ts + 3, 1, 4));
            v.push(TraceEvent::entry(ts + 10, 1, 4));
            v.push(TraceEvent::exit(ts + 10 + 120, 1, 4));
        }
        v.push(TraceEvent::exit(ts + d, 1, 3));
        ts += d + 10;
    }
    v.push(TraceEvent::exit(ts, 1, MAIN));
    (v, durs)
}

fn calls_of(dir: &std::path::Path) -> Vec<(u32, u64)> {
    let r = TraceReader::open(dir).unwrap();
    let mut out = Vec::new();
    let mut cs = CallStack::new();
    for rec in r.thread(1).unwrap() {
        cs.feed(&rec.unwrap(), |s| {
            if let Step::Leave {
                probe, start, end, ..
            } = s
            {
                out.push((probe, end - start));
            }
        });
    }
    out
}

#[test]
fn min_duration_keeps_exactly_the_long_calls() {
    let (events, _) = known_durations();
    let dir = tempfile::tempdir().unwrap();
    let mut meta = TraceMeta::new("t", symbols(false));
    meta.filter = Filter::none().min_duration_ns(100);
    let s = write_trace(dir.path(), meta, &events);
    let calls = calls_of(dir.path());
    let mut kept: Vec<(u32, u64)> = calls.clone();
    kept.sort();
    let mut want: Vec<(u32, u64)> = Vec::new();
    // Expected: every call (any function) lasting ≥ 100.
    let mut open = Vec::new();
    for e in &events {
        match e.kind {
            EventKind::Entry => open.push(*e),
            EventKind::Exit => {
                let en = open.pop().unwrap();
                if e.ts - en.ts >= 100 {
                    want.push((e.probe, e.ts - en.ts));
                }
            }
            EventKind::Hit => {}
        }
    }
    want.sort();
    assert_eq!(kept, want);
    // Removed: 5, 7, 99, 1 and the two short nested b calls (2 each): 6 calls.
    assert_eq!(s.filtered.duration, 12);
    assert_eq!(s.filtered.kept_short, 0);
}

#[test]
fn depth_and_patterns() {
    let lists = vec![thread_events(11, 1, 100, false)];
    let events = interleave(lists, 1);
    // Depth ≤ 2: main and its direct callees only.
    let dir = tempfile::tempdir().unwrap();
    let mut meta = TraceMeta::new("t", symbols(false));
    meta.filter = Filter::none().max_depth(2);
    let s = write_trace(dir.path(), meta, &events);
    let r = TraceReader::open(dir.path()).unwrap();
    let mut cs = CallStack::new();
    let mut max_depth = 0;
    for rec in r.thread(1).unwrap() {
        cs.feed(&rec.unwrap(), |st| {
            if let Step::Leave { depth, .. } = st {
                max_depth = max_depth.max(depth);
            }
        });
    }
    assert_eq!(max_depth, 1);
    assert!(s.filtered.depth > 0);
    assert_eq!(s.filtered.depth + s.events_out, s.events_in);

    // Exclude func_1* and fib; include func_* only (main goes too).
    let dir = tempfile::tempdir().unwrap();
    let mut meta = TraceMeta::new("t", symbols(false));
    meta.filter = Filter::none()
        .include("func_*")
        .exclude("func_1?")
        .exclude("fib");
    let s = write_trace(dir.path(), meta, &events);
    let r = TraceReader::open(dir.path()).unwrap();
    let names: std::collections::BTreeSet<String> = read_thread(&r, 1)
        .iter()
        .filter_map(|x| x.probe())
        .map(|p| r.symbols().name(p).into_owned())
        .collect();
    assert!(!names.is_empty());
    for n in &names {
        assert!(n.starts_with("func_"), "{n}");
        assert!(!(n.len() == 7 && n.starts_with("func_1")), "{n}");
    }
    let expect_removed = events
        .iter()
        .filter(|e| {
            let n = symbols(false)[e.probe as usize].name.clone();
            !n.starts_with("func_") || (n.len() == 7 && n.starts_with("func_1"))
        })
        .count() as u64;
    assert_eq!(s.filtered.pattern, expect_removed);
    assert_eq!(s.events_out + expect_removed, s.events_in);
}

#[test]
fn sampling_is_consistent_for_entry_and_exit() {
    let events = thread_events(21, 1, 300, false);
    let dir = tempfile::tempdir().unwrap();
    let mut meta = TraceMeta::new("t", symbols(false));
    meta.filter = Filter::none().sample_every(3);
    let s = write_trace(dir.path(), meta, &events);
    let r = TraceReader::open(dir.path()).unwrap();
    let recs = read_thread(&r, 1);
    // Balanced: every entry written has its exit written.
    let mut open = Vec::new();
    for rec in &recs {
        match rec {
            Record::Entry { probe, .. } => open.push(*probe),
            Record::Exit { probe, .. } => assert_eq!(open.pop(), Some(*probe)),
            _ => {}
        }
    }
    assert!(open.is_empty());
    // Per function: calls kept = ceil(calls / 3).
    let mut total = std::collections::HashMap::<u32, u64>::new();
    for e in events.iter().filter(|e| e.kind == EventKind::Entry) {
        *total.entry(e.probe).or_default() += 1;
    }
    let mut kept = std::collections::HashMap::<u32, u64>::new();
    for rec in &recs {
        if let Record::Entry { probe, .. } | Record::Call { probe, .. } = rec {
            *kept.entry(*probe).or_default() += 1;
        }
    }
    for (p, n) in total {
        assert_eq!(
            kept.get(&p).copied().unwrap_or(0),
            n.div_ceil(3),
            "probe {p}"
        );
    }
    assert_eq!(s.filtered.sampling + s.events_out, s.events_in);
}

#[test]
fn three_marked_phases() {
    // main: init() marker, 3 × work; load() marker, 5 × work + 2 × aux;
    // run() marker, 7 × work. A second thread runs 4 × work during "load".
    let mut syms = symbols(false);
    syms[10].name = "init".into();
    syms[11].name = "load".into();
    syms[12].name = "run".into();
    syms[12].kind = ProbeKind::Marker;
    let (work, aux) = (20, 21);
    let mut v = Vec::new();
    let mut ts = 0;
    let call = |v: &mut Vec<TraceEvent>, tid, p, ts: &mut u64| {
        *ts += 10;
        v.push(TraceEvent::entry(*ts, tid, p));
        *ts += 5;
        v.push(TraceEvent::exit(*ts, tid, p));
    };
    v.push(TraceEvent::entry(ts, 1, MAIN));
    call(&mut v, 1, 10, &mut ts);
    for _ in 0..3 {
        call(&mut v, 1, work, &mut ts);
    }
    call(&mut v, 1, 11, &mut ts);
    for _ in 0..5 {
        call(&mut v, 1, work, &mut ts);
    }
    let mut ts2 = ts;
    for _ in 0..4 {
        call(&mut v, 2, work, &mut ts2);
    }
    for _ in 0..2 {
        call(&mut v, 1, aux, &mut ts);
    }
    ts = ts.max(ts2);
    v.push(TraceEvent::hit(ts + 1, 1, 12)); // marker hit
    ts += 2;
    for _ in 0..7 {
        call(&mut v, 1, work, &mut ts);
    }
    v.push(TraceEvent::exit(ts + 1, 1, MAIN));
    let dir = tempfile::tempdir().unwrap();
    let mut meta = TraceMeta::new("phases", syms);
    meta.phase_markers = vec!["init".into(), "load".into()];
    write_trace(dir.path(), meta, &v);
    let r = TraceReader::open(dir.path()).unwrap();
    let pr = report_phases(&r, &PhaseSpec::from_trace(&r), None).unwrap();
    let names: Vec<&str> = pr.phases.iter().map(|p| p.name.as_str()).collect();
    // main starts before the first marker: it makes the (start) phase.
    assert_eq!(names, ["(start)", "init", "load", "run"]);
    let calls = |ph: &str, f: &str| pr.phase(ph).unwrap().report.row(f).map_or(0, |r| r.calls);
    assert_eq!(calls("init", "func_20"), 3);
    assert_eq!(calls("load", "func_20"), 9);
    assert_eq!(calls("load", "func_21"), 2);
    assert_eq!(calls("run", "func_20"), 7);
    assert_eq!(calls("(start)", "main"), 1);
    assert_eq!(pr.phase("init").unwrap().calls(), 4);
    assert!(pr.to_text().contains("# phase 3: load"));

    // Per thread: thread 2 has no marker, its calls stay in (start).
    let spec = PhaseSpec {
        per_thread: true,
        ..PhaseSpec::from_trace(&r)
    };
    let pr = report_phases(&r, &spec, None).unwrap();
    assert_eq!(
        pr.phase("load")
            .unwrap()
            .report
            .row("func_20")
            .unwrap()
            .calls,
        5
    );
    assert_eq!(
        pr.phase("(start)")
            .unwrap()
            .report
            .row("func_20")
            .unwrap()
            .calls,
        4
    );
}

fn small_tree(dir: &std::path::Path) {
    // main { a { b(); b(); } c(); } — times in ns.
    let e = |ts, p, k: EventKind| TraceEvent {
        kind: k,
        ..TraceEvent::entry(ts, 7, p)
    };
    use EventKind::*;
    let events = vec![
        e(0, MAIN, Entry),
        e(100, 3, Entry),
        e(110, 4, Entry),
        e(130, 4, Exit),
        e(140, 4, Entry),
        e(170, 4, Exit),
        e(300, 3, Exit),
        e(400, 5, Entry),
        e(450, 5, Exit),
        e(1000, MAIN, Exit),
    ];
    let mut syms = symbols(false);
    syms[3].name = "a".into();
    syms[4].name = "b".into();
    syms[5].name = "c".into();
    write_trace(dir, TraceMeta::new("tree", syms), &events);
}

#[test]
fn replay_and_report_of_a_known_tree() {
    let dir = tempfile::tempdir().unwrap();
    small_tree(dir.path());
    let r = TraceReader::open(dir.path()).unwrap();
    let mut out = Vec::new();
    replay(&r, &mut out, None).unwrap();
    let text = String::from_utf8(out).unwrap();
    let want = "\
# DURATION     TID     FUNCTION
            [     7] | main() {
            [     7] |   a() {
   0.020 us [     7] |     b();
   0.030 us [     7] |     b();
   0.200 us [     7] |   }; /* a */
   0.050 us [     7] |   c();
   1.000 us [     7] | }; /* main */
";
    assert_eq!(text, want);
    let rep = report(&r, None).unwrap();
    let rows: Vec<(&str, u64, u64, u64)> = rep
        .rows
        .iter()
        .map(|x| (x.name.as_str(), x.calls, x.total_ns, x.self_ns))
        .collect();
    assert_eq!(
        rows,
        [
            ("main", 1, 1000, 750),
            ("a", 1, 200, 150),
            ("b", 2, 50, 50),
            ("c", 1, 50, 50)
        ]
    );
    assert!(rep.to_text().contains("Total time"));
}

fn all_trace_files(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    v
}

/// Reads everything a trace has; Err on the first problem.
fn read_all(dir: &std::path::Path) -> Result<u64> {
    let r = TraceReader::open(dir)?;
    let mut n = 0;
    for st in r.threads()? {
        for rec in st {
            rec?;
            n += 1;
        }
    }
    Ok(n)
}

#[test]
fn truncation_at_every_byte_is_an_error() {
    let src = tempfile::tempdir().unwrap();
    let lists: Vec<_> = (0..2)
        .map(|t| thread_events(0x77 + t as u64, 1 + t, 8, true))
        .collect();
    let events = interleave(lists, 3);
    let mut meta = TraceMeta::new("trunc", symbols(true));
    meta.start_unix_ns = 1;
    write_trace(src.path(), meta, &events);
    assert!(read_all(src.path()).unwrap() > 0);
    let work = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for f in all_trace_files(src.path()) {
        let data = std::fs::read(&f).unwrap();
        let name = f.file_name().unwrap();
        for cut in 0..data.len() {
            // A fresh copy with this one file truncated.
            for g in all_trace_files(src.path()) {
                std::fs::copy(&g, work.path().join(g.file_name().unwrap())).unwrap();
            }
            std::fs::write(work.path().join(name), &data[..cut]).unwrap();
            let e = read_all(work.path()).expect_err(&format!(
                "{} cut at {cut} read fine",
                name.to_string_lossy()
            ));
            let msg = e.to_string();
            assert!(
                msg.contains(&*name.to_string_lossy()),
                "error does not name the file: {msg}"
            );
            checked += 1;
        }
    }
    assert!(checked > 500);

    // Without info.json's sizes (a crashed recording) the stream itself
    // still reports truncation at every byte.
    let s = &src.path().join("tid-1.hpt");
    let data = std::fs::read(s).unwrap();
    for cut in 0..data.len() {
        let mut dec = match hotprobe_trace::format::Decoder::new(&data[..cut], "tid-1.hpt") {
            Ok(d) => d,
            Err(e) => {
                assert!(matches!(e, TraceError::Truncated { .. }), "{e}");
                continue;
            }
        };
        let err = loop {
            match dec.next_record() {
                Ok(Some(_)) => {}
                Ok(None) => panic!("cut at {cut} decoded to the end"),
                Err(e) => break e,
            }
        };
        assert!(err.to_string().contains("tid-1.hpt: truncated"), "{err}");
    }
}

#[test]
fn corrupt_bytes_never_panic() {
    let src = tempfile::tempdir().unwrap();
    standard_trace(src.path(), true);
    let data = std::fs::read(src.path().join("tid-100.hpt")).unwrap();
    let mut rng = Rng(5);
    for _ in 0..3000 {
        let mut d = data.clone();
        for _ in 0..rng.range(1, 4) {
            let i = rng.below(d.len() as u64) as usize;
            d[i] = rng.next() as u8;
        }
        if let Ok(mut dec) = hotprobe_trace::format::Decoder::new(&d[..], "x") {
            while let Ok(Some(_)) = dec.next_record() {}
        }
    }
}

/// The example of docs/TRACE_FORMAT.md, byte for byte.
#[test]
fn format_doc_example_bytes() {
    let mut syms = vec![
        Symbol::function(0, "main"),
        Symbol::function(1, "leaf"),
        Symbol::function(2, "loop_top"),
        Symbol::function(3, "parse"),
        Symbol::function(20, "eval"),
    ];
    syms[2].kind = ProbeKind::Hit;
    syms[3].nargs = 2;
    syms[3].retval = true;
    let t = 42;
    let events = [
        TraceEvent::entry(1000, t, 0),
        TraceEvent::entry(1010, t, 3).with_args(&[7, (-1i64) as u64, 99]),
        TraceEvent::exit(1150, t, 3).with_ret(5),
        TraceEvent::entry(1200, t, 20),
        TraceEvent::entry(1205, t, 1),
        TraceEvent::exit(1300, t, 1),
        TraceEvent::hit(1310, t, 2),
        TraceEvent::exit(1400, t, 20),
        TraceEvent::exit(1500, t, 0),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut w = TraceWriter::create(dir.path(), TraceMeta::new("doc", syms)).unwrap();
    w.compress(false);
    for e in &events {
        w.write_event(e).unwrap();
    }
    let s = w.finish().unwrap();
    let bytes = std::fs::read(dir.path().join("tid-42.hpt")).unwrap();
    let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(
        hex.join(" "),
        "48 50 54 53 01 00 00 00 2a 00 00 00 e8 03 00 00 00 00 00 00 \
         01 00 \
         38 0a 8c 01 03 02 0e 01 0a \
         f1 14 32 \
         10 05 5f \
         23 0a \
         e2 5a \
         e2 64 \
         05 07"
    );
    assert_eq!((s.events_out, s.records, s.bytes), (9, 7, 45));
}

/// Format version 2: a typed probe's captured values (types.tsv, values
/// files) come back through replay; a version-1 trace (no types) is still
/// read; a values file cut short is an error, shown per value by replay.
#[test]
fn typed_values_round_trip_and_version_1_still_reads() {
    let dir = tempfile::tempdir().unwrap();
    let mut meta = TraceMeta::new(
        "typed",
        vec![{
            let mut s = Symbol::function(3, "greet");
            s.nargs = 1;
            s.retval = true;
            s
        }],
    );
    meta.start_unix_ns = 1;
    let mut w = TraceWriter::create(dir.path(), meta).unwrap();
    let item = |shape| ShapeItem {
        label: String::new(),
        shape,
    };
    let mut types = ValueTypes::default();
    types.insert(
        3,
        vec![item(Shape::Str), item(Shape::Signed(4))],
        vec![item(Shape::F64)],
    );
    w.set_value_types(&types).unwrap();
    let mut entry = vec![1, 0, 5, 0];
    entry.extend(b"world");
    entry.push(0);
    entry.extend((-3i64 as u64).to_le_bytes());
    let mut exit = vec![0];
    exit.extend(4.75f64.to_bits().to_le_bytes());
    for (i, (e, x)) in [(1000, 1500), (2000, 2600)].into_iter().enumerate() {
        w.write_event_values(&TraceEvent::entry(e, 9, 3), &entry)
            .unwrap();
        let mut ev = TraceEvent::exit(x, 9, 3);
        ev.ret = Some(1234 + i as u64); // replaced by the record's index
        w.write_event_values(&ev, &exit).unwrap();
    }
    w.finish().unwrap();
    let r = TraceReader::open(dir.path()).unwrap();
    assert_eq!(r.info().version, FORMAT_VERSION);
    assert_eq!(r.thread_values(9).unwrap().len(), 4);
    let mut out = Vec::new();
    replay(&r, &mut out, None).unwrap();
    let out = String::from_utf8(out).unwrap();
    assert_eq!(
        out.matches("| greet(\"world\", -3) = 4.75;").count(),
        2,
        "{out}"
    );
    // Chrome JSON: the values as text (strings are JSON strings holding
    // the quoted C string); CTF keeps no numbers for typed probes.
    let mut json = Vec::new();
    export_chrome(&r, &mut json, None).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&json).unwrap();
    let calls: Vec<&serde_json::Value> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "X")
        .collect();
    assert_eq!(calls.len(), 2);
    for c in calls {
        assert_eq!(c["args"]["args"], serde_json::json!(["\"world\"", "-3"]));
        assert_eq!(c["args"]["retval"], "4.75");
    }
    // A values file cut short: an error naming it; replay shows the
    // values it cannot find, and everything else.
    let vp = dir.path().join(values_file_name(9));
    let bytes = std::fs::read(&vp).unwrap();
    std::fs::write(&vp, &bytes[..bytes.len() - 3]).unwrap();
    assert!(r.thread_values(9).is_err());
    let mut out = Vec::new();
    replay(&r, &mut out, None).unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(out.contains("greet(<no captured values #0>)"), "{out}");

    // Version 1: no types, registers as before.
    let dir1 = tempfile::tempdir().unwrap();
    let mut meta = TraceMeta::new(
        "v1",
        vec![{
            let mut s = Symbol::function(3, "greet");
            s.nargs = 2;
            s.retval = true;
            s
        }],
    );
    meta.start_unix_ns = 1;
    let mut w = TraceWriter::create(dir1.path(), meta).unwrap();
    let mut e = TraceEvent::entry(1000, 9, 3);
    e.args = Args::from_slice(&[7, u64::MAX]);
    w.write_event(&e).unwrap();
    let mut x = TraceEvent::exit(1500, 9, 3);
    x.ret = Some(5);
    w.write_event(&x).unwrap();
    w.finish().unwrap();
    let ip = dir1.path().join(INFO_FILE);
    let info = std::fs::read_to_string(&ip).unwrap();
    let current = format!("\"version\": {FORMAT_VERSION}");
    std::fs::write(&ip, info.replace(&current, "\"version\": 1")).unwrap();
    let r = TraceReader::open(dir1.path()).unwrap();
    assert_eq!(r.info().version, 1);
    let mut out = Vec::new();
    replay(&r, &mut out, None).unwrap();
    let out = String::from_utf8(out).unwrap();
    assert!(out.contains("| greet(7, -1) = 5;"), "{out}");
    // A version after this reader's is refused.
    let next = format!("\"version\": {}", FORMAT_VERSION + 1);
    std::fs::write(&ip, info.replace(&current, &next)).unwrap();
    assert!(TraceReader::open(dir1.path()).is_err());
}
