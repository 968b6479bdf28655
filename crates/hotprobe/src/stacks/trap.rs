//! Stacks at a trap hit (issue 24, `--stacks` on the ptrace trap): the
//! agent's walk needs its trampoline, so a probe on the trap (`--mechanism
//! trap`, a static binary with no agent, a site nothing faster fits) is
//! walked in the tracer instead, at the stop, with the same rows
//! ([`StackTables`](super::StackTables) compiles them) and the same walk
//! ([`hotprobe_abi::stacks::walk`]), reading the target's memory through
//! the target (`process_vm_readv` for a process: a word that is not mapped
//! fails instead of faulting). The stacks are counted here, per probe, as
//! the agent counts its own in the stacks region.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

use hotprobe_abi::stacks::{find_row, walk, StackRow, WalkStart, MAX_FRAMES};
use hotprobe_target::{Registers, RuntimeAddr, Target};

use super::publish::{StackCount, StackTotals};
use crate::handler::ProbeId;

/// How far above the hit's stack pointer the walk reads (the default
/// stack size): garbage frame pointers go no further.
const STACK_SPAN: u64 = 8 << 20;

/// The stacks of one process's trap probes, shared between the session
/// (which says which probes walk and publishes the rows) and the engine's
/// stack hook (which walks at each hit).
#[derive(Clone, Debug, Default)]
pub struct TrapStacks {
    inner: Rc<RefCell<TrapState>>,
}

#[derive(Debug, Default)]
struct TrapState {
    /// The compiled rows of the process's modules, sorted by address.
    rows: Vec<StackRow>,
    /// The probes whose hits walk (trap probes at a function's entry).
    probes: HashSet<ProbeId>,
    /// The probes a followed fork child got again, each counting for its
    /// parent's probe.
    aliases: HashMap<ProbeId, ProbeId>,
    /// (probe, return addresses innermost first, truncated) → hits.
    counts: HashMap<(ProbeId, Vec<u64>, bool), u64>,
    totals: StackTotals,
}

impl TrapStacks {
    /// No probe walks yet.
    pub fn new() -> TrapStacks {
        TrapStacks::default()
    }

    /// The rows the walks follow from now on (sorted by address).
    pub fn set_rows(&self, rows: &[StackRow]) {
        let mut s = self.inner.borrow_mut();
        s.rows.clear();
        s.rows.extend_from_slice(rows);
    }

    /// Probe `id`'s hits walk their stack from now on.
    pub fn add_probe(&self, id: ProbeId) {
        self.inner.borrow_mut().probes.insert(id);
    }

    /// Probe `child` (placed again in a followed fork child, whose
    /// engine shares these stacks) counts its stacks as `parent`'s, if
    /// `parent` walks.
    pub fn add_alias(&self, child: ProbeId, parent: ProbeId) {
        let mut s = self.inner.borrow_mut();
        if s.probes.contains(&parent) {
            s.aliases.insert(child, parent);
        }
    }

    /// Whether probe `id`'s hits walk their stack.
    pub fn has_probe(&self, id: ProbeId) -> bool {
        let s = self.inner.borrow();
        s.probes.contains(&id) || s.aliases.contains_key(&id)
    }

    /// Whether any probe walks.
    pub fn is_active(&self) -> bool {
        !self.inner.borrow().probes.is_empty()
    }

    /// Walks the stack of an entry hit of `probe` (`regs`: the thread's
    /// registers at the function's first instruction, `[rsp]` its return
    /// address) and counts it. `fix(slot, word)` gives the real return
    /// address of a word the tracer swapped for its return trampoline.
    pub fn on_hit(
        &self,
        target: &mut dyn Target,
        probe: ProbeId,
        regs: &Registers,
        fix: &dyn Fn(u64, u64) -> u64,
    ) {
        let mut s = self.inner.borrow_mut();
        let probe = match s.aliases.get(&probe) {
            Some(parent) => *parent,
            None if s.probes.contains(&probe) => probe,
            None => return,
        };
        let sp = regs.rsp;
        let mut read = |addr: u64| -> Option<u64> {
            if addr < sp || addr - sp > STACK_SPAN || !addr.is_multiple_of(8) {
                return None;
            }
            let mut b = [0u8; 8];
            target.read_memory(RuntimeAddr(addr), &mut b).ok()?;
            Some(u64::from_le_bytes(b))
        };
        let Some(first) = read(sp) else {
            s.totals.no_region += 1;
            return;
        };
        let start = WalkStart {
            ret: fix(sp, first),
            rsp: sp.wrapping_add(8),
            rbp: regs.rbp,
        };
        let mut frames = [0u64; MAX_FRAMES];
        let end = {
            let rows = &s.rows;
            walk(
                |pc| find_row(rows, pc).copied(),
                start,
                read,
                |at, w| Some(fix(at, w)),
                &mut frames,
            )
        };
        s.totals.captured += 1;
        if end.truncated {
            s.totals.truncated += 1;
        }
        let key = (probe, frames[..end.depth].to_vec(), end.truncated);
        *s.counts.entry(key).or_insert(0) += 1;
    }

    /// The stacks counted for `probe`, most frequent first (its probe
    /// field is 0: these are the session's probe's own).
    pub fn stacks_of(&self, probe: ProbeId) -> Vec<StackCount> {
        let s = self.inner.borrow();
        let mut out: Vec<StackCount> = s
            .counts
            .iter()
            .filter(|((p, _, _), _)| *p == probe)
            .map(|((_, frames, truncated), count)| StackCount {
                probe: 0,
                frames: frames.clone(),
                truncated: *truncated,
                count: *count,
            })
            .collect();
        out.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.frames.cmp(&b.frames)));
        out
    }

    /// What the walks counted, over every probe.
    pub fn totals(&self) -> StackTotals {
        self.inner.borrow().totals
    }
}
