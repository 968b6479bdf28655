//! Every pair of mechanisms the per-probe API can place on one function
//! (issue 21): the trap's entry probe, the trap's return probe, the
//! in-process trap (a handler probe with a post handler), the fast path's
//! patch or jump (a count), and a shared-memory handler (a pre handler on
//! the fast path's handler call), each pair in both orders, on a program
//! started under the session (the in-process trap is refused in a process
//! attached to) that runs on after the detach. Each probe
//! placed counts exactly the calls made; after the detach every address
//! the code ledger listed holds its original bytes (the file's, for the
//! program's own code) and the program's output is what it prints unprobed.

mod support;

use hotprobe::{Action, EngineError, MechanismChoice, Probe, ProbeId, Session, SpawnOptions};
use std::cell::Cell;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::OwnedFd;
use std::process::{Child, Command, Stdio};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::program;

/// Calls of `compute` made while a pair is placed.
const CALLS: u32 = 20;
/// The longest one command may take (one still going is a hang).
const LIMIT: Duration = Duration::from_secs(60);

/// One way of probing `compute`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mech {
    TrapEntry,
    TrapReturn,
    InProcess,
    Fast,
    ShmHandler,
}

const MECHS: [Mech; 5] = [
    Mech::TrapEntry,
    Mech::TrapReturn,
    Mech::InProcess,
    Mech::Fast,
    Mech::ShmHandler,
];

/// `target serve`, its commands sent through stdin, its lines read by a
/// thread that raises `done` at each `done …` line.
struct Served {
    /// Run unprobed, or `None`: started by a session.
    child: Option<Child>,
    stdin: Option<Box<dyn Write>>,
    lines: Receiver<String>,
    done: Arc<AtomicBool>,
    pid: i32,
}

impl Served {
    /// Started unprobed.
    fn start(bin: &std::path::Path) -> Served {
        let mut child = Command::new(bin)
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = Box::new(child.stdin.take().unwrap());
        let out = child.stdout.take().unwrap();
        let mut served = Served::reading(out, stdin);
        served.child = Some(child);
        served.ready();
        served
    }

    /// Spawned by `s` (its `ready` line is read once `s` runs it).
    fn spawn(s: &mut Session, bin: &std::path::Path) -> (Served, hotprobe::TargetId) {
        let (in_r, in_w) = std::io::pipe().unwrap();
        let (out_r, out_w) = std::io::pipe().unwrap();
        let opts = SpawnOptions {
            stdin: Some(File::from(OwnedFd::from(in_r))),
            stdout: Some(File::from(OwnedFd::from(out_w))),
            ..Default::default()
        };
        let t = s.spawn_with(bin, &["serve".into()], &opts).unwrap();
        drop(opts);
        (Served::reading(out_r, Box::new(in_w)), t)
    }

    fn reading(out: impl Read + Send + 'static, stdin: Box<dyn Write>) -> Served {
        let mut out = BufReader::new(out);
        let done = Arc::new(AtomicBool::new(false));
        let (tx, lines) = std::sync::mpsc::channel();
        let seen = done.clone();
        std::thread::spawn(move || loop {
            let mut l = String::new();
            if out.read_line(&mut l).unwrap_or(0) == 0 {
                return;
            }
            let is_done = l.starts_with("done ");
            if tx.send(l.trim_end().to_string()).is_err() {
                return;
            }
            if is_done {
                seen.store(true, Ordering::SeqCst);
            }
        });
        Served {
            child: None,
            stdin: Some(stdin),
            lines,
            done,
            pid: 0,
        }
    }

    /// Reads the `ready PID` line.
    fn ready(&mut self) {
        let ready = self.lines.recv_timeout(LIMIT).unwrap();
        self.pid = ready.strip_prefix("ready ").unwrap().parse().unwrap();
    }

    /// Closes its input and reads the rest: `bye` as it ends.
    fn finish(&mut self) -> Vec<String> {
        self.stdin = None;
        let mut rest = Vec::new();
        while let Ok(l) = self.lines.recv_timeout(LIMIT) {
            rest.push(l);
        }
        rest
    }

    /// Sends `cmd` (its `done` not seen yet).
    fn send(&mut self, cmd: &str) {
        self.done.store(false, Ordering::SeqCst);
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
    }

    /// The lines of the command sent last, up to its `done` line.
    fn reply(&mut self) -> Vec<String> {
        let mut v = Vec::new();
        loop {
            match self.lines.recv_timeout(LIMIT) {
                Ok(l) => {
                    let done = l.starts_with("done ");
                    v.push(l);
                    if done {
                        return v;
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!("no `done` line: {v:?}"),
                Err(RecvTimeoutError::Disconnected) => panic!("the program closed its output"),
            }
        }
    }

    /// Runs `cmd` unprobed.
    fn run(&mut self, cmd: &str) -> Vec<String> {
        self.send(cmd);
        self.reply()
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A probe placed by [`place`]: its id, and the hits its handler saw
/// (handler probes).
struct Placed {
    id: ProbeId,
    handled: Option<Rc<Cell<u64>>>,
    mechanism: String,
}

/// Places `m` on `compute` through the per-probe API.
fn place(s: &mut Session, t: hotprobe::TargetId, m: Mech) -> Result<Placed, EngineError> {
    let handled = Rc::new(Cell::new(0u64));
    let h = handled.clone();
    let pre = move |_: &mut hotprobe::HitContext<'_>| h.set(h.get() + 1);
    let (spec, action, choice) = match m {
        Mech::TrapEntry => ("compute", Action::Count, MechanismChoice::Trap),
        Mech::TrapReturn => ("compute%return", Action::Count, MechanismChoice::Trap),
        Mech::Fast => ("compute", Action::Count, MechanismChoice::Auto),
        Mech::InProcess => (
            "compute",
            Action::Handler(Probe::new().pre(pre).post(|_| {})),
            MechanismChoice::Auto,
        ),
        Mech::ShmHandler => (
            "compute",
            Action::Handler(Probe::new().pre(pre)),
            MechanismChoice::Auto,
        ),
    };
    let handler = matches!(action, Action::Handler(_));
    let added = s.add_using(t, spec, action, choice)?;
    let [p] = &added.placements[..] else {
        panic!("{m:?}: {:?}", added.placements.len());
    };
    Ok(Placed {
        id: p.id,
        handled: handler.then_some(handled),
        mechanism: format!("{} / {}", p.mechanism, p.execution),
    })
}

/// The bytes of process `pid` at `addr` (/proc/PID/mem), if mapped.
fn memory_at(pid: i32, addr: u64, len: usize) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt;
    let mem = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut b = vec![0u8; len];
    mem.read_exact_at(&mut b, addr).ok().map(|_| b)
}

/// The file and offset behind `addr` of process `pid`, if a file maps it.
fn file_behind(pid: i32, addr: u64) -> Option<(String, u64)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        let (s, e) = w.first()?.split_once('-')?;
        let (s, e) = (
            u64::from_str_radix(s, 16).ok()?,
            u64::from_str_radix(e, 16).ok()?,
        );
        let offset = u64::from_str_radix(w.get(2)?, 16).ok()?;
        let path = w.get(5).filter(|p| p.starts_with('/'))?;
        (s..e)
            .contains(&addr)
            .then(|| (path.to_string(), addr - s + offset))
    })
}

#[test]
fn every_pair_of_mechanisms_on_one_function_leaves_the_original_bytes_at_detach() {
    pairs_on_compute(&MECHS, false);
}

/// The same in a process attached to while it runs (`-p`): the in-process
/// trap is refused there (the agent injected cannot keep `SIGTRAP`
/// unblocked), the other four are paired.
#[test]
fn every_pair_on_one_function_of_a_process_attached_to_leaves_the_original_bytes() {
    let mechs: Vec<Mech> = MECHS
        .into_iter()
        .filter(|m| *m != Mech::InProcess)
        .collect();
    pairs_on_compute(&mechs, true);
}

/// Places every ordered pair of `mechs` on `compute`, each on a `target
/// serve` of its own, spawned by the session or (`attach`) started and
/// attached to (see the module docs).
fn pairs_on_compute(mechs: &[Mech], attach: bool) {
    let bin = program("target", &["-O2"]);
    let file = std::fs::read(&bin).unwrap();
    let bin_path = bin.canonicalize().unwrap();
    let compute = format!("compute {CALLS}");
    for &first in mechs {
        for &second in mechs {
            if first == second {
                continue;
            }
            let pair = (first, second, attach);
            let mut s = Session::new();
            let (mut srv, t) = match attach {
                true => {
                    let srv = Served::start(&bin);
                    let t = s.attach(srv.pid).unwrap();
                    (srv, t)
                }
                false => Served::spawn(&mut s, &bin),
            };
            let a = place(&mut s, t, first).unwrap_or_else(|e| panic!("{pair:?}: {e}"));
            // The first is on the mechanism asked for.
            let on = |m: &str| a.mechanism.starts_with(m);
            let expected = match first {
                Mech::TrapEntry | Mech::TrapReturn => on("trap /"),
                Mech::InProcess => on("in-process trap /"),
                Mech::Fast => (on("jump /") || on("patch /")) && !a.mechanism.contains("handler"),
                Mech::ShmHandler => {
                    (on("jump /") || on("patch /")) && a.mechanism.contains("shared-memory handler")
                }
            };
            assert!(expected, "{pair:?}: {first:?} placed as {}", a.mechanism);
            // The second joins the first's site or is refused with the
            // reason; it never writes over it.
            let b = match place(&mut s, t, second) {
                Ok(b) => Some(b),
                Err(EngineError::RefusedSpec { reason, .. }) => {
                    assert!(!reason.is_empty(), "{pair:?}");
                    None
                }
                Err(e) => panic!("{pair:?}: {e}"),
            };
            let ledger: Vec<(u64, Vec<u8>)> = s
                .code_ledger(t)
                .unwrap()
                .iter()
                .map(|site| (site.start, site.original().to_vec()))
                .collect();
            assert!(!ledger.is_empty(), "{pair:?}: nothing written");
            s.start().unwrap();
            s.set_wait_deadline(Some(Instant::now()));
            if !attach {
                srv.ready();
            }
            // The same program unprobed, given the same commands.
            let mut native = Served::start(&bin);
            srv.send(&compute);
            let end = s.run_until(&srv.done).unwrap();
            assert_eq!(end, hotprobe::RunEnd::Interrupted, "{pair:?}");
            let probed = srv.reply();
            assert_eq!(probed, native.run(&compute), "{pair:?}: output changed");
            for (m, p) in [(first, Some(&a)), (second, b.as_ref())] {
                let Some(p) = p else { continue };
                let st = s.stats(p.id).unwrap();
                let counted = match m {
                    Mech::TrapReturn => st.returns,
                    _ => st.hits,
                };
                assert_eq!(
                    (counted, st.nmissed),
                    (u64::from(CALLS), 0),
                    "{pair:?}: {m:?} on {}: {st:?}",
                    p.mechanism
                );
                if let Some(h) = &p.handled {
                    assert_eq!(h.get(), u64::from(CALLS), "{pair:?}: {m:?} handler");
                }
            }
            s.detach().unwrap();
            drop(s);
            // Every address the ledger listed holds its original bytes,
            // the file's in the program's own code.
            let mut in_program = 0;
            for (addr, original) in &ledger {
                let Some(now) = memory_at(srv.pid, *addr, original.len()) else {
                    // Scratch memory of ours, unmapped at detach.
                    assert!(file_behind(srv.pid, *addr).is_none(), "{pair:?}");
                    continue;
                };
                assert_eq!(&now, original, "{pair:?}: {addr:#x}");
                if let Some((path, off)) = file_behind(srv.pid, *addr) {
                    if std::path::Path::new(&path) == bin_path {
                        in_program += 1;
                        let off = off as usize;
                        assert_eq!(
                            &now[..],
                            &file[off..off + original.len()],
                            "{pair:?}: {addr:#x} is not the file's code"
                        );
                    }
                }
            }
            assert!(in_program > 0, "{pair:?}: no site in compute");
            // The program runs on, unprobed, as before, to its end.
            assert_eq!(srv.run("compute 3"), native.run("compute 3"), "{pair:?}");
            assert_eq!(srv.finish(), ["bye"], "{pair:?}");
        }
    }
}
