//! The code ledger of a target (issue 21): one store of every byte range
//! any mechanism wrote into the target's code — the trap engine's `int3`s
//! and their guards, the session's own `int3`s (return trampoline, loader
//! rendezvous), the fast path's patch calls and jumps with their padding,
//! the agent's in-process traps — each with its owner and the bytes it
//! replaced.
//!
//! The session writes each entry as the write is made: the fast path's
//! sites from what `FastPath::written_since` lists after the placement, the
//! `int3`s from what `ProcessTarget::take_breakpoint_changes` reports (the
//! ledger is that list's only reader; the trap mechanism publishes the
//! changes it hands on, see [`CodeLedger::take_trap_changes`]).
//!
//! Sites are kept in a `Vec` sorted by their first address: placements
//! mostly come in address order and are appended; a lookup is a binary
//! search (issue 21's PERFORMANCE note: a `BTreeMap` index cost arming
//! 100,000 patch probes about 15 %).
//!
//! The rule between mechanisms (a second probe at an address another
//! mechanism serves joins that site when it can serve the action, is
//! refused with the reason when it cannot, and is never written over the
//! first) is in `plan.rs` (`Session::fit_to_ledger`).

use crate::handler::ProbeId;

/// Who wrote a site's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeOwner {
    /// An `int3` of the process target: a trap probe's, or the session's
    /// own (return trampoline, loader rendezvous, unwind hooks).
    Trap,
    /// A guard `int3` one byte into a trap's instruction (see
    /// `hotprobe_fastpath::TRAP_GUARD`).
    Guard,
    /// The agent's in-process trap.
    InProcess,
    /// A patch call or a jump of the fast path (and their padding).
    Fast,
}

impl CodeOwner {
    /// The mechanism whose list holds these bytes (the fast path's list
    /// holds the agent's in-process traps too).
    pub(crate) fn writer(self) -> super::mech::MechKind {
        use super::mech::MechKind;
        match self {
            CodeOwner::Trap | CodeOwner::Guard => MechKind::Trap,
            CodeOwner::Fast | CodeOwner::InProcess => MechKind::Fast,
        }
    }
}

/// `int3` changes kept for the trap mechanism before it is told to look
/// at all of them instead.
const MAX_TRAP_CHANGES: usize = 1 << 16;

/// Up to this many original bytes are kept inline (a jump displaces whole
/// instructions: 5 bytes and at most one more instruction).
const INLINE: usize = 24;

/// The bytes a write replaced, inline when short (no allocation for the
/// usual site).
#[derive(Clone, Debug)]
enum Original {
    Inline(u8, [u8; INLINE]),
    Heap(Box<[u8]>),
}

impl Original {
    fn new(bytes: &[u8]) -> Original {
        if bytes.len() <= INLINE {
            let mut b = [0u8; INLINE];
            b[..bytes.len()].copy_from_slice(bytes);
            Original::Inline(bytes.len() as u8, b)
        } else {
            Original::Heap(bytes.into())
        }
    }

    fn bytes(&self) -> &[u8] {
        match self {
            Original::Inline(n, b) => &b[..*n as usize],
            Original::Heap(b) => b,
        }
    }
}

/// One site of the ledger: what `owner` wrote at `start` replaced
/// [`CodeSite::original`].
#[derive(Clone, Debug)]
pub struct CodeSite {
    /// The first byte written.
    pub start: u64,
    /// Who wrote it.
    pub owner: CodeOwner,
    original: Original,
    /// The session probes a fast-path site serves, and whether each
    /// records (none for an exit placeholder, a stub, an `int3`).
    first: Option<(ProbeId, bool)>,
    more: Vec<(ProbeId, bool)>,
}

impl CodeSite {
    /// The bytes the write replaced (the code as it was in the file).
    pub fn original(&self) -> &[u8] {
        self.original.bytes()
    }

    /// One past the last byte written.
    pub fn end(&self) -> u64 {
        self.start + self.original.bytes().len() as u64
    }

    /// The session probes on a fast-path site.
    pub(crate) fn probes(&self) -> impl Iterator<Item = (ProbeId, bool)> + '_ {
        self.first.into_iter().chain(self.more.iter().copied())
    }

    /// Whether a fast-path site serves a probe.
    pub(crate) fn has_probes(&self) -> bool {
        self.first.is_some()
    }

    /// Takes probe `id` off the site; false when the site had probes and
    /// has none left (its bytes were taken out).
    fn drop_probe(&mut self, id: ProbeId) -> bool {
        let had = self.first.is_some();
        self.more.retain(|(p, _)| *p != id);
        if self.first.is_some_and(|(p, _)| p == id) {
            self.first = (!self.more.is_empty()).then(|| self.more.remove(0));
        }
        !had || self.first.is_some()
    }

    fn is_agent(&self) -> bool {
        matches!(self.owner, CodeOwner::Fast | CodeOwner::InProcess)
    }
}

/// Every byte range the mechanisms wrote into one target's code (see the
/// module docs).
#[derive(Default)]
pub struct CodeLedger {
    /// Sorted by `start` (ties in the order written).
    sites: Vec<CodeSite>,
    /// The agent's writes already taken in: its write count and
    /// `removals()` then (the agent's list is taken in again whole when
    /// writes left it since).
    agent_synced: (usize, u64),
    /// `int3` addresses written or taken out since the trap mechanism last
    /// published them (`None`: all of them).
    trap_changes: Option<Vec<u64>>,
}

impl CodeLedger {
    /// Every site, by address.
    pub fn sites(&self) -> &[CodeSite] {
        &self.sites
    }

    /// Where a site starting at `start` goes (after the ones already
    /// starting there).
    fn slot_for(&self, start: u64) -> usize {
        match self.sites.last() {
            Some(last) if last.start > start => self.sites.partition_point(|s| s.start <= start),
            _ => self.sites.len(),
        }
    }

    /// Records a write of `owner` at `start` that replaced `original`.
    /// A second write of the fast path at the same address keeps the first
    /// one's original (the file's bytes), lengthened if it is longer.
    pub(crate) fn insert(&mut self, start: u64, original: &[u8], owner: CodeOwner) {
        let i = self.slot_for(start);
        if let Some(s) = self.sites[..i]
            .iter_mut()
            .rev()
            .take_while(|s| s.start == start)
            .find(|s| s.owner == owner)
        {
            let old = s.original.bytes();
            if original.len() > old.len() {
                let mut b = old.to_vec();
                b.extend_from_slice(&original[old.len()..]);
                s.original = Original::new(&b);
            }
            return;
        }
        self.sites.insert(
            i,
            CodeSite {
                start,
                owner,
                original: Original::new(original),
                first: None,
                more: Vec::new(),
            },
        );
    }

    /// The index of the site of `owner` starting at `start`.
    fn find(&self, start: u64, owner: impl Fn(CodeOwner) -> bool) -> Option<usize> {
        let i = self.sites.partition_point(|s| s.start < start);
        (i..self.sites.len())
            .take_while(|k| self.sites[*k].start == start)
            .find(|k| owner(self.sites[*k].owner))
    }

    /// Forgets the site of `owner` starting at `start`, if any.
    pub(crate) fn remove(&mut self, start: u64, owner: CodeOwner) {
        if let Some(i) = self.find(start, |o| o == owner) {
            self.sites.remove(i);
        }
    }

    /// Forgets every site starting in `start..end` (an unmapped module:
    /// nothing is restored, the memory is gone).
    pub(crate) fn forget_range(&mut self, start: u64, end: u64) {
        self.sites.retain(|s| s.start < start || s.start >= end);
    }

    /// Forgets the agent's sites (exec, exit: the image is gone).
    pub(crate) fn forget_agent(&mut self) {
        self.sites.retain(|s| !s.is_agent());
    }

    /// Forgets every site (detach: each writer put its bytes back).
    pub(crate) fn clear(&mut self) {
        self.sites.clear();
        self.trap_changes = Some(Vec::new());
    }

    /// Puts `probe` on the fast-path site starting at `start`.
    pub(crate) fn add_probe(&mut self, start: u64, probe: (ProbeId, bool)) {
        let i = match self.find(start, |o| o == CodeOwner::Fast) {
            Some(i) => i,
            None => {
                self.insert(start, &[], CodeOwner::Fast);
                self.find(start, |o| o == CodeOwner::Fast)
                    .expect("just inserted")
            }
        };
        let s = &mut self.sites[i];
        match s.first {
            None => s.first = Some(probe),
            Some(_) => s.more.push(probe),
        }
    }

    /// Takes probe `id` off the fast-path sites; a site left without
    /// probes is forgotten (the fast path took its bytes out).
    pub(crate) fn drop_probe(&mut self, id: ProbeId) {
        self.sites
            .retain_mut(|s| s.owner != CodeOwner::Fast || s.drop_probe(id));
    }

    /// The fast-path site starting at `start`.
    #[cfg(test)]
    fn fast_site(&self, start: u64) -> Option<&CodeSite> {
        self.find(start, |o| o == CodeOwner::Fast)
            .map(|i| &self.sites[i])
    }

    /// Forgets the fast-path site starting at `start` and hands back its
    /// probes.
    pub(crate) fn take_fast_site(&mut self, start: u64) -> Vec<(ProbeId, bool)> {
        match self.find(start, |o| o == CodeOwner::Fast) {
            Some(i) => self.sites.remove(i).probes().collect(),
            None => Vec::new(),
        }
    }

    /// The site whose bytes hold `addr`, the agent's in-process trap
    /// first, then the fast path's, then an `int3`.
    pub(crate) fn site_at(&self, addr: u64) -> Option<&CodeSite> {
        let i = self.sites.partition_point(|s| s.start <= addr);
        let rank = |o: CodeOwner| match o {
            CodeOwner::InProcess => 0,
            CodeOwner::Fast => 1,
            CodeOwner::Trap | CodeOwner::Guard => 2,
        };
        // The sites starting at the last start at or before `addr` (sites
        // do not overlap: a write never goes over another's bytes).
        let last = self.sites[..i].last()?.start;
        self.sites[..i]
            .iter()
            .rev()
            .take_while(|s| s.start == last)
            .filter(|s| s.end() > addr || (s.start == addr && s.end() == s.start))
            .min_by_key(|s| rank(s.owner))
    }

    /// The first site start in `from..to`, if any.
    pub(crate) fn first_start_in(&self, from: u64, to: u64) -> Option<u64> {
        if from >= to {
            return None;
        }
        let i = self.sites.partition_point(|s| s.start < from);
        self.sites.get(i).map(|s| s.start).filter(|s| *s < to)
    }

    /// The originals that lie in `start..end`, for laying over code read
    /// from the target (`hotprobe_resolve::lay_over`): the latest write
    /// first, so that the first one's bytes (the file's) are laid last.
    pub(crate) fn originals_in(&self, start: u64, end: u64) -> Vec<(u64, Vec<u8>)> {
        // A site holding `start` starts at most one jump's length before.
        let from = self
            .sites
            .partition_point(|s| s.start.saturating_add(INLINE as u64 * 4) < start);
        let mut v: Vec<(u64, Vec<u8>)> = self.sites[from..]
            .iter()
            .take_while(|s| s.start < end)
            .filter(|s| s.end() > start)
            .map(|s| (s.start, s.original().to_vec()))
            .collect();
        v.reverse();
        v
    }

    /// The agent's writes as (address, original bytes): what a forked
    /// child inherits, what a crash check looks at.
    pub(crate) fn agent_writes(&self) -> Vec<(u64, Vec<u8>)> {
        self.sites
            .iter()
            .filter(|s| s.is_agent())
            .map(|s| (s.start, s.original().to_vec()))
            .collect()
    }

    /// Takes in the agent's writes since the last call (`count` writes
    /// listed now, `removals` as `FastPath::removals` says, `since(from)`
    /// listing them from the `from`-th on). Returns the writes new to the
    /// ledger and whether the agent's list was taken in whole again
    /// (writes left it since): then the returned list is all of them.
    pub(crate) fn sync_agent(
        &mut self,
        count: usize,
        removals: u64,
        since: impl FnOnce(usize) -> Vec<(u64, Vec<u8>, bool)>,
    ) -> (Vec<(u64, Vec<u8>)>, bool) {
        let (synced, seen) = self.agent_synced;
        let whole = !(removals == seen && count >= synced);
        let from = if whole { 0 } else { synced };
        let new = since(from);
        if whole {
            // Keep the probes of the fast-path sites that are still there.
            let old: Vec<CodeSite> = self
                .sites
                .iter()
                .filter(|s| s.is_agent() && s.has_probes())
                .cloned()
                .collect();
            self.forget_agent();
            for s in old {
                for p in s.probes() {
                    self.add_probe(s.start, p);
                }
            }
        }
        let mut out = Vec::with_capacity(new.len());
        for (a, original, inproc) in new {
            let owner = match inproc {
                true => CodeOwner::InProcess,
                false => CodeOwner::Fast,
            };
            self.insert(a, &original, owner);
            out.push((a, original));
        }
        if whole {
            // Sites of probes whose bytes are gone (none listed).
            self.sites
                .retain(|s| s.owner != CodeOwner::Fast || !s.original().is_empty());
        }
        self.agent_synced = (count, removals);
        (out, whole)
    }

    /// Takes in the `int3`s written or taken out (`changed`, `None`: every
    /// one, listed by `all`), `at(a)` telling the original byte under the
    /// `int3` at `a` now, if there is one, and `guard(a)` whether it is a
    /// guard. Kept for the trap mechanism to publish.
    pub(crate) fn sync_traps(
        &mut self,
        changed: Option<Vec<u64>>,
        all: impl FnOnce() -> Vec<(u64, u8)>,
        at: impl Fn(u64) -> Option<u8>,
        guard: impl Fn(u64) -> bool,
    ) {
        let is_trap = |s: &CodeSite| matches!(s.owner, CodeOwner::Trap | CodeOwner::Guard);
        match changed {
            Some(changed) => {
                for &a in &changed {
                    if let Some(i) =
                        self.find(a, |o| matches!(o, CodeOwner::Trap | CodeOwner::Guard))
                    {
                        self.sites.remove(i);
                    }
                    if let Some(b) = at(a) {
                        let owner = match guard(a) {
                            true => CodeOwner::Guard,
                            false => CodeOwner::Trap,
                        };
                        self.insert(a, &[b], owner);
                    }
                }
                if let Some(v) = &mut self.trap_changes {
                    v.extend(changed);
                    // Nobody took them (no trap table): all of them, later.
                    if v.len() > MAX_TRAP_CHANGES {
                        self.trap_changes = None;
                    }
                }
            }
            None => {
                self.sites.retain(|s| !is_trap(s));
                for (a, b) in all() {
                    let owner = match guard(a) {
                        true => CodeOwner::Guard,
                        false => CodeOwner::Trap,
                    };
                    self.insert(a, &[b], owner);
                }
                self.trap_changes = None;
            }
        }
    }

    /// The `int3` addresses changed since the last call, for the trap
    /// mechanism's table (`None`: look at all of them).
    pub(crate) fn take_trap_changes(&mut self) -> Option<Vec<u64>> {
        let v = self.trap_changes.replace(Vec::new())?;
        Some(v)
    }

    /// The `int3` addresses, guards included.
    pub(crate) fn traps(&self) -> impl Iterator<Item = u64> + '_ {
        self.sites
            .iter()
            .filter(|s| matches!(s.owner, CodeOwner::Trap | CodeOwner::Guard))
            .map(|s| s.start)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sites_stay_sorted_and_found() {
        let mut l = CodeLedger::default();
        l.insert(0x100, &[1, 2, 3, 4, 5], CodeOwner::Fast);
        l.insert(0x200, &[9], CodeOwner::Trap);
        l.insert(0x180, &[7], CodeOwner::InProcess);
        let starts: Vec<u64> = l.sites().iter().map(|s| s.start).collect();
        assert_eq!(starts, [0x100, 0x180, 0x200]);
        assert_eq!(l.site_at(0x103).map(|s| s.start), Some(0x100));
        assert_eq!(l.site_at(0x105).map(|s| s.start), None);
        assert_eq!(
            l.site_at(0x180).map(|s| s.owner),
            Some(CodeOwner::InProcess)
        );
        assert_eq!(l.first_start_in(0x101, 0x181), Some(0x180));
        assert_eq!(l.first_start_in(0x101, 0x180), None);
        assert_eq!(
            l.originals_in(0x102, 0x104),
            vec![(0x100, vec![1, 2, 3, 4, 5])]
        );
        l.remove(0x180, CodeOwner::InProcess);
        assert_eq!(l.site_at(0x180).map(|s| s.start), None);
    }

    #[test]
    fn a_second_write_keeps_the_files_bytes() {
        let mut l = CodeLedger::default();
        l.insert(0x100, &[1, 2], CodeOwner::Fast);
        l.insert(0x100, &[0xe8, 0, 0], CodeOwner::Fast);
        assert_eq!(l.sites().len(), 1);
        assert_eq!(l.sites()[0].original(), &[1, 2, 0]);
    }

    #[test]
    fn fast_site_probes_join_and_leave() {
        let mut l = CodeLedger::default();
        l.insert(0x100, &[1, 2, 3, 4, 5], CodeOwner::Fast);
        l.add_probe(0x100, (ProbeId(1), false));
        l.add_probe(0x100, (ProbeId(2), true));
        l.drop_probe(ProbeId(1));
        assert_eq!(
            l.fast_site(0x100).unwrap().probes().collect::<Vec<_>>(),
            [(ProbeId(2), true)]
        );
        l.drop_probe(ProbeId(2));
        assert!(l.fast_site(0x100).is_none());
    }

    #[test]
    fn trap_changes_are_taken_in_and_handed_on() {
        let mut l = CodeLedger::default();
        l.sync_traps(
            Some(vec![0x10, 0x11]),
            Vec::new,
            |a| Some(a as u8),
            |a| a == 0x11,
        );
        assert_eq!(l.sites()[1].owner, CodeOwner::Guard);
        // A new ledger has its trap mechanism look at every int3 first.
        assert_eq!(l.take_trap_changes(), None);
        l.sync_traps(Some(vec![0x11]), Vec::new, |_| None, |_| false);
        assert_eq!(l.traps().collect::<Vec<_>>(), [0x10]);
        assert_eq!(l.take_trap_changes(), Some(vec![0x11]));
        l.sync_traps(None, || vec![(0x20, 1)], |_| None, |_| false);
        assert_eq!(l.traps().collect::<Vec<_>>(), [0x20]);
        assert_eq!(l.take_trap_changes(), None);
        assert_eq!(l.take_trap_changes(), Some(vec![]));
    }
}
