//! Detach from a live process in one walk of its code ledger (issue 21):
//! every byte any mechanism wrote — the trap engine's `int3`s and their
//! guards, the session's own (return trampoline, loader rendezvous, unwind
//! hooks), the fast path's patch calls and jumps, the agent's in-process
//! traps — goes back to the ledger's original once, in one pass that
//! writes a span of nearby sites at a time (`hotprobe_fastpath::restore_sites`).
//!
//! The order keeps every thread out of the bytes being written:
//! 1. each mechanism makes its sites safe, doing only what it alone can
//!    (`ProbeMechanism::prepare_detach`, in the order of `Mechs::all`):
//!    the fast path stops the threads, waits for none to be strictly
//!    inside a site's bytes and turns its sites' actions off; the trap
//!    engine handles what the target reported meanwhile, moves threads
//!    out of its scratch slots and puts the live return addresses back;
//! 2. the walk restores every ledger site (the process target forgets the
//!    `int3`s it tracked there first, so that its writes do not keep
//!    them);
//! 3. each mechanism lets go, told what the walk did
//!    (`ProbeMechanism::finish_detach`): the fast path drops its shared-memory ledger
//!    entries and unloads the agent it injected (at the target's detach),
//!    the engine detaches the target (scratch freed, threads let go), the
//!    trap table is emptied.
//!
//! A site whose bytes another writer changed meanwhile is left as
//! [`hotprobe_fastpath::ForeignOutcome`] says, and named for the fast
//! path's sites (an `int3` the program rewrote is left as found, quietly,
//! as before).

use super::agent::AgentState;
use super::mech::{DetachReady, MechKind, Walked};
use super::Slot;
use crate::EngineError;
use hotprobe_fastpath::{ForeignWrite, LiveWrite, SiteRestore};
use hotprobe_target::{RuntimeAddr, Target};
use std::collections::{BTreeSet, HashMap, HashSet};

/// The `int3` the trap engine writes.
const INT3: u8 = 0xcc;

impl Slot {
    /// Detaches from this live process target in one walk of its ledger
    /// (see the module docs). Errors are those of the first step that
    /// failed; the steps after it still run where they can.
    pub(super) fn detach_by_ledger(&mut self) -> Result<(), EngineError> {
        let mut first_err: Option<EngineError> = None;
        // 1. Each mechanism makes its sites safe (the agent's first: its
        // wait for threads to leave a site may let them run).
        let mut ready: Vec<(MechKind, Option<DetachReady>)> = Vec::new();
        let (mut cx, mechs) = self.parts();
        for m in mechs.all() {
            let r = match m.prepare_detach(&mut cx) {
                Ok(r) => Some(r),
                Err(e) => {
                    first_err.get_or_insert(e);
                    None
                }
            };
            ready.push((m.kind(), r));
        }
        let gone = ready.iter().any(|(_, r)| *r == Some(DetachReady::Gone));
        let is_ready = |k: MechKind| {
            ready
                .iter()
                .any(|(m, r)| *m == k && *r == Some(DetachReady::Ready))
        };
        let (fast, traps) = (is_ready(MechKind::Fast), is_ready(MechKind::Trap));
        // 2. One walk over the ledger.
        let walk = match (gone, fast || traps) {
            (false, true) => Some(self.restore_ledger(fast, traps)),
            _ => None,
        };
        // 3. Each mechanism lets go, told what the walk did.
        let (mut foreign, failed) = match walk {
            Some(Ok(found)) => (found, false),
            Some(Err(e)) => {
                first_err.get_or_insert(e);
                (Vec::new(), true)
            }
            None => (Vec::new(), false),
        };
        let (mut cx, mechs) = self.parts();
        for m in mechs.all() {
            let kind = m.kind();
            let prepared = ready.iter().find(|(k, _)| *k == kind).and_then(|(_, r)| *r);
            let walked = match prepared {
                _ if gone => Walked::Gone,
                Some(DetachReady::Ready) if failed => Walked::Failed,
                Some(DetachReady::Ready) => Walked::Restored {
                    foreign: take_foreign_of(&mut foreign, kind),
                },
                _ => Walked::Skipped,
            };
            if let Err(e) = m.finish_detach(&mut cx, walked) {
                first_err.get_or_insert(e);
            }
        }
        // What of the agent stayed in the target (its unload runs at the
        // target's detach, last).
        if let Some(fp) = self.agent.fast_path_mut() {
            for n in fp.take_left_behind() {
                self.inbox.notice(&mut self.engine, n);
            }
        }
        self.ledger.clear();
        match first_err {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Step 2 of [`Slot::detach_by_ledger`]: every site of the ledger
    /// back to its original, once — the fast path's (`fast`) and the
    /// `int3`s (`traps`), those of mechanisms that are ready. Returns the
    /// sites another writer changed, each with the writer whose it was.
    fn restore_ledger(
        &mut self,
        fast: bool,
        traps: bool,
    ) -> Result<Vec<(MechKind, ForeignWrite)>, EngineError> {
        self.sync_ledger();
        let Slot {
            engine,
            agent,
            ledger,
            ..
        } = self;
        let Some(pt) = engine.process() else {
            return Ok(Vec::new());
        };
        let fp = match &agent.state {
            AgentState::On(fp) if fast => Some(&**fp),
            _ => None,
        };
        // What each writer has in the code now: the fast path's bytes, and
        // the byte under each `int3` the process target tracks (the
        // latest: a write under an `int3` changes it).
        let writes = fp.map(|fp| fp.live_writes()).unwrap_or_default();
        let under: HashMap<u64, u8> = match traps {
            true => pt.breakpoints().into_iter().collect(),
            false => HashMap::new(),
        };
        let mut sites = Vec::with_capacity(ledger.sites().len());
        let mut ints = Vec::new();
        let mut inherited = Vec::new();
        // Both by address: the fast path's writes are walked along the
        // ledger's sites; one the ledger missed (it never should) is taken
        // out all the same.
        let mut next = 0;
        for s in ledger.sites() {
            match s.owner.writer() {
                // A followed child's copy of its parent's agent writes
                // (threads are never inside those bytes but at their
                // first one: each is one instruction), taken out with the
                // `int3`s (the trap's preparation stopped every thread).
                None => {
                    if let (true, Some(written)) = (traps, s.written()) {
                        inherited.push(s.start);
                        sites.push(SiteRestore {
                            addr: s.start,
                            expected: written,
                            original: s.original(),
                        });
                    }
                }
                Some(MechKind::Fast) => {
                    while writes.get(next).is_some_and(|w| w.addr < s.start) {
                        let w = &writes[next];
                        sites.push(fast_site(w, &w.original));
                        next += 1;
                    }
                    let Some(w) = writes.get(next).filter(|w| w.addr == s.start) else {
                        continue;
                    };
                    next += 1;
                    // The ledger's original is the file's (the first write
                    // at the address, lengthened by longer ones); the fast
                    // path's own account of it where they differ in length.
                    let original = match s.original().len() == w.now.len() {
                        true => s.original(),
                        false => &w.original,
                    };
                    sites.push(fast_site(w, original));
                }
                Some(MechKind::Trap) => {
                    if let Some(b) = under.get(&s.start) {
                        ints.push(s.start);
                        sites.push(SiteRestore {
                            addr: s.start,
                            expected: &[INT3],
                            original: std::slice::from_ref(b),
                        });
                    }
                }
                Some(MechKind::InProcess | MechKind::Plugin) => {}
            }
        }
        for w in writes.get(next..).unwrap_or_default() {
            sites.push(fast_site(w, &w.original));
        }
        // The process target stops tracking the `int3`s the walk takes out
        // (its writes would keep them); any it tracks beyond the ledger
        // go at its detach.
        for a in &ints {
            pt.forget_breakpoint(RuntimeAddr(*a));
        }
        let left: BTreeSet<u64> = pt.breakpoints().into_iter().map(|b| b.0).collect();
        let mut found = Vec::new();
        let restored = hotprobe_fastpath::restore_sites(pt, &sites, Some(&left), &mut found);
        let ints: HashSet<u64> = ints.into_iter().chain(inherited).collect();
        // The trap's (an `int3` left as found, quietly) and an inherited
        // site's (no writer of this target's to name it): `Trap`.
        let found = found
            .into_iter()
            .map(|f| match ints.contains(&f.addr) {
                true => (MechKind::Trap, f),
                false => (MechKind::Fast, f),
            })
            .collect();
        restored?;
        Ok(found)
    }
}

/// The fast path's write `w` to take out, back to `original`.
fn fast_site<'a>(w: &'a LiveWrite<'_>, original: &'a [u8]) -> SiteRestore<'a> {
    SiteRestore {
        addr: w.addr,
        expected: &w.now,
        original,
    }
}

/// The sites of `kind`'s bytes another writer changed, taken out of
/// `found`.
fn take_foreign_of(found: &mut Vec<(MechKind, ForeignWrite)>, kind: MechKind) -> Vec<ForeignWrite> {
    let (mine, rest): (Vec<_>, Vec<_>) = std::mem::take(found)
        .into_iter()
        .partition(|(k, _)| *k == kind);
    *found = rest;
    mine.into_iter().map(|(_, f)| f).collect()
}
