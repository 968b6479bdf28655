//! Issue 22, traces: data is never lost silently. On C programs compiled
//! here: a `record` killed with SIGKILL at seeded moments leaves a trace
//! `replay`, `report` and `info` read up to its last whole block (saying
//! so), holding every call the program logged more than a flush interval
//! before the kill (a corrupt time base, a FIFO or a device in a trace
//! directory, an empty or invalid filter are errors: bad_input.rs); calls
//! whose exits were lost get no invented duration; on a full disk (a tmpfs the test
//! fills at seeded moments, 10 runs) `record` stops writing, runs the
//! program to its end and exits with its status, the loss said on stderr,
//! in `info` and in the trace. The seeds are printed: `HOTPROBE_KILL_SEED`
//! and `HOTPROBE_DISK_SEED` repeat them.

use hotprobe_testkit::GroupKilled;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{line_reader, text};
use hotprobe_testkit::SeededMoments;

mod record_support;
use record_support::{json, program, record, row, run, tmp, SPIN};

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
    let mut rng = SeededMoments::from_env("HOTPROBE_KILL_SEED", "kill moments");
    let seed = rng.seed();
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
        let _group = GroupKilled(pgid);
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
        let delay = Duration::from_millis(rng.in_range(100..1600));
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

/// Fills the file system holding `file` from `file`: writes until a write
/// fails with ENOSPC, in smaller and smaller pieces, so that not a page is
/// left; then gives back `slack` bytes (rounded to whole pages by the file
/// system). The bytes written.
fn fill_disk(file: &Path, slack: u64) -> u64 {
    use std::io::Write;
    let mut f = std::fs::File::create(file).unwrap();
    let mut written = 0u64;
    for piece in [1 << 20, 64 << 10, 4 << 10, 512, 1] {
        let buf = vec![0x5au8; piece];
        loop {
            match f.write(&buf) {
                Ok(n) => written += n as u64,
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => break,
                Err(e) => panic!("filling {}: {e}", file.display()),
            }
        }
    }
    let kept = written.saturating_sub(slack);
    f.set_len(kept).unwrap();
    kept
}

/// Calls of `work` per full-disk run (a `done` line every 20,000).
const FULL_DISK_CALLS: u64 = 60_000;

#[test]
fn on_a_full_disk_at_seeded_moments_record_stops_writing_and_runs_the_program_to_its_end() {
    let mut moments = SeededMoments::from_env("HOTPROBE_DISK_SEED", "full-disk moments");
    let seed = moments.seed();
    let prog = program("spin", SPIN);
    let n = FULL_DISK_CALLS.to_string();
    // The program alone: its output and status.
    let native = Command::new(&prog).arg(&n).output().unwrap();
    assert_eq!(native.status.code(), Some(3));
    let want = text(&native.stdout);
    assert!(want.ends_with("done 60000\nend 60000\n"), "{want}");
    // A tmpfs big enough for the whole trace: the test fills it.
    let fs = Tmpfs::mount(tmp().join(format!("full-{}", std::process::id())), "16m");
    let started = Instant::now();
    for run_no in 0..10 {
        // The moment: once the first block of the stream is on disk
        // (line 0) or once the program printed its line `after`; the
        // room then left, `slack` bytes, which record's writer fills.
        let after = moments.in_range(0..3);
        let slack = moments.in_range(0..32 << 10);
        let ctx = format!(
            "run {run_no} (HOTPROBE_DISK_SEED={seed}): disk filled after line {after}, \
             {slack} bytes left"
        );
        let dir = fs.0.join("trace");
        let _ = std::fs::remove_dir_all(&dir);
        let filler = fs.0.join("filler");
        let _ = std::fs::remove_file(&filler);
        let d = dir.to_str().unwrap();
        let errf = tmp().join(format!("full-{run_no}.stderr"));
        use std::os::unix::process::CommandExt;
        // The program waits after each of its lines until the test has
        // read it (and filled the disk at its moment): a test reading its
        // lines late, under load, filled the disk once the whole trace
        // was written.
        let mut child = Command::new(common::HOTPROBE)
            .args(["record", "--args", "1", "-o", d, "--"])
            .arg(&prog)
            .args([&n, "pause"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&errf).unwrap())
            .process_group(0)
            .spawn()
            .unwrap();
        let _group = GroupKilled(child.id() as i32);
        let lines = line_reader(child.stdout.take().unwrap());
        let mut go_on = child.stdin.take().unwrap();
        let mut go_on = move || {
            use std::io::Write;
            // Written to a program that may have ended: no error then.
            let _ = go_on.write_all(b"go\n").and_then(|_| go_on.flush());
        };
        let mut out = String::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        let said = || std::fs::read_to_string(&errf).unwrap_or_default();
        // Up to the moment: the lines, and the stream's first block.
        while out.lines().count() < after as usize || stream_size(&dir) <= 20 {
            assert!(
                Instant::now() < deadline,
                "{ctx}: no progress in 60 s: {out}; record said: {}",
                said()
            );
            if let Ok(l) = lines.recv_timeout(Duration::from_millis(5)) {
                out.push_str(&l);
                out.push('\n');
                // Paused at line `after` (not at all for 0) until the
                // disk is full.
                if out.lines().count() != after as usize {
                    go_on();
                }
            }
        }
        let filled = fill_disk(&filler, slack);
        if after > 0 {
            go_on();
        }
        // The rest of the program's output, to its end.
        loop {
            match lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(l) => {
                    if l.starts_with("done ") {
                        go_on();
                    }
                    out.push_str(&l);
                    out.push('\n');
                }
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(_) => panic!("{ctx}: not ended in 60 s: {out}; record said: {}", said()),
            }
        }
        let status = child.wait().unwrap();
        let err = said();
        // The program's own output and status, hotprobe's status the program's.
        assert_eq!(out, want, "{ctx}: {err}");
        assert_eq!(status.code(), Some(3), "{ctx}: {err}");
        assert!(err.contains("exited with code 3"), "{ctx}: {err}");
        // The failed write, in info.json.
        let info = json(&std::fs::read_to_string(dir.join("info.json")).unwrap());
        let stats = &info["stats"];
        let dropped = stats["dropped"].as_u64().unwrap();
        let why = stats["write_error"]
            .as_str()
            .unwrap_or_else(|| panic!("{ctx}: no write error: {info}\n{err}"));
        assert!(
            why.starts_with(d) && why.ends_with("No space left on device (os error 28)"),
            "{ctx}: {why}"
        );
        assert!(dropped > 0, "{ctx}: {info}");
        assert_eq!(info["complete"], true, "{ctx}");
        // On stderr.
        let warning = format!(
            "hotprobe: warning: {why}: stopped writing the trace there and let the program run \
             to its end; {dropped} events were not written (the trace ends with a lost record \
             counting them)"
        );
        assert!(err.lines().any(|l| l == warning), "{ctx}: {err}");
        // Every event written or counted as dropped (when no ring overflowed).
        let no_ring_loss = stats["lost"] == 0;
        if no_ring_loss {
            assert_eq!(
                stats["events_out"].as_u64().unwrap() + dropped,
                stats["events_in"].as_u64().unwrap(),
                "{ctx}: {stats}"
            );
            // main's entry, work's 60,000 entries and exits, main's exit.
            assert_eq!(stats["events_in"].as_u64(), Some(120_002), "{ctx}");
        }
        // The trace reads whole (no cut-short warning): calls 0..C of
        // work, in order, then the lost record; nothing after the failure.
        let (rc, rep, rerr) = run(&["replay", d]);
        assert_eq!(rc, 0, "{ctx}: {rerr}");
        assert!(!rerr.contains("cut short"), "{ctx}: {rerr}");
        let args = replayed_args(&rep);
        if no_ring_loss {
            assert!(
                args.iter().enumerate().all(|(i, a)| *a == i as u64),
                "{ctx}: replay's work() arguments are not 0..{}",
                args.len()
            );
        }
        let last = rep.lines().last().unwrap_or_default();
        if no_ring_loss {
            assert!(
                last.ends_with(&format!("| /* lost {dropped} events */")),
                "{ctx}: {last}"
            );
        } else {
            assert!(last.contains("| /* lost "), "{ctx}: {last}");
        }
        // In info.
        let (rc, txt, ierr) = run(&["info", d]);
        assert_eq!(rc, 0, "{ctx}: {ierr}");
        assert!(
            txt.lines().any(|l| l
                == format!(
                    "# write error:   {why}: writing stopped there, {dropped} events not \
                     written (counted as lost)"
                )),
            "{ctx}: {txt}"
        );
        // report reads the same calls.
        let (rc, rep, rerr) = run(&["report", "--json", d]);
        assert_eq!(rc, 0, "{ctx}: {rerr}");
        let rep = json(&rep);
        let work_calls = rep["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["function"] == "work")
            .map_or(0, |r| r["calls"].as_u64().unwrap());
        assert_eq!(work_calls, args.len() as u64, "{ctx}: {rep}");
        eprintln!(
            "{ctx}: filler {filled} bytes; {} calls written, {dropped} events dropped; the \
             program ran to its end",
            args.len()
        );
    }
    eprintln!("10 full-disk runs in {:?}", started.elapsed());
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
    let _group = GroupKilled(child.id() as i32);
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
