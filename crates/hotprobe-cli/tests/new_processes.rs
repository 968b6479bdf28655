//! Issue 24, "Processes started later": `count --exe PATH` and `--comm
//! NAME` take every matching process, those running when hotprobe starts
//! and those that start later (held at their exec: no call is missed), a
//! row per process, until Ctrl-C or --duration. Needs root.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

mod common;
use common::{gcc, line_reader, reader, text, CountTable, HOTPROBE};

const WAIT: Duration = Duration::from_secs(60);

/// One test at a time: `--comm leafn` would take the other tests' leafn.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// `leafn` built into a directory of this test's, which is returned.
fn leafn_dir(tag: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("new-procs-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/leafn.c");
    gcc(&src, &dir.join("leafn"), &["-O1"]);
    dir
}

/// `hotprobe count ARGS leafwork` started in `dir`, and its stderr lines.
fn start(dir: &Path, args: &[&str]) -> (Child, Receiver<String>) {
    start_cmd("count", dir, args)
}

/// `hotprobe CMD ARGS leafwork` started in `dir`, and its stderr lines.
fn start_cmd(cmd: &str, dir: &Path, args: &[&str]) -> (Child, Receiver<String>) {
    let mut c = Command::new(HOTPROBE)
        .arg(cmd)
        .args(args)
        .arg("leafwork")
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let lines = line_reader(c.stderr.take().unwrap());
    (c, lines)
}

/// Reads stderr lines until one contains `what`; returns it.
fn until(lines: &Receiver<String>, what: &str, seen: &mut String) -> String {
    loop {
        let l = lines
            .recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("no line with {what:?} from hotprobe; stderr:\n{seen}"));
        seen.push_str(&l);
        seen.push('\n');
        if l.contains(what) {
            return l;
        }
    }
}

/// Runs `./leafn 4` five times in `dir`, one after the other; their output.
fn five_runs(dir: &Path) -> String {
    let o = Command::new("sh")
        .args(["-c", "for i in 1 2 3 4 5; do ./leafn 4; done"])
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(o.status.success());
    text(&o.stdout)
}

/// Ctrl-C to hotprobe, then its table (stdout) and the rest of stderr.
fn stop(mut c: Child, lines: Receiver<String>, mut seen: String) -> CountTable {
    let out = reader(c.stdout.take().unwrap());
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
    let st = c.wait().unwrap();
    while let Ok(l) = lines.recv_timeout(WAIT) {
        seen.push_str(&l);
        seen.push('\n');
    }
    assert_eq!(st.code(), Some(0), "{seen}");
    CountTable::parse(&text(&out.join().unwrap()), &seen)
}

/// The (pid, hits) of each leafwork row.
fn rows(t: &CountTable) -> Vec<(String, u64)> {
    let (p, h) = (t.col("PID"), t.col("HITS"));
    t.rows_of("leafwork")
        .into_iter()
        .map(|r| (r[p].clone(), r[h].parse().unwrap()))
        .collect()
}

fn five_later(tag: &str, args: &[&str]) {
    let _one = one_at_a_time();
    let dir = leafn_dir(tag);
    let (c, lines) = start(&dir, args);
    let mut seen = String::new();
    until(&lines, "waiting for processes", &mut seen);
    assert_eq!(five_runs(&dir), "leafn 4 sum 20\n".repeat(5));
    let t = stop(c, lines, seen);
    let r = rows(&t);
    assert_eq!(r.len(), 5, "a row per process:\n{}", t.all);
    assert!(r.iter().all(|(_, h)| *h == 4), "4 calls each:\n{}", t.all);
    let pids: std::collections::HashSet<_> = r.iter().map(|(p, _)| p).collect();
    assert_eq!(pids.len(), 5, "five processes:\n{}", t.all);
}

#[test]
fn exe_takes_each_process_started_later() {
    five_later("exe", &["--exe", "./leafn", "--duration", "120"]);
}

#[test]
fn comm_takes_each_process_started_later() {
    five_later("comm", &["--comm", "leafn", "--duration", "120"]);
}

#[test]
fn exe_takes_one_already_running_and_those_started_later() {
    let _one = one_at_a_time();
    let dir = leafn_dir("running");
    let fifo = dir.join("go");
    let _ = std::fs::remove_file(&fifo);
    let made = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(made.success());
    // Blocked opening the fifo until the test writes to it.
    let early = Command::new("./leafn")
        .args(["4", fifo.to_str().unwrap()])
        .current_dir(&dir)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let early_pid = early.id().to_string();
    let (c, lines) = start(&dir, &["--exe", "./leafn", "--duration", "120"]);
    let mut seen = String::new();
    let attached = until(&lines, "attached to pid", &mut seen);
    assert!(
        attached.contains(&format!("pid {early_pid} (leafn)")),
        "{seen}"
    );
    until(&lines, "waiting for processes", &mut seen);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&fifo)
        .unwrap()
        .write_all(b"go")
        .unwrap();
    let o = early.wait_with_output().unwrap();
    assert_eq!(text(&o.stdout), "leafn 4 sum 20\n");
    assert!(o.status.success());
    assert_eq!(five_runs(&dir), "leafn 4 sum 20\n".repeat(5));
    let t = stop(c, lines, seen);
    let r = rows(&t);
    assert_eq!(r.len(), 6, "a row per process:\n{}", t.all);
    assert!(r.iter().all(|(_, h)| *h == 4), "4 calls each:\n{}", t.all);
    assert!(r.iter().any(|(p, _)| *p == early_pid), "{}", t.all);
}

#[test]
fn trace_exe_shows_the_calls_of_each_process_started_later() {
    let _one = one_at_a_time();
    let dir = leafn_dir("trace");
    let (mut c, lines) = start_cmd("trace", &dir, &["--exe", "./leafn", "--duration", "120"]);
    let mut seen = String::new();
    until(&lines, "waiting for processes", &mut seen);
    assert_eq!(five_runs(&dir), "leafn 4 sum 20\n".repeat(5));
    let out = reader(c.stdout.take().unwrap());
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
    assert_eq!(c.wait().unwrap().code(), Some(0), "{seen}");
    let out = text(&out.join().unwrap());
    let calls = common::call_tree(&out);
    let mut per_tid: std::collections::BTreeMap<u32, usize> = Default::default();
    for (tid, _, name) in calls.iter().filter(|c| !c.2.starts_with("/*")) {
        assert_eq!(name, "leafwork", "{out}");
        *per_tid.entry(*tid).or_default() += 1;
    }
    assert_eq!(per_tid.len(), 5, "five processes:\n{out}");
    assert!(per_tid.values().all(|n| *n == 4), "4 calls each:\n{out}");
    for tid in per_tid.keys() {
        assert!(
            out.contains(&format!(
                "/* pid {tid} executed {} (leafn) */",
                dir.join("leafn").display()
            )),
            "the exec of {tid} said:\n{out}"
        );
    }
}

#[test]
fn record_exe_writes_each_process_with_its_pid_and_comm() {
    let _one = one_at_a_time();
    let dir = leafn_dir("record");
    let trace = dir.join("trace");
    let t = trace.to_str().unwrap();
    let (c, lines) = start_cmd(
        "record",
        &dir,
        &["--force", "-o", t, "--exe", "./leafn", "--duration", "120"],
    );
    let mut seen = String::new();
    until(&lines, "waiting for processes", &mut seen);
    assert_eq!(five_runs(&dir), "leafn 4 sum 20\n".repeat(5));
    let mut c = c;
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
    assert_eq!(c.wait().unwrap().code(), Some(0), "{seen}");
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(trace.join("info.json")).unwrap()).unwrap();
    let procs = info["processes"].as_array().expect("processes");
    assert_eq!(procs.len(), 5, "{info}");
    assert!(procs.iter().all(|p| p["comm"] == "leafn"), "{info}");
    let out = text(&common::hotprobe_within(&["replay", t], WAIT).stdout);
    let calls = common::call_tree(&out);
    for p in procs {
        let pid = p["pid"].as_u64().unwrap();
        let n = calls
            .iter()
            .filter(|(tid, _, f)| u64::from(*tid) == pid && f == "leafwork")
            .count();
        assert_eq!(n, 4, "pid {pid}:\n{out}");
    }
}
