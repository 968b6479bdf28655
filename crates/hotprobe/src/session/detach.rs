//! Detach from a live target in one walk of its code ledger (issue 21):
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
//! A guest goes the same way: the QEMU plugin turns its callbacks off
//! (it writes no code byte), the engine stops the vCPUs and moves them
//! out of its scratch, the walk removes every stub breakpoint the ledger
//! lists (`Target::stub_breakpoints` took them in) through the target,
//! and the engine detaches it.
//!
//! A site whose bytes another writer changed meanwhile is left as
//! [`hotprobe_fastpath::ForeignOutcome`] says, and named for the fast
//! path's sites (an `int3` the program rewrote is left as found, quietly,
//! as before).

use super::agent::AgentState;
use super::ledger::CodeLedger;
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
            target,
            agent,
            ledger,
            ..
        } = self;
        let Some(pt) = target.process() else {
            return match traps {
                true => restore_stub_breakpoints(target.as_target(), ledger),
                false => Ok(Vec::new()),
            };
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
        let ints: HashSet<u64> = ints.into_iter().collect();
        let inherited: HashSet<u64> = inherited.into_iter().collect();
        // An inherited site another writer changed has no mechanism of
        // this target's to name it: named here.
        let mut notes = Vec::new();
        let found = found
            .into_iter()
            .filter_map(
                |f| match (ints.contains(&f.addr), inherited.contains(&f.addr)) {
                    (true, _) => Some((MechKind::Trap, f)),
                    (false, true) => {
                        use hotprobe_fastpath::ForeignOutcome as O;
                        let what = match f.outcome {
                            O::Int3Kept => "its int3 was kept, over the original instructions",
                            O::Restored => "the original bytes were put back",
                            O::LeftAsFound | O::LeftDisabled => "it was left as found",
                        };
                        notes.push(format!(
                            "the probe site at {:#x} this followed child inherited from its \
                         parent's fast path was changed by another writer (hotprobe left \
                         {:02x?}, found {:02x?}): {what}",
                            f.addr, f.expected, f.found
                        ));
                        None
                    }
                    (false, false) => Some((MechKind::Fast, f)),
                },
            )
            .collect();
        for n in notes {
            self.inbox.notice(&mut self.engine, n);
        }
        restored?;
        Ok(found)
    }
}

/// Step 2 for a target that keeps its breakpoints itself (a guest's
/// stub breakpoints write no byte): each breakpoint site of the ledger is
/// removed once, through the target; one that cannot be does not stop the
/// others, and the first error is returned at the end. (A guest's
/// out-of-line areas in unused kernel text are the target's own scratch,
/// put back at its detach, as a process's scratch is unmapped at its.)
fn restore_stub_breakpoints(
    target: &mut dyn Target,
    ledger: &CodeLedger,
) -> Result<Vec<(MechKind, ForeignWrite)>, EngineError> {
    let mut first_err = None;
    for s in ledger.sites() {
        if s.owner.writer() != Some(MechKind::Trap) {
            continue;
        }
        if let Err(e) = target.remove_breakpoint(RuntimeAddr(s.start)) {
            first_err.get_or_insert(e);
        }
    }
    match first_err {
        Some(e) => Err(e.into()),
        None => Ok(Vec::new()),
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

#[cfg(test)]
mod tests {
    use super::*;
    use hotprobe_target::{Registers, ResumeMode, TargetError, TargetEvent, ThreadId};
    use std::collections::BTreeSet;
    use std::time::Duration;

    /// A target that keeps its breakpoints itself, as a guest's stub does:
    /// the removals it was asked for, in order; `stuck` cannot be removed.
    #[derive(Default)]
    struct Stub {
        breakpoints: BTreeSet<u64>,
        removed: Vec<u64>,
        stuck: Option<u64>,
    }

    impl Target for Stub {
        fn describe(&self) -> String {
            "stub".into()
        }
        fn threads(&self) -> Vec<ThreadId> {
            Vec::new()
        }
        fn read_memory(&mut self, _: RuntimeAddr, _: &mut [u8]) -> Result<(), TargetError> {
            Ok(())
        }
        fn write_memory(&mut self, _: RuntimeAddr, _: &[u8]) -> Result<(), TargetError> {
            panic!("a stub breakpoint is no byte to write")
        }
        fn registers(&mut self, _: ThreadId) -> Result<Registers, TargetError> {
            Ok(Registers::default())
        }
        fn set_registers(&mut self, _: ThreadId, _: &Registers) -> Result<(), TargetError> {
            Ok(())
        }
        fn resume(&mut self, _: ThreadId, _: ResumeMode) -> Result<(), TargetError> {
            Ok(())
        }
        fn wait(&mut self, _: Option<Duration>) -> Result<TargetEvent, TargetError> {
            Ok(TargetEvent::Timeout)
        }
        fn insert_breakpoint(&mut self, a: RuntimeAddr) -> Result<(), TargetError> {
            self.breakpoints.insert(a.0);
            Ok(())
        }
        fn remove_breakpoint(&mut self, a: RuntimeAddr) -> Result<(), TargetError> {
            if self.stuck == Some(a.0) {
                return Err(TargetError::Protocol {
                    target: self.describe(),
                    why: "refused".into(),
                });
            }
            self.breakpoints.remove(&a.0);
            self.removed.push(a.0);
            Ok(())
        }
        fn stub_breakpoints(&self) -> Option<Vec<u64>> {
            Some(self.breakpoints.iter().copied().collect())
        }
        fn stop_all(&mut self) -> Result<(), TargetError> {
            Ok(())
        }
        fn resume_all(&mut self) -> Result<(), TargetError> {
            Ok(())
        }
        fn detach(&mut self) -> Result<(), TargetError> {
            Ok(())
        }
    }

    #[test]
    fn a_guests_stub_breakpoints_are_taken_out_in_one_walk_of_the_ledger() {
        let mut stub = Stub::default();
        for a in [0x30, 0x10, 0x20] {
            stub.insert_breakpoint(RuntimeAddr(a)).unwrap();
        }
        let mut ledger = CodeLedger::default();
        ledger.sync_stub_breakpoints(stub.stub_breakpoints().unwrap());
        // No byte is written for them: the sites have no original.
        assert!(ledger.sites().iter().all(|s| s.original().is_empty()));
        assert_eq!(ledger.traps().collect::<Vec<_>>(), [0x10, 0x20, 0x30]);
        // One that goes is dropped at the next sync.
        stub.remove_breakpoint(RuntimeAddr(0x20)).unwrap();
        stub.removed.clear();
        ledger.sync_stub_breakpoints(stub.stub_breakpoints().unwrap());
        assert_eq!(ledger.traps().collect::<Vec<_>>(), [0x10, 0x30]);
        // The walk removes each once, by address, and goes on past one
        // that fails: its error is the walk's.
        stub.stuck = Some(0x10);
        let r = restore_stub_breakpoints(&mut stub, &ledger);
        assert!(r.is_err());
        assert_eq!(stub.removed, [0x30]);
        assert_eq!(stub.breakpoints.iter().copied().collect::<Vec<_>>(), [0x10]);
        stub.stuck = None;
        assert!(restore_stub_breakpoints(&mut stub, &ledger)
            .unwrap()
            .is_empty());
        assert!(stub.breakpoints.is_empty());
    }
}
