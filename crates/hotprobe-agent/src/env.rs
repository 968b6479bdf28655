//! The environment edits of the agent's constructor, made without calling
//! a single function of libc or of the program: when the tracer attached
//! the agent before any constructor ran (spawn), every libc function may
//! already be probed, and a `getenv`, `strlen`, `malloc` or `setenv` of
//! ours would be counted as the program's (`count 'libc.so.6:*'` counted
//! one `malloc`, one `free` and six `strlen`s more than the program made).
//! So `environ` is read directly, bytes are compared and moved by loops of
//! volatile accesses (which the compiler cannot turn into `memcmp` or
//! `memmove` calls), and system calls are made with the `syscall`
//! instruction. The constructor runs before any thread of the program
//! exists: editing `environ` here races with nothing.

use std::ffi::c_char;

extern "C" {
    /// libc's environment (a data symbol: reading it calls nothing).
    static mut environ: *mut *mut c_char;
}

/// The byte at `p` (volatile: no loop of these becomes a libc call).
///
/// # Safety
/// `p` is readable.
unsafe fn get(p: *const u8) -> u8 {
    // SAFETY: per the caller.
    unsafe { p.read_volatile() }
}

/// Writes `b` at `p` (volatile, as [`get`]).
///
/// # Safety
/// `p` is writable.
unsafe fn put(p: *mut u8, b: u8) {
    // SAFETY: per the caller.
    unsafe { p.write_volatile(b) }
}

/// The length of the C string at `s`.
///
/// # Safety
/// `s` is a NUL-terminated string.
unsafe fn c_len(s: *const u8) -> usize {
    let mut n = 0;
    // SAFETY: within the string, up to its NUL.
    while unsafe { get(s.add(n)) } != 0 {
        n += 1;
    }
    n
}

/// The environment's entries, in order.
fn entries() -> impl Iterator<Item = (usize, *mut u8)> {
    // SAFETY: `environ` is libc's, set before any constructor runs; read
    // once here (no thread exists yet to change it).
    let env = unsafe { environ };
    (0..)
        .map_while(move |i| {
            if env.is_null() {
                return None;
            }
            // SAFETY: the array is NULL-terminated; `i` stops at that NULL.
            let p = unsafe { *env.add(i) };
            (!p.is_null()).then_some((i, p as *mut u8))
        })
        .fuse()
}

/// The value of entry `e` if it is `name=value`.
///
/// # Safety
/// `e` is a NUL-terminated string.
unsafe fn value_of(e: *mut u8, name: &[u8]) -> Option<*mut u8> {
    for (i, &c) in name.iter().enumerate() {
        // SAFETY: stops at the string's NUL (which differs from `c`).
        if unsafe { get(e.add(i)) } != c {
            return None;
        }
    }
    // SAFETY: every byte before it matched a non-NUL byte of `name`.
    (unsafe { get(e.add(name.len())) } == b'=').then(|| unsafe { e.add(name.len() + 1) })
}

/// The value of variable `name` (the first entry), NUL-terminated.
pub(crate) fn var(name: &[u8]) -> Option<*mut u8> {
    // SAFETY: entries are NUL-terminated strings.
    entries().find_map(|(_, e)| unsafe { value_of(e, name) })
}

/// Removes every entry of variable `name`, as `unsetenv` would (the array
/// is shifted down; the strings stay where they are, so a value read
/// before stays valid).
pub(crate) fn remove(name: &[u8]) {
    // SAFETY: as in `entries`.
    let env = unsafe { environ };
    if env.is_null() {
        return;
    }
    let mut w = 0;
    for (_, e) in entries() {
        // SAFETY: entries are NUL-terminated strings.
        if unsafe { value_of(e, name) }.is_some() {
            continue;
        }
        // SAFETY: w <= r: both index the array read so far.
        unsafe { *env.add(w) = e as *mut c_char };
        w += 1;
    }
    // SAFETY: w is at most the index of the terminating NULL.
    unsafe { *env.add(w) = std::ptr::null_mut() };
}

/// `readlink(path)` into `buf` by the system call; the length read.
fn readlink(path: *const u8, buf: &mut [u8]) -> Option<usize> {
    let n = crate::orphan::syscall(
        libc::SYS_readlink,
        [path as u64, buf.as_mut_ptr() as u64, buf.len() as u64, 0],
    ) as i64;
    (n >= 0).then_some(n as usize)
}

/// Whether `hay[..len]` contains `needle`.
fn contains(hay: &[u8], len: usize, needle: &[u8]) -> bool {
    (0..=len.saturating_sub(needle.len())).any(|i| {
        i + needle.len() <= len
            // SAFETY: indices within `hay[..len]`.
            && (0..needle.len()).all(|j| unsafe { get(hay.as_ptr().add(i + j)) } == needle[j])
    })
}

/// Whether the `LD_PRELOAD` entry `p[..len]` is this agent preloaded from
/// a descriptor path: `/proc/PID/fd/N` (the tracer's memfd), linking to
/// a memfd named `libhotprobe_agent…`.
///
/// # Safety
/// `p[..len]` is readable.
unsafe fn is_ephemeral_agent(p: *const u8, len: usize) -> bool {
    const PROC: &[u8] = b"/proc/";
    let mut path = [0u8; 256];
    if len < PROC.len() || len >= path.len() {
        return false;
    }
    for (i, slot) in path.iter_mut().enumerate().take(len) {
        // SAFETY: i < len.
        *slot = unsafe { get(p.add(i)) };
    }
    if !contains(&path, PROC.len(), PROC) || !contains(&path, len, b"/fd/") {
        return false;
    }
    let mut link = [0u8; 256];
    match readlink(path.as_ptr(), &mut link) {
        Some(n) => contains(&link, n, b"memfd:libhotprobe_agent"),
        None => false,
    }
}

/// Takes this agent's entry out of `LD_PRELOAD` when it was preloaded from
/// a descriptor path (see `drop_ephemeral_preload` in the crate root):
/// the value is rewritten in place without it (it only shrinks), and the
/// variable is removed when nothing else is left.
pub(crate) fn drop_ephemeral_preload() {
    const NAME: &[u8] = b"LD_PRELOAD";
    let Some(v) = var(NAME) else { return };
    // SAFETY: an environment value, NUL-terminated and writable (the
    // strings `execve` put on the stack, or ones a parent allocated).
    let len = unsafe { c_len(v) };
    let sep = |c: u8| c == b':' || c == b' ';
    let (mut r, mut w, mut dropped, mut kept) = (0, 0, false, 0);
    while r < len {
        // SAFETY: r < len, inside the value.
        if sep(unsafe { get(v.add(r)) }) {
            r += 1;
            continue;
        }
        let start = r;
        // SAFETY: r < len, inside the value.
        while r < len && !sep(unsafe { get(v.add(r)) }) {
            r += 1;
        }
        // SAFETY: v[start..r] is inside the value.
        if unsafe { is_ephemeral_agent(v.add(start), r - start) } {
            dropped = true;
            continue;
        }
        if kept > 0 {
            // SAFETY: w < r: at least the separator before `start` was read.
            unsafe { put(v.add(w), b':') };
            w += 1;
        }
        for i in start..r {
            // SAFETY: w <= i: moving left within the value.
            unsafe { put(v.add(w), get(v.add(i))) };
            w += 1;
        }
        kept += 1;
    }
    if !dropped {
        return;
    }
    if kept == 0 {
        remove(NAME);
    } else {
        // SAFETY: w <= len: within the value (its NUL at most).
        unsafe { put(v.add(w), 0) };
    }
}

/// A decimal number (no sign) from a C string.
///
/// # Safety
/// `s` is a NUL-terminated string.
pub(crate) unsafe fn parse_fd(s: *const u8) -> Option<i32> {
    // SAFETY: per the caller.
    let len = unsafe { c_len(s) };
    if len == 0 || len > 9 {
        return None;
    }
    let mut n = 0i32;
    for i in 0..len {
        // SAFETY: i < len.
        let c = unsafe { get(s.add(i)) };
        if !c.is_ascii_digit() {
            return None;
        }
        n = n * 10 + (c - b'0') as i32;
    }
    Some(n)
}
