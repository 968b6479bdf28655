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

const INT3: u8 = 0xcc;
/// The `syscall` instruction's first byte, under the `int3`.
const SYSCALL0: u8 = 0x0f;
/// The `syscall` instruction's second byte, after the `int3`.
const SYSCALL1: u8 = 0x05;

/// Whether the 7 bytes `w` are a site with the tracer's `int3` (at 5).
fn is_site(w: &[u8]) -> bool {
    w.len() >= 7
        && w[0] == 0xb8
        && (w[1] == 13 || w[1] == 14)
        && w[2..5] == [0, 0, 0]
        && w[5] == INT3
        && (w[6] == SYSCALL1 || w[6] == INT3)
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
    each_libc_text(|start, end| {
        // Not zeroed (see `each_libc_text`).
        let mut chunk = core::mem::MaybeUninit::<[u8; 1024]>::uninit();
        let mut at = start;
        while at < end {
            // Chunks overlap by 6 bytes: a site across two is seen.
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
            for (i, w) in data.windows(7).enumerate() {
                if is_site(w) && put_back(mem, at + i as u64 + 5, w[6] == INT3) {
                    undone += 1;
                }
            }
            if at + len as u64 >= end {
                break;
            }
            at += len as u64 - 6;
        }
    });
    undone
}

/// Whether the `int3` at `at` is a site's (see [`is_site`]).
pub(crate) fn is_site_at(at: u64) -> bool {
    let Some(fd) = crate::undo::open_self_mem(libc::O_RDONLY) else {
        return false;
    };
    let w = site_window(fd, at);
    syscall(libc::SYS_close, [fd, 0, 0, 0]);
    w.is_some_and(|w| is_site(&w))
}

/// The 7 bytes around a site's `int3` at `at` (`mov eax, N` and the
/// `syscall`), read through `fd` (the process's own memory); `None`
/// when they cannot all be read.
fn site_window(fd: u64, at: u64) -> Option<[u8; 7]> {
    let mut w = [0u8; 7];
    let n = syscall(
        libc::SYS_pread64,
        [fd, w.as_mut_ptr() as u64, 7, at.wrapping_sub(5)],
    ) as i64;
    (n == 7).then_some(w)
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
        let restored = w[5] == SYSCALL0 && w[6] == SYSCALL1 && {
            let mut t = w;
            t[5] = INT3;
            is_site(&t)
        };
        let ours = is_site(&w) || restored;
        if ours && w[5] == INT3 {
            put_back(fd, at, w[6] == INT3);
        }
        ours
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
        assert!(is_site(&[0xb8, 14, 0, 0, 0, 0xcc, 0x05]));
        assert!(is_site(&[0xb8, 13, 0, 0, 0, 0xcc, 0x05]));
        assert!(!is_site(&[0xb8, 13, 0, 0, 0, 0x0f, 0x05]));
        assert!(!is_site(&[0xb8, 39, 0, 0, 0, 0xcc, 0x05]));
        assert!(!is_site(&[0xb8, 14, 0, 0, 1, 0xcc, 0x05]));
        // Guarded by the trap mechanism.
        assert!(is_site(&[0xb8, 14, 0, 0, 0, 0xcc, 0xcc]));
        assert!(!is_site(&[0xb8, 14, 0, 0, 0, 0xcc, 0x90]));
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
