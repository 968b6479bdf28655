//! Reads of the process's own memory that cannot fault: the
//! `process_vm_readv` system call on the agent's own pid copies what is
//! mapped readable and answers `EFAULT` where nothing is, instead of
//! raising `SIGSEGV`. No signal handler is involved (the program's signal
//! state is never relied on), no allocation, no lock: one system call per
//! read. The one primitive of the stack walk (an unpublished stack, see
//! `stackwalk`) and of typed captures (`capture`).
//!
//! Where the system call is refused (a seccomp filter's `EPERM`; seccomp
//! strict mode allows no system call at all, which the callers check
//! first), nothing is read: the caller records the memory as unreadable.

use core::mem::MaybeUninit;

/// Copies up to `len` bytes at `addr` of this process (`pid`) into `dst`;
/// returns how many were copied — fewer than `len` when the range runs
/// into memory that is not readable (the copy stops at the page boundary
/// before it), 0 when none is or the call is refused. The range is split
/// at its first page boundary so that a readable first page is copied
/// even when the next is not.
///
/// # Safety
/// `dst` must be valid for writes of `len` bytes.
#[inline]
pub(crate) unsafe fn read_into(pid: u32, addr: u64, dst: *mut u8, len: usize) -> usize {
    if len == 0 || addr == 0 {
        return 0;
    }
    let first = ((0x1000 - (addr & 0xfff)) as usize).min(len);
    // One local iovec then two remote ones, written a word at a time with
    // volatile stores (an array initialiser would compile to vector
    // stores, which the fast path may not use).
    let mut iov = MaybeUninit::<[u64; 6]>::uninit();
    let w = iov.as_mut_ptr().cast::<u64>();
    // SAFETY: `iov` holds six words.
    unsafe {
        w.write_volatile(dst as u64);
        w.add(1).write_volatile(len as u64);
        w.add(2).write_volatile(addr);
        w.add(3).write_volatile(first as u64);
        w.add(4).write_volatile(addr.wrapping_add(first as u64));
        w.add(5).write_volatile((len - first) as u64);
    }
    let n = crate::orphan::syscall6(
        libc::SYS_process_vm_readv,
        [
            u64::from(pid),
            w as u64,
            1,
            w.wrapping_add(2) as u64,
            if first < len { 2 } else { 1 },
            0,
        ],
    );
    // Negative (an errno): nothing copied.
    if (n as i64) < 0 {
        0
    } else {
        (n as usize).min(len)
    }
}

/// The `size` bytes (1–8) at `addr`, zero-extended; `None` where they are
/// not all readable.
#[inline]
pub(crate) fn read_value(pid: u32, addr: u64, size: u8) -> Option<u64> {
    let n = usize::from(size).clamp(1, 8);
    let mut word = 0u64;
    // SAFETY: `word` holds 8 >= n bytes.
    let got = unsafe { read_into(pid, addr, (&mut word as *mut u64).cast(), n) };
    (got == n).then_some(word)
}

/// The word at `addr`; `None` where it is not readable.
#[inline]
pub(crate) fn read_word(pid: u32, addr: u64) -> Option<u64> {
    read_value(pid, addr, 8)
}
