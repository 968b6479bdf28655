//! `hotprobe guest` against a real Debian kernel booted under QEMU TCG (the
//! boot harness of hotprobe-guest's tests): `count` equals the getppid calls
//! the guest workload made, `%return` counts, `trace` shows the returned
//! error, Ctrl-C detaches and the guest runs on. One boot for all.

#[path = "../../hotprobe-guest/tests/guest/harness.rs"]
mod harness;

use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use harness::Guest;

mod common;
use common::{line_reader, HOTPROBE};
const LONG: Duration = Duration::from_secs(120);

struct Run {
    child: Child,
    out: Receiver<String>,
    err: Receiver<String>,
}

impl Run {
    fn start(g: &Guest, args: &[&str]) -> Run {
        let mut child = Command::new(HOTPROBE)
            .arg("guest")
            .arg("--gdb")
            .arg(format!("unix:{}", g.gdb_socket.display()))
            .arg("--symbols")
            .arg(g.kallsyms_file())
            .arg("--ram")
            .arg(&g.ram_file)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = line_reader(child.stdout.take().unwrap());
        let err = line_reader(child.stderr.take().unwrap());
        let mut r = Run { child, out, err };
        let l = r.wait_err("hotprobe: attached to");
        eprintln!("{l}");
        r
    }

    fn wait_err(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + LONG;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.err.recv_timeout(left) {
                Ok(l) if l.contains(needle) => return l,
                Ok(l) => eprintln!("stderr: {l}"),
                Err(e) => panic!("{needle:?} never came on stderr: {e}"),
            }
        }
    }

    /// Ctrl-C, then the exit status and the whole stdout.
    fn interrupt(mut self) -> (bool, Vec<String>, Vec<String>) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGINT) };
        let ok = self.child.wait().unwrap().success();
        let out: Vec<String> = self.out.try_iter().collect();
        let err: Vec<String> = self.err.try_iter().collect();
        (ok, out, err)
    }
}

fn cols<'a>(out: &'a [String], label: &str) -> Vec<&'a str> {
    out.iter()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|c| c.first() == Some(&label) && c.len() >= 5)
        .unwrap_or_else(|| panic!("no row {label} in {out:#?}"))
}

#[test]
fn guest_count_and_trace_from_the_command_line() {
    if let Some(why) = harness::missing_prerequisite() {
        eprintln!(
            "\n!!!!!!!! SKIPPED guest_count_and_trace_from_the_command_line: {why} !!!!!!!!\n"
        );
        return;
    }
    let mut g = Guest::boot("cli");

    // count: getppid entries, openat returns.
    let run = Run::start(
        &g,
        &["count", "__x64_sys_getppid", "__x64_sys_openat%return"],
    );
    g.send_line("getppid 33");
    g.wait_for("@getppid 33 done", LONG);
    g.send_line("open /tmp/probe-me.txt");
    g.wait_for("@open /tmp/probe-me.txt fd=", LONG);
    let (ok, out, err) = run.interrupt();
    eprintln!("{}\n{}", out.join("\n"), err.join("\n"));
    assert!(ok, "hotprobe guest count exits 0 on Ctrl-C");
    assert_eq!(
        cols(&out, "__x64_sys_getppid")[2],
        "33",
        "count == getppid calls made"
    );
    assert_eq!(
        cols(&out, "__x64_sys_openat%return")[2],
        "1",
        "one openat returned"
    );
    assert!(
        err.iter().any(|l| l.contains("interrupted: detached")),
        "{err:?}"
    );

    // The guest runs on without probes.
    g.send_line("getppid 3");
    g.wait_for("@getppid 3 done", LONG);

    // trace: the returned error of a failing open.
    let run = Run::start(&g, &["trace", "--args", "1", "__x64_sys_openat"]);
    g.send_line("open /tmp/no-such-file");
    g.wait_for("@open /tmp/no-such-file fd=-2", LONG);
    std::thread::sleep(Duration::from_millis(300));
    let (ok, out, _) = run.interrupt();
    eprintln!("{}", out.join("\n"));
    assert!(ok);
    assert!(out.first().is_some_and(|l| l.starts_with("# DURATION")));
    assert!(
        out.iter()
            .any(|l| l.contains("__x64_sys_openat(0x") && l.ends_with('{')),
        "entry line with the pt_regs pointer: {out:#?}"
    );
    assert!(
        out.iter()
            .any(|l| l.contains("} /* __x64_sys_openat */ = -2")),
        "return line with -ENOENT: {out:#?}"
    );
    g.send_line("getppid 2");
    g.wait_for("@getppid 2 done", LONG);
}
