//! A process whose probes are all on the agent's fast paths runs untraced
//! (issue 23: a thread start costs no ptrace clone stop). The program
//! (tests/programs/untraced_threads.c) reads its threads' own TracerPid
//! at their start: "traced 0" is what it saw. What the traced run gave is
//! kept: counts, the program's output and exit status, a SIGKILL, an
//! exec (its notice), and under `-p` the detach with the original bytes.

mod common;

use common::attached::CountAttached;
use common::{
    file_offset_of, hotprobe, line_reader, memory_at, program_output, text, untraced, CountTable,
};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

const ITERS: u64 = 1000;
/// How long a step the test waits for may take on a loaded machine.
const WAIT: Duration = Duration::from_secs(60);

fn program() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/untraced_threads.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("untraced_fast");
    std::fs::create_dir_all(&dir).unwrap();
    common::gcc(&src, &dir.join("untraced_threads"), &["-O1"])
}

/// The round line of 8 threads × `ITERS` calls of `work(i + id)`, none
/// of them traced at its start.
fn round_line() -> String {
    let total: u64 = (0..8u64)
        .map(|id| (0..ITERS).map(|i| i + id + 1).sum::<u64>())
        .sum();
    format!("round traced 0 total {total}\n")
}

/// The program run natively: its output and exit status.
fn native(args: &[&str]) -> (String, std::process::ExitStatus) {
    let out = Command::new(program())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (text(&out.stdout), out.status)
}

#[test]
fn fast_path_only_threads_run_untraced_with_counts_output_and_status_unchanged() {
    let bin = program();
    let bin = bin.to_str().unwrap();
    let iters = ITERS.to_string();
    let args = ["exit", &iters, "7"];
    let (native_out, native_status) = native(&args);
    assert_eq!(native_out, round_line());
    assert_eq!(native_status.code(), Some(7));
    for cmd in ["count", "record"] {
        let dir = hotprobe_testkit::TempDir::new("untraced-record");
        let trace = dir.path().join("t");
        let mut a: Vec<&str> = vec![cmd];
        if cmd == "record" {
            a.extend(["--force", "-o", trace.to_str().unwrap()]);
        }
        a.extend(["work", "--", bin]);
        a.extend(args);
        let out = hotprobe(&a);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(7), "{cmd}: {stderr}");
        assert_eq!(program_output(&stdout), native_out, "{cmd}: {stderr}");
        assert!(stderr.contains("exited with code 7"), "{cmd}: {stderr}");
        if cmd == "count" {
            let t = CountTable::parse(&stdout, &stderr);
            assert_eq!(t.hits("work"), 8 * ITERS);
            assert!(
                ["patch", "jump"].contains(&t.execution("work").as_str()),
                "{stdout}"
            );
        } else {
            let rep = hotprobe(&["report", trace.to_str().unwrap()]);
            let rep_out = text(&rep.stdout);
            assert!(rep.status.success(), "{}", text(&rep.stderr));
            let calls = rep_out
                .lines()
                .find(|l| l.split_whitespace().last() == Some("work"))
                .unwrap_or_else(|| panic!("no row of work:\n{rep_out}"));
            assert!(
                calls
                    .split_whitespace()
                    .any(|w| w == (8 * ITERS).to_string()),
                "8000 calls of work: {calls}\n{rep_out}"
            );
        }
    }
}

#[test]
fn a_sigkill_of_the_untraced_program_is_its_reported_status() {
    let bin = program();
    let iters = ITERS.to_string();
    let out = hotprobe(&["count", "work", "--", bin.to_str().unwrap(), "kill", &iters]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(128 + 9), "{stderr}");
    assert!(stderr.contains("killed by signal 9"), "{stderr}");
    assert_eq!(program_output(&stdout), round_line(), "{stderr}");
    assert_eq!(CountTable::parse(&stdout, &stderr).hits("work"), 8 * ITERS);
}

/// An exec of the untraced program is said as a traced run says it, both
/// when the new image may have ended already when it is looked for
/// (`echo`) and when it still runs: then the process is taken back at
/// its exec, which the new image sees (`await_seize` waits for a tracer).
#[test]
fn an_exec_of_the_untraced_program_is_noticed() {
    let bin = program();
    let bin = bin.to_str().unwrap();
    let iters = ITERS.to_string();
    const NOTICE: &str = "exec: 1 fast-path probes dropped";
    for (image, said) in [
        (vec!["/bin/echo", "after exec"], "after exec\n"),
        (vec![bin, "await_seize", "0"], "seized after exec\n"),
    ] {
        let mut a = vec!["count", "work", "--", bin, "exec", &iters];
        a.extend(&image);
        let out = hotprobe(&a);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{image:?}: {stderr}");
        assert!(stderr.contains(NOTICE), "{image:?}: {stderr}");
        assert!(stderr.contains("exited with code 0"), "{image:?}: {stderr}");
        assert_eq!(
            program_output(&stdout),
            format!("{}{said}", round_line()),
            "{image:?}: {stderr}"
        );
        assert_eq!(CountTable::parse(&stdout, &stderr).hits("work"), 8 * ITERS);
    }
}

/// The `serve` program, started: its pid, stdin and output lines.
struct Served {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Served {
    fn start() -> Served {
        let mut child = Command::new(program())
            .args(["serve", &ITERS.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = line_reader(child.stdout.take().unwrap());
        let ready = lines.recv_timeout(WAIT).unwrap();
        assert_eq!(ready, format!("ready {}", child.id()));
        Served {
            child,
            stdin,
            lines,
        }
    }

    fn say(&mut self, line: &str) {
        writeln!(self.stdin, "{line}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// One round, and its line.
    fn round(&mut self) -> String {
        self.say("round");
        self.lines.recv_timeout(WAIT).expect("the round's line") + "\n"
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `count -p` on `s`, up to its "attached" line, then until the process
/// runs untraced (it is traced while the probes go in).
fn attach(s: &Served) -> CountAttached {
    let pid = s.child.id();
    let hp = CountAttached::start(pid, &["work"], WAIT);
    assert!(
        hp.first.contains(&format!("attached to pid {pid}")),
        "{}",
        hp.first
    );
    hp.until_released(pid, true, WAIT);
    hp
}

#[test]
fn count_p_runs_the_process_untraced_and_detaches_with_its_bytes() {
    let mut s = Served::start();
    let pid = s.child.id();
    let hp = attach(&s);
    assert_eq!(s.round(), round_line(), "threads started untraced");
    let (status, stdout, stderr) = hp.interrupt();
    assert!(status.success());
    let t = CountTable::parse(&stdout, &stderr);
    assert_eq!(t.hits("work"), 8 * ITERS);
    assert!(stderr.contains("interrupted: detached"), "{stderr}");
    // The original bytes are back at work's entry.
    let addr =
        u64::from_str_radix(t.row("work")[t.col("ADDRESS")].trim_start_matches("0x"), 16).unwrap();
    let off = file_offset_of(pid, addr);
    let file = std::fs::read(program()).unwrap();
    assert_eq!(
        memory_at(pid, addr, 16),
        file[off as usize..off as usize + 16].to_vec()
    );
    assert!(untraced(pid));
    assert_eq!(s.round(), round_line(), "runs on after the detach");
}

#[test]
fn count_p_reports_the_untraced_process_exit_status_and_sigkill() {
    for (line, said, code) in [
        ("exit 5", "exited with code 5", 5),
        ("kill", "killed by signal 9", 128 + 9),
    ] {
        let mut s = Served::start();
        let hp = attach(&s);
        assert_eq!(s.round(), round_line());
        s.say(line);
        let (status, stdout, stderr) = hp.end();
        assert!(stderr.contains(said), "{line}: {stderr}");
        assert_eq!(status.code(), Some(code), "{line}: {stderr}");
        let t = CountTable::parse(&stdout, &stderr);
        assert_eq!(t.hits("work"), 8 * ITERS, "{line}");
    }
}
