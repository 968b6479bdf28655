//! Issue 22, traces: data is never lost silently. On C programs compiled
//! here: a `record` killed with SIGKILL at seeded moments leaves a trace
//! `replay`, `report` and `info` read up to its last whole block (saying
//! so), holding every call the program logged more than a flush interval
//! before the kill; a corrupt time base, a FIFO or a device in a trace
//! directory, an empty or invalid filter are errors; calls whose exits
//! were lost get no invented duration; on a full disk (a small tmpfs)
//! `record` stops writing, runs the program to its end and exits with its
//! status, the loss said on stderr, in `info` and in the trace.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{gcc, hotprobe, hotprobe_within, kill_group, line_reader, text};

fn tmp() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("trace-loss");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `spin [N]`: calls `work(i)` for i = 0, 1, ... (N times, or until
/// killed), each call about a microsecond of work; prints `done K` after
/// every 20,000 calls and `end N` at the end; exits with status 3.
const SPIN: &str = r#"
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) long work(long i) {
    volatile long x = i;
    for (int k = 0; k < 300; k++) x += k;
    return x;
}
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : -1;
    for (long i = 0; n < 0 || i < n; i++) {
        work(i);
        if ((i + 1) % 20000 == 0) { printf("done %ld\n", i + 1); fflush(stdout); }
    }
    printf("end %ld\n", n);
    return 3;
}
"#;

/// `rec D`: recursion D deep; prints how many calls it made.
const REC: &str = r#"
#include <stdio.h>
#include <stdlib.h>
static long calls;
__attribute__((noinline)) long rec(long n) { calls++; if (n == 0) return 0; return 1 + rec(n - 1); }
int main(int argc, char **argv) {
    long d = atol(argv[1]);
    long r = rec(d - 1);
    printf("rec calls %ld depth %ld\n", calls, r + 1);
    return 0;
}
"#;

fn program(name: &str, src: &str) -> PathBuf {
    let s = hotprobe_testkit::write_source(&tmp(), &format!("{name}.c"), src);
    gcc(&s, &tmp().join(format!("bin-{name}")), &["-O1", "-fno-inline"])
}

/// `hotprobe ARGS` with a time limit; (status code, stdout, stderr).
fn run(args: &[&str]) -> (i32, String, String) {
    let o = hotprobe_within(args, Duration::from_secs(60));
    (
        o.status.code().unwrap_or(-1),
        text(&o.stdout),
        text(&o.stderr),
    )
}

/// `hotprobe record -o DIR ARGS -- PROG PARGS`, to completion.
fn record(dir: &Path, args: &[&str], prog: &Path, pargs: &[&str]) -> (i32, String, String) {
    let _ = std::fs::remove_dir_all(dir);
    let mut a = vec!["record", "-o", dir.to_str().unwrap()];
    a.extend_from_slice(args);
    a.push("--");
    a.push(prog.to_str().unwrap());
    a.extend_from_slice(pargs);
    run(&a)
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s).unwrap_or_else(|e| panic!("not JSON ({e}): {s}"))
}

/// The report row of `function` (`report --json`).
fn row(report: &serde_json::Value, function: &str) -> serde_json::Value {
    report["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["function"] == function)
        .unwrap_or_else(|| panic!("no row {function} in {report}"))
        .clone()
}

/// A small seeded PRNG (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The stream file of a trace directory being written, if any.
fn stream_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir).map_or(0, |rd| {
        rd.flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("tid-"))
            .map(|e| e.metadata().map_or(0, |m| m.len()))
            .sum()
    })
}

/// The `work(i)` arguments `replay` shows, in order.
fn replayed_args(out: &str) -> Vec<u64> {
    out.lines()
        .filter_map(|l| {
            let a = l.split("work(").nth(1)?;
            let a = a.split(')').next()?;
            Some(a.parse::<u64>().unwrap_or_else(|_| panic!("bad line {l}")))
        })
        .collect()
}

#[test]
fn record_killed_at_seeded_moments_leaves_a_readable_trace() {
    let seed: u64 = std::env::var("HOTPROBE_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("kill moments from seed {seed} (HOTPROBE_KILL_SEED={seed} repeats them)");
    let mut rng = Rng(seed);
    let prog = program("spin", SPIN);
    for run_no in 0..10 {
        let dir = tmp().join(format!("killed-{run_no}"));
        let _ = std::fs::remove_dir_all(&dir);
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(common::HOTPROBE)
            .args(["record", "--args", "1", "-o", dir.to_str().unwrap(), "--"])
            .arg(&prog)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id() as i32;
        let lines = line_reader(child.stdout.take().unwrap());
        // (calls done, when the line came)
        let mut logged: Vec<(u64, Instant)> = Vec::new();
        let take = |l: String, logged: &mut Vec<(u64, Instant)>| {
            let k = l.strip_prefix("done ").and_then(|k| k.parse().ok());
            logged.push((k.unwrap_or_else(|| panic!("line {l:?}")), Instant::now()));
        };
        // The observable events: the program runs (its first line) and
        // the trace has its first block on disk.
        let deadline = Instant::now() + Duration::from_secs(30);
        while logged.is_empty() || stream_size(&dir) <= 20 {
            assert!(Instant::now() < deadline, "run {run_no}: no progress");
            if let Ok(l) = lines.recv_timeout(Duration::from_millis(5)) {
                take(l, &mut logged);
            }
        }
        let delay = Duration::from_millis(200 + rng.next() % 1800);
        let until = Instant::now() + delay;
        while let Some(left) = until.checked_duration_since(Instant::now()) {
            if let Ok(l) = lines.recv_timeout(left) {
                take(l, &mut logged);
            }
        }
        let killed_at = Instant::now();
        // SAFETY: a plain syscall on the child this test started.
        unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
        child.wait().unwrap();
        // The target dies with its tracer (PTRACE_O_EXITKILL); its last
        // lines still come.
        for l in lines.iter() {
            take(l, &mut logged);
        }
        kill_group(pgid);
        let last = logged.last().unwrap().0;
        let d = dir.to_str().unwrap();
        let cut = format!(
            "hotprobe: warning: {d} was not finished by its recorder (killed?): cut short, \
             read up to the last whole block of each stream"
        );
        let (rc, rep, err) = run(&["report", "--json", d]);
        assert_eq!(rc, 0, "run {run_no} (seed {seed}): report: {err}");
        assert!(err.lines().any(|l| l == cut), "{err}");
        let read_line = err
            .lines()
            .find(|l| l.contains(": read ") && l.contains(" records, "))
            .unwrap_or_else(|| panic!("no 'read N records' line: {err}"));
        let rep = json(&rep);
        let work = row(&rep, "work");
        let calls = work["calls"].as_u64().unwrap();
        assert_eq!(work["no_exit"], 0, "{work}");
        // main never returned: counted, no duration invented.
        let main = row(&rep, "main");
        assert_eq!((main["calls"].as_u64(), main["no_exit"].as_u64()), (Some(0), Some(1)));
        // Never more than the program did; all it logged a flush
        // interval (0.5 s) plus 1 s of slack before the kill is there.
        assert!(calls <= last + 20_000, "{calls} calls, program logged {last}");
        let old_enough = logged
            .iter()
            .filter(|(_, t)| killed_at.duration_since(*t) >= Duration::from_millis(1500))
            .map(|(k, _)| *k)
            .max()
            .unwrap_or(1);
        assert!(
            calls >= old_enough,
            "run {run_no} (seed {seed}, kill {delay:?} after the first block): {calls} calls \
             in the trace, the program had logged {old_enough} 1.5 s before the kill"
        );
        let (rc, out, err) = run(&["replay", d]);
        assert_eq!(rc, 0, "replay: {err}");
        assert!(err.lines().any(|l| l == cut), "{err}");
        let args = replayed_args(&out);
        let lost = out.contains("/* lost ");
        if !lost {
            // Every call, in order, none twice, none missing.
            assert!(
                args.iter().enumerate().all(|(i, a)| *a == i as u64),
                "run {run_no}: replay's work() arguments are not 0..{}",
                args.len()
            );
        }
        assert_eq!(args.len() as u64, calls);
        let (rc, info, err) = run(&["info", "--json", d]);
        assert_eq!(rc, 0, "info: {err}");
        assert!(err.contains(read_line), "{err}\nreport said {read_line}");
        let info = json(&info);
        assert_eq!(info["complete"], false);
        assert_eq!(info["calls"].as_u64(), Some(calls + 1));
        assert_eq!(info["no_exit"].as_u64(), Some(1));
        eprintln!(
            "run {run_no}: killed {delay:?} after the first block; program logged {last} calls, \
             the trace holds {calls} ({read_line}){}",
            if lost { "; with lost events" } else { "" }
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
