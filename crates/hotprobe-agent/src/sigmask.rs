//! Signal masks, interposed (issue 22). An in-process trap's `int3` raises
//! `SIGTRAP` synchronously: in a thread that blocks it — a server's worker
//! threads often block every signal — or in a handler whose `sa_mask`
//! holds it, the kernel unblocks it and kills the process instead of
//! running the agent's handler. So while the agent's `SIGTRAP` handler is
//! installed ([`crate::orphan`]), `SIGTRAP` is taken out of every mask the
//! program sets through libc (`pthread_sigmask`, `sigprocmask`, a
//! handler's `sa_mask` in `sigaction`), and the program is shown the mask
//! it asked for: the old mask these calls return holds `SIGTRAP` where the
//! program blocked it.
//!
//! A `SIGTRAP` of the program's own (`raise`, `pthread_kill`) that arrives
//! while the thread believes it blocked is held, as the kernel would keep
//! it pending ([`hold_if_blocked`]): `sigpending` shows it, and it is
//! raised again once the program unblocks `SIGTRAP` through these calls
//! (before, it went to the chained handler at once: the default action
//! killed a program that blocked `SIGTRAP` and raised it).
//!
//! What the program can tell apart: `/proc/self/status` (`SigBlk`), a
//! `SIGTRAP` sent by `kill` to the process while the receiving thread
//! believes it blocked (held by that thread rather than pending for the
//! process), and a new thread's view of the mask it inherited (the thread
//! starts with `SIGTRAP` shown unblocked). The libc `syscall()` function is interposed too
//! (`rawcall`): `syscall(SYS_rt_sigprocmask, …)` and
//! `syscall(SYS_rt_sigaction, …)` get the same treatment on the kernel's
//! 8-byte sets ([`kernel_mask`], [`kernel_handler_mask`]). Not covered:
//! a `syscall` instruction of the program's own (the Go runtime's, or
//! inline assembly: the session gives such a program no in-process trap)
//! and an agent injected into a running process (its calls are bound to
//! glibc already: the session gives it no in-process trap either).

// The interposers are exported (`no_mangle`) in the library only: a unit
// test build calls none of them.
#![cfg_attr(test, allow(dead_code))]

use core::sync::atomic::AtomicUsize;
use core::sync::atomic::Ordering::Relaxed;

// One initial-exec TLS word per thread for this module's flags (as
// `tls.rs`'s: `thread_local!` in the cdylib would go through
// `__tls_get_addr`, which may allocate, and the `SIGTRAP` handler reads
// it).
core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 3",
    ".globl hotprobe_agent_tls_sigflags",
    ".hidden hotprobe_agent_tls_sigflags",
    ".type hotprobe_agent_tls_sigflags,@object",
    ".size hotprobe_agent_tls_sigflags,8",
    "hotprobe_agent_tls_sigflags:",
    ".zero 8",
    ".popsection",
);

/// Flag: the program asked this thread to block `SIGTRAP`.
const WANTS_BLOCKED: u64 = 1;
/// Flag: a `SIGTRAP` of the program's arrived while it believed it
/// blocked: pending, as far as the program can tell ([`hold_if_blocked`]).
const HELD: u64 = 2;

/// The calling thread's flags word.
#[inline(always)]
fn flags() -> u64 {
    let off: u64;
    let v: u64;
    // SAFETY: loads the word's thread-pointer offset from the GOT
    // (R_X86_64_TPOFF64), then the calling thread's own static TLS word.
    unsafe {
        core::arch::asm!(
            "mov {off}, qword ptr [rip + hotprobe_agent_tls_sigflags@GOTTPOFF]",
            "mov {v}, qword ptr fs:[{off}]",
            off = out(reg) off,
            v = out(reg) v,
            options(nostack, readonly, preserves_flags)
        )
    };
    let _ = off;
    v
}

/// Sets the calling thread's flags word.
#[inline(always)]
fn set_flags(v: u64) {
    // SAFETY: as for `flags`: this thread's own static TLS word.
    unsafe {
        core::arch::asm!(
            "mov {off}, qword ptr [rip + hotprobe_agent_tls_sigflags@GOTTPOFF]",
            "mov qword ptr fs:[{off}], {v}",
            off = out(reg) _,
            v = in(reg) v,
            options(nostack, preserves_flags)
        )
    };
}

/// Whether the program wants `SIGTRAP` blocked in this thread.
fn wants_blocked() -> bool {
    flags() & WANTS_BLOCKED != 0
}

/// Notes whether the program wants `SIGTRAP` blocked in this thread.
fn set_wants_blocked(on: bool) {
    let f = flags();
    set_flags(if on {
        f | WANTS_BLOCKED
    } else {
        f & !WANTS_BLOCKED
    });
}

/// For the agent's `SIGTRAP` handler, a signal that is no probe's: when
/// the thread believes `SIGTRAP` blocked, it is held (the kernel would
/// keep it pending) and true is returned; it is raised again when the
/// program unblocks `SIGTRAP` ([`release_held`]). Async-signal-safe (a
/// thread-local flag with a constant initialiser).
pub(crate) fn hold_if_blocked() -> bool {
    let f = flags();
    let blocked = f & WANTS_BLOCKED != 0;
    if blocked {
        set_flags(f | HELD);
    }
    blocked
}

/// After a mask change that leaves `SIGTRAP` unblocked in the program's
/// view: a held `SIGTRAP` is raised again, for this thread (delivered
/// before the call returns, as the kernel delivers an unblocked pending
/// signal).
fn release_held(now_blocked: bool) {
    let f = flags();
    if now_blocked || f & HELD == 0 {
        return;
    }
    set_flags(f & !HELD);
    let pid = crate::threads::getpid();
    let tid = crate::threads::gettid();
    crate::orphan::syscall(
        libc::SYS_tgkill,
        [u64::from(pid), u64::from(tid), libc::SIGTRAP as u64, 0],
    );
}

/// Before the program's own `SIGTRAP` handler runs, chained from the
/// agent's (`orphan::chain`): the thread is shown `SIGTRAP` blocked while
/// it runs when the program's action asks for it (`trap_blocked`), as the
/// kernel would block it. Returns the flags to give back to
/// [`leave_program_handler`].
pub(crate) fn enter_program_handler(trap_blocked: bool) -> u64 {
    let f = flags();
    if trap_blocked {
        set_flags(f | WANTS_BLOCKED);
    }
    f
}

/// After the program's `SIGTRAP` handler returned: the thread's view of
/// its mask is the one it had before (as `sigreturn` puts the mask back),
/// and a `SIGTRAP` held meanwhile is raised again if that view unblocks
/// it.
pub(crate) fn leave_program_handler(before: u64) {
    let held = flags() & HELD;
    set_flags((before & WANTS_BLOCKED) | held | (before & HELD));
    release_held(before & WANTS_BLOCKED != 0);
}

type MaskFn =
    unsafe extern "C" fn(libc::c_int, *const libc::sigset_t, *mut libc::sigset_t) -> libc::c_int;

/// glibc's `pthread_sigmask` and `sigprocmask` (found once through
/// `dlsym(RTLD_NEXT)`: the agent exports both names).
static NEXT_PTHREAD_SIGMASK: AtomicUsize = AtomicUsize::new(0);
static NEXT_SIGPROCMASK: AtomicUsize = AtomicUsize::new(0);

/// The next definition of `name` after the agent.
fn next(cache: &AtomicUsize, name: &core::ffi::CStr) -> Option<MaskFn> {
    let f = crate::next_symbol::next_symbol(cache, name);
    // SAFETY: a non-null address dlsym gave for a function of this type.
    (f != 0).then(|| unsafe { core::mem::transmute::<usize, MaskFn>(f) })
}

/// Sets `how`/`set` through `real`, less `SIGTRAP` while the agent's
/// handler is installed; `old` gets the mask the program believes in.
///
/// # Safety
/// As `pthread_sigmask`: `set` and `old` are null or valid.
unsafe fn masked(
    real: MaskFn,
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    if !crate::orphan::installed() {
        // SAFETY: the caller's arguments.
        return unsafe { real(how, set, old) };
    }
    let before = wants_blocked();
    let mut after = before;
    let mut copy: libc::sigset_t;
    let mut set = set;
    if !set.is_null() {
        // SAFETY: `set` is valid (caller); copied, as `old` may be the
        // same memory.
        copy = unsafe { *set };
        // SAFETY: a valid set.
        let trap = unsafe { libc::sigismember(&copy, libc::SIGTRAP) } == 1;
        after = wants_after(before, how, trap);
        if trap && how != libc::SIG_UNBLOCK {
            // SAFETY: a valid set.
            unsafe { libc::sigdelset(&mut copy, libc::SIGTRAP) };
        }
        set = &copy;
    }
    // SAFETY: the caller's `how` and `old`, a valid `set`.
    let rc = unsafe { real(how, set, old) };
    if rc == 0 {
        set_wants_blocked(after);
        if before && !old.is_null() {
            // SAFETY: `old` is valid (caller) and was just written.
            unsafe { libc::sigaddset(old, libc::SIGTRAP) };
        }
        release_held(after);
    }
    rc
}

/// Whether the program wants `SIGTRAP` blocked after a mask change `how`
/// whose set holds it (`trap`) or not, having wanted it (`before`).
fn wants_after(before: bool, how: libc::c_int, trap: bool) -> bool {
    match how {
        libc::SIG_BLOCK => before || trap,
        libc::SIG_UNBLOCK => before && !trap,
        libc::SIG_SETMASK => trap,
        _ => before,
    }
}

/// `SIGTRAP`'s bit in the kernel's signal set.
const TRAP_BIT: u64 = 1 << (libc::SIGTRAP - 1);

/// `rt_sigprocmask(how, set, old, size)` on the kernel's 8-byte sets, made
/// by `call` (libc's `syscall`) with `set` less `SIGTRAP` while the
/// agent's handler is installed; `old` gets the mask the program believes
/// in (see the module docs).
///
/// # Safety
/// `set` and `old` are null or valid for `size` bytes (the kernel checks
/// `size`; the set's first word is read and written only when it is 8).
pub(crate) unsafe fn kernel_mask(
    how: libc::c_int,
    set: *const u64,
    old: *mut u64,
    size: usize,
    call: impl FnOnce(*const u64) -> libc::c_long,
) -> libc::c_long {
    if !crate::orphan::installed() || size != 8 {
        return call(set);
    }
    let before = wants_blocked();
    let mut after = before;
    let mut copy;
    let mut arg = set;
    if !set.is_null() {
        // SAFETY: `set` is valid for 8 bytes (caller); copied, as `old`
        // may be the same memory.
        copy = unsafe { set.read_unaligned() };
        let trap = copy & TRAP_BIT != 0;
        after = wants_after(before, how, trap);
        if trap && how != libc::SIG_UNBLOCK {
            copy &= !TRAP_BIT;
        }
        arg = &copy;
    }
    let rc = call(arg);
    if rc == 0 {
        set_wants_blocked(after);
        if before && !old.is_null() {
            // SAFETY: `old` is valid for 8 bytes (caller), just written.
            unsafe { old.write_unaligned(old.read_unaligned() | TRAP_BIT) };
        }
        release_held(after);
    }
    rc
}

/// For an `rt_sigaction` system call on a signal other than `SIGTRAP`
/// while the agent's handler is installed: takes `SIGTRAP` out of the
/// kernel mask `mask` (remembered, as [`handler_mask`] does); returns
/// whether the signal's previous handler had asked for it.
pub(crate) fn kernel_handler_mask(sig: libc::c_int, mask: Option<&mut u64>) -> bool {
    let bit = 1u64.checked_shl(sig.wrapping_sub(1) as u32).unwrap_or(0);
    let had = TRAP_IN_HANDLER_MASK.load(Relaxed) & bit != 0;
    if let Some(m) = mask {
        if *m & TRAP_BIT != 0 {
            *m &= !TRAP_BIT;
            TRAP_IN_HANDLER_MASK.fetch_or(bit, Relaxed);
        } else {
            TRAP_IN_HANDLER_MASK.fetch_and(!bit, Relaxed);
        }
    }
    had
}

/// `pthread_sigmask`, interposed (see the module docs).
///
/// # Safety
/// As glibc's `pthread_sigmask`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pthread_sigmask(
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    match next(&NEXT_PTHREAD_SIGMASK, c"pthread_sigmask") {
        // SAFETY: the caller's arguments.
        Some(real) => unsafe { masked(real, how, set, old) },
        None => libc::ENOSYS,
    }
}

/// `sigprocmask`, interposed (see the module docs).
///
/// # Safety
/// As glibc's `sigprocmask`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sigprocmask(
    how: libc::c_int,
    set: *const libc::sigset_t,
    old: *mut libc::sigset_t,
) -> libc::c_int {
    match next(&NEXT_SIGPROCMASK, c"sigprocmask") {
        // SAFETY: the caller's arguments.
        Some(real) => unsafe { masked(real, how, set, old) },
        None => {
            // SAFETY: errno is thread-local and always valid.
            unsafe { *libc::__errno_location() = libc::ENOSYS };
            -1
        }
    }
}

/// Per signal: the program's handler asked for `SIGTRAP` in its `sa_mask`
/// (bit `sig - 1`), which was taken out.
static TRAP_IN_HANDLER_MASK: core::sync::atomic::AtomicU64 = core::sync::atomic::AtomicU64::new(0);

/// For [`crate::orphan::sigaction`] on a signal other than `SIGTRAP`,
/// while the agent's handler is installed: `act` less `SIGTRAP` in its
/// `sa_mask` (remembered), and a function that puts `SIGTRAP` back into
/// the old action's mask where the program had asked for it.
///
/// # Safety
/// `act` is null or valid.
pub(crate) unsafe fn handler_mask(
    sig: libc::c_int,
    act: *const libc::sigaction,
) -> (Option<libc::sigaction>, bool) {
    let bit = 1u64.checked_shl(sig.wrapping_sub(1) as u32).unwrap_or(0);
    let had = TRAP_IN_HANDLER_MASK.load(Relaxed) & bit != 0;
    if act.is_null() {
        return (None, had);
    }
    // SAFETY: `act` is valid (caller).
    let mut a = unsafe { *act };
    // SAFETY: a valid set.
    if unsafe { libc::sigismember(&a.sa_mask, libc::SIGTRAP) } == 1 {
        // SAFETY: a valid set.
        unsafe { libc::sigdelset(&mut a.sa_mask, libc::SIGTRAP) };
        TRAP_IN_HANDLER_MASK.fetch_or(bit, Relaxed);
    } else {
        TRAP_IN_HANDLER_MASK.fetch_and(!bit, Relaxed);
    }
    (Some(a), had)
}

/// glibc's `sigpending` (see [`next`]).
static NEXT_SIGPENDING: AtomicUsize = AtomicUsize::new(0);

/// `sigpending`, interposed: a held `SIGTRAP` ([`hold_if_blocked`]) is
/// shown pending.
///
/// # Safety
/// As glibc's `sigpending`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sigpending(set: *mut libc::sigset_t) -> libc::c_int {
    type PendingFn = unsafe extern "C" fn(*mut libc::sigset_t) -> libc::c_int;
    let f = crate::next_symbol::next_symbol(&NEXT_SIGPENDING, c"sigpending");
    if f == 0 {
        // SAFETY: errno is thread-local and always valid.
        unsafe { *libc::__errno_location() = libc::ENOSYS };
        return -1;
    }
    // SAFETY: dlsym's address of glibc's sigpending.
    let real = unsafe { core::mem::transmute::<usize, PendingFn>(f) };
    // SAFETY: the caller's argument.
    let rc = unsafe { real(set) };
    if rc == 0 && !set.is_null() && flags() & HELD != 0 {
        // SAFETY: `set` is valid (caller) and was just written.
        unsafe { libc::sigaddset(set, libc::SIGTRAP) };
    }
    rc
}

type StartFn = extern "C" fn(*mut libc::c_void) -> *mut libc::c_void;
type CreateFn = unsafe extern "C" fn(
    *mut libc::pthread_t,
    *const libc::pthread_attr_t,
    StartFn,
    *mut libc::c_void,
) -> libc::c_int;

/// glibc's `pthread_create` (see [`next`]).
static NEXT_PTHREAD_CREATE: AtomicUsize = AtomicUsize::new(0);

/// What a thread created while its creator blocked `SIGTRAP` starts with.
struct Start {
    routine: StartFn,
    arg: *mut libc::c_void,
}

/// The new thread's start: it inherits its creator's view of the mask
/// (`SIGTRAP` shown blocked), then runs the program's routine.
extern "C" fn start_blocked(p: *mut libc::c_void) -> *mut libc::c_void {
    // SAFETY: `p` is the Box `pthread_create` below leaked for this thread.
    let s = unsafe { Box::from_raw(p as *mut Start) };
    set_wants_blocked(true);
    (s.routine)(s.arg)
}

/// `pthread_create`, interposed: a thread the program creates while it
/// blocks `SIGTRAP` (as a thread inherits its creator's mask) is shown
/// `SIGTRAP` blocked too (see the module docs). Otherwise glibc's, as is.
///
/// # Safety
/// As glibc's `pthread_create`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    routine: StartFn,
    arg: *mut libc::c_void,
) -> libc::c_int {
    let f = crate::next_symbol::next_symbol(&NEXT_PTHREAD_CREATE, c"pthread_create");
    if f == 0 {
        return libc::ENOSYS;
    }
    // SAFETY: dlsym's address of glibc's pthread_create.
    let real = unsafe { core::mem::transmute::<usize, CreateFn>(f) };
    if !crate::orphan::installed() || !wants_blocked() {
        // SAFETY: the caller's arguments.
        return unsafe { real(thread, attr, routine, arg) };
    }
    let start = Box::into_raw(Box::new(Start { routine, arg }));
    // SAFETY: the caller's `thread` and `attr`; `start` lives until the
    // new thread takes it back (or is freed here if none starts).
    let rc = unsafe { real(thread, attr, start_blocked, start.cast()) };
    if rc != 0 {
        // SAFETY: no thread took it.
        drop(unsafe { Box::from_raw(start) });
    }
    rc
}
