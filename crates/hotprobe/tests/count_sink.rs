//! Conditional counts and histograms through the library alone
//! ([`CountSink::place`] and [`hotprobe::Session::run_with`]), no CLI: a
//! generated program calls `fI(I)` `I + 1` times; `arg0 >= 3` counts the
//! calls of f3, f4 and f5, and times each of them.

mod support;

use hotprobe::{CountError, CountSink, RunEnd};
use std::sync::atomic::AtomicBool;
use support::*;

#[test]
fn a_pattern_counted_where_its_condition_holds_with_histograms() {
    let bin = many_functions("count-sink", 6, |i| i + 1);
    let mut t = spawn(&bin, &[]);
    let mut sink = CountSink::new(true);
    let mut placements = Vec::new();
    for i in 0..6 {
        let added = sink
            .place(
                &mut t.session,
                t.target,
                &format!("f{i}"),
                Some("arg0 >= 3"),
            )
            .unwrap();
        assert_eq!(added.placements.len(), 1, "{added:?}");
        placements.extend(added.placements);
    }
    // Refused before anything is placed.
    assert!(matches!(
        sink.place(&mut t.session, t.target, "f1", Some("arg0 >=")),
        Err(CountError::Cond(_))
    ));
    assert!(matches!(
        sink.place(&mut t.session, t.target, "f1%return", None),
        Err(CountError::Return { .. })
    ));
    t.session.start().unwrap();
    let end = t
        .session
        .run_with(&AtomicBool::new(false), Some(&mut sink))
        .unwrap();
    assert_eq!(end, RunEnd::AllExited);
    let mut counts: Vec<(String, u64, u64)> = placements
        .iter()
        .map(|p| {
            (
                p.function.clone().unwrap_or_else(|| p.label.clone()),
                sink.hits(p.id).unwrap(),
                sink.histogram(p.id).unwrap().count(),
            )
        })
        .collect();
    counts.sort();
    let want: Vec<(String, u64, u64)> = (0..6u64)
        .map(|i| {
            let n = if i >= 3 { i + 1 } else { 0 };
            (format!("f{i}"), n, n)
        })
        .collect();
    assert_eq!(counts, want);
    assert_eq!(sink.lost_events(), 0);
    // 0*1 + 1*2 + 2*3 + 3*4 + 4*5 + 5*6 = 70, each call returning 2i.
    assert_eq!(t.output(), "sum 140\n");
}
