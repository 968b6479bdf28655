//! The safe reads on memory of this test process: NULL, unmapped and
//! `PROT_NONE` pages, a string running into an unmapped page, a string
//! ending right before one, a string longer than the copy, and a string
//! another thread rewrites meanwhile, through each way (the transaction
//! where the processor has RTM, the system call) and through
//! [`read_into`], which picks.

use super::*;
use std::sync::atomic::{AtomicBool, Ordering};

const PAGE: usize = 4096;

/// Two fresh pages, the second made `PROT_NONE` when `guard`, else
/// unmapped: its base.
fn two_pages(guard: bool) -> *mut u8 {
    // SAFETY: a fresh anonymous mapping, then a change to its own second
    // page.
    unsafe {
        let p = libc::mmap(
            core::ptr::null_mut(),
            2 * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        let second = p.cast::<u8>().add(PAGE).cast();
        if guard {
            assert_eq!(libc::mprotect(second, PAGE, libc::PROT_NONE), 0);
        } else {
            assert_eq!(libc::munmap(second, PAGE), 0);
        }
        p.cast()
    }
}

fn pid() -> u32 {
    std::process::id()
}

/// [`read_into`] of up to 129 bytes at `addr`, until a NUL: the bytes up
/// to and including the first NUL (the system call may copy more).
fn read_str(addr: u64) -> Vec<u8> {
    let mut buf = [0u8; 129];
    // SAFETY: `buf` holds 129 bytes.
    let n = unsafe { read_into(pid(), addr, buf.as_mut_ptr(), buf.len(), true) };
    let end = buf[..n].iter().position(|&b| b == 0).map_or(n, |z| z + 1);
    buf[..end].to_vec()
}

/// [`read_by_syscall`] of `len` bytes at `addr`.
fn by_syscall(addr: u64, len: usize) -> Vec<u8> {
    let mut buf = vec![0u8; len];
    // SAFETY: `buf` holds `len` bytes.
    let n = unsafe { read_by_syscall(pid(), addr, buf.as_mut_ptr(), len) };
    buf.truncate(n);
    buf
}

/// [`copy_in_transaction`] of `len` bytes at `addr`; `None` without RTM
/// or when it aborted.
fn in_transaction(addr: u64, len: usize, until_nul: bool) -> Option<Vec<u8>> {
    if !rtm_usable() {
        return None;
    }
    let mut buf = vec![0u8; len];
    // SAFETY: `buf` holds `len` bytes; RTM is there.
    let n = unsafe { copy_in_transaction(addr, buf.as_mut_ptr(), len, until_nul) }?;
    buf.truncate(n);
    Some(buf)
}

/// [`in_transaction`] of readable memory, tried until one completes: a
/// transaction may abort for a reason of the machine's (an interrupt, a
/// context switch: the agent then reads by the system call), as one did
/// in a CI run under load. Panics if none of 10,000 completes.
fn completed(addr: u64, len: usize, until_nul: bool) -> Vec<u8> {
    (0..10_000)
        .find_map(|_| in_transaction(addr, len, until_nul))
        .expect("no transaction of readable memory completed in 10,000 tries")
}

#[test]
fn null_and_unmapped_read_nothing() {
    let p = two_pages(false);
    let gone = p as u64 + PAGE as u64;
    assert_eq!(read_str(0), b"");
    assert_eq!(read_str(1), b"");
    assert_eq!(read_str(gone), b"");
    assert_eq!(read_value(pid(), gone, 8), None);
    assert_eq!(read_value(pid(), 0, 8), None);
    assert_eq!(by_syscall(gone, 16), b"");
    assert_eq!(in_transaction(gone, 16, true), None);
    assert_eq!(in_transaction(1, 16, true), None);
}

#[test]
fn a_string_running_into_an_unreadable_page_is_read_to_the_page_end() {
    for guard in [false, true] {
        let p = two_pages(guard);
        // SAFETY: the first page is ours and writable.
        unsafe { core::ptr::write_bytes(p, b'x', PAGE) };
        let at = p as u64 + PAGE as u64 - 10;
        assert_eq!(read_str(at), b"xxxxxxxxxx", "guard {guard}");
        assert_eq!(by_syscall(at, 129), b"xxxxxxxxxx");
        // The transaction cannot read it: the system call does.
        assert_eq!(in_transaction(at, 129, true), None);
        // A value straddling the boundary is unreadable as a whole.
        assert_eq!(read_value(pid(), p as u64 + PAGE as u64 - 4, 8), None);
        assert_eq!(
            read_value(pid(), p as u64 + PAGE as u64 - 8, 8),
            Some(u64::from_le_bytes(*b"xxxxxxxx"))
        );
    }
}

#[test]
fn a_string_ending_right_before_an_unmapped_page_is_whole() {
    let p = two_pages(false);
    // SAFETY: the first page is ours and writable.
    unsafe {
        core::ptr::write_bytes(p, b'y', PAGE);
        p.add(PAGE - 1).write(0);
    }
    let at = p as u64 + PAGE as u64 - 6;
    assert_eq!(read_str(at), b"yyyyy\0");
    if rtm_usable() {
        // Up to and including the NUL, never past it.
        assert_eq!(completed(at, 129, true), b"yyyyy\0");
    }
}

#[test]
fn a_long_string_is_read_to_the_limit() {
    let s = vec![b'z'; 300];
    let at = s.as_ptr() as u64;
    assert_eq!(read_str(at), vec![b'z'; 129]);
    assert_eq!(by_syscall(at, 129), vec![b'z'; 129]);
    if rtm_usable() {
        assert_eq!(completed(at, 129, true), vec![b'z'; 129]);
        // Without `until_nul`, a NUL does not stop the copy.
        let t = b"ab\0cd";
        assert_eq!(completed(t.as_ptr() as u64, 5, false), t);
        assert_eq!(completed(t.as_ptr() as u64, 5, true), b"ab\0");
    }
    let word = 0x1122_3344_5566_7788u64;
    let wa = &word as *const u64 as u64;
    assert_eq!(read_word(pid(), wa), Some(word));
    assert_eq!(read_value(pid(), wa, 2), Some(0x7788));
}

/// The processor's answer, compared with the kernel's `/proc/cpuinfo`
/// (whose `rtm` flag is the same `cpuid` bit, cleared where the kernel
/// turned TSX off).
#[test]
fn rtm_is_used_where_cpuinfo_lists_it() {
    let info = std::fs::read_to_string("/proc/cpuinfo").unwrap();
    let flags = info
        .lines()
        .find(|l| l.starts_with("flags"))
        .expect("a flags line");
    let listed = flags.split_whitespace().any(|f| f == "rtm");
    let always_aborts = flags.split_whitespace().any(|f| f == "rtm_always_abort");
    assert_eq!(rtm_usable(), listed && !always_aborts, "{flags}");
}

/// Another thread flips one byte of a string and its length (a NUL in or
/// out) as fast as it can while this one reads it: every read is one of
/// the four strings the memory can hold (a byte is never torn), and each
/// way is taken.
#[test]
fn a_string_another_thread_rewrites_reads_as_one_of_its_values() {
    let buf: &'static mut [u8; 16] = Box::leak(Box::new(*b"Axyzw\0\0\0\0\0\0\0\0\0\0\0"));
    let at = buf.as_ptr() as u64;
    let addr = buf.as_mut_ptr() as usize;
    let stop: &'static AtomicBool = Box::leak(Box::new(AtomicBool::new(false)));
    let writer = std::thread::spawn(move || {
        let p = addr as *mut u8;
        let mut i = 0u32;
        while !stop.load(Ordering::Relaxed) {
            // SAFETY: the leaked buffer lives on; volatile single-byte
            // stores, read by the other thread only through the safe
            // reads.
            unsafe {
                p.write_volatile(if i & 1 == 0 { b'A' } else { b'B' });
                p.add(4).write_volatile(if i & 2 == 0 { b'w' } else { 0 });
            }
            i = i.wrapping_add(1);
        }
    });
    let valid: [&[u8]; 4] = [b"Axyzw\0", b"Bxyzw\0", b"Axyz\0", b"Bxyz\0"];
    let mut whole = 0;
    for _ in 0..20_000 {
        let s = read_str(at);
        assert!(valid.contains(&s.as_slice()), "{s:?}");
        let s = by_syscall(at, 6);
        assert!(
            valid.iter().any(|v| s.starts_with(&v[..4])),
            "the system call: {s:?}"
        );
        if let Some(s) = in_transaction(at, 16, true) {
            assert!(valid.contains(&s.as_slice()), "a transaction: {s:?}");
            whole += 1;
        }
    }
    // Conflicts are retried: some transactions complete (all of them here).
    assert_eq!(whole > 0, rtm_usable());
    stop.store(true, Ordering::Relaxed);
    writer.join().unwrap();
}

/// A thread that made `cpuid` fault (`ARCH_SET_CPUID` 0, as rr does) is
/// not killed by the check for RTM, which then says no. Where the
/// processor or the kernel has no CPUID faulting, the check runs
/// `cpuid` as usual.
#[test]
fn the_rtm_check_runs_no_cpuid_where_it_would_fault() {
    const ARCH_SET_CPUID: u64 = 0x1012;
    let usual = rtm_supported();
    // On a thread of its own: the setting is per thread.
    std::thread::spawn(move || {
        if arch_prctl(ARCH_SET_CPUID, 0) == 0 {
            assert_eq!(arch_prctl(ARCH_GET_CPUID, 0), 0);
            assert!(!rtm_supported());
            assert_eq!(arch_prctl(ARCH_SET_CPUID, 1), 0);
            assert_eq!(rtm_supported(), usual);
        } else {
            assert!(arch_prctl(ARCH_GET_CPUID, 0) != 0);
            assert_eq!(rtm_supported(), usual);
        }
    })
    .join()
    .unwrap();
}
