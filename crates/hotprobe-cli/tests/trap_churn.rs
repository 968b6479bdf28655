//! Issue 22: thread churn on the ptrace trap (tests/programs/trap_churn.c).
//! Long-lived threads and waves of short ones all hit one probe served by
//! ptrace stops; the tracer drains every ready wait status before it
//! handles any (`hotprobe-process/src/ready.rs`), so the old threads are
//! served while new ones keep coming (within 80 waves of new threads).
//! Every call is counted (the program
//! says how many it made, since the number of waves depends on how fast
//! the old threads get through), its results are those of the native
//! run, and it exits 0 (3: the old threads never finished within the
//! program's bound of waves).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, program_output, text, CountTable};

const LIMIT: Duration = Duration::from_secs(300);

fn program() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/trap_churn.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("trap-churn");
    std::fs::create_dir_all(&dir).unwrap();
    gcc(&src, &dir.join("trap_churn"), &["-O1", "-pthread"])
}

/// The value of line `key N` in the program's output.
fn value(out: &str, key: &str) -> u64 {
    out.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no `{key} N` line in {out:?}"))
}

/// The sum the program prints after `waves` waves (`trap_churn.c`'s
/// arithmetic): the same for any run with as many waves.
fn expected_sum(waves: u64) -> i64 {
    let mut sum = 0i64;
    for id in 0..4i64 {
        sum += (0..1500).map(|i| (id * 100_000 + i) * 3 + 1).sum::<i64>();
    }
    for w in 0..waves as i64 {
        for i in 0..8 {
            sum += (0..40).map(|j| (w * 1000 + i - j) * 3 + 1).sum::<i64>();
        }
    }
    sum
}

#[test]
fn every_call_of_old_and_churning_threads_is_counted_on_the_ptrace_trap() {
    let bin = program();
    let native = Command::new(&bin).output().unwrap();
    assert_eq!(native.status.code(), Some(0), "natively");
    let native_out = text(&native.stdout);
    let native_waves = value(&native_out, "waves");
    assert_eq!(
        value(&native_out, "sum") as i64,
        expected_sum(native_waves),
        "natively: {native_out}"
    );
    let b = bin.to_str().unwrap();
    for run in 0..2 {
        let o = hotprobe_within(&["count", "--mechanism", "trap", "probed", "--", b], LIMIT);
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        let ctx = format!("run {run}:\n{out}\n{err}");
        assert_eq!(o.status.code(), Some(0), "{ctx}");
        let prog = program_output(&out);
        let waves = value(prog, "waves");
        // Fairness, counted in work and not in time: the old threads'
        // 6,000 stops are served while waves of 320 come in (14–26 waves
        // here, on 2 loaded cores; 127–189 when each wait served the
        // newest thread's stop first).
        assert!(waves <= 80, "old threads starved: {waves} waves\n{ctx}");
        let calls = value(prog, "calls");
        assert_eq!(calls, 4 * 1500 + waves * 8 * 40, "{ctx}");
        assert_eq!(value(prog, "sum") as i64, expected_sum(waves), "{ctx}");
        let table = CountTable::parse(&out, &err);
        assert_eq!(table.execution("probed"), "trap", "{ctx}");
        assert_eq!(table.hits("probed"), calls, "{ctx}");
        let missed = table.col("NMISSED");
        assert_eq!(table.row("probed")[missed], "0", "{ctx}");
    }
}
