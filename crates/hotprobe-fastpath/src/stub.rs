//! Per-site stubs: the fast path of the fast path.
//!
//! The agent's generic trampolines save nine registers, look the site up in
//! a hash table and the thread in another (≈ 6 ns before any work). A stub
//! generated here for one site knows its counter index, probe id and kind
//! as immediates, reaches the thread's counters and ring through the
//! agent's TLS word (`mov r11, fs:[tpoff]`, see `hotprobe_abi::fast`),
//! saves only the registers it uses, and is placed within ±2 GiB of its
//! site so that the site `call`s it directly (no near-stub hop).
//!
//! * count: `push r11; mov r11, fs:[tpoff]; test; jz generic;
//!   mov r11, [r11+counters]; inc qword [r11+8*counter]; pop r11; ret` —
//!   exact with any number of threads (each thread increments its own
//!   counter array; one instruction, so a signal handler on the same
//!   thread cannot interleave with it), no `lock` prefix.
//! * record: the same, then (unless the thread is already writing its ring,
//!   or recording is off) `rdtsc` and the 72-byte event written straight
//!   into the thread's ring; a full ring refreshes the cached tail, then
//!   drops and counts, and checks the tracer's heartbeat (a stale one
//!   clears `CONTROL_RECORD` and sets `STATUS_ORPHANED`, as the agent does).
//!
//! Stubs only go where the SysV ABI leaves the flags dead: a function's
//! first instruction or a `call` site (the placeholders of the patch
//! mechanism, the jump mechanism's entry trampolines). Every general
//! register is preserved — r11 included, since gcc's `-fipa-ra` lets a
//! caller keep values in call-clobbered registers its callee does not use.
//! A thread not yet known to the agent (TLS word 0) or a re-entered one is
//! sent to the agent's generic trampoline with the stack as the site left
//! it, so the generic path handles it under the same site key.

use hotprobe_abi::fast::{
    HDR_CONTROL, HDR_HEARTBEAT, HDR_HEARTBEAT_TIMEOUT, HDR_STATUS, RING_DROPPED, RING_HEAD,
    RING_TAIL, TB_BUSY, TB_CACHED_TAIL, TB_COUNTERS, TB_CTL, TB_EVENTS, TB_HEADER, TB_MASK,
    TB_TID_HI,
};
use hotprobe_abi::{CONTROL_RECORD, KIND_ENTRY, KIND_EXIT, STATUS_ORPHANED};
use iced_x86::code_asm::*;

/// Which registers an event records.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StubKind {
    /// Function entry: rdi, rsi, rdx, rcx, r8, r9.
    Entry,
    /// Exit placeholder: rax, rdx.
    Exit,
}

/// What one stub does.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StubParams {
    /// `Header::thread_tpoff` of the agent.
    pub tpoff: u64,
    /// Counter index incremented on each hit.
    pub counter: u32,
    /// Probe id written into events.
    pub probe: u32,
    /// Entry or exit registers.
    pub kind: StubKind,
    /// Write an event (when `CONTROL_RECORD` is set).
    pub record: bool,
    /// The agent's generic trampoline for this kind (absolute address).
    pub generic: u64,
}

fn d(off: i32) -> i64 {
    off as i64
}

/// Assembles the stub for placement at `ip`.
pub(crate) fn build(ip: u64, p: &StubParams) -> Result<Vec<u8>, IcedError> {
    let tp = (p.tpoff as i64) as i32;
    // mov r11, qword ptr fs:[disp32] (absolute, no base): 64 4c 8b 1c 25 disp32.
    let mut load_tls = vec![0x64, 0x4c, 0x8b, 0x1c, 0x25];
    load_tls.extend_from_slice(&tp.to_le_bytes());
    let cdisp = p.counter as i64 * 8;
    let mut a = CodeAssembler::new(64)?;
    let mut slow = a.create_label();
    let mut lit = a.create_label();
    a.push(r11)?;
    a.db(&load_tls)?;
    a.test(r11, r11)?;
    a.jz(slow)?;
    if !p.record {
        a.mov(r11, qword_ptr(r11 + d(TB_COUNTERS)))?;
        a.inc(qword_ptr(r11 + cdisp))?;
        a.pop(r11)?;
        a.ret()?;
    } else {
        let mut done = a.create_label();
        let mut unbusy = a.create_label();
        let mut full = a.create_label();
        let mut room = a.create_label();
        a.cmp(dword_ptr(r11 + d(TB_BUSY)), 0)?;
        a.jne(slow)?;
        a.push(rax)?;
        a.push(rdx)?;
        a.push(rcx)?;
        a.push(r10)?;
        // Saved: [rsp] r10, +8 rcx, +16 rdx, +24 rax, +32 r11, +40 the key.
        a.mov(rax, qword_ptr(r11 + d(TB_COUNTERS)))?;
        a.inc(qword_ptr(rax + cdisp))?;
        a.mov(rax, qword_ptr(r11 + d(TB_HEADER)))?;
        a.test(byte_ptr(rax + d(HDR_CONTROL)), CONTROL_RECORD as i32)?;
        a.jz(done)?;
        a.mov(dword_ptr(r11 + d(TB_BUSY)), 1)?;
        a.rdtsc()?;
        a.shl(rdx, 32)?;
        a.or(rdx, rax)?;
        a.mov(rcx, qword_ptr(r11 + d(TB_CTL)))?;
        // Relaxed load of our own head (single writer).
        a.mov(rax, qword_ptr(rcx + d(RING_HEAD)))?;
        a.mov(r10, rax)?;
        a.sub(r10, qword_ptr(r11 + d(TB_CACHED_TAIL)))?;
        a.cmp(r10, qword_ptr(r11 + d(TB_MASK)))?;
        a.ja(full)?;
        a.set_label(&mut room)?;
        a.mov(r10, rax)?;
        a.and(r10, qword_ptr(r11 + d(TB_MASK)))?;
        a.imul_3(r10, r10, 72)?;
        a.add(r10, qword_ptr(r11 + d(TB_EVENTS)))?;
        a.mov(qword_ptr(r10), rdx)?;
        a.mov(rdx, qword_ptr(r11 + d(TB_TID_HI)))?;
        a.or(rdx, p.probe as i32)?;
        a.mov(qword_ptr(r10 + 8), rdx)?;
        match p.kind {
            StubKind::Entry => {
                a.mov(qword_ptr(r10 + 16), (KIND_ENTRY as i32) | 6 << 8)?;
                a.mov(qword_ptr(r10 + 24), rdi)?;
                a.mov(qword_ptr(r10 + 32), rsi)?;
                a.mov(rdx, qword_ptr(rsp + 16))?;
                a.mov(qword_ptr(r10 + 40), rdx)?;
                a.mov(rdx, qword_ptr(rsp + 8))?;
                a.mov(qword_ptr(r10 + 48), rdx)?;
                a.mov(qword_ptr(r10 + 56), r8)?;
                a.mov(qword_ptr(r10 + 64), r9)?;
            }
            StubKind::Exit => {
                a.mov(qword_ptr(r10 + 16), (KIND_EXIT as i32) | 2 << 8)?;
                a.mov(rdx, qword_ptr(rsp + 24))?;
                a.mov(qword_ptr(r10 + 24), rdx)?;
                a.mov(rdx, qword_ptr(rsp + 16))?;
                a.mov(qword_ptr(r10 + 32), rdx)?;
                a.xor(edx, edx)?;
                for off in [40, 48, 56, 64] {
                    a.mov(qword_ptr(r10 + off), rdx)?;
                }
            }
        }
        // Publish: x86 stores are not reordered with older stores, so this
        // plain store is the Release that pairs with the tracer's
        // `head.load(Acquire)` in `Consumer::drain`.
        a.inc(rax)?;
        a.mov(qword_ptr(rcx + d(RING_HEAD)), rax)?;
        a.set_label(&mut unbusy)?;
        a.mov(dword_ptr(r11 + d(TB_BUSY)), 0)?;
        a.set_label(&mut done)?;
        a.pop(r10)?;
        a.pop(rcx)?;
        a.pop(rdx)?;
        a.pop(rax)?;
        a.pop(r11)?;
        a.ret()?;
        // Ring looks full: refresh the cached tail (a plain load is an
        // Acquire on x86, pairing with the consumer's Release store).
        a.set_label(&mut full)?;
        a.mov(r10, qword_ptr(rcx + d(RING_TAIL)))?;
        a.mov(qword_ptr(r11 + d(TB_CACHED_TAIL)), r10)?;
        a.mov(r10, rax)?;
        a.sub(r10, qword_ptr(r11 + d(TB_CACHED_TAIL)))?;
        a.cmp(r10, qword_ptr(r11 + d(TB_MASK)))?;
        a.jbe(room)?;
        a.inc(qword_ptr(rcx + d(RING_DROPPED)))?;
        // Is the tracer still there? (rdx = now.)
        a.mov(rcx, qword_ptr(r11 + d(TB_HEADER)))?;
        a.mov(r10, qword_ptr(rcx + d(HDR_HEARTBEAT_TIMEOUT)))?;
        a.test(r10, r10)?;
        a.jz(unbusy)?;
        a.sub(rdx, qword_ptr(rcx + d(HDR_HEARTBEAT)))?;
        a.cmp(rdx, r10)?;
        a.jle(unbusy)?;
        a.lock()
            .and(dword_ptr(rcx + d(HDR_CONTROL)), !(CONTROL_RECORD as i32))?;
        a.lock()
            .or(dword_ptr(rcx + d(HDR_STATUS)), STATUS_ORPHANED as i32)?;
        a.jmp(unbusy)?;
    }
    a.set_label(&mut slow)?;
    a.pop(r11)?;
    a.jmp(qword_ptr(lit))?;
    a.set_label(&mut lit)?;
    a.dq(&[p.generic])?;
    a.assemble(ip)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};

    fn text(code: &[u8], ip: u64) -> String {
        let mut dec = Decoder::with_ip(64, code, ip, DecoderOptions::NONE);
        let mut f = IntelFormatter::new();
        let mut out = String::new();
        for ins in &mut dec {
            f.format(&ins, &mut out);
            out.push('\n');
        }
        out
    }

    #[test]
    fn count_stub_reads_tls_and_increments_one_counter() {
        let p = StubParams {
            tpoff: (-8i64) as u64,
            counter: 3,
            probe: 3,
            kind: StubKind::Entry,
            record: false,
            generic: 0x1122_3344_5566_7788,
        };
        let code = build(0x1000, &p).unwrap();
        let t = text(&code, 0x1000);
        assert!(
            t.starts_with("push r11\nmov r11,fs:[0FFFFFFFFFFFFFFF8h]\ntest r11,r11\nje "),
            "{t}"
        );
        assert!(t.contains("inc qword ptr [r11+18h]"), "{t}");
        assert!(code.ends_with(&0x1122_3344_5566_7788u64.to_le_bytes()));
    }

    #[test]
    fn record_stub_writes_nine_words_and_publishes_head() {
        for kind in [StubKind::Entry, StubKind::Exit] {
            let p = StubParams {
                tpoff: (-16i64) as u64,
                counter: 7,
                probe: 5,
                kind,
                record: true,
                generic: 0x4000,
            };
            let code = build(0x2000, &p).unwrap();
            let t = text(&code, 0x2000);
            let stores = t
                .lines()
                .filter(|l| l.starts_with("mov qword ptr [r10") || l.starts_with("mov [r10"))
                .count();
            assert_eq!(stores, 9, "{t}");
            assert!(t.contains("rdtsc"), "{t}");
            assert!(t.contains("mov [rcx],rax"), "{t}");
        }
    }
}
