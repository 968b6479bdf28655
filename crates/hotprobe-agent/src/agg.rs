//! Aggregations in the target (`count --hist=arg0`, `--lhist`, `--by`):
//! a hit of a site whose action has `ACTION_AGG` adds into its probe's
//! histogram or key count in the shared memory (`hotprobe_abi::agg`)
//! instead of writing an event. Allocation-free and lock-free: a rule
//! lookup, then one locked add (a bucket) or a bounded probe of the key
//! table. Hits that cannot be aggregated are counted as such.

use core::sync::atomic::Ordering::Relaxed;

use hotprobe_abi::agg::{self, AGG_SRC_ARG0, AGG_SRC_COMM, AGG_SRC_RETVAL, AGG_SRC_TID};
use hotprobe_abi::{Shm, ACTION_AGG, KIND_EXIT};

use crate::hit::ThreadEntry;
use crate::trampoline::Frame;

/// A shadow-stack flag (`hit::Shadow::flags`): the hooked return adds
/// its return value into the probe's aggregation ([`on_return`]).
pub(crate) const SHADOW_AGG: u32 = 8;

/// The shadow-stack flag an entry of `probe` with `action` hooks its
/// return with: [`SHADOW_AGG`] when the probe aggregates return values.
#[inline(always)]
pub(crate) fn shadow_flag(shm: &Shm, probe: u32, action: u32) -> u32 {
    if action & ACTION_AGG == 0 {
        return 0;
    }
    match agg::find_rule(shm, probe) {
        Some(r) if r.source.load(Relaxed) == AGG_SRC_RETVAL => SHADOW_AGG,
        _ => 0,
    }
}

/// A hooked return of `probe` with return value `rax`: added into the
/// probe's aggregation of return values.
#[inline(never)]
pub(crate) fn on_return(shm: &Shm, probe: u32, rax: u64) {
    if let Some(rule) = agg::find_rule(shm, probe) {
        agg::add_hit(shm, rule, probe, rax, 0);
    }
}

/// A hit of `probe` on thread `t` with the registers of `frame` (`kind`:
/// an entry, or an exit placeholder's): adds it into the probe's
/// aggregation (no rule: nothing, the site was armed before its rule,
/// which the tracer never does). Return values are added at the return:
/// an entry of such a probe adds nothing.
#[inline(never)]
pub(crate) fn on_hit(shm: &Shm, t: &ThreadEntry, frame: &Frame, probe: u32, kind: u32) {
    let Some(rule) = agg::find_rule(shm, probe) else {
        return;
    };
    let source = rule.source.load(Relaxed);
    let (k0, k1) = match source {
        AGG_SRC_RETVAL if kind == KIND_EXIT as u32 => (frame.rax, 0),
        AGG_SRC_RETVAL => return,
        AGG_SRC_TID => (t.tid.load(Relaxed) as u64, 0),
        AGG_SRC_COMM => match comm(t) {
            Some(c) => c,
            None => {
                rule.uncounted.fetch_add(1, Relaxed);
                return;
            }
        },
        s => match frame.args.get(s.wrapping_sub(AGG_SRC_ARG0) as usize) {
            Some(v) => (agg::narrow(*v, rule.width.load(Relaxed)), 0),
            None => {
                rule.uncounted.fetch_add(1, Relaxed);
                return;
            }
        },
    };
    agg::add_hit(shm, rule, probe, k0, k1);
}

/// A hit of `probe` that could not be aggregated (its thread was inside
/// the agent, or registering): counted in the rule's `uncounted`.
#[cold]
pub(crate) fn refused(shm: &Shm, probe: u32) {
    if let Some(rule) = agg::find_rule(shm, probe) {
        rule.uncounted.fetch_add(1, Relaxed);
    }
}

/// The calling thread's command name as two little-endian words
/// (`prctl(PR_GET_NAME)`, a raw system call: the name may change at any
/// time, with `prctl` or through `/proc`). `None` in seccomp strict mode,
/// where the call would kill the thread.
fn comm(t: &ThreadEntry) -> Option<(u64, u64)> {
    if t.clock.load(Relaxed) == crate::clock::CLOCK_NONE {
        return None;
    }
    // Not zeroed, read word by word: a 16-byte zeroing or copy compiles
    // to an xmm store, which the fast path must not touch. The kernel
    // writes all 16 bytes (TASK_COMM_LEN, NUL-padded).
    let mut buf = core::mem::MaybeUninit::<[u64; 2]>::uninit();
    let p = buf.as_mut_ptr() as *mut u64;
    let r: i64;
    // SAFETY: prctl(PR_GET_NAME, p) writes 16 bytes at `p`, a live local
    // of 16 bytes; `syscall` clobbers rcx and r11.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") libc::SYS_prctl => r,
            in("rdi") libc::PR_GET_NAME as u64,
            in("rsi") p,
            in("rdx") 0u64,
            in("r10") 0u64,
            in("r8") 0u64,
            out("rcx") _,
            out("r11") _,
            options(nostack)
        )
    };
    if r != 0 {
        return None;
    }
    // SAFETY: the call succeeded: both words are written.
    unsafe { Some((p.read_volatile(), p.add(1).read_volatile())) }
}
