//! `call_stacks.tsv` (trace format 5): each recorded call's stack, by
//! thread and entry number, read back and counted in calls; a malformed
//! file is an error, never a panic (a bounded fuzz pass); a trace without
//! the file (older ones) has none.

use hotprobe_fuzzcheck::Fuzz;
use hotprobe_trace::call_stacks::*;

fn sample() -> CallStacks {
    let mut c = CallStacks::default();
    let s = |f: &str, callers: &[&str], t: bool| {
        (
            f.to_string(),
            callers.iter().map(|c| c.to_string()).collect::<Vec<_>>(),
            t,
        )
    };
    c.stacks
        .insert(1, s("malloc", &["leaf", "a", "main"], false));
    c.stacks
        .insert(2, s("malloc", &["leaf", "b", "main"], false));
    c.stacks.insert(7, s("free", &[], true));
    for (tid, entry, id) in [(10, 1, 1), (10, 2, 2), (10, 4, 2), (11, 1, 7), (11, 2, 2)] {
        c.calls.insert((tid, entry), id);
    }
    c
}

fn tmp(tag: &str) -> std::path::PathBuf {
    let d = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(tag);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn call_stacks_round_trip_and_count_in_calls() {
    let d = tmp("call-stacks-file");
    assert_eq!(read_call_stacks(&d).unwrap(), None);
    write_call_stacks(&d, &sample()).unwrap();
    let back = read_call_stacks(&d).unwrap().unwrap();
    assert_eq!(back, sample());
    assert_eq!(back.of_call(10, 4).map(|s| s.1[1].as_str()), Some("b"));
    assert_eq!(back.of_call(10, 3), None);
    let counted: Vec<(String, u64)> = back
        .counted()
        .into_iter()
        .map(|s| (s.callers.join(","), s.count))
        .collect();
    assert_eq!(
        counted,
        [
            ("leaf,b,main".to_string(), 3),
            ("".to_string(), 1),
            ("leaf,a,main".to_string(), 1)
        ]
    );
    // A call naming a stack no line gives is an error.
    let text = std::fs::read_to_string(d.join(CALL_STACKS_FILE)).unwrap();
    std::fs::write(d.join(CALL_STACKS_FILE), format!("{text}c\t1\t1\t99\n")).unwrap();
    assert!(read_call_stacks(&d).is_err());
}

#[test]
fn fuzz_call_stacks_tsv() {
    let d = tmp("call-stacks-fuzz");
    write_call_stacks(&d, &sample()).unwrap();
    let path = d.join(CALL_STACKS_FILE);
    let seed = std::fs::read(&path).unwrap();
    let report = Fuzz::new("call_stacks_tsv")
        .seed(seed)
        .tokens(["\t", "\n", ";", "s", "c", "0", "1", "4294967296", "-1"])
        .iterations(3_000)
        .run(|data| {
            std::fs::write(&path, data).unwrap();
            match read_call_stacks(&d) {
                Ok(Some(c)) => {
                    let _ = c.counted();
                    true
                }
                _ => false,
            }
        });
    assert!(report.accepted > 0, "{report:?}");
}

mod common;

/// `CallStacks::kept`: under every filter, the calls it keeps are those
/// `report` counts, function by function (each call's stack here is its
/// function's own, numbered as the recorder numbers entries), on a
/// synthetic trace of four threads with recursion, nesting and hits.
#[test]
fn kept_calls_are_the_calls_report_keeps() {
    use hotprobe_trace::{report_filtered, Query, Record, TraceReader};
    use std::collections::BTreeMap;
    let dir = tmp("call-stacks-kept");
    common::standard_trace(&dir, false);
    let r = TraceReader::open(&dir).unwrap();
    // Each entry (entry and call records, from 1 per thread) gets the
    // stack of its function.
    let mut cs = CallStacks::default();
    for s in r.streams() {
        let mut n = 0;
        for rec in r.thread(s.tid).unwrap() {
            if let Record::Entry { probe, .. } | Record::Call { probe, .. } = rec.unwrap() {
                n += 1;
                let name = r.symbols().name(probe).to_string();
                cs.stacks.insert(probe, (name, Vec::new(), false));
                cs.calls.insert((s.tid, n), probe);
            }
        }
    }
    let tids: Vec<u32> = r.streams().iter().map(|s| s.tid).collect();
    let queries = [
        Query::all(),
        Query {
            filter: vec!["fib".into()],
            ..Query::all()
        },
        Query {
            notrace: vec!["func_1*".into()],
            ..Query::all()
        },
        Query {
            max_depth: Some(2),
            ..Query::all()
        },
        Query {
            min_duration_ns: Some(500),
            ..Query::all()
        },
        Query {
            tids: vec![tids[1]],
            filter: vec!["func_*".into()],
            ..Query::all()
        },
        Query {
            since_ns: Some(2_000),
            until_ns: Some(20_000),
            ..Query::all()
        },
    ];
    for q in queries {
        let c = q.compile(&r).unwrap();
        let kept = cs.kept(&r, &c, None).unwrap();
        let mut got: BTreeMap<String, u64> = BTreeMap::new();
        for s in kept.counted() {
            *got.entry(s.function).or_default() += s.count;
        }
        let want: BTreeMap<String, u64> = report_filtered(&r, &c, None)
            .unwrap()
            .rows
            .into_iter()
            .filter(|row| row.calls > 0)
            .map(|row| (row.name, row.calls))
            .collect();
        assert!(!want.is_empty(), "{q:?} keeps nothing: a weak case");
        assert_eq!(got, want, "{q:?}");
        // Per thread: the same calls, split by thread.
        let by: u64 = kept
            .counted_by_thread()
            .iter()
            .flat_map(|(_, s)| s.iter().map(|s| s.count))
            .sum();
        assert_eq!(by, want.values().sum::<u64>(), "{q:?}");
    }
}
