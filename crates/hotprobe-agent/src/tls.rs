//! One initial-exec TLS word per thread holding the address of the
//! thread's [`hotprobe_abi::fast::ThreadBlock`] (0 until its first hit).
//!
//! Defined in assembly because Rust has no stable `#[thread_local]`, and
//! `thread_local!` in a cdylib uses the general-dynamic model
//! (`__tls_get_addr`, which may allocate in a `dlopen`ed library). An
//! initial-exec word lives at a fixed offset from the thread pointer for
//! the life of the process; the agent publishes that offset
//! ([`hotprobe_abi::Header::thread_tpoff`]) so that the tracer's per-site
//! stubs read it with one `mov r11, fs:[offset]`. A `dlopen`ed agent takes
//! the 8 bytes from glibc's static TLS surplus.

core::arch::global_asm!(
    ".pushsection .tbss,\"awT\",@nobits",
    ".p2align 3",
    ".globl hotprobe_agent_tls_block",
    ".hidden hotprobe_agent_tls_block",
    ".type hotprobe_agent_tls_block,@object",
    ".size hotprobe_agent_tls_block,8",
    "hotprobe_agent_tls_block:",
    ".zero 8",
    ".popsection",
);

/// The word's offset from the thread pointer (negative under the x86-64
/// TLS variant II, returned as its two's complement).
#[inline(always)]
pub(crate) fn offset() -> u64 {
    let off: u64;
    // SAFETY: loads the GOT entry the dynamic linker filled with the
    // word's thread-pointer offset (R_X86_64_TPOFF64); no other effect.
    unsafe {
        core::arch::asm!(
            "mov {}, qword ptr [rip + hotprobe_agent_tls_block@GOTTPOFF]",
            out(reg) off,
            options(nostack, readonly, preserves_flags)
        )
    };
    off
}

/// Sets the calling thread's word.
#[inline(always)]
pub(crate) fn set(v: u64) {
    let off = offset();
    // SAFETY: fs:[off] is this thread's own static TLS word (allocated by
    // the dynamic linker for every thread, this one included).
    unsafe {
        core::arch::asm!(
            "mov qword ptr fs:[{off}], {v}",
            off = in(reg) off,
            v = in(reg) v,
            options(nostack, preserves_flags)
        )
    };
}

/// The calling thread's word.
#[inline(always)]
pub(crate) fn get() -> u64 {
    let off = offset();
    let v: u64;
    // SAFETY: as for `set`: this thread's own static TLS word.
    unsafe {
        core::arch::asm!(
            "mov {v}, qword ptr fs:[{off}]",
            off = in(reg) off,
            v = out(reg) v,
            options(nostack, readonly, preserves_flags)
        )
    };
    v
}
