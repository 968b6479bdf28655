//! Issue 21: a probe with handlers on a function of a library the program
//! loads later (dlopen) is pending at first; when the library is loaded it
//! is planned and placed through the mechanisms as one placed at the start
//! is (a shared-memory handler at a patch or jump site under `auto`, the
//! trap when that is asked), under the id it was given, in the code ledger
//! once. Its handler sees every call with its arguments, and detach puts
//! the library's bytes back while the program runs on.
//!
//! A library unloaded and loaded again: the probe is armed again (its
//! handler, or its condition compiled again), every call seen.
//! [`CountSink::place`]'s condition naming parameters compiles when the
//! library is loaded, or says why not.
//!
//! The C programs are the CLI tests' (crates/hotprobe-cli/tests/programs):
//! dlopen_cond.c calls scale(n, 100 - 30 * n) for n = 0 .. 11;
//! dlopen_twice.c calls libtest.c's libfn(i) for i = 0 .. 2, unloads the
//! library, loads it again and calls libfn(i) for i = 0 .. 3.

use std::cell::RefCell;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use hotprobe::{
    Action, CountSink, Mechanism, MechanismChoice, Probe, RunEnd, Session, SessionConfig,
    SpawnOptions,
};

const CALLS: usize = 12;
/// Long enough that a loaded machine starving the session of CPU
/// withdraws no call.
const SERVED: Duration = Duration::from_secs(60);

fn dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pending_handlers");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../hotprobe-cli/tests/programs")
        .join(format!("{name}.c"))
}

/// The library (libpendh.so, with DWARF), the program that dlopens it,
/// and the same program linked with it.
fn build() -> (PathBuf, PathBuf, PathBuf) {
    let d = dir();
    let so = hotprobe_testkit::compile(
        "gcc",
        &source("dlopen_cond_lib"),
        &d.join("libpendh.so"),
        &["-O1", "-g", "-shared", "-fPIC"],
        &[],
    );
    let flags = ["-O1", "-g"];
    let dlopening = hotprobe_testkit::compile(
        "gcc",
        &source("dlopen_cond"),
        &d.join("dlopen"),
        &flags,
        &["-ldl"],
    );
    let (l, rpath) = (
        format!("-L{}", d.display()),
        format!("-Wl,-rpath,{}", d.display()),
    );
    let linked = hotprobe_testkit::compile(
        "gcc",
        &source("dlopen_cond"),
        &d.join("linked"),
        &["-O1", "-g", "-DLINKED"],
        &[&l, "-lpendh", &rpath],
    );
    (so, dlopening, linked)
}

/// The calls dlopen_cond.c makes: (n, weight).
fn expected() -> Vec<(i64, i64)> {
    (0..CALLS as i64).map(|n| (n, 100 - 30 * n)).collect()
}

/// The calls a handler saw: (n, weight).
type Seen = Rc<RefCell<Vec<(i64, i64)>>>;

/// A pre handler noting each call's (n, weight); it stops the run at the
/// last call.
fn noting() -> (Probe, Seen) {
    let seen = Rc::new(RefCell::new(Vec::new()));
    let s = seen.clone();
    let probe = Probe::new().pre(move |ctx| {
        let n = ctx.arg(0).expect("rdi") as u32 as i32 as i64;
        let w = ctx.arg(1).expect("rsi") as i64;
        s.borrow_mut().push((n, w));
        if s.borrow().len() == CALLS {
            ctx.stop();
        }
    });
    (probe, seen)
}

/// `len` bytes of `path` at the file offset process `pid` maps at `addr`.
fn file_bytes(pid: i32, addr: u64, len: usize) -> Vec<u8> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    for l in maps.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        let (lo, hi) = w[0].split_once('-').unwrap();
        let (lo, hi) = (
            u64::from_str_radix(lo, 16).unwrap(),
            u64::from_str_radix(hi, 16).unwrap(),
        );
        if (lo..hi).contains(&addr) {
            let off = u64::from_str_radix(w[2], 16).unwrap();
            let mut b = vec![0u8; len];
            File::open(w[5])
                .unwrap()
                .read_exact_at(&mut b, addr - lo + off)
                .unwrap();
            return b;
        }
    }
    panic!("nothing maps {addr:#x} in {pid}:\n{maps}");
}

fn memory(pid: i32, addr: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    File::open(format!("/proc/{pid}/mem"))
        .unwrap()
        .read_exact_at(&mut b, addr)
        .unwrap();
    b
}

/// A session with `mechanism` on `prog ARGS`, stdout to a file, stdin a
/// pipe whose write end is returned.
fn spawn(
    mechanism: MechanismChoice,
    prog: &Path,
    args: &[&str],
    tag: &str,
) -> (Session, hotprobe::TargetId, PathBuf, std::io::PipeWriter) {
    let out = dir().join(format!("out-{tag}-{}", std::process::id()));
    let (r, w) = std::io::pipe().unwrap();
    let mut s = Session::with_config(SessionConfig {
        mechanism,
        ..SessionConfig::default()
    });
    s.set_handler_timeout(SERVED);
    let args: Vec<std::ffi::OsString> = args.iter().map(|a| a.into()).collect();
    let t = s
        .spawn_with(
            prog,
            &args,
            &SpawnOptions {
                stdin: Some(File::from(OwnedFd::from(r))),
                stdout: Some(File::create(&out).unwrap()),
                ..Default::default()
            },
        )
        .expect("spawn");
    (s, t, out, w)
}

/// The mechanism a handler probe on `scale` gets when placed at the
/// start of the program linked with the library; its handler sees every
/// call.
fn placed_at_start(mechanism: MechanismChoice, linked: &Path, so: &Path) -> Mechanism {
    let (mut s, t, out, w) = spawn(mechanism, linked, &[so.to_str().unwrap(), "12"], "linked");
    drop(w);
    let (probe, seen) = noting();
    let added = s
        .add(t, "libpendh.so:scale", Action::Handler(probe))
        .unwrap();
    let placed = added.placements[0].mechanism;
    assert_ne!(placed, Mechanism::Pending);
    s.start().unwrap();
    while s.run().unwrap() != RunEnd::AllExited {}
    assert_eq!(*seen.borrow(), expected());
    let printed = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        printed.lines().filter(|l| l.starts_with("call ")).count(),
        CALLS
    );
    placed
}

fn pending_handler(mechanism: MechanismChoice, tag: &str) {
    let (so, dlopening, linked) = build();
    let at_start = placed_at_start(mechanism, &linked, &so);
    // Under `auto`, a shared-memory handler at a patch or jump site (no
    // ptrace stop per call); the trap when asked.
    match mechanism {
        MechanismChoice::Trap => assert_eq!(at_start, Mechanism::Trap),
        _ => assert!(
            matches!(at_start, Mechanism::Patch(_) | Mechanism::Jump),
            "{at_start:?}"
        ),
    }
    let so_arg = so.to_str().unwrap();
    let (mut s, t, out, w) = spawn(mechanism, &dlopening, &[so_arg, "12", "wait"], tag);
    let pid = s.pid(t).unwrap();
    let (probe, seen) = noting();
    let added = s
        .add(t, "libpendh.so:scale", Action::Handler(probe))
        .unwrap();
    let pending = &added.placements[0];
    assert_eq!(pending.mechanism, Mechanism::Pending, "{pending:?}");
    let id = pending.id;
    s.start().unwrap();
    assert_eq!(s.run().unwrap(), RunEnd::Stopped);
    assert_eq!(*seen.borrow(), expected());

    // Armed once, under its id, on the mechanism a probe placed at the
    // start gets.
    let armed = s.armed_pending().to_vec();
    assert_eq!(armed.len(), 1, "{armed:?}");
    let placed = &armed[0].placement;
    assert_eq!(placed.id, id);
    assert_eq!(placed.mechanism, at_start, "{placed:?}");
    assert_eq!(placed.function.as_deref(), Some("scale"));
    assert_eq!(s.stats(id).unwrap().hits, CALLS as u64);

    // One ledger entry covers the function's entry, with the file's bytes
    // as its original ones; the memory there is changed until detach.
    let addr = placed.addr.0;
    let sites: Vec<(u64, Vec<u8>)> = s
        .code_ledger(t)
        .unwrap()
        .iter()
        .filter(|c| c.start <= addr && addr < c.end())
        .map(|c| (c.start, c.original().to_vec()))
        .collect();
    assert_eq!(sites.len(), 1, "{sites:?}");
    let (start, original) = &sites[0];
    assert_eq!(*original, file_bytes(pid, *start, original.len()));
    assert_ne!(memory(pid, *start, original.len()), *original);
    s.detach().unwrap();
    assert_eq!(memory(pid, *start, original.len()), *original);

    // The program runs on untraced and ends as it would have.
    drop(w);
    let (_, status) = hotprobe::os::sys::waitpid(pid, 0)
        .expect("waitpid")
        .expect("an exit");
    assert_eq!(status, 0, "wait status {status:#x}");
    let printed = std::fs::read_to_string(&out).unwrap();
    let calls: Vec<&str> = printed.lines().filter(|l| l.starts_with("call ")).collect();
    let want: Vec<String> = expected()
        .iter()
        .map(|(n, w)| format!("call {n} {w}"))
        .collect();
    assert_eq!(calls, want);
    assert!(printed.ends_with("bye\n"), "{printed}");
}

#[test]
fn a_pending_handler_probe_arms_through_the_mechanisms_as_at_the_start() {
    pending_handler(MechanismChoice::Auto, "auto");
}

#[test]
fn a_pending_handler_probe_asked_on_the_trap_arms_on_the_trap() {
    pending_handler(MechanismChoice::Trap, "trap");
}

/// libtest.so and dlopen_twice.
fn build_twice() -> (PathBuf, PathBuf) {
    let d = dir();
    let so = hotprobe_testkit::compile(
        "gcc",
        &source("libtest"),
        &d.join("libtest.so"),
        &["-O1", "-g", "-shared", "-fPIC"],
        &[],
    );
    let prog = hotprobe_testkit::compile(
        "gcc",
        &source("dlopen_twice"),
        &d.join("dlopen_twice"),
        &["-O1", "-g"],
        &["-ldl"],
    );
    (so, prog)
}

const TWICE_OUTPUT: &str = "first libfn 3\nunloaded yes\nsecond libfn 4\ntotal libfn 7\n";

fn unloaded_and_loaded_again(mechanism: MechanismChoice, tag: &str) {
    let (so, prog) = build_twice();
    let (mut s, t, out, w) = spawn(mechanism, &prog, &[so.to_str().unwrap()], tag);
    drop(w);
    let seen = Rc::new(RefCell::new(Vec::new()));
    let noted = seen.clone();
    let probe = Probe::new().pre(move |ctx| noted.borrow_mut().push(ctx.arg(0).expect("rdi")));
    let added = s
        .add(t, "libtest.so:libfn", Action::Handler(probe))
        .unwrap();
    let id = added.placements[0].id;
    assert_eq!(added.placements[0].mechanism, Mechanism::Pending);
    s.start().unwrap();
    while s.run().unwrap() != RunEnd::AllExited {}
    assert_eq!(std::fs::read_to_string(&out).unwrap(), TWICE_OUTPUT);
    assert_eq!(*seen.borrow(), vec![0, 1, 2, 0, 1, 2, 3]);
    // Armed at each load, under its id, on the same mechanism.
    let armed = s.armed_pending();
    assert_eq!(armed.len(), 2, "{armed:?}");
    assert!(armed.iter().all(|a| a.placement.id == id), "{armed:?}");
    assert_eq!(armed[0].placement.mechanism, armed[1].placement.mechanism);
    if mechanism == MechanismChoice::Trap {
        assert_eq!(armed[0].placement.mechanism, Mechanism::Trap);
    } else {
        assert_ne!(armed[0].placement.mechanism, Mechanism::Trap, "{armed:?}");
    }
}

#[test]
fn a_pending_handler_probe_is_armed_again_when_its_library_is_loaded_again() {
    unloaded_and_loaded_again(MechanismChoice::Auto, "twice-auto");
    unloaded_and_loaded_again(MechanismChoice::Trap, "twice-trap");
}

/// `CountSink::place` with a condition naming libfn's parameter `x`, on
/// the library not loaded yet: compiled at each load (x >= 1: 2 of the
/// first 3 calls, 3 of the next 4); on a name it lacks, a notice and
/// every hit not counted.
#[test]
fn a_count_sink_condition_compiles_when_the_library_is_loaded() {
    let (so, prog) = build_twice();
    let run = |cond: &str, tag: &str| {
        let (mut s, t, out, w) = spawn(MechanismChoice::Auto, &prog, &[so.to_str().unwrap()], tag);
        drop(w);
        let mut sink = CountSink::new(false);
        let added = sink
            .place(&mut s, t, "libtest.so:libfn", Some(cond))
            .unwrap();
        assert_eq!(added.placements[0].mechanism, Mechanism::Pending);
        s.start().unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        while s.run_with(&stop, Some(&mut sink)).unwrap() != RunEnd::AllExited {}
        assert_eq!(std::fs::read_to_string(&out).unwrap(), TWICE_OUTPUT);
        (sink, added.placements[0].id)
    };
    let (mut sink, id) = run("x >= 1", "sink-x");
    assert_eq!(sink.hits(id), Some(5));
    assert_eq!(sink.uncountable_hits(), 0);
    assert!(sink.take_notices().is_empty());

    let (mut sink, id) = run("size >= 1", "sink-size");
    assert_eq!(sink.hits(id), Some(0));
    assert_eq!(sink.uncountable_hits(), 7);
    let notices = sink.take_notices();
    assert_eq!(notices.len(), 2, "one per load: {notices:?}");
    for n in &notices {
        assert!(
            n.ends_with(
                "`libtest.so:libfn if size >= 1`: the condition: libfn has no parameter size; \
                 its parameters: x; its hits are not counted"
            ),
            "{n}"
        );
    }
}

/// A pending probe removed before its library is loaded is not armed
/// when it is: no placement, no hit, the program's calls all its own.
#[test]
fn a_pending_probe_removed_is_not_armed_when_its_library_loads() {
    let (so, dlopening, _) = build();
    let so_arg = so.to_str().unwrap();
    let (mut s, t, out, w) = spawn(
        MechanismChoice::Auto,
        &dlopening,
        &[so_arg, "12"],
        "removed",
    );
    drop(w);
    let (probe, seen) = noting();
    let added = s
        .add(t, "libpendh.so:scale", Action::Handler(probe))
        .unwrap();
    let id = added.placements[0].id;
    assert_eq!(added.placements[0].mechanism, Mechanism::Pending);
    s.remove_probe(id).unwrap();
    s.start().unwrap();
    let mut notices = Vec::new();
    while s.run().unwrap() != RunEnd::AllExited {
        notices.extend(s.take_notices());
    }
    notices.extend(s.take_notices());
    // Before, the removed spec was still armed at the load: a "cannot
    // arm libpendh.so:scale: no such probe" notice (its engine probe
    // gone), or, counting, a placement nobody asked for.
    assert!(
        !notices.iter().any(|n| n.contains("libpendh.so:scale")),
        "{notices:?}"
    );
    assert!(s.armed_pending().is_empty(), "{:?}", s.armed_pending());
    assert!(seen.borrow().is_empty(), "{:?}", seen.borrow());
    let printed = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        printed.lines().filter(|l| l.starts_with("call ")).count(),
        CALLS
    );
}
