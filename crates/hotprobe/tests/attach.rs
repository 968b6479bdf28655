//! Attaching to a running process, probing, detaching byte-exact; and the
//! bad-input cases, each leaving the target running correctly.

mod support;

use hotprobe::{
    Action, EngineError, Mechanism, MechanismChoice, Probe, ProcessError, RetProbe, RunEnd,
    Session, SessionConfig,
};
use std::cell::RefCell;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::rc::Rc;
use support::*;

/// A `target serve` process driven through its stdin/stdout.
struct Served {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pid: i32,
}

/// `after`'s mappings that `before` has, after checking that the others
/// are what the attach leaves mapped on purpose: the agent (injected at
/// attach, for the trap mechanism's orphaned int3s), the libgcc_s it
/// loads, and its near page.
fn same_mappings(
    before: &[(String, Vec<u8>)],
    after: Vec<(String, Vec<u8>)>,
) -> Vec<(String, Vec<u8>)> {
    let (same, new): (Vec<_>, Vec<_>) = after
        .into_iter()
        .partition(|(m, _)| before.iter().any(|(b, _)| b == m));
    for (m, _) in &new {
        let name = m.split_whitespace().nth(5).unwrap_or("");
        assert!(
            name.is_empty() || name.contains("libhotprobe_agent") || name.contains("libgcc_s"),
            "a new executable mapping after detach: {m}"
        );
    }
    assert_eq!(same.len(), before.len(), "every executable mapping kept");
    same
}

impl Served {
    fn start(bin: &std::path::Path) -> Served {
        let mut child = Command::new(bin)
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let pid: i32 = line.trim().strip_prefix("ready ").unwrap().parse().unwrap();
        Served {
            child,
            stdin,
            stdout,
            pid,
        }
    }

    fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
    }

    /// Lines up to and including the next `done ...` line.
    fn until_done(&mut self) -> Vec<String> {
        let mut v = Vec::new();
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "target closed its output"
            );
            let done = line.starts_with("done ");
            v.push(line.trim_end().to_string());
            if done {
                return v;
            }
        }
    }

    /// Every executable mapping's bytes, read through /proc/PID/mem.
    fn text(&self) -> Vec<(String, Vec<u8>)> {
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)).unwrap();
        let mem = std::fs::File::open(format!("/proc/{}/mem", self.pid)).unwrap();
        let mut out = Vec::new();
        for l in maps.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if !f[1].contains('x') || l.contains("[vsyscall]") {
                continue;
            }
            let (s, e) = f[0].split_once('-').unwrap();
            let (s, e) = (
                u64::from_str_radix(s, 16).unwrap(),
                u64::from_str_radix(e, 16).unwrap(),
            );
            let mut buf = vec![0u8; (e - s) as usize];
            use std::os::unix::fs::FileExt;
            mem.read_exact_at(&mut buf, s).unwrap();
            out.push((l.to_string(), buf));
        }
        out
    }

    fn finish(mut self) -> String {
        drop(self.stdin);
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.stdout, &mut rest).unwrap();
        let st = self.child.wait().unwrap();
        assert!(st.success(), "target ended with {st}");
        rest
    }
}

#[test]
fn attach_probe_detach_leaves_text_identical() {
    let bin = program("target", &["-O2"]);
    let mut srv = Served::start(&bin);
    let before = srv.text();

    let mut s = Session::new();
    let t = s.attach(srv.pid).unwrap();
    let hits = Rc::new(RefCell::new(0u64));
    let h = hits.clone();
    let id = s.probe(t, "compute", Probe::new()).unwrap();
    // Stop once the 10th call has returned (the target then waits for input).
    let rp = s
        .retprobe(
            t,
            "compute",
            RetProbe::new(4).ret(move |ctx| {
                *h.borrow_mut() += 1;
                if *h.borrow() == 10 {
                    ctx.stop();
                }
            }),
        )
        .unwrap();
    // A return probe whose call is still live at detach: slow() sleeps.
    let slow = s
        .retprobe(t, "slow", RetProbe::new(4).entry(|ctx| ctx.stop()))
        .unwrap();
    s.start().unwrap();
    srv.send("compute 10");
    assert_eq!(s.run().unwrap(), RunEnd::Stopped);
    let lines = srv.until_done();
    assert_eq!(lines.len(), 11, "{lines:?}");
    assert_eq!(lines[10], "done compute 10 counter 10");
    srv.send("slow 300");
    assert_eq!(s.run().unwrap(), RunEnd::Stopped, "entered slow");
    assert_eq!(s.stats(slow).unwrap().hits, 1);
    // Detach while slow() sleeps with its return address swapped.
    s.detach().unwrap();
    assert_eq!(s.stats(id).unwrap().hits, 10);
    assert_eq!(s.stats(rp).unwrap().returns, 10);
    let lines = srv.until_done();
    assert_eq!(lines, vec!["slow(300) = 300", "done slow 300 counter 10"]);
    let after = same_mappings(&before, srv.text());
    for ((m1, b1), (m2, b2)) in before.iter().zip(after.iter()) {
        assert_eq!(m1, m2);
        assert!(b1 == b2, "text differs after detach in {m1}");
    }
    srv.send("compute 3");
    let lines = srv.until_done();
    assert_eq!(
        lines,
        vec![
            "compute(0, 7) = 7",
            "compute(1, 7) = 10",
            "compute(2, 7) = 13",
            "done compute 3 counter 13"
        ]
    );
    assert_eq!(srv.finish().trim(), "bye");
}

#[test]
fn bad_inputs_give_errors_and_leave_the_target_running() {
    let bin = program("target", &["-O2"]);
    let mut srv = Served::start(&bin);
    let before = srv.text();

    // No such process.
    let mut s0 = Session::new();
    match s0.attach(999_999_999) {
        Err(EngineError::Process(ProcessError::NoSuchProcess { pid })) => {
            assert_eq!(pid, 999_999_999)
        }
        other => panic!("expected NoSuchProcess, got {:?}", other.err()),
    }

    let mut s = Session::new();
    let t = s.attach(srv.pid).unwrap();

    // A second tracer is refused: the process is already traced (by us).
    let mut s2 = Session::new();
    let err = s2.attach(srv.pid).expect_err("second attach fails");
    let me = std::process::id() as i32;
    assert!(
        matches!(
            err,
            EngineError::Process(ProcessError::AlreadyTraced { pid, tracer, .. })
                if pid == srv.pid && tracer == me
        ),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("is already traced by pid"),
        "{err}"
    );

    // Unknown symbol: the error names it.
    let err = s.probe(t, "no_such_function", Probe::new()).err().unwrap();
    assert!(err.to_string().contains("no_such_function"), "{err}");

    // Bad spec syntax.
    assert!(s.probe(t, "compute+zz", Probe::new()).is_err());

    // Not on an instruction boundary: compute+1 is inside its first instruction.
    let first_len = {
        let r = s.resolve(t, "compute").unwrap().remove(0);
        let mut code = [0u8; 16];
        s.engine(t)
            .unwrap()
            .target()
            .read_memory(r.addr, &mut code)
            .unwrap();
        hotprobe_x86::decode(&code, r.addr.0).unwrap().len()
    };
    assert!(first_len > 1);
    let err = s.probe(t, "compute+1", Probe::new()).err().unwrap();
    assert!(
        err.to_string().contains("middle of an instruction"),
        "{err}"
    );

    // A PLT stub.
    let plt = {
        let syms = hotprobe_symbols::ProcessSymbols::for_pid(srv.pid as u32).unwrap();
        let main = syms.main_module().unwrap();
        let r = main
            .module
            .plt_ranges()
            .into_iter()
            .next()
            .expect("the program has a PLT");
        main.runtime(r.start)
    };
    let err = s
        .probe(t, &format!("{:#x}", plt.0), Probe::new())
        .err()
        .unwrap();
    assert!(err.to_string().contains("PLT"), "{err}");
    let bl = s.blacklist(t).unwrap();
    assert!(bl
        .iter()
        .any(|b| b.start <= plt && plt < b.end && b.what.contains("PLT")));

    // A return probe needs a function entry.
    let err = s.retprobe(t, "compute+0x4", RetProbe::new(1)).err();
    assert!(err.is_some());

    s.start().unwrap();
    s.detach().unwrap();
    drop(s2);
    srv.send("compute 2");
    assert_eq!(
        srv.until_done(),
        vec![
            "compute(0, 7) = 7",
            "compute(1, 7) = 10",
            "done compute 2 counter 2"
        ]
    );
    let after = same_mappings(&before, srv.text());
    for ((m, b1), (_, b2)) in before.iter().zip(after.iter()) {
        let diff: Vec<usize> = (0..b1.len()).filter(|i| b1[*i] != b2[*i]).take(8).collect();
        assert!(diff.is_empty(), "text differs in {m} at offsets {diff:?}");
    }
    assert_eq!(srv.finish().trim(), "bye");
}

#[test]
fn the_target_dying_drops_its_probes() {
    let bin = program("target", &["-O2"]);
    let mut srv = Served::start(&bin);
    let mut s = Session::new();
    let t = s.attach(srv.pid).unwrap();
    let id = s.probe(t, "compute", Probe::new()).unwrap();
    s.start().unwrap();
    srv.send("compute 4");
    srv.send("bogus 0");
    // The program stops reading at the bad line and exits.
    drop(srv.stdin);
    let end = s.run().unwrap();
    assert_eq!(end, RunEnd::AllExited);
    assert_eq!(s.stats(id).unwrap().hits, 4);
    // A normal exit is the end of the run, not a loss: it says so, and
    // names no "dropped" probes (issue 21).
    let notices = s.take_notices();
    assert!(
        notices
            .iter()
            .any(|n| n == &format!("pid {} exited with code 0", srv.pid)),
        "{notices:?}"
    );
    assert!(
        !notices.iter().any(|n| n.contains("dropped")),
        "{notices:?}"
    );
    // Adding a probe now says the target is gone.
    let err = s
        .probe_addr(t, hotprobe::RuntimeAddr(0x1000), Probe::new())
        .err()
        .unwrap();
    assert!(err.to_string().contains("gone"), "{err}");
    let _ = srv.child.wait();
}

#[test]
fn attach_follows_every_existing_thread() {
    let bin = program("threads", &["-O2"]);
    let mut child = Command::new(&bin)
        .args(["3000", "wait"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    let pid: i32 = line.trim().strip_prefix("ready ").unwrap().parse().unwrap();
    let mut s = Session::new();
    let t = s.attach(pid).unwrap();
    assert_eq!(
        s.engine(t).unwrap().target().threads().len(),
        9,
        "main + 8 existing threads"
    );
    let id = s.probe(t, "work", Probe::new().post(|_| {})).unwrap();
    s.start().unwrap();
    writeln!(stdin, "go").unwrap();
    stdin.flush().unwrap();
    assert_eq!(s.run().unwrap(), RunEnd::AllExited);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    assert!(rest.contains("threads 8 iters 3000 calls 24000"), "{rest}");
    assert_eq!(s.stats(id).unwrap().hits, 24000);
    // The session reaped it as its tracer; nothing is left to wait for.
    let _ = child.wait();
}

use hotprobe_testkit::cpu_ticks;

/// Attach to a child of this very process (spawned with `Command`, so
/// also a child of the tracing thread), stop the run from a pre handler
/// at the 5th hit, read the stats, detach: exactly 5 hits (one per
/// handler run, the calls consecutive), and the program runs on. Attached
/// at once after the spawn (the exec may still be ending: its event comes
/// while attaching, and the loader still runs), and once the program is
/// past its start (with the default mechanism that is a shared-memory
/// handler — a patch or jump site's stub, or an in-process trap — the
/// process untraced); with
/// ptrace traps. The C API test `crates/hotprobe-capi/tests/attach.rs`
/// is the first case.
#[test]
fn attach_to_own_child_stop_at_fifth_hit_then_detach() {
    let bin = program("target", &["-O1"]);
    let cases = [
        (MechanismChoice::Auto, false, None),
        (MechanismChoice::Auto, true, Some(Mechanism::InProcessTrap)),
        (MechanismChoice::Trap, false, Some(Mechanism::Trap)),
    ];
    for (mechanism, started, want) in cases {
        let case = format!("{mechanism:?}, attached after start: {started}");
        // A program the session did not start: calls compute() for hours.
        let mut child = Command::new(&bin)
            .args(["compute", "1000000000000"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        if started {
            // Two ticks (20 ms) of CPU: far past the loader, in the loop.
            while cpu_ticks(child.id()) < 2 {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        let mut s = Session::with_config(SessionConfig {
            mechanism,
            ..SessionConfig::default()
        });
        // The handler's calls are served however loaded the machine
        // (the 1 s default withdraws one when the session is starved).
        s.set_handler_timeout(std::time::Duration::from_secs(60));
        let t = s.attach(child.id() as i32).unwrap();
        let args = Rc::new(RefCell::new(Vec::new()));
        let a = args.clone();
        let added = s
            .add(
                t,
                "compute",
                Action::Handler(Probe::new().pre(move |ctx| {
                    a.borrow_mut().push(ctx.regs().rdi);
                    if a.borrow().len() == 5 {
                        ctx.stop();
                    }
                })),
            )
            .unwrap();
        let p = &added.placements[0];
        match want {
            // Past the start: a shared-memory handler (at a patch or jump
            // site's stub, or an in-process trap), not a ptrace stop.
            Some(Mechanism::InProcessTrap) => assert!(
                p.mechanism != Mechanism::Trap && p.execution.contains("shared-memory handler")
                    || p.mechanism == Mechanism::InProcessTrap,
                "{case}: {:?} {}",
                p.mechanism,
                p.reason
            ),
            Some(want) => assert_eq!(p.mechanism, want, "{case}: {}", p.reason),
            None => {}
        }
        s.start().unwrap();
        let end = s.run().unwrap();
        assert_eq!(
            end,
            RunEnd::Stopped,
            "{case}: {:?} {:?} {:?}",
            s.exit_status(t),
            s.take_notices(),
            p.reason
        );
        // Taken at once, while the program runs on (its next hit waits
        // for a next run that never comes).
        let st = s.stats(p.id).unwrap();
        s.detach().unwrap();
        let args = args.borrow();
        assert_eq!(args.len(), 5, "{case}");
        assert_eq!((st.hits, st.nmissed), (5, 0), "{case}");
        assert!(
            args.windows(2).all(|w| w[1] == w[0] + 1),
            "{case}: {args:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
        let after = child.try_wait().unwrap();
        assert!(after.is_none(), "{case}: died after detach: {after:?}");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

/// Attached while the dynamic loader relocates the program (blocked in an
/// IFUNC resolver, libc mapped but not initialised, `r_state` RT_ADD): the
/// agent is not loaded into the half-made process (a remote `dlopen` there
/// faulted: the CI flake of the test above, attached right after spawn),
/// the probe takes the trap, and the program runs on unchanged with every
/// call counted.
#[test]
fn attached_inside_the_loader_the_agent_waits_and_nothing_breaks() {
    let bin = program("loader_gate", &["-O1"]);
    let mut child = Command::new(&bin)
        .arg("25")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // "L": the resolver runs and now blocks reading stdin.
    let mut mark = [0u8; 1];
    std::io::Read::read_exact(child.stderr.as_mut().unwrap(), &mut mark).unwrap();
    assert_eq!(&mark, b"L");
    let mut s = Session::new();
    let t = s.attach(child.id() as i32).unwrap();
    let added = s.add(t, "work_impl", Action::Count).unwrap();
    let p = &added.placements[0];
    assert_eq!(p.mechanism, Mechanism::Trap, "{}", p.reason);
    assert!(
        p.reason.contains("dynamic loader is still loading"),
        "the reason names the loader: {}",
        p.reason
    );
    s.start().unwrap();
    child.stdin.take().unwrap().write_all(b"g").unwrap();
    assert_eq!(s.run().unwrap(), RunEnd::AllExited);
    assert_eq!(s.stats(p.id).unwrap().hits, 25);
    // The session reaped its tracee (our child too): its status is the session's.
    assert_eq!(
        s.exit_status(t),
        Some(hotprobe::ExitStatus::Code(0)),
        "{:?}",
        s.take_notices()
    );
    let mut out = String::new();
    std::io::Read::read_to_string(child.stdout.as_mut().unwrap(), &mut out).unwrap();
    assert_eq!(out, "sum 925 calls 25\n");
    // Reaped by the session already: this wait finds no child.
    assert!(child.wait().is_err());
}
