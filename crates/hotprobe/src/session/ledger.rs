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
    /// A followed fork child's copy of its parent's agent writes (patch
    /// calls, jumps, in-process traps): no mechanism of the child's wrote
    /// them (its agent counts through them into slots of its own); the
    /// child's ledger walks put them back (detach) or drop them (exec).
    Inherited,
}

impl CodeOwner {
    /// The mechanism whose list holds these bytes (the fast path's list
    /// holds the agent's in-process traps too); `None` for inherited
    /// bytes, which only the ledger holds.
    pub(crate) fn writer(self) -> Option<super::mech::MechKind> {
        use super::mech::MechKind;
        match self {
            CodeOwner::Trap | CodeOwner::Guard => Some(MechKind::Trap),
            CodeOwner::Fast | CodeOwner::InProcess => Some(MechKind::Fast),
            CodeOwner::Inherited => None,
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
/// usual site); for an inherited site, the original followed by the bytes
/// written (as many).
#[derive(Clone, Debug)]
enum Original {
    Inline(u8, [u8; INLINE]),
    Heap(Box<[u8]>),
    WithWritten(Box<[u8]>),
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
            Original::WithWritten(b) => &b[..b.len() / 2],
        }
    }

    /// The bytes written over the original, where the site keeps them
    /// (an inherited site).
    fn written(&self) -> Option<&[u8]> {
        match self {
            Original::WithWritten(b) => Some(&b[b.len() / 2..]),
            _ => None,
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

    /// The bytes written over the original, for an inherited site (the
    /// parent's agent's, as the child got them).
    pub(crate) fn written(&self) -> Option<&[u8]> {
        self.original.written()
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

/// What a forked child's copy of the code gets, from one walk of its
/// parent's ledger ([`CodeLedger::fork_walk`]).
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct ForkBytes {
    /// (address, bytes) written into the child: the original under each
    /// site it does not keep.
    pub put_back: Vec<(u64, Vec<u8>)>,
    /// (address, original) of the sites a followed child keeps: the
    /// agent's writes (its agent counts through them into slots of its
    /// own), inherited ones included. Its ledger takes them in as
    /// [`CodeOwner::Inherited`].
    pub kept: Vec<(u64, Vec<u8>)>,
}

/// A site the program unmapped under its bytes, as the walk of the
/// ledger found it ([`CodeLedger::take_unmapped`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct GoneSite {
    /// Its first byte.
    pub addr: u64,
    /// Who wrote it.
    pub owner: CodeOwner,
    /// The session probes it served, where the ledger keeps them (a
    /// fast-path site's; the trap engine and the in-process trap know
    /// their own by address).
    pub probes: Vec<ProbeId>,
}

/// The sites of one gap between the target's mappings (where a module
/// was), in address order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct UnmappedGap {
    /// The gap: the end of the mapping before it (0 if none) …
    pub start: u64,
    /// … to the start of the one after it (`u64::MAX` if none).
    pub end: u64,
    /// The sites no mapping holds any more.
    pub sites: Vec<GoneSite>,
}

impl UnmappedGap {
    /// How many of the user's probe sites the gap held: a guard is a
    /// trap site's second byte, not a probe of its own.
    pub(crate) fn probe_sites(&self) -> usize {
        self.sites
            .iter()
            .filter(|s| s.owner != CodeOwner::Guard)
            .count()
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

    /// Forgets the agent's sites (a whole resync of its list).
    fn forget_agent(&mut self) {
        self.sites.retain(|s| !s.is_agent());
    }

    /// Forgets every site of the image (exec, exit: the memory is gone,
    /// nothing is restored). The `int3`s of a new image are taken in again
    /// at the next sync (the process target lists them all after an exec).
    pub(crate) fn forget_image(&mut self) {
        self.sites.clear();
    }

    /// What a child forked by this target gets in its copy of the code, in
    /// one walk of the ledger: not followed (`follow` false), every site's
    /// original back; followed, the `int3`s' originals back (its own trap
    /// probes are placed again) and the agent's writes kept. `under(a)`
    /// is the byte under the `int3` at `a` now (the process target's: a
    /// write under an `int3` changes it), `None` where none is in the code
    /// (lifted for a step: the child's copy holds the original).
    pub(crate) fn fork_walk(&self, follow: bool, under: impl Fn(u64) -> Option<u8>) -> ForkBytes {
        let mut out = ForkBytes::default();
        for s in &self.sites {
            match s.owner {
                CodeOwner::Trap | CodeOwner::Guard => {
                    if let Some(b) = under(s.start) {
                        out.put_back.push((s.start, vec![b]));
                    }
                }
                // A probe's entry with no bytes of its own.
                CodeOwner::Fast if s.original().is_empty() => {}
                CodeOwner::Fast | CodeOwner::InProcess | CodeOwner::Inherited => match follow {
                    true => out.kept.push((s.start, s.original().to_vec())),
                    false => out.put_back.push((s.start, s.original().to_vec())),
                },
            }
        }
        out
    }

    /// One walk of the sites against `mapped` (the target's mappings now,
    /// sorted `(start, end)`): takes out every site no mapping holds any
    /// more (a module was unmapped under them: nothing is restored, the
    /// memory is gone) and hands them back, grouped by the gap between
    /// mappings they lay in.
    pub(crate) fn take_unmapped(&mut self, mapped: &[(u64, u64)]) -> Vec<UnmappedGap> {
        let mut gaps: Vec<UnmappedGap> = Vec::new();
        let mut m = 0;
        self.sites.retain_mut(|s| {
            while mapped.get(m).is_some_and(|r| r.1 <= s.start) {
                m += 1;
            }
            if mapped.get(m).is_some_and(|r| r.0 <= s.start) {
                return true;
            }
            let from = match m {
                0 => 0,
                _ => mapped[m - 1].1,
            };
            let to = mapped.get(m).map_or(u64::MAX, |r| r.0);
            let gone = GoneSite {
                addr: s.start,
                owner: s.owner,
                probes: s.probes().map(|(id, _)| id).collect(),
            };
            match gaps.last_mut() {
                Some(g) if g.start == from => g.sites.push(gone),
                _ => gaps.push(UnmappedGap {
                    start: from,
                    end: to,
                    sites: vec![gone],
                }),
            }
            false
        });
        gaps
    }

    /// Records a site a followed fork child inherited: `written` (as read
    /// in the child) over `original`.
    pub(crate) fn insert_inherited(&mut self, start: u64, original: &[u8], written: &[u8]) {
        if original.len() != written.len() || original.is_empty() {
            return;
        }
        let i = self.slot_for(start);
        let mut both = original.to_vec();
        both.extend_from_slice(written);
        self.sites.insert(
            i,
            CodeSite {
                start,
                owner: CodeOwner::Inherited,
                original: Original::WithWritten(both.into()),
                first: None,
                more: Vec::new(),
            },
        );
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

    /// [`CodeLedger::take_unmapped`] as (gap start, end, site addresses,
    /// probe sites), for tests.
    #[cfg(test)]
    fn unmapped_walk_summary(&mut self, mapped: &[(u64, u64)]) -> Vec<(u64, u64, Vec<u64>, usize)> {
        self.take_unmapped(mapped)
            .into_iter()
            .map(|g| {
                let n = g.probe_sites();
                (g.start, g.end, g.sites.iter().map(|s| s.addr).collect(), n)
            })
            .collect()
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
            CodeOwner::Inherited => 3,
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
    /// listing them from the `from`-th on); its list is taken in whole
    /// again when writes left it since.
    pub(crate) fn sync_agent(
        &mut self,
        count: usize,
        removals: u64,
        since: impl FnOnce(usize) -> Vec<(u64, Vec<u8>, bool)>,
    ) {
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
        for (a, original, inproc) in new {
            let owner = match inproc {
                true => CodeOwner::InProcess,
                false => CodeOwner::Fast,
            };
            self.insert(a, &original, owner);
        }
        if whole {
            // Sites of probes whose bytes are gone (none listed).
            self.sites
                .retain(|s| s.owner != CodeOwner::Fast || !s.original().is_empty());
        }
        self.agent_synced = (count, removals);
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

    /// Takes in the breakpoints a target keeps itself (`list`: a guest's
    /// stub breakpoints, which write no byte: their sites have no
    /// original), in place of the trap sites the ledger had.
    pub(crate) fn sync_stub_breakpoints(&mut self, mut list: Vec<u64>) {
        list.sort_unstable();
        let mut now: Vec<u64> = self.traps().collect();
        now.sort_unstable();
        if now == list {
            return;
        }
        self.sites
            .retain(|s| !matches!(s.owner, CodeOwner::Trap | CodeOwner::Guard));
        for a in list {
            self.insert(a, &[], CodeOwner::Trap);
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
#[path = "ledger_tests.rs"]
mod tests;
