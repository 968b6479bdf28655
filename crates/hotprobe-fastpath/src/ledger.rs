//! The code bytes this fast path wrote: detach, the list of written
//! bytes, forgetting them, and their mirror in shared memory.
//!
//! Every site is published in the shared memory's code ledger
//! (`hotprobe_abi::LedgerEntry`: address, original bytes, the bytes
//! written, owner) before its bytes go into the target, and taken out
//! after the original is back (detach, removal) or the image is gone
//! (`forget`). A disabled site keeps its entry: the agent only restores a
//! site where it finds exactly the bytes written, so an entry published
//! early (bytes not written yet, a batch still open), late (the original
//! back already) or over a disabled site is harmless, and no moment leaves
//! hotprobe's bytes in the code without an entry. When the tracer dies
//! (SIGKILL) the agent puts every published site back (see the agent's
//! `undo` module). Past the ledger's capacity (one entry per site-table
//! slot and per in-process trap, so never reached while the site table
//! has room) a site is written without an entry and counted in
//! `LedgerCtl::unmirrored` ([`FastPath::ledger_unmirrored`]).

use std::borrow::Cow;
use std::sync::atomic::Ordering::Relaxed;

use hotprobe_process::ProcessTarget;
use hotprobe_target::{Target, TargetError};

use crate::foreign::{restore_spans, Restore};
use crate::install::wait_pcs_outside;
use crate::FastPathError;
use crate::{FastPath, ForeignWrite};

/// One address of [`FastPath::live_writes`].
#[derive(Clone, Debug)]
pub struct LiveWrite<'a> {
    /// The first byte written.
    pub addr: u64,
    /// The bytes there now.
    pub now: Cow<'a, [u8]>,
    /// The bytes they replaced.
    pub original: Cow<'a, [u8]>,
}

impl FastPath {
    /// Takes out every byte written (the original back, or what
    /// [`ForeignOutcome`] says where another writer changed a site; see
    /// [`FastPath::take_foreign_writes`]), disables every site, stops the
    /// heartbeat. The threads are stopped for the restore and left stopped
    /// (resume or detach the target afterwards). An agent we injected is
    /// unloaded and our trampoline pages unmapped when no thread can still
    /// run in them (see the `unload` module); a preloaded agent stays.
    ///
    /// The same as [`FastPath::prepare_detach`], the restore of
    /// [`FastPath::live_writes`] by [`crate::restore_sites`], then
    /// [`FastPath::finish_detach`] (a session puts the bytes back in one
    /// walk over every writer's sites instead).
    pub fn detach(&mut self, t: &mut ProcessTarget) -> Result<(), FastPathError> {
        if !self.prepare_detach(t)? {
            return Ok(());
        }
        // Every original put back in one batch: a write per span of
        // nearby sites (see `end_batch`), in reverse order of installation
        // (the batch keeps that order for writes to one address).
        let mut restore = Vec::with_capacity(self.installed.len());
        for s in self.installed.iter().rev() {
            // A disabled site holds its original bytes already: nothing
            // of hotprobe's to take out.
            if !self.disabled.contains_key(&s.addr) {
                restore.push(Restore {
                    addr: s.addr,
                    expected: &s.written,
                    original: &s.original,
                });
            }
        }
        // The process's own int3s (the trap engine's) over our sites.
        let bps: Option<std::collections::BTreeSet<u64>> =
            Some(t.breakpoints().into_iter().map(|b| b.0).collect());
        let mut foreign = Vec::new();
        let restored = restore_spans(t, restore, bps.as_ref(), &mut foreign);
        // What was found before a failure is reported all the same.
        self.foreign.extend(foreign);
        restored?;
        self.finish_detach(t, Vec::new());
        Ok(())
    }

    /// Detach, first step: every thread stopped (and left stopped), none
    /// strictly inside a site's bytes (a thread can sit at the first byte
    /// of a site, which runs the original instruction, never inside: the
    /// patched bytes are one instruction, padded with int3 never run),
    /// every site's action off. False when there is nothing to take out
    /// (detached already, or the process is gone: then forgotten).
    pub fn prepare_detach(&mut self, t: &mut ProcessTarget) -> Result<bool, FastPathError> {
        if self.detached {
            return Ok(false);
        }
        if let Err(e) = t.stop_all() {
            // A process that is gone has nothing left to restore.
            if matches!(e, TargetError::Gone { .. }) {
                self.forget();
                return Ok(false);
            }
            return Err(e.into());
        }
        for i in (0..self.installed.len()).rev() {
            let (addr, len, key) = {
                let s = &self.installed[i];
                (s.addr, s.original.len() as u64, s.key)
            };
            wait_pcs_outside(t, addr, len)?;
            if key == 0 {
                // An in-process trap (`inproc`): its entry stays.
                self.shm.shm().quiet_inproc(addr);
            } else {
                let _ = self.shm.shm().set_site_action(key, 0);
            }
        }
        Ok(true)
    }

    /// The bytes of this fast path in the code now, one entry per
    /// address in address order, with the bytes they replaced: the writes
    /// at one address laid over each other in the order made (a probe
    /// joining a site writes its jump again over the first one's), over
    /// the first write's original (lengthened by a longer later write's).
    /// Borrowed where one write was made at the address (the usual site).
    /// Disabled sites, which hold their original already, are left out.
    pub fn live_writes(&self) -> Vec<LiveWrite<'_>> {
        let mut order: Vec<&crate::Installed> = match self.disabled.is_empty() {
            true => self.installed.iter().collect(),
            false => self
                .installed
                .iter()
                .filter(|s| !self.disabled.contains_key(&s.addr))
                .collect(),
        };
        // Stable (writes at one address keep their order), and linear on
        // the usual list, written in address order.
        order.sort_by_key(|s| s.addr);
        let mut out: Vec<LiveWrite<'_>> = Vec::with_capacity(order.len());
        for s in order {
            match out.last_mut() {
                Some(w) if w.addr == s.addr => {
                    let (now, first) = (w.now.to_mut(), w.original.to_mut());
                    let n = s.written.len().min(now.len());
                    now[..n].copy_from_slice(&s.written[..n]);
                    if s.written.len() > now.len() {
                        first.extend_from_slice(&s.original[now.len()..]);
                        now.extend_from_slice(&s.written[now.len()..]);
                    }
                }
                _ => out.push(LiveWrite {
                    addr: s.addr,
                    now: Cow::from(&s.written[..]),
                    original: Cow::from(&s.original[..]),
                }),
            }
        }
        out
    }

    /// Detach, last step, once every byte written is out (`foreign`: the
    /// sites another writer had changed, found then): the code ledger's
    /// entries go, the sites are forgotten, the heartbeat stops, and an
    /// agent we injected is unloaded at the target's detach.
    pub fn finish_detach(&mut self, t: &mut ProcessTarget, foreign: Vec<ForeignWrite>) {
        self.foreign.extend(foreign);
        for i in 0..self.installed.len() {
            self.ledger_unpublish(self.installed[i].ledger);
        }
        self.disabled.clear();
        self.installed.clear();
        self.removals += 1;
        self.heartbeat = None;
        self.detached = true;
        // No session holds the process through this memory any more: a
        // later one may take the agent over (`owner`).
        self.shm().ledger_ctl().tracer_pid.store(0, Relaxed);
        // Nothing of ours left mapped in a process we attached to.
        self.unload_agent(t);
    }

    /// The sites found changed by another writer (a kernel uprobe, a
    /// debugger) when hotprobe took its bytes out of them (detach, disable,
    /// removal) since the last call, each with what was done about it.
    pub fn take_foreign_writes(&mut self) -> Vec<ForeignWrite> {
        std::mem::take(&mut self.foreign)
    }

    /// Every byte range this fast path wrote into the target's code
    /// (address, original bytes), in the order written.
    pub fn written_bytes(&self) -> Vec<(u64, Vec<u8>)> {
        self.written_since(0)
    }

    /// [`FastPath::written_bytes`] from the `from`-th write on, so that a
    /// caller keeping a copy adds only what is new (probing names one at a
    /// time stays linear); with the number of writes and
    /// [`FastPath::removals`] the caller tells when its copy is stale.
    pub fn written_since(&self, from: usize) -> Vec<(u64, Vec<u8>)> {
        self.installed
            .get(from..)
            .unwrap_or_default()
            .iter()
            .map(|i| (i.addr, i.original.clone()))
            .collect()
    }

    /// How many writes [`FastPath::written_bytes`] lists.
    pub fn written_count(&self) -> usize {
        self.installed.len()
    }

    /// How many times writes left the list (detach, forget): a copy taken
    /// before a change of this number is stale.
    pub fn removals(&self) -> u64 {
        self.removals
    }

    /// Forgets every byte written without restoring anything (the image
    /// they were written into is gone: exec, exit, or a library unmapped),
    /// disables the sites and stops the heartbeat. Counters and rings stay
    /// readable.
    pub fn forget(&mut self) {
        for s in &self.installed {
            let _ = self.shm.shm().set_site_action(s.key, 0);
            if let Some(i) = s.ledger {
                self.shm.shm().unpublish_site(i);
            }
        }
        self.ledger_free.clear();
        self.ledger_next = 0;
        self.installed.clear();
        self.disabled.clear();
        self.removals += 1;
        self.heartbeat = None;
        self.detached = true;
    }

    /// Forgets the sites written at `addrs` (sorted: the sites a walk of
    /// the session's code ledger found in a library that was unmapped)
    /// without restoring them; the other sites stay. Counters and rings
    /// stay readable.
    pub fn forget_sites(&mut self, addrs: &[u64]) {
        if addrs.is_empty() {
            return;
        }
        let shm = self.shm.clone();
        self.removals += 1;
        let gone = |a: &u64| addrs.binary_search(a).is_ok();
        // A library mapped there again is probed afresh, enabled.
        self.disabled.retain(|a, _| !gone(a));
        let free = &mut self.ledger_free;
        self.installed.retain(|s| {
            let inside = gone(&s.addr);
            if inside {
                let _ = shm.shm().set_site_action(s.key, 0);
                if let Some(i) = s.ledger {
                    shm.shm().unpublish_site(i);
                    free.push(i);
                }
            }
            !inside
        });
    }

    /// Publishes a site in the code ledger before its bytes go in (see the
    /// module docs): its entry, or `None` when the ledger is full (counted).
    pub(crate) fn ledger_publish(
        &mut self,
        addr: u64,
        original: &[u8],
        written: &[u8],
        owner: u32,
    ) -> Option<u32> {
        let shm = self.shm.shm();
        let index = match self.ledger_free.pop() {
            Some(i) => i,
            None if (self.ledger_next as usize) < shm.ledger().len() => {
                self.ledger_next += 1;
                self.ledger_next - 1
            }
            None => u32::MAX,
        };
        if shm.publish_site(index, addr, original, written, owner) {
            return Some(index);
        }
        if index != u32::MAX {
            self.ledger_free.push(index);
        }
        shm.ledger_ctl().unmirrored.fetch_add(1, Relaxed);
        None
    }

    /// Takes a site's entry out of the code ledger (its original is back,
    /// or hotprobe gave it up) and frees it.
    pub(crate) fn ledger_unpublish(&mut self, entry: Option<u32>) {
        if let Some(i) = entry {
            self.shm.shm().unpublish_site(i);
            self.ledger_free.push(i);
        }
    }

    /// Sites written without an entry in the code ledger (it was full):
    /// the agent cannot put those back if the tracer dies.
    pub fn ledger_unmirrored(&self) -> u64 {
        self.shm().ledger_ctl().unmirrored.load(Relaxed)
    }

    /// Sites published in the code ledger now (what the agent would put
    /// back if the tracer died).
    pub fn ledger_published(&self) -> usize {
        let shm = self.shm();
        shm.ledger_in_use()
            .iter()
            .filter(|e| shm.ledger_site(e).is_some())
            .count()
    }
}
