//! Kprobes' scalability work made tens of thousands of simultaneous probes
//! practical: here thousands of functions of one generated program are
//! probed at once, each hit counted exactly, through several scratch chunks.

mod support;

use hotprobe::{Probe, RunEnd, Session, SpawnOptions};
use std::path::PathBuf;

const FUNCTIONS: usize = 3000;

fn build() -> PathBuf {
    // Function i is called (i % 3) + 1 times.
    support::many_functions("many", FUNCTIONS, |i| i % 3 + 1)
}

#[test]
fn thousands_of_probes_count_exactly() {
    let bin = build();
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("many.out");
    let f = std::fs::File::create(&out).unwrap();
    let mut s = Session::new();
    let t = s
        .spawn_with(
            &bin,
            &[],
            &SpawnOptions {
                stdout: Some(f),
                ..Default::default()
            },
        )
        .unwrap();
    let ids: Vec<_> = (0..FUNCTIONS)
        .map(|i| s.probe(t, &format!("f{i}"), Probe::new()).unwrap())
        .collect();
    s.start().unwrap();
    assert_eq!(s.run().unwrap(), RunEnd::AllExited);
    let expect_sum: i64 = (0..FUNCTIONS as i64).map(|i| ((i % 3) + 1) * (2 * i)).sum();
    assert_eq!(
        std::fs::read_to_string(&out).unwrap().trim(),
        format!("sum {expect_sum}")
    );
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(s.stats(*id).unwrap().hits, (i % 3) as u64 + 1, "f{i}");
    }
}
