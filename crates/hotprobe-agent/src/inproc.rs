//! In-process traps: `int3`s the agent's own `SIGTRAP` handler takes, with
//! no ptrace stop (a probe where neither a patch nor a jump fits: a
//! function shorter than 5 bytes, a jump target, an instruction in the
//! middle of a function).
//!
//! The tracer publishes each site in the shared memory's in-process table
//! (`hotprobe_abi::InprocSite`: address → counter, execution) *before* it
//! writes the `int3`. The handler ([`handle`], called first by the agent's
//! `SIGTRAP` handler in `orphan`) finds `rip - 1` there, counts, and
//! executes the displaced instruction by moving the interrupted context:
//!
//! * boosted (`INPROC_BOOST`): `rip` = the tracer's copy of the
//!   instruction (relocated with iced-x86, as the jump mechanism's
//!   trampolines are), followed by a `jmp` back to the next instruction;
//! * `ret` (`INPROC_RET`): `rip = [rsp]`, `rsp += 8`;
//! * `call rel32` (`INPROC_CALL`): the return address is pushed (below
//!   `rsp`: the kernel put the signal frame below the red zone) and `rip`
//!   is the call's target.
//!
//! The table pointer is kept apart from the attached memory ([`set`]) and
//! is never cleared: in a forked child whose agent went dormant the
//! `int3`s the child inherited still resume correctly (uncounted), and a
//! thread whose `SIGTRAP` is still pending when the tracer restores the
//! original byte at detach finds its entry (entries are never removed).
//! A `SIGTRAP` whose `rip - 1` is not in the table goes on to the rest of
//! the agent's handler, then to the program's own (chained).
//!
//! A recording site (`INPROC_RECORD`) writes its entry event into the
//! thread's ring and, at a function's first instruction (`INPROC_EXIT`),
//! swaps the return address on top of the stack for the agent's return
//! trampoline (which records the exit), through the fast path's own code
//! (`hit::inproc_hit`): the same per-thread state, rings and shadow stack,
//! a thread's first hit registering it from the handler.
//!
//! A site with a handler of the tracer's (`INPROC_HANDLER`) first hands
//! the thread's registers to the tracer through the thread's
//! `hotprobe_abi::HandlerSlot` ([`call_tracer`]): the thread spins for the
//! answer for `HandlerCtl::spin_ns`, then sleeps on the slot's state word
//! (futex); the tracer runs the handler, writes the registers back and
//! wakes it. A request the tracer does not take within
//! `HandlerCtl::timeout_ns` (a dead or stuck tracer) is withdrawn and the
//! thread resumes unmodified, counted in `HandlerCtl::missed`; a request
//! it took is waited for as long as the tracer's heartbeat is fresh.
//!
//! Only atomics, plain loads and stores, `rdtsc`, and the `futex`,
//! `clock_gettime`, `sched_yield` and `gettid` system calls made by the
//! `syscall` instruction, never through libc, whose functions may be the
//! ones probed (the spin yields the CPU at each check after 2 µs; time is
//! the thread's clock, see `clock`): async-signal-safe, allocation-free,
//! lock-free. The thread's handler slot is claimed at its first call
//! (registering the thread if need be) and given back when it exits.

use core::sync::atomic::AtomicPtr;
use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use hotprobe_abi::{
    Shm, ACTION_COUNT, CONTROL_ENABLED, HANDLER_BUSY, HANDLER_DONE, HANDLER_IDLE, HANDLER_MODIFIED,
    HANDLER_POST, HANDLER_REGS, HANDLER_REQUEST, HANDLER_SLEEPING, HANDLER_STUB, INPROC_BOOST,
    INPROC_CALL, INPROC_COUNT, INPROC_EXIT, INPROC_HANDLER, INPROC_KIND_MASK, INPROC_POST,
    INPROC_POST_SITE, INPROC_RECORD, INPROC_RET,
};

const SI_KERNEL: i32 = 0x80;
/// Nanoseconds of pure spinning before a waiting thread yields at each check.
const YIELD_AFTER_NS: u64 = 2_000;

/// The memory whose in-process table the handler reads (a leaked view,
/// valid forever; never cleared, see the module docs).
static TABLE: AtomicPtr<Shm> = AtomicPtr::new(core::ptr::null_mut());

/// The in-process table of `shm` is the one the handler reads from now on.
pub(crate) fn set(shm: &'static Shm) {
    // Release pairs with the Acquire load in `handle`.
    TABLE.store(shm as *const Shm as *mut Shm, Release);
}

/// Whether the `SIGTRAP` was an in-process trap, now dealt with.
pub(crate) fn handle(info: &libc::siginfo_t, uc: &mut libc::ucontext_t) -> bool {
    // An int3 reports SI_KERNEL; anything else (a step, a tgkill) is not ours.
    if info.si_code != SI_KERNEL {
        return false;
    }
    let p = TABLE.load(Acquire);
    if p.is_null() {
        return false;
    }
    // SAFETY: non-null values are leaked views, valid forever.
    let table = unsafe { &*p };
    let gregs = &mut uc.uc_mcontext.gregs;
    let rip = gregs[libc::REG_RIP as usize] as u64;
    let at = rip.wrapping_sub(1);
    let Some((counter, flags, resume, next)) = table.lookup_inproc(at) else {
        return false;
    };
    if flags & INPROC_POST_SITE != 0 {
        // The int3 after a boosted copy: the instruction ran; the post
        // handler sees rip at the next original instruction.
        gregs[libc::REG_RIP as usize] = resume as i64;
        if flags & INPROC_HANDLER != 0 {
            if let Some(shm) = crate::shm() {
                if shm.header().control.load(Relaxed) & CONTROL_ENABLED != 0 {
                    call_tracer(shm, counter, next, gregs, HANDLER_POST);
                }
            }
        }
        return true;
    }
    // Counted only with the tracer's memory attached (not in a dormant
    // forked child) and enabled.
    if flags & INPROC_COUNT != 0 {
        if let Some(shm) = crate::shm() {
            if flags & INPROC_RECORD != 0 {
                // Entry event, return hook and count, as a trampoline's
                // hit (before the displaced instruction runs: `rsp` still
                // points at the return address).
                crate::hit::inproc_hit(shm, counter, flags & INPROC_EXIT != 0, at, gregs);
            } else if shm.header().control.load(Relaxed) & CONTROL_ENABLED != 0 {
                count_in_handler(shm, counter);
            }
        }
    }
    if flags & INPROC_HANDLER != 0 {
        if let Some(shm) = crate::shm() {
            if shm.header().control.load(Relaxed) & CONTROL_ENABLED != 0 {
                // The handler sees (and may move) rip at the probed
                // instruction, as the kernel's rip is one past the int3.
                gregs[libc::REG_RIP as usize] = at as i64;
                call_tracer(shm, counter, at, gregs, 0);
                if gregs[libc::REG_RIP as usize] as u64 != at {
                    // The handler moved the thread: the displaced
                    // instruction is skipped (a Kprobes pre handler's redirect).
                    return true;
                }
            }
        }
    }
    match flags & INPROC_KIND_MASK {
        INPROC_BOOST => gregs[libc::REG_RIP as usize] = resume as i64,
        INPROC_RET => {
            let rsp = gregs[libc::REG_RSP as usize] as u64;
            // SAFETY: the interrupted thread was about to run `ret`, which
            // reads this very word: it is mapped and readable.
            let ret = unsafe { (rsp as *const u64).read() };
            gregs[libc::REG_RIP as usize] = ret as i64;
            gregs[libc::REG_RSP as usize] = rsp.wrapping_add(8) as i64;
        }
        INPROC_CALL => {
            let rsp = gregs[libc::REG_RSP as usize] as u64 - 8;
            // SAFETY: the interrupted thread was about to run `call`, which
            // writes this very word (in its red zone, above the signal
            // frame the kernel placed below it).
            unsafe { (rsp as *mut u64).write(next) };
            gregs[libc::REG_RSP as usize] = rsp as i64;
            gregs[libc::REG_RIP as usize] = resume as i64;
        }
        _ => return false,
    }
    if flags & (INPROC_POST | INPROC_HANDLER) == INPROC_POST | INPROC_HANDLER
        && flags & INPROC_KIND_MASK != INPROC_BOOST
    {
        // An emulated instruction: its post handler in the same signal.
        if let Some(shm) = crate::shm() {
            if shm.header().control.load(Relaxed) & CONTROL_ENABLED != 0 {
                call_tracer(shm, counter, at, gregs, HANDLER_POST);
            }
        }
    }
    true
}

/// `futex(word, op, val, timeout)` on a shared (not private) word, by the
/// system call (libc's `syscall` may be probed).
fn futex(word: &core::sync::atomic::AtomicU32, op: i32, val: u32, timeout_ns: u64) {
    let ts = [
        (timeout_ns / 1_000_000_000) as i64,
        (timeout_ns % 1_000_000_000) as i64,
    ];
    let tsp = if op == libc::FUTEX_WAIT {
        ts.as_ptr() as u64
    } else {
        0
    };
    // `word` is a valid, aligned u32 in shared memory; the timeout, when
    // passed, is a valid timespec.
    crate::orphan::syscall(
        libc::SYS_futex,
        [word.as_ptr() as u64, op as u64, u64::from(val), tsp],
    );
}

/// Hands the registers in `gregs` (at least [`HANDLER_REGS`] words, in
/// `gregs` order) to the tracer's handler for the site at `at` (counter
/// `counter`; `flags`: 0, [`HANDLER_POST`], or [`HANDLER_STUB`] with `at`
/// the site key; `rip` is `gregs`' own) and
/// takes back the ones it returns (see the module docs).
fn call_tracer(shm: &Shm, counter: u32, at: u64, gregs: &mut [libc::greg_t], flags: u32) {
    if crate::threads::in_own_call() {
        // The agent's own call of a probed function: not the program's.
        return;
    }
    let ctl = shm.handler_ctl();
    let mode = crate::clock::current_mode();
    // In seccomp strict mode the wait (futex, clock) would kill the thread.
    let slot = (mode != crate::clock::CLOCK_NONE)
        .then(|| crate::threads::handler_slot(shm))
        .flatten();
    let Some(slot) = slot else {
        ctl.missed.fetch_add(1, Relaxed);
        shm.note_missed(counter);
        return;
    };
    let now_ns = || crate::clock::now_ns(shm, mode).unwrap_or(0);
    if slot.state.load(Relaxed) != HANDLER_IDLE {
        // This thread is already in a call (a signal handler interrupting
        // the agent): the nested hit runs without its handler.
        ctl.missed.fetch_add(1, Relaxed);
        shm.note_missed(counter);
        return;
    }
    for (i, r) in slot.regs.iter().enumerate().take(HANDLER_REGS) {
        r.store(gregs[i] as u64, Relaxed);
    }
    slot.counter.store(counter, Relaxed);
    slot.addr.store(at, Relaxed);
    slot.flags.store(flags, Relaxed);
    // Release pairs with the tracer's Acquire CAS REQUEST -> BUSY: the
    // registers are seen with the request.
    slot.state.store(HANDLER_REQUEST, Release);
    ctl.doorbell.fetch_add(1, Release);
    if ctl.tracer_sleeping.load(Acquire) != 0 {
        futex(&ctl.doorbell, libc::FUTEX_WAKE, i32::MAX as u32, 0);
    }
    let spin = ctl.spin_ns.load(Relaxed);
    let timeout = match ctl.timeout_ns.load(Relaxed) {
        0 => 1_000_000_000,
        t => t,
    };
    let start = now_ns();
    let mut n = 0u32;
    // Acquire pairs with the tracer's Release store of DONE: the registers
    // it wrote are seen.
    let done = loop {
        let st = slot.state.load(Acquire);
        if st == HANDLER_DONE {
            break true;
        }
        n = n.wrapping_add(1);
        // Spinning: the clock is read every 64 checks. Sleeping (no
        // spin): at once — pauses would only hold the core the tracer's
        // thread may be waiting for.
        if spin != 0 && !n.is_multiple_of(64) {
            core::hint::spin_loop();
            continue;
        }
        let elapsed = now_ns().wrapping_sub(start);
        if st == HANDLER_REQUEST && elapsed > timeout {
            // Not taken: withdraw it (the tracer's CAS fails if this wins).
            if slot
                .state
                .compare_exchange(HANDLER_REQUEST, HANDLER_IDLE, Acquire, Relaxed)
                .is_ok()
            {
                ctl.missed.fetch_add(1, Relaxed);
                shm.note_missed(counter);
                return;
            }
            continue;
        }
        if st == HANDLER_BUSY && elapsed > timeout && crate::tracer_gone_now(shm) {
            // Taken by a tracer that died meanwhile: resume unmodified
            // (the slot stays BUSY; the thread makes no more calls).
            ctl.missed.fetch_add(1, Relaxed);
            shm.note_missed(counter);
            return;
        }
        if elapsed < spin {
            if elapsed > YIELD_AFTER_NS {
                // Past a short pure spin, give the CPU away at each check:
                // on a machine with more runnable threads than cores the
                // tracer may be waiting for this very core.
                // sched_yield has no arguments; by the system call.
                crate::orphan::syscall(libc::SYS_sched_yield, [0; 4]);
            }
        } else {
            slot.flags.fetch_or(HANDLER_SLEEPING, Relaxed);
            // Sleeps only while the state is still `st` (the futex
            // compares): a DONE stored meanwhile is not slept through.
            // Until the call's timeout (a request not taken by then is
            // withdrawn), at most 100 ms (a taken call checks the tracer
            // lives): a wait shorter than the kernel's tick programs the
            // timer at each call, which doubled the hand-over in a VM.
            let left = if st == HANDLER_REQUEST {
                timeout.saturating_sub(elapsed).max(1)
            } else {
                u64::MAX
            };
            futex(&slot.state, libc::FUTEX_WAIT, st, left.min(100_000_000));
        }
    };
    if done {
        if slot.flags.load(Relaxed) & HANDLER_MODIFIED != 0 {
            for (i, r) in slot.regs.iter().enumerate().take(HANDLER_REGS) {
                gregs[i] = r.load(Relaxed) as libc::greg_t;
            }
        }
        slot.flags.store(0, Relaxed);
        slot.state.store(HANDLER_IDLE, Relaxed);
    }
}

/// Called by the handler trampoline (a patch or jump site of a handler
/// probe) with its frame: [`HANDLER_REGS`] words in `gregs` order, `rip`
/// holding the site key. Counts the hit and makes the shared-memory call
/// (no signal: the ≤ 1 µs path); the trampoline resumes with the frame.
/// Only atomics and the system calls of [`call_tracer`].
pub(crate) extern "C" fn handler_hit(frame: *mut libc::greg_t) {
    let Some(shm) = crate::shm() else { return };
    let h = shm.header();
    if h.control.load(Relaxed) & CONTROL_ENABLED == 0 {
        return;
    }
    // SAFETY: the trampoline passes its frame of HANDLER_REGS words, on
    // this thread's stack, valid for the call.
    let regs = unsafe { core::slice::from_raw_parts_mut(frame, HANDLER_REGS) };
    let key = regs[16] as u64;
    let Some((probe, action)) = shm.lookup_site(key) else {
        h.site_misses.fetch_add(1, Relaxed);
        return;
    };
    if action == 0 {
        return;
    }
    if action & ACTION_COUNT != 0 {
        count_in_handler(shm, probe);
    }
    call_tracer(shm, probe, key, regs, HANDLER_STUB);
}

/// Counts one hit of counter `counter` from the in-process trap's
/// `SIGTRAP` handler or the handler trampoline: into the calling thread's
/// own counter (one `inc`) when the thread has a slot, else into the
/// shared global counter (a locked add). A thread waiting for a slot of
/// its own (a forked or vfork child's, `PENDING_SLOT`) claims it first,
/// as on the slow path, rather than count as the process's; a vfork
/// child without one counts the hit as missed (`vfork::unslotted`), and
/// the parent of a pending vfork child counts in its own slot. Only
/// atomics and system calls: async-signal-safe.
pub(crate) fn count_in_handler(shm: &Shm, counter: u32) {
    use crate::hit::{find_thread, thread_pointer, NO_SLOT, PENDING_SLOT};
    let word = crate::tls::get();
    if word == crate::threads::own_call() || crate::vfork::unslotted(shm, word, counter) {
        return;
    }
    let i = counter as usize;
    let tp = thread_pointer();
    let pending = find_thread(tp).is_some_and(|e| e.slot.load(Relaxed) == PENDING_SLOT);
    let parent = pending
        .then(|| crate::vfork::parent_in_window(tp))
        .flatten();
    if pending && parent.is_none() && word != crate::hit::registering() {
        crate::threads::register_current(shm, tp);
        if crate::vfork::unslotted(shm, crate::tls::get(), counter) {
            return;
        }
    }
    let slot = find_thread(tp).map_or(NO_SLOT, |e| e.slot.load(Relaxed));
    let mut counted = false;
    if slot != NO_SLOT && slot != PENDING_SLOT && !crate::shared_tls::is_shared(tp) {
        if let Some(c) = shm.thread_counters(slot).and_then(|c| c.get(i)) {
            crate::hit::bump(c);
            counted = true;
        }
    }
    if !counted {
        if let Some(c) = shm.global_counters().get(i) {
            c.fetch_add(1, Relaxed);
        }
    }
    if let Some(e) = parent {
        crate::vfork::rearm(e);
    }
}
