//! libc's `syscall()`, interposed (issue 22): a program that changes its
//! signal state or its clock with `syscall(SYS_rt_sigprocmask, …)` and the
//! like, rather than through the libc functions the agent interposes,
//! gets the same treatment as through them:
//!
//! * `rt_sigprocmask`: `SIGTRAP` kept out of the mask, the program shown
//!   the mask it asked for (`sigmask`);
//! * `rt_sigaction`: `SIGTRAP` kept out of a handler's mask; a handler of
//!   `SIGTRAP` itself becomes the chained one (`orphan::sigaction`);
//! * `sigaltstack`: the agent's larger stack in the kernel (`altstack`);
//! * `prctl` and `seccomp`: the thread's clock mode (`clock`).
//!
//! Every other number goes to libc's `syscall()` unchanged, as do the
//! changed `rt_sigprocmask` and `rt_sigaction` calls (a probe on libc's
//! `syscall` counts them); the other three make the system call
//! themselves. `clone` and `clone3` jump straight to libc's (a child on a
//! stack of its own returns from it with nothing of the agent's on its
//! stack), after `vfork`'s bookkeeping when they carry `CLONE_VFORK`. A `syscall` instruction of the program's own is not seen:
//! the session gives a program with one no in-process trap.

#![cfg_attr(test, allow(dead_code))]

use core::sync::atomic::AtomicUsize;

use libc::c_long;

type SyscallFn = unsafe extern "C" fn(c_long, ...) -> c_long;

/// glibc's `syscall` (found once through `dlsym(RTLD_NEXT)`).
static NEXT_SYSCALL: AtomicUsize = AtomicUsize::new(0);

/// Finds glibc's `syscall` now (at attach): a thread in seccomp strict
/// mode may make no system call, and `dlsym` makes some.
pub(crate) fn resolve() {
    next();
}

fn next() -> Option<SyscallFn> {
    let f = crate::next_symbol::next_symbol(&NEXT_SYSCALL, c"syscall");
    // SAFETY: dlsym's address of glibc's variadic `syscall`.
    (f != 0).then(|| unsafe { core::mem::transmute::<usize, SyscallFn>(f) })
}

/// A result of the system call itself (0 or more, or the negated error)
/// as libc's `syscall` returns it: -1 with `errno` set on error.
fn as_libc(r: i64) -> c_long {
    if (-4095..0).contains(&r) {
        // SAFETY: errno of the calling thread.
        unsafe { *libc::__errno_location() = -r as i32 };
        -1
    } else {
        r as c_long
    }
}

/// The kernel's `struct sigaction` (x86-64).
#[repr(C)]
#[derive(Clone, Copy)]
struct KernelSigaction {
    handler: u64,
    flags: u64,
    restorer: u64,
    mask: u64,
}

/// `rt_sigaction(sig, act, old, size)` (see the module docs); `call`
/// makes the system call with the given action through libc.
///
/// # Safety
/// `act` and `old` are null or valid kernel sigactions.
unsafe fn rt_sigaction(
    sig: libc::c_int,
    act: *const KernelSigaction,
    old: *mut KernelSigaction,
    size: usize,
    call: impl FnOnce(*const KernelSigaction) -> c_long,
) -> c_long {
    if !crate::orphan::installed() || size != 8 {
        return call(act);
    }
    if sig != libc::SIGTRAP {
        // SAFETY: `act` is null or valid (caller); copied.
        let mut copy = (!act.is_null()).then(|| unsafe { act.read_unaligned() });
        let had = crate::sigmask::kernel_handler_mask(sig, copy.as_mut().map(|a| &mut a.mask));
        let rc = call(copy.as_ref().map_or(core::ptr::null(), |a| a as *const _));
        if rc == 0 && had && !old.is_null() {
            // SAFETY: `old` is valid (caller) and was just written.
            unsafe { (*old).mask |= 1 << (libc::SIGTRAP - 1) };
        }
        return rc;
    }
    // SIGTRAP: the program's kept action (see `progtrap`), exactly as
    // the kernel would have read and written it.
    let prev = crate::progtrap::get();
    if !act.is_null() {
        // SAFETY: `act` is valid (caller).
        let k = unsafe { act.read_unaligned() };
        crate::progtrap::set(crate::progtrap::KernelAction {
            handler: k.handler,
            flags: k.flags,
            restorer: k.restorer,
            mask: k.mask,
        });
    }
    if !old.is_null() {
        // SAFETY: `old` is valid (caller).
        unsafe {
            old.write_unaligned(KernelSigaction {
                handler: prev.handler,
                flags: prev.flags,
                restorer: prev.restorer,
                mask: prev.mask,
            })
        };
    }
    0
}

/// The flags of `clone3`'s `struct clone_args` at `args` (`size` bytes),
/// read without faulting (0 when the memory is not readable: the kernel
/// answers the call itself with `EFAULT`). Where `process_vm_readv` is
/// refused otherwise (a seccomp filter's `EPERM`), read directly.
fn clone3_flags(args: c_long, size: c_long) -> u64 {
    if args == 0 || size < 8 {
        return 0;
    }
    let mut flags: u64 = 0;
    let local = libc::iovec {
        iov_base: &mut flags as *mut u64 as *mut libc::c_void,
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: args as *mut libc::c_void,
        iov_len: 8,
    };
    // process_vm_readv of our own memory: EFAULT rather than a fault.
    let n = crate::orphan::syscall6(
        libc::SYS_process_vm_readv,
        [
            crate::threads::getpid() as u64,
            &local as *const libc::iovec as u64,
            1,
            &remote as *const libc::iovec as u64,
            1,
            0,
        ],
    );
    match n as i64 {
        8 => flags,
        e if e == -(libc::EFAULT as i64) => 0,
        // SAFETY: `args` is non-null and the program passes it to clone3
        // as a readable `struct clone_args` of `size` >= 8 bytes.
        _ => unsafe { (args as *const u64).read_unaligned() },
    }
}

/// Where a `syscall()` call goes (its return address at `ret_slot`):
/// `clone` and `clone3` to libc's, the others to [`syscall_other`].
extern "C" fn route(nr: c_long, a1: c_long, a2: c_long, ret_slot: *mut u64) -> usize {
    let flags = match nr {
        libc::SYS_clone => a1 as u64,
        libc::SYS_clone3 => clone3_flags(a1, a2),
        _ => return syscall_other as *const () as usize,
    };
    match next() {
        Some(real) => {
            if flags & crate::vfork::CLONE_VFORK != 0 {
                crate::vfork::before(ret_slot);
            }
            real as *const () as usize
        }
        None => syscall_other as *const () as usize,
    }
}

/// libc's `syscall`, interposed (see the module docs): a naked function
/// that keeps every argument register and the stack, then jumps to
/// libc's or to [`syscall_other`].
///
/// # Safety
/// As glibc's `syscall`: the arguments are valid for system call `nr`.
#[unsafe(naked)]
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn syscall() {
    core::arch::naked_asm!(
        // Entry rsp ≡ 8 (mod 16); seven pushes make the call aligned.
        "push rax",
        "push rdi",
        "push rsi",
        "push rdx",
        "push rcx",
        "push r8",
        "push r9",
        // nr, a1, a2 are in place; then the return address's slot.
        "lea rcx, [rsp + 56]",
        "call {f}",
        "mov r11, rax",
        "pop r9",
        "pop r8",
        "pop rcx",
        "pop rdx",
        "pop rsi",
        "pop rdi",
        "pop rax",
        "jmp r11",
        f = sym route,
    );
}

/// `syscall()` but `clone` and `clone3` (see the module docs). Declared
/// with six arguments after the number, as glibc's takes them: a caller
/// of the variadic function passes them in the same registers and stack
/// slot.
///
/// # Safety
/// As glibc's `syscall`: the arguments are valid for system call `nr`.
unsafe extern "C" fn syscall_other(
    nr: c_long,
    a1: c_long,
    a2: c_long,
    a3: c_long,
    a4: c_long,
    a5: c_long,
    a6: c_long,
) -> c_long {
    let Some(real) = next() else {
        return as_libc(-(libc::ENOSYS as i64));
    };
    // SAFETY: the caller's arguments, passed on as it gave them (or with
    // a copy of the set or action it passed, changed as documented).
    unsafe {
        match nr {
            libc::SYS_rt_sigprocmask => crate::sigmask::kernel_mask(
                a1 as libc::c_int,
                a2 as *const u64,
                a3 as *mut u64,
                a4 as usize,
                |set| real(nr, a1, set as c_long, a3, a4),
            ),
            libc::SYS_rt_sigaction => rt_sigaction(
                a1 as libc::c_int,
                a2 as *const KernelSigaction,
                a3 as *mut KernelSigaction,
                a4 as usize,
                |act| real(nr, a1, act as c_long, a3, a4),
            ),
            libc::SYS_sigaltstack => {
                crate::altstack::sigaltstack(a1 as *const libc::stack_t, a2 as *mut libc::stack_t)
                    as c_long
            }
            libc::SYS_prctl => crate::clock::prctl(
                a1 as libc::c_int,
                a2 as libc::c_ulong,
                a3 as libc::c_ulong,
                a4 as libc::c_ulong,
                a5 as libc::c_ulong,
            ) as c_long,
            libc::SYS_seccomp => as_libc(crate::clock::seccomp(a1 as u64, a2 as u64, a3 as u64)),
            _ => real(nr, a1, a2, a3, a4, a5, a6),
        }
    }
}
