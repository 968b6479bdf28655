//! Trap return probes never change what the program does, whatever way a
//! probed frame is left: C++ exceptions (through cleanups and rethrows),
//! Rust panics caught by `catch_unwind`, `longjmp`, `siglongjmp` out of a
//! SIGALRM handler, `pthread_exit`, a signal handler on a stack above the
//! thread's. Each program counts its own calls and normal returns; the
//! probes' counts must equal them exactly (`returns` = normal returns,
//! `abandoned` = frames left otherwise, `nmissed` = 0) and the program's
//! output must be what it prints without hotprobe. Return probes are
//! refused where they cannot work: functions that return twice and Go.

mod nonlocal_support;
mod support;

use hotprobe::{EngineError, Probe, ProbeId, ProbeStats, RetProbe, RunEnd, RuntimeAddr};
use nonlocal_support::*;
use std::cell::Cell;
use std::rc::Rc;
use support::*;

/// A counting closure for handlers.
fn counter() -> (
    Rc<Cell<u64>>,
    impl FnMut(&mut hotprobe::HitContext<'_>) + 'static,
) {
    let c = Rc::new(Cell::new(0));
    let c2 = c.clone();
    (c, move |_: &mut hotprobe::HitContext<'_>| {
        c2.set(c2.get() + 1)
    })
}

/// Runs the target to its end; its output.
fn finish(t: &mut Captured) -> String {
    t.session.start().unwrap();
    assert_eq!(t.session.run().unwrap(), RunEnd::AllExited);
    t.output()
}

/// An entry probe and a return probe (with a counting `ret` handler) on
/// `func`; returns (entry id, return id, ret handler runs).
fn entry_and_return(
    t: &mut Captured,
    func: &str,
    maxactive: usize,
) -> (ProbeId, ProbeId, Rc<Cell<u64>>) {
    let e = t.session.probe(t.target, func, Probe::new()).unwrap();
    let (rets, f) = counter();
    let r = t
        .session
        .retprobe(t.target, func, RetProbe::new(maxactive).ret(f))
        .unwrap();
    (e, r, rets)
}

fn stats(t: &Captured, id: ProbeId) -> ProbeStats {
    t.session.stats(id).unwrap()
}

/// `returns`, `nmissed`, `abandoned` of a return probe.
fn ret_counts(t: &Captured, id: ProbeId) -> (u64, u64, u64) {
    let s = stats(t, id);
    (s.returns, s.nmissed, s.abandoned)
}

#[test]
fn longjmp_out_of_probed_frames_at_o0_and_o2() {
    for opt in ["-O0", "-O2"] {
        let bin = nonlocal_c(opt);
        let args = ["longjmp", "100"];
        let want = native_output(&bin, &args);
        // 100 rounds of deep(4) (5 calls) left by longjmp, deep(2) (3 calls).
        assert_eq!(want, "deep calls=800 returns=300\n");
        let mut t = spawn(&bin, &args);
        let (e, r, rets) = entry_and_return(&mut t, "deep", 64);
        let out = finish(&mut t);
        assert_eq!(out, want, "{opt}");
        assert_eq!(stats(&t, e).hits, 800, "{opt}");
        assert_eq!(stats(&t, r).hits, 800, "{opt}");
        assert_eq!(ret_counts(&t, r), (300, 0, 500), "{opt}");
        assert_eq!(rets.get(), 300, "{opt}");
    }
}

#[test]
fn dead_frames_never_exhaust_maxactive() {
    // 6 live frames at most, 500 left by longjmp: with maxactive 6 every
    // call is still followed.
    let bin = nonlocal_c("-O2");
    let mut t = spawn(&bin, &["longjmp", "100"]);
    let (_, r, rets) = entry_and_return(&mut t, "deep", 6);
    let out = finish(&mut t);
    assert_eq!(out, "deep calls=800 returns=300\n");
    assert_eq!(ret_counts(&t, r), (300, 0, 500));
    assert_eq!(rets.get(), 300);
}

#[test]
fn siglongjmp_out_of_a_sigalrm_handler() {
    for opt in ["-O0", "-O2"] {
        let bin = nonlocal_c(opt);
        let args = ["sigalrm", "50"];
        let want = native_output(&bin, &args);
        assert_eq!(want, "work calls=100 returns=50 jumps=50\n");
        let mut t = spawn(&bin, &args);
        let (e, r, rets) = entry_and_return(&mut t, "work", 64);
        let out = finish(&mut t);
        assert_eq!(out, want, "{opt}");
        assert_eq!(stats(&t, e).hits, 100, "{opt}");
        assert_eq!(ret_counts(&t, r), (50, 0, 50), "{opt}");
        assert_eq!(rets.get(), 50, "{opt}");
    }
}

#[test]
fn a_handler_on_a_signal_stack_above_the_stack_loses_no_frame() {
    // The handler's probed call sits above the thread's probed frames:
    // they look dead by stack pointer, are dropped, and are found again
    // when they return.
    let bin = nonlocal_c("-O2");
    let args = ["altstack", "50"];
    let want = native_output(&bin, &args);
    assert_eq!(
        want,
        "altstack above the stack: 1\ndeep calls=250 returns=250 signals=50\n"
    );
    let mut t = spawn(&bin, &args);
    let (e, r, rets) = entry_and_return(&mut t, "deep", 64);
    let out = finish(&mut t);
    assert_eq!(out, want);
    assert_eq!(stats(&t, e).hits, 250);
    assert_eq!(ret_counts(&t, r), (250, 0, 0));
    assert_eq!(rets.get(), 250);
}

#[test]
fn pthread_exit_unwinds_through_probed_frames() {
    // glibc's pthread_exit is a forced unwind (libgcc_s, loaded then).
    let bin = nonlocal_c("-O2");
    let args = ["exit", "20"];
    let want = native_output(&bin, &args);
    assert_eq!(want, "deep calls=80 returns=0\n");
    let mut t = spawn(&bin, &args);
    let (e, r, rets) = entry_and_return(&mut t, "deep", 64);
    let out = finish(&mut t);
    assert_eq!(out, want);
    assert_eq!(stats(&t, e).hits, 80);
    assert_eq!(ret_counts(&t, r), (0, 0, 80));
    assert_eq!(rets.get(), 0);
}

#[test]
fn functions_that_return_twice_refuse_return_probes() {
    let bin = nonlocal_c("-O2");
    let args = ["setjmp", "30"];
    let want = native_output(&bin, &args);
    let mut t = spawn(&bin, &args);
    for f in [
        "setjmp",
        "_setjmp",
        "__sigsetjmp",
        "libc:vfork",
        "libc:getcontext",
    ] {
        match t.session.retprobe(t.target, f, RetProbe::new(8)) {
            Err(EngineError::Refused { reason, .. }) => {
                assert!(reason.contains("returns twice"), "{f}: {reason}");
                assert!(reason.contains("probe the entry instead"), "{f}: {reason}");
            }
            r => panic!("{f}: {:?}", r.map(|_| ())),
        }
        let e = t
            .session
            .add(t.target, &format!("{f}%return"), hotprobe::Action::Count)
            .err()
            .unwrap_or_else(|| panic!("{f}%return placed"));
        assert!(e.to_string().contains("returns twice"), "{e}");
    }
    // Its entry is fine: glibc's setjmp macro calls _setjmp (30 times,
    // and once more in __libc_start_call_main before main).
    let e = t.session.probe(t.target, "_setjmp", Probe::new()).unwrap();
    let out = finish(&mut t);
    assert_eq!(out, want);
    assert_eq!(stats(&t, e).hits, 31);
}

#[test]
fn cpp_exceptions_through_return_probed_frames() {
    let bin = throw_cc();
    let args = ["300"];
    let want = native_output(&bin, &args);
    let (calls, leaf_ret, mid_ret) = (
        field(&want, "leaf_calls"),
        field(&want, "leaf_returns"),
        field(&want, "mid_returns"),
    );
    assert_eq!((calls, leaf_ret, mid_ret), (300, 160, 160), "{want}");
    assert_eq!(field(&want, "rethrown"), 40, "{want}");

    // The case alone: only leaf's returns are followed.
    let mut t = spawn(&bin, &args);
    let (e, r, rets) = entry_and_return(&mut t, "leaf", 64);
    assert_eq!(finish(&mut t), want);
    assert_eq!(stats(&t, e).hits, 300);
    assert_eq!(ret_counts(&t, r), (160, 0, 140));
    assert_eq!(rets.get(), 160);

    // Every frame followed: leaf and mid unwound, top catches and returns.
    let mut t = spawn(&bin, &args);
    let (le, lr, lrets) = entry_and_return(&mut t, "leaf", 64);
    let (_, mr, mrets) = entry_and_return(&mut t, "mid", 64);
    let (_, tr, trets) = entry_and_return(&mut t, "top", 64);
    assert_eq!(finish(&mut t), want);
    assert_eq!(stats(&t, le).hits, 300);
    assert_eq!(ret_counts(&t, lr), (160, 0, 140));
    assert_eq!(ret_counts(&t, mr), (160, 0, 140));
    assert_eq!(ret_counts(&t, tr), (300, 0, 0));
    assert_eq!((lrets.get(), mrets.get(), trets.get()), (160, 160, 300));
}

#[test]
fn rust_panics_caught_by_catch_unwind() {
    let bin = panic_rs();
    let args = ["200"];
    let want = native_output(&bin, &args);
    assert_eq!((field(&want, "calls"), field(&want, "returns")), (200, 150));
    let mut t = spawn(&bin, &args);
    let (le, lr, lrets) = entry_and_return(&mut t, "leaf", 64);
    let (_, mr, _) = entry_and_return(&mut t, "mid", 64);
    let (_, tr, trets) = entry_and_return(&mut t, "top", 64);
    assert_eq!(finish(&mut t), want);
    assert_eq!(stats(&t, le).hits, 200);
    assert_eq!(ret_counts(&t, lr), (150, 0, 50));
    assert_eq!(ret_counts(&t, mr), (150, 0, 50));
    assert_eq!(ret_counts(&t, tr), (200, 0, 0));
    assert_eq!((lrets.get(), trets.get()), (150, 200));
}

#[test]
fn go_functions_refuse_return_probes_and_keep_entry_probes() {
    let bin = go_program("gofunc", "");
    let args = ["2000"];
    let want = native_output(&bin, &args);
    let mut t = spawn(&bin, &args);
    for f in ["main.leaf", "main.mid", "runtime.mallocgc"] {
        match t.session.retprobe(t.target, f, RetProbe::new(8)) {
            Err(EngineError::Refused { reason, .. }) => assert_eq!(reason, GO_REASON, "{f}"),
            r => panic!("{f}: {:?}", r.map(|_| ())),
        }
        let e = t
            .session
            .add(t.target, &format!("{f}%return"), hotprobe::Action::Count)
            .err()
            .unwrap_or_else(|| panic!("{f}%return placed"));
        assert!(e.to_string().contains(GO_REASON), "{e}");
    }
    // Entry probes: a Go function's entry runs again after its prologue's
    // stack check sent it to runtime.morestack (the stack grew, or the
    // scheduler asked for a cooperative preemption through the stack
    // guard), so they count at least every call. The first instruction
    // after the prologue runs once per call.
    let leaf = t
        .session
        .probe(t.target, "main.leaf", Probe::new())
        .unwrap();
    let (seen, f) = counter();
    let mid = t
        .session
        .probe(t.target, "main.mid", Probe::new().pre(f))
        .unwrap();
    let body = after_go_prologue(&mut t, "main.leaf");
    let leaf_body = t.session.probe_addr(t.target, body, Probe::new()).unwrap();
    assert_eq!(finish(&mut t), want);
    assert!(stats(&t, leaf).hits >= 2000, "{:?}", stats(&t, leaf));
    assert!(stats(&t, mid).hits >= 2000, "{:?}", stats(&t, mid));
    assert_eq!(seen.get(), stats(&t, mid).hits);
    assert_eq!(stats(&t, leaf_body).hits, 2000);
}

/// The instruction after the stack-check prologue of Go function `func`
/// (`cmp rsp|r12, [r14+0x10]; jbe morestack`).
fn after_go_prologue(t: &mut Captured, func: &str) -> RuntimeAddr {
    use hotprobe_x86::iced_x86::Mnemonic;
    let r = t.session.resolve(t.target, func).unwrap().remove(0);
    let range = r.function_range.clone().unwrap();
    let mut code = vec![0u8; (range.end.0 - range.start.0) as usize];
    t.session
        .engine(t.target)
        .unwrap()
        .target()
        .read_memory(range.start, &mut code)
        .unwrap();
    for start in hotprobe_x86::instruction_starts(&code, range.start.0) {
        let off = (start - range.start.0) as usize;
        let insn = hotprobe_x86::decode(&code[off..], start).unwrap();
        if insn.mnemonic() == Mnemonic::Jbe {
            return RuntimeAddr(insn.next_ip());
        }
    }
    panic!("no stack-check prologue in {func}");
}

#[test]
fn a_stripped_go_binary_is_still_known_for_go() {
    // No symbols: only the .go.buildinfo section says it is Go.
    let bin = go_program("gofunc-stripped", "-s -w");
    let args = ["10"];
    let want = native_output(&bin, &args);
    let mut t = spawn(&bin, &args);
    let pid = t.session.pid(t.target).unwrap();
    let syms = hotprobe_symbols::ProcessSymbols::for_pid(pid as u32).unwrap();
    let main = syms.main_module().unwrap();
    assert!(main.module.find("runtime.main").is_none());
    assert!(hotprobe::nonlocal::is_go_module(main));
    let entry = main.runtime(main.module.entry());
    match t.session.retprobe_addr(t.target, entry, RetProbe::new(8)) {
        Err(EngineError::Refused { reason, .. }) => assert_eq!(reason, GO_REASON),
        r => panic!("{:?}", r.map(|_| ())),
    }
    assert_eq!(finish(&mut t), want);
}

#[test]
fn sixteen_threads_entry_and_return_probes_stay_exact() {
    // 15 runs of 16 threads × 1000 calls, each call an entry stop and a
    // trampoline stop: about 23 s in a debug build on two cores shared with
    // other builds (20 runs took 31 s there, over the ~30 s budget).
    let bin = nonlocal_c("-O2");
    let args = ["threads", "16", "1000"];
    let want = native_output(&bin, &args);
    assert_eq!(want, "deep calls=16000 returns=16000 total=16000\n");
    for run in 0..15 {
        let mut t = spawn(&bin, &args);
        let (e, r, rets) = entry_and_return(&mut t, "deep", 64);
        assert_eq!(finish(&mut t), want, "run {run}");
        assert_eq!(stats(&t, e).hits, 16000, "run {run}");
        assert_eq!(ret_counts(&t, r), (16000, 0, 0), "run {run}");
        assert_eq!(rets.get(), 16000, "run {run}");
    }
}
