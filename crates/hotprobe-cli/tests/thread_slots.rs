//! Thread slots grow on demand (issue 22: nothing lost for lack of a
//! slot). `waves.c` keeps THREADS threads alive at once (64 KiB stacks,
//! each waiting at a barrier, then calling `work` CALLS times, then
//! exiting): 3,000 at once fill three chunks of 1,024 slots, past the old
//! fixed default (1,024 slots). Under `count` every call is counted; under `record` the trace
//! holds every call and `info` says 0 lost; the program's output and exit
//! status are its own. `--max-threads` is a cap: at 1,024 the same run
//! loses the events of the threads past it, counted.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

mod common;
use common::record::{info, record, trace_dir};
use common::{drops, gcc, hotprobe_within, printed, text, CountTable};

const LIMIT: Duration = Duration::from_secs(300);

fn waves() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("thread-slots");
    std::fs::create_dir_all(&d).unwrap();
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/programs/waves.c");
    gcc(&src, &d.join("waves"), &["-O1", "-pthread"])
}

/// The program's own stdout, run without hotprobe (exit 0 checked).
fn native(cmd: &[&str]) -> String {
    let o = Command::new(cmd[0]).args(&cmd[1..]).output().unwrap();
    assert!(o.status.success(), "{cmd:?} natively: {:?}", o.status);
    text(&o.stdout)
}

#[test]
fn three_thousand_threads_alive_at_once_are_counted_in_full() {
    let prog = waves();
    let p = prog.to_str().unwrap();
    let cmd = [p, "1", "3000", "100", "1"];
    let out = native(&cmd);
    assert_eq!(printed(&out, "threads "), 3000);
    let calls = printed(&out, "calls ");
    assert_eq!(calls, 300_000);
    let o = hotprobe_within(&["count", "work", "--", p, "1", "3000", "100", "1"], LIMIT);
    let (stdout, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "count failed: {err}");
    assert!(err.contains("exited with code 0"), "{err}");
    assert_eq!(common::program_output(&stdout), out, "{err}");
    let t = CountTable::parse(&stdout, &err);
    assert_eq!(t.hits("work"), calls);
    assert_eq!(t.row("work")[t.col("NMISSED")], "0");
}

#[test]
fn three_thousand_threads_alive_at_once_are_recorded_in_full() {
    let prog = waves();
    let cmd = [prog.to_str().unwrap(), "1", "3000", "100", "1"];
    let out = native(&cmd);
    let calls = printed(&out, "calls ");
    assert_eq!(calls, 300_000);
    let dir = trace_dir("slots-3000");
    let (stdout, err) = record(&dir, &["work"], &cmd, LIMIT);
    assert_eq!(stdout, out, "{err}");
    let i = info(&dir, LIMIT);
    assert_eq!((i.calls, i.lost, drops(&err)), (calls, 0, 0), "{err}");
    // The same run with the old default as the cap: the threads past it
    // lose their events, every one of them counted.
    let dir = trace_dir("slots-3000-cap");
    let (stdout, err) = record(&dir, &["--max-threads", "1024", "work"], &cmd, LIMIT);
    assert_eq!(stdout, out, "{err}");
    let i = info(&dir, LIMIT);
    assert_eq!(2 * i.calls + i.lost, 2 * calls, "{err}");
    assert_eq!(i.lost, drops(&err));
    assert!(i.lost > 0 && i.calls >= 1024 * 100, "{i:?}");
}

/// Waves of short threads past the old limit: 3 waves of 2,000 threads
/// alive at once (6,000 threads over the run), each thread's slot given
/// back at its exit and claimed again by the next wave.
#[test]
fn waves_of_two_thousand_threads_are_recorded_in_full() {
    let prog = waves();
    let cmd = [prog.to_str().unwrap(), "3", "2000", "20", "1"];
    let out = native(&cmd);
    assert_eq!(printed(&out, "threads "), 6000);
    let calls = printed(&out, "calls ");
    assert_eq!(calls, 120_000);
    let dir = trace_dir("slots-waves");
    let (stdout, err) = record(&dir, &["work"], &cmd, LIMIT);
    assert_eq!(stdout, out, "{err}");
    let i = info(&dir, LIMIT);
    assert_eq!((i.calls, i.lost, drops(&err)), (calls, 0, 0), "{err}");
}
