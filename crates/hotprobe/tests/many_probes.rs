//! Kprobes' scalability work made tens of thousands of simultaneous probes
//! practical: here thousands of functions of one generated program are
//! probed at once, each hit counted exactly, through several scratch chunks.

mod support;

use hotprobe::{Probe, RunEnd};
use std::path::PathBuf;

const FUNCTIONS: usize = 3000;

fn build() -> PathBuf {
    // Function i is called (i % 3) + 1 times.
    support::many_functions("many", FUNCTIONS, |i| i % 3 + 1)
}

#[test]
fn thousands_of_probes_count_exactly() {
    let bin = build();
    let mut c = support::spawn(&bin, &[]);
    let (s, t) = (&mut c.session, c.target);
    let ids: Vec<_> = (0..FUNCTIONS)
        .map(|i| s.probe(t, &format!("f{i}"), Probe::new()).unwrap())
        .collect();
    s.start().unwrap();
    assert_eq!(s.run().unwrap(), RunEnd::AllExited);
    let expect_sum: i64 = (0..FUNCTIONS as i64).map(|i| ((i % 3) + 1) * (2 * i)).sum();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(s.stats(*id).unwrap().hits, (i % 3) as u64 + 1, "f{i}");
    }
    assert_eq!(c.output().trim(), format!("sum {expect_sum}"));
}
