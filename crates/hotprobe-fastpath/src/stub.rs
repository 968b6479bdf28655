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
//!   cmp dword [r11+stub_key], KEY; jne generic;
//!   mov r11, [r11+counters]; inc qword [r11+8*counter]; pop r11; ret` —
//!   exact with any number of threads (each thread increments its own
//!   counter array; one instruction, so a signal handler on the same
//!   thread cannot interleave with it), no `lock` prefix.
//! * record: the same, then (unless the thread is already writing its ring,
//!   or recording is off) `rdtsc` and the event written straight into the
//!   thread's ring — only the words it uses: tsc, the meta word (probe id,
//!   kind and number of values are immediates ORed into the thread's
//!   `tid << 32`), then rax, rdx for an exit, or the argument registers that
//!   fit the memory's slot (2 in 32-byte slots, 6 in 64-byte ones) for an
//!   entry; slots are powers of two, so the slot address is a shift, and
//!   never straddle a cache line. A full ring refreshes the cached tail,
//!   then drops and counts (the ring's drops, the probe's missed events),
//!   and checks the tracer's heartbeat (a stale one clears
//!   `CONTROL_RECORD` and sets `STATUS_ORPHANED`, as the agent does).
//! * record with a hooked return (an entry without xmm values): the
//!   same, but before counting, with `busy` set, it calls the agent's
//!   return hook through the thread block (`call [r11+hook_entry]`, `r10`
//!   = the function's return-address slot, `eax` = the probe id), which
//!   pushes the shadow stack and swaps the return address; a hook that
//!   declines, a block without one, and recording off send the hit to
//!   the generic trampoline with nothing done.
//!
//! Stubs only go where the SysV ABI leaves the flags dead: a function's
//! first instruction or a `call` site (the placeholders of the patch
//! mechanism, the jump mechanism's entry trampolines). Every general
//! register is preserved — r11 included, since gcc's `-fipa-ra` lets a
//! caller keep values in call-clobbered registers its callee does not use.
//! A thread not yet known to the agent (TLS word 0) or a re-entered one is
//! sent to the agent's generic trampoline with the stack as the site left
//! it, so the generic path handles it under the same site key (a
//! re-entered hit — a signal handler interrupting a record stub on the
//! same thread — is counted there and its event counted as refused; the
//! count stub counts re-entered hits itself: its one `inc` cannot be split). So is a hit
//! whose thread block carries another memory's `stub_key` (the record stub
//! checks key and `busy` with one 8-byte compare): stubs left behind by a
//! tracer that died are inert once the agent attaches to a new memory,
//! instead of counting and recording there with stale counter indices,
//! probe ids and slot size.

use hotprobe_abi::fast::{
    HDR_CONTROL, HDR_HEARTBEAT, HDR_HEARTBEAT_TIMEOUT, HDR_STATUS, RING_DROPPED, RING_HEAD,
    RING_TAIL, TB_BUSY, TB_COUNTERS, TB_CTL, TB_EVENTS, TB_HEADER, TB_HOOK_ENTRY, TB_LIMIT,
    TB_MASK, TB_STUB_KEY,
};
use hotprobe_abi::{
    pack_meta, slot_values, CONTROL_RECORD, EVENT_SIZE_COMPACT, EVENT_SIZE_FULL, EVENT_XMM,
    KIND_ENTRY, KIND_EXIT, STATUS_ORPHANED,
};
use iced_x86::code_asm::*;

/// Bytes past the event being written whose ring line a record stub asks
/// for, for writing (`hotprobe_abi`'s `Producer::push` does the same).
const PREFETCH_AHEAD: i32 = hotprobe_abi::PREFETCH_AHEAD as i32;

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
    /// Bytes per event slot of the memory ([`EVENT_SIZE_COMPACT`] or
    /// [`EVENT_SIZE_FULL`]).
    pub event_size: u32,
    /// `Header::stub_key` of the memory (non-zero, below 2^31): a thread
    /// block with another key (another tracer's memory) sends the hit to
    /// the generic path.
    pub key: u32,
    /// `Header::missed_offset` of the memory: a full ring's drop is also
    /// counted in the probe's missed counter (header + this + 8 × probe).
    pub missed_offset: u64,
    /// The xmm layout (`hotprobe_abi::ACTION_XMM_SHIFT`), `Some(k)`: an
    /// entry stores the first `k` integer argument registers then the low
    /// 64 bits of xmm0, xmm1, … (`movq`, one store each); an exit stores
    /// rax, rdx and xmm0. Events carry `EVENT_XMM`. Needs 64-byte slots.
    pub xmm_ints: Option<u8>,
    /// Hook the function's return too (an entry record stub without an
    /// xmm layout): before counting, the stub calls the agent's
    /// `ThreadBlock::hook_entry` with the return-address slot and the
    /// probe id; a thread without one, or whose hook declines (dead
    /// frames to pop, no shadow stack yet, …), and a hit while recording
    /// is off, go to the generic trampoline with nothing done.
    pub hook: bool,
}

/// Why a stub could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StubError {
    /// The assembler refused.
    #[error(transparent)]
    Asm(#[from] IcedError),
    /// Parameters the slot format cannot carry.
    #[error("{0}")]
    Params(&'static str),
}

fn d(off: i32) -> i64 {
    off as i64
}

/// Assembles the stub for placement at `ip`.
pub(crate) fn build(ip: u64, p: &StubParams) -> Result<Vec<u8>, StubError> {
    if p.event_size != EVENT_SIZE_COMPACT && p.event_size != EVENT_SIZE_FULL {
        return Err(StubError::Params("event size must be 32 or 64"));
    }
    if p.probe >= 1 << 24 {
        return Err(StubError::Params("probe id must be below 2^24"));
    }
    if p.key == 0 || p.key >= 1 << 31 {
        return Err(StubError::Params("stub key must be in 1..2^31"));
    }
    if p.xmm_ints.is_some() && p.event_size != EVENT_SIZE_FULL {
        return Err(StubError::Params("the xmm layout needs 64-byte slots"));
    }
    if p.hook && (p.kind != StubKind::Entry || !p.record || p.xmm_ints.is_some()) {
        return Err(StubError::Params(
            "only an entry record stub without an xmm layout hooks returns",
        ));
    }
    let missed = i32::try_from(p.missed_offset + 8 * p.probe as u64)
        .map_err(|_| StubError::Params("missed counters beyond 2 GiB"))?;
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
        a.cmp(dword_ptr(r11 + d(TB_STUB_KEY)), p.key as i32)?;
        a.jne(slow)?;
        a.mov(r11, qword_ptr(r11 + d(TB_COUNTERS)))?;
        a.inc(qword_ptr(r11 + cdisp))?;
        a.pop(r11)?;
        a.ret()?;
    } else {
        let mut done = a.create_label();
        let mut unbusy = a.create_label();
        let mut full = a.create_label();
        let mut room = a.create_label();
        let mut drop = a.create_label();
        let (kind, nvalues) = match (p.kind, p.xmm_ints) {
            (StubKind::Entry, _) => (KIND_ENTRY, slot_values(p.event_size).min(6)),
            (StubKind::Exit, None) => (KIND_EXIT, 2),
            (StubKind::Exit, Some(_)) => (KIND_EXIT, 3),
        };
        let flags = if p.xmm_ints.is_some() { EVENT_XMM } else { 0 };
        // The whole meta word (bits 31-63 clear: a positive imm32).
        let meta = pack_meta(p.probe, kind, nvalues as u8, flags) as i32;
        // Our memory (key) and not busy (the next 4 bytes are 0), at once.
        a.cmp(qword_ptr(r11 + d(TB_STUB_KEY)), p.key as i32)?;
        a.jne(slow)?;
        a.push(rax)?;
        a.push(rdx)?;
        a.push(r10)?;
        // Saved: [rsp] r10, +8 rdx, +16 rax, +24 r11, +32 the key, and
        // at +40 the function's return address (an entry site).
        let mut unsaved = a.create_label();
        if p.hook {
            // The return hooked first, so that a declined hook leaves
            // nothing done for the generic path to do again.
            let mut hooked = a.create_label();
            a.mov(r10, qword_ptr(r11 + d(TB_HEADER)))?;
            a.test(byte_ptr(r10 + d(HDR_CONTROL)), CONTROL_RECORD as i32)?;
            a.jz(unsaved)?;
            a.cmp(qword_ptr(r11 + d(TB_HOOK_ENTRY)), 0)?;
            a.je(unsaved)?;
            a.mov(dword_ptr(r11 + d(TB_BUSY)), 1)?;
            a.lea(r10, qword_ptr(rsp + 40))?;
            a.mov(eax, p.probe)?;
            a.call(qword_ptr(r11 + d(TB_HOOK_ENTRY)))?;
            a.test(eax, eax)?;
            a.jz(hooked)?;
            // Declined: nothing done.
            a.mov(dword_ptr(r11 + d(TB_BUSY)), 0)?;
            a.jmp(unsaved)?;
            a.set_label(&mut hooked)?;
            // The hook clobbered rdx, an argument the event records.
            a.mov(rdx, qword_ptr(rsp + 8))?;
            a.mov(r10, qword_ptr(r11 + d(TB_COUNTERS)))?;
            a.inc(qword_ptr(r10 + cdisp))?;
        } else {
            a.mov(r10, qword_ptr(r11 + d(TB_COUNTERS)))?;
            a.inc(qword_ptr(r10 + cdisp))?;
            a.mov(r10, qword_ptr(r11 + d(TB_HEADER)))?;
            a.test(byte_ptr(r10 + d(HDR_CONTROL)), CONTROL_RECORD as i32)?;
            a.jz(done)?;
            a.mov(dword_ptr(r11 + d(TB_BUSY)), 1)?;
        }
        // r10 = head (a relaxed load of our own counter: single writer).
        a.mov(r10, qword_ptr(r11 + d(TB_CTL)))?;
        a.mov(r10, qword_ptr(r10 + d(RING_HEAD)))?;
        a.cmp(r10, qword_ptr(r11 + d(TB_LIMIT)))?;
        a.jae(full)?;
        a.set_label(&mut room)?;
        // r10 = the slot: events + ((head & mask) << log2(size)).
        a.and(r10, qword_ptr(r11 + d(TB_MASK)))?;
        a.shl(r10, p.event_size.trailing_zeros())?;
        a.add(r10, qword_ptr(r11 + d(TB_EVENTS)))?;
        // The values straight from their registers (before rdtsc
        // clobbers rax and rdx), then the meta word.
        const INTS: [AsmRegister64; 6] = [rdi, rsi, rdx, rcx, r8, r9];
        const XMMS: [AsmRegisterXmm; 6] = [xmm0, xmm1, xmm2, xmm3, xmm4, xmm5];
        match (p.kind, p.xmm_ints) {
            (StubKind::Entry, Some(k)) => {
                let k = usize::from(k).min(6);
                let regs = INTS[..k]
                    .iter()
                    .map(|&r| Ok(r))
                    .chain(XMMS.iter().map(|&x| Err(x)));
                for (i, r) in regs.take(6).enumerate() {
                    let at = qword_ptr(r10 + (16 + 8 * i as i64));
                    match r {
                        Ok(g) => a.mov(at, g)?,
                        Err(x) => a.movq(at, x)?,
                    }
                }
            }
            (StubKind::Exit, Some(_)) => {
                a.mov(qword_ptr(r10 + 16), rax)?;
                a.mov(qword_ptr(r10 + 24), rdx)?;
                a.movq(qword_ptr(r10 + 32), xmm0)?;
            }
            (StubKind::Entry, None) => {
                a.mov(qword_ptr(r10 + 16), rdi)?;
                a.mov(qword_ptr(r10 + 24), rsi)?;
                if nvalues == 6 {
                    a.mov(qword_ptr(r10 + 32), rdx)?;
                    a.mov(qword_ptr(r10 + 40), rcx)?;
                    a.mov(qword_ptr(r10 + 48), r8)?;
                    a.mov(qword_ptr(r10 + 56), r9)?;
                }
            }
            (StubKind::Exit, None) => {
                a.mov(qword_ptr(r10 + 16), rax)?;
                a.mov(qword_ptr(r10 + 24), rdx)?;
            }
        }
        a.mov(qword_ptr(r10 + 8), meta)?;
        a.rdtsc()?;
        a.shl(rdx, 32)?;
        a.or(rax, rdx)?;
        a.mov(qword_ptr(r10), rax)?;
        // The ring's line 256 bytes ahead, asked for writing (as the
        // agent's `Producer::push` does): rax = events + ((slot - events +
        // 256) & (ring bytes - 1)). A prefetch never faults.
        a.mov(rax, r10)?;
        a.sub(rax, qword_ptr(r11 + d(TB_EVENTS)))?;
        a.add(rax, PREFETCH_AHEAD)?;
        a.mov(rdx, qword_ptr(r11 + d(TB_MASK)))?;
        a.shl(rdx, p.event_size.trailing_zeros())?;
        a.or(rdx, p.event_size as i32 - 1)?;
        a.and(rax, rdx)?;
        a.add(rax, qword_ptr(r11 + d(TB_EVENTS)))?;
        a.prefetchw(byte_ptr(rax))?;
        // Publish: x86 stores are not reordered with older stores, so this
        // plain read-modify-write of head (single writer; `busy` keeps a
        // signal handler on this thread out) is the Release that pairs
        // with the tracer's `head.load(Acquire)` in `Consumer::drain`.
        a.mov(r10, qword_ptr(r11 + d(TB_CTL)))?;
        a.inc(qword_ptr(r10 + d(RING_HEAD)))?;
        a.set_label(&mut unbusy)?;
        a.mov(dword_ptr(r11 + d(TB_BUSY)), 0)?;
        a.set_label(&mut done)?;
        a.pop(r10)?;
        a.pop(rdx)?;
        a.pop(rax)?;
        a.pop(r11)?;
        a.ret()?;
        // head reached the limit: refresh it from the consumer's tail (a
        // plain load is an Acquire on x86, pairing with the consumer's
        // Release store); rax and rdx are scratch here and restored below.
        a.set_label(&mut full)?;
        a.mov(rax, qword_ptr(r11 + d(TB_CTL)))?;
        a.mov(rax, qword_ptr(rax + d(RING_TAIL)))?;
        a.mov(rdx, r10)?;
        a.sub(rdx, rax)?;
        a.cmp(rdx, qword_ptr(r11 + d(TB_MASK)))?;
        a.ja(drop)?;
        a.add(rax, qword_ptr(r11 + d(TB_MASK)))?;
        a.inc(rax)?;
        a.mov(qword_ptr(r11 + d(TB_LIMIT)), rax)?;
        a.mov(rax, qword_ptr(rsp + 16))?;
        a.mov(rdx, qword_ptr(rsp + 8))?;
        a.jmp(room)?;
        // Still full: count the drop (single writer, no lock prefix), and
        // the probe's missed event (shared: locked).
        a.set_label(&mut drop)?;
        a.mov(r10, qword_ptr(r11 + d(TB_CTL)))?;
        a.inc(qword_ptr(r10 + d(RING_DROPPED)))?;
        a.mov(r10, qword_ptr(r11 + d(TB_HEADER)))?;
        a.lock().inc(qword_ptr(r10 + missed as i64))?;
        // Is the tracer still there?
        a.rdtsc()?;
        a.shl(rdx, 32)?;
        a.or(rdx, rax)?;
        a.mov(r10, qword_ptr(r11 + d(TB_HEADER)))?;
        a.mov(rax, qword_ptr(r10 + d(HDR_HEARTBEAT_TIMEOUT)))?;
        a.test(rax, rax)?;
        a.jz(unbusy)?;
        a.sub(rdx, qword_ptr(r10 + d(HDR_HEARTBEAT)))?;
        a.cmp(rdx, rax)?;
        a.jle(unbusy)?;
        a.lock()
            .and(dword_ptr(r10 + d(HDR_CONTROL)), !(CONTROL_RECORD as i32))?;
        a.lock()
            .or(dword_ptr(r10 + d(HDR_STATUS)), STATUS_ORPHANED as i32)?;
        a.jmp(unbusy)?;
        if p.hook {
            // Declined before anything was done: the generic path, with
            // the registers as the site left them.
            a.set_label(&mut unsaved)?;
            a.pop(r10)?;
            a.pop(rdx)?;
            a.pop(rax)?;
        }
    }
    a.set_label(&mut slow)?;
    a.pop(r11)?;
    a.jmp(qword_ptr(lit))?;
    a.set_label(&mut lit)?;
    a.dq(&[p.generic])?;
    Ok(a.assemble(ip)?)
}

/// Stubs assembled once per shape: every stub of one memory and kind
/// differs from its neighbours only in its counter's displacement, its
/// meta word's probe id and its missed counter's displacement, and is
/// position-independent (every branch goes to a label of its own, the
/// generic trampoline through a literal), so one assembly with sentinel
/// values is copied and those three fields patched in. Running iced-x86's
/// `BlockEncoder` per stub was a fifth of arming 100,000 probes.
#[derive(Default, Debug)]
pub(crate) struct StubTemplates {
    shapes: Vec<(StubParams, Option<Template>)>,
}

/// One shape's bytes and where its per-stub fields are.
#[derive(Debug)]
struct Template {
    code: Vec<u8>,
    /// Offset of the counter's disp32 (`8 × counter`).
    counter_at: usize,
    /// Offsets of the meta imm32 and the missed counter's disp32 (record).
    record_at: Option<(usize, usize)>,
    /// Offset of the probe id's imm32 passed to the return hook (hook).
    probe_at: Option<usize>,
}

/// Sentinels: values whose encodings occur once in a stub.
const SENTINEL_COUNTER: u32 = 0x0D5A_3C71;
const SENTINEL_PROBE: u32 = 0x00A7_1E93;

fn find_once(code: &[u8], v: i32) -> Option<usize> {
    let pat = v.to_le_bytes();
    let mut hits = code.windows(4).enumerate().filter(|(_, w)| *w == pat);
    let (at, _) = hits.next()?;
    hits.next().is_none().then_some(at)
}

fn same_shape(a: &StubParams, b: &StubParams) -> bool {
    a.tpoff == b.tpoff
        && a.kind == b.kind
        && a.record == b.record
        && a.generic == b.generic
        && a.event_size == b.event_size
        && a.key == b.key
        && a.missed_offset == b.missed_offset
        && a.xmm_ints == b.xmm_ints
        && a.hook == b.hook
}

fn meta_of(p: &StubParams) -> i32 {
    let (kind, nvalues) = match p.kind {
        StubKind::Entry => (KIND_ENTRY, slot_values(p.event_size).min(6)),
        StubKind::Exit => (KIND_EXIT, 2),
    };
    pack_meta(p.probe, kind, nvalues as u8, 0) as i32
}

impl Template {
    fn new(p: &StubParams) -> Option<Template> {
        // An xmm layout changes the event's meta word (value count, the
        // EVENT_XMM flag): typed-float sites are few, they are assembled.
        if p.xmm_ints.is_some() {
            return None;
        }
        let s = StubParams {
            counter: SENTINEL_COUNTER,
            probe: SENTINEL_PROBE,
            ..*p
        };
        let code = build(0, &s).ok()?;
        let counter_at = find_once(&code, (SENTINEL_COUNTER as i64 * 8) as i32)?;
        let record_at = if p.record {
            let missed = i32::try_from(p.missed_offset + 8 * SENTINEL_PROBE as u64).ok()?;
            Some((find_once(&code, meta_of(&s))?, find_once(&code, missed)?))
        } else {
            None
        };
        let probe_at = if p.hook {
            Some(find_once(&code, SENTINEL_PROBE as i32)?)
        } else {
            None
        };
        Some(Template {
            code,
            counter_at,
            record_at,
            probe_at,
        })
    }
}

impl StubTemplates {
    /// The stub [`build`] would assemble for `p` (at any address): from
    /// the shape's template when `p`'s fields encode at the template's
    /// sizes (disp32: counter ≥ 16, missed offset ≥ 128), else assembled.
    pub(crate) fn build(&mut self, p: &StubParams) -> Result<Vec<u8>, StubError> {
        let cdisp = p.counter as i64 * 8;
        let patchable = (128..=i32::MAX as i64).contains(&cdisp)
            && p.probe < 1 << 24
            && p.missed_offset >= 128
            && (p.event_size == EVENT_SIZE_COMPACT || p.event_size == EVENT_SIZE_FULL)
            && p.key != 0
            && p.key < 1 << 31;
        if !patchable {
            return build(0, p);
        }
        let i = match self.shapes.iter().position(|(s, _)| same_shape(s, p)) {
            Some(i) => i,
            None => {
                self.shapes.push((*p, Template::new(p)));
                self.shapes.len() - 1
            }
        };
        let Some(t) = &self.shapes[i].1 else {
            return build(0, p);
        };
        let mut code = t.code.clone();
        code[t.counter_at..t.counter_at + 4].copy_from_slice(&(cdisp as i32).to_le_bytes());
        if let Some((meta_at, missed_at)) = t.record_at {
            let missed = i32::try_from(p.missed_offset + 8 * p.probe as u64)
                .map_err(|_| StubError::Params("missed counters beyond 2 GiB"))?;
            code[meta_at..meta_at + 4].copy_from_slice(&meta_of(p).to_le_bytes());
            code[missed_at..missed_at + 4].copy_from_slice(&missed.to_le_bytes());
        }
        if let Some(at) = t.probe_at {
            code[at..at + 4].copy_from_slice(&p.probe.to_le_bytes());
        }
        Ok(code)
    }
}

#[cfg(test)]
mod tests;
