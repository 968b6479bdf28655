//! Watchpoint probes: data breakpoints on reads and writes of an address,
//! through the x86 debug registers (DR0–DR3, DR7) that the process target
//! sets on every thread, those created later included
//! ([`ProcessTarget::set_watchpoints`]).
//!
//! A hit is a trap *after* the access. What is reported for it
//! ([`WatchHit`]):
//! - `pc_after`: the thread's `rip` at the trap, the instruction after the
//!   accessing one;
//! - `insn`: the accessing instruction, found by decoding forward from the
//!   start of the function holding `pc_after` (decoding backwards is not
//!   reliable) and kept only if it ends exactly at `pc_after` and one of
//!   its memory operands, computed with the registers after the access,
//!   overlaps the watched bytes; `None` otherwise (no symbol, a jump's
//!   target). An access made out of line (a boosted trap probe on the
//!   accessing instruction) is looked for in the original code;
//! - `new`: for a `mov` of a register or an immediate into the watched
//!   bytes, the value that instruction wrote (taken from its operand, so
//!   another thread writing before this trap is handled does not change
//!   it); otherwise the watched bytes as read at the trap
//!   ([`ValueSource`] says which);
//! - `old`: the value the previous hit of this watchpoint left (the value
//!   read when it was set, for the first).
//!
//! This module is a child of `session` (it adds [`Session::watch`] and
//! friends) kept in a file of its own.

use super::{Action, Session, TargetId, TARGET_SHIFT};
use crate::handler::{Handler, HitRegs};
use crate::{EngineError, HitContext, HitKind, ProbeId, ProbeStats};
use hotprobe_process::{HwWatch, WATCH_SLOTS};
use hotprobe_target::{Registers, RuntimeAddr, TargetError, ThreadId};
use std::cell::RefCell;
use std::collections::BTreeMap;

pub use hotprobe_process::WatchKind;

/// Watchpoint ids: the target in the high bits as for probes, and a local
/// number from here (far above any probe's).
const WATCH_ID_BASE: u32 = 0x00f0_0000;

/// How far the accessing instruction is searched for from its function's
/// start.
const MAX_FUNCTION_DECODE: u64 = 1 << 16;

/// Where a watchpoint is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchAt {
    /// A run-time address.
    Addr(u64),
    /// A global variable (`STT_OBJECT`): `name` or `module:name`.
    Symbol(String),
}

/// What to watch: an address or a data symbol, how many bytes (1, 2, 4 or
/// 8, aligned), and which accesses. An [`WatchKind::Execute`] watchpoint
/// is on one instruction: its symbol is a function (`name`,
/// `module:name`), its length 1.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchSpec {
    /// The address or symbol.
    pub at: WatchAt,
    /// Bytes watched; `None`: the symbol's size (which must be 1, 2, 4 or
    /// 8), or for an address the largest of 8, 4, 2, 1 it is aligned to.
    pub len: Option<u8>,
    /// Writes, or reads and writes.
    pub kind: WatchKind,
}

impl WatchSpec {
    /// `ADDR|SYMBOL[:len]`: `counter`, `counter:4`, `0x4010:8`,
    /// `libfoo:var:2`. A last `:N` of decimal digits is the length.
    pub fn parse(text: &str, kind: WatchKind) -> Result<WatchSpec, String> {
        let text = text.trim();
        let (what, len) = match text.rsplit_once(':') {
            Some((w, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => {
                let len: u8 = n
                    .parse()
                    .ok()
                    .filter(|l| matches!(l, 1 | 2 | 4 | 8))
                    .ok_or_else(|| {
                        format!("`{text}`: a watchpoint covers 1, 2, 4 or 8 bytes, not {n}")
                    })?;
                (w, Some(len))
            }
            _ => (text, None),
        };
        if what.is_empty() {
            return Err(format!("`{text}`: no address or symbol"));
        }
        let at = if let Some(hex) = what.strip_prefix("0x").or_else(|| what.strip_prefix("0X")) {
            WatchAt::Addr(
                u64::from_str_radix(hex, 16)
                    .map_err(|_| format!("`{what}` is not a hexadecimal address"))?,
            )
        } else if what.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(format!(
                "`{what}`: give an address in hexadecimal (0x...) or a symbol name"
            ));
        } else {
            WatchAt::Symbol(what.to_string())
        };
        Ok(WatchSpec { at, len, kind })
    }
}

impl std::fmt::Display for WatchSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.at {
            WatchAt::Addr(a) => write!(f, "{a:#x}")?,
            WatchAt::Symbol(s) => f.write_str(s)?,
        }
        if let Some(l) = self.len {
            write!(f, ":{l}")?;
        }
        Ok(())
    }
}

/// Where [`WatchHit::new`] comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ValueSource {
    /// The accessing instruction's source operand (a `mov` of a register
    /// or an immediate): exactly what this thread wrote.
    Instruction,
    /// The watched bytes read at the trap: another thread may have written
    /// them since this access.
    Memory,
}

/// One watchpoint hit, as its handler sees it ([`HitContext::watch`]).
/// For an [`WatchKind::Execute`] watchpoint the trap comes before the
/// instruction: `insn` and `pc_after` are its address, `old` and `new` 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchHit {
    /// The watchpoint.
    pub id: ProbeId,
    /// The thread that made the access.
    pub thread: ThreadId,
    /// The watched address.
    pub addr: u64,
    /// Bytes watched.
    pub len: u8,
    /// What the watchpoint traps on.
    pub kind: WatchKind,
    /// The value before (what the previous hit left).
    pub old: u64,
    /// The value after (see [`ValueSource`]).
    pub new: u64,
    /// Where `new` comes from.
    pub source: ValueSource,
    /// Whether the accessing instruction writes the watched bytes (`None`
    /// when that instruction is not known).
    pub write: Option<bool>,
    /// The thread's `rip` at the trap: the instruction after the access.
    pub pc_after: u64,
    /// The accessing instruction, when it could be found (see the module
    /// documentation).
    pub insn: Option<u64>,
}

/// A watchpoint's counts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchStats {
    /// Accesses seen.
    pub hits: u64,
    /// Accesses seen per thread.
    pub by_thread: BTreeMap<ThreadId, u64>,
}

/// One watchpoint of a session.
struct Watch {
    id: ProbeId,
    slot: usize,
    /// Its debug register (DR0–DR3).
    index: usize,
    hw: HwWatch,
    handler: Option<Handler>,
    last: u64,
    stats: WatchStats,
}

/// The session's watchpoints.
#[derive(Default)]
pub(crate) struct Watches {
    list: Vec<Watch>,
    next: u32,
}

impl Watches {
    fn get(&self, id: ProbeId) -> Option<&Watch> {
        self.list.iter().find(|w| w.id == id)
    }

    fn table(&self, slot: usize) -> [Option<HwWatch>; WATCH_SLOTS] {
        let mut t = [None; WATCH_SLOTS];
        for w in self.list.iter().filter(|w| w.slot == slot) {
            t[w.index] = Some(w.hw);
        }
        t
    }
}

fn refused(spec: &WatchSpec, reason: impl Into<String>) -> EngineError {
    EngineError::RefusedSpec {
        spec: spec.to_string(),
        reason: reason.into(),
    }
}

fn le_value(b: &[u8]) -> u64 {
    let mut v = [0u8; 8];
    v[..b.len()].copy_from_slice(b);
    u64::from_le_bytes(v)
}

fn mask(v: u64, len: u8) -> u64 {
    if len >= 8 {
        v
    } else {
        v & ((1u64 << (8 * len as u32)) - 1)
    }
}

impl Session {
    /// Watch `spec` in process target `t` (a data breakpoint: at most 4
    /// per process, the CPU's DR0–DR3). `action`: [`Action::Handler`] (its
    /// `pre` handler runs after each access, with [`HitContext::watch`];
    /// a `post` handler is refused) or [`Action::Count`]. The watchpoint
    /// is set on every thread at once, on new threads as they appear, and
    /// cleared from all of them at detach.
    pub fn watch(
        &mut self,
        t: TargetId,
        spec: WatchSpec,
        action: Action,
    ) -> Result<ProbeId, EngineError> {
        let handler = match action {
            Action::Count => None,
            Action::Handler(p) => {
                if p.post.is_some() {
                    return Err(refused(
                        &spec,
                        "a watchpoint's handler runs after the access: give it as `pre`",
                    ));
                }
                p.pre
            }
            Action::Return(_) | Action::Record => {
                return Err(refused(
                    &spec,
                    "a watchpoint takes a handler or a count (no return probe, no record)",
                ))
            }
        };
        let used = self.watches.table(t.0);
        let Some(index) = used.iter().position(Option::is_none) else {
            let held: Vec<String> = self
                .watches
                .list
                .iter()
                .filter(|w| w.slot == t.0)
                .map(|w| format!("{:#x}:{}", w.hw.addr, w.hw.len))
                .collect();
            return Err(refused(
                &spec,
                format!(
                    "at most {WATCH_SLOTS} watchpoints per process (debug registers DR0–DR3), \
                     all taken: {}",
                    held.join(", ")
                ),
            ));
        };
        let exec = spec.kind == WatchKind::Execute;
        // An instruction: a probe spec's address (`function[+off]`).
        let code_at = match &spec.at {
            WatchAt::Symbol(name) if exec => {
                let found = self.resolve(t, name)?;
                let [one] = found.as_slice() else {
                    return Err(refused(
                        &spec,
                        format!("{name} names {} addresses, not one", found.len()),
                    ));
                };
                Some(one.addr.0)
            }
            _ => None,
        };
        let slot = self.slot(t)?;
        if slot.engine.gone().is_some() {
            return Err(refused(&spec, "the target is gone"));
        }
        let (addr, len) = match &spec.at {
            WatchAt::Addr(a) if exec => (*a, spec.len.unwrap_or(1)),
            WatchAt::Symbol(_) if exec => (code_at.unwrap_or_default(), spec.len.unwrap_or(1)),
            WatchAt::Addr(a) => {
                let len = spec.len.unwrap_or_else(|| {
                    [8u8, 4, 2, 1]
                        .into_iter()
                        .find(|l| a % *l as u64 == 0)
                        .unwrap_or(1)
                });
                (*a, len)
            }
            WatchAt::Symbol(name) => {
                let Some(resolver) = slot.resolver.as_mut() else {
                    return Err(refused(&spec, "this target has no symbols"));
                };
                let (a, size) = resolver.resolve_data(name, slot.target.as_target())?;
                let len = match spec.len {
                    Some(l) => {
                        if size != 0 && l as u64 > size {
                            return Err(refused(
                                &spec,
                                format!("{name} is {size} bytes, fewer than {l}"),
                            ));
                        }
                        l
                    }
                    None if matches!(size, 1 | 2 | 4 | 8) => size as u8,
                    None => {
                        return Err(refused(
                            &spec,
                            format!(
                                "{name} is {size} bytes: give the bytes to watch \
                                 (`{name}:8`, `:4`, `:2` or `:1`, from its start)"
                            ),
                        ))
                    }
                };
                (a.0, len)
            }
        };
        let hw = HwWatch {
            addr,
            len,
            kind: spec.kind,
        };
        hw.check().map_err(|why| refused(&spec, why))?;
        let mut bytes = vec![0u8; len as usize];
        slot.target
            .as_target()
            .read_memory(RuntimeAddr(addr), &mut bytes)
            .map_err(|e| refused(&spec, format!("cannot read it: {e}")))?;
        let mut table = used;
        table[index] = Some(hw);
        let Some(process) = super::Slot::process(&mut slot.target) else {
            return Err(refused(
                &spec,
                "watchpoints need a process target (debug registers through ptrace)",
            ));
        };
        process.set_watchpoints(table)?;
        let id = ProbeId(((t.0 as u32) << TARGET_SHIFT) | (WATCH_ID_BASE + self.watches.next));
        self.watches.next += 1;
        self.watches.list.push(Watch {
            id,
            slot: t.0,
            index,
            hw,
            handler,
            last: le_value(&bytes),
            stats: WatchStats::default(),
        });
        Ok(id)
    }

    /// Remove a watchpoint (from every thread); its counts are gone too.
    pub fn unwatch(&mut self, id: ProbeId) -> Result<(), EngineError> {
        let Some(pos) = self.watches.list.iter().position(|w| w.id == id) else {
            return Err(EngineError::NoSuchProbe(id));
        };
        let w = self.watches.list.remove(pos);
        let table = self.watches.table(w.slot);
        let slot = self.slot(TargetId(w.slot))?;
        if slot.engine.gone().is_some() {
            return Ok(());
        }
        if let Some(p) = super::Slot::process(&mut slot.target) {
            p.set_watchpoints(table)?;
        }
        Ok(())
    }

    /// A watchpoint's counts, per thread (see also [`Session::stats`]).
    pub fn watch_stats(&self, id: ProbeId) -> Option<WatchStats> {
        self.watches.get(id).map(|w| w.stats.clone())
    }

    /// [`ProbeStats`] of a watchpoint (`hits` only), with its process.
    pub(crate) fn watch_probe_stats(&self, id: ProbeId) -> Option<Vec<(i32, ProbeStats)>> {
        let w = self.watches.get(id)?;
        let pid = self.slots.get(w.slot).and_then(|s| s.pid).unwrap_or(0);
        Some(vec![(
            pid,
            ProbeStats {
                hits: w.stats.hits,
                ..ProbeStats::default()
            },
        )])
    }

    /// The session loop's hook: a thread of slot `i` made a watched access
    /// (`fired`: DR6's B0–B3). Each fired watchpoint counts it and runs its
    /// handler; the thread then runs on. True when a handler asked to stop.
    pub(crate) fn on_watchpoint(
        &mut self,
        i: usize,
        thread: ThreadId,
        fired: u8,
        regs: Registers,
    ) -> Result<bool, EngineError> {
        let mut hr = HitRegs::complete(regs);
        // The CPU did not say which (DR6 empty): only a watchpoint the
        // accessing instruction is found to touch counts the hit.
        let unsure = fired & hotprobe_target::WATCH_SLOTS_UNKNOWN != 0;
        let mut counted = false;
        let super::Slot { engine, target, .. } = &mut self.slots[i];
        for w in self
            .watches
            .list
            .iter_mut()
            .filter(|w| w.slot == i && fired & (1 << w.index) != 0)
        {
            let pc_after = regs.rip;
            // An access made out of line (a boosted probe on the accessing
            // instruction) is looked for in the original code.
            let pc = engine.original_of(pc_after).unwrap_or(pc_after);
            let mut at = regs;
            at.rip = pc;
            let (stop, symbolizer) = engine.handler_parts();
            let found = symbolizer
                .and_then(|s| s.function_start(RuntimeAddr(pc)))
                .filter(|f| f.0 < pc && pc - f.0 <= MAX_FUNCTION_DECODE)
                .and_then(|f| {
                    let mut code = vec![0u8; (pc - f.0) as usize];
                    target.read_memory(f, &mut code).ok()?;
                    hotprobe_x86::data_access(&code, f.0, &at, w.hw.addr, w.hw.len)
                });
            if unsure && found.is_none() {
                continue;
            }
            counted = true;
            let mut bytes = [0u8; 8];
            let memory =
                match target.read_memory(RuntimeAddr(w.hw.addr), &mut bytes[..w.hw.len as usize]) {
                    Ok(()) => le_value(&bytes[..w.hw.len as usize]),
                    Err(_) => w.last,
                };
            let (new, source) = match found.as_ref().and_then(|a| a.written) {
                Some(v) => (mask(v, w.hw.len), ValueSource::Instruction),
                None => (memory, ValueSource::Memory),
            };
            let hit = if w.hw.kind == WatchKind::Execute {
                // Before the instruction runs: it is at `rip`, no value.
                crate::WatchHit {
                    id: w.id,
                    thread,
                    addr: w.hw.addr,
                    len: w.hw.len,
                    kind: w.hw.kind,
                    old: 0,
                    new: 0,
                    source: ValueSource::Memory,
                    write: Some(false),
                    pc_after,
                    insn: Some(pc_after),
                }
            } else {
                crate::WatchHit {
                    id: w.id,
                    thread,
                    addr: w.hw.addr,
                    len: w.hw.len,
                    kind: w.hw.kind,
                    old: w.last,
                    new,
                    source,
                    write: found.as_ref().map(|a| a.writes),
                    pc_after,
                    insn: found.as_ref().map(|a| a.addr),
                }
            };
            w.last = new;
            w.stats.hits += 1;
            *w.stats.by_thread.entry(thread).or_default() += 1;
            let Some(f) = w.handler.as_mut() else {
                continue;
            };
            let fetch_error = {
                let mut ctx = HitContext {
                    target: RefCell::new(target.as_target()),
                    thread,
                    regs: &mut hr,
                    probe: w.id,
                    addr: RuntimeAddr(w.hw.addr),
                    kind: HitKind::Watch,
                    stop,
                    symbolizer,
                    entry: None,
                    fetch_error: RefCell::new(None),
                    watch: Some(hit),
                    stack: None,
                };
                f(&mut ctx);
                ctx.fetch_error.into_inner()
            };
            if let Some(e) = fetch_error {
                return Err(e.into());
            }
        }
        if unsure && !counted {
            self.slots[i].notice(format!(
                "a watchpoint trap at {:#x} did not say which watchpoint fired \
                 (the CPU's DR6 was empty, as a virtual CPU may leave it), and no \
                 watched address was found in the instruction before: not counted",
                regs.rip
            ));
        }
        let super::Slot { engine, target, .. } = &mut self.slots[i];
        if let Some(r) = hr.fetched() {
            if *r != regs {
                target.set_registers(thread, r)?;
            }
        }
        match target.resume(thread, hotprobe_target::ResumeMode::Continue) {
            Ok(()) | Err(TargetError::Gone { .. }) => {}
            Err(TargetError::NoSuchThread { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        Ok(engine.take_stop())
    }

    /// The session loop's once-a-second hook, and the last look before
    /// detaching: a watched value that differs from what the last hit
    /// left was written by no instruction the debug registers see — the
    /// kernel (`read(2)` into it, any system call's output) or another
    /// process. A notice says so with both values read, and the next hit's
    /// `old` is the value read now, not a stale one.
    pub(crate) fn check_unseen_writes(&mut self) {
        for w in self
            .watches
            .list
            .iter_mut()
            .filter(|w| w.hw.kind != WatchKind::Execute)
        {
            let Some(slot) = self.slots.get_mut(w.slot) else {
                continue;
            };
            if slot.engine.gone().is_some() {
                continue;
            }
            let len = w.hw.len as usize;
            let mut bytes = [0u8; 8];
            if slot
                .target
                .as_target()
                .read_memory(RuntimeAddr(w.hw.addr), &mut bytes[..len])
                .is_err()
            {
                continue;
            }
            let now = le_value(&bytes[..len]);
            if now != w.last {
                slot.notice(format!(
                    "watch {:#x}:{}: {} -> {} with no watched access: written by the kernel                      (a system call's output, e.g. read(2) into it) or by another process",
                    w.hw.addr, w.hw.len, w.last, now
                ));
                w.last = now;
            }
        }
    }

    /// Whether some watchpoint on data is set (the loop then wakes once a
    /// second for [`Session::check_unseen_writes`]).
    pub(crate) fn has_data_watches(&self) -> bool {
        self.watches
            .list
            .iter()
            .any(|w| w.hw.kind != WatchKind::Execute)
    }

    /// The session loop's hook at an exec of slot `i`: the kernel dropped
    /// the debug registers, the addresses mean nothing in the new image.
    pub(crate) fn watches_exec(&mut self, i: usize) {
        let n = self.watches.list.iter().filter(|w| w.slot == i).count();
        if n > 0 {
            let who = self.slots[i].target.as_target().describe();
            self.slots[i].notice(format!(
                "{who}: exec: {n} watchpoints dropped (their counts before the exec are kept)"
            ));
            // Kept for their counts; their debug registers are free again.
            for w in self.watches.list.iter_mut().filter(|w| w.slot == i) {
                w.slot = usize::MAX;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_specs() {
        let w = WatchKind::Write;
        assert_eq!(
            WatchSpec::parse("counter", w).unwrap(),
            WatchSpec {
                at: WatchAt::Symbol("counter".into()),
                len: None,
                kind: w
            }
        );
        assert_eq!(WatchSpec::parse("counter:4", w).unwrap().len, Some(4));
        assert_eq!(
            WatchSpec::parse("libfoo:var:2", w).unwrap(),
            WatchSpec {
                at: WatchAt::Symbol("libfoo:var".into()),
                len: Some(2),
                kind: w
            }
        );
        assert_eq!(
            WatchSpec::parse("0x4010:8", w).unwrap().at,
            WatchAt::Addr(0x4010)
        );
        assert!(WatchSpec::parse("counter:3", w).is_err());
        assert!(WatchSpec::parse("counter:99999", w).is_err());
        assert!(WatchSpec::parse("0xzz", w).is_err());
        assert!(WatchSpec::parse("1234", w).is_err());
        assert!(WatchSpec::parse(":4", w).is_err());
        assert!(WatchSpec::parse("", w).is_err());
    }
}
