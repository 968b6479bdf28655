//! Surviving a tracer that died with its `int3`s in the code.
//!
//! A tracer killed with SIGKILL restores nothing: its trap probes, its
//! return trampoline and the loader-rendezvous breakpoint stay in the
//! process as `int3`s, and the next thread to run one gets a `SIGTRAP`
//! that, with the default disposition, kills the process. The tracer
//! publishes every `int3` it writes (address → original byte), its
//! out-of-line memory and its live return instances in the shared memory's
//! trap table (`hotprobe_abi::TrapSlot`); the agent installs a `SIGTRAP`
//! handler (at attach, chaining to the handler the program had) which,
//! when the tracer is gone, undoes them:
//!
//! * an `int3` of the table at `rip - 1`: the original byte goes back
//!   (written through `/proc/self/mem`, which ignores page protections),
//!   `rip` is rewound and the original instruction runs.
//! * the return trampoline's `int3`: a hooked function returned; the real
//!   return address is the thread's published return instance for the
//!   slot the `ret` popped (`rsp - 8`). Without one, the return cannot be
//!   completed: the program gets the signal.
//! * a single-step trap (a thread the tracer was stepping when it died:
//!   a trap probe's instruction, or a remote system call of the fast
//!   path's) outside the tracer's out-of-line memory, in a program with no
//!   `SIGTRAP` handler of its own: the trap flag is cleared and the thread
//!   runs on. Inside it, the continuation is the tracer's
//!   secret: the program gets the signal.
//!
//! * a *guard* `int3` (`hotprobe_abi::TRAP_GUARD`): a thread the tracer
//!   had stopped at one of its breakpoints when it died. The kernel drops
//!   the `SIGTRAP` of that stop and resumes the thread one byte past the
//!   `int3`, inside the original instruction; the tracer puts a guard
//!   `int3` there (instructions of 2 bytes or more, and its return
//!   trampoline), which brings the thread here: both bytes go back and
//!   the thread restarts at the breakpoint's address (or returns, at the
//!   trampoline).
//!
//! Not covered, because no signal comes: a thread stopped at the
//! breakpoint of a 1-byte instruction (no room for a guard) when the
//! tracer dies runs on past it, skipping the instruction (unless the
//! tracer had moved it already): the window is the few microseconds
//! between the hit and the tracer's reaction.
//!
//! The tracer's other code (the fast path's sites) and the `int3`s of the
//! table no thread has hit yet are put back by `undo`, which this handler
//! calls at the first such hit, and which also takes the hang-up pipe's
//! `SIGTRAP` and the `int3`s of its own restores.
//!
//! Anything else (a `SIGTRAP` of the program's own, or any while the
//! tracer is alive and attached) goes to the program's handler, or to the
//! default action. The tracer is gone when its heartbeat is stale or, as
//! the heartbeat is still fresh right after a SIGKILL, when
//! `/proc/self/status` says no tracer is attached. Only raw system calls
//! and atomics: async-signal-safe.

use core::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use core::sync::atomic::{AtomicBool, AtomicU64};

use hotprobe_abi::{Shm, TRAP_GUARD, TRAP_RETURN};

use crate::progtrap::{self, KernelAction};

const INT3: u8 = 0xcc;
const SI_KERNEL: i32 = 0x80;
const TRAP_TRACE: i32 = 2;
/// The `si_code` of a single-step over a `syscall` instruction (the
/// kernel reports it at the system call's exit).
const TRAP_BRKPT: i32 = 1;
const EFLAGS_TF: i64 = 0x100;

/// glibc's restorer (`__restore_rt`), as the agent's own `sigaction`
/// got it: the one an interposed `sigaction` of the program's gets too.
static GLIBC_RESTORER: AtomicU64 = AtomicU64::new(0);

/// Installs the `SIGTRAP` handler unless it is installed (at every attach:
/// the program may have replaced it since). The program's action, as the
/// kernel held it, is kept in [`crate::progtrap`].
pub(crate) fn install() {
    let mut cur = KernelAction::default();
    if progtrap::kernel(None, Some(&mut cur)) != 0 {
        return;
    }
    if cur.handler == on_sigtrap as *const () as usize as u64 {
        return;
    }
    // SAFETY: zeroed sigaction structures are valid; sigaction reads them.
    unsafe {
        let mut sa: libc::sigaction = core::mem::zeroed();
        sa.sa_sigaction = on_sigtrap as *const () as usize;
        // SA_NODEFER: SIGTRAP stays unblocked while the handler runs, so a
        // probed function called from the chained handler, or from a
        // signal handler that interrupts this one, traps again instead of
        // having the kernel kill the process (issue 22).
        sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESTART | libc::SA_NODEFER;
        libc::sigemptyset(&mut sa.sa_mask);
        // Kept before the handler can run (it chains to it).
        progtrap::set(cur);
        if __sigaction(libc::SIGTRAP, &sa, core::ptr::null_mut()) != 0 {
            return;
        }
    }
    let mut mine = KernelAction::default();
    if progtrap::kernel(None, Some(&mut mine)) == 0 {
        GLIBC_RESTORER.store(mine.restorer, Relaxed);
    }
    progtrap::set_agent_handler(on_sigtrap as *const () as usize as u64);
    progtrap::set_held(true);
    INSTALLED.store(true, Release);
    // An injected agent's program reads its action through the agent too.
    crate::gotbind::bind();
}

/// Gives `SIGTRAP` back the program's action exactly as the kernel held
/// it (handler, flags, restorer, mask; see [`crate::progtrap`]), at
/// release and once a dead tracer's code is undone, if ours is still the
/// disposition (a program that replaced it by the system call keeps its
/// own).
pub(crate) fn uninstall() {
    if !INSTALLED.swap(false, AcqRel) {
        return;
    }
    crate::gotbind::unbind();
    progtrap::set_held(false);
    let mut cur = KernelAction::default();
    if progtrap::kernel(None, Some(&mut cur)) != 0
        || cur.handler != on_sigtrap as *const () as usize as u64
    {
        return;
    }
    progtrap::kernel(Some(&progtrap::get()), None);
}

/// Our handler is the process's `SIGTRAP` disposition: the program's own
/// `sigaction(SIGTRAP)`/`signal(SIGTRAP)` calls change the chained
/// handler instead (see [`sigaction`]).
static INSTALLED: AtomicBool = AtomicBool::new(false);

/// Whether the agent's `SIGTRAP` handler is installed (see
/// [`crate::sigmask`]).
#[cfg_attr(test, allow(dead_code))]
pub(crate) fn installed() -> bool {
    INSTALLED.load(Acquire)
}

extern "C" {
    /// glibc's own `sigaction` (exported as `__sigaction`): the agent
    /// exports a `sigaction` of its own, so it calls this one.
    fn __sigaction(
        sig: libc::c_int,
        act: *const libc::sigaction,
        old: *mut libc::sigaction,
    ) -> libc::c_int;
    /// glibc's `signal` (its other name, which the agent does not export).
    fn bsd_signal(sig: libc::c_int, h: libc::sighandler_t) -> libc::sighandler_t;
}

/// `sigaction`, interposed (the agent is preloaded ahead of libc) so that a
/// program installing its own `SIGTRAP` handler after the agent's does not
/// take the in-process traps' `int3`s away from the agent: while the
/// agent's handler is installed, the program's action (handler, flags,
/// mask) is kept as the chained one (see [`crate::progtrap`]: called for
/// every `SIGTRAP` that is not the agent's, as the kernel would) and the
/// previous one is returned as the old action, as glibc would have read
/// it. Every other signal goes to glibc with
/// `SIGTRAP` taken out of its handler's `sa_mask` while the agent's handler
/// is installed (see [`crate::sigmask`]); `SIGTRAP` before the agent
/// attached goes to glibc unchanged. Not
/// covered: a program that calls the `rt_sigaction` system call itself.
/// An agent injected into a running process is not reached (the
/// program's calls are bound to glibc already): there the tracer serves
/// the program's `rt_sigaction(SIGTRAP)` from the same kept action at
/// libc's system-call sites.
///
/// # Safety
/// As glibc's `sigaction`: `act` and `old` are null or valid.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sigaction(
    sig: libc::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    if !INSTALLED.load(Acquire) {
        // SAFETY: the caller's arguments, as glibc takes them.
        return unsafe { __sigaction(sig, act, old) };
    }
    if sig != libc::SIGTRAP {
        // SAFETY: `act` is null or valid (caller).
        let (act, had) = unsafe { crate::sigmask::handler_mask(sig, act) };
        let act = act.as_ref().map_or(core::ptr::null(), |a| a as *const _);
        // SAFETY: the caller's `old`, a valid or null `act`.
        let rc = unsafe { __sigaction(sig, act, old) };
        if rc == 0 && had && !old.is_null() {
            // SAFETY: `old` is valid (caller) and was just written.
            unsafe { libc::sigaddset(&mut (*old).sa_mask, libc::SIGTRAP) };
        }
        return rc;
    }
    // SAFETY: the caller's arguments.
    unsafe { program_sigtrap_action(act, old) }
}

/// `sigaction(SIGTRAP, act, old)` on the program's kept action (see
/// [`crate::progtrap`]), as glibc would have read and set the kernel's.
///
/// # Safety
/// `act` and `old` are null or valid.
pub(crate) unsafe fn program_sigtrap_action(
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    let prev = progtrap::get();
    if !act.is_null() {
        // SAFETY: `act` is valid (caller).
        let a = unsafe { &*act };
        progtrap::set(progtrap::from_libc(a, GLIBC_RESTORER.load(Relaxed)));
    }
    if !old.is_null() {
        // SAFETY: `old` is valid (caller).
        unsafe { old.write(progtrap::to_libc(&prev)) };
    }
    0
}

/// glibc's `sigaction`.
///
/// # Safety
/// As glibc's `sigaction`.
pub(crate) unsafe fn glibc_sigaction(
    sig: libc::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    // SAFETY: the caller's arguments.
    unsafe { __sigaction(sig, act, old) }
}

/// glibc's `signal`.
///
/// # Safety
/// As glibc's `signal`.
pub(crate) unsafe fn glibc_signal(sig: libc::c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the caller's arguments.
    unsafe { bsd_signal(sig, h) }
}

/// `signal`, interposed for `SIGTRAP` as [`sigaction`] is (glibc's
/// `signal` calls its internal `sigaction`, which interposition does not
/// reach).
///
/// # Safety
/// As glibc's `signal`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn signal(sig: libc::c_int, h: libc::sighandler_t) -> libc::sighandler_t {
    if sig != libc::SIGTRAP || !INSTALLED.load(Acquire) {
        // SAFETY: the caller's arguments, as glibc takes them.
        return unsafe { bsd_signal(sig, h) };
    }
    program_sigtrap_signal(h)
}

/// `signal(SIGTRAP, h)` on the program's kept action (see
/// [`crate::progtrap`]), as glibc's `signal` sets it: `SA_RESTART`, the
/// signal itself in the mask.
pub(crate) fn program_sigtrap_signal(h: libc::sighandler_t) -> libc::sighandler_t {
    let prev = progtrap::get();
    progtrap::set(KernelAction {
        handler: h as u64,
        flags: libc::SA_RESTART as u64 | progtrap::SA_RESTORER,
        restorer: GLIBC_RESTORER.load(Relaxed),
        mask: 1 << (libc::SIGTRAP - 1),
    });
    prev.handler as libc::sighandler_t
}

extern "C" fn on_sigtrap(sig: libc::c_int, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    // SAFETY: the kernel passes valid siginfo and ucontext pointers to an
    // SA_SIGINFO handler.
    let ok = !info.is_null()
        && !uc.is_null()
        && unsafe {
            let (info, uc) = (&*info, &mut *(uc as *mut libc::ucontext_t));
            crate::undo::on_signal(info) || crate::inproc::handle(info, uc) || handle(info, uc)
        };
    if ok || crate::sigmask::hold_if_blocked() {
        return;
    }
    chain(sig, info, uc);
}

/// Hands a `SIGTRAP` that is not ours to the program's handler as the
/// kernel would have delivered it (see [`crate::progtrap`]), or to the
/// default action (which ends the process as it would without the agent).
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, uc: *mut libc::c_void) {
    let a = progtrap::get();
    if a.handler == libc::SIG_IGN as u64 {
        return;
    }
    if a.handler == libc::SIG_DFL as u64 {
        // Back to the program's action (the default), and the signal
        // again: it is blocked while this handler runs and delivered as
        // it returns.
        progtrap::kernel(Some(&a), None);
        let pid = syscall(libc::SYS_getpid, [0; 4]);
        let tid = syscall(libc::SYS_gettid, [0; 4]);
        syscall(libc::SYS_tgkill, [pid, tid, sig as u64, 0]);
        return;
    }
    if a.flags & libc::SA_RESETHAND as u32 as u64 != 0 {
        // Delivered once, then the default (the kernel keeps the flags).
        progtrap::set(KernelAction {
            handler: libc::SIG_DFL as u64,
            ..a
        });
    }
    // The handler's mask, as the kernel adds it for the handler's run;
    // SIGTRAP itself (unless SA_NODEFER) only as the program sees it: an
    // int3 in a thread blocking SIGTRAP would reset the agent's handler.
    let trap_bit = 1u64 << (libc::SIGTRAP - 1);
    let trap_blocked = a.mask & trap_bit != 0 || a.flags & libc::SA_NODEFER as u64 == 0;
    let block = a.mask & !trap_bit;
    let mut saved = 0u64;
    syscall(
        libc::SYS_rt_sigprocmask,
        [
            libc::SIG_BLOCK as u64,
            &block as *const u64 as u64,
            &mut saved as *mut u64 as u64,
            8,
        ],
    );
    let view = crate::sigmask::enter_program_handler(trap_blocked);
    if a.flags & libc::SA_SIGINFO as u64 != 0 {
        // SAFETY: the program installed this SA_SIGINFO handler.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { core::mem::transmute(a.handler as usize) };
        f(sig, info, uc);
    } else {
        // SAFETY: the program installed this plain handler.
        let f: extern "C" fn(libc::c_int) = unsafe { core::mem::transmute(a.handler as usize) };
        f(sig);
    }
    syscall(
        libc::SYS_rt_sigprocmask,
        [libc::SIG_SETMASK as u64, &saved as *const u64 as u64, 0, 8],
    );
    crate::sigmask::leave_program_handler(view);
}

/// Whether the `SIGTRAP` was the tracer's and has been dealt with.
fn handle(info: &libc::siginfo_t, uc: &mut libc::ucontext_t) -> bool {
    let Some(shm) = crate::shm() else {
        return false;
    };
    let code = info.si_code;
    let gregs = &mut uc.uc_mcontext.gregs;
    let rip = gregs[libc::REG_RIP as usize] as u64;
    let rsp = gregs[libc::REG_RSP as usize] as u64;
    match code {
        SI_KERNEL => {}
        TRAP_TRACE | TRAP_BRKPT => {
            // A single-step trap: the program's own, if it has a handler.
            // Without one, and with the tracer gone, a step the tracer
            // left: its trap mechanism's, or a remote system call's (the
            // fast path allocates trampoline memory that way, before any
            // int3 is published; a step over a `syscall` reports
            // TRAP_BRKPT) — the kernel delivers the SIGTRAP of the stop a
            // dead tracer never consumed. The tracer put the thread's
            // registers back right after the step: it runs on from where
            // it was.
            if progtrap::get().handler > libc::SIG_IGN as u64
                || shm.in_trap_region(rip)
                || !tracer_gone(shm)
            {
                return false;
            }
            crate::undo::undo_all(shm);
            gregs[libc::REG_EFL as usize] &= !EFLAGS_TF;
            return true;
        }
        _ => return false,
    }
    let at = rip.wrapping_sub(1);
    let Some((orig, flags)) = shm.lookup_trap(at) else {
        // Not the trap mechanism's: perhaps a fast-path site being put
        // back (see `undo`), or a signal-state site of a dead tracer
        // (see `sigsites`).
        if crate::undo::resume_at_site(shm, at, gregs) {
            return true;
        }
        // The first byte of a site a tracer killed mid-write left (it
        // writes an `int3` there first), reached before the undo began.
        if crate::undo::is_site_at(shm, at) && tracer_gone(shm) {
            crate::undo::undo_all(shm);
            return crate::undo::resume_at_site(shm, at, gregs);
        }
        // Only a site's int3 (the program's own int3s, in a process run
        // untraced, are the program's: no undo for them).
        if !crate::sigsites::is_site_at(at) || !tracer_gone(shm) {
            return false;
        }
        crate::undo::undo_all(shm);
        return crate::sigsites::resume_at_site(at, gregs);
    };
    if !tracer_gone(shm) {
        return false;
    }
    // The rest of the tracer's code goes too, at once (see `undo`).
    crate::undo::undo_all(shm);
    let (site, found) = if flags & TRAP_GUARD != 0 {
        // A thread the tracer had stopped at the int3 before this one
        // when it died, resumed here by the kernel without its signal.
        if read_byte(at) == Some(INT3) && !write_byte(at, orig) {
            return false;
        }
        let site = at.wrapping_sub(1);
        (site, shm.lookup_trap(site))
    } else {
        (at, Some((orig, flags)))
    };
    match found {
        Some((_, f)) if f & TRAP_RETURN != 0 => {
            // The `ret` popped the swapped address from rsp - 8.
            let slot = rsp.wrapping_sub(8);
            let tid = syscall(libc::SYS_gettid, [0; 4]) as u32;
            let Some(real) = shm.find_return(tid, slot) else {
                return false;
            };
            shm.remove_return(tid, slot);
            gregs[libc::REG_RIP as usize] = real as i64;
            true
        }
        Some((orig, _)) => {
            // A guard one byte in goes first where the original byte and
            // the guard's `int3` would make another instruction (`0f cc`:
            // `bswap esp`) rather than a trap: a thread would run it.
            if !is_prefix(orig) {
                if let Some((g, f)) = shm.lookup_trap(site.wrapping_add(1)) {
                    let gsite = site.wrapping_add(1);
                    if f & TRAP_GUARD != 0
                        && read_byte(gsite) == Some(INT3)
                        && !write_byte(gsite, g)
                    {
                        return false;
                    }
                }
            }
            // Another thread may have put the byte back already.
            if read_byte(site) == Some(INT3) && !write_byte(site, orig) {
                return false;
            }
            gregs[libc::REG_RIP as usize] = site as i64;
            true
        }
        // The tracer had taken the int3 out: the original is back.
        None => {
            gregs[libc::REG_RIP as usize] = site as i64;
            true
        }
    }
}

/// Whether `b` is an x86 prefix (legacy or REX): followed by a guard's
/// `int3`, it still traps there.
fn is_prefix(b: u8) -> bool {
    matches!(
        b,
        0x26 | 0x2e | 0x36 | 0x3e | 0x40..=0x4f | 0x64 | 0x65 | 0x66 | 0x67 | 0xf0 | 0xf2 | 0xf3
    )
}

/// The tracer's heartbeat is stale, or no tracer is attached.
fn tracer_gone(shm: &Shm) -> bool {
    let h = shm.header();
    let timeout = h.heartbeat_timeout_tsc.load(Relaxed);
    // The thread's own clock (`rdtsc` may fault, see `clock`).
    let now = crate::clock::now_tsc(shm, crate::clock::current_mode());
    if let (true, Some(now)) = (timeout != 0, now) {
        let age = now.wrapping_sub(h.heartbeat_tsc.load(Relaxed)) as i64;
        if age > timeout as i64 {
            return true;
        }
    }
    tracer_pid() == Some(0)
}

/// `TracerPid` of `/proc/self/status`, read with a small buffer.
fn tracer_pid() -> Option<u64> {
    let fd = open(c"/proc/self/status", libc::O_RDONLY)?;
    const KEY: &[u8] = b"\nTracerPid:";
    let mut buf = [0u8; 128];
    let mut matched = 0;
    let mut value: Option<u64> = None;
    let mut in_value = false;
    'read: loop {
        let n = syscall(
            libc::SYS_read,
            [fd, buf.as_mut_ptr() as u64, buf.len() as u64, 0],
        ) as i64;
        if n <= 0 {
            break;
        }
        for &b in buf.iter().take(n as usize) {
            if in_value {
                match b {
                    b' ' | b'\t' if value.is_none() => {}
                    b'0'..=b'9' => {
                        value = Some(value.unwrap_or(0) * 10 + u64::from(b - b'0'));
                    }
                    _ => break 'read,
                }
            } else if KEY.get(matched) == Some(&b) {
                matched += 1;
                if matched == KEY.len() {
                    in_value = true;
                }
            } else {
                matched = usize::from(b == b'\n');
            }
        }
    }
    syscall(libc::SYS_close, [fd, 0, 0, 0]);
    value
}

fn open(path: &core::ffi::CStr, flags: i32) -> Option<u64> {
    let fd = syscall(
        libc::SYS_open,
        [path.as_ptr() as u64, (flags | libc::O_CLOEXEC) as u64, 0, 0],
    ) as i64;
    (fd >= 0).then_some(fd as u64)
}

/// The byte at `addr` of this process, or None when it is not mapped.
fn read_byte(addr: u64) -> Option<u8> {
    let fd = crate::undo::open_self_mem(libc::O_RDONLY)?;
    let mut b = 0u8;
    let n = syscall(libc::SYS_pread64, [fd, &mut b as *mut u8 as u64, 1, addr]) as i64;
    syscall(libc::SYS_close, [fd, 0, 0, 0]);
    (n == 1).then_some(b)
}

/// Writes `b` at `addr` through `/proc/self/mem` (whatever the page's
/// protection).
fn write_byte(addr: u64, b: u8) -> bool {
    let Some(fd) = crate::undo::open_self_mem(libc::O_RDWR) else {
        return false;
    };
    let n = syscall(libc::SYS_pwrite64, [fd, &b as *const u8 as u64, 1, addr]) as i64;
    syscall(libc::SYS_close, [fd, 0, 0, 0]);
    n == 1
}

/// A system call with six arguments (`mmap`), by the `syscall`
/// instruction: never through libc, whose functions may be probed.
pub(crate) fn syscall6(nr: libc::c_long, a: [u64; 6]) -> u64 {
    let r: u64;
    // SAFETY: the calls made with it (mmap of fresh anonymous memory,
    // `process_vm_readv`/`writev` of one word of the process itself, and
    // the program's own `prctl` with its arguments: see `clock::prctl`)
    // take the arguments given, touch no memory of ours but what they
    // point at, and clobber rcx and r11.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") nr as u64 => r,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            in("r8") a[4],
            in("r9") a[5],
            out("rcx") _,
            out("r11") _,
            options(nostack)
        )
    };
    r
}

/// A system call with up to four arguments, made here rather than through
/// libc (async-signal-safe, and no code of the program's libraries runs).
pub(crate) fn syscall(nr: libc::c_long, a: [u64; 4]) -> u64 {
    let r: u64;
    // SAFETY: the calls made here and by `env`, the constructor, `clock`,
    // `inproc` and `threads` (open, read, readlink, pread64, pwrite64,
    // close, getpid, gettid, tgkill, rt_sigaction, rt_sigprocmask, prctl
    // PR_GET_TSC and PR_GET/SET_DUMPABLE, clock_gettime, futex, sched_yield, madvise, and
    // `release`'s munmap of the agent's own mappings once no thread can
    // use them) take the
    // arguments given, read or write only the buffers passed (or the
    // futex word), and clobber rcx and r11.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") nr as u64 => r,
            in("rdi") a[0],
            in("rsi") a[1],
            in("rdx") a[2],
            in("r10") a[3],
            out("rcx") _,
            out("r11") _,
            options(nostack)
        )
    };
    r
}
