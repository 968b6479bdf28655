//! Hooked returns in assembly: the return trampoline, and the return hook
//! that record stubs call at a function's entry.
//!
//! A recorded function whose return is hooked went through the generic
//! entry trampoline (nine registers saved, the site and the thread looked
//! up in hash tables, [`crate::hit`]'s Rust) and the return trampoline
//! (nine registers, [`crate::hit::ret_hit`]). Both are short in the common
//! case, which these two routines do in a few dozen instructions:
//!
//! * [`hotprobe_agent_hook_entry`], called by a record stub (see
//!   `hotprobe_abi::fast::ThreadBlock::hook_entry`) before it counts and
//!   records the entry: pushes the thread's shadow stack and swaps the
//!   return address for the return trampoline.
//! * [`hotprobe_agent_return_trampoline`]: a hooked function returns
//!   into it. It records the exit straight into the thread's ring, pops
//!   the shadow stack, and returns to the real address.
//!
//! Each takes its fast path only when nothing unusual is in the way, and
//! changes nothing before it knows it will finish (but the thread's
//! `busy` flag, put back); anything else goes the way it went before, to
//! the Rust code, with every register as it was:
//! a thread whose stubs are keyed off (no slot, another memory, a clock
//! other than the TSC, a TLS block shared by several threads: its
//! `stub_key` is 0), a busy thread (a signal handler inside the agent), a
//! process with coroutine stacks (`coro`), no shadow stack yet or a full
//! one, dead frames to pop first (longjmp, exceptions, tail calls), a
//! slot already swapped, a shadow entry with more to do than recording
//! (xmm0, a typed capture, an aggregation, an unwound frame), recording
//! off, a full ring (a cached limit reached is refreshed from the
//! consumer's tail first, as the stubs do).
//!
//! What the thread's TLS word points at is its own entry when its
//! `stub_key` is non-zero (the sentinel blocks of `threads` and `vfork`
//! have 0), and the entry's key is still compared with the thread pointer,
//! as [`crate::hit::find_thread`] does.

use core::mem::{offset_of, size_of};

use hotprobe_abi::fast::{
    HDR_CONTROL, HDR_EVENT_SIZE, RING_HEAD, RING_TAIL, TB_BUSY, TB_CTL, TB_EVENTS, TB_HEADER,
    TB_LIMIT, TB_MASK, TB_STUB_KEY,
};
use hotprobe_abi::{
    pack_meta, CONTROL_ENABLED, CONTROL_RECORD, KIND_EXIT, META_PROBE_MASK, PREFETCH_AHEAD,
};

use crate::hit::{Shadow, ThreadEntry, SHADOW_CAP, SHADOW_RECORD};

/// Offsets the assembly uses, checked against the Rust layout.
const TE_KEY: usize = offset_of!(ThreadEntry, key);
const TE_SHADOW: usize = offset_of!(ThreadEntry, shadow);
const TE_DEPTH: usize = offset_of!(ThreadEntry, depth);
const SH_SLOT: usize = offset_of!(Shadow, slot);
const SH_REAL: usize = offset_of!(Shadow, real);
const SH_PROBE: usize = offset_of!(Shadow, probe);
const SH_FLAGS: usize = offset_of!(Shadow, flags);
const SH_SIZE: usize = size_of::<Shadow>();
// The entry's address is `base + 24 × depth` (`lea [x + x*2]`, `*8`),
// and its slot is the word the entry's address points at.
const _: () = assert!(SH_SIZE == 24 && SH_SLOT == 0);
/// `CONTROL_ENABLED | CONTROL_RECORD`: both needed to record an exit.
const RECORDING: u32 = CONTROL_ENABLED | CONTROL_RECORD;
/// The meta word of an exit event without its probe id: two values.
const EXIT_META: u64 = pack_meta(0, KIND_EXIT, 2, 0);
const _: () = assert!(EXIT_META < 1 << 31 && META_PROBE_MASK < 1 << 31);

/// The return hook of a record stub (see the module docs and
/// `hotprobe_abi::fast::ThreadBlock::hook_entry`). In: `r11` = the calling
/// thread's block (its entry, the stub checked its key and set `busy`),
/// `r10` = the address of the function's return-address slot, `eax` =
/// the probe id. Out: `eax` = 0 when the return is hooked; 1 when it must
/// go the generic way, nothing changed. Clobbers rax, rdx, r10, flags.
///
/// # Safety
/// Only to be called by a record stub as above.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn hotprobe_agent_hook_entry() {
    core::arch::naked_asm!(
        // Reached by an indirect call: a landing pad where IBT is on.
        "endbr64",
        "push rcx",
        "push rsi",
        "push rdi",
        "cmp dword ptr [rip + {coro_used}], 0",
        "jne 9f",
        "mov rdx, qword ptr [r11 + {te_shadow}]",
        "test rdx, rdx",
        "jz 9f",
        "mov ecx, dword ptr [r11 + {te_depth}]",
        "cmp ecx, {cap}",
        "jae 9f",
        // rdx = the free entry, base + 24 × depth.
        "lea rsi, [rcx + rcx*2]",
        "lea rdx, [rdx + rsi*8]",
        "test ecx, ecx",
        "jz 2f",
        // The top entry's slot must be above this one: else frames at or
        // below it are dead, and their unwound exits go first (Rust).
        "cmp qword ptr [rdx - {sh_size}], r10",
        "jbe 9f",
        "2:",
        // A slot already swapped (a tail call from a hooked frame): Rust.
        "mov rsi, qword ptr [r10]",
        // Through the GOT: an exported symbol may not be reached
        // PC-relative from a shared object.
        "mov rdi, qword ptr [rip + hotprobe_agent_return_trampoline@GOTPCREL]",
        "cmp rsi, rdi",
        "je 9f",
        "mov qword ptr [rdx], r10",
        "mov qword ptr [rdx + {sh_real}], rsi",
        "mov dword ptr [rdx + {sh_probe}], eax",
        "mov dword ptr [rdx + {sh_flags}], {record_flag}",
        "inc ecx",
        "mov dword ptr [r11 + {te_depth}], ecx",
        "mov qword ptr [r10], rdi",
        "xor eax, eax",
        "pop rdi",
        "pop rsi",
        "pop rcx",
        "ret",
        "9:",
        "mov eax, 1",
        "pop rdi",
        "pop rsi",
        "pop rcx",
        "ret",
        coro_used = sym crate::coro::USED,
        te_shadow = const TE_SHADOW,
        te_depth = const TE_DEPTH,
        cap = const SHADOW_CAP,
        record_flag = const SHADOW_RECORD,
        sh_real = const SH_REAL,
        sh_probe = const SH_PROBE,
        sh_flags = const SH_FLAGS,
        sh_size = const SH_SIZE,
    );
}

/// Return trampoline: a hooked function returns here (its return address
/// was swapped by the entry hook, see `ACTION_EXIT`). The fast path (see
/// the module docs) records the exit (rax, rdx) into the thread's ring
/// and pops the shadow stack itself; otherwise the agent's
/// [`crate::hit::ret_hit`] gives the real return address (popping the
/// thread's shadow stack and recording the exit). Either way it returns
/// there with every general register as the function left it: not only
/// rax and rdx (the return value) but also rcx, rsi, rdi and r8–r11,
/// because gcc's `-fipa-ra` lets a caller keep values in call-clobbered
/// registers across a call to a callee known not to touch them (a
/// frameless `-O2` leaf). xmm registers are left alone by the
/// integer-only Rust code in release builds (checked by the test
/// `fast_path_uses_no_vector_registers`) and saved in debug builds. Flags
/// are not saved: gcc treats them as clobbered by every call, `-fipa-ra`
/// or not (fixed registers are always marked used).
///
/// # Safety
/// Only reached by a `ret` whose return address the agent swapped.
#[unsafe(naked)]
#[no_mangle]
pub unsafe extern "C" fn hotprobe_agent_return_trampoline() {
    core::arch::naked_asm!(
        // rsp = slot + 8 (the ret popped the swapped address from `slot`);
        // the real address goes back into `slot` for our `ret`.
        "sub rsp, 8",
        // Saved: [rsp] r11, +8 r10, +16 rcx, +24 rdx, +32 rax, +40 the slot.
        "push rax",
        "push rdx",
        "push rcx",
        "push r10",
        "push r11",
        "mov r11, qword ptr [rip + hotprobe_agent_tls_block@GOTTPOFF]",
        "mov r11, qword ptr fs:[r11]",
        "test r11, r11",
        "jz 8f",
        "cmp dword ptr [r11 + {tb_key}], 0",
        "je 8f",
        "cmp dword ptr [r11 + {tb_busy}], 0",
        "jne 8f",
        "mov rax, qword ptr fs:[0]",
        "cmp qword ptr [r11 + {te_key}], rax",
        "jne 8f",
        "cmp dword ptr [rip + {coro_used}], 0",
        "jne 8f",
        // Busy before the shadow stack and the ring are read: a signal
        // handler on this thread now counts its hits without touching
        // either (from here, the Rust path is reached through 7:).
        "mov dword ptr [r11 + {tb_busy}], 1",
        "mov rdx, qword ptr [r11 + {te_shadow}]",
        "test rdx, rdx",
        "jz 7f",
        "mov ecx, dword ptr [r11 + {te_depth}]",
        "test ecx, ecx",
        "jz 7f",
        // rdx = the top entry; it must be this slot's (none dead below).
        "lea rax, [rcx + rcx*2]",
        "lea rdx, [rdx + rax*8 - {sh_size}]",
        "lea rax, [rsp + 40]",
        "cmp qword ptr [rdx], rax",
        "jne 7f",
        "mov eax, dword ptr [rdx + {sh_flags}]",
        "test eax, eax",
        "jz 3f",
        "cmp eax, {record_flag}",
        "jne 7f",
        "mov r10, qword ptr [r11 + {tb_header}]",
        "mov eax, dword ptr [r10 + {hdr_control}]",
        "and eax, {recording}",
        "cmp eax, {recording}",
        "jne 7f",
        // r10 = head, below the cached limit; at the limit, the limit is
        // refreshed from the consumer's tail (a plain load is an Acquire
        // on x86) as the stubs do, and a ring still full is Rust's (which
        // counts the drop).
        "mov r10, qword ptr [r11 + {tb_ctl}]",
        "mov r10, qword ptr [r10 + {ring_head}]",
        "cmp r10, qword ptr [r11 + {tb_limit}]",
        "jae 4f",
        "5:",
        // Taken: nothing below goes back.
        // r10 = the event's slot: events + (head & mask) × event size.
        "and r10, qword ptr [r11 + {tb_mask}]",
        "mov rax, qword ptr [r11 + {tb_header}]",
        "mov eax, dword ptr [rax + {hdr_event_size}]",
        "imul r10, rax",
        "add r10, qword ptr [r11 + {tb_events}]",
        "mov rax, qword ptr [rsp + 32]",
        "mov qword ptr [r10 + 16], rax",
        "mov rax, qword ptr [rsp + 24]",
        "mov qword ptr [r10 + 24], rax",
        "mov eax, dword ptr [rdx + {sh_probe}]",
        "and eax, {probe_mask}",
        "or eax, {exit_meta}",
        "mov qword ptr [r10 + 8], rax",
        // Popped: the real address into the slot, depth − 1.
        "mov rax, qword ptr [rdx + {sh_real}]",
        "mov qword ptr [rsp + 40], rax",
        "dec ecx",
        "mov dword ptr [r11 + {te_depth}], ecx",
        "rdtsc",
        "shl rdx, 32",
        "or rax, rdx",
        "mov qword ptr [r10], rax",
        // The ring's line PREFETCH_AHEAD bytes on, for writing (as
        // `Producer::push` does): events + ((slot − events + ahead) &
        // (ring bytes − 1)).
        "mov rax, r10",
        "sub rax, qword ptr [r11 + {tb_events}]",
        "add rax, {ahead}",
        "mov rdx, qword ptr [r11 + {tb_mask}]",
        "inc rdx",
        "mov rcx, qword ptr [r11 + {tb_header}]",
        "mov ecx, dword ptr [rcx + {hdr_event_size}]",
        "imul rdx, rcx",
        "dec rdx",
        "and rax, rdx",
        "add rax, qword ptr [r11 + {tb_events}]",
        "prefetchw byte ptr [rax]",
        // Publish (x86 keeps stores in order: a Release, as in the stubs).
        "mov r10, qword ptr [r11 + {tb_ctl}]",
        "inc qword ptr [r10 + {ring_head}]",
        "2:",
        "mov dword ptr [r11 + {tb_busy}], 0",
        "pop r11",
        "pop r10",
        "pop rcx",
        "pop rdx",
        "pop rax",
        // An indirect jump, not `ret`: the function's `ret` into this
        // trampoline already took the return-stack predictor's entry for
        // the real address; a second `ret` would take its caller's, and
        // every return above would be mispredicted in turn. The word
        // just below rsp stays ours: the red zone, which signal delivery
        // skips.
        "lea rsp, [rsp + 8]",
        "jmp qword ptr [rsp - 8]",
        // Nothing recorded for this return: popped only.
        "3:",
        "mov rax, qword ptr [rdx + {sh_real}]",
        "mov qword ptr [rsp + 40], rax",
        "dec ecx",
        "mov dword ptr [r11 + {te_depth}], ecx",
        "jmp 2b",
        // The limit reached: rax = tail.
        "4:",
        "mov rax, qword ptr [r11 + {tb_ctl}]",
        "mov rax, qword ptr [rax + {ring_tail}]",
        "mov rcx, r10",
        "sub rcx, rax",
        "cmp rcx, qword ptr [r11 + {tb_mask}]",
        "ja 7f",
        "add rax, qword ptr [r11 + {tb_mask}]",
        "inc rax",
        "mov qword ptr [r11 + {tb_limit}], rax",
        // rcx was the depth: reloaded (unchanged: nothing popped yet).
        "mov ecx, dword ptr [r11 + {te_depth}]",
        "jmp 5b",
        // The Rust path (busy as it was).
        "7:",
        "mov dword ptr [r11 + {tb_busy}], 0",
        "8:",
        "pop r11",
        "pop r10",
        "pop rcx",
        "pop rdx",
        "pop rax",
        "push rbp",
        "mov rbp, rsp",
        "and rsp, -16",
        "sub rsp, 80",
        "mov [rsp], rax",
        "mov [rsp+8], rdx",
        "mov [rsp+16], rcx",
        "mov [rsp+24], rsi",
        "mov [rsp+32], rdi",
        "mov [rsp+40], r8",
        "mov [rsp+48], r9",
        "mov [rsp+56], r10",
        "mov [rsp+64], r11",
        crate::trampoline::const_str!(SAVE_XMM_ALWAYS),
        "lea rdi, [rbp+8]",
        "mov rsi, rax",
        "movq rcx, xmm0",
        "call {ret}",
        "mov [rbp+8], rax",
        crate::trampoline::const_str!(RESTORE_XMM_ALWAYS),
        "mov rax, [rsp]",
        "mov rdx, [rsp+8]",
        "mov rcx, [rsp+16]",
        "mov rsi, [rsp+24]",
        "mov rdi, [rsp+32]",
        "mov r8, [rsp+40]",
        "mov r9, [rsp+48]",
        "mov r10, [rsp+56]",
        "mov r11, [rsp+64]",
        "mov rsp, rbp",
        "pop rbp",
        "ret",
        ret = sym crate::hit::ret_hit,
        coro_used = sym crate::coro::USED,
        tb_key = const TB_STUB_KEY,
        tb_busy = const TB_BUSY,
        tb_header = const TB_HEADER,
        tb_ctl = const TB_CTL,
        tb_limit = const TB_LIMIT,
        tb_mask = const TB_MASK,
        tb_events = const TB_EVENTS,
        te_key = const TE_KEY,
        te_shadow = const TE_SHADOW,
        te_depth = const TE_DEPTH,
        record_flag = const SHADOW_RECORD,
        sh_real = const SH_REAL,
        sh_probe = const SH_PROBE,
        sh_flags = const SH_FLAGS,
        sh_size = const SH_SIZE,
        hdr_control = const HDR_CONTROL,
        hdr_event_size = const HDR_EVENT_SIZE,
        recording = const RECORDING,
        ring_head = const RING_HEAD,
        ring_tail = const RING_TAIL,
        probe_mask = const META_PROBE_MASK,
        exit_meta = const EXIT_META,
        ahead = const PREFETCH_AHEAD,
    );
}
