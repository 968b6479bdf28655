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
use common::{gcc, hotprobe_within, kill_group, line_reader, text};

fn tmp() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("trace-loss");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `spin [N]`: calls `work(i)` for i = 0, 1, ... (N times, or until
/// killed), each call a few microseconds of work (so that a drain starved
/// by a loaded machine keeps up); prints `done K` after every 20,000 calls
/// and `end N` at the end; exits with status 3.
///
/// With each line it raises SIGURG (ignored): a ptrace stop, which wakes
/// `record`'s event loop. That loop waits for the target in `waitpid`
/// under a one-shot timer (hotprobe-process, `wake::waitpid_for`); when
/// the timer fires before `waitpid` starts (a loaded machine), it blocks
/// until the target's next ptrace stop and drains nothing meanwhile, a
/// bug of its own (seen here: a run whose stream stayed at its header
/// while the program printed 334 lines), not what these tests are about.
const SPIN: &str = r#"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) long work(long i) {
    volatile long x = i;
    for (int k = 0; k < 1500; k++) x += k;
    return x;
}
int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : -1;
    for (long i = 0; n < 0 || i < n; i++) {
        work(i);
        if ((i + 1) % 20000 == 0) { printf("done %ld\n", i + 1); fflush(stdout); raise(SIGURG); }
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
    gcc(
        &s,
        &tmp().join(format!("bin-{name}")),
        &["-O1", "-fno-inline"],
    )
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

/// Kills a process group when dropped (also when the test panics).
struct Group(i32);

impl Drop for Group {
    fn drop(&mut self) {
        kill_group(self.0);
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
        let errf = tmp().join(format!("killed-{run_no}.stderr"));
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(common::HOTPROBE)
            .args(["record", "--args", "1", "-o", dir.to_str().unwrap(), "--"])
            .arg(&prog)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&errf).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id() as i32;
        // Whatever happens, nothing it started outlives the test.
        let _group = Group(pgid);
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
            assert!(
                Instant::now() < deadline,
                "run {run_no}: no progress in 30 s: {} lines, stream {} bytes; record said: {}",
                logged.len(),
                stream_size(&dir),
                std::fs::read_to_string(&errf).unwrap_or_default()
            );
            if let Ok(l) = lines.recv_timeout(Duration::from_millis(5)) {
                take(l, &mut logged);
            }
        }
        let delay = Duration::from_millis(100 + rng.next() % 1500);
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
        // A program whose probes are all on the fast path runs untraced,
        // so it outlives its tracer (the agent puts its code back when the
        // tracer goes; a traced one died with it, PTRACE_O_EXITKILL): it
        // is ended now, in the group the test started, and its last lines
        // still come.
        // SAFETY: a plain syscall on the process group this test started.
        unsafe { libc::kill(-pgid, libc::SIGKILL) };
        for l in lines.iter() {
            take(l, &mut logged);
        }
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
        assert_eq!(
            (main["calls"].as_u64(), main["no_exit"].as_u64()),
            (Some(1), Some(1))
        );
        // Never more than the program did; all it logged a flush
        // interval (0.5 s) plus 1 s of slack before the kill is there.
        assert!(
            calls <= last + 20_000,
            "{calls} calls, program logged {last}"
        );
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

/// A recorded `spin 3000` (3,000 calls of `work`) in `dir`.
fn spin_trace(dir: &Path) {
    let (rc, out, err) = record(dir, &[], &program("spin", SPIN), &["3000"]);
    assert_eq!(rc, 3, "{err}");
    assert!(out.ends_with("end 3000\n"), "{out}");
    let (rc, info, err) = run(&["info", "--json", dir.to_str().unwrap()]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(json(&info)["calls"], 3001, "{info}");
}

/// Rewrites `info.json`'s time base with `f`.
fn edit_time_base(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("info.json");
    let mut info = json(&std::fs::read_to_string(&p).unwrap());
    f(&mut info["time_base"]);
    std::fs::write(&p, serde_json::to_string(&info).unwrap()).unwrap();
}

#[test]
fn a_corrupt_time_base_is_an_error() {
    let good = tmp().join("timebase-good");
    spin_trace(&good);
    let d = good.to_str().unwrap();
    let (rc, rep, err) = run(&["report", "--json", d]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(row(&json(&rep), "work")["calls"], 3000);
    // Both calibration pairs at the same ns: every time the same (today:
    // a report of zeros); the first pair moved past the data: times before
    // ns 0 (today: clamped, zeros again).
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit); 2] = [
        ("same-ns", |tb| tb["ns1"] = tb["ns0"].clone()),
        ("tsc0-late", |tb| {
            let (t0, t1) = (tb["tsc0"].as_u64().unwrap(), tb["tsc1"].as_u64().unwrap());
            tb["tsc0"] = (t0 * 1000).into();
            tb["tsc1"] = (t0 * 1000 + (t1 - t0)).into();
        }),
    ];
    for (name, f) in cases {
        let dir = tmp().join(format!("timebase-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for e in std::fs::read_dir(&good).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
        edit_time_base(&dir, f);
        let d = dir.to_str().unwrap();
        for cmd in [&["report", d][..], &["replay", d], &["info", d]] {
            let (rc, out, err) = run(cmd);
            assert_eq!(rc, 1, "{name}: hotprobe {cmd:?}: {out}{err}");
            let line = err.lines().find(|l| l.starts_with("hotprobe: error: "));
            let line = line.unwrap_or_else(|| panic!("{name}: no error line: {err}"));
            assert!(line.contains("corrupt time base"), "{name}: {line}");
            assert!(!out.contains("work"), "{name}: {cmd:?} printed {out}");
        }
    }
}

#[test]
fn fifos_and_devices_in_a_trace_directory_are_refused() {
    let good = tmp().join("fifo-good");
    spin_trace(&good);
    let tid = std::fs::read_dir(&good)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("tid-"))
        .unwrap();
    for (file, kind) in [
        ("info.json", "fifo"),
        ("symbols.tsv", "fifo"),
        (tid.as_str(), "fifo"),
        ("types.tsv", "fifo"),
        ("symbols.tsv", "device"),
    ] {
        let dir = tmp().join(format!("fifo-{kind}-{file}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for e in std::fs::read_dir(&good).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
        let p = dir.join(file);
        std::fs::remove_file(&p).unwrap();
        let what = if kind == "fifo" {
            let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
            "a FIFO"
        } else {
            std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
            "a character device"
        };
        let d = dir.to_str().unwrap();
        let refused = format!(
            "{}: not a regular file but {what}: refused (reading it could block or have effects)",
            p.display()
        );
        for cmd in [
            &["replay", d][..],
            &["report", d],
            &["info", d],
            &["export", "--format", "chrome", d],
        ] {
            let t = Instant::now();
            let (rc, out, err) = run(cmd);
            assert_eq!(rc, 1, "{file} {kind}: hotprobe {cmd:?}: {out}{err}");
            assert!(
                err.lines()
                    .any(|l| l.starts_with("hotprobe: error: ") && l.ends_with(&refused)),
                "{file} {kind}: hotprobe {cmd:?}: {err}"
            );
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{cmd:?} took {:?}",
                t.elapsed()
            );
        }
    }
}

#[test]
fn invalid_or_empty_filters_are_errors_and_filters_matching_nothing_say_so() {
    let dir = tmp().join("filters");
    spin_trace(&dir);
    let d = dir.to_str().unwrap();
    let bad = "filter pattern: bad name pattern \"[\": unclosed character class; missing ']'";
    for (cmd, line) in [
        (
            &["replay", "-F", "[", d][..],
            format!("{bad} (see hotprobe replay --help)"),
        ),
        (
            &["replay", "-F", "", d],
            "empty filter pattern (it would match nothing) (see hotprobe replay --help)".into(),
        ),
        (
            &["replay", "-N", "", d],
            "empty notrace pattern (it would match nothing) (see hotprobe replay --help)".into(),
        ),
        (
            &["report", "-F", "[", d],
            format!("{bad} (see hotprobe report --help)"),
        ),
        (
            &["report", "--marker", "", d],
            "--marker \"\": give a function name (see hotprobe report --help)".into(),
        ),
    ] {
        let (rc, out, err) = run(cmd);
        assert_eq!(rc, 2, "hotprobe {cmd:?}: {out}{err}");
        assert_eq!(out, "", "{cmd:?}");
        assert_eq!(err, format!("hotprobe: error: {line}\n"), "{cmd:?}");
    }
    for cmd in [
        &["replay", "-F", "nosuch*", d][..],
        &["report", "-F", "nosuch*", d],
    ] {
        let (rc, out, err) = run(cmd);
        assert_eq!(rc, 0, "hotprobe {cmd:?}: {err}");
        assert_eq!(out, "", "{cmd:?}");
        assert_eq!(err, "hotprobe: no call matches -F nosuch*\n", "{cmd:?}");
    }
    let (rc, out, err) = run(&["report", "--marker", "nosuch", d]);
    assert_eq!(rc, 0, "{err}");
    assert!(
        err.lines()
            .any(|l| l == "hotprobe: no call matches --marker nosuch"),
        "{err}"
    );
    assert!(out.contains("work"), "{out}");
    // A valid filter that matches keeps its calls.
    let (rc, out, err) = run(&["replay", "-F", "wor?", d]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(out.matches("work();").count(), 3000, "{out}");
}

#[test]
fn calls_whose_exits_were_lost_get_no_invented_duration() {
    let dir = tmp().join("recursion");
    let (rc, out, err) = record(&dir, &[], &program("rec", REC), &["100000"]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(out, "rec calls 100000 depth 100000\n");
    // The exits record could not hook, as record counts them.
    let refused: u64 = err
        .split("refused on re-entry ")
        .nth(1)
        .and_then(|s| s.split(',').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no refused count: {err}"));
    assert!(refused > 0, "this test wants lost exits: {err}");
    let d = dir.to_str().unwrap();
    let (rc, rep, err) = run(&["report", "--json", d]);
    assert_eq!(rc, 0, "{err}");
    let r = row(&json(&rep), "rec");
    let (calls, no_exit) = (r["calls"].as_u64().unwrap(), r["no_exit"].as_u64().unwrap());
    // Every call the program made, those without their exit included.
    assert_eq!(calls, 100_000, "{r}");
    assert_eq!(no_exit, refused, "{r}");
    let (min, avg, max) = (
        r["min_ns"].as_u64().unwrap(),
        r["avg_ns"].as_u64().unwrap(),
        r["max_ns"].as_u64().unwrap(),
    );
    assert!(min <= avg && avg <= max, "{r}");
    // The histogram counts the same calls, and no others.
    let (rc, hist, err) = run(&["report", "--hist", "rec", "--json", d]);
    assert_eq!(rc, 0, "{err}");
    let h = &json(&hist)["histograms"][0];
    assert_eq!(h["count"].as_u64(), Some(calls - no_exit), "{h}");
    assert_eq!(h["no_exit"].as_u64(), Some(no_exit), "{h}");
    let in_buckets: u64 = h["buckets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["count"].as_u64().unwrap())
        .sum();
    assert_eq!(in_buckets, calls - no_exit);
    assert_eq!(h["avg_ns"].as_u64(), Some(avg), "{h}");
    // The text says so.
    let (rc, text_rep, _) = run(&["report", d]);
    assert_eq!(rc, 0);
    assert!(
        text_rep
            .lines()
            .any(|l| l == format!("# {no_exit} of the calls have no exit (lost): not in the times")),
        "{text_rep}"
    );
    let line = text_rep.lines().find(|l| l.ends_with("  rec")).unwrap();
    let cols: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(
        cols[0], "-",
        "no outermost call with its exit: no total: {line}"
    );
    assert_eq!(
        &cols[cols.len() - 3..],
        &[no_exit.to_string().as_str(), &calls.to_string(), "rec"]
    );
    let (rc, info, _) = run(&["info", "--json", d]);
    assert_eq!(rc, 0);
    let info = json(&info);
    assert_eq!(info["calls"].as_u64(), Some(100_001));
    assert_eq!(info["no_exit"].as_u64(), Some(no_exit));
}

/// A tmpfs mounted for a test, unmounted (and its directory removed) on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: PathBuf, size: &str) -> Tmpfs {
        // SAFETY: a plain syscall, no arguments.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(euid, 0, "the full-disk test mounts a tmpfs: run as root");
        let _ = Command::new("umount")
            .arg(&dir)
            .stderr(Stdio::null())
            .status();
        std::fs::create_dir_all(&dir).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir)
            .status()
            .unwrap();
        assert!(st.success(), "mount -t tmpfs on {}", dir.display());
        Tmpfs(dir)
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let st = Command::new("umount").arg(&self.0).status();
        if !st.is_ok_and(|s| s.success()) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
        let _ = std::fs::remove_dir(&self.0);
    }
}

#[test]
fn on_a_full_disk_record_stops_writing_and_runs_the_program_to_its_end() {
    let prog = program("spin", SPIN);
    let fs = Tmpfs::mount(tmp().join(format!("full-{}", std::process::id())), "256k");
    let dir = fs.0.join("trace");
    let d = dir.to_str().unwrap();
    let (rc, out, err) = record(&dir, &["--args", "1"], &prog, &["300000"]);
    // The program's own output and status.
    assert_eq!(rc, 3, "{err}");
    assert!(out.ends_with("done 300000\nend 300000\n"), "{out}");
    let info: serde_json::Value = json(&std::fs::read_to_string(dir.join("info.json")).unwrap());
    let stats = &info["stats"];
    let dropped = stats["dropped"].as_u64().unwrap();
    let why = stats["write_error"]
        .as_str()
        .unwrap_or_else(|| panic!("{info}"));
    assert!(
        why.ends_with("No space left on device (os error 28)"),
        "{why}"
    );
    assert!(dropped > 0, "{info}");
    assert_eq!(info["complete"], true);
    let warning = format!(
        "hotprobe: warning: {why}: stopped writing the trace there and let the program run to \
         its end; {dropped} events were not written (the trace ends with a lost record \
         counting them)"
    );
    assert!(err.lines().any(|l| l == warning), "{err}");
    assert!(err.contains("exited with code 3"), "{err}");
    // Every event is written or counted as dropped (when no ring overflowed).
    if stats["lost"] == 0 {
        assert_eq!(
            stats["events_out"].as_u64().unwrap() + dropped,
            stats["events_in"].as_u64().unwrap(),
            "{stats}"
        );
        assert_eq!(stats["events_in"].as_u64(), Some(600_002));
    }
    // The trace reads: calls 0..C of work, then the lost record.
    let (rc, rep, err) = run(&["replay", d]);
    assert_eq!(rc, 0, "{err}");
    let args = replayed_args(&rep);
    assert!(!args.is_empty());
    if stats["lost"] == 0 {
        assert!(args.iter().enumerate().all(|(i, a)| *a == i as u64));
    }
    let last = rep.lines().last().unwrap();
    if stats["lost"] == 0 {
        assert!(
            last.ends_with(&format!("| /* lost {dropped} events */")),
            "{last}"
        );
    } else {
        assert!(last.contains("| /* lost "), "{last}");
    }
    let (rc, txt, err) = run(&["info", d]);
    assert_eq!(rc, 0, "{err}");
    assert!(
        txt.lines().any(|l| l
            == format!(
                "# write error:   {why}: writing stopped there, {dropped} events not written \
                 (counted as lost)"
            )),
        "{txt}"
    );
    let (rc, rep, err) = run(&["report", "--json", d]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(
        row(&json(&rep), "work")["calls"].as_u64(),
        Some(args.len() as u64)
    );
    eprintln!(
        "full disk: {} calls written, {dropped} events dropped; the program ran to its end",
        args.len()
    );
}

/// `pause K`: K calls of `work`, then `paused K` and a pause (until
/// killed), raising SIGURG (ignored) every 10 ms: ptrace stops that keep
/// `record`'s event loop from hanging in `waitpid` (see [`SPIN`]).
const PAUSE: &str = r#"
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((noinline)) long work(long i) { volatile long x = i; return x + 1; }
int main(int argc, char **argv) {
    long k = atol(argv[1]);
    for (long i = 0; i < k; i++) work(i);
    printf("paused %ld\n", k);
    fflush(stdout);
    for (;;) { raise(SIGURG); usleep(10000); }
}
"#;

#[test]
fn record_killed_while_the_program_pauses_keeps_every_call() {
    let prog = program("pause", PAUSE);
    let dir = tmp().join("killed-paused");
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().unwrap();
    use std::os::unix::process::CommandExt;
    let mut child = Command::new(common::HOTPROBE)
        .args(["record", "-o", d, "--"])
        .arg(&prog)
        .arg("5000")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let _group = Group(child.id() as i32);
    let lines = line_reader(child.stdout.take().unwrap());
    let line = lines.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(line, "paused 5000");
    // The observable event: the trace on disk holds the 5,000 calls while
    // the program pauses (the writer writes out what it holds when the
    // rings stay empty).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (rc, out, err) = run(&["report", "--json", d]);
        let calls = |o: &str| {
            let rows = json(o)["rows"].clone();
            let work = rows.as_array()?.iter().find(|r| r["function"] == "work")?;
            work["calls"].as_u64()
        };
        if rc == 0 && calls(&out) == Some(5000) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the trace never held the 5000 calls while the program paused: {out}{err}"
        );
    }
    // SAFETY: a plain syscall on the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let (rc, out, err) = run(&["replay", d]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(out.matches("work();").count(), 5000);
    let (rc, out, _) = run(&["info", "--json", d]);
    assert_eq!(rc, 0);
    let info = json(&out);
    assert_eq!(
        (info["calls"].as_u64(), info["no_exit"].as_u64()),
        (Some(5001), Some(1))
    );
}
