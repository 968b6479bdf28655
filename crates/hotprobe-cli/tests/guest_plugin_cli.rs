//! `hotprobe guest (count|record) PROBE... -- qemu-system-x86_64 ...`: the
//! guest started by hotprobe with its QEMU plugin. The workload is the
//! guest's init (`rdinit=/workload`: no shell, so every getppid call is the
//! workload's). `count` equals the calls the workload made and the guest's
//! power-off ends the run; killing hotprobe while the guest waits on
//! synchronous events releases it.

#[path = "../../hotprobe-guest/tests/guest/harness.rs"]
mod harness;

use std::ffi::OsString;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

mod common;
use common::{line_reader, HOTPROBE};

const LONG: Duration = Duration::from_secs(120);

struct Run {
    child: Child,
    /// Ours, not the child's: `Child::wait` would close it, and QEMU reads
    /// it too (it inherited hotprobe's stdin).
    stdin: std::process::ChildStdin,
    out: Receiver<String>,
    err: Receiver<String>,
    stdout: Vec<String>,
    stderr: Vec<String>,
    qemu_pid: Option<i32>,
}

impl Run {
    /// `hotprobe guest ARGS --symbols KALLSYMS -- QEMU` with the workload
    /// as init.
    fn start(args: &[&str], dir: &std::path::Path) -> Run {
        Run::start_with(args, dir, true)
    }

    /// As [`Run::start`]; without `symbols`, no `--symbols`: hotprobe
    /// recovers the kernel's symbols from the `-kernel` image.
    fn start_with(args: &[&str], dir: &std::path::Path, symbols: bool) -> Run {
        let mut qemu = harness::qemu_args(dir, "rdinit=/workload");
        // No monitor socket needed here.
        let i = qemu.iter().position(|a| a == "-monitor").unwrap();
        qemu.drain(i..i + 2);
        let mut cmd = Command::new(HOTPROBE);
        cmd.arg("guest").args(args);
        if symbols {
            cmd.arg("--symbols").arg(harness::kallsyms_cached());
        }
        let mut child = cmd
            .arg("--")
            .args(&qemu as &[OsString])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = line_reader(child.stdout.take().unwrap());
        let err = line_reader(child.stderr.take().unwrap());
        let stdin = child.stdin.take().unwrap();
        let mut r = Run {
            child,
            stdin,
            out,
            err,
            stdout: Vec::new(),
            stderr: Vec::new(),
            qemu_pid: None,
        };
        let l = r.wait_err("started QEMU (pid ");
        r.qemu_pid = l
            .split("pid ")
            .nth(1)
            .and_then(|s| s.split(')').next())
            .and_then(|s| s.parse().ok());
        r
    }

    fn wait_err(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + LONG;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.err.recv_timeout(left) {
                Ok(l) => {
                    self.stderr.push(l.clone());
                    if l.contains(needle) {
                        return l;
                    }
                }
                Err(e) => panic!("{needle:?} never came on stderr: {e}; {:#?}", self.stderr),
            }
        }
    }

    /// Waits for a console line (QEMU's stdout is hotprobe's).
    fn wait_out(&mut self, needle: &str, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.out.recv_timeout(left) {
                Ok(l) => {
                    self.stdout.push(l.clone());
                    if l.contains(needle) {
                        return true;
                    }
                }
                Err(_) => return false,
            }
        }
    }

    fn send(&mut self, line: &str) {
        use std::io::Write;
        self.stdin
            .write_all(format!("{line}\n").as_bytes())
            .unwrap();
        self.stdin.flush().unwrap();
    }

    fn finish(mut self) -> (i32, Vec<String>, Vec<String>) {
        let st = self.child.wait().unwrap();
        // Until both pipes close (QEMU holds them too until it is gone).
        while let Ok(l) = self.out.recv_timeout(Duration::from_secs(10)) {
            self.stdout.push(l);
        }
        while let Ok(l) = self.err.recv_timeout(Duration::from_secs(1)) {
            self.stderr.push(l);
        }
        (
            st.code().unwrap_or(-1),
            std::mem::take(&mut self.stdout),
            std::mem::take(&mut self.stderr),
        )
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        if let Some(p) = self.qemu_pid {
            // SAFETY: kill(2) on the QEMU our hotprobe started (gone: ESRCH).
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
}

fn tmpdir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("hp-plugin-cli-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn guest_count_with_the_plugin_from_the_command_line() {
    if let Some(why) = harness::missing_prerequisite() {
        eprintln!("\n!!!!!!!! SKIPPED: {why} !!!!!!!!\n");
        return;
    }
    let dir = tmpdir("count");
    let t0 = Instant::now();
    // No --symbols: they come from the -kernel image itself.
    let mut r = Run::start_with(
        &["count", "__x64_sys_getppid", "__x64_sys_getppid%return"],
        &dir,
        false,
    );
    assert!(r.wait_out("@READY", LONG), "the workload started");
    r.send("getppid 1000");
    r.send("getppid 234");
    r.send("exit");
    let (code, out, err) = r.finish();
    eprintln!("{:?} for the run; stderr: {err:#?}", t0.elapsed());
    assert_eq!(code, 0, "QEMU powered off cleanly: {out:#?}");
    let made: u64 = out
        .iter()
        .filter_map(|l| l.trim().strip_prefix("@getppid "))
        .filter_map(|l| l.strip_suffix(" done"))
        .map(|n| n.parse::<u64>().unwrap())
        .sum();
    assert_eq!(made, 1234, "the workload's own count: {out:#?}");
    // A guest that powers off ends silently (issue 24).
    let said = |l: &String| l.contains("gone") || l.contains("disconnected");
    assert!(!err.iter().any(said), "{err:#?}");
    let row = |label: &str| -> Vec<String> {
        out.iter()
            .map(|l| l.split_whitespace().map(String::from).collect::<Vec<_>>())
            .find(|c| c.first().map(String::as_str) == Some(label))
            .unwrap_or_else(|| panic!("no row {label}: {out:#?}"))
    };
    let entry = row("__x64_sys_getppid");
    assert_eq!(entry[2].parse::<u64>().unwrap(), made, "{entry:?}");
    assert_eq!(entry[4], "plugin", "{entry:?}");
    let ret = row("__x64_sys_getppid%return");
    assert_eq!(ret[2].parse::<u64>().unwrap(), made, "{ret:?}");
    assert_eq!(ret[3], "0", "nothing missed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn killing_hotprobe_releases_a_guest_waiting_on_synchronous_events() {
    if let Some(why) = harness::missing_prerequisite() {
        eprintln!("\n!!!!!!!! SKIPPED: {why} !!!!!!!!\n");
        return;
    }
    let dir = tmpdir("sync");
    let trace = dir.join("trace");
    let trace_s = trace.to_string_lossy().into_owned();
    let mut r = Run::start(
        &["record", "--sync", "-o", &trace_s, "__x64_sys_getppid"],
        &dir,
    );
    assert!(r.wait_out("@READY", LONG), "the workload started");
    // Long enough that the loop still runs, each call waiting for
    // hotprobe's answer, when hotprobe dies.
    let n = 4_000_000;
    r.send(&format!("getppid {n}"));
    std::thread::sleep(Duration::from_millis(1500));
    let done = format!("@getppid {n} done");
    assert!(
        !r.wait_out(&done, Duration::ZERO),
        "the loop ended before hotprobe was killed: make it longer"
    );
    r.child.kill().unwrap();
    let killed = Instant::now();
    let _ = r.child.wait();
    // QEMU's console is still ours (it inherited hotprobe's stdout).
    assert!(
        r.wait_out(&done, Duration::from_secs(60)),
        "the guest went on after hotprobe died"
    );
    eprintln!(
        "released: the loop ended {:?} after the kill",
        killed.elapsed()
    );
    r.send("exit");
    assert!(
        r.wait_out("@FINAL rc=0", Duration::from_secs(30)),
        "the guest powered off"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn usage_errors_of_a_started_guest() {
    let dir = tmpdir("usage");
    let syms = dir.join("kallsyms");
    std::fs::write(
        &syms,
        "ffffffff81000000 T _stext\nffffffff81000010 T foo\nffffffff81000020 T _etext\n",
    )
    .unwrap();
    let syms = syms.to_string_lossy().into_owned();
    let run = |args: &[&str]| {
        let o = Command::new(HOTPROBE)
            .arg("guest")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["count", "foo"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("give a QEMU command line after --"), "{err}");
    let (code, err) = run(&["count", "foo", "--", "qemu-system-x86_64"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("give --symbols FILE"), "{err}");
    let q = ["--", "qemu-system-x86_64", "-accel", "kvm"];
    let (code, err) = run(&[&["count", "foo", "--symbols", &syms][..], &q].concat());
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("needs TCG"), "{err}");
    let q = ["--", "qemu-system-x86_64", "-s"];
    let (_, err) = run(&[&["count", "foo", "--symbols", &syms][..], &q].concat());
    assert!(err.contains("hotprobe adds one"), "{err}");
    let q = ["--", "qemu-system-x86_64"];
    let (code, err) = run(&[&["--gdb", "unix:/x", "count", "foo"][..], &q].concat());
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("--gdb/--ram name a running guest"), "{err}");
    // Several guests: one non-empty -- block each, for count and trace.
    let (code, err) = run(&["count", "foo", "--", "qemu-system-x86_64", "--"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("an empty QEMU command line"), "{err}");
    let two = ["--", "qemu-system-x86_64", "--", "qemu-system-x86_64"];
    let (code, err) = run(&[&["record", "-o", "/nonexistent/t", "foo"][..], &two].concat());
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("for guest count and trace only"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `[pid N] read(3, 0x7ffc..., 64) = 64` with its pointers as `PTR`.
fn without_pointers(line: &str) -> String {
    line.split(", ")
        .map(|a| {
            if a.starts_with("0x7") && a.len() > 8 {
                "PTR".to_string()
            } else {
                a.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[test]
fn guest_syscalls_of_one_pid_like_strace() {
    if let Some(why) = harness::missing_prerequisite() {
        eprintln!("\n!!!!!!!! SKIPPED: {why} !!!!!!!!\n");
        return;
    }
    let dir = tmpdir("syscalls");
    // The workload is init: pid 1. Its forked child (same name) makes
    // calls too, which the pid filter in the plugin must leave out. No
    // --symbols: symbols and the task layout (BTF) come from the image.
    // The calls go to a file: the console shares hotprobe's stdout.
    let trace = dir.join("calls.txt");
    let trace_s = trace.to_string_lossy().into_owned();
    let mut r = Run::start_with(&["syscalls", "--pid", "1", "-o", &trace_s], &dir, false);
    assert!(r.wait_out("@READY pid=1", LONG), "the workload started");
    for c in [
        "cat /init",
        "cat /no/such/file",
        "fork cat /proc/version",
        "cat /proc/self/stat",
        "exit",
    ] {
        r.send(c);
    }
    let (code, out, err) = r.finish();
    assert_eq!(code, 0, "QEMU powered off cleanly: {out:#?} {err:#?}");
    // The workload's own account of its calls.
    let cat = |path: &str| -> (i64, i64, i64) {
        let l = out
            .iter()
            .find_map(|l| l.trim().strip_prefix(&format!("@cat {path} ")))
            .unwrap_or_else(|| panic!("no @cat {path}: {out:#?}"));
        let f: Vec<i64> = l
            .split_whitespace()
            .map(|kv| kv.split('=').nth(1).unwrap().parse().unwrap())
            .collect();
        (f[0], f[1], f[2])
    };
    let child: u64 = out
        .iter()
        .find_map(|l| l.trim().strip_prefix("@fork pid="))
        .and_then(|l| l.strip_suffix(" done"))
        .unwrap_or_else(|| panic!("no @fork: {out:#?}"))
        .parse()
        .unwrap();
    let text = std::fs::read_to_string(&trace).unwrap();
    let calls: Vec<&str> = text.lines().collect();
    assert!(
        calls.iter().all(|l| l.starts_with("[pid ")),
        "only calls in the file: {calls:#?}"
    );
    assert!(
        calls.iter().all(|l| l.starts_with("[pid 1] ")),
        "only pid 1: {calls:#?}"
    );
    assert!(
        !calls.iter().any(|l| l.contains("/proc/version")),
        "the child's openat is not pid 1's: {calls:#?}"
    );
    // Console reads and writes aside, from the first cat on, in call order.
    let seq: Vec<String> = calls
        .iter()
        .filter(|l| !l.contains("] read(0, ") && !l.contains("] write(1, "))
        .skip_while(|l| !l.contains("\"/init\""))
        .map(|l| {
            let l = without_pointers(l);
            match l.strip_prefix("[pid 1] clone(0x1200011, 0x0, 0x0, ") {
                Some(rest) => format!(
                    "[pid 1] clone(0x1200011, 0x0, 0x0, TID, {}",
                    rest.split_once(", ").map_or("", |x| x.1)
                ),
                None => l,
            }
        })
        .collect();
    let (fd1, n1, rc1) = cat("/init");
    let (fd2, _, _) = cat("/no/such/file");
    let (fd3, n3, rc3) = cat("/proc/self/stat");
    assert_eq!((fd2, rc1, rc3), (-2, 0, 0));
    let expected = [
        format!("[pid 1] openat(AT_FDCWD, \"/init\", O_RDONLY) = {fd1}"),
        format!("[pid 1] read({fd1}, PTR, 64) = {n1}"),
        format!("[pid 1] close({fd1}) = 0"),
        "[pid 1] openat(AT_FDCWD, \"/no/such/file\", O_RDONLY) = -1 ENOENT".to_string(),
        // fork(): clone with SIGCHLD and the tid flags; its last argument
        // (the child tid's address) varies.
        format!("[pid 1] clone(0x1200011, 0x0, 0x0, TID, ...) = {child}"),
        format!("[pid 1] wait4({child}, NULL, 0x0, NULL) = {child}"),
        format!("[pid 1] openat(AT_FDCWD, \"/proc/self/stat\", O_RDONLY) = {fd3}"),
        format!("[pid 1] read({fd3}, PTR, 64) = {n3}"),
        format!("[pid 1] close({fd3}) = 0"),
    ];
    assert!(seq.len() >= expected.len(), "{calls:#?}");
    assert_eq!(seq[..expected.len()], expected, "{calls:#?}");
    assert!(
        err.iter().any(|l| l.contains("system calls traced")),
        "{err:#?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn guest_boot_recorded_from_the_first_instruction() {
    if let Some(why) = harness::missing_prerequisite() {
        eprintln!("\n!!!!!!!! SKIPPED: {why} !!!!!!!!\n");
        return;
    }
    let dir = tmpdir("boot");
    let trace = dir.join("trace");
    let _ = std::fs::remove_dir_all(&trace);
    let trace_s = trace.to_string_lossy().into_owned();
    let mut r = Run::start_with(
        &["record", "--boot", "-o", &trace_s, "do_one_initcall"],
        &dir,
        false,
    );
    assert!(r.wait_out("@READY", LONG), "the guest booted");
    r.send("exit");
    let (code, out, err) = r.finish();
    assert_eq!(code, 0, "QEMU powered off cleanly: {out:#?} {err:#?}");
    let json = |args: &[&str]| -> serde_json::Value {
        let o = common::hotprobe(args);
        assert!(o.status.success(), "{args:?}: {}", common::text(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let total = json(&["report", "--json", &trace_s])["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["function"] == "do_one_initcall")
        .expect("do_one_initcall in the report")["calls"]
        .as_u64()
        .unwrap();
    assert!(total > 100, "the kernel's initcalls: {total}");
    let phases = json(&["report", "--phases", "--json", &trace_s]);
    let phases = phases["phases"].as_array().unwrap();
    let names: Vec<&str> = phases.iter().map(|p| p["name"].as_str().unwrap()).collect();
    // Armed before the first instruction: the kernel's start is seen, then
    // every initcall level in order, then the end of the initcalls and the
    // first user process.
    let mut expected = vec!["start_kernel".to_string()];
    expected.extend(
        [
            "early", "pure", "core", "postcore", "arch", "subsys", "fs", "device", "late",
        ]
        .iter()
        .map(|l| format!("initcall:{l}")),
    );
    expected.push("free_initmem".into());
    expected.push("run_init_process".into());
    assert_eq!(names, expected, "{phases:#?}");
    let calls = |p: &serde_json::Value| -> u64 {
        p["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["function"] == "do_one_initcall")
            .map(|r| r["calls"].as_u64().unwrap())
            .sum()
    };
    let per_phase: Vec<u64> = phases.iter().map(calls).collect();
    assert_eq!(
        per_phase.iter().sum::<u64>(),
        total,
        "per-phase counts add up to the total: {per_phase:?}"
    );
    assert_eq!(per_phase[0], 0, "no initcall before the early level");
    assert!(per_phase[8] > 0, "device initcalls: {per_phase:?}");
    // The exporters read it.
    let chrome = dir.join("boot.json");
    let o = common::hotprobe(&[
        "export",
        "--format",
        "chrome",
        &trace_s,
        "-o",
        &chrome.to_string_lossy(),
    ]);
    assert!(o.status.success(), "{}", common::text(&o.stderr));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&chrome).unwrap()).unwrap();
    let events = v["traceEvents"]
        .as_array()
        .or_else(|| v.as_array())
        .expect("Chrome trace events");
    let initcalls = events
        .iter()
        .filter(|e| e["name"] == "do_one_initcall")
        .count() as u64;
    assert!(
        initcalls >= total,
        "{initcalls} chrome events for {total} calls"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A guest's serial console on a unix socket QEMU listens on
/// (`-serial unix:PATH,server=on,wait=off`): with several guests, hotprobe's
/// standard streams cannot be every guest's console.
struct SocketConsole {
    stream: std::os::unix::net::UnixStream,
    lines: Receiver<String>,
    seen: Vec<String>,
}

impl SocketConsole {
    fn connect(path: &std::path::Path) -> SocketConsole {
        let stream = std::os::unix::net::UnixStream::connect(path)
            .unwrap_or_else(|e| panic!("console {}: {e}", path.display()));
        let lines = line_reader(stream.try_clone().unwrap());
        SocketConsole {
            stream,
            lines,
            seen: Vec::new(),
        }
    }

    /// The first line holding `needle` (the workload's replies start with @).
    fn wait(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + LONG;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.contains(needle) {
                        return l;
                    }
                }
                Err(e) => panic!(
                    "{needle:?} never came on the console: {e}; {:#?}",
                    self.seen
                ),
            }
        }
    }

    fn send(&mut self, line: &str) {
        use std::io::Write;
        self.stream
            .write_all(format!("{line}\n").as_bytes())
            .unwrap();
    }
}

/// The test guest's QEMU command line with its console on `DIR/console.sock`.
fn qemu_with_socket_console(dir: &std::path::Path) -> Vec<OsString> {
    let mut qemu = harness::qemu_args(dir, "rdinit=/workload");
    let i = qemu.iter().position(|a| a == "-monitor").unwrap();
    qemu.drain(i..i + 2);
    let i = qemu.iter().position(|a| a == "stdio").unwrap();
    qemu[i] = format!(
        "unix:{},server=on,wait=off",
        dir.join("console.sock").display()
    )
    .into();
    qemu
}

/// Reaps what is left of a run (hotprobe, its QEMUs) if an assertion fails.
struct Reap(Vec<i32>);

impl Drop for Reap {
    fn drop(&mut self) {
        for &p in &self.0 {
            // SAFETY: kill(2) on a process this test started (or its QEMU);
            // ESRCH once gone.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
}

/// `hotprobe guest ARGS --symbols KALLSYMS -- QEMU A -- QEMU B`, each
/// guest's console on its own socket, both workloads READY.
struct TwoGuests {
    child: Child,
    out: Receiver<String>,
    err: Receiver<String>,
    stderr: Vec<String>,
    pids: Vec<i32>,
    consoles: Vec<SocketConsole>,
    dirs: [std::path::PathBuf; 2],
    _reap: Reap,
}

impl TwoGuests {
    fn start(args: &[&str], tag: &str) -> TwoGuests {
        let dirs = [tmpdir(&format!("{tag}-a")), tmpdir(&format!("{tag}-b"))];
        let mut cmd = Command::new(HOTPROBE);
        cmd.arg("guest")
            .args(args)
            .arg("--symbols")
            .arg(harness::kallsyms_cached())
            .arg("--")
            .args(qemu_with_socket_console(&dirs[0]))
            .arg("--")
            .args(qemu_with_socket_console(&dirs[1]));
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = line_reader(child.stdout.take().unwrap());
        let err = line_reader(child.stderr.take().unwrap());
        let mut stderr = Vec::new();
        let mut pids = Vec::new();
        let mut consoles = Vec::new();
        let mut reap = Reap(vec![child.id() as i32]);
        for n in 1..=2 {
            let needle = format!("guest {n}: started QEMU (pid ");
            let line = loop {
                let l = err
                    .recv_timeout(LONG)
                    .unwrap_or_else(|e| panic!("{needle:?} never came: {e}; {stderr:#?}"));
                stderr.push(l.clone());
                if l.contains(&needle) {
                    break l;
                }
            };
            let pid: i32 = line
                .split("pid ")
                .nth(1)
                .and_then(|s| s.split(')').next())
                .and_then(|s| s.parse().ok())
                .unwrap();
            reap.0.push(pid);
            pids.push(pid);
            consoles.push(SocketConsole::connect(&dirs[n - 1].join("console.sock")));
        }
        for c in &mut consoles {
            c.wait("@READY");
        }
        TwoGuests {
            child,
            out,
            err,
            stderr,
            pids,
            consoles,
            dirs,
            _reap: reap,
        }
    }

    /// Waits until hotprobe ends: its status, stdout, and the stderr lines.
    fn finish(mut self) -> (std::process::ExitStatus, Vec<String>, Vec<String>) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let status = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            assert!(
                Instant::now() < deadline,
                "hotprobe did not end: {:#?}",
                self.stderr
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let out = &self.out;
        let stdout: Vec<String> =
            std::iter::from_fn(|| out.recv_timeout(Duration::from_secs(5)).ok()).collect();
        let err = &self.err;
        self.stderr.extend(std::iter::from_fn(|| {
            err.recv_timeout(Duration::from_secs(5)).ok()
        }));
        eprintln!("stdout: {stdout:#?}\nstderr: {:#?}", self.stderr);
        for d in &self.dirs {
            let _ = std::fs::remove_dir_all(d);
        }
        (status, stdout, std::mem::take(&mut self.stderr))
    }
}

/// `hotprobe guest count PROBE -- QEMU A -- QEMU B`: two guests with
/// different workloads in one session, each counted in its own GUEST row;
/// killing guest 1's QEMU leaves guest 2 counted to its end; hotprobe then
/// prints the table and exits with the first failing guest's status
/// (guest 1's, killed: 128 + 9).
#[test]
fn two_guests_from_the_command_line() {
    if let Some(why) = harness::missing_prerequisite() {
        eprintln!("\n!!!!!!!! SKIPPED: {why} !!!!!!!!\n");
        return;
    }
    let mut two = TwoGuests::start(&["count", "__x64_sys_getppid"], "two");
    let (pids, consoles) = (two.pids.clone(), &mut two.consoles);
    consoles[0].send("getppid 300");
    consoles[1].send("getppid 500");
    consoles[0].wait("@getppid 300 done");
    consoles[1].wait("@getppid 500 done");
    // Guest 1 dies; guest 2 goes on, then powers off.
    // SAFETY: kill(2) on guest 1's QEMU.
    assert_eq!(unsafe { libc::kill(pids[0], libc::SIGKILL) }, 0);
    consoles[1].send("getppid 200");
    consoles[1].wait("@getppid 200 done");
    consoles[1].send("exit");
    consoles[1].wait("@FINAL rc=0");
    let (status, stdout, stderr) = two.finish();
    assert_eq!(
        status.code(),
        Some(128 + 9),
        "guest 1's status: its QEMU was killed"
    );
    let head: Vec<&str> = stdout[0].split_whitespace().collect();
    assert_eq!(
        head[..4],
        ["PROBE", "GUEST", "ADDRESS", "HITS"],
        "{stdout:#?}"
    );
    let rows: Vec<Vec<&str>> = stdout[1..]
        .iter()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(rows.len(), 2, "one row per guest: {stdout:#?}");
    for (row, (guest, hits)) in rows.iter().zip([("1", 300), ("2", 700)]) {
        assert_eq!(row[0], "__x64_sys_getppid", "{row:?}");
        assert_eq!(row[1], guest, "{row:?}");
        assert_eq!(
            row[3].parse::<u64>().unwrap(),
            hits,
            "guest {guest}: {row:?}"
        );
        assert_eq!(row[5], "plugin", "{row:?}");
    }
    let has = |s: &str| stderr.iter().any(|l| l.contains(s));
    assert!(has("every guest is gone"), "{stderr:#?}");
    assert!(
        has(&format!(
            "guest 1: QEMU (pid {}) was killed by signal 9",
            pids[0]
        )),
        "{stderr:#?}"
    );
    assert!(
        has(&format!(
            "guest 2: QEMU (pid {}) exited with status 0",
            pids[1]
        )),
        "{stderr:#?}"
    );
    assert!(!has("error"), "{stderr:#?}");
}

/// `hotprobe guest trace PROBE -- QEMU A -- QEMU B`: each guest's calls in
/// its own call tree, its functions labelled `[gN]`: as many entries and
/// returns per guest as its workload made; both power off: status 0.
#[test]
fn two_guests_traced_from_the_command_line() {
    if let Some(why) = harness::missing_prerequisite() {
        eprintln!("\n!!!!!!!! SKIPPED: {why} !!!!!!!!\n");
        return;
    }
    let mut two = TwoGuests::start(&["trace", "__x64_sys_getppid"], "trace2");
    let consoles = &mut two.consoles;
    consoles[0].send("getppid 3");
    consoles[1].send("getppid 5");
    consoles[0].wait("@getppid 3 done");
    consoles[1].wait("@getppid 5 done");
    for c in consoles.iter_mut() {
        c.send("exit");
        c.wait("@FINAL rc=0");
    }
    let (status, stdout, stderr) = two.finish();
    assert_eq!(
        status.code(),
        Some(0),
        "both guests powered off: {stderr:#?}"
    );
    let n = |s: &str| stdout.iter().filter(|l| l.contains(s)).count();
    for (g, calls) in [(1, 3), (2, 5)] {
        let name = format!("[g{g}] __x64_sys_getppid");
        assert_eq!(
            n(&format!("{name}(")),
            calls,
            "guest {g}'s entries: {stdout:#?}"
        );
        assert_eq!(
            n(&format!("/* {name} */")),
            calls,
            "guest {g}'s returns: {stdout:#?}"
        );
    }
    assert_eq!(
        stdout
            .iter()
            .filter(|l| l.contains("__x64_sys_getppid"))
            .count(),
        2 * (3 + 5),
        "nothing else: {stdout:#?}"
    );
}
