//! End-to-end tests of the fast path on programs compiled here with gcc:
//! exact counts per mechanism over 4 threads × 10^6 calls, recorded
//! arguments and return values nested per thread (recursion, a C++
//! exception), ColdPatch (output equal, stripped binary through its probe
//! list), fallbacks to trap with their reasons, a fork inside a probed
//! function. (The agent injected into a running process: injected.rs.)

use std::ffi::OsString;
use std::fs::File;

use std::path::{Path, PathBuf};
use std::process::Command;

use hotprobe_fastpath::*;
use hotprobe_process::{ProcessTarget, SpawnOptions};
use hotprobe_target::{Target, TargetEvent};

mod fastpath_support;
use fastpath_support::*;

const N: u64 = 1_000_000;

fn count_work(exe: &Path, tag: &str, expect: fn(Mechanism) -> bool, choice: MechanismChoice) {
    let args = [&N.to_string()[..], "4"];
    let out = tmp().join(format!("{tag}.out"));
    let (mut t, mut fp) = spawn(exe, &args, &out);
    let info = fp.add(&mut t, "work", Action::count(), choice).unwrap();
    assert!(expect(info.mechanism), "{tag}: {info:?}");
    run_to_exit(&mut t);
    assert_eq!(fp.count(info.probe_id), 4 * N, "{tag}: exact count");
    // Counting writes no event: no ring was prepared, by the tracer or
    // by a thread.
    assert_eq!(fp.shm().ring_pool(), (false, 0), "{tag}: ring pool");
    assert_eq!(
        fp.shm()
            .header()
            .site_misses
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        native_output(exe, &args)
    );
    eprintln!("{tag}: {} — {}", info.mechanism, info.reason);
}

#[test]
fn count_exact_patchable_entry() {
    let exe = compile(
        "loop.c",
        "loop-pfe",
        &["-O2", "-fpatchable-function-entry=5"],
    );
    count_work(
        &exe,
        "pfe",
        |m| m == Mechanism::Patch(PatchKind::PatchableEntry),
        MechanismChoice::Auto,
    );
}

#[test]
fn count_exact_mcount_nops() {
    for (tag, rec) in [("mcount", false), ("mcount-loc", true)] {
        let mut flags = vec![
            "-O2",
            "-fno-pie",
            "-no-pie",
            "-pg",
            "-mfentry",
            "-mnop-mcount",
        ];
        if rec {
            flags.push("-mrecord-mcount");
        }
        let exe = compile("loop.c", &format!("loop-{tag}"), &flags);
        count_work(
            &exe,
            tag,
            |m| m == Mechanism::Patch(PatchKind::Mcount),
            MechanismChoice::Auto,
        );
    }
}

#[test]
fn count_exact_jump() {
    let exe = compile("loop.c", "loop-plain", &["-O2"]);
    count_work(
        &exe,
        "jump",
        |m| m == Mechanism::Jump,
        MechanismChoice::Auto,
    );
}

fn coldpatched() -> (PathBuf, PathBuf) {
    static ONCE: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let inst = compile("loop.c", "loop-inst", &["-O2", "-finstrument-functions"]);
        let (bytes, list) = hotprobe_coldpatch::coldpatch(&std::fs::read(&inst).unwrap()).unwrap();
        let out = tmp().join("loop-cold");
        std::fs::write(&out, bytes).unwrap();
        std::fs::set_permissions(&out, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        std::fs::write(probe_list_path(&out), list.to_text()).unwrap();
        let stripped = tmp().join("loop-cold-stripped");
        assert!(Command::new("strip")
            .arg("-o")
            .arg(&stripped)
            .arg(&out)
            .status()
            .unwrap()
            .success());
        std::fs::write(probe_list_path(&stripped), list.to_text()).unwrap();
        // The coldpatched binary runs like the original.
        assert_eq!(
            native_output(&out, &["1000", "3"]),
            native_output(&inst, &["1000", "3"])
        );
        (out, stripped)
    })
    .clone()
}

#[test]
fn count_exact_coldpatch_and_stripped() {
    let (cold, stripped) = coldpatched();
    count_work(
        &cold,
        "cold",
        |m| m == Mechanism::Patch(PatchKind::Coldpatch),
        MechanismChoice::Auto,
    );
    count_work(
        &stripped,
        "cold-stripped",
        |m| m == Mechanism::Patch(PatchKind::Coldpatch),
        MechanismChoice::Patch,
    );
}

#[test]
fn coldpatch_exit_placeholders_record_nested() {
    let (cold, _) = coldpatched();
    let out = tmp().join("cold-rec.out");
    let (mut t, mut fp) = spawn(&cold, &["10", "1"], &out);
    let info = fp
        .add(
            &mut t,
            "fact",
            Action::record().with_exit(),
            MechanismChoice::Auto,
        )
        .unwrap();
    assert_eq!(info.exits, "exit placeholders");
    run_to_exit(&mut t);
    let mut kinds = vec![];
    fp.drain(|e| {
        if e.probe_id == info.probe_id {
            kinds.push(e.kind)
        }
    });
    assert_eq!(kinds, [[KIND_ENTRY; 5], [KIND_EXIT; 5]].concat());
}

fn check_nested(events: &[RecordedEvent]) {
    let mut stack = vec![];
    for e in events {
        if e.kind == KIND_ENTRY {
            stack.push(e.probe_id);
        } else {
            assert_eq!(stack.pop(), Some(e.probe_id), "exit without its entry");
        }
    }
    assert!(stack.is_empty(), "unmatched entries {stack:?}");
}

#[test]
fn record_args_and_return_values_through_recursion() {
    for (tag, flags) in [
        ("rec-pfe", &["-O2", "-fpatchable-function-entry=5"][..]),
        ("rec-plain", &["-O1", "-fno-optimize-sibling-calls"][..]),
    ] {
        let exe = compile("loop.c", tag, flags);
        let out = tmp().join(format!("{tag}.out"));
        let (mut t, mut fp) = spawn(&exe, &["100", "2"], &out);
        let fact = fp
            .add(
                &mut t,
                "fact",
                Action::record().with_exit(),
                MechanismChoice::Auto,
            )
            .unwrap();
        let work = fp
            .add(
                &mut t,
                "work",
                Action::record().with_exit(),
                MechanismChoice::Auto,
            )
            .unwrap();
        assert_eq!(fact.exits, "return hook", "{tag}: {fact:?}");
        // A recorded entry with a hooked return is on a per-site stub,
        // which hooks the return through the agent's assembly.
        assert!(fact.stub && work.stub, "{tag}: {fact:?} {work:?}");
        run_to_exit(&mut t);
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            native_output(&exe, &["100", "2"])
        );
        let mut per_tid = std::collections::BTreeMap::<u32, Vec<RecordedEvent>>::new();
        fp.drain(|e| per_tid.entry(e.tid).or_default().push(*e));
        assert_eq!(fp.drops(), 0);
        let mut fact_events = vec![];
        let mut work_threads = 0;
        for evs in per_tid.values() {
            check_nested(evs);
            let w: Vec<_> = evs.iter().filter(|e| e.probe_id == work.probe_id).collect();
            if !w.is_empty() {
                work_threads += 1;
                assert_eq!(w.len(), 200);
                for (i, pair) in w.chunks(2).enumerate() {
                    let (a, b) = (pair[0].args[0], pair[0].args[1]);
                    assert_eq!(b, i as u64 & 7);
                    assert_eq!(pair[1].args[0], a * 2 + b, "return value");
                }
            }
            fact_events.extend(evs.iter().filter(|e| e.probe_id == fact.probe_id).copied());
        }
        assert_eq!(work_threads, 2);
        let args: Vec<u64> = fact_events.iter().map(|e| e.args[0]).collect();
        assert_eq!(
            args,
            [5, 4, 3, 2, 1, 1, 2, 6, 24, 120],
            "{tag}: entries n, exits n!"
        );
        eprintln!(
            "{tag}: fact via {}, work via {}",
            fact.mechanism, work.mechanism
        );
    }
}

/// A probe never changes what the program computes. leaves.c's frameless
/// `-O2` leaves are called from a loop that keeps its state in
/// call-clobbered registers the leaves leave alone (rcx, rsi, r8-r11:
/// gcc's `-fipa-ra`); jump probes with exits (entry trampoline, return
/// hook) on all three, recording with 64- and 32-byte slots, and counting:
/// the output equals the unprobed output, and the recorded arguments and
/// return values equal what the program printed.
#[test]
fn jump_probes_with_exits_keep_every_register_of_the_caller() {
    let exe = compile("leaves.c", "leaves-o2", &["-O2"]);
    let native = native_output(&exe, &[]);
    // "i digit rand scaled" per call, then the sums.
    let printed: Vec<[u64; 3]> = native
        .lines()
        .filter(|l| !l.contains('='))
        .map(|l| {
            let w: Vec<u64> = l.split(' ').map(|w| w.parse().unwrap()).collect();
            [w[1], w[2], w[3]]
        })
        .collect();
    assert_eq!(printed.len(), 300);
    let funcs = ["is_digit", "next_rand", "scale"];
    for (tag, record_args, action) in [
        ("record-6", 6, Action::record().with_exit()),
        ("record-2", 2, Action::record().with_exit()),
        ("count", 6, Action::count().with_exit()),
    ] {
        let out = tmp().join(format!("leaves-{tag}.out"));
        let config = FastPathConfig {
            record_args,
            ..FastPathConfig::default()
        };
        let (mut t, mut fp) = spawn_config(&exe, &[], &out, config);
        let infos: Vec<SiteInfo> = funcs
            .iter()
            .map(|f| fp.add(&mut t, f, action, MechanismChoice::Jump).unwrap())
            .collect();
        for i in &infos {
            assert_eq!(i.mechanism, Mechanism::Jump, "{tag}: {i:?}");
            assert_eq!(i.exits, "return hook", "{tag}: {i:?}");
            // Recording: the stub hooks the return; counting with a
            // return hook is the generic trampoline's.
            assert_eq!(i.stub, action.record, "{tag}: {i:?}");
        }
        run_to_exit(&mut t);
        assert_eq!(std::fs::read_to_string(&out).unwrap(), native, "{tag}");
        for i in &infos {
            assert_eq!(fp.count(i.probe_id), 300, "{tag}: {}", i.function);
        }
        let mut events = vec![];
        fp.drain(|e| events.push(*e));
        assert_eq!(fp.drops(), 0, "{tag}");
        if !action.record {
            assert!(events.is_empty(), "{tag}");
            continue;
        }
        check_nested(&events);
        assert_eq!(events.len(), 3 * 2 * 300, "{tag}");
        for (f, info) in infos.iter().enumerate() {
            let evs: Vec<_> = events
                .iter()
                .filter(|e| e.probe_id == info.probe_id)
                .collect();
            for (i, pair) in evs.chunks(2).enumerate() {
                let (entry, exit) = (pair[0], pair[1]);
                assert_eq!((entry.kind, exit.kind), (KIND_ENTRY, KIND_EXIT));
                let ret = exit.args[0];
                match funcs[f] {
                    "is_digit" => {
                        assert_eq!(entry.args[0], i as u64 & 127, "{tag}: call {i}");
                        assert_eq!(ret & 0xffff_ffff, printed[i][0], "{tag}: call {i}");
                    }
                    "next_rand" => assert_eq!(ret, printed[i][1], "{tag}: call {i}"),
                    _ => {
                        // scale(v, k) = v * k + 3
                        let (v, k) = (entry.args[0], entry.args[1]);
                        assert_eq!(k, entry.args[1] & 31, "{tag}: call {i}");
                        assert_eq!(v.wrapping_mul(k).wrapping_add(3), printed[i][2]);
                        assert_eq!(ret, printed[i][2], "{tag}: call {i}");
                    }
                }
            }
        }
    }
}

#[test]
fn cxx_exception_crosses_probed_frames() {
    let exe = compile(
        "throw.cc",
        "throw-pfe",
        &["-O2", "-fpatchable-function-entry=5"],
    );
    let out = tmp().join("throw.out");
    let (mut t, mut fp) = spawn(&exe, &[], &out);
    let m = fp
        .add(
            &mut t,
            "middle",
            Action::record().with_exit(),
            MechanismChoice::Auto,
        )
        .unwrap();
    let th = fp
        .add(
            &mut t,
            "thrower",
            Action::record().with_exit(),
            MechanismChoice::Auto,
        )
        .unwrap();
    run_to_exit(&mut t);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "706\n");
    let mut evs = vec![];
    fp.drain(|e| evs.push(*e));
    check_nested(&evs);
    let unwound = evs
        .iter()
        .filter(|e| e.kind == KIND_EXIT && e.reserved == EXIT_UNWOUND)
        .count();
    assert_eq!(unwound, 4, "thrower and middle unwound twice");
    assert_eq!(evs.len(), 20);
    let _ = (m, th);
}

#[test]
fn short_and_jumped_into_functions_fall_back_to_trap() {
    let exe = compile("loop.c", "loop-plain2", &["-O2"]);
    let m = ModuleInfo::open(&exe).unwrap();
    let tiny = m
        .plan(m.function("tiny").unwrap(), MechanismChoice::Auto)
        .unwrap();
    assert_eq!(tiny.mechanism, Mechanism::Trap);
    assert!(
        tiny.reason.starts_with("function shorter than 5 bytes"),
        "{}",
        tiny.reason
    );
    let bj = m
        .plan(m.function("backjump").unwrap(), MechanismChoice::Auto)
        .unwrap();
    assert_eq!(bj.mechanism, Mechanism::Trap);
    assert!(
        bj.reason
            .starts_with("a jump lands inside the first 5 bytes at +2"),
        "{}",
        bj.reason
    );
    let e = m
        .plan(m.function("backjump").unwrap(), MechanismChoice::Jump)
        .unwrap_err();
    assert!(e.to_string().contains("a jump lands inside"), "{e}");
    let e = m
        .plan(m.function("work").unwrap(), MechanismChoice::Patch)
        .unwrap_err();
    assert!(e.to_string().contains("no placeholder"), "{e}");
    // Through a live process: the API reports trap and installs nothing.
    let (mut t, mut fp) = spawn(&exe, &["10", "1"], &tmp().join("trap.out"));
    let info = fp
        .add(&mut t, "tiny", Action::count(), MechanismChoice::Auto)
        .unwrap();
    assert_eq!(info.mechanism, Mechanism::Trap);
    run_to_exit(&mut t);
    let plans = explain(&exe).unwrap();
    assert!(plans
        .iter()
        .any(|p| p.function.name == "work" && p.plan.mechanism == Mechanism::Jump));
}

/// What the tracer of `forks.c` does at the child's fork stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AtFork {
    /// Writes the original bytes of every site back into the child
    /// ([`FastPath::written_bytes`]), as the engine does.
    Restore,
    /// Leaves the child's code patched: the agent's dormancy alone keeps
    /// the child out of the shared memory.
    LeavePatched,
    /// Sets `CONTROL_FOLLOW_FORKS` before the run and leaves the child's
    /// code patched: the child counts and records in slots of its own.
    Follow,
}

/// `forks.c`: `f` (recorded, with its return hook) forks inside its 4th
/// call; the child returns from it through the return trampoline, calls
/// `f` and `g` (counted through a per-site stub) 5 times each, and exits 0;
/// the parent calls each 10 times. Whatever happens to the child, the
/// parent's counters and ring hold the parent's calls only, and the child
/// runs correctly.
fn fork_inside_a_probed_function(tag: &str, flags: &[&str], mode: AtFork, agent: &Path) {
    let exe = compile("forks.c", tag, flags);
    let out = tmp().join(format!("{tag}-{mode:?}.out"));
    let (mut t, mut fp) = spawn_agent(&exe, &[], &out, FastPathConfig::default(), agent);
    let parent = t.pid() as u32;
    let f = fp
        .add(
            &mut t,
            "f",
            Action::record().with_exit(),
            MechanismChoice::Auto,
        )
        .unwrap();
    let g = fp
        .add(&mut t, "g", Action::count(), MechanismChoice::Auto)
        .unwrap();
    assert_eq!(f.exits, "return hook", "{f:?}");
    assert!(g.stub, "{g:?}");
    assert_eq!(f.mechanism, g.mechanism, "{f:?} {g:?}");
    if mode == AtFork::Follow {
        fp.shm().header().control.fetch_or(
            hotprobe_abi::CONTROL_FOLLOW_FORKS,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
    t.resume_all().unwrap();
    let mut child = None;
    loop {
        match t.wait(None).unwrap() {
            TargetEvent::Exited(st) => {
                assert_eq!(
                    st.to_string(),
                    hotprobe_target::ExitStatus::Code(0).to_string()
                );
                break;
            }
            TargetEvent::Forked { thread, child: c } => {
                child = Some(c as u32);
                if mode == AtFork::Restore {
                    let mem = std::fs::OpenOptions::new()
                        .write(true)
                        .open(format!("/proc/{c}/mem"))
                        .unwrap();
                    use std::os::unix::fs::FileExt;
                    let written = fp.written_bytes();
                    assert_eq!(written.len(), 2, "{written:?}");
                    for (addr, original) in written {
                        mem.write_all_at(&original, addr).unwrap();
                    }
                }
                t.release_fork_child(c, &[]).unwrap();
                t.resume(thread, hotprobe_target::ResumeMode::Continue)
                    .unwrap();
            }
            TargetEvent::Breakpoint { thread, .. } | TargetEvent::Stepped { thread, .. } => t
                .resume(thread, hotprobe_target::ResumeMode::Continue)
                .unwrap(),
            _ => {}
        }
    }
    let child = child.expect("a fork event");
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "child 16 24 1025 545\nparent 100 115 status 0\n",
        "{tag} {mode:?}: both processes computed right, the child exited 0"
    );
    // Counters per owning process.
    let shm = fp.shm();
    let mut per_pid = std::collections::BTreeMap::<u32, (u64, u64)>::new();
    for slot in 0..shm.threads_in_use() {
        let (pid, _) = shm.thread_owner(slot).expect("claimed");
        let c = shm.thread_counters(slot).unwrap();
        let e = per_pid.entry(pid).or_default();
        e.0 += c[f.probe_id as usize].load(std::sync::atomic::Ordering::Relaxed);
        e.1 += c[g.probe_id as usize].load(std::sync::atomic::Ordering::Relaxed);
    }
    let globals = shm.global_counters();
    assert_eq!(
        globals[f.probe_id as usize].load(std::sync::atomic::Ordering::Relaxed)
            + globals[g.probe_id as usize].load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    // Events per thread (the child's one thread has tid = its pid).
    let mut events = std::collections::BTreeMap::<u32, Vec<RecordedEvent>>::new();
    fp.drain(|e| events.entry(e.tid).or_default().push(*e));
    let kinds = |tid: u32| -> String {
        events
            .get(&tid)
            .map(|v| {
                v.iter()
                    .map(|e| match e.kind {
                        KIND_ENTRY => 'e',
                        KIND_EXIT => 'x',
                        _ => '?',
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        per_pid.get(&parent),
        Some(&(10, 10)),
        "{tag} {mode:?}: {per_pid:?}"
    );
    assert_eq!(kinds(parent), "ex".repeat(10), "{tag} {mode:?}");
    let exit_values: Vec<u64> = events[&parent]
        .iter()
        .filter(|e| e.kind == KIND_EXIT)
        .map(|e| e.args[0])
        .collect();
    assert_eq!(
        exit_values,
        (0..10).map(|i| 2 * i + 1).collect::<Vec<u64>>()
    );
    if mode == AtFork::Follow {
        assert_eq!(per_pid.get(&child), Some(&(5, 5)), "{tag}: {per_pid:?}");
        assert_eq!(per_pid.len(), 2, "{per_pid:?}");
        // The child's first event is the return of the call that forked.
        assert_eq!(kinds(child), format!("x{}", "ex".repeat(5)), "{tag}");
        assert_eq!(events[&child][0].args[0], 7);
        assert_eq!(fp.count(f.probe_id), 15);
        assert_eq!(fp.count(g.probe_id), 15);
    } else {
        assert_eq!(per_pid.len(), 1, "{tag} {mode:?}: {per_pid:?}");
        assert!(!events.contains_key(&child), "{tag} {mode:?}");
        assert_eq!(fp.count(f.probe_id), 10);
        assert_eq!(fp.count(g.probe_id), 10);
    }
    assert_eq!(fp.drops(), 0);
}

/// With the agent of this build (debug) and the embedded one (release).
#[test]
fn fork_in_a_probed_function_patch() {
    for agent in [agent(), embedded_agent().unwrap()] {
        for mode in [AtFork::Restore, AtFork::LeavePatched, AtFork::Follow] {
            fork_inside_a_probed_function(
                "forks-pfe",
                &["-O2", "-fpatchable-function-entry=5"],
                mode,
                &agent,
            );
        }
    }
}

#[test]
fn fork_in_a_probed_function_jump() {
    for agent in [agent(), embedded_agent().unwrap()] {
        for mode in [AtFork::Restore, AtFork::LeavePatched, AtFork::Follow] {
            fork_inside_a_probed_function("forks-plain", &["-O2"], mode, &agent);
        }
    }
}

/// `fork_throw.cc`: the child of a fork inside `forker` (return hooked in
/// the parent) throws through `forker`'s frame, which still holds the
/// swapped return address: the preloaded agent's unwinder hooks put the
/// real one back even when dormant, so the child catches and exits 0.
#[test]
fn a_forked_child_throws_through_a_hooked_frame() {
    let exe = compile(
        "fork_throw.cc",
        "fork-throw-pfe",
        &["-O2", "-fpatchable-function-entry=5"],
    );
    for mode in [AtFork::Restore, AtFork::LeavePatched, AtFork::Follow] {
        let out = tmp().join(format!("fork-throw-{mode:?}.out"));
        let (mut t, mut fp) = spawn(&exe, &[], &out);
        let parent = t.pid() as u32;
        for f in ["forker", "thrower"] {
            let info = fp
                .add(
                    &mut t,
                    f,
                    Action::record().with_exit(),
                    MechanismChoice::Auto,
                )
                .unwrap();
            assert_eq!(info.exits, "return hook", "{info:?}");
        }
        if mode == AtFork::Follow {
            fp.shm().header().control.fetch_or(
                hotprobe_abi::CONTROL_FOLLOW_FORKS,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        t.resume_all().unwrap();
        loop {
            match t.wait(None).unwrap() {
                TargetEvent::Exited(st) => {
                    assert_eq!(
                        st.to_string(),
                        hotprobe_target::ExitStatus::Code(0).to_string()
                    );
                    break;
                }
                TargetEvent::Forked { thread, child } => {
                    if mode == AtFork::Restore {
                        let mem = std::fs::OpenOptions::new()
                            .write(true)
                            .open(format!("/proc/{child}/mem"))
                            .unwrap();
                        use std::os::unix::fs::FileExt;
                        for (addr, original) in fp.written_bytes() {
                            mem.write_all_at(&original, addr).unwrap();
                        }
                    }
                    t.release_fork_child(child, &[]).unwrap();
                    t.resume(thread, hotprobe_target::ResumeMode::Continue)
                        .unwrap();
                }
                _ => {}
            }
        }
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "child caught 5\nparent child-status 0\n",
            "{mode:?}"
        );
        let mut parent_events = vec![];
        fp.drain(|e| {
            if e.tid == parent {
                parent_events.push((e.kind, e.args[0]));
            }
        });
        // forker's entry and its return value (the child's exit status).
        assert_eq!(parent_events.len(), 2, "{mode:?}: {parent_events:?}");
        assert_eq!(parent_events[1], (KIND_EXIT, 0), "{mode:?}");
    }
}

/// The agent preloaded from the tracer's memfd (`/proc/TRACER/fd/N`) takes
/// that entry out of `LD_PRELOAD` (it opens only while the tracer lives);
/// other entries stay.
#[test]
fn the_embedded_agent_leaves_ld_preload_without_its_memfd() {
    let out = tmp().join("preload.out");
    let mut opts = SpawnOptions {
        stdout: Some(File::create(&out).unwrap()),
        ..Default::default()
    };
    let agent = embedded_agent().unwrap();
    let pending = FastPath::for_spawn(&mut opts, &agent, FastPathConfig::default()).unwrap();
    for (k, v) in opts.env.iter_mut() {
        if k == "LD_PRELOAD" {
            assert!(v.to_string_lossy().starts_with(&*agent.to_string_lossy()));
            v.push(":libm.so.6");
        }
    }
    let args: Vec<OsString> = ["-c", "echo \"[$LD_PRELOAD]\""]
        .iter()
        .map(OsString::from)
        .collect();
    let mut t = ProcessTarget::spawn_with(Path::new("/bin/sh"), &args, &opts).unwrap();
    let _fp = pending.attach(&mut t).unwrap();
    run_to_exit(&mut t);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "[libm.so.6]\n");
}

/// A jump probe is refused where a branch of *another* function lands in
/// the bytes it would rewrite (glibc's memcpy/mempcpy pair, found by
/// probing every libc function): the entry gets a trap, with the reason.
#[test]
fn a_branch_from_another_function_into_the_entry_refuses_a_jump() {
    let exe = compile("branch_into.c", "branch_into", &["-O2"]);
    let out = Command::new(&exe).arg("10").output().unwrap();
    // sum over i < 10 of (i + 1 + 3) + (2i + 2 + 3) = 3 * 45 + 90
    assert_eq!(String::from_utf8_lossy(&out.stdout), "225\n");
    let m = ModuleInfo::open(&exe).unwrap();
    let add3 = m.function("add3").unwrap();
    let p = m.plan(add3, MechanismChoice::Auto).unwrap();
    assert_eq!(p.mechanism, Mechanism::Trap);
    assert!(
        p.reason.contains("elsewhere in the module lands at +0x3"),
        "{}",
        p.reason
    );
    let e = m.plan(add3, MechanismChoice::Jump).unwrap_err();
    assert!(e.to_string().contains("lands at +0x3"), "{e}");
    assert_eq!(m.branch_into(add3.addr, 3).map(|(t, _)| t), None);
    assert_eq!(
        m.branch_into(add3.addr, 5).map(|(t, _)| t),
        Some(add3.addr + 3)
    );
    // Nothing lands inside add3_twice's first bytes: it takes a jump.
    let q = m
        .plan(m.function("add3_twice").unwrap(), MechanismChoice::Auto)
        .unwrap();
    assert_eq!(q.mechanism, Mechanism::Jump, "{}", q.reason);
}
