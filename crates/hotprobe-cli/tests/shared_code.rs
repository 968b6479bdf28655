//! Code shared with another tool: a kernel uprobe (bpftrace's) placed on
//! an instruction hotprobe rewrote writes its `int3` over the first byte of
//! hotprobe's jump, and puts the file's byte back when it goes. Detaching,
//! hotprobe puts the original back only where its own bytes still are,
//! names each site another writer changed, and leaves the program running
//! its original code: the uprobe still there counts the calls made after
//! the detach, the one gone left the original bytes, and the program's
//! output is its own (docs/DESIGN.md, "Code shared with other tools").
//! A program that crashes on a uprobe placed over hotprobe's jump gets a
//! notice naming the uprobe's file and the process holding it.
//!
//! Needs root and bpftrace (scripts/setup.sh installs it); a missing one
//! fails the test, it is never skipped.

mod common;

use common::text;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);

/// The test program, built as `name`: each test has its own file, since a
/// uprobe is on a file and reaches every process mapping it.
fn program(name: &str) -> PathBuf {
    program_with(name, &[])
}

fn program_with(name: &str, flags: &[&str]) -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let flags: Vec<&str> = ["-O2"].iter().chain(flags).copied().collect();
    common::gcc(&dir.join("shared_code.c"), &out, &flags)
}

/// The run-time address of function `name` of `exe` in process `pid`
/// (the program is PIE: its first mapping plus the symbol's value).
fn address(pid: i32, exe: &Path, name: &str) -> u64 {
    let nm = Command::new("nm").arg(exe).output().expect("nm runs");
    let value = text(&nm.stdout)
        .lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            let (v, _, n) = (w.next()?, w.next()?, w.next()?);
            (n == name).then(|| u64::from_str_radix(v, 16).unwrap())
        })
        .unwrap_or_else(|| panic!("no {name} in {}", exe.display()));
    let exe = std::fs::canonicalize(exe).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let base = maps
        .lines()
        .find(|l| l.ends_with(exe.to_str().unwrap()))
        .and_then(|l| l.split('-').next())
        .map(|s| u64::from_str_radix(s, 16).unwrap())
        .expect("the program's first mapping");
    base + value
}

fn bytes(pid: i32, addr: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, addr).unwrap();
    b
}

/// SIGINT to `pid`, as a terminal's Ctrl-C sends it.
fn sigint(pid: u32) {
    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGINT) }, 0);
}

/// Waits until `what` holds, or fails naming `doing`.
fn wait_for(doing: &str, mut what: impl FnMut() -> bool) {
    let deadline = Instant::now() + LIMIT;
    while !what() {
        assert!(Instant::now() < deadline, "timed out: {doing}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `c`'s exit status, killing it and failing if it takes longer than
/// [`LIMIT`].
fn wait_child(c: &mut Child, what: &str) -> ExitStatus {
    let deadline = Instant::now() + LIMIT;
    loop {
        if let Some(st) = c.try_wait().unwrap() {
            return st;
        }
        if Instant::now() > deadline {
            let _ = c.kill();
            let _ = c.wait();
            panic!("timed out waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The next line from `lines`, within [`LIMIT`].
fn next_line(lines: &Receiver<String>, what: &str) -> String {
    lines
        .recv_timeout(LIMIT)
        .unwrap_or_else(|e| panic!("no line from {what}: {e}"))
}

/// Every line left in `lines` (its writer closed), appended to `all`.
fn drain(lines: &Receiver<String>, all: &mut String) {
    while let Ok(l) = lines.recv_timeout(LIMIT) {
        all.push_str(&l);
        all.push('\n');
    }
}

/// bpftrace, killed if the test fails before [`Bpftrace::stop`].
struct Bpftrace(Option<Child>);

impl Drop for Bpftrace {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Bpftrace {
    /// bpftrace counting calls of `function` of `exe`, started; its uprobe
    /// is in place once the function's first byte in `pid` is an `int3`.
    fn start(exe: &Path, function: &str, pid: i32, addr: u64) -> Bpftrace {
        let prog = format!("uprobe:{}:{function} {{ @ = count(); }}", exe.display());
        assert_ne!(
            bytes(pid, addr, 1),
            [0xcc],
            "an int3 at {function} before bpftrace starts (another bpftrace left running?)"
        );
        let mut cmd = Command::new("bpftrace");
        cmd.args(["-e", &prog])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: prctl(2) with integer arguments only, async-signal-safe,
        // between fork and exec: bpftrace dies with the test (a killed test
        // run must not leave its uprobes on the program's file).
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let mut bt = Bpftrace(Some(
            cmd.spawn()
                .expect("bpftrace runs (installed by scripts/setup.sh)"),
        ));
        let mut exited = None;
        wait_for(&format!("bpftrace's uprobe on {function}"), || {
            exited = bt.0.as_mut().unwrap().try_wait().unwrap();
            exited.is_some() || bytes(pid, addr, 1)[0] == 0xcc
        });
        assert!(exited.is_none(), "bpftrace exited: {exited:?} (needs root)");
        bt
    }

    fn pid(&self) -> u32 {
        self.0.as_ref().unwrap().id()
    }

    /// Stops bpftrace as Ctrl-C does and returns its count.
    fn stop(mut self) -> u64 {
        let mut bt = self.0.take().unwrap();
        sigint(bt.id());
        let stdout = common::reader(bt.stdout.take().unwrap());
        wait_child(&mut bt, "bpftrace");
        text(&stdout.join().unwrap())
            .lines()
            .find_map(|l| l.strip_prefix("@: "))
            .map_or(0, |n| n.trim().parse().unwrap())
    }
}

/// `cmd` started with stdin, stdout and stderr piped.
fn spawn_piped(cmd: &mut Command) -> Child {
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command starts")
}

/// The program's output when it runs alone.
fn native(exe: &Path) -> String {
    let mut c = spawn_piped(&mut Command::new(exe));
    c.stdin.take().unwrap().write_all(b"go\n").unwrap();
    text(&c.wait_with_output().unwrap().stdout)
}

#[test]
fn detaching_keeps_a_kernel_uprobe_placed_over_a_jump_and_names_the_site() {
    let exe = program("shared_code_detach");
    let native = native(&exe);

    let mut prog = spawn_piped(&mut Command::new(&exe));
    let pid = prog.id() as i32;
    let lines = common::line_reader(prog.stdout.take().unwrap());
    assert_eq!(next_line(&lines, "the program"), "ready");
    let (work, work2) = (address(pid, &exe, "work"), address(pid, &exe, "work2"));
    let original = (bytes(pid, work, 8), bytes(pid, work2, 8));

    let mut hp = Command::new(common::HOTPROBE)
        .args(["count", "--mechanism", "jump", "work", "work2", "-p"])
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let hp_out = common::reader(hp.stdout.take().unwrap());
    let hp_err = common::line_reader(hp.stderr.take().unwrap());
    let mut err = String::new();
    wait_for("hotprobe's probes", || {
        while let Ok(l) = hp_err.try_recv() {
            err.push_str(&l);
            err.push('\n');
        }
        let gone = hp.try_wait().unwrap();
        assert!(gone.is_none(), "hotprobe ended: {gone:?}\n{err}");
        err.contains("attached to pid")
    });
    assert_eq!(bytes(pid, work, 1), [0xe9], "work: a jump\n{err}");
    assert_eq!(bytes(pid, work2, 1), [0xe9], "work2: a jump\n{err}");
    let jumps = (bytes(pid, work, 8), bytes(pid, work2, 8));

    // A uprobe on work2 comes and goes: its int3 goes over the jump's
    // first byte, and the file's original byte comes back in its place.
    let bt2 = Bpftrace::start(&exe, "work2", pid, work2);
    assert_eq!(bytes(pid, work2, 8)[1..], jumps.1[1..]);
    assert_eq!(bt2.stop(), 0, "work2 was not called meanwhile");
    wait_for("the file's byte back at work2", || {
        bytes(pid, work2, 1) == original.1[..1]
    });
    // A uprobe on work stays.
    let bt = Bpftrace::start(&exe, "work", pid, work);
    assert_eq!(bytes(pid, work, 8)[1..], jumps.0[1..]);

    // hotprobe detaches (Ctrl-C).
    sigint(hp.id());
    wait_child(&mut hp, "hotprobe");
    drain(&hp_err, &mut err);
    let out = text(&hp_out.join().unwrap());
    assert!(err.contains("detached from pid"), "{err}");
    let notice = |name: &str| {
        err.lines()
            .find(|l| l.contains(&format!("the probe site {name} ")))
            .unwrap_or_else(|| panic!("no notice for {name}:\n{err}"))
    };
    let (n1, n2) = (notice("work"), notice("work2"));
    assert!(
        n1.contains("hotprobe left e9 ")
            && n1.contains("found cc ")
            && n1.contains("its int3 was kept, over the original instructions"),
        "{n1}"
    );
    let byte0 = format!("{:02x}", original.1[0]);
    assert!(
        n2.contains("hotprobe left e9 ")
            && n2.contains(&format!("found {byte0} "))
            && n2.contains("the original bytes were put back"),
        "{n2}"
    );
    assert_eq!(err.matches("changed by another writer").count(), 2, "{err}");
    assert!(out.contains("work2"), "the table is printed:\n{out}");

    // Only hotprobe's bytes were taken out: work keeps the uprobe's int3
    // over its original instructions, work2 is the original.
    assert_eq!(bytes(pid, work, 1), [0xcc]);
    assert_eq!(bytes(pid, work, 8)[1..], original.0[1..]);
    assert_eq!(bytes(pid, work2, 8), original.1);

    // The program runs its second round: the uprobe counts each call of
    // work, and the program's output is its own.
    prog.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let status = wait_child(&mut prog, "the program");
    let mut rest = String::new();
    drain(&lines, &mut rest);
    assert!(status.success(), "{status:?}");
    assert_eq!(format!("ready\n{rest}"), native);
    assert_eq!(
        bt.stop(),
        5,
        "bpftrace counted the 5 calls of the second round"
    );
}

#[test]
fn a_crash_on_a_kernel_uprobe_placed_over_a_jump_names_the_uprobe() {
    let exe = program("shared_code_crash");
    let mut hp = spawn_piped(
        Command::new(common::HOTPROBE)
            .args(["count", "--mechanism", "jump", "work", "--"])
            .arg(&exe),
    );
    let hp_err = common::line_reader(hp.stderr.take().unwrap());
    let out = common::line_reader(hp.stdout.take().unwrap());
    assert_eq!(next_line(&out, "the program under hotprobe"), "ready");
    let mut err = String::new();
    let pid: i32 = loop {
        let l = next_line(&hp_err, "hotprobe");
        err.push_str(&l);
        err.push('\n');
        if let Some(p) = l
            .strip_prefix("hotprobe: started pid ")
            .and_then(|s| s.split(':').next())
        {
            break p.parse().unwrap();
        }
    };
    let work = address(pid, &exe, "work");
    assert_eq!(bytes(pid, work, 1), [0xe9], "work: a jump");

    let bt = Bpftrace::start(&exe, "work", pid, work);
    // The program calls work again: the kernel runs work's first
    // instruction out of line and resumes inside hotprobe's jump.
    hp.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let status = wait_child(&mut hp, "hotprobe");
    drain(&hp_err, &mut err);
    let signal = status.code().map(|c| c - 128);
    assert!(
        matches!(signal, Some(4 | 5 | 7 | 11)),
        "the program crashed (SIGILL, SIGTRAP, SIGBUS or SIGSEGV): {status:?}\n{err}"
    );
    let notice = err
        .lines()
        .find(|l| l.contains("kernel uprobes sit on instructions hotprobe rewrote"))
        .unwrap_or_else(|| panic!("no notice:\n{err}"));
    assert!(
        notice.contains(&format!("pid {pid} was killed by signal"))
            && notice.contains(&format!(
                "rewrote: work [shared_code_crash] at {work:#x}, held by bpftrace (pid {});",
                bt.pid()
            )),
        "{notice}"
    );
    assert_eq!(bt.stop(), 1, "the uprobe was hit once");
}

/// A uprobe placed before hotprobe arms: on a patchable build, planned from
/// the file, the placeholder in memory holds the uprobe's int3 and the
/// patch is refused with that reason; the other function is patched and
/// counted, and the program's output is its own.
#[test]
fn a_patch_placeholder_under_a_kernel_uprobe_is_refused() {
    let exe = program_with("shared_code_patchable", &["-fpatchable-function-entry=5"]);
    let native = native(&exe);
    // A process of the program waits while bpftrace's uprobe goes in.
    let mut waiting = Command::new(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let pid = waiting.id() as i32;
    let work = address(pid, &exe, "work");
    let bt = Bpftrace::start(&exe, "work", pid, work);

    let mut hp = spawn_piped(
        Command::new(common::HOTPROBE)
            .args(["count", "work*", "--"])
            .arg(&exe),
    );
    let (out, err) = (
        common::reader(hp.stdout.take().unwrap()),
        common::reader(hp.stderr.take().unwrap()),
    );
    hp.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let status = wait_child(&mut hp, "hotprobe");
    let (stdout, stderr) = (text(&out.join().unwrap()), text(&err.join().unwrap()));
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "skipping work: cannot use the patch mechanism for work: its placeholder is no NOP \
             in memory (cc "
        ),
        "{stderr}"
    );
    let table = common::CountTable::parse(&stdout, &stderr);
    assert_eq!(table.hits("work2"), 10, "{stdout}");
    assert!(table.execution("work2").starts_with("patch"), "{stdout}");
    assert_eq!(common::program_output(&stdout), native);
    assert_eq!(bt.stop(), 10, "the uprobe counted work's 10 calls");
    waiting.stdin.take().unwrap().write_all(b"go\n").unwrap();
    assert!(wait_child(&mut waiting, "the waiting program").success());
}
