//! The raw system calls behind the process target's OS layer (ptrace,
//! waitpid, tgkill, kill): [`crate::ptrace::RealOs`] makes them, and the target
//! itself calls only [`crate::ptrace::Sys`] (which tests give a scripted fake).
//! Each returns a [`SysError`] naming the call and the errno. Public for
//! tests that drive a tracee by hand.
//!
//! Written on raw `libc` rather than nix because ptrace must pass every
//! signal number through untouched, realtime signals included, which nix's
//! `Signal` enum cannot represent.

use std::io;

/// A failed system call: which call, for which pid/tid, and the OS error.
#[derive(Debug, thiserror::Error)]
#[error("{call} on {pid}: {source}")]
pub struct SysError {
    /// The call, e.g. `ptrace(PTRACE_GETREGS)`.
    pub call: &'static str,
    /// The pid or tid it was made for.
    pub pid: i32,
    /// The OS error.
    pub source: io::Error,
}

impl SysError {
    fn last(call: &'static str, pid: i32) -> Self {
        SysError {
            call,
            pid,
            source: io::Error::last_os_error(),
        }
    }

    /// The errno, if any.
    pub fn errno(&self) -> i32 {
        self.source.raw_os_error().unwrap_or(0)
    }
}

/// `ptrace(2)` with a request, an address and a data word.
fn ptrace(
    call: &'static str,
    req: libc::c_uint,
    pid: i32,
    addr: usize,
    data: usize,
) -> Result<libc::c_long, SysError> {
    // SAFETY: ptrace with the given request; callers pass addr/data that are
    // either plain integers or pointers to live, correctly sized buffers.
    let r = unsafe {
        libc::ptrace(
            req,
            pid,
            addr as *mut libc::c_void,
            data as *mut libc::c_void,
        )
    };
    if r == -1 {
        let e = io::Error::last_os_error();
        if e.raw_os_error().unwrap_or(0) != 0 {
            return Err(SysError {
                call,
                pid,
                source: e,
            });
        }
    }
    Ok(r)
}

/// PTRACE_SEIZE with options.
pub fn seize(pid: i32, options: i32) -> Result<(), SysError> {
    ptrace(
        "ptrace(PTRACE_SEIZE)",
        libc::PTRACE_SEIZE,
        pid,
        0,
        options as usize,
    )
    .map(drop)
}

/// PTRACE_INTERRUPT: stop a seized thread (reported as a PTRACE_EVENT_STOP).
pub fn interrupt(pid: i32) -> Result<(), SysError> {
    ptrace(
        "ptrace(PTRACE_INTERRUPT)",
        libc::PTRACE_INTERRUPT,
        pid,
        0,
        0,
    )
    .map(drop)
}

/// PTRACE_CONT, delivering `sig` (0 for none).
pub fn cont(pid: i32, sig: i32) -> Result<(), SysError> {
    ptrace(
        "ptrace(PTRACE_CONT)",
        libc::PTRACE_CONT,
        pid,
        0,
        sig as usize,
    )
    .map(drop)
}

/// PTRACE_SINGLESTEP, delivering `sig` (0 for none).
pub fn step(pid: i32, sig: i32) -> Result<(), SysError> {
    ptrace(
        "ptrace(PTRACE_SINGLESTEP)",
        libc::PTRACE_SINGLESTEP,
        pid,
        0,
        sig as usize,
    )
    .map(drop)
}

/// PTRACE_SYSCALL, delivering `sig` (0 for none): the thread runs to its
/// next system-call entry or exit stop (no trap signal of the kernel's).
pub fn syscall_resume(pid: i32, sig: i32) -> Result<(), SysError> {
    ptrace(
        "ptrace(PTRACE_SYSCALL)",
        libc::PTRACE_SYSCALL,
        pid,
        0,
        sig as usize,
    )
    .map(drop)
}

/// PTRACE_GETSIGMASK: the thread's blocked-signal mask (the kernel's
/// 8-byte set, bit `sig - 1`).
pub fn getsigmask(pid: i32) -> Result<u64, SysError> {
    let mut mask = 0u64;
    ptrace(
        "ptrace(PTRACE_GETSIGMASK)",
        0x420a,
        pid,
        8,
        &mut mask as *mut u64 as usize,
    )?;
    Ok(mask)
}

/// PTRACE_SETSIGMASK: sets the thread's blocked-signal mask.
pub fn setsigmask(pid: i32, mask: u64) -> Result<(), SysError> {
    ptrace(
        "ptrace(PTRACE_SETSIGMASK)",
        0x420b,
        pid,
        8,
        &mask as *const u64 as usize,
    )
    .map(drop)
}

/// PTRACE_LISTEN: leave a thread in group-stop while still being notified.
pub fn listen(pid: i32) -> Result<(), SysError> {
    ptrace("ptrace(PTRACE_LISTEN)", libc::PTRACE_LISTEN, pid, 0, 0).map(drop)
}

/// PTRACE_DETACH, delivering `sig` (0 for none).
pub fn detach(pid: i32, sig: i32) -> Result<(), SysError> {
    ptrace(
        "ptrace(PTRACE_DETACH)",
        libc::PTRACE_DETACH,
        pid,
        0,
        sig as usize,
    )
    .map(drop)
}

/// PTRACE_GETEVENTMSG (new tid/pid for clone/fork events).
pub fn geteventmsg(pid: i32) -> Result<u64, SysError> {
    let mut msg: libc::c_ulong = 0;
    ptrace(
        "ptrace(PTRACE_GETEVENTMSG)",
        libc::PTRACE_GETEVENTMSG,
        pid,
        0,
        &mut msg as *mut libc::c_ulong as usize,
    )?;
    Ok(msg)
}

/// PTRACE_GETSIGINFO.
pub fn getsiginfo(pid: i32) -> Result<libc::siginfo_t, SysError> {
    // SAFETY: siginfo_t is plain old data; all-zero is a valid value.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    ptrace(
        "ptrace(PTRACE_GETSIGINFO)",
        libc::PTRACE_GETSIGINFO,
        pid,
        0,
        &mut info as *mut libc::siginfo_t as usize,
    )?;
    Ok(info)
}

/// PTRACE_GETREGS.
pub fn getregs(pid: i32) -> Result<libc::user_regs_struct, SysError> {
    // SAFETY: user_regs_struct is plain old data; all-zero is a valid value.
    let mut regs: libc::user_regs_struct = unsafe { std::mem::zeroed() };
    ptrace(
        "ptrace(PTRACE_GETREGS)",
        libc::PTRACE_GETREGS,
        pid,
        0,
        &mut regs as *mut libc::user_regs_struct as usize,
    )?;
    Ok(regs)
}

/// PTRACE_GETFPREGS: the low 64 bits of xmm0–xmm15.
pub fn getxmm(pid: i32) -> Result<[u64; 16], SysError> {
    // SAFETY: user_fpregs_struct is plain old data; all-zero is a valid value.
    let mut fp: libc::user_fpregs_struct = unsafe { std::mem::zeroed() };
    ptrace(
        "ptrace(PTRACE_GETFPREGS)",
        libc::PTRACE_GETFPREGS,
        pid,
        0,
        &mut fp as *mut libc::user_fpregs_struct as usize,
    )?;
    let mut out = [0u64; 16];
    for (i, o) in out.iter_mut().enumerate() {
        // xmm_space: 16 registers of four u32 words, low word first.
        *o = u64::from(fp.xmm_space[4 * i]) | (u64::from(fp.xmm_space[4 * i + 1]) << 32);
    }
    Ok(out)
}

/// PTRACE_GETFPREGS: the whole x87/SSE state.
pub fn getfpregs(pid: i32) -> Result<libc::user_fpregs_struct, SysError> {
    // SAFETY: user_fpregs_struct is plain old data; all-zero is a valid value.
    let mut fp: libc::user_fpregs_struct = unsafe { std::mem::zeroed() };
    ptrace(
        "ptrace(PTRACE_GETFPREGS)",
        libc::PTRACE_GETFPREGS,
        pid,
        0,
        &mut fp as *mut libc::user_fpregs_struct as usize,
    )?;
    Ok(fp)
}

/// `NT_X86_XSTATE`: the regset of the whole extended state (x87, SSE,
/// the upper halves of the AVX registers, AVX-512, PKRU…).
const NT_X86_XSTATE: usize = 0x202;

/// Room for the extended state: its size is the processor's (`cpuid`
/// leaf 0xd), 2.7 KiB with AVX-512, more with AMX.
const XSTATE_ROOM: usize = 16 * 1024;

/// PTRACE_GETREGSET of `NT_X86_XSTATE`: the thread's whole extended
/// state, as long as the kernel says it is.
pub fn getxstate(pid: i32) -> Result<Vec<u8>, SysError> {
    let mut buf = vec![0u8; XSTATE_ROOM];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    ptrace(
        "ptrace(PTRACE_GETREGSET, NT_X86_XSTATE)",
        libc::PTRACE_GETREGSET,
        pid,
        NT_X86_XSTATE,
        &mut iov as *mut libc::iovec as usize,
    )?;
    buf.truncate(iov.iov_len);
    Ok(buf)
}

/// PTRACE_SETREGSET of `NT_X86_XSTATE` with a state [`getxstate`] read.
pub fn setxstate(pid: i32, state: &[u8]) -> Result<(), SysError> {
    let mut iov = libc::iovec {
        iov_base: state.as_ptr() as *mut libc::c_void,
        iov_len: state.len(),
    };
    ptrace(
        "ptrace(PTRACE_SETREGSET, NT_X86_XSTATE)",
        libc::PTRACE_SETREGSET,
        pid,
        NT_X86_XSTATE,
        &mut iov as *mut libc::iovec as usize,
    )
    .map(drop)
}

/// PTRACE_SETFPREGS.
pub fn setfpregs(pid: i32, fp: &libc::user_fpregs_struct) -> Result<(), SysError> {
    ptrace(
        "ptrace(PTRACE_SETFPREGS)",
        libc::PTRACE_SETFPREGS,
        pid,
        0,
        fp as *const libc::user_fpregs_struct as usize,
    )
    .map(drop)
}

/// PTRACE_SETREGS.
pub fn setregs(pid: i32, regs: &libc::user_regs_struct) -> Result<(), SysError> {
    ptrace(
        "ptrace(PTRACE_SETREGS)",
        libc::PTRACE_SETREGS,
        pid,
        0,
        regs as *const libc::user_regs_struct as usize,
    )
    .map(drop)
}

/// PTRACE_SETOPTIONS.
pub fn setoptions(pid: i32, options: i32) -> Result<(), SysError> {
    ptrace(
        "ptrace(PTRACE_SETOPTIONS)",
        libc::PTRACE_SETOPTIONS,
        pid,
        0,
        options as usize,
    )
    .map(drop)
}

/// `waitpid(pid, __WALL | extra)`: `Ok(None)` when WNOHANG found nothing.
/// Async-signal-safe (no allocation, no lock: the error is the errno), so
/// a signal handler may reap a child with it.
pub fn waitpid(pid: i32, extra_flags: i32) -> Result<Option<(i32, i32)>, SysError> {
    let mut status = 0;
    // SAFETY: status is a valid out pointer.
    let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL | extra_flags) };
    if r == -1 {
        return Err(SysError::last("waitpid", pid));
    }
    if r == 0 {
        return Ok(None);
    }
    Ok(Some((r, status)))
}

thread_local! {
    /// A `Sys::waitpid_restart` of this thread retried past a signal since
    /// [`take_deferred_interrupt`] last looked.
    static DEFERRED_EINTR: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Notes that a blocking wait of this thread retried past a signal
/// (`Sys::waitpid_restart`, [`waitpid_restart`]): its next main wait
/// returns at once.
pub fn defer_interrupt() {
    DEFERRED_EINTR.with(|d| d.set(true));
}

/// [`waitpid`] retried when a signal interrupts it, the interruption
/// kept for the thread's next main wait (see `Sys::waitpid_restart`, the
/// same through the OS layer).
pub fn waitpid_restart(pid: i32, extra_flags: i32) -> Result<Option<(i32, i32)>, SysError> {
    loop {
        match waitpid(pid, extra_flags) {
            Err(e) if e.errno() == libc::EINTR => defer_interrupt(),
            r => return r,
        }
    }
}

/// Whether a `Sys::waitpid_restart` of this thread retried past a signal
/// since the last call (the flag is cleared).
pub fn take_deferred_interrupt() -> bool {
    DEFERRED_EINTR.with(|d| d.replace(false))
}

/// [`take_deferred_interrupt`] without clearing the flag.
pub fn deferred_interrupt() -> bool {
    DEFERRED_EINTR.with(|d| d.get())
}

/// `tgkill(tgid, tid, sig)`.
pub fn tgkill(tgid: i32, tid: i32, sig: i32) -> Result<(), SysError> {
    // SAFETY: plain syscall with integer arguments.
    let r = unsafe { libc::syscall(libc::SYS_tgkill, tgid, tid, sig) };
    if r == -1 {
        return Err(SysError::last("tgkill", tid));
    }
    Ok(())
}

/// `kill(pid, sig)`.
pub fn kill(pid: i32, sig: i32) -> Result<(), SysError> {
    // SAFETY: plain syscall with integer arguments.
    if unsafe { libc::kill(pid, sig) } == -1 {
        return Err(SysError::last("kill", pid));
    }
    Ok(())
}

/// Convert kernel registers to the engine's register file.
pub fn regs_from_user(r: &libc::user_regs_struct) -> hotprobe_target::Registers {
    hotprobe_target::Registers {
        rax: r.rax,
        rbx: r.rbx,
        rcx: r.rcx,
        rdx: r.rdx,
        rsi: r.rsi,
        rdi: r.rdi,
        rbp: r.rbp,
        rsp: r.rsp,
        r8: r.r8,
        r9: r.r9,
        r10: r.r10,
        r11: r.r11,
        r12: r.r12,
        r13: r.r13,
        r14: r.r14,
        r15: r.r15,
        rip: r.rip,
        rflags: r.eflags,
        cs: r.cs,
        ss: r.ss,
        ds: r.ds,
        es: r.es,
        fs: r.fs,
        gs: r.gs,
        fs_base: r.fs_base,
        gs_base: r.gs_base,
        orig_rax: r.orig_rax,
        cr3: 0,
    }
}

/// Convert the engine's register file back to kernel registers.
pub fn regs_to_user(r: &hotprobe_target::Registers) -> libc::user_regs_struct {
    libc::user_regs_struct {
        r15: r.r15,
        r14: r.r14,
        r13: r.r13,
        r12: r.r12,
        rbp: r.rbp,
        rbx: r.rbx,
        r11: r.r11,
        r10: r.r10,
        r9: r.r9,
        r8: r.r8,
        rax: r.rax,
        rcx: r.rcx,
        rdx: r.rdx,
        rsi: r.rsi,
        rdi: r.rdi,
        orig_rax: r.orig_rax,
        rip: r.rip,
        cs: r.cs,
        eflags: r.rflags,
        rsp: r.rsp,
        ss: r.ss,
        fs_base: r.fs_base,
        gs_base: r.gs_base,
        ds: r.ds,
        es: r.es,
        fs: r.fs,
        gs: r.gs,
    }
}

/// Byte offset of debug register `n` (0..=7) in `struct user`
/// (`offsetof(struct user, u_debugreg[n])`), for PTRACE_PEEKUSER/POKEUSER.
pub fn debugreg_offset(n: usize) -> usize {
    std::mem::offset_of!(libc::user, u_debugreg) + n * std::mem::size_of::<u64>()
}

/// PTRACE_PEEKUSER of debug register `n` (DR0–DR3, DR6, DR7).
pub fn get_debugreg(pid: i32, n: usize) -> Result<u64, SysError> {
    // SAFETY: errno is thread-local; PEEKUSER returns the word, so a -1
    // result is an error only if errno was set by this very call.
    unsafe { *libc::__errno_location() = 0 };
    ptrace(
        "ptrace(PTRACE_PEEKUSER, u_debugreg)",
        libc::PTRACE_PEEKUSER,
        pid,
        debugreg_offset(n),
        0,
    )
    .map(|v| v as u64)
}

/// PTRACE_POKEUSER of debug register `n` (DR0–DR3, DR6, DR7).
pub fn set_debugreg(pid: i32, n: usize, value: u64) -> Result<(), SysError> {
    ptrace(
        "ptrace(PTRACE_POKEUSER, u_debugreg)",
        libc::PTRACE_POKEUSER,
        pid,
        debugreg_offset(n),
        value as usize,
    )
    .map(|_| ())
}
