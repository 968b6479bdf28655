//! Aggregations in the target (issue 24): a `Record` probe the
//! aggregation chooser gives a rule is placed on the fast path counting,
//! its hits added into the agent's tables, and writes no event at all.

mod support;

use hotprobe::agg::{AggKey, AggSpec};
use hotprobe::{Action, EventSink, Mechanism, RecordedEvent, RunEnd, SinkError};
use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use support::*;

/// Keeps every recorded event.
#[derive(Default)]
struct Collect(Vec<RecordedEvent>);

impl EventSink for Collect {
    fn event(&mut self, ev: &RecordedEvent) -> Result<(), SinkError> {
        self.0.push(*ev);
        Ok(())
    }
    fn lost(&mut self, _tid: u32, _ts: u64, count: u64) -> Result<(), SinkError> {
        panic!("{count} events lost");
    }
}

#[test]
fn an_aggregating_probe_writes_no_event_and_fills_its_table() {
    // mixed.c calls recorded(i, i + 1) for i in 0..5.
    let bin = program("mixed", &["-O2"]);
    let mut t = spawn(&bin, &["200"]);
    let s = &mut t.session;
    let by_arg1 = AggSpec::by("arg1").unwrap().rule(0);
    s.set_aggregate(Some(std::rc::Rc::new(move |_| Some(by_arg1))));
    let recorded = s.add(t.target, "recorded", Action::Record).unwrap();
    s.set_aggregate(None);
    let r = &recorded.placements[0];
    assert_eq!(r.mechanism, Mechanism::Jump, "{r:?}");
    s.start().unwrap();
    let mut sink = Collect::default();
    let end = s
        .run_with(&AtomicBool::new(false), Some(&mut sink))
        .unwrap();
    assert_eq!(end, RunEnd::AllExited);
    assert_eq!(s.stats(r.id).unwrap().hits, 5);
    // Not one event: the hits were aggregated in the target.
    assert!(sink.0.iter().all(|e| e.probe_id != r.id.0), "{:?}", sink.0);
    let table = s.aggregation(r.id).expect("aggregated in the target");
    let expected: HashMap<AggKey, u64> = (1..=5).map(|v| (AggKey::Value(v), 1)).collect();
    assert_eq!(table.keys, expected);
    assert_eq!(table.uncounted, 0);
}
