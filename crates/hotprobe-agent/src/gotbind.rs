//! An injected agent's `sigaction` and `signal`, bound through the
//! program's GOT (issue 22).
//!
//! A preloaded agent's `sigaction` and `signal` come before libc's, so the
//! program's `sigaction(SIGTRAP)` reads and sets the action the agent
//! keeps for it (`progtrap`) while the agent's own handler holds the
//! kernel's disposition. An agent injected into a running process is
//! found by no lookup: the program's calls are bound to glibc's already,
//! and would read back the agent's handler. So at attach, where the
//! agent's names are not the ones the program's lookups find, every
//! `JUMP_SLOT` and `GLOB_DAT` relocation for `sigaction` or `signal` in
//! the objects loaded (not libc, the loader, the vDSO or the agent) gets
//! the agent's entry instead ([`bind`]: [`injected_sigaction`],
//! [`injected_signal`], which serve `SIGTRAP` from the kept action and
//! pass every other signal to glibc as is); at release each slot that
//! still holds it gets glibc's back ([`unbind`]). The slots are written
//! through `/proc/self/mem` (a full-RELRO GOT is read-only), with every
//! other thread stopped (the tracer calls attach and release so).
//!
//! Not reached: a library loaded after the attach, a call through a
//! pointer taken before it (`&sigaction` stored by the program), and
//! glibc's own internal calls (which never set `SIGTRAP`'s action).

use core::sync::atomic::AtomicU64;
use core::sync::atomic::Ordering::Relaxed;

/// The most slots bound.
const MAX_SLOTS: usize = 64;

/// The slots bound: (address, glibc's value); address 0: free.
static SLOTS: [[AtomicU64; 2]; MAX_SLOTS] =
    [const { [AtomicU64::new(0), AtomicU64::new(0)] }; MAX_SLOTS];

const PT_DYNAMIC: u32 = 2;
const DT_NULL: i64 = 0;
const DT_PLTRELSZ: i64 = 2;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_RELA: i64 = 7;
const DT_RELASZ: i64 = 8;
const DT_STRSZ: i64 = 10;
const DT_JMPREL: i64 = 23;
const R_X86_64_GLOB_DAT: u64 = 6;
const R_X86_64_JUMP_SLOT: u64 = 7;

/// `sigaction` for a program whose calls the agent was injected under:
/// `SIGTRAP` is the kept action (see `progtrap`), every other signal
/// glibc's.
///
/// # Safety
/// As glibc's `sigaction`.
pub unsafe extern "C" fn injected_sigaction(
    sig: libc::c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> libc::c_int {
    if sig == libc::SIGTRAP && crate::orphan::installed() {
        // SAFETY: the caller's arguments.
        return unsafe { crate::orphan::program_sigtrap_action(act, old) };
    }
    // SAFETY: the caller's arguments, as glibc takes them.
    unsafe { crate::orphan::glibc_sigaction(sig, act, old) }
}

/// `signal` for a program whose calls the agent was injected under (see
/// [`injected_sigaction`]).
///
/// # Safety
/// As glibc's `signal`.
pub unsafe extern "C" fn injected_signal(
    sig: libc::c_int,
    h: libc::sighandler_t,
) -> libc::sighandler_t {
    if sig == libc::SIGTRAP && crate::orphan::installed() {
        return crate::orphan::program_sigtrap_signal(h);
    }
    // SAFETY: the caller's arguments.
    unsafe { crate::orphan::glibc_signal(sig, h) }
}

/// Whether the program's lookups find the agent's `sigaction` (it was
/// preloaded): then nothing is bound. Told by the object the global
/// lookup's answer lies in (the agent's own references to its exported
/// names resolve through that lookup too: an address compare would say
/// yes either way).
fn preloaded() -> bool {
    crate::threads::as_own_call(|| {
        // SAFETY: a NUL-terminated name; RTLD_DEFAULT is the global scope;
        // dladdr fills the zeroed infos.
        unsafe {
            let f = libc::dlsym(libc::RTLD_DEFAULT, c"sigaction".as_ptr());
            let mut found: libc::Dl_info = core::mem::zeroed();
            let mut agent: libc::Dl_info = core::mem::zeroed();
            !f.is_null()
                && libc::dladdr(f, &mut found) != 0
                && libc::dladdr(bind as *const () as *const libc::c_void, &mut agent) != 0
                && found.dli_fbase == agent.dli_fbase
        }
    })
}

/// Binds the agent's entries into every slot for `sigaction` and `signal`
/// (see the module docs). Called at attach, every other thread stopped.
pub(crate) fn bind() {
    if preloaded() || SLOTS.iter().any(|s| s[0].load(Relaxed) != 0) {
        return;
    }
    let Some(mem) = crate::undo::open_self_mem(libc::O_RDWR) else {
        return;
    };
    let mut ctx = Ctx { mem, next: 0 };
    // SAFETY: the callback reads the loader's list of objects, as
    // `dl_iterate_phdr` hands it.
    crate::threads::as_own_call(|| unsafe {
        libc::dl_iterate_phdr(Some(each_object), &mut ctx as *mut Ctx as *mut libc::c_void)
    });
    crate::orphan::syscall(libc::SYS_close, [mem, 0, 0, 0]);
}

/// Puts glibc's values back into the slots [`bind`] wrote, where they
/// still hold the agent's (at release, every other thread stopped).
pub(crate) fn unbind() {
    let Some(mem) = crate::undo::open_self_mem(libc::O_RDWR) else {
        return;
    };
    let ours = [
        injected_sigaction as *const () as usize as u64,
        injected_signal as *const () as usize as u64,
    ];
    for s in &SLOTS {
        let (slot, glibc) = (s[0].swap(0, Relaxed), s[1].load(Relaxed));
        if slot != 0 && read_word(mem, slot).is_some_and(|v| ours.contains(&v)) {
            write_word(mem, slot, glibc);
        }
    }
    crate::orphan::syscall(libc::SYS_close, [mem, 0, 0, 0]);
}

struct Ctx {
    mem: u64,
    next: usize,
}

fn read_word(mem: u64, at: u64) -> Option<u64> {
    let mut v = 0u64;
    let n = crate::orphan::syscall(libc::SYS_pread64, [mem, &mut v as *mut u64 as u64, 8, at]);
    (n == 8).then_some(v)
}

fn write_word(mem: u64, at: u64, v: u64) -> bool {
    crate::orphan::syscall(libc::SYS_pwrite64, [mem, &v as *const u64 as u64, 8, at]) == 8
}

/// Whether an object named `name` is left alone: libc (glibc's own
/// calls), the loader, the vDSO, the agent.
fn skipped(name: &[u8]) -> bool {
    let base = match name.iter().rposition(|&b| b == b'/') {
        Some(i) => &name[i + 1..],
        None => name,
    };
    base.starts_with(b"libc.so")
        || base.starts_with(b"libc-")
        || base.starts_with(b"ld-linux")
        || base.starts_with(b"linux-vdso")
        || name.windows(14).any(|w| w == b"hotprobe_agent")
}

/// A dynamic-section address: absolute once the loader relocated it,
/// else relative to `base`.
fn abs(base: u64, v: u64) -> u64 {
    if v < base {
        base.wrapping_add(v)
    } else {
        v
    }
}

unsafe extern "C" fn each_object(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: the loader passes a valid info and our context.
    let (info, ctx) = unsafe { (&*info, &mut *(data as *mut Ctx)) };
    let name: &[u8] = if info.dlpi_name.is_null() {
        b""
    } else {
        // SAFETY: a NUL-terminated name of the loader's.
        unsafe { core::ffi::CStr::from_ptr(info.dlpi_name) }.to_bytes()
    };
    if skipped(name) || info.dlpi_phdr.is_null() {
        return 0;
    }
    let base = info.dlpi_addr;
    // SAFETY: dlpi_phnum program headers at dlpi_phdr.
    let phdrs = unsafe { core::slice::from_raw_parts(info.dlpi_phdr, info.dlpi_phnum as usize) };
    let Some(dynamic) = phdrs.iter().find(|p| p.p_type == PT_DYNAMIC) else {
        return 0;
    };
    let mut at = base.wrapping_add(dynamic.p_vaddr);
    let (mut strtab, mut strsz, mut symtab) = (0u64, 0u64, 0u64);
    let (mut rela, mut relasz, mut jmprel, mut pltrelsz) = (0u64, 0u64, 0u64, 0u64);
    for _ in 0..512 {
        let (Some(tag), Some(val)) = (read_word(ctx.mem, at), read_word(ctx.mem, at + 8)) else {
            return 0;
        };
        match tag as i64 {
            DT_NULL => break,
            DT_STRTAB => strtab = abs(base, val),
            DT_STRSZ => strsz = val,
            DT_SYMTAB => symtab = abs(base, val),
            DT_RELA => rela = abs(base, val),
            DT_RELASZ => relasz = val,
            DT_JMPREL => jmprel = abs(base, val),
            DT_PLTRELSZ => pltrelsz = val,
            _ => {}
        }
        at += 16;
    }
    if strtab == 0 || symtab == 0 {
        return 0;
    }
    for (table, size) in [(jmprel, pltrelsz), (rela, relasz)] {
        if table == 0 {
            continue;
        }
        for i in 0..(size / 24).min(1 << 20) {
            let r = table + i * 24;
            let (Some(offset), Some(rinfo)) = (read_word(ctx.mem, r), read_word(ctx.mem, r + 8))
            else {
                break;
            };
            let kind = rinfo & 0xffff_ffff;
            if kind != R_X86_64_JUMP_SLOT && kind != R_X86_64_GLOB_DAT {
                continue;
            }
            let sym = symtab + (rinfo >> 32) * 24;
            let Some(st_name) = read_word(ctx.mem, sym).map(|w| w & 0xffff_ffff) else {
                continue;
            };
            let ours = match symbol_name(ctx.mem, strtab, strsz, st_name) {
                Some(Wanted::Sigaction) => injected_sigaction as *const () as usize as u64,
                Some(Wanted::Signal) => injected_signal as *const () as usize as u64,
                None => continue,
            };
            let slot = base.wrapping_add(offset);
            let Some(glibc) = read_word(ctx.mem, slot) else {
                continue;
            };
            if ctx.next >= MAX_SLOTS || glibc == ours || glibc == 0 {
                continue;
            }
            if write_word(ctx.mem, slot, ours) {
                SLOTS[ctx.next][1].store(glibc, Relaxed);
                SLOTS[ctx.next][0].store(slot, Relaxed);
                ctx.next += 1;
            }
        }
    }
    0
}

enum Wanted {
    Sigaction,
    Signal,
}

/// Whether the string at `strtab + off` is `sigaction` or `signal`.
fn symbol_name(mem: u64, strtab: u64, strsz: u64, off: u64) -> Option<Wanted> {
    if strsz != 0 && off >= strsz {
        return None;
    }
    let mut b = [0u8; 11];
    let n = crate::orphan::syscall(
        libc::SYS_pread64,
        [mem, b.as_mut_ptr() as u64, b.len() as u64, strtab + off],
    ) as i64;
    if n < 7 {
        return None;
    }
    if b.starts_with(b"sigaction\0") {
        Some(Wanted::Sigaction)
    } else if b.starts_with(b"signal\0") {
        Some(Wanted::Signal)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libc_the_loader_and_the_agent_are_left_alone() {
        assert!(skipped(b"/usr/lib/x86_64-linux-gnu/libc.so.6"));
        assert!(skipped(b"/lib64/ld-linux-x86-64.so.2"));
        assert!(skipped(b"linux-vdso.so.1"));
        assert!(skipped(b"/memfd:libhotprobe_agent.so (deleted)"));
        assert!(!skipped(b""));
        assert!(!skipped(b"/usr/lib/libcrypt.so.1"));
    }

    #[test]
    fn dynamic_addresses_are_made_absolute() {
        assert_eq!(abs(0x5555_0000_0000, 0x3000), 0x5555_0000_3000);
        assert_eq!(abs(0x5555_0000_0000, 0x5555_0000_3000), 0x5555_0000_3000);
        assert_eq!(abs(0, 0x403000), 0x403000);
    }
}
