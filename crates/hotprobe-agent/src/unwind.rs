//! Hooks on the C++ exception machinery, so that an exception can unwind
//! through frames whose return address the agent swapped (the unwinder
//! finds no unwind information for the return trampoline).
//!
//! With the agent preloaded (`LD_PRELOAD`), its definitions of
//! `_Unwind_RaiseException`, `_Unwind_Resume_or_Rethrow`,
//! `_Unwind_ForcedUnwind` (pthread_exit, cancellation) and
//! `__cxa_begin_catch` come first in symbol lookup. The first three put the
//! real return address back into every live hooked frame before forwarding
//! to libgcc's; `__cxa_begin_catch` (called by every `catch` handler) drops
//! the entries of the frames the exception unwound — recording an unwound
//! exit for each, so entry/exit events stay nested — and swaps the live
//! frames' return addresses back. An agent injected with `dlopen` does not
//! interpose these symbols: the tracer then must not hook returns in
//! programs that throw through probed frames (documented limitation).
//!
//! Each hook is a naked function (it must see the caller's exact stack
//! pointer) calling a Rust helper that returns the real function's address,
//! resolved with `dlsym(RTLD_NEXT)`, then tail-jumps to it.

use core::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::ffi::CStr;

use crate::hit::{
    find_thread, pop_dead, return_trampoline, thread_pointer, Shadow, ThreadEntry, SHADOW_RESTORED,
};

static REAL: [AtomicUsize; 4] = [const { AtomicUsize::new(0) }; 4];
const NAMES: [&CStr; 4] = [
    c"_Unwind_RaiseException",
    c"_Unwind_Resume_or_Rethrow",
    c"_Unwind_ForcedUnwind",
    c"__cxa_begin_catch",
];

fn real(i: usize) -> usize {
    let r = REAL[i].load(Relaxed);
    if r != 0 {
        return r;
    }
    // SAFETY: dlsym with a valid C string; RTLD_NEXT finds the definition
    // after the agent's (libgcc_s, libstdc++).
    let p =
        crate::threads::as_own_call(|| unsafe { libc::dlsym(libc::RTLD_NEXT, NAMES[i].as_ptr()) })
            as usize;
    if p == 0 {
        // SAFETY: abort has no preconditions; with no real unwinder the
        // program could not have thrown.
        unsafe { libc::abort() };
    }
    REAL[i].store(p, Relaxed);
    p
}

extern "C" fn before_unwind(sp: u64, which: u64) -> usize {
    // No catch_unwind here: the helpers are panic-free (no indexing that can
    // fail, no allocation).
    restore_for_unwind(sp);
    real(which as usize)
}

extern "C" fn before_catch(sp: u64) -> usize {
    rearm_after_catch(sp);
    real(3)
}

macro_rules! unwind_hook {
    ($name:ident, $which:literal) => {
        /// Interposed unwinder entry: restores hooked return addresses, then
        /// jumps to libgcc's function of the same name.
        ///
        /// # Safety
        /// Same contract as the libgcc function it forwards to.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
            core::arch::naked_asm!(
                "push rdi",
                "push rsi",
                "push rdx",
                // The caller's stack pointer before its call: rsp + 24 + 8.
                "lea rdi, [rsp+32]",
                concat!("mov esi, ", $which),
                // Entry rsp ≡ 8 (mod 16); three pushes make the call aligned.
                "call {f}",
                "pop rdx",
                "pop rsi",
                "pop rdi",
                "jmp rax",
                f = sym before_unwind,
            );
        }
    };
}

unwind_hook!(_Unwind_RaiseException, "0");
unwind_hook!(_Unwind_Resume_or_Rethrow, "1");
unwind_hook!(_Unwind_ForcedUnwind, "2");

/// Interposed `__cxa_begin_catch`: drops the unwound frames' shadow entries
/// and re-hooks the live ones, then jumps to libstdc++'s.
///
/// # Safety
/// Same contract as `__cxa_begin_catch`.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn __cxa_begin_catch() {
    core::arch::naked_asm!(
        "push rdi",
        "lea rdi, [rsp+16]",
        "call {f}",
        "pop rdi",
        "jmp rax",
        f = sym before_catch,
    );
}

/// The current thread's entry and shadow stack, for the unwinder hooks.
fn current_shadow() -> Option<(&'static ThreadEntry, *mut Shadow)> {
    let t = find_thread(thread_pointer())?;
    let base = t.shadow.load(Relaxed) as *mut Shadow;
    (!base.is_null()).then_some((t, base))
}

/// Before an unwinder walks the stack from `sp` (the caller's stack
/// pointer): drops the entries of dead frames and puts every live frame's
/// real return address back, marking it restored.
fn restore_for_unwind(sp: u64) {
    let Some((t, base)) = current_shadow() else {
        return;
    };
    // Without shared memory (dormant, a forked child) the hooked frames
    // still need their real return addresses.
    let shm = crate::shm();
    let was = t.fast.busy.swap(1, Relaxed);
    pop_dead(shm, t, base, sp, false);
    let tramp = return_trampoline();
    for i in 0..t.depth.load(Relaxed) as usize {
        // SAFETY: i < depth <= SHADOW_CAP.
        let e = unsafe { &mut *base.add(i) };
        if e.flags & SHADOW_RESTORED == 0 {
            // SAFETY: a live frame's return slot on this thread's stack.
            unsafe {
                if (e.slot as *const u64).read_volatile() == tramp {
                    (e.slot as *mut u64).write_volatile(e.real);
                }
            }
            e.flags |= SHADOW_RESTORED;
        }
    }
    t.fast.busy.store(was, Relaxed);
}

/// When a handler catches (the caller's stack pointer is `sp`): the frames
/// below `sp` were unwound (their entries are popped with unwound exits);
/// the live ones are hooked again.
fn rearm_after_catch(sp: u64) {
    let Some((t, base)) = current_shadow() else {
        return;
    };
    // Without shared memory (dormant, a forked child) the hooked frames
    // still need their real return addresses.
    let shm = crate::shm();
    let was = t.fast.busy.swap(1, Relaxed);
    pop_dead(shm, t, base, sp, false);
    let tramp = return_trampoline();
    for i in 0..t.depth.load(Relaxed) as usize {
        // SAFETY: i < depth <= SHADOW_CAP.
        let e = unsafe { &mut *base.add(i) };
        if e.flags & SHADOW_RESTORED != 0 {
            // SAFETY: a live frame's return slot on this thread's stack.
            unsafe {
                if (e.slot as *const u64).read_volatile() == e.real {
                    (e.slot as *mut u64).write_volatile(tramp);
                }
            }
            e.flags &= !SHADOW_RESTORED;
        }
    }
    t.fast.busy.store(was, Relaxed);
}
