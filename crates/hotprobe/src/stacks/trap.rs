//! Stacks at a trap hit (issue 24, `--stacks` on the ptrace trap): the
//! agent's walk needs its trampoline, so a probe on the trap (`--mechanism
//! trap`, a static binary with no agent, a site nothing faster fits) is
//! walked in the tracer instead, at the stop, with the same rows
//! ([`StackTables`](super::StackTables) compiles them) and the same walk
//! ([`hotprobe_abi::stacks::walk`]), reading the target's memory through
//! the target (`process_vm_readv` for a process: a word that is not mapped
//! fails instead of faulting). The stacks are counted here, per probe, as
//! the agent counts its own in the stacks region. Each distinct stack also
//! gets an id ([`TRAP_STACK_ID`] set, unique in the process), which the
//! engine hands to the probe's handler (`HitContext::stack_id`): a trap
//! `Record` probe's entry event carries it as the agent's carry theirs
//! (`RecordedEvent::reserved2`), and [`TrapStacks::call_stack`] names it
//! while the session runs (`record --stacks`: each call's stack).

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU32, Ordering};

use hotprobe_abi::stacks::{find_row, walk, StackRow, WalkStart, MAX_FRAMES};
use hotprobe_target::{Registers, RuntimeAddr, Target};

use super::names::{CallStack, SharedSymbols};
use super::publish::{frame_name, StackCount, StackTotals};
use crate::handler::ProbeId;

/// The bit that marks the id of a stack the tracer walked at a trap hit
/// (the agent's ids, 1 + a slot of its stack table, stay below it).
pub const TRAP_STACK_ID: u32 = 1 << 31;

/// The next trap stack id (without [`TRAP_STACK_ID`]): unique in the
/// process, so that a stack is found by its id alone, whichever image or
/// followed child walked it.
static NEXT_TRAP_STACK: AtomicU32 = AtomicU32::new(1);

thread_local! {
    /// The trap stacks of this thread's sessions (each session lives on
    /// one thread), for [`TrapStacks::call_stack`]; dead ones are pruned
    /// as new ones come.
    static LIVE: RefCell<Vec<Weak<RefCell<TrapState>>>> = const { RefCell::new(Vec::new()) };
}

/// How far above the hit's stack pointer the walk reads (the default
/// stack size): garbage frame pointers go no further.
const STACK_SPAN: u64 = 8 << 20;

/// The stacks of one process's trap probes, shared between the session
/// (which says which probes walk and publishes the rows) and the engine's
/// stack hook (which walks at each hit).
#[derive(Clone, Debug)]
pub struct TrapStacks {
    inner: Rc<RefCell<TrapState>>,
}

impl Default for TrapStacks {
    fn default() -> TrapStacks {
        let inner = Rc::new(RefCell::new(TrapState::default()));
        LIVE.with(|live| {
            let mut live = live.borrow_mut();
            live.retain(|w| w.strong_count() > 0);
            live.push(Rc::downgrade(&inner));
        });
        TrapStacks { inner }
    }
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
    /// (probe, return addresses, truncated) → its id ([`TRAP_STACK_ID`] set).
    ids: HashMap<(ProbeId, Vec<u64>, bool), u32>,
    /// Id → (return addresses, truncated).
    by_id: HashMap<u32, (Vec<u64>, bool)>,
    /// The modules the stacks are named with (the owning tables').
    symbols: SharedSymbols,
    totals: StackTotals,
}

impl TrapStacks {
    /// No probe walks yet.
    pub fn new() -> TrapStacks {
        TrapStacks::default()
    }

    /// Stacks named with `symbols` (the modules of the tables whose rows
    /// the walks follow).
    pub fn named_with(symbols: SharedSymbols) -> TrapStacks {
        let t = TrapStacks::default();
        t.inner.borrow_mut().symbols = symbols;
        t
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
    /// address) and counts it; its id ([`TRAP_STACK_ID`] set), or `None`
    /// when the probe does not walk. A stack that cannot be read at all
    /// (`rsp` unreadable) is counted in [`StackTotals::unwalked`] and as
    /// an empty truncated stack, which has an id too. `fix(slot, word)` gives the
    /// real return address of a word the tracer swapped for its return
    /// trampoline.
    pub fn on_hit(
        &self,
        target: &mut dyn Target,
        probe: ProbeId,
        regs: &Registers,
        fix: &dyn Fn(u64, u64) -> u64,
    ) -> Option<u32> {
        let mut s = self.inner.borrow_mut();
        let probe = match s.aliases.get(&probe) {
            Some(parent) => *parent,
            None if s.probes.contains(&probe) => probe,
            None => return None,
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
        let key = match read(sp) {
            Some(first) => {
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
                (probe, frames[..end.depth].to_vec(), end.truncated)
            }
            None => {
                // Not even the return address: counted (and recorded) as
                // an empty truncated stack, so that the call is not lost
                // from the stacks (`[unknown]` caller in the reports).
                s.totals.unwalked += 1;
                (probe, Vec::new(), true)
            }
        };
        *s.counts.entry(key.clone()).or_insert(0) += 1;
        if let Some(id) = s.ids.get(&key) {
            return Some(*id);
        }
        let Ok(n) = NEXT_TRAP_STACK.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < TRAP_STACK_ID).then_some(n + 1)
        }) else {
            // 2^31 distinct stacks: counted, but no id to record (said
            // as a stack not walked).
            s.totals.unwalked += 1;
            return None;
        };
        let id = TRAP_STACK_ID | n;
        s.by_id.insert(id, (key.1.clone(), key.2));
        s.ids.insert(key, id);
        Some(id)
    }

    /// The stack of id `id` ([`TRAP_STACK_ID`] set) walked by any trap
    /// of this thread's live sessions, named with the modules of the
    /// tables it was walked with; `None` for an id no live walk gave.
    pub fn call_stack(id: u32) -> Option<CallStack> {
        if id & TRAP_STACK_ID == 0 {
            return None;
        }
        LIVE.with(|live| {
            live.borrow().iter().find_map(|w| {
                let state = w.upgrade()?;
                let s = state.borrow();
                let (addrs, truncated) = s.by_id.get(&id)?;
                let symbols = s.symbols.borrow();
                let frames = addrs
                    .iter()
                    .map(|a| match &*symbols {
                        Some(sym) => frame_name(sym, *a),
                        None => format!("{a:#x}"),
                    })
                    .collect();
                Some(CallStack {
                    frames,
                    truncated: *truncated,
                })
            })
        })
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
