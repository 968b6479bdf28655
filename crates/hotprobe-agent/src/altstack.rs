//! Alternate signal stacks, interposed (issue 22).
//!
//! An in-process trap's `int3` hit inside a signal handler that runs on
//! the program's alternate stack (`SA_ONSTACK`) raises `SIGTRAP` on that
//! stack: the kernel puts a nested signal's frame below the interrupted
//! stack pointer when it is on the alternate stack, whatever the nested
//! handler's flags. A stack the program sized for its own handler (4,096
//! or 6,000 bytes are common) has no room for that second frame: the
//! kernel kills the thread with `SIGSEGV` when the frame does not fit,
//! and the agent's handler overruns the stack when only the frame does.
//!
//! So while the agent's `SIGTRAP` handler is installed ([`crate::orphan`];
//! it runs without `SA_ONSTACK`, on the thread's own stack for a hit in
//! normal code), a stack the program installs with `sigaltstack` is given
//! to the kernel as a mapping of the agent's that is larger by
//! [`reserve`] bytes: the kernel's largest signal frame for this machine
//! (`AT_MINSIGSTKSZ`) plus what the agent's handler needs on top of it
//! ([`AGENT_FRAME`]). The program's handler has the room it sized its
//! stack for, and a `SIGTRAP` inside it has the room it needs. The
//! program is shown the stack it asked for: `sigaltstack`'s old stack is
//! the program's address, size and flags (with the kernel's
//! `SS_ONSTACK`). The agent's mapping is unmapped when the program
//! replaces or disables its stack, and when the thread exits.
//!
//! What the program can tell apart: its handler's locals are not in the
//! buffer it gave (a program that paints its buffer to measure its use
//! sees it untouched), and the `uc_stack` of the `ucontext` its
//! `SA_SIGINFO` handler receives names the agent's mapping. Not covered:
//! the raw `sigaltstack` system call made by the program's own `syscall`
//! instruction (the session gives such programs no in-process trap) — the
//! libc `syscall()` function is covered (`rawcall`).

#![cfg_attr(test, allow(dead_code))]

use core::cell::Cell;

/// What the agent's `SIGTRAP` handler uses of the stack the kernel runs
/// it on, beyond a trivial handler's, rounded up generously. Measured
/// with a program that paints the stack below its frame, then either
/// raises a signal with a trivial handler or calls a probed 4-byte
/// function, and finds the deepest byte written (the test
/// `signal_state2.rs` checks it stays under this, in its `depth` mode):
/// on this project's machine, with the debug agent, 144 bytes past the
/// trivial handler under `count`, 644 under `record` with the thread's
/// first hit (registration, the return hooked) in the handler. 4 KiB
/// leaves a wide margin (a handler probe's wait for the tracer, a
/// deeper libc).
pub(crate) const AGENT_FRAME: usize = 4096;

/// glibc's `MINSIGSTKSZ`: the kernel refuses smaller stacks (`ENOMEM`).
const MIN_STACK: usize = 2048;
/// `AT_MINSIGSTKSZ`: the kernel's signal frame size for this machine.
const AT_MINSIGSTKSZ: libc::c_ulong = 51;

/// The agent's stack standing in for the program's, on this thread.
struct Mapped {
    addr: Cell<usize>,
    len: Cell<usize>,
    /// The program's stack as it gave it: address, size, flags.
    shown: Cell<(usize, usize, i32)>,
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // The thread exits: no signal is delivered on the stack from here
        // on (it is disabled first).
        release(self);
    }
}

std::thread_local! {
    static MAPPED: Mapped = const {
        Mapped { addr: Cell::new(0), len: Cell::new(0), shown: Cell::new((0, 0, 0)) }
    };
}

/// The room added to every stack the program installs (see the module
/// docs): the kernel's signal frame for this machine and the agent's.
pub(crate) fn reserve() -> usize {
    // SAFETY: getauxval has no preconditions.
    let kernel = unsafe { libc::getauxval(AT_MINSIGSTKSZ) } as usize;
    // Kernels older than 5.14 do not say: the largest x86-64 frame then
    // (AVX-512 state) is below 4 KiB; 16 KiB covers AMX's 8 KiB of tiles.
    let kernel = if kernel == 0 { 16 * 1024 } else { kernel };
    kernel + AGENT_FRAME
}

/// `sigaltstack(2)` by the system call: 0, or the negated error.
fn raw(ss: *const libc::stack_t, old: *mut libc::stack_t) -> i64 {
    crate::orphan::syscall(libc::SYS_sigaltstack, [ss as u64, old as u64, 0, 0]) as i64
}

/// Unmaps the agent's stack of `m` after disabling it when it is still the
/// kernel's (a thread that exits without disabling its stack).
fn release(m: &Mapped) {
    let (addr, len) = (m.addr.get(), m.len.get());
    if addr == 0 {
        return;
    }
    // SAFETY: an all-zero stack_t is valid to be overwritten.
    let mut cur: libc::stack_t = unsafe { core::mem::zeroed() };
    if raw(core::ptr::null(), &mut cur) == 0 && cur.ss_sp as usize == addr {
        if cur.ss_flags & libc::SS_ONSTACK != 0 {
            // Still running on it: it stays.
            return;
        }
        let off = libc::stack_t {
            ss_sp: core::ptr::null_mut(),
            ss_flags: libc::SS_DISABLE,
            ss_size: 0,
        };
        raw(&off, core::ptr::null_mut());
    }
    crate::orphan::syscall(libc::SYS_munmap, [addr as u64, len as u64, 0, 0]);
    m.addr.set(0);
    m.len.set(0);
}

/// A fresh private read-write mapping of `len` bytes (0 on failure).
fn map(len: usize) -> usize {
    let p = crate::orphan::syscall6(
        libc::SYS_mmap,
        [
            0,
            len as u64,
            (libc::PROT_READ | libc::PROT_WRITE) as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK) as u64,
            u64::MAX,
            0,
        ],
    );
    if p > u64::MAX - 4095 {
        0
    } else {
        p as usize
    }
}

/// `sigaltstack`'s work with the agent's handler installed: 0 or the
/// negated error.
///
/// # Safety
/// `ss` and `old` are null or valid.
pub(crate) unsafe fn substitute(ss: *const libc::stack_t, old: *mut libc::stack_t) -> i64 {
    // Past the thread's TLS destructors: the kernel's call as is.
    let r = MAPPED.try_with(|m| {
        // SAFETY: an all-zero stack_t is valid to be overwritten.
        let mut cur: libc::stack_t = unsafe { core::mem::zeroed() };
        let r = raw(core::ptr::null(), &mut cur);
        if r != 0 {
            return r;
        }
        let ours = m.addr.get() != 0 && cur.ss_sp as usize == m.addr.get();
        let shown_old = if ours {
            let (sp, size, flags) = m.shown.get();
            libc::stack_t {
                ss_sp: sp as *mut libc::c_void,
                ss_flags: flags | (cur.ss_flags & libc::SS_ONSTACK),
                ss_size: size,
            }
        } else {
            cur
        };
        if !ss.is_null() {
            // SAFETY: `ss` is valid (caller); copied before `old` is written
            // (they may be the same memory).
            let new = unsafe { *ss };
            if cur.ss_flags & libc::SS_ONSTACK != 0 {
                return -(libc::EPERM as i64);
            }
            if new.ss_flags & libc::SS_DISABLE != 0 {
                let r = raw(&new, core::ptr::null_mut());
                if r != 0 {
                    return r;
                }
                release(m);
            } else {
                // The kernel's own checks (flags, the minimum size) first,
                // on the program's stack as given.
                if new.ss_size < MIN_STACK {
                    return -(libc::ENOMEM as i64);
                }
                let r = raw(&new, core::ptr::null_mut());
                if r != 0 {
                    return r;
                }
                let len = (new.ss_size + reserve() + 4095) & !4095;
                let addr = map(len);
                if addr != 0 {
                    let sub = libc::stack_t {
                        ss_sp: addr as *mut libc::c_void,
                        ss_flags: new.ss_flags,
                        ss_size: len,
                    };
                    if raw(&sub, core::ptr::null_mut()) == 0 {
                        // The previous stack of ours is no longer the kernel's.
                        let (prev, prev_len) = (m.addr.get(), m.len.get());
                        if prev != 0 {
                            crate::orphan::syscall(
                                libc::SYS_munmap,
                                [prev as u64, prev_len as u64, 0, 0],
                            );
                        }
                        m.addr.set(addr);
                        m.len.set(len);
                        m.shown.set((new.ss_sp as usize, new.ss_size, new.ss_flags));
                    } else {
                        crate::orphan::syscall(libc::SYS_munmap, [addr as u64, len as u64, 0, 0]);
                    }
                }
                // No mapping: the program's own stack stays installed
                // (as without the agent).
            }
        }
        if !old.is_null() {
            // SAFETY: `old` is valid (caller).
            unsafe { old.write(shown_old) };
        }
        0
    });
    r.unwrap_or_else(|_| raw(ss, old))
}

/// `sigaltstack`, interposed (see the module docs).
///
/// # Safety
/// As glibc's `sigaltstack`: `ss` and `old` are null or valid.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sigaltstack(ss: *const libc::stack_t, old: *mut libc::stack_t) -> i32 {
    let r = if crate::orphan::installed() {
        // SAFETY: the caller's arguments.
        unsafe { substitute(ss, old) }
    } else {
        raw(ss, old)
    };
    if r < 0 {
        // SAFETY: errno of the calling thread, as libc's wrapper sets it.
        unsafe { *libc::__errno_location() = -r as i32 };
        return -1;
    }
    0
}
