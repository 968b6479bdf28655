//! A remote system call that a tracer killed in its midst does not leave
//! half done (issue 22 item 3): the thread's own state waits for it on its
//! stack as a signal frame.
//!
//! A remote system call borrows a thread's registers: `rip` at a `syscall`
//! instruction of the target's, the number and arguments in the argument
//! registers. A tracer SIGKILLed between lending them and giving the
//! thread's back (the kernel then lets the thread run on untraced) used to
//! leave it running on from that `syscall` with the borrowed registers:
//! whatever code followed in the vDSO ran with them, and the program died.
//!
//! So, where the target's code has what it takes (glibc's and its loader's
//! have it), the call runs from a `syscall; ret` sequence, with the stack
//! pointer at a frame written below the red zone, as the kernel writes one
//! for a signal handler: its return address is a sigreturn sequence
//! (`mov $15, %rax; syscall`, glibc's `__restore_rt`), then a `ucontext`
//! holding every general register the thread had (with an interrupted
//! system call set up to restart, [`resume_context`]), its signal mask and
//! its whole extended state (`NT_X86_XSTATE`, in the signal frame's
//! format). While the tracer lives, nothing changes: it stops the thread
//! right after the `syscall` and sets its registers back itself. Should it
//! die first, the thread returns from the call into `rt_sigreturn`, which
//! puts back exactly what it had. The altstack field is left invalid, so
//! that `rt_sigreturn` leaves the thread's altstack as it is.
//!
//! Written by hand: no crate builds a signal frame for another process.
//! The frame takes about 3 KiB of the thread's stack, 2 KiB below the red
//! zone (the callers' buffers go there), where any signal delivered then
//! would have written its own frame.

use crate::remote_resumable::resume_context;
use crate::sys::{regs_from_user, regs_to_user};

/// `syscall; ret`.
pub(crate) const SYSCALL_RET: [u8; 3] = [0x0f, 0x05, 0xc3];
/// The sigreturn sequences the frame's return address may name: glibc's
/// `__restore_rt` (`mov $15, %rax; syscall`), or the 5-byte `mov $15,
/// %eax` form.
pub(crate) const SIGRETURNS: [&[u8]; 2] = [
    &[0x48, 0xc7, 0xc0, 0x0f, 0, 0, 0, 0x0f, 0x05],
    &[0xb8, 0x0f, 0, 0, 0, 0x0f, 0x05],
];

/// The code a remote function call returns into (`remote_call.rs`), in
/// a page of its own: `mov %rax, %rdi` (the result, where the tracer reads
/// it at the next stop), then a sigreturn sequence (`mov $15, %eax;
/// syscall`). The function's `ret` leaves the stack pointer just past the
/// frame's first word, where `rt_sigreturn` wants it.
pub(crate) const RETURN_STUB: [u8; 10] = [0x48, 0x89, 0xc7, 0xb8, 0x0f, 0, 0, 0, 0x0f, 0x05];

/// The red zone and, below it, the room callers of remote system calls
/// write their buffers into (`sigtrap.rs`: a `sigaction` at `rsp - 512`
/// and `rsp - 640`): the frame stays below both.
const RED_ZONE: u64 = 128;
const CALLERS_ROOM: u64 = 2048;
/// `struct rt_sigframe`: the return address, the `ucontext` (304 bytes),
/// the `siginfo` (128, unread by `rt_sigreturn` but in the frame's size).
const FRAME_BYTES: usize = 8 + 304 + 128;
/// Where the extended state starts in the frame (64-byte aligned, as
/// `xrstor` wants).
const FPSTATE_AT: usize = 448;
const _: () = assert!(FRAME_BYTES <= FPSTATE_AT);
/// `ucontext` offsets from the frame's start.
const UC_FLAGS: usize = 8;
const UC_STACK_FLAGS: usize = 8 + 24;
const UC_MCONTEXT: usize = 8 + 40;
const UC_SIGMASK: usize = 8 + 296;
/// `uc_flags`: `UC_FP_XSTATE | UC_SIGCONTEXT_SS | UC_STRICT_RESTORE_SS`.
const UC_FLAGS_VALUE: u64 = 1 | 2 | 4;
/// An `ss_flags` that is neither 0, `SS_ONSTACK` nor `SS_DISABLE`:
/// `rt_sigreturn`'s `sigaltstack` fails on it (its error is ignored), so
/// the thread's altstack stays as it is.
const ALTSTACK_LEFT_ALONE: u32 = 3;
/// `FP_XSTATE_MAGIC1` in the legacy area's software bytes (offset 464),
/// `FP_XSTATE_MAGIC2` just past the state.
const FP_XSTATE_MAGIC1: u32 = 0x4650_5853;
const FP_XSTATE_MAGIC2: u32 = 0x4650_5845;
/// The software bytes: where `NT_X86_XSTATE` puts XCR0 (the features
/// enabled), where a signal frame says what it holds.
const SW_BYTES_AT: usize = 464;
/// The legacy area and the XSAVE header.
const XSAVE_MIN: usize = 512 + 64;
/// AMX's tile configuration and data (features 17 and 18): left out of
/// the frame (8 KiB more, and a thread the kernel did not permit AMX
/// has no room for them in its signal state). A tracer's death puts them
/// back to their initial state, on a thread that used AMX.
const AMX_FEATURES: u64 = 3 << 17;

/// The length of the standard-format XSAVE area holding `features`:
/// past the end of the last one (`cpuid` leaf 0xd gives each component's
/// offset and size), at least the legacy area and the header.
fn xsave_len(features: u64) -> usize {
    (2..64)
        .filter(|i| features & (1 << i) != 0)
        .map(|i| {
            // Leaf 0xd is there wherever XSAVE is (the kernel gave an
            // XSAVE state).
            let c = core::arch::x86_64::__cpuid_count(0xd, i);
            c.ebx as usize + c.eax as usize
        })
        .fold(XSAVE_MIN, usize::max)
}
/// A frame to write at `at`; the borrowed stack pointer is `at` (its first
/// word, the return address of the `syscall; ret`, or of the function a
/// remote call runs).
#[derive(Debug)]
pub(crate) struct SignalFrame {
    /// Where it goes, below the red zone of the thread: 64-byte aligned,
    /// or 8 below that for a function call ([`FrameFor::Call`]).
    pub(crate) at: u64,
    /// Its bytes.
    pub(crate) bytes: Vec<u8>,
}

/// What the stack pointer at a frame's start is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FrameFor {
    /// A `syscall; ret`: the frame 64-byte aligned.
    Syscall,
    /// A function's first instruction, the frame's first word its return
    /// address: the frame starts 8 below a 16-byte boundary, as the ABI
    /// wants a function's stack pointer at its entry.
    Call,
}

/// The frame that gives a thread stopped with `regs` (blocking `blocked`,
/// with extended state `xstate` as `PTRACE_GETREGSET` gave it) its state
/// back by `rt_sigreturn` from `sigreturn`, an address of one of
/// [`SIGRETURNS`] (or of code ending in one, [`RETURN_STUB`]). None when
/// the extended state is not one (shorter than the features XCR0 names,
/// or without x87/SSE), or the stack pointer leaves no room.
pub(crate) fn signal_frame(
    regs: &libc::user_regs_struct,
    xstate: &[u8],
    blocked: u64,
    sigreturn: u64,
    used_by: FrameFor,
) -> Option<SignalFrame> {
    // NT_X86_XSTATE: the standard-format XSAVE area, XCR0 in the
    // software bytes. The frame's copy says in those bytes what it holds,
    // as the kernel's signal frames do (else `rt_sigreturn` restores the
    // x87/SSE state alone, and the AVX registers' upper halves are lost).
    let xcr0 = u64::from_le_bytes(xstate.get(SW_BYTES_AT..SW_BYTES_AT + 8)?.try_into().ok()?);
    let features = xcr0 & !AMX_FEATURES;
    let xlen = xsave_len(features);
    if xcr0 & 3 != 3 || xlen > xstate.len() {
        return None;
    }
    // A call's frame starts 8 below the 64-byte boundary; its extended
    // state stays 64-byte aligned.
    let skew = match used_by {
        FrameFor::Syscall => 0,
        FrameFor::Call => 8,
    };
    let fpstate_at = FPSTATE_AT + skew;
    let total = fpstate_at + xlen + 4;
    let at = (regs
        .rsp
        .checked_sub(RED_ZONE + CALLERS_ROOM + total as u64)?
        .checked_sub(63)?
        & !63)
        .checked_sub(skew as u64)?;
    let resume = regs_to_user(&resume_context(&regs_from_user(regs)));
    let mut b = vec![0u8; total];
    let mut put = |off: usize, v: u64| b[off..off + 8].copy_from_slice(&v.to_le_bytes());
    put(0, sigreturn);
    put(UC_FLAGS, UC_FLAGS_VALUE);
    put(UC_STACK_FLAGS, u64::from(ALTSTACK_LEFT_ALONE));
    // struct sigcontext: r8…r15, rdi, rsi, rbp, rbx, rdx, rax, rcx, rsp,
    // rip, eflags, then cs, gs, fs, ss (16 bits each).
    let r = &resume;
    let gregs = [
        r.r8, r.r9, r.r10, r.r11, r.r12, r.r13, r.r14, r.r15, r.rdi, r.rsi, r.rbp, r.rbx, r.rdx,
        r.rax, r.rcx, r.rsp, r.rip, r.eflags,
    ];
    for (i, v) in gregs.into_iter().enumerate() {
        put(UC_MCONTEXT + 8 * i, v);
    }
    let segments = (r.cs & 0xffff) | (r.ss & 0xffff) << 48;
    put(UC_MCONTEXT + 144, segments);
    // fpstate, then the mask.
    put(UC_MCONTEXT + 184, at + fpstate_at as u64);
    put(UC_SIGMASK, blocked);
    b[fpstate_at..fpstate_at + xlen].copy_from_slice(&xstate[..xlen]);
    // struct _fpx_sw_bytes: magic1, extended size, features, size.
    let sw = fpstate_at + SW_BYTES_AT;
    b[sw..sw + 48].fill(0);
    b[sw..sw + 4].copy_from_slice(&FP_XSTATE_MAGIC1.to_le_bytes());
    b[sw + 4..sw + 8].copy_from_slice(&(xlen as u32 + 4).to_le_bytes());
    b[sw + 8..sw + 16].copy_from_slice(&features.to_le_bytes());
    b[sw + 16..sw + 20].copy_from_slice(&(xlen as u32).to_le_bytes());
    b[fpstate_at + xlen..].copy_from_slice(&FP_XSTATE_MAGIC2.to_le_bytes());
    Some(SignalFrame { at, bytes: b })
}

/// The first offset of `pattern` in `code` that `usable` accepts.
pub(crate) fn find(code: &[u8], pattern: &[u8], usable: impl Fn(usize) -> bool) -> Option<usize> {
    code.windows(pattern.len())
        .enumerate()
        .find(|(i, w)| *w == pattern && usable(*i))
        .map(|(i, _)| i)
}
