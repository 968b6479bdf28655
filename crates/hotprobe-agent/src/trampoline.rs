//! The three trampolines a patched site calls (through a near stub), as
//! naked functions (exported in the dynamic symbol table, unlike
//! `global_asm!` symbols, which the cdylib's version script would hide).
//!
//! Each one: sets up a frame pointer and aligns the stack to 16 bytes, saves
//! the caller-saved general registers (rdi, rsi, rdx, rcx, r8, r9, rax, r10,
//! r11) into a [`Frame`] together with the return address (the site key),
//! calls the Rust fast path, and restores everything before `ret`. The fast
//! path is integer-only code (no vector registers: checked on the release
//! build by the test `fast_path_uses_no_vector_registers`); when it asks for
//! the slow path (a thread's first hit), xmm0–xmm15 are saved too, because
//! the slow path calls into libc. The debug build saves xmm0–xmm15 on every
//! hit, since unoptimised Rust gives no such guarantee.
//!
//! * entry — for function-entry placeholders (patchable entry, fentry,
//!   `__cyg_profile_func_enter`): flags are not saved (a call site or a
//!   function entry has no live flags under the SysV ABI).
//! * exit — for `__cyg_profile_func_exit` placeholders; records rax, rdx.
//! * mid — for mid-function sites reached from a per-site stub that has
//!   already stepped over the red zone (`lea rsp,[rsp-128]`, see
//!   `hotprobe_abi::patch::MID_STUB_ENTER`) *before* its `call`: the call's
//!   push would otherwise clobber the red zone of leaf code. Also saves the
//!   flags (pushfq/popfq) and clears DF for the Rust code.

use hotprobe_abi::{KIND_ENTRY, KIND_EXIT, KIND_HIT};

/// The registers a trampoline saved, as the Rust side sees them.
#[repr(C)]
#[derive(Debug)]
pub struct Frame {
    /// Argument registers rdi, rsi, rdx, rcx, r8, r9 (SysV order).
    pub args: [u64; 6],
    /// rax.
    pub rax: u64,
    /// r10.
    pub r10: u64,
    /// r11.
    pub r11: u64,
    /// The return address the patched call pushed: the site key.
    pub key: u64,
    /// Address of the stack word just above the key: for an entry site at a
    /// function's first instruction, the function's return address slot.
    pub slot: u64,
    /// The low 64 bits of xmm0–xmm5 (float and double arguments; xmm0 is
    /// also a float return value), for sites whose action has an xmm
    /// layout (`hotprobe_abi::ACTION_XMM_SHIFT`). Six `movq` stores per
    /// hit, whatever the action: cheaper than a second path.
    pub xmm: [u64; 6],
}
const _: () = assert!(core::mem::size_of::<Frame>() == 136);

macro_rules! trampoline {
    ($(#[$doc:meta])* $name:ident, $kind:expr, $pre:literal, $post:literal, $keyoff:literal) => {
        $(#[$doc])*
        ///
        /// # Safety
        /// Only to be reached by a `call` from a patched site or stub; never
        /// call it from Rust.
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn $name() {
        core::arch::naked_asm!(
            $pre,
            "push rbp",
            "mov rbp, rsp",
            "and rsp, -16",
            "sub rsp, 144",
            "mov [rsp], rdi",
            "mov [rsp+8], rsi",
            "mov [rsp+16], rdx",
            "mov [rsp+24], rcx",
            "mov [rsp+32], r8",
            "mov [rsp+40], r9",
            "mov [rsp+48], rax",
            "mov [rsp+56], r10",
            "mov [rsp+64], r11",
            concat!("mov rax, [rbp+", $keyoff, "]"),
            "mov [rsp+72], rax",
            concat!("lea rax, [rbp+", $keyoff, "+8]"),
            "mov [rsp+80], rax",
            "movq [rsp+88], xmm0",
            "movq [rsp+96], xmm1",
            "movq [rsp+104], xmm2",
            "movq [rsp+112], xmm3",
            "movq [rsp+120], xmm4",
            "movq [rsp+128], xmm5",
            const_str!(SAVE_XMM_ALWAYS),
            "mov rdi, rsp",
            const_str!(ADJUST_FRAME),
            "mov esi, {kind}",
            "call {fast}",
            "test eax, eax",
            "jnz 2f",
            "1:",
            const_str!(RESTORE_XMM_ALWAYS),
            "mov rdi, [rsp]",
            "mov rsi, [rsp+8]",
            "mov rdx, [rsp+16]",
            "mov rcx, [rsp+24]",
            "mov r8, [rsp+32]",
            "mov r9, [rsp+40]",
            "mov rax, [rsp+48]",
            "mov r10, [rsp+56]",
            "mov r11, [rsp+64]",
            "mov rsp, rbp",
            "pop rbp",
            $post,
            "ret",
            "2:",
            "sub rsp, 256",
            "movups [rsp], xmm0",
            "movups [rsp+16], xmm1",
            "movups [rsp+32], xmm2",
            "movups [rsp+48], xmm3",
            "movups [rsp+64], xmm4",
            "movups [rsp+80], xmm5",
            "movups [rsp+96], xmm6",
            "movups [rsp+112], xmm7",
            "movups [rsp+128], xmm8",
            "movups [rsp+144], xmm9",
            "movups [rsp+160], xmm10",
            "movups [rsp+176], xmm11",
            "movups [rsp+192], xmm12",
            "movups [rsp+208], xmm13",
            "movups [rsp+224], xmm14",
            "movups [rsp+240], xmm15",
            "lea rdi, [rsp+256]",
            const_str!(ADJUST_FRAME),
            "mov esi, {kind}",
            "call {slow}",
            "movups xmm0, [rsp]",
            "movups xmm1, [rsp+16]",
            "movups xmm2, [rsp+32]",
            "movups xmm3, [rsp+48]",
            "movups xmm4, [rsp+64]",
            "movups xmm5, [rsp+80]",
            "movups xmm6, [rsp+96]",
            "movups xmm7, [rsp+112]",
            "movups xmm8, [rsp+128]",
            "movups xmm9, [rsp+144]",
            "movups xmm10, [rsp+160]",
            "movups xmm11, [rsp+176]",
            "movups xmm12, [rsp+192]",
            "movups xmm13, [rsp+208]",
            "movups xmm14, [rsp+224]",
            "movups xmm15, [rsp+240]",
            "add rsp, 256",
            "jmp 1b",
            kind = const $kind as u32,
            fast = sym crate::hit::fast_hit,
            slow = sym crate::hit::slow_hit,
        );
        }
    };
}

// `global_asm!` cannot splice a `const &str`; these tiny macros pick the
// text at expansion time instead.
#[cfg(debug_assertions)]
macro_rules! const_str {
    (SAVE_XMM_ALWAYS) => {
        // Debug build: save xmm0-15 on every hit (unoptimised Rust may use them).
        "sub rsp, 256\nmovups [rsp], xmm0\nmovups [rsp+16], xmm1\nmovups [rsp+32], xmm2\nmovups [rsp+48], xmm3\nmovups [rsp+64], xmm4\nmovups [rsp+80], xmm5\nmovups [rsp+96], xmm6\nmovups [rsp+112], xmm7\nmovups [rsp+128], xmm8\nmovups [rsp+144], xmm9\nmovups [rsp+160], xmm10\nmovups [rsp+176], xmm11\nmovups [rsp+192], xmm12\nmovups [rsp+208], xmm13\nmovups [rsp+224], xmm14\nmovups [rsp+240], xmm15"
    };
    (RESTORE_XMM_ALWAYS) => {
        "movups xmm0, [rsp]\nmovups xmm1, [rsp+16]\nmovups xmm2, [rsp+32]\nmovups xmm3, [rsp+48]\nmovups xmm4, [rsp+64]\nmovups xmm5, [rsp+80]\nmovups xmm6, [rsp+96]\nmovups xmm7, [rsp+112]\nmovups xmm8, [rsp+128]\nmovups xmm9, [rsp+144]\nmovups xmm10, [rsp+160]\nmovups xmm11, [rsp+176]\nmovups xmm12, [rsp+192]\nmovups xmm13, [rsp+208]\nmovups xmm14, [rsp+224]\nmovups xmm15, [rsp+240]\nadd rsp, 256"
    };
    (ADJUST_FRAME) => {
        // rdi must point at the Frame, 256 bytes above the xmm area.
        "add rdi, 256"
    };
}
#[cfg(not(debug_assertions))]
macro_rules! const_str {
    (SAVE_XMM_ALWAYS) => {
        ""
    };
    (RESTORE_XMM_ALWAYS) => {
        ""
    };
    (ADJUST_FRAME) => {
        ""
    };
}

pub(crate) use const_str;

trampoline!(
    /// Entry trampoline: for function-entry placeholders; records rdi..r9.
    hotprobe_agent_entry_trampoline, KIND_ENTRY, "", "", "8"
);
trampoline!(
    /// Exit trampoline: for exit placeholders; records rax and rdx.
    hotprobe_agent_exit_trampoline, KIND_EXIT, "", "", "8"
);
trampoline!(
    /// Mid-function trampoline: reached from a per-site stub that stepped
    /// over the red zone first; saves the flags too.
    hotprobe_agent_mid_trampoline, KIND_HIT, "pushfq\ncld", "popfq", "16"
);

pub use crate::hooked::hotprobe_agent_return_trampoline;

/// Handler trampoline: a patched site or jump trampoline of a probe whose
/// handler runs in the tracer calls it (`call rel32`, through a near stub
/// when out of reach). It saves the whole register file — r8–r15, rdi,
/// rsi, rbp, rbx, rdx, rax, rcx, rsp, rip, rflags: the order of a
/// ucontext's `gregs` and of `hotprobe_abi::HandlerSlot::regs` — with `rsp`
/// as it was before the `call` and `rip` holding the site key (the return
/// address), saves the x87/SSE state (`fxsave64`: the Rust code and the
/// vDSO may use vector registers), calls [`crate::inproc::handler_hit`]
/// (which hands the registers to the tracer through shared memory and
/// waits), then restores every register from the (possibly modified)
/// frame and returns to its `rip` word: the key when the handler left
/// `rip` alone, else where the handler sent the thread. `rsp` is not
/// restored from the frame (a handler's change of it is not carried).
///
/// # Safety
/// Only to be reached by a `call` from a patched site or a jump
/// trampoline; never call it from Rust.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn hotprobe_agent_handler_trampoline() {
    core::arch::naked_asm!(
        // [rsp] = key; frame of 18 words below the pushed flags.
        "pushfq",
        "sub rsp, 144",
        "mov [rsp], r8",
        "mov [rsp+8], r9",
        "mov [rsp+16], r10",
        "mov [rsp+24], r11",
        "mov [rsp+32], r12",
        "mov [rsp+40], r13",
        "mov [rsp+48], r14",
        "mov [rsp+56], r15",
        "mov [rsp+64], rdi",
        "mov [rsp+72], rsi",
        "mov [rsp+80], rbp",
        "mov [rsp+88], rbx",
        "mov [rsp+96], rdx",
        "mov [rsp+104], rax",
        "mov [rsp+112], rcx",
        // rsp before the site's call: above the flags and the key.
        "lea rax, [rsp+160]",
        "mov [rsp+120], rax",
        "mov rax, [rsp+152]",
        "mov [rsp+128], rax",
        "mov rax, [rsp+144]",
        "mov [rsp+136], rax",
        "mov rbp, rsp",
        "and rsp, -16",
        "sub rsp, 512",
        "fxsave64 [rsp]",
        "cld",
        "mov rdi, rbp",
        "call {hit}",
        "fxrstor64 [rsp]",
        "mov rsp, rbp",
        // Flags and the return target from the frame.
        "mov rax, [rsp+136]",
        "mov [rsp+144], rax",
        "mov rax, [rsp+128]",
        "mov [rsp+152], rax",
        "mov r8, [rsp]",
        "mov r9, [rsp+8]",
        "mov r10, [rsp+16]",
        "mov r11, [rsp+24]",
        "mov r12, [rsp+32]",
        "mov r13, [rsp+40]",
        "mov r14, [rsp+48]",
        "mov r15, [rsp+56]",
        "mov rdi, [rsp+64]",
        "mov rsi, [rsp+72]",
        "mov rbp, [rsp+80]",
        "mov rbx, [rsp+88]",
        "mov rdx, [rsp+96]",
        "mov rax, [rsp+104]",
        "mov rcx, [rsp+112]",
        "add rsp, 144",
        "popfq",
        "ret",
        hit = sym crate::inproc::handler_hit,
    );
}
