//! The wait state machine driven without a kernel: each case is a script of
//! the OS layer's calls and results (wait statuses, ptrace answers) for the
//! scripted fake (`os/fake.rs`); a case checks the events the target
//! reports, the threads it follows after, and that it made exactly the
//! script's calls, in order. Two scripts were recorded from real runs
//! (`tests/fixtures/*.log`, see [`record`]) and are replayed as they are;
//! the recording tests record a new run each time and replay it at once.

use crate::os::fake::FakeOs;
use crate::os::Sys;
use crate::*;
use std::io::Write;
use std::sync::{Arc, Mutex};

/// Pids no kernel hands out (`pid_max` is at most 2^22): `/proc` has none.
pub(crate) const L: i32 = 5_000_001;
pub(crate) const T2: i32 = 5_000_002;
pub(crate) const T3: i32 = 5_000_003;

/// A process target over `script`, its leader `pid`, following `tids`
/// (running).
pub(crate) fn fake_target(pid: i32, tids: &[i32], script: &str) -> (ProcessTarget, Arc<FakeOs>) {
    let os = Arc::new(FakeOs::new(script));
    let sys = Sys::with_os(os.clone());
    let mem = File::open("/dev/null").expect("/dev/null");
    let mut t = ProcessTarget::new(pid, PathBuf::from("/fake/program"), mem, true, sys);
    for tid in tids {
        t.threads.insert(*tid, Thread::new(RunState::Running));
    }
    (t, os)
}

/// An event in a line of text, as the cases and fixtures write them.
pub(crate) fn render(ev: &TargetEvent) -> String {
    match ev {
        TargetEvent::Breakpoint { thread, addr, .. } => {
            format!("breakpoint {} {:#x}", thread.0, addr.0)
        }
        TargetEvent::Stepped { thread, regs } => {
            format!("stepped {} rip={:#x}", thread.0, regs.rip)
        }
        TargetEvent::Watchpoint {
            thread,
            slots,
            regs,
        } => format!(
            "watchpoint {} slots={slots:#x} rip={:#x}",
            thread.0, regs.rip
        ),
        TargetEvent::ThreadCreated(t) => format!("thread-created {}", t.0),
        TargetEvent::ThreadExited(t) => format!("thread-exited {}", t.0),
        TargetEvent::Forked { thread, child } => format!("forked {} child {child}", thread.0),
        TargetEvent::Exec => "exec".into(),
        TargetEvent::ModulesChanged { thread } => format!("modules-changed {}", thread.0),
        TargetEvent::Exited(st) => format!("exited {st:?}"),
        TargetEvent::Timeout => "timeout".into(),
    }
}

/// The register words of a `getregs` line with `rip` (others zero).
pub(crate) fn regs_at(rip: u64) -> String {
    let mut w = ["0"; 27].map(String::from);
    w[16] = format!("{rip:x}");
    w.join(",")
}

/// What a case does to the target, in order.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op {
    /// `wait(None)`; its event is recorded.
    Wait,
    /// `stop_all()`.
    StopAll,
    /// `resume(thread, mode)`.
    Resume(i32, ResumeMode),
    /// `resume_all()`.
    ResumeAll,
}

/// One table-driven case.
pub(crate) struct Case {
    /// What it shows.
    pub(crate) name: &'static str,
    /// Threads followed at the start (running), the leader first.
    pub(crate) tids: &'static [i32],
    /// Set up before the ops (watchpoints, stopped threads).
    pub(crate) setup: fn(&mut ProcessTarget),
    /// What is done to the target.
    pub(crate) ops: &'static [Op],
    /// The OS calls expected and their results.
    pub(crate) script: String,
    /// The events reported, rendered.
    pub(crate) events: &'static [&'static str],
    /// Threads followed at the end.
    pub(crate) threads_after: &'static [i32],
}

/// Nothing set up.
pub(crate) fn no_setup(_: &mut ProcessTarget) {}

fn watch_slot0(t: &mut ProcessTarget) {
    t.watches[0] = Some(HwWatch {
        addr: 0x601000,
        len: 8,
        kind: WatchKind::Write,
    });
}

fn watch_slot1_leader_parked(t: &mut ProcessTarget) {
    t.watches[1] = Some(HwWatch {
        addr: 0x601008,
        len: 4,
        kind: WatchKind::ReadWrite,
    });
    t.threads.get_mut(&L).expect("leader").state = RunState::Parked;
}

/// Runs `case` on a scripted target and checks what it says.
pub(crate) fn run(case: &Case) {
    let (mut t, os) = fake_target(case.tids[0], case.tids, &case.script);
    (case.setup)(&mut t);
    let mut events = Vec::new();
    for op in case.ops {
        match *op {
            Op::Wait => events.push(render(&t.wait(None).expect("wait"))),
            Op::StopAll => t.stop_all().expect("stop_all"),
            Op::Resume(tid, mode) => t.resume(ThreadId(tid as u64), mode).expect("resume"),
            Op::ResumeAll => t.resume_all().expect("resume_all"),
        }
    }
    let name = case.name;
    assert_eq!(events, case.events, "{name}: events");
    assert_eq!(
        os.remaining(),
        Vec::<String>::new(),
        "{name}: calls not made"
    );
    let scripted: Vec<String> = FakeOs::new(&case.script)
        .remaining()
        .iter()
        .map(|l| {
            let call = l.split_once(": ").expect("line N: call").1;
            call.split(" = ").next().expect("call").to_string()
        })
        .collect();
    assert_eq!(os.made(), scripted, "{name}: calls made");
    let after: Vec<ThreadId> = case
        .threads_after
        .iter()
        .map(|t| ThreadId(*t as u64))
        .collect();
    assert_eq!(t.threads(), after, "{name}: threads after");
    assert_eq!(t.strays.entries(), vec![], "{name}: statuses left stray");
    // Nothing more to script: the target is not killed at drop.
    t.attached = false;
}

/// `waitpid(-1, __WNOTHREAD)` of a blocking `wait`.
pub(crate) const WAIT_ANY: &str = "waitpid -1 0x20000000";

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "clone event, then the new thread's first stop",
            tids: &[L],
            setup: no_setup,
            ops: &[Op::Wait],
            script: format!(
                "{WAIT_ANY} = {L} 0x3057f
                 geteventmsg {L} = {T2}
                 waitpid {T2} 0x0 = {T2} 0x80057f
                 cont {T2} 0 = ok
                 cont {L} 0 = ok"
            ),
            events: &["thread-created 5000002"],
            threads_after: &[L, T2],
        },
        Case {
            name: "the new thread's first stop before the parent's clone event",
            tids: &[L],
            setup: no_setup,
            ops: &[Op::Wait],
            script: format!(
                "# The new thread's first stop (PTRACE_EVENT_STOP with SIGTRAP, as an
                 # auto-attached task's is) is kept: no clone event yet ...
                 {WAIT_ANY} = {T2} 0x80057f
                 {WAIT_ANY} = {L} 0x3057f
                 geteventmsg {L} = {T2}
                 # ... and taken here: no waitpid for it.
                 cont {T2} 0 = ok
                 cont {L} 0 = ok"
            ),
            events: &["thread-created 5000002"],
            threads_after: &[L, T2],
        },
        Case {
            name: "vfork: the child is followed until its exec; vfork-done is no signal",
            tids: &[L],
            setup: no_setup,
            ops: &[Op::Wait, Op::Wait],
            script: format!(
                "{WAIT_ANY} = {L} 0x2057f
                 geteventmsg {L} = {T3}
                 waitpid {T3} 0x0 = {T3} 0x80057f
                 cont {T3} 0 = ok
                 cont {L} 0 = ok
                 # The child's exec: a process of its own, let go.
                 {WAIT_ANY} = {T3} 0x4057f
                 detach {T3} 0 = ok
                 # PTRACE_EVENT_VFORK_DONE: continued without a signal.
                 {WAIT_ANY} = {L} 0x5057f
                 cont {L} 0 = ok
                 {WAIT_ANY} = {L} 0x0"
            ),
            events: &["thread-created 5000003", "exited Code(0)"],
            threads_after: &[],
        },
        Case {
            name: "vfork child that exits without exec",
            tids: &[L],
            setup: no_setup,
            ops: &[Op::Wait, Op::Wait],
            script: format!(
                "{WAIT_ANY} = {L} 0x2057f
                 geteventmsg {L} = {T3}
                 waitpid {T3} 0x0 = {T3} 0x80057f
                 cont {T3} 0 = ok
                 cont {L} 0 = ok
                 {WAIT_ANY} = {T3} 0x300"
            ),
            events: &["thread-created 5000003", "thread-exited 5000003"],
            threads_after: &[L],
        },
        Case {
            name: "exec by a thread that is not the leader: the leader's tid takes over",
            tids: &[L, T2, T3],
            setup: no_setup,
            ops: &[Op::Wait, Op::Resume(L, ResumeMode::Continue), Op::Wait],
            script: format!(
                "# T3 ran execve: the exec stop comes with the leader's tid.
                 {WAIT_ANY} = {L} 0x4057f
                 open_mem {L} = ok
                 cont {L} 0 = ok
                 # T2's exit, reported after the exec: no event, no stray.
                 {WAIT_ANY} = {T2} 0x0
                 {WAIT_ANY} = {L} 0x300"
            ),
            events: &["exec", "exited Code(3)"],
            threads_after: &[],
        },
        Case {
            name: "group stop under PTRACE_SEIZE: listened to, then SIGCONT",
            tids: &[L],
            setup: no_setup,
            ops: &[Op::Wait],
            script: format!(
                "# SIGSTOP's delivery: delivered.
                 {WAIT_ANY} = {L} 0x137f
                 cont {L} 19 = ok
                 # The group stop (PTRACE_EVENT_STOP with SIGSTOP): listen.
                 {WAIT_ANY} = {L} 0x80137f
                 listen {L} = ok
                 # SIGCONT ends it (PTRACE_EVENT_STOP with SIGTRAP), then its delivery.
                 {WAIT_ANY} = {L} 0x80057f
                 cont {L} 0 = ok
                 {WAIT_ANY} = {L} 0x127f
                 cont {L} 18 = ok
                 {WAIT_ANY} = {L} 0x0"
            ),
            events: &["exited Code(0)"],
            threads_after: &[],
        },
        Case {
            name: "SIGTRAP with DR6: a watchpoint hit",
            tids: &[L],
            setup: watch_slot0,
            ops: &[Op::Wait, Op::Resume(L, ResumeMode::Continue)],
            script: format!(
                "{WAIT_ANY} = {L} 0x57f
                 get_debugreg {L} 6 = 0xffff0ff1
                 set_debugreg {L} 6 0x0 = ok
                 getregs {L} = {}
                 cont {L} 0 = ok",
                regs_at(0x401234)
            ),
            events: &["watchpoint 5000001 slots=0x1 rip=0x401234"],
            threads_after: &[L],
        },
        Case {
            name: "SIGTRAP with DR6 empty (a virtual CPU's) as an icebp: the one watchpoint's hit",
            tids: &[L],
            setup: watch_slot0,
            ops: &[Op::Wait, Op::Resume(L, ResumeMode::Continue)],
            script: format!(
                "{WAIT_ANY} = {L} 0x57f
                 get_debugreg {L} 6 = 0xffff0ff0
                 getregs {L} = {}
                 # TRAP_BRKPT, and no icebp before rip (memory unreadable here).
                 getsiginfo {L} = 5 1
                 cont {L} 0 = ok",
                regs_at(0x401234)
            ),
            events: &["watchpoint 5000001 slots=0x1 rip=0x401234"],
            threads_after: &[L],
        },
        Case {
            name: "a watchpoint hit in a single-step's trap is reported after the step",
            tids: &[L],
            setup: watch_slot1_leader_parked,
            ops: &[
                Op::Resume(L, ResumeMode::Step),
                Op::Wait,
                Op::Resume(L, ResumeMode::Continue),
                Op::Wait,
                Op::Resume(L, ResumeMode::Continue),
            ],
            script: format!(
                "step {L} 0 = ok
                 {WAIT_ANY} = {L} 0x57f
                 get_debugreg {L} 6 = 0x4002
                 set_debugreg {L} 6 0x0 = ok
                 getregs {L} = {}
                 # The watchpoint comes from the resume, no call made.
                 cont {L} 0 = ok",
                regs_at(0x7000_0005)
            ),
            events: &[
                "stepped 5000001 rip=0x70000005",
                "watchpoint 5000001 slots=0x2 rip=0x70000005",
            ],
            threads_after: &[L],
        },
        Case {
            name: "a hardware trap queued before the watchpoint was removed is dropped",
            tids: &[L],
            setup: no_setup,
            ops: &[Op::Wait],
            script: format!(
                "{WAIT_ANY} = {L} 0x57f
                 getsiginfo {L} = 5 4
                 get_debugreg {L} 6 = 0x1
                 set_debugreg {L} 6 0x0 = ok
                 cont {L} 0 = ok
                 {WAIT_ANY} = {L} 0x0"
            ),
            events: &["exited Code(0)"],
            threads_after: &[],
        },
        Case {
            name: "a thread exits while stopping",
            tids: &[L, T2],
            setup: no_setup,
            ops: &[Op::StopAll, Op::Wait, Op::ResumeAll],
            script: format!(
                "interrupt {L} = ok
                 interrupt {T2} = ok
                 waitpid {L} 0x1 = {L} 0x80057f
                 waitpid {T2} 0x0 = {T2} 0x0
                 cont {L} 0 = ok"
            ),
            events: &["thread-exited 5000002"],
            threads_after: &[L],
        },
        Case {
            name: "ESRCH at an interrupt, the process killed while stopping",
            tids: &[L, T2, T3],
            setup: no_setup,
            ops: &[Op::StopAll, Op::Wait, Op::Wait],
            script: format!(
                "interrupt {L} = ok
                 interrupt {T2} = err 3
                 interrupt {T3} = ok
                 waitpid {L} 0x1 = {L} 0x9
                 # Gone with the leader: nothing left to wait for."
            ),
            events: &["exited Signal(9)", "exited Signal(9)"],
            threads_after: &[],
        },
        Case {
            name: "a leader whose process died is waited for with its threads' exits",
            tids: &[L, T2],
            setup: no_setup,
            ops: &[Op::StopAll, Op::Wait, Op::Wait],
            script: format!(
                "# A fatal signal ended the process while it ran: the leader
                 # reports only once T2's exit is reaped (a wait on the
                 # leader alone hung, both tasks zombies).
                 interrupt {L} = ok
                 interrupt {T2} = err 3
                 waitpid {L} 0x1 = none
                 {WAIT_ANY} = {T2} 0x5
                 waitpid {L} 0x0 = {L} 0x5"
            ),
            events: &["thread-exited 5000002", "exited Signal(5)"],
            threads_after: &[],
        },
        Case {
            name: "a stopped thread the process's end took is waited for, not an error",
            tids: &[L, T2],
            setup: no_setup,
            ops: &[Op::Wait, Op::Wait],
            script: format!(
                "# T2 stops at a trap; another thread's exit_group takes it
                 # before its registers are read.
                 {WAIT_ANY} = {T2} 0x57f
                 getsiginfo {T2} = 5 128
                 getregs {T2} = err 3
                 getregs {T2} = err 3
                 {WAIT_ANY} = {T2} 0x0
                 {WAIT_ANY} = {L} 0x0"
            ),
            events: &["thread-exited 5000002", "exited Code(0)"],
            threads_after: &[],
        },
        Case {
            name: "ECHILD for a thread being stopped: it is forgotten",
            tids: &[L, T2],
            setup: no_setup,
            ops: &[Op::StopAll, Op::ResumeAll],
            script: format!(
                "interrupt {L} = ok
                 interrupt {T2} = ok
                 waitpid {L} 0x1 = {L} 0x80057f
                 waitpid {T2} 0x0 = err 10
                 cont {L} 0 = ok"
            ),
            events: &[],
            threads_after: &[L],
        },
        Case {
            name: "an interrupt a clone stop cleared is sent again by the next stop_all",
            tids: &[L],
            setup: no_setup,
            ops: &[Op::StopAll, Op::Wait, Op::ResumeAll, Op::StopAll],
            script: format!(
                "interrupt {L} = ok
                 waitpid {L} 0x0 = {L} 0x3057f
                 geteventmsg {L} = {T2}
                 waitpid {T2} 0x0 = {T2} 0x80057f
                 cont {L} 0 = ok
                 cont {T2} 0 = ok
                 # The clone stop cleared the leader's pending STOP trap (the
                 # kernel's ptrace_stop: any trap clears it): no stop comes
                 # for it. stop_all interrupts it again rather than waiting
                 # for that stop for ever (watch -p under thread churn hung).
                 interrupt {L} = ok
                 interrupt {T2} = ok
                 waitpid {L} 0x1 = {L} 0x80057f
                 waitpid {T2} 0x0 = {T2} 0x80057f"
            ),
            events: &["thread-created 5000002"],
            threads_after: &[L, T2],
        },
        Case {
            name: "a clone event instead of the interrupt's stop while stopping",
            tids: &[L],
            setup: no_setup,
            ops: &[Op::StopAll, Op::Wait, Op::ResumeAll, Op::Wait],
            script: format!(
                "interrupt {L} = ok
                 waitpid {L} 0x0 = {L} 0x3057f
                 geteventmsg {L} = {T2}
                 waitpid {T2} 0x0 = {T2} 0x80057f
                 # Both parked; the leader's interrupt is still to come.
                 cont {L} 0 = ok
                 cont {T2} 0 = ok
                 {WAIT_ANY} = {L} 0x80057f
                 cont {L} 0 = ok
                 {WAIT_ANY} = {L} 0x0"
            ),
            events: &["thread-created 5000002", "exited Code(0)"],
            threads_after: &[],
        },
    ]
}

#[test]
fn wait_state_machine_cases() {
    for case in cases() {
        run(&case);
    }
}

#[test]
fn a_call_out_of_script_order_fails_the_case() {
    let case = Case {
        name: "clone event with the calls in another order",
        tids: &[L],
        setup: no_setup,
        ops: &[Op::Wait],
        script: format!(
            "{WAIT_ANY} = {L} 0x3057f
             geteventmsg {L} = {T2}
             waitpid {T2} 0x0 = {T2} 0x80057f
             cont {L} 0 = ok
             cont {T2} 0 = ok"
        ),
        events: &["thread-created 5000002"],
        threads_after: &[L, T2],
    };
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&case)));
    let msg = r.expect_err("the fake accepted calls out of order");
    let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        msg.contains(&format!("called `cont {T2} 0`")),
        "unexpected failure: {msg}"
    );
}

/// A `Write` into a buffer the test keeps.
#[derive(Clone, Default)]
struct Buffer(Arc<Mutex<Vec<u8>>>);

impl Write for Buffer {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("buffer").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Buffer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("buffer")).into_owned()
    }
}

/// Waits for events until the process exits, resuming each stopped
/// thread, as the engine would; `on_timeout` runs at each timeout.
fn drive(
    t: &mut ProcessTarget,
    timeout: Option<Duration>,
    mut on_timeout: impl FnMut(&mut ProcessTarget),
) -> Vec<String> {
    let mut events = Vec::new();
    for _ in 0..10_000 {
        let ev = t.wait(timeout).expect("wait");
        events.push(render(&ev));
        match ev {
            TargetEvent::Exited(_) => return events,
            TargetEvent::Timeout => on_timeout(t),
            TargetEvent::Breakpoint { thread, .. }
            | TargetEvent::Stepped { thread, .. }
            | TargetEvent::Watchpoint { thread, .. }
            | TargetEvent::ModulesChanged { thread } => {
                t.resume(thread, ResumeMode::Continue).expect("resume")
            }
            TargetEvent::Forked { thread, child } => {
                t.release_fork_child(child, &[]).expect("release");
                t.resume(thread, ResumeMode::Continue).expect("resume");
            }
            TargetEvent::Exec => {
                let leader = ThreadId(t.pid as u64);
                t.resume(leader, ResumeMode::Continue).expect("resume");
            }
            TargetEvent::ThreadCreated(_) | TargetEvent::ThreadExited(_) => {}
        }
    }
    panic!("no exit after 10000 events: {events:?}");
}

/// A recorded run: the leader, the timeout its waits used, the events,
/// the call log.
struct Recording {
    pid: i32,
    timeout_ms: Option<u64>,
    events: Vec<String>,
    log: String,
}

impl Recording {
    fn fixture(&self, what: &str) -> String {
        let mut s = format!(
            "# hotprobe-process OS call log of a real run: {what}\n\
             # Recorded by wait_tests (HOTPROBE_RECORD_FIXTURES=1 cargo test -p hotprobe-process record_);\n\
             # replayed through the scripted fake by wait_tests::replay.\n\
             # pid {}\n# timeout-ms {}\n",
            self.pid,
            self.timeout_ms.map_or("none".into(), |m| m.to_string())
        );
        for e in &self.events {
            s.push_str(&format!("# event {e}\n"));
        }
        s.push_str(&self.log);
        s
    }

    fn parse(fixture: &str) -> Recording {
        let field = |key: &str| {
            fixture
                .lines()
                .find_map(|l| l.strip_prefix(&format!("# {key} ")))
                .unwrap_or_else(|| panic!("fixture has no `# {key}` line"))
                .to_string()
        };
        Recording {
            pid: field("pid").parse().expect("pid"),
            timeout_ms: field("timeout-ms").parse().ok(),
            events: fixture
                .lines()
                .filter_map(|l| l.strip_prefix("# event "))
                .map(String::from)
                .collect(),
            log: fixture.to_string(),
        }
    }
}

/// Replays `fixture` through the fake: the same events, every call made
/// as recorded, in order.
fn replay(fixture: &str) {
    let rec = Recording::parse(fixture);
    assert!(!rec.events.is_empty(), "a fixture without events");
    let (mut t, os) = fake_target(rec.pid, &[rec.pid], &rec.log);
    let events = drive(&mut t, rec.timeout_ms.map(Duration::from_millis), |_| {});
    assert_eq!(events, rec.events, "replayed events");
    assert_eq!(
        os.remaining(),
        Vec::<String>::new(),
        "recorded calls not made"
    );
    assert!(t.strays.is_empty(), "stray statuses left");
}

/// Compiles C `source` into a temporary folder.
fn compile(dir: &hotprobe_testkit::TempDir, name: &str, source: &str) -> PathBuf {
    let src = hotprobe_testkit::write_source(dir.path(), &format!("{name}.c"), source);
    hotprobe_testkit::compile("gcc", &src, &dir.path().join(name), &["-O0"], &[])
}

/// Runs `program` under a real target with the call log on from the first
/// wait after its start, as [`drive`] does; `on_timeout` sees the log.
fn record(
    program: &Path,
    timeout_ms: Option<u64>,
    mut on_timeout: impl FnMut(i32, &str),
) -> Recording {
    let mut t = ProcessTarget::spawn(program, &[]).expect("spawn");
    t.resume_all().expect("resume_all");
    let log = Buffer::default();
    t.set_os_log(Some(Box::new(log.clone())));
    let pid = t.pid;
    let events = drive(&mut t, timeout_ms.map(Duration::from_millis), |_| {
        on_timeout(pid, &log.text())
    });
    Recording {
        pid,
        timeout_ms,
        events,
        log: log.text(),
    }
}

/// Checks a fresh recording replays, and writes it as the fixture when
/// `HOTPROBE_RECORD_FIXTURES` is set.
fn keep(rec: &Recording, name: &str, what: &str) {
    let fixture = rec.fixture(what);
    replay(&fixture);
    if std::env::var_os("HOTPROBE_RECORD_FIXTURES").is_some() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name);
        std::fs::write(&path, fixture).expect("write fixture");
    }
}

const VFORK_C: &str = r#"#include <unistd.h>
#include <sys/wait.h>
int main(void) {
    int st = 0;
    pid_t c = vfork();
    if (c == 0) {
        execl("/bin/true", "true", (char *)0);
        _exit(127);
    }
    waitpid(c, &st, 0);
    c = vfork();
    if (c == 0)
        _exit(0);
    waitpid(c, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 100;
}
"#;

const GROUP_STOP_C: &str = r#"#include <signal.h>
int main(void) {
    raise(SIGSTOP);
    return 0;
}
"#;

#[test]
fn record_vfork_and_replay() {
    let dir = hotprobe_testkit::TempDir::new("os-vfork");
    let program = compile(&dir, "vfork", VFORK_C);
    let rec = record(&program, None, |_, _| {});
    assert_eq!(rec.events.len(), 4, "events: {:?}", rec.events);
    assert!(
        rec.events[0].starts_with("thread-created "),
        "{:?}",
        rec.events
    );
    assert!(
        rec.events[1].starts_with("thread-created "),
        "{:?}",
        rec.events
    );
    assert!(
        rec.events[2].starts_with("thread-exited "),
        "{:?}",
        rec.events
    );
    assert_eq!(rec.events[3], "exited Code(0)");
    keep(
        &rec,
        "vfork.log",
        "a vfork child that execs /bin/true, then one that _exits (wait_tests::VFORK_C)",
    );
}

#[test]
fn record_group_stop_and_replay() {
    let dir = hotprobe_testkit::TempDir::new("os-groupstop");
    let program = compile(&dir, "groupstop", GROUP_STOP_C);
    let mut sent = false;
    let rec = record(&program, Some(200), |pid, log| {
        // The group stop is handled inside the target (no event): the log
        // shows when it listens, and SIGCONT ends the stop.
        if !sent && log.contains(&format!("listen {pid} = ok")) {
            // SAFETY: kill with a pid of our own traced child.
            assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
            sent = true;
        }
    });
    assert!(sent, "no group stop was listened to:\n{}", rec.log);
    assert_eq!(
        rec.events.last().map(String::as_str),
        Some("exited Code(0)")
    );
    assert!(
        rec.log.contains(&format!("cont {} 19 = ok", rec.pid)),
        "SIGSTOP not delivered:\n{}",
        rec.log
    );
    keep(
        &rec,
        "group_stop.log",
        "raise(SIGSTOP), ended by the test's SIGCONT (wait_tests::GROUP_STOP_C)",
    );
}

#[test]
fn replay_recorded_vfork() {
    replay(include_str!("../tests/fixtures/vfork.log"));
}

#[test]
fn replay_recorded_group_stop() {
    replay(include_str!("../tests/fixtures/group_stop.log"));
}
