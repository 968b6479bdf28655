//! Time for events, heartbeats and handler waits — without libc, and
//! without `rdtsc` where the thread may not run it.
//!
//! Each registered thread has a clock mode ([`ThreadEntry::clock`]):
//!
//! * [`CLOCK_TSC`]: `rdtsc` (the usual case).
//! * [`CLOCK_SYSCALL`]: the thread runs under `prctl(PR_SET_TSC,
//!   PR_TSC_SIGSEGV)`, where `rdtsc` (and the vDSO's `clock_gettime`, which
//!   reads the TSC) raises `SIGSEGV`: time is the raw `clock_gettime`
//!   system call, converted into TSC units with the tracer's calibration
//!   ([`hotprobe_abi::Header::tsc_hz`], `calib_tsc`/`calib_ns`).
//! * [`CLOCK_NONE`]: the thread entered seccomp strict mode, where any
//!   system call but `read`, `write`, `_exit` and `sigreturn` kills it:
//!   no system call and no `rdtsc`. It counts; its events are refused
//!   (counted losses), its handler calls missed.
//!
//! The mode is read with `prctl(PR_GET_TSC)` when a thread registers (a
//! new thread inherits its creator's TSC setting), and kept up to date by
//! the agent's own `prctl` (the agent is preloaded ahead of libc, as for
//! `sigaction`): `PR_SET_TSC` sets it after the call; `PR_SET_SECCOMP`
//! with `SECCOMP_MODE_STRICT` registers the thread first (registering makes
//! system calls) and sets [`CLOCK_NONE`] before the call. A thread whose
//! mode is not [`CLOCK_TSC`] has its stubs' view keyed off (its stubs,
//! which read the TSC, send every hit to the generic path, which honours
//! the mode). Not seen: the raw `prctl` or `seccomp` system call.

use core::sync::atomic::AtomicU32;
use core::sync::atomic::Ordering::Relaxed;

use hotprobe_abi::{rdtsc, Shm};

use crate::hit::{find_thread, thread_pointer, ThreadEntry};

/// [`ThreadEntry::clock`]: `rdtsc` is allowed.
pub(crate) const CLOCK_TSC: u32 = 0;
/// [`ThreadEntry::clock`]: `rdtsc` faults: the `clock_gettime` system call.
pub(crate) const CLOCK_SYSCALL: u32 = 1;
/// [`ThreadEntry::clock`]: seccomp strict: no system call, no `rdtsc`.
pub(crate) const CLOCK_NONE: u32 = 2;

/// Some thread of the process disabled its TSC (through the agent's
/// `prctl`): threads the agent does not know ask the kernel.
static ANY_NO_TSC: AtomicU32 = AtomicU32::new(0);
/// Some thread of the process entered seccomp strict mode (through the
/// agent's `prctl`): threads the agent does not know make no system call.
static ANY_STRICT: AtomicU32 = AtomicU32::new(0);
/// Some thread of the process installed a seccomp filter (through the
/// agent's `prctl` or `seccomp`): a filter may kill on a system call the
/// program never makes, so typed captures stop reading memory
/// (`process_vm_readv`) and record it as unreadable.
static ANY_FILTER: AtomicU32 = AtomicU32::new(0);

/// Whether a seccomp filter may be installed (see [`ANY_FILTER`]).
#[inline(always)]
pub(crate) fn filtered() -> bool {
    ANY_FILTER.load(Relaxed) != 0
}

const PR_GET_TSC: u64 = 25;
const PR_SET_TSC: i32 = 26;
const PR_TSC_SIGSEGV: u64 = 2;
const PR_SET_SECCOMP: i32 = 22;
const SECCOMP_MODE_STRICT: u64 = 1;
const SECCOMP_MODE_FILTER: u64 = 2;
/// `seccomp(2)`'s operations.
const SECCOMP_SET_MODE_STRICT: u64 = 0;
const SECCOMP_SET_MODE_FILTER: u64 = 1;

/// The calling thread's TSC setting, from the kernel (`prctl(PR_GET_TSC)`,
/// a raw system call): [`CLOCK_SYSCALL`] when `rdtsc` faults.
pub(crate) fn kernel_mode() -> u32 {
    let mut v: i32 = 0;
    let r = crate::orphan::syscall(
        libc::SYS_prctl,
        [PR_GET_TSC, &mut v as *mut i32 as u64, 0, 0],
    );
    if r == 0 && v as u64 == PR_TSC_SIGSEGV {
        CLOCK_SYSCALL
    } else {
        CLOCK_TSC
    }
}

/// The calling thread's mode: its entry's, else a guess that is safe (no
/// system call when a thread of the process went strict; the kernel's
/// answer when one disabled its TSC; `rdtsc` otherwise).
pub(crate) fn current_mode() -> u32 {
    if let Some(t) = find_thread(thread_pointer()) {
        return t.clock.load(Relaxed);
    }
    if ANY_STRICT.load(Relaxed) != 0 {
        CLOCK_NONE
    } else if ANY_NO_TSC.load(Relaxed) != 0 {
        kernel_mode()
    } else {
        CLOCK_TSC
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds by the system call (not the vDSO,
/// which reads the TSC; not libc's, which may be probed).
///
/// Reached from the fast path (a thread under `PR_TSC_SIGSEGV`), which
/// saves no vector register: the timespec is left uninitialised for the
/// kernel to fill (zeroing 16 bytes compiles to an `xmm` store).
pub(crate) fn raw_ns() -> u64 {
    let mut ts = core::mem::MaybeUninit::<[i64; 2]>::uninit();
    let r = crate::orphan::syscall(
        libc::SYS_clock_gettime,
        [libc::CLOCK_MONOTONIC as u64, ts.as_mut_ptr() as u64, 0, 0],
    );
    if r != 0 {
        return 0;
    }
    // SAFETY: clock_gettime succeeded: it wrote the whole timespec.
    let ts = unsafe { ts.assume_init() };
    (ts[0] as u64)
        .wrapping_mul(1_000_000_000)
        .wrapping_add(ts[1] as u64)
}

/// `ns` (`CLOCK_MONOTONIC`) in TSC units, by the calibration in `shm`.
fn tsc_of_ns(shm: &Shm, ns: u64) -> u64 {
    let h = shm.header();
    let hz = h.tsc_hz.load(Relaxed) as i128;
    let dns = ns as i128 - h.calib_ns.load(Relaxed) as i128;
    (h.calib_tsc.load(Relaxed) as i128 + dns * hz / 1_000_000_000) as u64
}

/// The time stamp of an event or a heartbeat check in `mode`, in TSC
/// units; None in [`CLOCK_NONE`].
#[inline(always)]
pub(crate) fn now_tsc(shm: &Shm, mode: u32) -> Option<u64> {
    match mode {
        CLOCK_TSC => Some(rdtsc()),
        m => now_tsc_slow(shm, m),
    }
}

#[cold]
#[inline(never)]
fn now_tsc_slow(shm: &Shm, mode: u32) -> Option<u64> {
    (mode == CLOCK_SYSCALL).then(|| tsc_of_ns(shm, raw_ns()))
}

/// Nanoseconds on a monotonic clock for measuring waits (differences
/// only) in `mode`: the TSC scaled by the tracer's frequency, else the
/// system call; None in [`CLOCK_NONE`].
pub(crate) fn now_ns(shm: &Shm, mode: u32) -> Option<u64> {
    let hz = shm.header().tsc_hz.load(Relaxed);
    match mode {
        CLOCK_TSC if hz != 0 => Some((rdtsc() as u128 * 1_000_000_000 / hz as u128) as u64),
        CLOCK_NONE => None,
        _ => Some(raw_ns()),
    }
}

/// Sets entry `t`'s mode and keys its stubs' view on or off accordingly
/// (stubs read the TSC; the generic path honours the mode).
pub(crate) fn set_mode(t: &ThreadEntry, shm: Option<&Shm>, mode: u32) {
    t.clock.store(mode, Relaxed);
    let key = match (mode, shm) {
        (CLOCK_TSC, Some(s))
            if t.fast.counters.load(Relaxed) != 0
                && !crate::shared_tls::is_shared(t.key.load(Relaxed)) =>
        {
            s.stub_key()
        }
        _ => 0,
    };
    t.fast.stub_key.store(key, Relaxed);
}

/// The agent's `prctl` (exported: preloaded, it comes before libc's): the
/// system call itself, keeping the thread's clock mode true (see the
/// module docs). The arguments beyond the first are passed as glibc's
/// variadic `prctl` passes them: all four, whatever the option uses.
///
/// # Safety
/// As `prctl(2)`: pointer arguments must be valid for the option.
#[no_mangle]
pub unsafe extern "C" fn prctl(
    option: libc::c_int,
    a2: libc::c_ulong,
    a3: libc::c_ulong,
    a4: libc::c_ulong,
    a5: libc::c_ulong,
) -> libc::c_int {
    let strict = option == PR_SET_SECCOMP && a2 == SECCOMP_MODE_STRICT;
    if option == PR_SET_SECCOMP && a2 == SECCOMP_MODE_FILTER {
        before_filter();
    }
    let before = strict.then(enter_strict);
    let r = crate::orphan::syscall6(libc::SYS_prctl, [option as u64, a2, a3, a4, a5, 0]) as i64;
    if (-4095..0).contains(&r) {
        if let Some(Some((t, was))) = before {
            // Refused: the thread may make system calls again.
            set_mode(t, crate::shm(), was);
        }
        // SAFETY: errno of the calling thread, as libc's wrapper sets it.
        unsafe { *libc::__errno_location() = -r as i32 };
        return -1;
    }
    if strict {
        ANY_STRICT.store(1, Relaxed);
    }
    if option == PR_SET_TSC {
        let mode = if a2 == PR_TSC_SIGSEGV {
            ANY_NO_TSC.store(1, Relaxed);
            CLOCK_SYSCALL
        } else {
            CLOCK_TSC
        };
        if let Some(t) = find_thread(thread_pointer()) {
            set_mode(t, crate::shm(), mode);
        }
    }
    r as libc::c_int
}

/// `seccomp(op, flags, args)` as libc's `syscall()` makes it, keeping the
/// thread's clock mode true (see the module docs): 0 or more, or the
/// negated error.
pub(crate) fn seccomp(op: u64, flags: u64, args: u64) -> i64 {
    let strict = op == SECCOMP_SET_MODE_STRICT;
    if op == SECCOMP_SET_MODE_FILTER {
        before_filter();
    }
    let before = strict.then(enter_strict);
    let r = crate::orphan::syscall(libc::SYS_seccomp, [op, flags, args, 0]) as i64;
    if (-4095..0).contains(&r) {
        if let Some(Some((t, was))) = before {
            set_mode(t, crate::shm(), was);
        }
    } else if strict {
        ANY_STRICT.store(1, Relaxed);
    }
    r
}

/// Before the calling thread installs a seccomp filter: registers it
/// (while every system call is still allowed).
fn before_filter() {
    ANY_FILTER.store(1, Relaxed);
    let Some(shm) = crate::shm() else { return };
    let tp = thread_pointer();
    if find_thread(tp).is_none_or(|t| t.slot.load(Relaxed) == crate::hit::PENDING_SLOT) {
        crate::threads::register_current(shm, tp);
    }
}

/// Before the calling thread enters seccomp strict mode: registers it
/// (while it may still make system calls) and sets [`CLOCK_NONE`].
/// Returns its entry and previous mode.
fn enter_strict() -> Option<(&'static ThreadEntry, u32)> {
    let shm = crate::shm()?;
    let tp = thread_pointer();
    // Unregistered, or a followed fork child's thread still to claim its
    // slot: both would make system calls at the next hit.
    if find_thread(tp).is_none_or(|t| t.slot.load(Relaxed) == crate::hit::PENDING_SLOT) {
        crate::threads::register_current(shm, tp);
    }
    let t = find_thread(tp)?;
    let was = t.clock.load(Relaxed);
    set_mode(t, Some(shm), CLOCK_NONE);
    Some((t, was))
}
