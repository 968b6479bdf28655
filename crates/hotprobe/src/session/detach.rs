//! Detach from a live process in one walk of its code ledger (issue 21):
//! every byte any mechanism wrote — the trap engine's `int3`s and their
//! guards, the session's own (return trampoline, loader rendezvous, unwind
//! hooks), the fast path's patch calls and jumps, the agent's in-process
//! traps — goes back to the ledger's original once, in one pass that
//! writes a span of nearby sites at a time (`hotprobe_fastpath::restore_sites`).
//!
//! The order keeps every thread out of the bytes being written:
//! 1. each mechanism makes its sites safe, doing only what it alone can:
//!    the fast path stops the threads, waits for none to be strictly
//!    inside a site's bytes and turns its sites' actions off; the trap
//!    engine handles what the target reported meanwhile, moves threads
//!    out of its scratch slots and puts the live return addresses back;
//! 2. the walk restores every ledger site (the process target forgets the
//!    `int3`s it tracked there first, so that its writes do not keep
//!    them);
//! 3. each mechanism lets go: the fast path drops its shared-memory ledger
//!    entries and unloads the agent it injected (at the target's detach),
//!    the engine detaches the target (scratch freed, threads let go), the
//!    trap table is emptied.
//!
//! A site whose bytes another writer changed meanwhile is left as
//! [`hotprobe_fastpath::ForeignOutcome`] says, and named for the fast
//! path's sites (an `int3` the program rewrote is left as found, quietly,
//! as before).

use super::agent::AgentState;
use super::foreign::note_foreign_writes;
use super::ledger::CodeOwner;
use super::Slot;
use crate::EngineError;
use hotprobe_fastpath::SiteRestore;
use hotprobe_target::{RuntimeAddr, Target, TargetError};
use std::collections::{BTreeSet, HashMap, HashSet};

/// The `int3` the trap engine writes.
const INT3: u8 = 0xcc;

impl Slot {
    /// Detaches from this live process target in one walk of its ledger
    /// (see the module docs). Errors are those of the first step that
    /// failed; the steps after it still run where they can.
    pub(super) fn detach_by_ledger(&mut self) -> Result<(), EngineError> {
        let mut first_err: Option<EngineError> = None;
        if !self.inherited.is_empty() {
            // A followed child still running: its parent's fast-path code
            // goes (threads are never inside those bytes but at their
            // first one: each is one instruction). Those bytes are the
            // parent's ledger's, not this one's.
            let t = self.engine.target();
            if t.stop_all().is_ok() {
                for (a, b) in std::mem::take(&mut self.inherited) {
                    let _ = t.write_memory(a, &b);
                }
            }
        }
        // 1. Each mechanism makes its sites safe.
        let fast_ready = match (&mut self.agent.state, self.engine.process()) {
            (AgentState::On(fp), Some(pt)) => match fp.prepare_detach(pt) {
                Ok(ready) => ready,
                Err(e) => {
                    first_err.get_or_insert(e.into());
                    false
                }
            },
            _ => false,
        };
        // `live`: the engine's part is ready; `gone`: the process is (it
        // exited meanwhile, or stopped answering).
        let (live, gone) = match self.engine.prepare_detach() {
            Ok(live) => (live, !live),
            Err(EngineError::Target(TargetError::Gone { .. })) => (false, true),
            Err(e) => {
                first_err.get_or_insert(e);
                (false, false)
            }
        };
        // 2. One walk over the ledger.
        if gone {
            if let (true, AgentState::On(fp)) = (fast_ready, &mut self.agent.state) {
                fp.forget();
            }
        } else if fast_ready || live {
            if let Err(e) = self.restore_ledger(fast_ready, live) {
                first_err.get_or_insert(e);
            }
        }
        // 3. Each mechanism lets go.
        note_foreign_writes(&mut self.engine, &mut self.agent, &mut self.inbox);
        if live {
            match self.engine.finish_detach() {
                Ok(()) => self.mechs.trap.unpublish(&self.agent),
                Err(EngineError::Target(TargetError::Gone { .. })) => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
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
    /// `int3`s (`traps`) — then the fast path told its bytes are out.
    fn restore_ledger(&mut self, fast: bool, traps: bool) -> Result<(), EngineError> {
        self.sync_ledger();
        let Slot {
            engine,
            agent,
            ledger,
            ..
        } = self;
        let Some(pt) = engine.process() else {
            return Ok(());
        };
        let fp = match &mut agent.state {
            AgentState::On(fp) if fast => Some(fp),
            _ => None,
        };
        // What each writer has in the code now: the fast path's bytes, and
        // the byte under each `int3` the process target tracks (the
        // latest: a write under an `int3` changes it).
        let writes = fp.as_ref().map(|fp| fp.live_writes()).unwrap_or_default();
        let under: HashMap<u64, u8> = match traps {
            true => pt.breakpoints().into_iter().collect(),
            false => HashMap::new(),
        };
        let mut sites = Vec::with_capacity(ledger.sites().len());
        let mut ints = Vec::new();
        let mut fast_sites = 0;
        // Sites are by address: two of the agent's at one address (never
        // seen) are next to each other.
        let mut last_fast = None;
        for s in ledger.sites() {
            match s.owner {
                CodeOwner::Fast | CodeOwner::InProcess => {
                    let Some((now, first)) = writes.get(&s.start) else {
                        continue;
                    };
                    if last_fast.replace(s.start) == Some(s.start) {
                        continue;
                    }
                    // The ledger's original is the file's (the first write
                    // at the address, lengthened by longer ones); the fast
                    // path's own account of it where they differ in length.
                    let original = match s.original().len() == now.len() {
                        true => s.original(),
                        false => first,
                    };
                    fast_sites += 1;
                    sites.push(SiteRestore {
                        addr: s.start,
                        expected: now,
                        original,
                    });
                }
                CodeOwner::Trap | CodeOwner::Guard => {
                    if let Some(b) = under.get(&s.start) {
                        ints.push(s.start);
                        sites.push(SiteRestore {
                            addr: s.start,
                            expected: &[INT3],
                            original: std::slice::from_ref(b),
                        });
                    }
                }
            }
        }
        if fast_sites < writes.len() {
            // The fast path's bytes the ledger missed (it never should):
            // out all the same.
            let traps: HashSet<u64> = ints.iter().copied().collect();
            let listed: HashSet<u64> = sites
                .iter()
                .map(|r| r.addr)
                .filter(|a| !traps.contains(a))
                .collect();
            for (a, (now, first)) in &writes {
                if !listed.contains(a) {
                    sites.push(SiteRestore {
                        addr: *a,
                        expected: now,
                        original: first,
                    });
                }
            }
        }
        // The process target stops tracking the `int3`s the walk takes out
        // (its writes would keep them); any it tracks beyond the ledger
        // go at its detach.
        for a in &ints {
            pt.forget_breakpoint(RuntimeAddr(*a));
        }
        let left: BTreeSet<u64> = pt.breakpoints().into_iter().map(|b| b.0).collect();
        let restored = hotprobe_fastpath::restore_sites(pt, &sites, Some(&left));
        let foreign = match &restored {
            Ok(found) => {
                let ints: HashSet<u64> = ints.into_iter().collect();
                found
                    .iter()
                    .filter(|f| !ints.contains(&f.addr))
                    .cloned()
                    .collect()
            }
            Err(_) => Vec::new(),
        };
        if let Some(fp) = fp {
            if restored.is_ok() {
                fp.finish_detach(pt, foreign);
            }
        }
        restored?;
        Ok(())
    }
}
