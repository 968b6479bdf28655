//! The `hotprobe` binary on real programs compiled here with gcc: counts
//! equal the calls the programs made, the trace shows their nesting,
//! arguments and return values, every bad input gives one error line and
//! leaves the target running, and Ctrl-C detaches leaving the text intact.
//! (The fast path's mechanisms and agent through the CLI: fast_path_cli.rs.)

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

mod common;
use common::{gcc, hotprobe, line_reader, ready_pid, text, HOTPROBE};

mod cli_support;
use cli_support::{assert_error, hits, repo_root, row};

const WAIT: Duration = Duration::from_secs(30);

/// Compile tests/programs/NAME.c with `flags` (cached by flags).
fn program(name: &str, flags: &[&str]) -> PathBuf {
    let src = repo_root().join("tests/programs").join(format!("{name}.c"));
    let tag: String = flags
        .join("")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("cli-programs");
    std::fs::create_dir_all(&dir).unwrap();
    gcc(&src, &dir.join(format!("{name}-{tag}")), flags)
}

fn target() -> PathBuf {
    program("target", &["-O2"])
}

/// `target serve`, started here with piped stdin/stdout; killed on drop.
struct Serve {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    pid: i32,
}

impl Serve {
    fn start() -> Serve {
        let mut child = Command::new(target())
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = line_reader(child.stdout.take().unwrap());
        let pid = ready_pid(&lines, WAIT) as i32;
        assert_eq!(pid as u32, child.id());
        Serve {
            child,
            stdin,
            lines,
            pid,
        }
    }

    /// Send a command; return its output lines up to its `done` line.
    fn ask(&mut self, cmd: &str) -> Vec<String> {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
        let mut out = Vec::new();
        loop {
            let l = self.lines.recv_timeout(WAIT).expect("serve answers");
            let done = l.starts_with("done ");
            out.push(l);
            if done {
                return out;
            }
        }
    }

    /// It answers `compute n` correctly and is not traced.
    fn check_healthy(&mut self, n: i64) {
        self.check_answers(n);
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        assert!(status.contains("TracerPid:\t0"), "still traced: {status}");
    }

    /// It answers `compute n` correctly.
    fn check_answers(&mut self, n: i64) {
        let out = self.ask(&format!("compute {n}"));
        let expect: Vec<String> = (0..n)
            .map(|i| format!("compute({i}, 7) = {}", i * 3 + 7))
            .collect();
        assert_eq!(&out[..n as usize], &expect[..], "{out:?}");
    }

    /// The bytes of its executable mappings.
    fn text(&self) -> Vec<(u64, Vec<u8>)> {
        use std::io::{Read, Seek, SeekFrom};
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)).unwrap();
        let mut mem = std::fs::File::open(format!("/proc/{}/mem", self.pid)).unwrap();
        let mut v = Vec::new();
        for l in maps.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f[1] != "r-xp" || l.contains("[vsyscall]") {
                continue;
            }
            let (a, b) = f[0].split_once('-').unwrap();
            let (a, b) = (
                u64::from_str_radix(a, 16).unwrap(),
                u64::from_str_radix(b, 16).unwrap(),
            );
            let mut buf = vec![0u8; (b - a) as usize];
            mem.seek(SeekFrom::Start(a)).unwrap();
            mem.read_exact(&mut buf).unwrap();
            v.push((a, buf));
        }
        assert!(!v.is_empty());
        v
    }

    /// Every executable mapping of `before` still holds the same bytes.
    /// Mappings added since are allowed: an injected agent library and the
    /// fast path's trampoline pages stay mapped after detach (documented in
    /// hotprobe-fastpath), no code of the program referring to them.
    fn text_unchanged(&self, before: &[(u64, Vec<u8>)]) -> bool {
        let now = self.text();
        before
            .iter()
            .all(|(a, b)| now.iter().any(|(x, y)| x == a && y == b))
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn plt_link_addr(bin: &Path) -> u64 {
    let out = Command::new("objdump").arg("-h").arg(bin).output().unwrap();
    let t = text(&out.stdout);
    let l = t
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(".plt"))
        .expect(".plt section");
    u64::from_str_radix(l.split_whitespace().nth(3).unwrap(), 16).unwrap()
}

#[test]
fn count_compute_reports_the_calls_made() {
    let bin = target();
    let out = hotprobe(&[
        "count",
        "--mechanism",
        "trap",
        "compute",
        "--",
        bin.to_str().unwrap(),
        "compute",
        "10",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        stdout.lines().filter(|l| l.starts_with("compute(")).count(),
        10
    );
    assert_eq!(hits(&stdout, "compute"), 10, "{stdout}");
    assert_eq!(row(&stdout, "compute")[4], "trap");
    let err = text(&out.stderr);
    assert!(err.contains("exited with code 0"), "{err}");
}

#[test]
fn count_a_libc_function_exactly() {
    let bin = program("target", &["-O0", "-no-pie", "-fno-pie"]);
    let out = hotprobe(&[
        "count",
        "libc:getpid",
        "compute",
        "--",
        bin.to_str().unwrap(),
        "getpid",
        "123",
        "compute",
        "4",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("getpid x123 sum"), "{stdout}");
    assert_eq!(hits(&stdout, "libc:getpid"), 123, "{stdout}");
    assert_eq!(hits(&stdout, "compute"), 4, "{stdout}");
}

#[test]
fn count_returns_and_nmissed() {
    let bin = target();
    let b = bin.to_str().unwrap();
    // rec(20) makes 21 calls; every return is followed.
    let out = hotprobe(&["count", "rec%return", "--", b, "rec", "20"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(stdout.contains("rec(20) = 20"), "{stdout}");
    let r = row(&stdout, "rec%return");
    assert_eq!((r[2], r[3]), ("21", "0"), "{stdout}");
    // With maxactive 5: returns + nmissed add up to the calls.
    let out = hotprobe(&[
        "count",
        "--maxactive",
        "5",
        "rec%return",
        "--",
        b,
        "rec",
        "20",
    ]);
    let stdout = text(&out.stdout);
    let r = row(&stdout, "rec%return");
    let (ret, missed): (u64, u64) = (r[2].parse().unwrap(), r[3].parse().unwrap());
    assert_eq!((ret, missed), (5, 16), "{stdout}");
}

/// The function column of trace lines (after `| `), and the durations.
fn trace_lines(stdout: &str) -> Vec<String> {
    stdout
        .lines()
        .filter_map(|l| l.split_once("] | ").map(|(_, f)| f.to_string()))
        .collect()
}

#[test]
fn trace_shows_nesting_arguments_and_return_values() {
    let bin = target();
    let out = hotprobe(&[
        "trace",
        "--args",
        "1",
        "rec",
        "--",
        bin.to_str().unwrap(),
        "rec",
        "4",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout.starts_with("# DURATION     TID     FUNCTION\n"),
        "{stdout}"
    );
    assert!(stdout.contains("rec(4) = 4"), "{stdout}");
    let mut expect = Vec::new();
    for d in 0..=4 {
        expect.push(format!("{}rec({}) {{", "  ".repeat(d), 4 - d));
    }
    for d in (0..=4).rev() {
        expect.push(format!("{}}} /* rec */ = {}", "  ".repeat(d), 4 - d));
    }
    assert_eq!(trace_lines(&stdout), expect, "{stdout}");
    // Fixed-width duration column, the tid of the target.
    let tid = stdout
        .lines()
        .find_map(|l| l.split_once('[').and_then(|(_, r)| r.split_once(']')))
        .map(|(t, _)| t.trim().to_string())
        .unwrap();
    for l in stdout.lines().skip(1).filter(|l| l.contains("] | ")) {
        assert_eq!(&l[11..13], " [", "{l}");
        assert_eq!(l[13..19].trim(), tid, "{l}");
        if l.contains("/* rec */") {
            assert!(l[..11].ends_with(" us") || l[..11].ends_with(" ms"), "{l}");
        } else {
            assert_eq!(l[..11].trim(), "", "{l}");
        }
    }
}

/// An instruction inside a function takes an in-process trap recording
/// hit events: a point inside the caller's call, once per call.
#[test]
fn trace_of_an_instruction_inside_a_function_prints_its_hits_in_place() {
    let bin = target();
    let out = hotprobe(&[
        "trace",
        "compute+4",
        "caller",
        "--",
        bin.to_str().unwrap(),
        "caller",
        "3",
    ]);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("(in-process 1, "), "{stderr}");
    let expect: Vec<String> = (0..3)
        .flat_map(|_| ["caller() {", "  /* compute+4 */", "} /* caller */"])
        .map(String::from)
        .collect();
    assert_eq!(trace_lines(&stdout), expect, "{stdout}");
}

#[test]
fn trace_arguments_match_what_the_program_printed() {
    let bin = target();
    let out = hotprobe(&[
        "trace",
        "--args",
        "2",
        "compute",
        "caller",
        "--",
        bin.to_str().unwrap(),
        "caller",
        "3",
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut expect = Vec::new();
    for i in 0..3u64 {
        // caller(i) calls compute(i, 1) = 3i + 1 and returns 3i + 2.
        assert!(
            stdout.contains(&format!("caller({i}) = {}", 3 * i + 2)),
            "{stdout}"
        );
        expect.push(format!("caller({i}, 7) {{"));
        expect.push(format!("  compute({i}, 1) {{"));
        expect.push(format!("  }} /* compute */ = {}", 3 * i + 1));
        expect.push(format!("}} /* caller */ = {}", 3 * i + 2));
    }
    let got = trace_lines(&stdout);
    // caller's second register is whatever rsi held: compare the rest.
    let norm = |s: &str| match s.split_once("caller(") {
        Some((ind, rest)) => format!("{ind}caller({}", rest.split(',').next().unwrap()),
        None => s.to_string(),
    };
    let got: Vec<String> = got.iter().map(|s| norm(s)).collect();
    let expect: Vec<String> = expect.iter().map(|s| norm(s)).collect();
    assert_eq!(got, expect, "{stdout}");
}

#[test]
fn bad_inputs_on_a_spawned_target_give_one_line() {
    let bin = target();
    let b = bin.to_str().unwrap();
    let module = bin.file_name().unwrap().to_str().unwrap();
    let plt = format!("{module}:{:#x}", plt_link_addr(&bin) + 0x10);
    let cases: Vec<(Vec<&str>, i32, &str)> = vec![
        (
            vec!["count", "computee", "--", b, "compute", "1"],
            1,
            "similar names: compute",
        ),
        (
            vec!["count", "compute+1", "--", b, "compute", "1"],
            1,
            "middle of an instruction",
        ),
        (vec!["count", &plt, "--", b, "compute", "1"], 1, "PLT"),
        // Bad input: exit code 2, as a usage error.
        (vec!["count", "comp ute+", "--", b], 2, "bad probe spec"),
        (
            vec!["count", "compute", "--", "/nonexistent/prog"],
            1,
            "cannot run /nonexistent/prog",
        ),
        (
            vec!["count", "compute", "-p", "999999999"],
            1,
            "no such process: 999999999",
        ),
        // Inside a function only an in-process trap records (hit events).
        (
            vec!["trace", "--mechanism", "trap", "compute+4", "--", b],
            1,
            "whole functions",
        ),
        (vec!["count", "compute"], 2, "required"),
        (
            vec!["count", "compute", "-p", "1", "--", b],
            2,
            "cannot be used with",
        ),
        (vec!["frobnicate"], 2, "frobnicate"),
        (vec!["list", "/nonexistent/bin"], 1, "no such file"),
    ];
    for (args, code, needle) in cases {
        let out = hotprobe(&args);
        assert_error(&out, code, needle);
    }
}

#[test]
fn bad_inputs_on_an_attached_target_leave_it_running() {
    let mut s = Serve::start();
    let before = s.text();
    let pid = s.pid.to_string();
    let bin = target();
    let module = bin.file_name().unwrap().to_str().unwrap();
    let plt = format!("{module}:{:#x}", plt_link_addr(&bin) + 0x10);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["count", "computee", "-p", &pid],
            "similar names: compute",
        ),
        (
            vec!["count", "compute", "compute+1", "-p", &pid],
            "middle of an instruction",
        ),
        (vec!["count", "compute", &plt, "-p", &pid], "PLT"),
        (
            vec!["count", "compute", "comp ute+", "-p", &pid],
            "bad probe spec",
        ),
        (
            vec![
                "trace",
                "--mechanism",
                "trap",
                "compute",
                "compute+4",
                "-p",
                &pid,
            ],
            "whole functions",
        ),
        (
            vec!["count", "nosuchlib:compute", "-p", &pid],
            "no module `nosuchlib`",
        ),
    ];
    for (args, needle) in cases {
        let out = hotprobe(&args);
        // Bad input (a malformed spec) is exit code 2, as a usage error.
        let code = if needle == "bad probe spec" { 2 } else { 1 };
        assert_error(&out, code, needle);
        s.check_healthy(3);
    }
    assert!(s.text_unchanged(&before), "text changed");
}

#[test]
fn permission_denied_is_one_line() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        if std::env::var_os("HOTPROBE_SKIP_ROOT").is_some_and(|v| v == "1") {
            eprintln!(
                "SKIPPED LOUDLY: needs root to run hotprobe as another user (HOTPROBE_SKIP_ROOT=1)"
            );
            return;
        }
        panic!("needs root to run hotprobe as another user (set HOTPROBE_SKIP_ROOT=1 to skip)");
    }
    let mut s = Serve::start();
    let pid = s.pid.to_string();
    // A copy nobody can run wherever the checkout is (its folders may be
    // closed to other users).
    let dir = hotprobe_testkit::TempDir::new("as-nobody");
    let bin = dir.path().join("hotprobe");
    std::fs::copy(HOTPROBE, &bin).unwrap();
    use std::os::unix::fs::PermissionsExt;
    for p in [dir.path(), bin.as_path()] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    use std::os::unix::process::CommandExt;
    let out = Command::new(&bin)
        .args(["count", "compute", "-p", &pid])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run hotprobe as nobody");
    assert_error(&out, 1, "not permitted to ptrace");
    s.check_healthy(2);
}

#[test]
fn list_finds_compute_at_nms_address() {
    let bin = target();
    let nm = Command::new("nm").arg(&bin).output().unwrap();
    let nm_addr = text(&nm.stdout)
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] == "compute").then(|| u64::from_str_radix(f[0], 16).unwrap())
        })
        .unwrap();
    let out = hotprobe(&["list", bin.to_str().unwrap(), "comp*"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let line = stdout
        .lines()
        .find(|l| l.ends_with(" compute"))
        .unwrap_or_else(|| panic!("{stdout}"));
    let addr = u64::from_str_radix(
        line.split_whitespace()
            .next()
            .unwrap()
            .trim_start_matches("0x"),
        16,
    )
    .unwrap();
    assert_eq!(addr, nm_addr, "{stdout}");
    // A plain -O2 build: the fast path's jump mechanism, with its reason.
    assert!(
        line.contains(" jump ") && line.contains("bytes of relocatable instructions"),
        "{line}"
    );
    // The blacklist of the file shows its PLT.
    let out = hotprobe(&["list", bin.to_str().unwrap(), "--blacklist"]);
    let stdout = text(&out.stdout);
    let plt = format!("{:#018x}", plt_link_addr(&bin));
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with(&plt) && l.contains("PLT")),
        "{stdout}"
    );
}

#[test]
fn list_of_a_process_and_its_blacklist() {
    let mut s = Serve::start();
    let before = s.text();
    let pid = s.pid.to_string();
    let out = hotprobe(&["list", "-p", &pid, "getpid"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("libc.so.6") && l.ends_with(" getpid")),
        "{stdout}"
    );
    let out = hotprobe(&["list", "-p", &pid, "--blacklist"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", s.pid)).unwrap();
    // A PLT range of the main executable, inside its mappings.
    let line = stdout
        .lines()
        .find(|l| l.contains("PLT stubs of target"))
        .unwrap_or_else(|| panic!("{stdout}"));
    let start = u64::from_str_radix(
        line.split_whitespace()
            .next()
            .unwrap()
            .trim_start_matches("0x"),
        16,
    )
    .unwrap();
    assert!(
        maps.lines().any(|l| {
            let (a, b) = l
                .split_whitespace()
                .next()
                .unwrap()
                .split_once('-')
                .unwrap();
            let (a, b) = (
                u64::from_str_radix(a, 16).unwrap(),
                u64::from_str_radix(b, 16).unwrap(),
            );
            (a..b).contains(&start) && l.contains("target")
        }),
        "{line} not in\n{maps}"
    );
    s.check_healthy(2);
    assert!(s.text_unchanged(&before), "text changed");
}

#[test]
fn demo_traces_its_program() {
    let out = hotprobe(&["demo"]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", text(&out.stderr));
    for needle in [
        "# DURATION",
        "| parse(",
        "|   square(",
        "} /* compute */ = 9",
        "fib(5) = 5",
        "} /* fib */ = 5",
    ] {
        assert!(stdout.contains(needle), "{needle:?} in:\n{stdout}");
    }
    assert_eq!(hits(&stdout, "fib"), 15, "{stdout}");
    assert_eq!(hits(&stdout, "compute"), 3, "{stdout}");
}

#[test]
fn ctrl_c_detaches_and_the_target_runs_on_unchanged() {
    let mut s = Serve::start();
    let before = s.text();
    let mut hp = Command::new(HOTPROBE)
        .args(["count", "compute", "-p", &s.pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = line_reader(hp.stderr.take().unwrap());
    let attached = format!("attached to pid {}: 1 probes", s.pid);
    loop {
        let l = err.recv_timeout(WAIT).expect("hotprobe says it attached");
        if l.contains(&attached) {
            break;
        }
    }
    s.check_answers(5);
    // SAFETY: sending a signal to our own child.
    assert_eq!(unsafe { libc::kill(hp.id() as i32, libc::SIGINT) }, 0);
    let mut stdout = String::new();
    std::io::Read::read_to_string(&mut hp.stdout.take().unwrap(), &mut stdout).unwrap();
    let status = hp.wait().unwrap();
    let rest: Vec<String> = err.iter().collect();
    assert!(status.success(), "{status:?} {rest:?}");
    assert_eq!(hits(&stdout, "compute"), 5, "{stdout}");
    assert!(
        rest.iter().any(|l| l.contains("interrupted: detached")),
        "{rest:?}"
    );
    s.check_healthy(4);
    assert!(s.text_unchanged(&before), "text changed after Ctrl-C");
}

#[test]
fn duration_stops_an_attached_count() {
    let mut s = Serve::start();
    let before = s.text();
    let out = hotprobe(&[
        "count",
        "compute",
        "-p",
        &s.pid.to_string(),
        "--duration",
        "0.3",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(hits(&text(&out.stdout), "compute"), 0);
    assert!(text(&out.stderr).contains("duration elapsed"));
    s.check_healthy(2);
    assert!(s.text_unchanged(&before), "text changed");
}

#[test]
fn ctrl_c_during_a_traced_call_puts_the_return_address_back() {
    let mut s = Serve::start();
    let before = s.text();
    let mut hp = Command::new(HOTPROBE)
        .args(["trace", "--args", "1", "slow", "-p", &s.pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = line_reader(hp.stderr.take().unwrap());
    let out = line_reader(hp.stdout.take().unwrap());
    while !err
        .recv_timeout(WAIT)
        .expect("hotprobe says it attached")
        .contains("attached to pid")
    {}
    // slow(800) sleeps in the traced call; interrupt once it was entered.
    writeln!(s.stdin, "slow 800").unwrap();
    s.stdin.flush().unwrap();
    while !out
        .recv_timeout(WAIT)
        .expect("the entry line")
        .ends_with("slow(800) {")
    {}
    // SAFETY: sending a signal to our own child.
    assert_eq!(unsafe { libc::kill(hp.id() as i32, libc::SIGINT) }, 0);
    assert!(hp.wait().unwrap().success());
    // The call returns to its real caller after the detach.
    let l = s.lines.recv_timeout(WAIT).expect("slow returns");
    assert_eq!(l, "slow(800) = 800");
    assert!(s.lines.recv_timeout(WAIT).unwrap().starts_with("done slow"));
    s.check_healthy(3);
    assert!(s.text_unchanged(&before), "text changed");
}
