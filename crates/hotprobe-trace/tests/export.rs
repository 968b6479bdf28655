//! Exporters: CTF read back by babeltrace2, Chrome JSON, folded stacks.

mod common;

use common::*;
use hotprobe_trace::*;

#[test]
fn ctf_export_reads_in_babeltrace2_with_the_recorded_count() {
    let src = tempfile::tempdir().unwrap();
    let (stats, _) = standard_trace(src.path(), true);
    let r = TraceReader::open(src.path()).unwrap();
    let out = tempfile::tempdir().unwrap();
    let ctf = out.path().join("ctf");
    let mut calls = 0;
    let mut cb = |d: u64, t: u64| {
        assert!(d <= t);
        calls += 1;
    };
    let cs = export_ctf(&r, &ctf, Some(&mut cb)).unwrap();
    assert!(calls > 0, "progress callback never called");
    assert_eq!(cs.events, stats.events_out + stats.kinds.lost);
    assert_eq!(cs.streams, 4);
    let bt = match std::process::Command::new("babeltrace2").arg(&ctf).output() {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "SKIPPED LOUDLY: babeltrace2 not runnable ({e}); install the babeltrace2 package"
            );
            return;
        }
    };
    let stderr = String::from_utf8_lossy(&bt.stderr);
    assert!(bt.status.success(), "babeltrace2 failed: {stderr}");
    let text = String::from_utf8_lossy(&bt.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len() as u64,
        stats.events_out,
        "babeltrace2 event count"
    );
    assert_eq!(
        lines.iter().filter(|l| l.contains("func_entry")).count() as u64,
        stats.kinds.calls + stats.kinds.entries
    );
    // The enum shows function names.
    assert!(
        text.contains("\"fib\""),
        "{}",
        &text[..text.len().min(2000)]
    );
}

#[test]
fn chrome_json_parses_and_balances_per_thread() {
    let src = tempfile::tempdir().unwrap();
    let (stats, _) = standard_trace(src.path(), true);
    let r = TraceReader::open(src.path()).unwrap();
    let mut out = Vec::new();
    let cs = export_chrome(&r, &mut out, None).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let evs = v["traceEvents"].as_array().unwrap();
    let mut depth = std::collections::HashMap::<u64, Vec<String>>::new();
    let (mut b, mut e, mut x) = (0, 0, 0);
    for ev in evs {
        let tid = ev["tid"].as_u64().unwrap();
        let name = ev["name"].as_str().unwrap().to_string();
        match ev["ph"].as_str().unwrap() {
            "B" => {
                b += 1;
                depth.entry(tid).or_default().push(name);
            }
            "E" => {
                e += 1;
                let top = depth.get_mut(&tid).and_then(|s| s.pop());
                assert_eq!(top.as_deref(), Some(name.as_str()), "unbalanced E on {tid}");
            }
            "X" => {
                x += 1;
                assert!(ev["dur"].as_f64().unwrap() >= 0.0);
            }
            "i" | "M" => {}
            o => panic!("unexpected ph {o}"),
        }
        if ev["ph"] != "M" {
            assert!(ev["ts"].as_f64().is_some());
        }
    }
    assert!(depth.values().all(|s| s.is_empty()), "open B left");
    assert_eq!((b, e, x), (cs.begins, cs.ends, cs.completes));
    assert_eq!(x, stats.kinds.calls);
    assert_eq!(b, stats.kinds.entries);
}

#[test]
fn folded_stacks_of_a_known_tree() {
    // main { a { b(); b(); } c(); a { b(); } } — ns.
    use EventKind::*;
    let e = |ts, p, k: EventKind| TraceEvent {
        kind: k,
        ..TraceEvent::entry(ts, 3, p)
    };
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
        e(500, 3, Entry),
        e(510, 4, Entry),
        e(515, 4, Exit),
        e(600, 3, Exit),
        e(1000, MAIN, Exit),
    ];
    let mut syms = symbols(false);
    syms[3].name = "a".into();
    syms[4].name = "b".into();
    syms[5].name = "c".into();
    let dir = tempfile::tempdir().unwrap();
    write_trace(dir.path(), TraceMeta::new("tree", syms), &events);
    let r = TraceReader::open(dir.path()).unwrap();
    let mut out = Vec::new();
    let n = export_folded(&r, &mut out, FoldedOptions::default(), None).unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "main 650\nmain;a 245\nmain;a;b 55\nmain;c 50\n"
    );
    assert_eq!(n, 4);
    let mut out = Vec::new();
    export_folded(
        &r,
        &mut out,
        FoldedOptions {
            value: FoldedValue::Calls,
            per_thread: true,
        },
        None,
    )
    .unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "tid-3;main 1\ntid-3;main;a 2\ntid-3;main;a;b 3\ntid-3;main;c 1\n"
    );
}
