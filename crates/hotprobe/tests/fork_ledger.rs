//! What a forked child gets back is one walk of its parent's code ledger
//! (issue 21). A program with probes of four mechanisms — the trap (entry
//! and `%return`), the in-process trap, the fast path's patch call and its
//! jump — forks; its child waits for a line on its standard input before
//! it calls the probed functions itself.
//!
//! - Not followed: before the child goes on, every executable mapping of
//!   every file in it (the program, libc, the dynamic loader) holds the
//!   file's bytes (read through /proc/CHILD/mem); the output and both exit
//!   statuses are those of the program run unprobed, and each probe counts
//!   the parent's calls exactly.
//! - Followed (`follow_forks`): the child keeps the fast path's bytes (its
//!   agent counts through them into slots of its own) and gets its trap
//!   probes placed again; the output and exit statuses are unchanged, and
//!   each `Count` probe's counts are exact per process.

use hotprobe::{Action, MechanismChoice, Probe, ProbeId, Session, SessionConfig, SpawnOptions};
use std::cell::Cell;
use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

/// Calls of each function by the parent before the fork, after it, and
/// by the child.
const BEFORE: u64 = 10;
const AFTER: u64 = 5;
const IN_CHILD: u64 = 7;
/// The child's exit status.
const CHILD_EXIT: i32 = 7;

const SOURCE: &str = r#"
#include <stdio.h>
#include <unistd.h>
#include <sys/wait.h>
volatile long sink;
__attribute__((noinline)) long tr(long x) { sink += x; return x * 3; }
__attribute__((noinline)) long ip(long x) { sink += x * 5; return x + 1; }
__attribute__((noinline, patchable_function_entry(5, 0))) long pa(long x) { sink += x; return x ^ 5; }
__attribute__((noinline)) long ju(long x) { sink += x * 7; return x - 2; }
static long round_of(int n) {
  long s = 0;
  for (int i = 0; i < n; i++) s += tr(i) + ip(i) + pa(i) + ju(i);
  return s;
}
int main(void) {
  setvbuf(stdout, NULL, _IONBF, 0);
  printf("before %ld\n", round_of(BEFORE));
  pid_t c = fork();
  if (c == 0) {
    printf("child %d\n", (int)getpid());
    char b[8];
    if (read(0, b, sizeof b) <= 0) return 3;
    printf("child sum %ld\n", round_of(IN_CHILD));
    return CHILD_EXIT;
  }
  int st = 0;
  waitpid(c, &st, 0);
  printf("after %ld, child exited %d\n", round_of(AFTER), WIFEXITED(st) ? WEXITSTATUS(st) : -1);
  return 0;
}
"#;

/// The program, built once (a second build would replace the file under
/// the other test's process).
fn program() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(build).clone()
}

fn build() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fork_ledger");
    let src = hotprobe_testkit::write_source(&dir, "forker.c", SOURCE);
    let defines = [
        format!("-DBEFORE={BEFORE}"),
        format!("-DAFTER={AFTER}"),
        format!("-DIN_CHILD={IN_CHILD}"),
        format!("-DCHILD_EXIT={CHILD_EXIT}"),
    ];
    let mut flags: Vec<&str> = vec!["-O2", "-g"];
    flags.extend(defines.iter().map(String::as_str));
    hotprobe_testkit::compile("gcc", &src, &dir.join("forker"), &flags, &[])
        .canonicalize()
        .unwrap()
}

/// The program's output with the child's pid left out.
fn without_pid(lines: &[String]) -> Vec<String> {
    lines
        .iter()
        .map(
            |l| match l.starts_with("child ") && !l.starts_with("child sum") {
                true => "child PID".to_string(),
                false => l.clone(),
            },
        )
        .collect()
}

/// The program run unprobed, its child let go at once: its output.
fn native(bin: &Path) -> Vec<String> {
    let mut child = std::process::Command::new(bin)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    without_pid(&text.lines().map(String::from).collect::<Vec<_>>())
}

/// The probes of [`SOURCE`], one per mechanism.
struct Probes {
    trap: ProbeId,
    trap_return: ProbeId,
    in_process: ProbeId,
    handled: Rc<Cell<u64>>,
    patch: ProbeId,
    jump: ProbeId,
}

fn place(s: &mut Session, t: hotprobe::TargetId) -> Probes {
    let mut one = |spec: &str, action: Action, choice: MechanismChoice, on: &str| {
        let added = s.add_using(t, spec, action, choice).unwrap();
        let [p] = &added.placements[..] else {
            panic!("{spec}: {} placements", added.placements.len());
        };
        assert!(
            p.mechanism.to_string().starts_with(on),
            "{spec} on {} / {}, not {on}",
            p.mechanism,
            p.execution
        );
        p.id
    };
    let handled = Rc::new(Cell::new(0u64));
    let h = handled.clone();
    let handler = Probe::new().pre(move |_| h.set(h.get() + 1)).post(|_| {});
    Probes {
        trap: one("tr", Action::Count, MechanismChoice::Trap, "trap"),
        trap_return: one("tr%return", Action::Count, MechanismChoice::Trap, "trap"),
        in_process: one(
            "ip",
            Action::Handler(handler),
            MechanismChoice::Auto,
            "in-process trap",
        ),
        handled,
        patch: one("pa", Action::Count, MechanismChoice::Auto, "patch"),
        jump: one("ju", Action::Count, MechanismChoice::Auto, "jump"),
    }
}

/// The program spawned by a session (`follow`: following forks), its
/// probes placed and started; the lines it prints, and its stdin.
struct Run {
    s: Session,
    t: hotprobe::TargetId,
    probes: Probes,
    lines: Receiver<String>,
    stdin: Option<File>,
    seen_child: Arc<AtomicBool>,
}

fn start(bin: &Path, follow: bool) -> Run {
    let mut s = Session::with_config(SessionConfig {
        follow_forks: follow,
        ..Default::default()
    });
    let (in_r, in_w) = std::io::pipe().unwrap();
    let (out_r, out_w) = std::io::pipe().unwrap();
    let opts = SpawnOptions {
        stdin: Some(File::from(OwnedFd::from(in_r))),
        stdout: Some(File::from(OwnedFd::from(out_w))),
        ..Default::default()
    };
    let t = s.spawn_with(bin, &[], &opts).unwrap();
    drop(opts);
    let probes = place(&mut s, t);
    // The lines, and a flag raised at the child's first one.
    let seen_child = Arc::new(AtomicBool::new(false));
    let (tx, lines) = std::sync::mpsc::channel();
    let seen = seen_child.clone();
    let from = hotprobe_testkit::line_reader(out_r);
    std::thread::spawn(move || {
        while let Ok(l) = from.recv() {
            let child = l.starts_with("child ");
            if tx.send(l).is_err() {
                return;
            }
            if child {
                seen.store(true, Ordering::SeqCst);
            }
        }
    });
    s.start().unwrap();
    // Waits of 1 ms: the flag is seen as soon as it is raised.
    s.set_wait_deadline(Some(std::time::Instant::now()));
    Run {
        s,
        t,
        probes,
        lines,
        stdin: Some(File::from(OwnedFd::from(in_w))),
        seen_child,
    }
}

impl Run {
    /// Runs until the child printed its pid: returns it.
    fn until_child(&mut self) -> (i32, Vec<String>) {
        let end = self.s.run_until(&self.seen_child).unwrap();
        assert_eq!(end, hotprobe::RunEnd::Interrupted);
        let mut got = Vec::new();
        loop {
            let l = self.lines.recv_timeout(Duration::from_secs(60)).unwrap();
            got.push(l.clone());
            if let Some(pid) = l.strip_prefix("child ") {
                return (pid.parse().unwrap(), got);
            }
        }
    }

    /// Lets the child go on: the line it waits for.
    fn let_the_child_go(&mut self) {
        let mut stdin = self.stdin.take().unwrap();
        stdin.write_all(b"go\n").unwrap();
    }

    /// `got` and the lines printed since, up to the parent's last one.
    fn lines_to_the_end(&self, mut got: Vec<String>) -> Vec<String> {
        loop {
            let l = self.lines.recv_timeout(Duration::from_secs(60)).unwrap();
            let last = l.starts_with("after ");
            got.push(l);
            if last {
                return got;
            }
        }
    }

    /// Lets the child go on and runs the session to the end: every line
    /// printed.
    fn run_to_the_end(&mut self, got: Vec<String>) -> Vec<String> {
        self.let_the_child_go();
        self.s.run().unwrap();
        self.lines_to_the_end(got)
    }
}

/// The files mapped executable in `pid` (those still on disk).
fn code_files(pid: i32) -> Vec<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mut files: Vec<PathBuf> = maps
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let path = Path::new(w.get(5)?);
            (w.len() == 6 && w[1].contains('x') && path.is_file()).then(|| path.to_path_buf())
        })
        .collect();
    files.sort();
    files.dedup();
    files
}

#[test]
fn an_unfollowed_child_gets_the_files_code_back_from_the_ledger() {
    let bin = program();
    let mut run = start(&bin, false);
    let (child, got) = run.until_child();
    let files = code_files(child);
    assert!(files.contains(&bin), "{files:?}");
    assert!(files.len() >= 3, "the program, libc, the loader: {files:?}");
    for f in &files {
        let diffs = hotprobe_testkit::text_differences(child as u32, f);
        assert_eq!(
            diffs,
            vec![],
            "child {child}: {} is not the file's",
            f.display()
        );
    }
    // The parent still has its probes' bytes.
    let parent = run.s.pid(run.t).unwrap();
    assert_ne!(
        hotprobe_testkit::text_differences(parent as u32, &bin),
        vec![],
        "the parent lost its probes"
    );
    let got = run.run_to_the_end(got);
    assert_eq!(without_pid(&got), native(&bin));
    assert!(got
        .iter()
        .any(|l| l.ends_with(&format!("child exited {CHILD_EXIT}"))));
    assert_eq!(
        run.s.exit_status(run.t),
        Some(hotprobe_target::ExitStatus::Code(0))
    );
    let p = &run.probes;
    let calls = BEFORE + AFTER;
    for (name, id) in [("tr", p.trap), ("pa", p.patch), ("ju", p.jump)] {
        let st = run.s.stats(id).unwrap();
        assert_eq!((st.hits, st.nmissed), (calls, 0), "{name}: {st:?}");
    }
    let st = run.s.stats(p.trap_return).unwrap();
    assert_eq!((st.returns, st.nmissed), (calls, 0), "tr%return: {st:?}");
    let st = run.s.stats(p.in_process).unwrap();
    assert_eq!((st.hits, p.handled.get()), (calls, calls), "ip: {st:?}");
}

#[test]
fn a_followed_child_keeps_the_fast_paths_code_and_counts_exactly() {
    let bin = program();
    let mut run = start(&bin, true);
    let (child, got) = run.until_child();
    // It keeps the fast path's code (the patch call, the jump) and has
    // its own trap probes' int3s.
    let diffs = hotprobe_testkit::text_differences(child as u32, &bin);
    assert!(diffs.len() >= 2, "child {child}: {diffs:?}");
    let got = run.run_to_the_end(got);
    assert_eq!(without_pid(&got), native(&bin));
    assert!(got
        .iter()
        .any(|l| l.ends_with(&format!("child exited {CHILD_EXIT}"))));
    assert_eq!(
        run.s.exit_status(run.t),
        Some(hotprobe_target::ExitStatus::Code(0))
    );
    let parent = run.s.pid(run.t).unwrap();
    let p = &run.probes;
    let per_process = |id: ProbeId, returns: bool| {
        let mut v: Vec<(i32, u64)> = run
            .s
            .stats_by_process(id)
            .unwrap()
            .into_iter()
            .map(|(pid, st)| {
                assert_eq!(st.nmissed, 0, "{pid}: {st:?}");
                (pid, if returns { st.returns } else { st.hits })
            })
            .collect();
        v.sort();
        v
    };
    let mut expected = vec![(parent, BEFORE + AFTER), (child, IN_CHILD)];
    expected.sort();
    for (name, id, returns) in [
        ("tr", p.trap, false),
        ("tr%return", p.trap_return, true),
        ("pa", p.patch, false),
        ("ju", p.jump, false),
    ] {
        assert_eq!(per_process(id, returns), expected, "{name}");
    }
}

/// A followed child detached while it waits: its ledger holds what it
/// inherited from its parent's fast path next to its own `int3`s, and
/// the one walk at the detach puts the file's bytes back in it (and in
/// the parent); both run on, unprobed, to their usual end.
#[test]
fn detaching_a_followed_child_puts_back_what_it_inherited() {
    let bin = program();
    let mut run = start(&bin, true);
    let (child, got) = run.until_child();
    let parent = run.s.pid(run.t).unwrap();
    assert_ne!(
        hotprobe_testkit::text_differences(child as u32, &bin),
        vec![]
    );
    run.s.detach().unwrap();
    for pid in [parent, child] {
        for f in code_files(pid) {
            let diffs = hotprobe_testkit::text_differences(pid as u32, &f);
            assert_eq!(
                diffs,
                vec![],
                "pid {pid}: {} is not the file's",
                f.display()
            );
        }
    }
    run.let_the_child_go();
    let got = run.lines_to_the_end(got);
    assert_eq!(without_pid(&got), native(&bin));
}
