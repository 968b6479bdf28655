//! `record --kernel` (issue 25): the host kernel's syscalls and off-CPU
//! time of the traced threads in the trace, read back by replay, report,
//! the Chrome export and info; for a spawned program, an attached one
//! (`-p`) and a followed fork (`-f`); and refused, in one line with exit
//! code 2, to a user without the permissions.

mod common;

use common::*;
use hotprobe_trace::TraceReader;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const MS: u64 = 1_000_000;

fn tmp() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kernel-cli");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Compiles tests/programs/NAME.c (-O1, no inlining).
fn program(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(format!("{name}.c"));
    gcc(&src, &tmp().join(name), &["-O1", "-fno-inline"])
}

/// `hotprobe record --kernel -o DIR ARGS -- PROG`: the program's stdout
/// and hotprobe's stderr; fails unless the program exits 0.
fn record(dir: &Path, args: &[&str], prog: &Path) -> (String, String) {
    let _ = std::fs::remove_dir_all(dir);
    let mut a = vec!["record", "--kernel", "-o", dir.to_str().unwrap()];
    a.extend_from_slice(args);
    a.extend(["--", prog.to_str().unwrap()]);
    let o = hotprobe(&a);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "record failed: {err}");
    assert!(err.contains("exited with code 0"), "{err}");
    assert!(err.contains("  kernel:   "), "{err}");
    (out, err)
}

/// `ROLE TID` lines of the program's output.
fn tid_of(out: &str, role: &str) -> u32 {
    out.lines()
        .find_map(|l| l.strip_prefix(role)?.trim().split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no `{role} TID` line in {out:?}"))
}

/// `300.123 ms` (`us`, `s`…) in ns.
fn ns_of(cell: &str) -> u64 {
    let (v, unit) = cell.trim().split_once(' ').unwrap();
    let v: f64 = v.parse().unwrap();
    let scale = match unit {
        "ns" => 1.0,
        "us" => 1e3,
        "ms" => 1e6,
        "s" => 1e9,
        u => panic!("unit {u}"),
    };
    (v * scale) as u64
}

/// The getppid syscalls of each thread of a trace.
fn getppid_by_tid(dir: &Path) -> std::collections::BTreeMap<u32, (u32, usize)> {
    let r = TraceReader::open(dir).unwrap();
    let k = r.kernel_info().expect("kernel events in info.json").clone();
    let mut by = std::collections::BTreeMap::new();
    for t in &k.threads {
        let n = r
            .kernel_events(t.tid)
            .unwrap()
            .iter()
            .filter(|e| e.name() == "getppid")
            .count();
        if n > 0 {
            by.insert(t.tid, (t.pid, n));
        }
    }
    by
}

#[test]
fn a_read_blocked_200_ms_is_a_syscall_inside_wait_for_data_and_off_cpu() {
    let dir = tmp().join("late");
    let (out, err) = record(&dir, &[], &program("kernel_late"));
    // The program's own output: its tid, and the 5 bytes its child wrote.
    let line = out.lines().find(|l| l.starts_with("main ")).unwrap();
    assert!(line.ends_with(" read 5"), "{out}");
    let tid = tid_of(&out, "main");

    // replay: the read, 190 ms or more, returning 5, between the lines
    // opening and closing wait_for_data, on the main thread.
    let o = hotprobe(&["replay", dir.to_str().unwrap()]);
    let replay = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let lines: Vec<&str> = replay.lines().collect();
    let open = lines
        .iter()
        .position(|l| l.ends_with("| wait_for_data() {") || l.ends_with("|   wait_for_data() {"))
        .unwrap_or_else(|| panic!("no wait_for_data() {{ line:\n{replay}\n{err}"));
    let close = open
        + lines[open..]
            .iter()
            .position(|l| l.ends_with("}; /* wait_for_data */"))
            .unwrap();
    let reads: Vec<&&str> = lines[open..close]
        .iter()
        .filter(|l| l.contains("syscall:read() = 5;"))
        .collect();
    assert_eq!(reads.len(), 1, "{replay}");
    let read = reads[0];
    assert!(read.contains(&format!("[{tid:>6}]")), "{read}");
    let dur = ns_of(&read.trim_start()[..10]);
    assert!(dur >= 190 * MS, "{read}");
    assert!(
        lines[open..=close]
            .iter()
            .all(|l| l.contains(&format!("[{tid:>6}]"))),
        "{replay}"
    );

    // report: wait_for_data's thread was off the CPU (and in a syscall)
    // for it.
    let o = hotprobe(&["report", dir.to_str().unwrap()]);
    let report = text(&o.stdout);
    let head = report.lines().next().unwrap();
    assert!(
        head.starts_with("  Total time   Self time     Off-CPU  In syscall"),
        "{report}"
    );
    let row = report
        .lines()
        .find(|l| l.ends_with(" wait_for_data"))
        .unwrap();
    let cell = |i: usize| ns_of(&row[2 + 12 * i..12 + 12 * i]);
    assert!(cell(2) >= 190 * MS, "off-CPU: {row}");
    assert!(cell(3) >= 190 * MS, "in syscall: {row}");
    assert!(cell(2) <= cell(0) && cell(3) <= cell(0), "{row}");

    // Chrome: the read on the thread's track, where wait_for_data is.
    let json = dir.join("trace.json");
    let o = hotprobe(&[
        "export",
        "--format",
        "chrome",
        dir.to_str().unwrap(),
        "-o",
        json.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    let func = ev.iter().find(|e| e["name"] == "wait_for_data").unwrap();
    let span = ev
        .iter()
        .find(|e| e["name"] == "read" && e["cat"] == "syscall" && e["tid"] == tid)
        .unwrap_or_else(|| panic!("no read span on tid {tid}"));
    assert_eq!(
        (&span["pid"], &span["tid"], &span["ph"]),
        (&func["pid"], &func["tid"], &"X".into())
    );
    assert_eq!(span["args"]["retval"], "5");
    let (fts, sts) = (func["ts"].as_f64().unwrap(), span["ts"].as_f64().unwrap());
    assert!(
        sts >= fts && sts <= fts + func["dur"].as_f64().unwrap(),
        "{span} {func}"
    );
    assert!(span["dur"].as_f64().unwrap() >= 190_000.0, "{span}");
    assert!(ev.iter().any(|e| e["cat"] == "off-cpu"
        && e["tid"] == tid
        && e["dur"].as_f64().unwrap() >= 190_000.0));

    // info: how many were taken and lost.
    let o = hotprobe(&["info", dir.to_str().unwrap()]);
    let info = text(&o.stdout);
    let line = info.lines().find(|l| l.starts_with("# kernel:")).unwrap();
    assert!(
        line.contains("records taken, 0 lost by the kernel"),
        "{line}"
    );
    let r = TraceReader::open(&dir).unwrap();
    let k = r.kernel_info().unwrap();
    assert_eq!(k.lost, 0);
    assert!(k.taken >= 2 * k.syscalls(), "{k:?}");
}

#[test]
fn attached_with_p_each_threads_syscalls_are_its_own() {
    let dir = tmp().join("attached");
    let _ = std::fs::remove_dir_all(&dir);
    let mut prog = Command::new(program("kernel_threads"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(prog.stdout.take().unwrap());
    let mut ready = String::new();
    out.read_line(&mut ready).unwrap();
    assert_eq!(ready, "ready\n");
    let pid = prog.id().to_string();
    let mut stdin = prog.stdin.take().unwrap();
    let mut hp = Command::new(HOTPROBE)
        .args([
            "record",
            "--kernel",
            "-o",
            dir.to_str().unwrap(),
            "-p",
            &pid,
        ])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Once hotprobe says it is attached (probes and kernel events in),
    // the program is let go.
    let mut hp_err = BufReader::new(hp.stderr.take().unwrap());
    let mut err = String::new();
    while !err.contains("hotprobe: attached to pid") {
        assert_ne!(hp_err.read_line(&mut err).unwrap(), 0, "{err}");
    }
    stdin.write_all(b"go\n").unwrap();
    let status = hp.wait().unwrap();
    std::io::Read::read_to_string(&mut hp_err, &mut err).unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    assert!(prog.wait().unwrap().success());
    assert!(status.success(), "{err}");
    let (main, worker) = (tid_of(&rest, "main"), tid_of(&rest, "worker"));
    assert_eq!(main.to_string(), pid);
    let by = getppid_by_tid(&dir);
    let p = prog.id();
    assert_eq!(
        by.into_iter().collect::<Vec<_>>(),
        vec![(main, (p, 3)), (worker, (p, 5))],
        "{err}"
    );
}

#[test]
fn a_followed_forks_syscalls_are_its_own() {
    let dir = tmp().join("forked");
    let (out, err) = record(&dir, &["-f"], &program("kernel_fork"));
    let (parent, child) = (tid_of(&out, "parent"), tid_of(&out, "child"));
    assert!(err.contains(&format!("forked {child}: followed")), "{err}");
    let by = getppid_by_tid(&dir);
    // The child is a process of its own: its tid is its pid.
    assert_eq!(
        by.into_iter().collect::<Vec<_>>(),
        vec![(parent, (parent, 2)), (child, (child, 4))],
        "{err}"
    );

    // Without -f the child is not followed: its events (inherited by the
    // kernel all the same) are not written, the parent's are.
    let dir = tmp().join("not-followed");
    let (out, err) = record(&dir, &[], &program("kernel_fork"));
    let parent = tid_of(&out, "parent");
    assert_eq!(
        getppid_by_tid(&dir).into_iter().collect::<Vec<_>>(),
        vec![(parent, (parent, 2))],
        "{err}"
    );
}

#[test]
fn nobody_gets_one_line_saying_what_is_missing_and_exit_2() {
    let dir = tmp().join("nobody");
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", HOTPROBE])
        .args([
            "record",
            "--kernel",
            "-o",
            dir.to_str().unwrap(),
            "--",
            "/bin/true",
        ])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("hotprobe: error: "), "{err}");
    // Which permission, and how to get it.
    assert!(
        err.contains("tracefs") || err.contains("perf_event_paranoid"),
        "{err}"
    );
    assert!(err.contains("run hotprobe as root"), "{err}");
    assert!(!dir.exists(), "nothing written");
}
