//! Fast-path probes (count and shared-memory handler probes, on patch and
//! jump sites) disabled, enabled again and removed while the program runs:
//! a disabled probe neither counts nor calls its handler and its site holds
//! the original bytes; enabled again it counts on; removed, the original
//! bytes are back for good and the program's output is unchanged.
//!
//! The tracee (tests/programs/fpctl.c) runs one phase per line on its
//! stdin — 4 threads each calling every probed function `ITERS` times —
//! so the counts of each phase are exact. The first phase runs unprobed,
//! so that count probes are per-site stubs.

mod support;

use hotprobe::{Action, Mechanism, ProbeId, RunEnd};
use std::cell::Cell;
use std::io::Write;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use support::{program, spawn_with_stdin, Captured};

const THREADS: u64 = 4;
const ITERS: u64 = 2000;

fn read_mem(pid: i32, addr: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, addr).unwrap();
    b
}

/// Starts phase `k` (a line on the tracee's stdin) and runs the session
/// `bin ARGS` spawned under a session, its stdin a pipe that `phase`
/// writes to: the session, the pipe's writing end, the pid.
fn spawn_phased(bin: &std::path::Path, args: &[&str]) -> (Captured, std::io::PipeWriter, i32) {
    let (reader, stdin) = std::io::pipe().unwrap();
    let reader = std::fs::File::from(std::os::fd::OwnedFd::from(reader));
    let c = spawn_with_stdin(bin, args, Some(reader));
    let pid = c.session.pid(c.target).unwrap();
    (c, stdin, pid)
}

/// until the tracee printed the phase's result.
fn phase(c: &mut Captured, stdin: &mut std::io::PipeWriter, k: u32) {
    stdin.write_all(b"go\n").unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let (flag, out) = (done.clone(), c.out.clone());
    let watcher = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(120);
        let want = format!("phase {k} total ");
        while Instant::now() < deadline {
            let text = std::fs::read_to_string(&out).unwrap_or_default();
            if text.lines().any(|l| l.starts_with(&want)) {
                flag.store(true, Ordering::Relaxed);
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        flag.store(true, Ordering::Relaxed);
        false
    });
    let end = c.session.run_until(&done).unwrap();
    assert!(watcher.join().unwrap(), "phase {k} did not finish");
    assert_eq!(end, RunEnd::Interrupted, "phase {k}");
}

#[test]
fn disable_enable_and_remove_count_and_handler_probes_on_patch_and_jump() {
    let bin = program("fpctl", &["-O2"]);
    let args = [THREADS.to_string(), ITERS.to_string()];
    let args: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let native = {
        let mut child = std::process::Command::new(&bin)
            .args(&args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"1\n2\n3\n4\n5\n")
            .unwrap();
        String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap()
    };
    assert_eq!(native.lines().count(), 5, "{native}");

    let (mut c, mut stdin, pid) = spawn_phased(&bin, &args);
    let t = c.target;

    let names = ["cnt_patched", "cnt_jumped", "h_patched", "h_jumped"];
    let originals: Vec<(u64, Vec<u8>)> = names
        .iter()
        .map(|n| {
            let a = c.session.resolve(t, n).unwrap()[0].addr.0;
            (a, read_mem(pid, a, 8))
        })
        .collect();

    let mut ids: Vec<ProbeId> = Vec::new();
    let mut mechanisms: Vec<Mechanism> = Vec::new();
    let calls: Vec<Rc<Cell<u64>>> = (0..2).map(|_| Rc::new(Cell::new(0))).collect();
    let mut handler_ids = Vec::new();
    for (n, seen) in names[2..].iter().zip(&calls) {
        let seen = seen.clone();
        let probe = hotprobe::Probe::new().pre(move |_| seen.set(seen.get() + 1));
        let p = c
            .session
            .add(t, n, Action::Handler(probe))
            .unwrap()
            .placements[0]
            .clone();
        handler_ids.push((p.id, p.mechanism));
    }
    // Phase 1 runs with the handler probes only (they keep the session's
    // loop polling): the agent publishes its TLS offset once threads ran,
    // and only then are count probes per-site stubs — which never read
    // the site table, so flipping the action alone would not disable them.
    c.session.start().unwrap();
    phase(&mut c, &mut stdin, 1);
    for seen in &calls {
        assert_eq!(seen.get(), THREADS * ITERS, "phase 1: handlers");
        seen.set(0);
    }
    for n in &names[..2] {
        let p = c.session.add(t, n, Action::Count).unwrap().placements[0].clone();
        ids.push(p.id);
        mechanisms.push(p.mechanism);
    }
    for (id, m) in handler_ids {
        ids.push(id);
        mechanisms.push(m);
    }
    assert!(
        matches!(mechanisms[0], Mechanism::Patch(_)),
        "{mechanisms:?}"
    );
    assert_eq!(mechanisms[1], Mechanism::Jump, "{mechanisms:?}");
    assert!(
        matches!(mechanisms[2], Mechanism::Patch(_)),
        "{mechanisms:?}"
    );
    assert_eq!(mechanisms[3], Mechanism::Jump, "{mechanisms:?}");

    let counts = |c: &mut Captured| -> Vec<u64> {
        let mut v: Vec<u64> = ids[..2]
            .iter()
            .map(|id| c.session.stats(*id).unwrap().hits)
            .collect();
        v.extend(calls.iter().map(|x| x.get()));
        v
    };
    let bytes_now = || -> Vec<Vec<u8>> {
        originals
            .iter()
            .map(|(a, _)| read_mem(pid, *a, 8))
            .collect()
    };
    let original: Vec<Vec<u8>> = originals.iter().map(|(_, b)| b.clone()).collect();

    let n = THREADS * ITERS;
    phase(&mut c, &mut stdin, 2);
    assert_eq!(counts(&mut c), vec![n; 4], "phase 2: all enabled");
    let patched = bytes_now();
    for (p, o) in patched.iter().zip(&original) {
        assert_ne!(p, o, "armed sites are rewritten");
    }

    for id in &ids {
        c.session.set_enabled(*id, false).unwrap();
    }
    assert_eq!(bytes_now(), original, "disabled: the original bytes");
    phase(&mut c, &mut stdin, 3);
    assert_eq!(counts(&mut c), vec![n; 4], "phase 3: no hit while disabled");

    for id in &ids {
        c.session.set_enabled(*id, true).unwrap();
    }
    assert_eq!(bytes_now(), patched, "enabled again: the same rewrite");
    phase(&mut c, &mut stdin, 4);
    assert_eq!(counts(&mut c), vec![2 * n; 4], "phase 4: counting again");

    for id in &ids {
        c.session.remove_probe(*id).unwrap();
    }
    assert_eq!(bytes_now(), original, "removed: the original bytes");
    for id in &ids {
        assert!(
            matches!(
                c.session.remove_probe(*id),
                Err(hotprobe::EngineError::NoSuchProbe(_))
            ),
            "removed twice"
        );
        assert!(
            c.session.set_enabled(*id, true).is_err(),
            "enabling a removed probe"
        );
    }
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    assert_eq!(c.session.run().unwrap(), RunEnd::AllExited);
    assert_eq!(counts(&mut c), vec![2 * n; 4], "phase 5: removed, no hit");
    assert_eq!(c.output(), native, "the program's output is unchanged");
}

/// Two count probes on one patch site: a site calls the agent for one
/// probe, so the second is not written over the first's call (issue 21):
/// the site goes to the trap with the first, which serves both. After the
/// first is removed the second counts on (its `int3` stays in memory);
/// after the second, the original bytes are back (not the first's call),
/// and no site is reported as another writer's.
#[test]
fn removing_the_first_of_two_probes_on_one_patch_site_keeps_the_second() {
    let bin = program("fpctl", &["-O2"]);
    let args = ["1", &ITERS.to_string()];
    let (mut c, mut stdin, pid) = spawn_phased(&bin, &args);
    let t = c.target;
    let addr = c.session.resolve(t, "cnt_patched").unwrap()[0].addr.0;
    let original = read_mem(pid, addr, 8);
    // Every wait of the session's loop bounded, so that it sees the end of
    // a phase (a handler probe did that when both probes were patches; a
    // pass serving handlers waits up to 20 ms for a call, each trap hit
    // would wait that long).
    c.session.set_wait_deadline(Some(std::time::Instant::now()));
    // And a shared-memory handler probe in the same traced process: its
    // serving must not hold the trap's stops back (each waited up to
    // 20 ms, and phase 1 did not end within 120 s).
    let probe = hotprobe::Probe::new().pre(|_| {});
    c.session
        .add(t, "h_patched", Action::Handler(probe))
        .unwrap();
    let first = c
        .session
        .add(t, "cnt_patched", Action::Count)
        .unwrap()
        .placements[0]
        .clone();
    let second = c
        .session
        .add(t, "cnt_patched", Action::Count)
        .unwrap()
        .placements[0]
        .clone();
    assert!(
        matches!(first.mechanism, Mechanism::Patch(_)),
        "{:?}",
        first.mechanism
    );
    assert!(
        matches!(second.mechanism, Mechanism::Trap),
        "{:?}",
        second.mechanism
    );
    let handed = c.session.take_notices();
    assert!(
        handed.iter().any(|n| n.contains("was handed to the trap")),
        "{handed:?}"
    );
    assert!(
        c.session.execution_of(first.id).is_some(),
        "both on the trap"
    );
    c.session.start().unwrap();
    phase(&mut c, &mut stdin, 1);
    let hits = |c: &Captured, p: &hotprobe::Placement| c.session.stats(p.id).unwrap().hits;
    assert_eq!(
        (hits(&c, &first), hits(&c, &second)),
        (ITERS, ITERS),
        "both count"
    );
    let second_bytes = read_mem(pid, addr, 8);

    c.session.remove_probe(first.id).unwrap();
    assert_eq!(
        read_mem(pid, addr, 8),
        second_bytes,
        "the second's int3 stays"
    );
    phase(&mut c, &mut stdin, 2);
    assert_eq!(hits(&c, &second), 2 * ITERS, "the second counts on");

    c.session.remove_probe(second.id).unwrap();
    assert_eq!(
        read_mem(pid, addr, 8),
        original,
        "the original, not the first's call"
    );
    assert!(
        c.session.take_notices().is_empty(),
        "no site reported as another writer's"
    );
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    assert_eq!(c.session.run().unwrap(), RunEnd::AllExited);
    // A trap probe removed has no counts left to read (a fast-path one
    // keeps them): none may have grown.
    let after = c.session.stats(second.id).map(|s| s.hits);
    assert!(
        after.is_none_or(|h| h == 2 * ITERS),
        "removed: no hit in phase 3 ({after:?})"
    );
}

/// Two count probes on one jump site: the second jump chains on the first
/// (both on the jump, both counting). Removing the first hands the site to
/// the trap with both (the later jump's trampoline runs the earlier one's,
/// so the first would go on counting): the second counts on, the first no
/// more; removing the second brings the original bytes back, with no site
/// reported as another writer's.
#[test]
fn removing_the_first_of_two_chained_jumps_keeps_the_second_alone() {
    let bin = program("fpctl", &["-O2"]);
    let args = ["1", &ITERS.to_string()];
    let (mut c, mut stdin, pid) = spawn_phased(&bin, &args);
    let t = c.target;
    let addr = c.session.resolve(t, "cnt_jumped").unwrap()[0].addr.0;
    let original = read_mem(pid, addr, 8);
    c.session.set_wait_deadline(Some(std::time::Instant::now()));
    let add = |c: &mut Captured| {
        c.session
            .add(t, "cnt_jumped", Action::Count)
            .unwrap()
            .placements[0]
            .clone()
    };
    let (first, second) = (add(&mut c), add(&mut c));
    for p in [&first, &second] {
        assert!(matches!(p.mechanism, Mechanism::Jump), "{:?}", p.mechanism);
    }
    c.session.start().unwrap();
    phase(&mut c, &mut stdin, 1);
    let hits = |c: &Captured, p: &hotprobe::Placement| c.session.stats(p.id).map(|s| s.hits);
    assert_eq!(
        (hits(&c, &first), hits(&c, &second)),
        (Some(ITERS), Some(ITERS)),
        "both count"
    );
    c.session.take_notices();

    c.session.remove_probe(first.id).unwrap();
    let handed = c.session.take_notices();
    assert!(
        handed.iter().any(|n| n.contains("was handed to the trap")),
        "{handed:?}"
    );
    phase(&mut c, &mut stdin, 2);
    assert_eq!(hits(&c, &second), Some(2 * ITERS), "the second counts on");
    // The first, removed, counted nothing more (a trap probe removed has
    // no counts left to read).
    let first_after = hits(&c, &first);
    assert!(
        first_after.is_none_or(|h| h == ITERS),
        "the first no more: {first_after:?}"
    );

    c.session.remove_probe(second.id).unwrap();
    assert_eq!(read_mem(pid, addr, 8), original, "the original bytes");
    assert!(
        c.session.take_notices().is_empty(),
        "no site reported as another writer's"
    );
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    assert_eq!(c.session.run().unwrap(), RunEnd::AllExited);
}
