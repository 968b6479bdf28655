//! Watchpoint probes (`Session::watch`): a global written by 4 threads,
//! each write seen with its thread and value; the 4-watchpoint limit and
//! bad specs refused; after detach no thread keeps a debug register.

mod support;

use hotprobe::{
    Action, EngineError, Probe, RunEnd, Session, ValueSource, WatchAt, WatchKind, WatchSpec,
};
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::rc::Rc;
use support::*;

/// One hit: (thread, old, new, value source, accessing instruction
/// symbolized, write?).
type Hit = (u64, u64, u64, ValueSource, Option<String>, Option<bool>);
type Seen = Rc<RefCell<Vec<Hit>>>;

fn recorder(seen: &Seen, stop_after: Option<usize>) -> Probe {
    let seen = seen.clone();
    Probe::new().pre(move |ctx| {
        let w = ctx.watch().expect("a watch hit").clone();
        assert_eq!(ctx.kind(), hotprobe::HitKind::Watch);
        assert_eq!(ctx.thread(), w.thread);
        // The handler context reads registers and memory as for probes.
        assert_eq!(ctx.regs().rip, w.pc_after);
        let mut b = [0u8; 4];
        ctx.read_memory(w.addr, &mut b).unwrap();
        let insn = w.insn.and_then(|a| ctx.symbolize(a));
        let mut v = seen.borrow_mut();
        v.push((w.thread.0, w.old, w.new, w.source, insn, w.write));
        if stop_after == Some(v.len()) {
            ctx.stop();
        }
    })
}

/// `writer K tid T wrote N values, last V` lines: K → (tid, N).
fn writers(out: &str) -> BTreeMap<u64, (u64, u64)> {
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&"writer")).then(|| {
                (
                    f[1].parse().unwrap(),
                    (f[3].parse().unwrap(), f[5].parse().unwrap()),
                )
            })
        })
        .collect()
}

/// Checks one round's hits against the program's own log: writer k's
/// thread stored (k+1)*1000 + 1..=10*(k+1), in order; the main thread
/// stored 0 once.
fn check_round(seen: &[Hit], out: &str, main: u64) {
    let w = writers(out);
    assert_eq!(w.len(), 4, "4 writer lines in:\n{out}");
    let mut by: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for (tid, _, new, source, insn, write) in seen {
        by.entry(*tid).or_default().push(*new);
        // `counter = v` is a mov of a register: the value comes from it.
        assert_eq!(*source, ValueSource::Instruction, "{seen:?}");
        assert_eq!(*write, Some(true));
        let insn = insn.as_deref().unwrap_or("");
        assert!(
            insn.starts_with("store+") || insn.starts_with("round_+"),
            "accessing instruction {insn:?}"
        );
    }
    assert_eq!(
        by.remove(&main),
        Some(vec![0]),
        "the main thread's one store"
    );
    for (k, (tid, n)) in &w {
        let expect: Vec<u64> = (1..=*n).map(|i| (k + 1) * 1000 + i).collect();
        assert_eq!(
            by.remove(tid).as_ref(),
            Some(&expect),
            "writer {k} (tid {tid})"
        );
    }
    assert!(by.is_empty(), "writes by unknown threads: {by:?}");
    // Old values chain: each hit's old is the previous hit's new.
    for pair in seen.windows(2) {
        assert_eq!(pair[1].1, pair[0].2);
    }
}

#[test]
fn every_write_of_four_threads_with_its_thread_and_value() {
    let bin = program("watched", &["-O0", "-pthread"]);
    let mut c = spawn(&bin, &["run"]);
    let t = c.target;
    let seen: Seen = Rc::default();
    let id = c
        .session
        .watch(
            t,
            WatchSpec::parse("counter", WatchKind::Write).unwrap(),
            Action::Handler(recorder(&seen, None)),
        )
        .unwrap();
    c.session.start().unwrap();
    assert_eq!(c.session.run().unwrap(), RunEnd::AllExited);
    let out = c.output();
    let main = out
        .lines()
        .find_map(|l| l.strip_prefix("round 1 main tid "))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no round line in:\n{out}"));
    check_round(&seen.borrow(), &out, main);
    assert_eq!(seen.borrow()[0].1, 0, "counter starts at 0");
    // Counts: 100 writer stores and the main thread's one.
    assert_eq!(c.session.stats(id).unwrap().hits, 101);
    let ws = c.session.watch_stats(id).unwrap();
    assert_eq!(ws.hits, 101);
    assert_eq!(ws.by_thread.len(), 5);
    for (tid, n) in writers(&out).values() {
        assert_eq!(ws.by_thread[&hotprobe::ThreadId(*tid)], *n);
    }
    // The program's own output is what it prints untraced.
    let plain = Command::new(&bin).arg("run").output().unwrap();
    let strip = |s: &str| -> Vec<String> {
        let mut v: Vec<String> = s
            .lines()
            .map(|l| {
                // Thread ids differ from run to run.
                let w: Vec<&str> = l.split_whitespace().collect();
                w.iter()
                    .enumerate()
                    .map(|(i, x)| if i > 0 && w[i - 1] == "tid" { "T" } else { x })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        v.sort();
        v
    };
    assert_eq!(strip(&out), strip(&String::from_utf8_lossy(&plain.stdout)));
}

#[test]
fn counting_reads_and_writes() {
    // `other` is read and written once per round by `other += 1`, and read
    // again by the printf: a read/write watchpoint sees 3 accesses, a
    // write watchpoint 1.
    let bin = program("watched", &["-O0", "-pthread"]);
    let mut c = spawn(&bin, &["run"]);
    let t = c.target;
    let rw = c
        .session
        .watch(
            t,
            WatchSpec::parse("other", WatchKind::ReadWrite).unwrap(),
            Action::Count,
        )
        .unwrap();
    let w = c
        .session
        .watch(
            t,
            WatchSpec::parse("other:8", WatchKind::Write).unwrap(),
            Action::Count,
        )
        .unwrap();
    c.session.start().unwrap();
    c.session.run().unwrap();
    assert!(c.output().contains("other 1"), "{}", c.output());
    assert_eq!(c.session.stats(w).unwrap().hits, 1);
    assert_eq!(c.session.stats(rw).unwrap().hits, 3);
}

#[test]
fn at_most_four_and_bad_specs_refused() {
    let bin = program("watched", &["-O0", "-pthread"]);
    let mut c = spawn(&bin, &["run"]);
    let t = c.target;
    let s = &mut c.session;
    let spec = |t: &str| WatchSpec::parse(t, WatchKind::Write).unwrap();
    let refusal = |r: Result<hotprobe::ProbeId, EngineError>| match r {
        Err(e) => e.to_string(),
        Ok(_) => panic!("accepted"),
    };
    let e = refusal(s.watch(t, spec("no_such_variable"), Action::Count));
    assert!(e.contains("no data symbol"), "{e}");
    // `store` is a function, not a variable.
    let e = refusal(s.watch(t, spec("store"), Action::Count));
    assert!(e.contains("no data symbol"), "{e}");
    let e = refusal(s.watch(
        t,
        WatchSpec {
            at: WatchAt::Addr(0x1002),
            len: Some(4),
            kind: WatchKind::Write,
        },
        Action::Count,
    ));
    assert!(e.contains("not aligned"), "{e}");
    let e = refusal(s.watch(t, spec("counter:8"), Action::Count));
    assert!(e.contains("4 bytes, fewer than 8"), "{e}");
    let e = refusal(s.watch(t, spec("counter"), Action::Record));
    assert!(e.contains("handler or a count"), "{e}");
    for w in ["counter", "counter:2", "counter:1", "other"] {
        s.watch(t, spec(w), Action::Count).unwrap();
    }
    let e = refusal(s.watch(t, spec("other:4"), Action::Count));
    assert!(e.contains("at most 4 watchpoints"), "{e}");
    s.start().unwrap();
    assert_eq!(s.run().unwrap(), RunEnd::AllExited);
}

/// DR7 of every thread of `pid`, read by seizing it (after hotprobe left).
fn dr7_of_every_thread(pid: i32) -> Vec<(i32, u64)> {
    use hotprobe_process::sys;
    let mut out = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let tid: i32 = e.unwrap().file_name().to_str().unwrap().parse().unwrap();
        sys::seize(tid, 0).unwrap();
        sys::interrupt(tid).unwrap();
        sys::waitpid(tid, libc_wall()).unwrap();
        out.push((tid, sys::get_debugreg(tid, 7).unwrap()));
        sys::detach(tid, 0).unwrap();
    }
    out
}

fn libc_wall() -> i32 {
    0x4000_0000 // __WALL
}

#[test]
fn attach_watch_detach_leaves_no_debug_register() {
    let bin = program("watched", &["-O0", "-pthread"]);
    let mut child = Command::new(&bin)
        .arg("serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let pid: i32 = line.trim().strip_prefix("ready ").unwrap().parse().unwrap();
    // The target's lines up to and including `round R ...`.
    let until_round = |stdout: &mut BufReader<std::process::ChildStdout>, r: u32| -> String {
        let mut out = String::new();
        loop {
            let mut l = String::new();
            assert!(stdout.read_line(&mut l).unwrap() > 0, "target gone");
            out.push_str(&l);
            if l.starts_with(&format!("round {r} ")) {
                return out;
            }
        }
    };

    // A hit missed would leave the loop waiting forever: past a minute
    // the target is killed, and the run ends with it (a failure below).
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let d = done.clone();
    std::thread::spawn(move || {
        for _ in 0..600 {
            std::thread::sleep(std::time::Duration::from_millis(100));
            if d.load(std::sync::atomic::Ordering::Relaxed) {
                return;
            }
        }
        let _ = hotprobe_process::sys::kill(pid, 9);
    });

    let mut s = Session::new();
    let t = s.attach(pid).unwrap();
    let seen: Seen = Rc::default();
    let id = s
        .watch(
            t,
            WatchSpec::parse("counter:4", WatchKind::Write).unwrap(),
            Action::Handler(recorder(&seen, Some(101))),
        )
        .unwrap();
    s.start().unwrap();
    writeln!(stdin, "go").unwrap();
    stdin.flush().unwrap();
    // The handler stops the loop at the round's 101st store, its last.
    let end = s.run().unwrap();
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(end, RunEnd::Stopped, "{} hits", seen.borrow().len());
    s.detach().unwrap();
    let out = until_round(&mut stdout, 1);
    let main: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("round 1 main tid "))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap();
    check_round(&seen.borrow(), &out, main);
    assert_eq!(s.stats(id).unwrap().hits, 101);

    // No thread keeps a watchpoint...
    for (tid, dr7) in dr7_of_every_thread(pid) {
        assert_eq!(dr7, 0, "DR7 of thread {tid} after detach");
    }
    // ...and the program writes on, untraced, unstopped.
    writeln!(stdin, "go").unwrap();
    stdin.flush().unwrap();
    let out2 = until_round(&mut stdout, 2);
    assert_eq!(writers(&out2).len(), 4, "{out2}");
    assert!(out2.contains("other 2"), "{out2}");
    assert_eq!(seen.borrow().len(), 101, "no hit after detach");
    writeln!(stdin, "quit").unwrap();
    drop(stdin);
    let st = child.wait().unwrap();
    assert!(st.success(), "target ended with {st}");
}

/// A trap probe on the very store the watchpoint sees: the store runs out
/// of line, single-stepped (a post handler) or boosted (none). Every store
/// is still reported once, by its thread, with its value, naming the
/// original instruction (stepped, the step's trap carries the
/// watchpoint's too; boosted, the trap comes in the slot).
#[test]
fn a_trap_probe_on_the_watched_store() {
    for stepped in [true, false] {
        let bin = program("watched", &["-O0", "-pthread"]);
        let mut c = spawn(&bin, &["run"]);
        let t = c.target;
        let seen: Seen = Rc::default();
        let probe_hits = Rc::new(RefCell::new(0u64));
        let ph = probe_hits.clone();
        let mut probe = Probe::new().pre(move |_| *ph.borrow_mut() += 1);
        let post_runs = Rc::new(RefCell::new(0u64));
        if stepped {
            let pr = post_runs.clone();
            probe = probe.post(move |_| *pr.borrow_mut() += 1);
        }
        // store: push rbp; mov rbp, rsp; mov [rbp-4], edi; mov eax, [rbp-4];
        // mov [rip+counter], eax (at +0xa, gcc -O0).
        let id = c.session.probe(t, "store+0xa", probe).unwrap();
        let w = c
            .session
            .watch(
                t,
                WatchSpec::parse("counter", WatchKind::Write).unwrap(),
                Action::Handler(recorder(&seen, None)),
            )
            .unwrap();
        // Boosted, but a post handler makes each hit a single-step.
        assert_eq!(c.session.execution_of(id), Some("boosted"));
        c.session.start().unwrap();
        assert_eq!(c.session.run().unwrap(), RunEnd::AllExited);
        let out = c.output();
        assert_eq!(*probe_hits.borrow(), 100, "stepped: {stepped}");
        assert_eq!(*post_runs.borrow(), if stepped { 100 } else { 0 });
        assert_eq!(c.session.stats(id).unwrap().hits, 100);
        assert_eq!(c.session.stats(w).unwrap().hits, 101, "stepped: {stepped}");
        let ws = c.session.watch_stats(w).unwrap();
        for (tid, n) in writers(&out).values() {
            assert_eq!(ws.by_thread[&hotprobe::ThreadId(*tid)], *n, "{out}");
        }
        let main = out
            .lines()
            .find_map(|l| l.strip_prefix("round 1 main tid "))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|t| t.parse().ok())
            .unwrap();
        check_round(&seen.borrow(), &out, main);
    }
}

/// A watchpoint removed while the program runs (its threads are stopped
/// for it and resumed): no hit after, the program runs to its end.
#[test]
fn unwatch_while_running() {
    let bin = program("watched", &["-O0", "-pthread"]);
    let mut c = spawn(&bin, &["run"]);
    let t = c.target;
    let seen: Seen = Rc::default();
    let id = c
        .session
        .watch(
            t,
            WatchSpec::parse("counter", WatchKind::Write).unwrap(),
            Action::Handler(recorder(&seen, Some(5))),
        )
        .unwrap();
    c.session.start().unwrap();
    assert_eq!(c.session.run().unwrap(), RunEnd::Stopped);
    c.session.unwatch(id).unwrap();
    assert!(c.session.watch_stats(id).is_none());
    assert!(c.session.unwatch(id).is_err(), "removed twice");
    assert_eq!(c.session.run().unwrap(), RunEnd::AllExited);
    assert_eq!(seen.borrow().len(), 5);
    let out = c.output();
    assert_eq!(writers(&out).len(), 4, "{out}");
    assert!(out.contains("round 1 main tid"), "{out}");
}

/// An execute watchpoint on a function (DR7 R/W = 00): a hit per call,
/// before the instruction, by the calling thread; the function runs once
/// per hit (the kernel's RF), the program's output is unchanged.
#[test]
fn execute_watchpoint_on_a_function() {
    let bin = program("watched", &["-O0", "-pthread"]);
    let mut c = spawn(&bin, &["run"]);
    let t = c.target;
    let at = Rc::new(RefCell::new(Vec::new()));
    let a = at.clone();
    let id = c
        .session
        .watch(
            t,
            WatchSpec::parse("store", WatchKind::Execute).unwrap(),
            Action::Handler(Probe::new().pre(move |ctx| {
                let w = ctx.watch().unwrap().clone();
                assert_eq!(ctx.regs().rip, w.addr);
                a.borrow_mut().push((w.insn, ctx.symbolize(w.addr)));
            })),
        )
        .unwrap();
    let e = c
        .session
        .watch(
            t,
            WatchSpec::parse("store:4", WatchKind::Execute).unwrap(),
            Action::Count,
        )
        .unwrap_err()
        .to_string();
    assert!(e.contains("covers 1 byte"), "{e}");
    let writes = c
        .session
        .watch(
            t,
            WatchSpec::parse("counter", WatchKind::Write).unwrap(),
            Action::Count,
        )
        .unwrap();
    c.session.start().unwrap();
    assert_eq!(c.session.run().unwrap(), RunEnd::AllExited);
    let out = c.output();
    let ws = c.session.watch_stats(id).unwrap();
    assert_eq!(ws.hits, 100);
    for (tid, n) in writers(&out).values() {
        assert_eq!(ws.by_thread[&hotprobe::ThreadId(*tid)], *n, "{out}");
    }
    let at = at.borrow();
    assert_eq!(at.len(), 100);
    assert!(at
        .iter()
        .all(|(i, s)| i.is_some() && s.as_deref().is_some_and(|s| s.starts_with("store "))));
    // Each call ran its store once: 100 and the main thread's.
    assert_eq!(c.session.stats(writes).unwrap().hits, 101);
    assert!(out.contains("round 1 main tid"), "{out}");
}
