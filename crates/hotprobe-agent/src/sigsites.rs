//! The tracer's signal-state sites, put back when it died (issue 22).
//!
//! The ptrace tracer puts an `int3` of its own on each `syscall`
//! instruction of libc that makes `rt_sigaction` or `rt_sigprocmask`
//! (`hotprobe-process`'s `sigtrap.rs`: the program's `SIGTRAP` state is
//! kept across its traps there). Such a site is always the same bytes:
//! `mov eax, 13|14` (`b8 0d|0e 00 00 00`), then the `syscall` instruction
//! (`0f 05`) whose first byte is the `int3`. A tracer killed with SIGKILL
//! leaves them in, and the program's next `sigaction` or `sigprocmask`
//! would trap with no one to serve it. They are not in the trap table
//! (the process layer places them, not the engine), so the agent finds
//! them by their bytes: in every executable mapping of libc (where the
//! tracer puts them), `b8 0d|0e 00 00 00 cc 05` is a site, and its `0f`
//! goes back (`… cc cc`: one the trap mechanism also guarded, see
//! `hotprobe_abi::TRAP_GUARD`, whose `05` goes back first: `0f cc` would
//! run as `bswap esp`) ([`undo_all`], called by `undo::undo_all`); a thread that
//! traps on one first is resumed at it once the code is back
//! ([`resume_at_site`]).
//!
//! A static program (no agent) keeps its sites after such a death
//! (`tracer_killed.rs` counts them); hotprobe's notice that a killed
//! hotprobe leaves its int3s in covers them, and the CLI prints it when
//! the run starts. Only raw system calls: it runs in a signal handler.

use crate::orphan::syscall;
use hotprobe_abi::sigsite::{sig_site_shape, SIG_SITE_MAX};

const INT3: u8 = 0xcc;
/// The `syscall` instruction's first byte, under the `int3`.
const SYSCALL0: u8 = 0x0f;
/// The `syscall` instruction's second byte, after the `int3`.
const SYSCALL1: u8 = 0x05;

/// If `w` starts with a site (`hotprobe_abi::sigsite`) whose `syscall`
/// holds the tracer's `int3`: the `int3`'s offset in `w`, and whether it
/// is guarded (`cc cc`).
fn site_in(w: &[u8]) -> Option<(usize, bool)> {
    let (at, _) = sig_site_shape(w)?;
    match (w[at], w[at + 1]) {
        (INT3, SYSCALL1) => Some((at, false)),
        (INT3, INT3) => Some((at, true)),
        _ => None,
    }
}

/// Whether `w`, read from `INT3_AT - ...` (see [`site_window`]), holds a
/// site whose `syscall` starts at [`INT3_AT`], with the tracer's `int3`
/// there or (`restored`) put back already: whether it is guarded.
fn site_ending_at(w: &[u8; WINDOW], restored: bool) -> Option<bool> {
    (0..=INT3_AT - 5).find_map(|s| {
        let (at, _) = sig_site_shape(&w[s..])?;
        if s + at != INT3_AT {
            return None;
        }
        match (w[INT3_AT], w[INT3_AT + 1]) {
            (INT3, SYSCALL1) => Some(false),
            (INT3, INT3) => Some(true),
            (SYSCALL0, SYSCALL1) if restored => Some(false),
            _ => None,
        }
    })
}

/// Puts back the site whose `int3` is at `site` (`guarded`: with the
/// engine's guard `int3` one byte in, see `hotprobe_abi::TRAP_GUARD`)
/// through `/proc/self/mem` (`mem`): the guard first, as `0f cc` is an
/// instruction of its own (`bswap esp`), never a trap. True when written.
fn put_back(mem: u64, site: u64, guarded: bool) -> bool {
    let (b0, b1) = (SYSCALL0, SYSCALL1);
    if guarded
        && syscall(
            libc::SYS_pwrite64,
            [mem, &b1 as *const u8 as u64, 1, site + 1],
        ) != 1
    {
        return false;
    }
    syscall(libc::SYS_pwrite64, [mem, &b0 as *const u8 as u64, 1, site]) == 1
}

/// Whether the file name ending `line` (a `/proc/self/maps` line) is
/// libc's (`libc.so*`, `libc-*`), where the tracer puts the sites.
fn is_libc(path: &[u8]) -> bool {
    let name = match path.iter().rposition(|&b| b == b'/') {
        Some(i) => &path[i + 1..],
        None => return false,
    };
    name.starts_with(b"libc.so") || name.starts_with(b"libc-")
}

/// The executable libc mapping a `/proc/self/maps` line describes:
/// (start, end).
fn libc_text(line: &[u8]) -> Option<(u64, u64)> {
    let mut fields = line.split(|&b| b == b' ').filter(|f| !f.is_empty());
    let range = fields.next()?;
    let perms = fields.next()?;
    if perms.get(2) != Some(&b'x') {
        return None;
    }
    let path = fields.nth(3)?;
    if !is_libc(path) {
        return None;
    }
    let dash = range.iter().position(|&b| b == b'-')?;
    Some((hex(&range[..dash])?, hex(&range[dash + 1..])?))
}

fn hex(s: &[u8]) -> Option<u64> {
    let mut v: u64 = 0;
    if s.is_empty() || s.len() > 16 {
        return None;
    }
    for &c in s {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            _ => return None,
        };
        v = (v << 4) | u64::from(d);
    }
    Some(v)
}

/// Calls `each` with every executable libc mapping of this process
/// (read from `/proc/self/maps` in small pieces: a signal handler's stack
/// may be small).
fn each_libc_text(mut each: impl FnMut(u64, u64)) {
    let fd = syscall(
        libc::SYS_open,
        [
            c"/proc/self/maps".as_ptr() as u64,
            (libc::O_RDONLY | libc::O_CLOEXEC) as u64,
            0,
            0,
        ],
    ) as i64;
    if fd < 0 {
        return;
    }
    // Not zeroed (no `memset`, which a probe could be on: only the bytes
    // read or written are looked at).
    let mut line = core::mem::MaybeUninit::<[u8; 512]>::uninit();
    let line = line.as_mut_ptr() as *mut u8;
    let mut len = 0usize;
    let mut overlong = false;
    let mut buf = core::mem::MaybeUninit::<[u8; 256]>::uninit();
    loop {
        let n = syscall(libc::SYS_read, [fd as u64, buf.as_mut_ptr() as u64, 256, 0]) as i64;
        if n <= 0 || n > 256 {
            break;
        }
        // SAFETY: the first `n` bytes were just written by `read`.
        let got = unsafe { core::slice::from_raw_parts(buf.as_ptr() as *const u8, n as usize) };
        for &b in got {
            if b == b'\n' {
                // SAFETY: the first `len` bytes were written below.
                let l = unsafe { core::slice::from_raw_parts(line, len) };
                if !overlong {
                    if let Some((s, e)) = libc_text(l) {
                        each(s, e);
                    }
                }
                len = 0;
                overlong = false;
            } else if len < 512 {
                // SAFETY: `len` < 512, inside the buffer.
                unsafe { line.add(len).write(b) };
                len += 1;
            } else {
                overlong = true;
            }
        }
    }
    syscall(libc::SYS_close, [fd as u64, 0, 0, 0]);
}

/// Puts back every site's `syscall` byte in libc, through `/proc/self/mem`
/// (`mem`, open for writing); returns how many.
pub(crate) fn undo_all(mem: u64) -> u64 {
    let mut undone = 0;
    // Chunks overlap by a site's length but one: a site across two is seen.
    const OVERLAP: usize = SIG_SITE_MAX - 1;
    each_libc_text(|start, end| {
        // Not zeroed (see `each_libc_text`).
        let mut chunk = core::mem::MaybeUninit::<[u8; 1024]>::uninit();
        let mut at = start;
        while at < end {
            let len = ((end - at) as usize).min(1024);
            let n = syscall(
                libc::SYS_pread64,
                [mem, chunk.as_mut_ptr() as u64, len as u64, at],
            ) as i64;
            if n != len as i64 {
                return;
            }
            // SAFETY: the first `len` bytes were just written by `pread64`.
            let data = unsafe { core::slice::from_raw_parts(chunk.as_ptr() as *const u8, len) };
            for i in 0..len {
                if data[i] != 0xb8 {
                    continue;
                }
                let w = &data[i..len.min(i + SIG_SITE_MAX)];
                if let Some((o, guarded)) = site_in(w) {
                    if put_back(mem, at + (i + o) as u64, guarded) {
                        undone += 1;
                    }
                }
            }
            if at + len as u64 >= end {
                break;
            }
            at += (len - OVERLAP) as u64;
        }
    });
    undone
}

/// Whether the `int3` at `at` is a site's (see [`site_in`]).
pub(crate) fn is_site_at(at: u64) -> bool {
    let Some(fd) = crate::undo::open_self_mem(libc::O_RDONLY) else {
        return false;
    };
    let w = site_window(fd, at);
    syscall(libc::SYS_close, [fd, 0, 0, 0]);
    w.is_some_and(|w| site_ending_at(&w, false).is_some())
}

/// Where a site's `syscall` (or `int3`) sits in a [`site_window`].
const INT3_AT: usize = SIG_SITE_MAX - 2;
/// The bytes of a [`site_window`]: a whole site ending with the `syscall`.
const WINDOW: usize = SIG_SITE_MAX;

/// The bytes of a site whose `syscall` instruction starts at `at` (the
/// `mov eax, N`, what is between, the `syscall`), from `at -`
/// [`INT3_AT`], read through `fd` (the process's own memory); `None`
/// when they cannot all be read.
fn site_window(fd: u64, at: u64) -> Option<[u8; WINDOW]> {
    let mut w = [0u8; WINDOW];
    let n = syscall(
        libc::SYS_pread64,
        [
            fd,
            w.as_mut_ptr() as u64,
            WINDOW as u64,
            at.wrapping_sub(INT3_AT as u64),
        ],
    ) as i64;
    (n == WINDOW as i64).then_some(w)
}

/// A thread trapped on `at` (`rip - 1`) after the tracer died: if `at` is
/// a site (with its `int3`, or put back already), its byte is put back and
/// the thread resumes at the `syscall` instruction.
pub(crate) fn resume_at_site(at: u64, gregs: &mut [libc::greg_t]) -> bool {
    let Some(fd) = crate::undo::open_self_mem(libc::O_RDWR) else {
        return false;
    };
    let ours = site_window(fd, at).is_some_and(|w| {
        // Put back already (by another thread's undo): `0f 05`.
        let Some(guarded) = site_ending_at(&w, true) else {
            return false;
        };
        if w[INT3_AT] == INT3 {
            put_back(fd, at, guarded);
        }
        true
    });
    syscall(libc::SYS_close, [fd, 0, 0, 0]);
    if ours {
        if let Some(rip) = gregs.get_mut(libc::REG_RIP as usize) {
            *rip = at as i64;
        }
    }
    ours
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_site_is_the_number_then_the_int3_over_syscall() {
        assert_eq!(site_in(&[0xb8, 14, 0, 0, 0, 0xcc, 0x05]), Some((5, false)));
        assert_eq!(site_in(&[0xb8, 13, 0, 0, 0, 0xcc, 0x05]), Some((5, false)));
        assert_eq!(site_in(&[0xb8, 13, 0, 0, 0, 0x0f, 0x05]), None);
        assert_eq!(site_in(&[0xb8, 39, 0, 0, 0, 0xcc, 0x05]), None);
        assert_eq!(site_in(&[0xb8, 14, 0, 0, 1, 0xcc, 0x05]), None);
        // Guarded by the trap mechanism.
        assert_eq!(site_in(&[0xb8, 14, 0, 0, 0, 0xcc, 0xcc]), Some((5, true)));
        assert_eq!(site_in(&[0xb8, 14, 0, 0, 0, 0xcc, 0x90]), None);
        // glibc's pthread_create: a lea between.
        let w = [0xb8, 14, 0, 0, 0, 0x48, 0x8d, 0x35, 1, 2, 3, 0, 0xcc, 0x05];
        assert_eq!(site_in(&w), Some((12, false)));
    }

    #[test]
    fn a_window_ending_at_the_syscall_is_read_back_to_its_number() {
        let mut w = [0x90u8; WINDOW];
        let site = [0xb8, 14, 0, 0, 0, 0x48, 0x8d, 0x35, 1, 2, 3, 0, 0xcc, 0x05];
        w[INT3_AT + 2 - site.len()..].copy_from_slice(&site);
        assert_eq!(site_ending_at(&w, false), Some(false));
        w[INT3_AT] = SYSCALL0;
        assert_eq!(site_ending_at(&w, false), None);
        assert_eq!(site_ending_at(&w, true), Some(false));
        let mut w = [0x90u8; WINDOW];
        w[INT3_AT - 5..].copy_from_slice(&[0xb8, 13, 0, 0, 0, 0xcc, 0xcc]);
        assert_eq!(site_ending_at(&w, false), Some(true));
        w[INT3_AT - 4] = 39;
        assert_eq!(site_ending_at(&w, true), None);
    }

    #[test]
    fn libc_text_mappings_are_picked_from_maps_lines() {
        let l = b"7f0000001000-7f0000002000 r-xp 00028000 fe:01 123 /usr/lib/x86_64-linux-gnu/libc.so.6";
        assert_eq!(libc_text(l), Some((0x7f00_0000_1000, 0x7f00_0000_2000)));
        let data = b"7f0000001000-7f0000002000 r--p 00028000 fe:01 123 /usr/lib/libc.so.6";
        assert_eq!(libc_text(data), None);
        let other = b"7f0000001000-7f0000002000 r-xp 00028000 fe:01 123 /usr/lib/libcrypt.so.1";
        assert_eq!(libc_text(other), None);
        assert_eq!(libc_text(b"garbage"), None);
    }
}
