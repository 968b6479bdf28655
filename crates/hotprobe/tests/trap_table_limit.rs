//! The agent's trap table has a fixed size (`TRAP_SLOTS`, issue 14): a
//! program with more trap probes than it holds (each `int3` on an
//! instruction of 2 bytes or more takes a second slot for its guard) still
//! has every probe working on the ptrace trap, counted exactly, and the
//! ones past the table are counted and say so in their placement.

mod support;

use hotprobe::{Probe, RunEnd};
use std::path::PathBuf;

/// More functions than the table has slots (each takes two: its `int3`
/// and its guard).
const FUNCTIONS: usize = hotprobe_fastpath::TRAP_SLOTS / 2 + 1000;

fn build() -> PathBuf {
    // Function i is called (i % 2) + 1 times; each entry is
    // `add %rdi, sink(%rip)` (7 bytes): guarded.
    support::many_functions("trap_table_limit", FUNCTIONS, |i| i % 2 + 1)
}

#[test]
fn trap_probes_past_the_trap_table_still_count_and_say_so() {
    let bin = build();
    let mut c = support::spawn(&bin, &[]);
    let (s, t) = (&mut c.session, c.target);
    // Handler probes run in hotprobe: on ptrace traps, with the agent
    // (and its table) in.
    let ids: Vec<_> = (0..FUNCTIONS)
        .map(|i| s.probe(t, &format!("f{i}"), Probe::new()).unwrap())
        .collect();
    s.start().unwrap();
    let past = s.traps_past_table(t);
    assert!(
        past > 0,
        "every int3 fit in the table: the test proves nothing"
    );
    let notices = s.take_notices();
    assert!(
        notices
            .iter()
            .any(|n| n.contains("the agent's trap table is full")),
        "no notice: {notices:?}"
    );
    assert_eq!(s.run().unwrap(), RunEnd::AllExited);
    let expect_sum: i64 = (0..FUNCTIONS as i64).map(|i| ((i % 2) + 1) * (2 * i)).sum();
    // Every probe counted exactly, those past the table included.
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(s.stats(*id).unwrap().hits, (i % 2) as u64 + 1, "f{i}");
    }
    assert_eq!(c.output().trim(), format!("sum {expect_sum}"));
}
