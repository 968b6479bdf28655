//! A real program followed through its syscalls and context switches: the
//! spans each thread (the main one, a pthread, a forked child) made are
//! attributed to it, counted exactly, and a sleep is off the CPU.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use hotprobe_kernel::{KernelOptions, KernelRecorder, SpanKind};

/// The tests count this process's perf events: one at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// This process's open perf events.
fn perf_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|l| l.to_string_lossy().contains("perf_event"))
        })
        .count()
}

/// Waits on stdin (the gate: the test opens the events first), then
/// calls getppid 7 times in the main thread, 5 times in a pthread (which
/// also sleeps 2 ms: off the CPU) and 3 times in a forked child; each
/// prints its role and tid.
const PROGRAM: &str = r#"
#include <pthread.h>
#include <stdio.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void calls(const char *who, int n) {
    for (int i = 0; i < n; i++) syscall(SYS_getppid);
    printf("%s %ld\n", who, (long)syscall(SYS_gettid));
    fflush(stdout);
}

static void *worker(void *arg) {
    (void)arg;
    struct timespec ts = {0, 2000000};
    nanosleep(&ts, 0);
    calls("thread", 5);
    return 0;
}

int main(void) {
    char c;
    if (read(0, &c, 1) != 1) return 3;
    pthread_t t;
    pthread_create(&t, 0, worker, 0);
    pthread_join(t, 0);
    pid_t child = fork();
    if (child == 0) { calls("child", 3); _exit(0); }
    waitpid(child, 0, 0);
    calls("main", 7);
    return 0;
}
"#;

fn program() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kernel-record");
    let src = hotprobe_testkit::write_source(&dir, "threads.c", PROGRAM);
    hotprobe_testkit::compile("gcc", &src, &dir.join("threads"), &["-O1", "-pthread"], &[])
}

#[test]
fn each_threads_syscalls_are_its_own_and_a_sleep_is_off_cpu() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let exe = program();
    let mut child = Command::new(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as i32;
    let rec = KernelRecorder::open(pid, KernelOptions::default()).unwrap();
    rec.enable().unwrap();
    let draining = rec.drain_in_background().unwrap();
    child.stdin.take().unwrap().write_all(b"g").unwrap();
    let mut tids: HashMap<String, u32> = HashMap::new();
    for line in std::io::BufReader::new(child.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        let (who, tid) = line.split_once(' ').unwrap();
        tids.insert(who.to_string(), tid.parse().unwrap());
    }
    assert!(child.wait().unwrap().success());
    let cap = draining.finish().unwrap();
    assert_eq!(perf_fds(), 0, "closed at the end");
    assert_eq!(tids.len(), 3, "{tids:?}");
    assert_eq!(cap.stats.lost, 0);
    assert_eq!(cap.stats.corrupt, 0);
    assert_eq!(cap.stats.threads, 1);
    let getppid = hotprobe_target::syscalls::syscall_number("getppid").unwrap();
    for (who, n) in [("main", 7), ("thread", 5), ("child", 3)] {
        let tid = tids[who];
        let calls = cap
            .spans
            .iter()
            .filter(|s| {
                s.tid == tid
                    && s.kind
                        == SpanKind::Syscall {
                            nr: getppid,
                            ret: s_ret(s),
                        }
            })
            .count();
        assert_eq!(calls, n, "{who} (tid {tid})");
    }
    // The forked child is a process of its own; the pthread is not.
    let pid_of = |tid: u32| cap.spans.iter().find(|s| s.tid == tid).unwrap().pid;
    assert_eq!(pid_of(tids["main"]), pid as u32);
    assert_eq!(pid_of(tids["thread"]), pid as u32);
    assert_eq!(pid_of(tids["child"]), tids["child"]);
    // The pthread's 2 ms sleep: a syscall span holding an off-CPU one.
    let thread = tids["thread"];
    let sleeps: Vec<_> = cap
        .spans
        .iter()
        .filter(|s| {
            s.tid == thread
                && matches!(s.kind, SpanKind::Syscall { nr, .. }
                    if matches!(hotprobe_kernel::syscall_name(nr), Some("nanosleep" | "clock_nanosleep")))
        })
        .collect();
    assert_eq!(sleeps.len(), 1, "{:?}", cap.spans);
    let sleep = sleeps[0];
    assert!(sleep.end_ns - sleep.start_ns >= 2_000_000, "{sleep:?}");
    assert!(
        cap.spans.iter().any(|s| s.tid == thread
            && matches!(s.kind, SpanKind::OffCpu { preempted: false })
            && s.start_ns >= sleep.start_ns
            && s.end_ns <= sleep.end_ns
            && s.end_ns - s.start_ns >= 1_500_000),
        "no off-CPU interval inside {sleep:?}"
    );
}

/// The span's return value (any).
fn s_ret(s: &hotprobe_kernel::KernelSpan) -> i64 {
    match s.kind {
        SpanKind::Syscall { ret, .. } => ret,
        SpanKind::OffCpu { .. } => i64::MIN,
    }
}

#[test]
fn the_fds_are_closed_when_the_recorder_goes() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let before = perf_fds();
    let mut child = Command::new("cat").stdin(Stdio::piped()).spawn().unwrap();
    let rec = KernelRecorder::open(child.id() as i32, KernelOptions::default()).unwrap();
    assert_eq!(
        perf_fds(),
        before + 2 * hotprobe_kernel::online_cpus().len()
    );
    drop(rec);
    drop(child.stdin.take());
    child.wait().unwrap();
    assert_eq!(perf_fds(), before);
}
