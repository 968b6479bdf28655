//! The code ledger of a target (issue 21): the bytes every mechanism
//! wrote into the target's code, with their owner and the original bytes,
//! walked in one place, and the rule that a second probe at an address
//! another mechanism already serves joins that site or takes it over —
//! it is never written over it.
//!
//! The ledger is read from the two writers that hold the bytes: the
//! process target's `int3`s (the trap engine's, its return trampoline's,
//! the loader rendezvous) and the fast path's installed sites (patch
//! calls, jumps, in-process traps), which the agent mirrors in shared
//! memory. What is laid down here is the rule between them:
//!
//! - a site of the trap engine at the address: the new probe joins it
//!   (the engine serves several probes on one `int3`);
//! - an in-process trap there: the new probe goes on the ptrace trap,
//!   which takes the in-process one over (`before_trap_at`);
//! - a fast-path site starting there, and the fast path can serve the new
//!   action (count, record): the new probe joins it;
//! - otherwise a fast-path site whose bytes hold the address (a `%return`
//!   or a handler at a jump's entry, `mix+3` inside the jump at `mix`):
//!   the site's probes are handed to the trap engine (their counts go on
//!   there; a recording one is refused instead), the original bytes come
//!   back, and the new probe goes on the trap;
//! - a jump or patch that would cover another site is planned as a trap.

use super::*;

/// Who wrote a site's bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    /// An `int3` of the process target: the trap engine's, or the
    /// session's own (return trampoline, loader rendezvous).
    Trap,
    /// The agent's in-process trap.
    InProcess,
    /// A patch call or a jump of the fast path (and their padding).
    Fast,
}

/// One site of the ledger: what was written at `start` replaced
/// `original`.
#[derive(Clone, Debug)]
pub(crate) struct LedgerSite {
    /// The first byte written.
    pub start: u64,
    /// The bytes the write replaced.
    pub original: Vec<u8>,
}

/// The bytes the fast path wrote at one address (the key of
/// [`Slot::fast_ranges`]): where they end, and the session probes the site
/// serves (none for an exit placeholder or a stub); kept without an
/// allocation for the usual one probe.
#[derive(Clone, Debug)]
pub(crate) struct FastSpan {
    /// One past the last byte written.
    pub end: u64,
    /// The first probe on the site, and whether it records.
    pub first: Option<(ProbeId, bool)>,
    /// Further probes on the site.
    pub more: Vec<(ProbeId, bool)>,
}

impl FastSpan {
    /// Adds `spans` (start, end) to `index`, keeping the probes of a span
    /// already there.
    pub(crate) fn add(
        index: &mut std::collections::BTreeMap<u64, FastSpan>,
        spans: impl IntoIterator<Item = (u64, u64)>,
    ) {
        for (start, end) in spans {
            index
                .entry(start)
                .and_modify(|s| s.end = s.end.max(end))
                .or_insert(FastSpan {
                    end,
                    first: None,
                    more: Vec::new(),
                });
        }
    }

    /// Puts `probe` on the site starting at `start`.
    pub(crate) fn add_probe(
        index: &mut std::collections::BTreeMap<u64, FastSpan>,
        start: u64,
        probe: (ProbeId, bool),
    ) {
        let span = index.entry(start).or_insert(FastSpan {
            end: start + 1,
            first: None,
            more: Vec::new(),
        });
        match span.first {
            None => span.first = Some(probe),
            Some(_) => span.more.push(probe),
        }
    }

    /// The probes on the site.
    pub(crate) fn probes(&self) -> impl Iterator<Item = (ProbeId, bool)> + '_ {
        self.first.into_iter().chain(self.more.iter().copied())
    }

    /// Takes probe `id` off the site; false when the site had probes and
    /// has none left (its bytes were taken out).
    pub(crate) fn drop_probe(&mut self, id: ProbeId) -> bool {
        let had = self.first.is_some();
        self.more.retain(|(p, _)| *p != id);
        if self.first.is_some_and(|(p, _)| p == id) {
            self.first = (!self.more.is_empty()).then(|| self.more.remove(0));
        }
        !had || self.first.is_some()
    }
}

/// Which mechanism serves a probe of a target: the one place that says
/// so (`Session::set_enabled` and `remove_probe` dispatch on it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ProbeOwner {
    /// The guest's QEMU plugin.
    Plugin,
    /// An in-process trap at `addr` (`handler`: a shared-memory handler).
    InProcess { addr: u64, handler: bool },
    /// Handed over to the trap engine, whose probe `.0` counts on for it.
    Handed(ProbeId),
    /// A fast-path probe removed while the target ran (counts readable).
    Removed,
    /// A patch or jump site of the fast path.
    Fast,
    /// The trap engine (ptrace trap, guest stub).
    Trap,
}

impl Slot {
    /// Which mechanism serves probe `id` (see [`ProbeOwner`]).
    pub(crate) fn owner(&self, id: ProbeId) -> ProbeOwner {
        if self.plugin.as_ref().is_some_and(|p| p.has(id)) {
            return ProbeOwner::Plugin;
        }
        if let Some(&x) = self.handed.get(&id) {
            return ProbeOwner::Handed(x);
        }
        if let (Some(&(addr, handler)), Fast::On(_)) = (self.inproc.get(&id), &self.fast) {
            return ProbeOwner::InProcess { addr, handler };
        }
        if self.removed_fast.contains(&id) {
            return ProbeOwner::Removed;
        }
        if self.fast_probes.contains_key(&id) {
            return ProbeOwner::Fast;
        }
        ProbeOwner::Trap
    }

    /// The target's ledger, in the order the writes lie over each other:
    /// the `int3`s, then the fast path's sites, the latest first (a site
    /// written over another of the fast path's keeps that one's bytes as
    /// its original), so that laying every original over the code in this
    /// order gives the code as it was in the file.
    pub(crate) fn ledger(&mut self) -> Vec<LedgerSite> {
        let mut sites = Vec::new();
        if let Some(pt) = Slot::process(&mut self.engine) {
            for (a, b) in pt.breakpoints() {
                sites.push(LedgerSite {
                    start: a,
                    original: vec![b],
                });
            }
        }
        if let Fast::On(fp) = &self.fast {
            for (start, original) in fp.written_bytes().into_iter().rev() {
                sites.push(LedgerSite { start, original });
            }
        }
        sites
    }

    /// The ledger's originals that lie in `start..end`, for laying over
    /// code read from the target ([`hotprobe_resolve::lay_over`]); the
    /// whole ledger is read only when a fast-path site is in the span (the
    /// process target already shows the originals under its `int3`s).
    pub(crate) fn originals_in(&mut self, start: u64, end: u64) -> Vec<(u64, Vec<u8>)> {
        let fast_there = self
            .fast_ranges
            .range(..end)
            .next_back()
            .is_some_and(|(_, s)| s.end > start);
        if !fast_there {
            return Vec::new();
        }
        self.ledger()
            .into_iter()
            .filter(|s| s.start < end && s.start + s.original.len() as u64 > start)
            .map(|s| (s.start, s.original))
            .collect()
    }

    /// The fast-path site (start, end) whose bytes hold `addr`, from the
    /// index the placements keep ([`Slot::fast_ranges`]).
    pub(crate) fn fast_range_at(&self, addr: u64) -> Option<(u64, u64)> {
        self.fast_ranges
            .range(..=addr)
            .next_back()
            .filter(|(_, s)| s.end > addr)
            .map(|(start, s)| (*start, s.end))
    }

    /// Who owns the byte at `addr`, and where its site starts: an `int3`
    /// of the process (the engine's, the session's own), an in-process
    /// trap, or a fast-path site holding it.
    pub(crate) fn owner_at(&mut self, addr: u64) -> Option<(Owner, u64)> {
        if self.inproc.values().any(|(a, _)| *a == addr) {
            return Some((Owner::InProcess, addr));
        }
        if let Some((s, _)) = self.fast_range_at(addr) {
            return Some((Owner::Fast, s));
        }
        let pt = Slot::process(&mut self.engine)?;
        pt.breakpoint_at(addr).map(|_| (Owner::Trap, addr))
    }

    /// The first site start in `from..to` (a fast-path site, an
    /// in-process trap or an `int3` of the process), if any.
    pub(crate) fn site_start_in(&mut self, from: u64, to: u64) -> Option<u64> {
        if from >= to {
            return None;
        }
        let fast = self.fast_ranges.range(from..to).next().map(|(s, _)| *s);
        let inproc = self
            .inproc
            .values()
            .map(|(a, _)| *a)
            .filter(|a| (from..to).contains(a))
            .min();
        let trap = Slot::process(&mut self.engine)
            .and_then(|pt| (from..to).find(|a| pt.breakpoint_at(*a).is_some()));
        [fast, inproc, trap].into_iter().flatten().min()
    }
}

impl Session {
    /// Fits `plan`, made for a new probe at `r` from the file, to the
    /// sites already in target `t` (see the module docs). `fast_ok`: the
    /// fast path could serve the new probe's action (a count or a record
    /// of entries, nothing read at the hit).
    pub(super) fn fit_to_ledger(
        &mut self,
        t: TargetId,
        r: &ResolvedProbe,
        plan: Plan,
        fast_ok: bool,
    ) -> Result<Plan, EngineError> {
        let a = r.addr.0;
        let slot = self.slot(t)?;
        if !slot.is_process() {
            return Ok(plan);
        }
        if let Some(owner) = slot.owner_at(a) {
            return match owner {
                (Owner::Trap, _) => Ok(Plan::Join("joins the trap already at this address".into())),
                (Owner::InProcess, _) => Ok(Plan::Join(
                    "joins the in-process trap at this address (taken over by the trap, which \
                     serves both)"
                        .into(),
                )),
                (Owner::Fast, start) => {
                    let here =
                        start == a && slot.fast_ranges.get(&a).is_some_and(|s| s.first.is_some());
                    if let (true, true, Plan::Fast { site, .. }) = (here, fast_ok, &plan) {
                        if *site == start {
                            return Ok(plan);
                        }
                    }
                    // The engine's `before_trap_at` hands the site over.
                    let why = match here {
                        true => "the fast path cannot serve this probe",
                        false => "this address lies in its bytes",
                    };
                    Ok(Plan::Join(format!(
                        "the fast-path site at {start:#x} goes to the trap, which serves both \
                         ({why})"
                    )))
                }
            };
        }
        if let Plan::Fast { site, len, .. } = &plan {
            let (site, end) = (*site, *site + *len as u64);
            if let Some(other) = slot.site_start_in(site + 1, end) {
                return Ok(Plan::Trap(format!(
                    "a probe at {other:#x} lies in the {} bytes the fast path would rewrite",
                    end - site
                )));
            }
        }
        Ok(plan)
    }

    /// Before the engine writes an `int3` at `at` of target `t`: a
    /// fast-path site whose bytes hold `at` is handed to the trap engine:
    /// each of its probes (counts, shared-memory handlers) goes on as a
    /// trap probe at the site's address, counting on from where it was
    /// (see [`Slot::handed`]), and the site's original bytes come back.
    /// Refused (nothing changed) when one of them records: its events
    /// would change hands in the middle of a call.
    pub(super) fn hand_fast_to_trap(
        &mut self,
        t: TargetId,
        at: RuntimeAddr,
    ) -> Result<(), EngineError> {
        let slot = self.slot(t)?;
        if !matches!(slot.fast, Fast::On(_)) {
            return Ok(());
        }
        let Some(start) = slot.fast_range_at(at.0).map(|(s, _)| s) else {
            return Ok(());
        };
        let probes: Vec<(ProbeId, bool)> = slot
            .fast_ranges
            .get(&start)
            .map(|s| s.probes().collect())
            .unwrap_or_default();
        if probes.is_empty() {
            return Err(EngineError::RefusedSpec {
                spec: at.to_string(),
                reason: format!(
                    "{at} lies in bytes the fast path rewrote at {start:#x} (an exit \
                     placeholder or a stub) for no probe that can move to the trap"
                ),
            });
        }
        if probes.iter().any(|(_, record)| *record) {
            return Err(EngineError::RefusedSpec {
                spec: at.to_string(),
                reason: format!(
                    "the fast-path site at {start:#x} records calls, and a probe there or in \
                     its bytes needs the trap: place this probe first, or put both on the trap \
                     (--mechanism trap)"
                ),
            });
        }
        let addr = RuntimeAddr(start);
        slot.fast_ranges.remove(&start);
        for (id, _) in probes {
            let mut probe = Probe::default();
            if let Some(k) = slot
                .shm_handlers
                .iter()
                .find_map(|(k, (p, _))| (*p == id).then_some(*k))
            {
                if let Some((_, p)) = slot.shm_handlers.remove(&k) {
                    probe = p;
                }
            }
            slot.change_fast(id, |fp, pt, c| fp.remove_probe(pt, c).map(|_| ()))?;
            slot.removed_fast.insert(id);
            slot.prepublish_trap(addr);
            let x = slot.change_traps(|e| e.add_probe(addr, probe))?;
            slot.handed.insert(id, x);
        }
        let who = slot.engine.target().describe();
        slot.engine.notices.push(format!(
            "{who}: the fast-path site at {start:#x} was handed to the trap for a probe at \
             {at}, which serves both (their counts go on)"
        ));
        Ok(())
    }
}
