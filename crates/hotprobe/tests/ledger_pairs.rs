//! Every pair of mechanisms the per-probe API can place on one function
//! (issue 21's "pairs at one function"), in both orders, on a function an
//! exception is thrown through (C++, `g++ -O1`) and on one `longjmp`
//! leaves (C, `gcc -O1`):
//!
//! - the trap's entry probe (`Count`, [`MechanismChoice::Trap`]);
//! - the trap's return probe (`leafK%return`, the same);
//! - the in-process trap: a handler probe with a post handler, which the
//!   per-probe API puts there (`Action::Handler` under `Auto`: a patch or
//!   jump cannot run a handler after the entry instruction);
//! - the fast path's patch (`Count`, [`MechanismChoice::Patch`]: the
//!   programs are built with `-fpatchable-function-entry=5,0`);
//! - the fast path's jump (`Count`, [`MechanismChoice::Jump`]: its 5 bytes
//!   relocated with the instruction after them);
//! - a shared-memory handler: a pre handler alone (`Auto`), on the site's
//!   call to the agent.
//!
//! Each program has one copy of the function per ordered pair (`leaf0`,
//! `leaf1`, …), so that one process serves every pair: pair K goes on
//! `leafK`, placed first then second, and `run K N` calls it N times from
//! its caller, which catches the throw (or is where the `longjmp` lands)
//! every third call, the program printing its own counts. The program
//! runs while the pairs are placed: `leafK` runs with the first probe
//! alone, then again once the second is added, so the first's counts must
//! go on across the hand-over of its site.
//!
//! Each pair must:
//! - leave the program's output equal to a native run's given the same
//!   commands, and its exit status 0;
//! - count exactly: an entry (count or handler) counts every call made
//!   while it was in place, a handler runs once per call (its post
//!   handler too), a return probe counts the calls that returned as
//!   `returns` and the ones the throw or `longjmp` left as `abandoned`,
//!   none `nmissed`;
//! - place its second probe on the site the first holds (joined, or the
//!   site handed to the trap, which serves both), or refuse it with a
//!   reason listed in [`ALLOWED_REFUSALS`] (the first mechanism cannot
//!   serve that action): any other refusal fails;
//! - after the session detaches from the program, which runs on, leave
//!   at every address the code ledger ever listed its original bytes, the
//!   file's in the leaves' code (no two ledger sites overlapping at any
//!   time, each giving the file's code as its original), and the whole
//!   text of the program and of the leaves' library equal to the files.
//!
//! A process the session started takes all 30 ordered pairs; one it
//! attached to (`-p`) the 20 without the in-process trap, which is refused
//! there (the agent injected cannot keep `SIGTRAP` unblocked). A third
//! variant has the leaves in a library the program opens (`dlopen`) when
//! told: all 30 pairs are pending when added (before it runs), armed in
//! the order added when the loader maps it (`pending.rs`), and must fit
//! each other as pairs placed at once do.
//!
//! No second probe is refused in this matrix ([`ALLOWED_REFUSALS`] is
//! empty): every first mechanism's site either serves the second (the
//! trap's `int3`) or is handed to the trap, which serves both (a patch,
//! jump or in-process trap calls the agent for one probe).

use hotprobe::{EngineError, RunEnd, Session, TargetId};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

mod ledger_pairs_support;
use ledger_pairs_support::*;

#[test]
fn every_pair_on_a_function_an_exception_goes_through_in_a_process_started() {
    pairs(Lang::Throw, Mode::Started);
}

#[test]
fn every_pair_on_a_function_longjmp_leaves_in_a_process_started() {
    pairs(Lang::Longjmp, Mode::Started);
}

#[test]
fn every_pair_on_a_function_an_exception_goes_through_in_a_process_attached_to() {
    pairs(Lang::Throw, Mode::Attached);
}

#[test]
fn every_pair_on_a_function_longjmp_leaves_in_a_process_attached_to() {
    pairs(Lang::Longjmp, Mode::Attached);
}

#[test]
fn every_pair_pending_on_a_library_function_an_exception_goes_through() {
    pairs(Lang::Throw, Mode::Pending);
}

#[test]
fn every_pair_pending_on_a_library_function_longjmp_leaves() {
    pairs(Lang::Longjmp, Mode::Pending);
}

/// How the session gets the program, and when the pairs are placed.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Mode {
    /// Spawned by the session; the pairs placed before it runs.
    Started,
    /// Started here and attached to (`-p`); no in-process trap.
    Attached,
    /// Spawned by the session, its leaves in a library not mapped yet:
    /// the pairs are pending, armed as the loader maps it.
    Pending,
}

/// The checks of pair `pair` once both probes are in the target: both
/// on one site (joined, or the trap holding both), and one ledger site at
/// the function's entry `entry`.
fn check_one_site(
    s: &mut Session,
    t: TargetId,
    pair: &Pair,
    entry: u64,
    failures: &mut Vec<String>,
) {
    let when = format!("{}: {:?} then {:?}", pair.function, pair.first, pair.second);
    // `execution_of` names trap probes only (one another mechanism
    // handed to the trap too).
    let on_trap: Vec<bool> = pair
        .placed
        .iter()
        .map(|(_, p)| s.execution_of(p.id).is_some())
        .collect();
    if on_trap.contains(&true) && on_trap.contains(&false) {
        failures.push(format!("{when}: not on one site: on the trap {on_trap:?}"));
    }
    let at_entry = s
        .code_ledger(t)
        .unwrap()
        .iter()
        .filter(|site| site.end() > entry && site.start < entry + 5)
        .count();
    if at_entry != 1 {
        failures.push(format!("{when}: {at_entry} ledger sites at {entry:#x}"));
    }
}

/// Runs `leafK` [`CALLS`] times in the probed program (served by `s`)
/// and in the native one, the outputs compared: the program's counts
/// (calls, returns, left), as the native run printed them.
fn probed_run(
    s: &mut Session,
    t: TargetId,
    (srv, native): (&mut Served, &mut Served),
    k: usize,
    pair: &Pair,
    failures: &mut Vec<String>,
) -> (u64, u64, u64) {
    let cmd = format!("run {k} {CALLS}");
    srv.send(&cmd);
    let end = s.run_until(&srv.done).unwrap();
    if end != RunEnd::Interrupted {
        panic!(
            "{}: {:?} then {:?}: {end:?}: {:?}, notices {:?}\n{}",
            pair.function,
            pair.first,
            pair.second,
            s.exit_status(t),
            s.take_notices(),
            failures.join("\n")
        );
    }
    let probed = srv.reply();
    let want = native.run(&cmd);
    if probed != want {
        failures.push(format!(
            "{}: {:?} then {:?}: the output changed: {probed:?}, natively {want:?}",
            pair.function, pair.first, pair.second
        ));
    }
    program_counts(&want[0])
}

/// Places every ordered pair of the mechanisms (without the in-process
/// trap when attached to) on its own `leafK` of one `lang` program, runs
/// each, and detaches (see the module docs). Every failure is collected,
/// then reported together.
fn pairs(lang: Lang, mode: Mode) {
    let began = Instant::now();
    let mechs: Vec<Mech> = MECHS
        .into_iter()
        .filter(|m| !(mode == Mode::Attached && *m == Mech::InProcess))
        .collect();
    let ordered: Vec<(Mech, Mech)> = mechs
        .iter()
        .flat_map(|&a| mechs.iter().map(move |&b| (a, b)))
        .filter(|(a, b)| a != b)
        .collect();
    let built = build(lang, mode == Mode::Pending);
    let file = std::fs::read(&built.code).unwrap();
    let code_path = &built.code;
    let mut failures = Vec::new();
    let mut s = Session::new();
    let (mut srv, t) = match mode {
        Mode::Attached => {
            let srv = Served::start(&built.bin, false);
            let t = s.attach(srv.pid).unwrap();
            (srv, t)
        }
        Mode::Started | Mode::Pending => Served::spawn(&mut s, &built.bin),
    };
    let pid = s.pid(t).unwrap();
    // Every address the ledger listed, with the original bytes it gave
    // (two different ones at an address: a write over another's bytes,
    // which the checks after the detach find). No two of its sites may
    // overlap, and those in the leaves' file hold the file's code as
    // original.
    let mut ledger: BTreeMap<u64, BTreeSet<Vec<u8>>> = BTreeMap::new();
    let mut note_ledger = |s: &mut Session, when: &str, failures: &mut Vec<String>| {
        let sites = s.code_ledger(t).unwrap();
        for w in sites.windows(2) {
            if w[0].end() > w[1].start {
                failures.push(format!(
                    "{when}: ledger sites overlap: {:#x}..{:#x} ({:?}) and {:#x} ({:?})",
                    w[0].start,
                    w[0].end(),
                    w[0].owner,
                    w[1].start,
                    w[1].owner
                ));
            }
        }
        for site in sites {
            if let Some((path, off)) = file_behind(pid, site.start) {
                let off = off as usize;
                let original = site.original();
                if path == *code_path && original != &file[off..off + original.len()] {
                    failures.push(format!(
                        "{when}: the ledger's original at {:#x} ({:?}) is not the file's code: \
                         {original:02x?}",
                        site.start, site.owner,
                    ));
                }
            }
            ledger
                .entry(site.start)
                .or_default()
                .insert(site.original().to_vec());
        }
    };
    // The same program unprobed, given the same commands.
    let mut native = Served::start(&built.bin, mode == Mode::Pending);
    // Running while the pairs are placed, their first probes counting
    // before their second ones come: all but the pending variant.
    let live = mode != Mode::Pending;
    if live {
        s.start().unwrap();
        s.set_wait_deadline(Some(Instant::now()));
        if mode == Mode::Started {
            srv.ready();
        }
    }
    let mut placed_pairs = Vec::new();
    for (k, &(first, second)) in ordered.iter().enumerate() {
        let function = format!("{}leaf{k}", built.module);
        let a = place(&mut s, t, &function, first)
            .unwrap_or_else(|e| panic!("{function}: {first:?} first: {e}"));
        let pending = mode == Mode::Pending;
        if pending != a.mechanism.starts_with("pending")
            || !pending && !placed_as_asked(first, &a.mechanism)
        {
            failures.push(format!("{function}: {first:?} placed as {}", a.mechanism));
        }
        note_ledger(&mut s, &format!("{function}: {first:?}"), &mut failures);
        let mut pair = Pair {
            first,
            second,
            function,
            placed: vec![(first, a)],
            refused: None,
            alone: (0, 0, 0),
        };
        if live {
            pair.alone = probed_run(&mut s, t, (&mut srv, &mut native), k, &pair, &mut failures);
        }
        match place(&mut s, t, &pair.function, second) {
            Ok(b) => pair.placed.push((second, b)),
            Err(EngineError::RefusedSpec { reason, .. }) => {
                let allowed = ALLOWED_REFUSALS
                    .iter()
                    .any(|(f, sec, why)| (*f, *sec) == (first, second) && reason.contains(why));
                if !allowed {
                    failures.push(format!(
                        "{}: {first:?} then {second:?}: refused: {reason}",
                        pair.function
                    ));
                }
                pair.refused = Some(reason);
            }
            Err(e) => failures.push(format!("{}: {first:?} then {second:?}: {e}", pair.function)),
        }
        if !pending {
            let entry = pair.placed[0].1.addr;
            check_one_site(&mut s, t, &pair, entry, &mut failures);
        }
        let when = format!("{}: {first:?} then {second:?}", pair.function);
        note_ledger(&mut s, &when, &mut failures);
        placed_pairs.push(pair);
    }
    match mode {
        Mode::Attached | Mode::Started => {}
        Mode::Pending => {
            s.start().unwrap();
            s.set_wait_deadline(Some(Instant::now()));
            // Served up to its `ready` line: the library is loaded, the
            // pending probes armed.
            srv.send("load");
            let end = s.run_until(&srv.done).unwrap();
            assert_eq!(end, RunEnd::Interrupted);
            srv.ready();
            for pair in &placed_pairs {
                let entry = s.resolve(t, &pair.function).unwrap()[0].addr.0;
                check_one_site(&mut s, t, pair, entry, &mut failures);
            }
            note_ledger(&mut s, "armed", &mut failures);
        }
    }
    for (k, pair) in placed_pairs.iter().enumerate() {
        let (calls, returns, left) =
            probed_run(&mut s, t, (&mut srv, &mut native), k, pair, &mut failures);
        // The program's calls and returns are its totals, `left` this
        // run's.
        let (c0, r0, l0) = pair.alone;
        let first = (calls, returns, l0 + left);
        let second = (calls - c0, returns - r0, left);
        check_counts(&s, pair, (first, second), &mut failures);
    }
    // The table of what served each pair, for the record.
    for pair in &placed_pairs {
        let served: Vec<String> = pair
            .placed
            .iter()
            .map(|(m, p)| format!("{m:?} on {}", p.mechanism))
            .collect();
        eprintln!(
            "{lang:?} {}: {:?} then {:?}: {}{}",
            pair.function,
            pair.first,
            pair.second,
            served.join("; "),
            pair.refused
                .as_deref()
                .map(|r| format!("; second refused: {r}"))
                .unwrap_or_default()
        );
    }
    note_ledger(&mut s, "before the detach", &mut failures);
    for n in s.take_notices() {
        eprintln!("notice: {n}");
    }
    s.detach().unwrap();
    drop(s);
    // Every address the ledger listed holds its original bytes, the
    // file's in the leaves' code.
    let mut in_code = 0;
    for (addr, original) in ledger
        .iter()
        .flat_map(|(a, o)| o.iter().map(move |o| (a, o)))
    {
        let Some(now) = memory_at(srv.pid, *addr, original.len()) else {
            // Scratch memory of ours, unmapped at detach.
            if file_behind(srv.pid, *addr).is_some() {
                failures.push(format!("{addr:#x}: a file's, but unreadable"));
            }
            continue;
        };
        if &now != original {
            failures.push(format!("{addr:#x}: {now:02x?}, originally {original:02x?}"));
        }
        if let Some((path, off)) = file_behind(srv.pid, *addr) {
            if path == *code_path {
                in_code += 1;
                let off = off as usize;
                if now[..] != file[off..off + original.len()] {
                    failures.push(format!("{addr:#x}: {now:02x?} is not the file's code"));
                }
            }
        }
    }
    assert!(
        in_code >= placed_pairs.len(),
        "{in_code} sites in the leaves' code"
    );
    for f in [&built.bin, code_path] {
        let changed =
            hotprobe_testkit::text_differences(srv.pid as u32, &f.canonicalize().unwrap());
        if !changed.is_empty() {
            failures.push(format!(
                "{}: text differs from the file: {changed:x?}",
                f.display()
            ));
        }
    }
    // The program runs on, unprobed, as before, to its end.
    for k in 0..placed_pairs.len() {
        let cmd = format!("run {k} 3");
        let (after, want) = (srv.run(&cmd), native.run(&cmd));
        if after != want {
            failures.push(format!(
                "leaf{k} after the detach: {after:?}, natively {want:?}"
            ));
        }
    }
    assert_eq!(srv.finish(), ["bye"]);
    assert_eq!(srv.exit_code(), Some(0));
    assert_eq!(native.finish(), ["bye"]);
    assert_eq!(native.exit_code(), Some(0));
    eprintln!(
        "{lang:?}, {mode:?}: {} pairs in {:?}",
        placed_pairs.len(),
        began.elapsed()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
