//! Test support: compile the C tracees in tests/programs with gcc at test
//! time, spawn them under a Session with captured output.
#![allow(dead_code)]

use hotprobe::{Session, SpawnOptions, TargetId};
use std::path::{Path, PathBuf};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Compile tests/programs/NAME.c with `flags` (cached by flags), return the binary.
pub fn program(name: &str, flags: &[&str]) -> PathBuf {
    let src = repo_root().join("tests/programs").join(format!("{name}.c"));
    let tag: String = flags
        .join("")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("programs");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{name}-{tag}"));
    let flags: Vec<&str> = flags.iter().copied().chain(["-g"]).collect();
    hotprobe_testkit::compile("gcc", &src, &out, &flags, &["-lpthread"])
}

/// A generated program of `n` functions `f0`…`f{n-1}` (`long fI(long x)`:
/// adds `x` to a volatile global, returns `x + I`; its entry is a 7-byte
/// `add %rdi, sink(%rip)`), `main` calling `fI(I)` `calls(I)` times and
/// printing `sum S`; built with `gcc -O1` into the test's tmp dir `name`.
pub fn many_functions(name: &str, n: usize, calls: fn(usize) -> usize) -> PathBuf {
    use std::fmt::Write as _;
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let mut src = String::from("#include <stdio.h>\nvolatile long sink;\n");
    for i in 0..n {
        writeln!(
            src,
            "__attribute__((noinline)) long f{i}(long x) {{ sink += x; return x + {i}; }}"
        )
        .unwrap();
    }
    src.push_str("int main(void) {\n  long s = 0;\n");
    for i in 0..n {
        for _ in 0..calls(i) {
            writeln!(src, "  s += f{i}({i});").unwrap();
        }
    }
    src.push_str("  printf(\"sum %ld\\n\", s);\n  return 0;\n}\n");
    let c = hotprobe_testkit::write_source(&dir, "many.c", &src);
    hotprobe_testkit::compile("gcc", &c, &dir.join("many"), &["-O1"], &[])
}

/// A spawned tracee whose stdout goes to a file.
pub struct Captured {
    pub session: Session,
    pub target: TargetId,
    pub out: PathBuf,
}

impl Captured {
    /// Everything the tracee printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

/// Spawn `bin args` under a new session, stdout captured.
pub fn spawn(bin: &Path, args: &[&str]) -> Captured {
    spawn_with_stdin(bin, args, None)
}

/// [`spawn`] with the tracee's stdin read from `stdin` (a pipe's read end,
/// say) when given.
pub fn spawn_with_stdin(bin: &Path, args: &[&str], stdin: Option<std::fs::File>) -> Captured {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "out-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let f = std::fs::File::create(&out).unwrap();
    let mut session = Session::new();
    let args: Vec<std::ffi::OsString> = args.iter().map(|a| a.into()).collect();
    let target = session
        .spawn_with(
            bin,
            &args,
            &SpawnOptions {
                stdin,
                stdout: Some(f),
                ..Default::default()
            },
        )
        .expect("spawn");
    Captured {
        session,
        target,
        out,
    }
}

static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Lines of `out` that start with `prefix`.
pub fn lines_with<'a>(out: &'a str, prefix: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.starts_with(prefix)).collect()
}

/// Runs `session` until target `t` runs untraced, after its `start`: a
/// release refused then (a thread start or a library load still queued,
/// now and then under load) is tried again by the run loop, tens of
/// milliseconds later. The loop's waits are bounded to 1 ms meanwhile,
/// and it is interrupted once the process's tasks have no tracer (watched
/// by a thread that reads their status, yielding between reads), or once
/// the process ended while released (a program that ends when released
/// may do so before the watcher looks). Panics if
/// that takes a minute, or the run ends otherwise.
pub fn run_until_untraced(session: &mut Session, t: TargetId) {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::{Duration, Instant};
    if session.is_untraced(t) {
        return;
    }
    let pid = session.pid(t).expect("a process");
    let released = std::sync::Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(60);
    let watcher = {
        let released = released.clone();
        std::thread::spawn(move || {
            while Instant::now() < deadline {
                // Gone: it ended (the run loop says how).
                let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
                    break;
                };
                let untraced = tasks.filter_map(Result::ok).all(|task| {
                    std::fs::read_to_string(task.path().join("status"))
                        .unwrap_or_default()
                        .lines()
                        .any(|l| l.split_whitespace().eq(["TracerPid:", "0"]))
                });
                if untraced {
                    break;
                }
                std::thread::yield_now();
            }
            released.store(true, Ordering::Relaxed);
        })
    };
    session.set_wait_deadline(Some(Instant::now()));
    let end = session.run_until(&released);
    session.set_wait_deadline(None);
    watcher.join().unwrap();
    match end.unwrap() {
        hotprobe::RunEnd::Interrupted => assert!(
            session.is_untraced(t),
            "pid {pid} not untraced after a minute"
        ),
        // Released, it ran to its end before the watcher looked (a
        // program that waits for its release, then ends; under load).
        hotprobe::RunEnd::AllExited => assert!(
            session.ended_untraced(t),
            "pid {pid} ended traced, never released"
        ),
        other => panic!("pid {pid}: the run ended before its release: {other:?}"),
    }
}
