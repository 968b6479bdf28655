//! Reads of the process's own memory that cannot fault, with no signal
//! handler (the program's signal state is never relied on), no
//! allocation and no lock. The one primitive of the stack walk (an
//! unpublished stack, see `stackwalk`) and of typed captures (`capture`).
//!
//! Two ways, the first where the processor has it:
//! - **A hardware transaction** (Intel RTM, `xbegin`/`xend`): the bytes are
//!   loaded inside a transaction, and a load of memory that is not mapped
//!   readable (unmapped, `PROT_NONE`, a page not yet faulted in) aborts it
//!   instead of raising a fault; so does a write of the bytes by another
//!   thread meanwhile (a conflict, tried again: a transaction's copy is
//!   never torn, the system call's after the last try may be). No system call:
//!   ≈ 20 ns for a short string against ≈ 450 ns for the system call.
//!   Used only when `cpuid` says RTM is there and not forced to abort
//!   (without it `xbegin` is an invalid opcode); checked once a process,
//!   at its first read, and not at all where the program made `cpuid`
//!   fault.
//! - **`process_vm_readv`** on the agent's own pid: copies what is mapped
//!   readable and answers `EFAULT` where nothing is. It is the fallback of
//!   every aborted transaction, so whatever a transaction could not read
//!   (a page not yet faulted in, a string running into an unmapped page,
//!   memory the program made unreadable) is read, cut, or found unreadable
//!   exactly as the system call alone would.
//!
//! Where the system call is refused (a seccomp filter's `EPERM`; seccomp
//! strict mode allows no system call at all, which the callers check
//! first), nothing is read: the caller records the memory as unreadable.

use core::mem::MaybeUninit;
use core::sync::atomic::AtomicU8;
use core::sync::atomic::Ordering::Relaxed;

/// Copies up to `len` bytes at `addr` of this process (`pid`) into `dst`;
/// returns how many were copied — fewer than `len` when the range runs
/// into memory that is not readable (the copy stops at the page boundary
/// before it), 0 when none is or the call is refused. With `until_nul`, a
/// copy may also stop right after a NUL byte (the count includes it):
/// what follows a string's end is never needed, and not reading it keeps
/// a string that ends just before an unmapped page on the fast way.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes.
#[inline]
pub(crate) unsafe fn read_into(
    pid: u32,
    addr: u64,
    dst: *mut u8,
    len: usize,
    until_nul: bool,
) -> usize {
    if len == 0 || addr == 0 {
        return 0;
    }
    if rtm_usable() {
        // SAFETY: caller contract; RTM is there (checked above).
        if let Some(n) = unsafe { copy_in_transaction(addr, dst, len, until_nul) } {
            return n;
        }
    }
    // SAFETY: caller contract.
    unsafe { read_by_syscall(pid, addr, dst, len) }
}

/// Copies up to `len` bytes at `addr` into `dst` with `process_vm_readv`
/// (see [`read_into`]). One remote iovec: Linux copies a range that runs
/// into unreadable memory up to the page before it. Where the call fails
/// outright on a range crossing a page boundary (a kernel that does not
/// split an iovec, as the manual page describes), the part before the
/// boundary is asked again alone, so that a readable first page is copied
/// even when the next is not. (Two iovecs in one call cost ≈ 200 ns more
/// here than one.)
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes.
#[inline(never)]
#[cold]
pub(crate) unsafe fn read_by_syscall(pid: u32, addr: u64, dst: *mut u8, len: usize) -> usize {
    if len == 0 || addr == 0 {
        return 0;
    }
    // SAFETY: caller contract.
    if let Some(n) = unsafe { process_vm_readv(pid, addr, dst, len) } {
        return n;
    }
    let first = ((0x1000 - (addr & 0xfff)) as usize).min(len);
    if first == len {
        return 0;
    }
    // SAFETY: caller contract, first < len.
    unsafe { process_vm_readv(pid, addr, dst, first) }.unwrap_or(0)
}

/// One `process_vm_readv` of `len` bytes at `addr` into `dst`: the count
/// copied, `None` on an error (nothing copied, or the call refused).
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes.
#[inline(always)]
unsafe fn process_vm_readv(pid: u32, addr: u64, dst: *mut u8, len: usize) -> Option<usize> {
    // One local iovec then one remote, written a word at a time with
    // volatile stores (an array initialiser would compile to vector
    // stores, which the fast path may not use).
    let mut iov = MaybeUninit::<[u64; 4]>::uninit();
    let w = iov.as_mut_ptr().cast::<u64>();
    // SAFETY: `iov` holds four words.
    unsafe {
        w.write_volatile(dst as u64);
        w.add(1).write_volatile(len as u64);
        w.add(2).write_volatile(addr);
        w.add(3).write_volatile(len as u64);
    }
    let n = crate::orphan::syscall6(
        libc::SYS_process_vm_readv,
        [u64::from(pid), w as u64, 1, w.wrapping_add(2) as u64, 1, 0],
    );
    // Negative: an errno.
    ((n as i64) >= 0).then_some((n as usize).min(len))
}

/// How often a transaction that aborted with the "may succeed on retry"
/// status (a conflict with another thread's write, an interrupt) is tried
/// again before the system call.
const RETRIES: u32 = 3;

/// `xbegin`'s abort status bit: the transaction may succeed on a retry.
const XABORT_RETRY: u32 = 1 << 1;

/// Copies `len` bytes at `addr` (or up to and including the first NUL,
/// with `until_nul`) into `dst` inside an RTM transaction: the count
/// copied, or `None` when every try aborted (memory not readable, a
/// conflict, an interrupt): the caller then reads another way.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes, and the processor must
/// have RTM ([`rtm_usable`]).
#[inline(never)]
pub(crate) unsafe fn copy_in_transaction(
    addr: u64,
    dst: *mut u8,
    len: usize,
    until_nul: bool,
) -> Option<usize> {
    // A byte value no load gives (256) unless a NUL ends the copy.
    let stop: u32 = if until_nul { 0 } else { 0x100 };
    let mut tries = 0;
    loop {
        let copied: usize;
        let done: u32;
        let status: u32;
        // SAFETY: RTM is there (caller contract), so `xbegin` is valid.
        // Inside the transaction only `addr..addr+len` is loaded (a load
        // that would fault aborts the transaction instead: no signal) and
        // only `dst..dst+len` is stored (valid, caller contract). On an
        // abort every register is restored to its value at `xbegin` but
        // eax (the status): `done` is then still 0 and `copied` 0, and the
        // stores are undone. General registers only (the fast path uses
        // no vector register).
        unsafe {
            core::arch::asm!(
                "xor {done:e}, {done:e}",
                "xor {i:e}, {i:e}",
                "xbegin 3f",
                "2:",
                "movzx {b:e}, byte ptr [{src} + {i}]",
                "mov byte ptr [{dst} + {i}], {b:l}",
                "inc {i}",
                "cmp {b:e}, {stop:e}",
                "je 4f",
                "cmp {i}, {len}",
                "jb 2b",
                "4:",
                "xend",
                "mov {done:e}, 1",
                "3:",
                src = in(reg) addr,
                dst = in(reg) dst,
                len = in(reg) len,
                stop = in(reg) stop,
                i = out(reg) copied,
                b = out(reg) _,
                done = out(reg) done,
                inout("eax") u32::MAX => status,
                options(nostack),
            );
        }
        if done != 0 {
            return Some(copied);
        }
        tries += 1;
        if status & XABORT_RETRY == 0 || tries > RETRIES {
            return None;
        }
    }
}

/// Whether RTM transactions may be used: 0 not yet known, 1 yes, 2 no.
static RTM: AtomicU8 = AtomicU8::new(0);

/// Whether the processor has RTM, not forced to abort: `cpuid` leaf 7
/// (EBX bit 11 RTM, EDX bit 11 RTM_ALWAYS_ABORT). Asked once (in a
/// virtual machine `cpuid` exits to the hypervisor); threads racing on the
/// first ask store the same answer.
#[inline(always)]
pub(crate) fn rtm_usable() -> bool {
    match RTM.load(Relaxed) {
        1 => true,
        2 => false,
        _ => probe_rtm(),
    }
}

#[cold]
#[inline(never)]
fn probe_rtm() -> bool {
    let ok = rtm_supported();
    RTM.store(if ok { 1 } else { 2 }, Relaxed);
    ok
}

/// Whether this thread may run `cpuid` and the processor has RTM not
/// forced to abort. A thread of the program may have turned on CPUID
/// faulting (`arch_prctl(ARCH_SET_CPUID, 0)`, as rr's recorded programs
/// do): `cpuid` would then raise `SIGSEGV`, so it is asked first
/// (`ARCH_GET_CPUID` answers 0 then; an error where the kernel or the
/// processor has no CPUID faulting, so `cpuid` cannot fault).
fn rtm_supported() -> bool {
    if arch_prctl(ARCH_GET_CPUID, 0) == 0 {
        return false;
    }
    cpuid(0).0 >= 7 && {
        let (_, ebx, _, edx) = cpuid(7);
        ebx & (1 << 11) != 0 && edx & (1 << 11) == 0
    }
}

/// `arch_prctl`'s code: whether `cpuid` runs (1) or faults (0).
const ARCH_GET_CPUID: u64 = 0x1011;

/// `arch_prctl(code, arg)` by the `syscall` instruction (never through
/// libc, whose functions may be probed): its result, an errno negated.
fn arch_prctl(code: u64, arg: u64) -> i64 {
    let r: u64;
    // SAFETY: `arch_prctl` with `ARCH_GET_CPUID` (or, in the tests,
    // `ARCH_SET_CPUID` on the calling thread) reads and writes no memory;
    // `syscall` clobbers rcx and r11.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") libc::SYS_arch_prctl as u64 => r,
            in("rdi") code,
            in("rsi") arg,
            out("rcx") _,
            out("r11") _,
            options(nostack)
        )
    };
    r as i64
}

/// `cpuid` of `leaf`, subleaf 0: (eax, ebx, ecx, edx).
fn cpuid(leaf: u32) -> (u32, u32, u32, u32) {
    let (eax, ebx, ecx, edx): (u32, u64, u32, u32);
    // SAFETY: `cpuid` exists on every x86-64 processor and only writes
    // the four registers; rbx (reserved by the compiler) is saved in a
    // scratch register around it.
    unsafe {
        core::arch::asm!(
            "mov {tmp}, rbx",
            "cpuid",
            "xchg {tmp}, rbx",
            tmp = out(reg) ebx,
            inout("eax") leaf => eax,
            inout("ecx") 0u32 => ecx,
            out("edx") edx,
            options(nostack, preserves_flags),
        );
    }
    (eax, ebx as u32, ecx, edx)
}

/// The `size` bytes (1–8) at `addr`, zero-extended; `None` where they are
/// not all readable.
#[inline]
pub(crate) fn read_value(pid: u32, addr: u64, size: u8) -> Option<u64> {
    let n = usize::from(size).clamp(1, 8);
    let mut word = 0u64;
    // SAFETY: `word` holds 8 >= n bytes.
    let got = unsafe { read_into(pid, addr, (&mut word as *mut u64).cast(), n, false) };
    (got == n).then_some(word)
}

/// The word at `addr`; `None` where it is not readable.
#[inline]
pub(crate) fn read_word(pid: u32, addr: u64) -> Option<u64> {
    read_value(pid, addr, 8)
}

#[cfg(test)]
mod tests;
