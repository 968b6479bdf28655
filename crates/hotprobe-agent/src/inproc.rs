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
//! Only atomics and plain loads and stores: async-signal-safe,
//! allocation-free, lock-free.

use core::sync::atomic::AtomicPtr;
use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};

use hotprobe_abi::{
    Shm, CONTROL_ENABLED, INPROC_BOOST, INPROC_CALL, INPROC_COUNT, INPROC_KIND_MASK, INPROC_RET,
};

const SI_KERNEL: i32 = 0x80;

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
    // Counted only with the tracer's memory attached (not in a dormant
    // forked child) and enabled.
    if flags & INPROC_COUNT != 0 {
        if let Some(shm) = crate::shm() {
            if shm.header().control.load(Relaxed) & CONTROL_ENABLED != 0 {
                crate::hit::count_in_handler(shm, counter);
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
    true
}
