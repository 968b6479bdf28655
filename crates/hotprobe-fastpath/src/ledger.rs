//! The code bytes this fast path wrote: detach, the list of written
//! bytes, forgetting them.

use hotprobe_process::ProcessTarget;
use hotprobe_target::{Target, TargetError};

use crate::foreign::{restore_spans, Restore};
use crate::install::wait_pcs_outside;
use crate::FastPathError;
use crate::{FastPath, ForeignWrite};

impl FastPath {
    /// Takes out every byte written (the original back, or what
    /// [`ForeignOutcome`] says where another writer changed a site; see
    /// [`FastPath::take_foreign_writes`]), disables every site, stops the
    /// heartbeat. The threads are stopped for the restore and left stopped
    /// (resume or detach the target afterwards). Trampoline pages and the
    /// agent stay mapped (see the crate docs).
    pub fn detach(&mut self, t: &mut ProcessTarget) -> Result<(), FastPathError> {
        if self.detached {
            return Ok(());
        }
        if let Err(e) = t.stop_all() {
            // A process that is gone has nothing left to restore.
            if matches!(e, TargetError::Gone { .. }) {
                self.forget();
                return Ok(());
            }
            return Err(e.into());
        }
        // Every original put back in one batch: a write per span of
        // nearby sites (see `end_batch`), in reverse order of installation
        // (the batch keeps that order for writes to one address).
        let mut restore = Vec::with_capacity(self.installed.len());
        for s in self.installed.iter().rev() {
            // A thread can sit at the first byte of a site (fine: it runs
            // the original instruction) but never strictly inside: the
            // patched bytes are one instruction, padded with int3 never run.
            wait_pcs_outside(t, s.addr, s.original.len() as u64)?;
            // A disabled site holds its original bytes already: nothing
            // of hotprobe's to take out.
            if !self.disabled.contains_key(&s.addr) {
                restore.push(Restore {
                    addr: s.addr,
                    expected: &s.written,
                    original: &s.original,
                });
            }
            if s.key == 0 {
                // An in-process trap (`inproc`): its entry stays.
                self.shm.shm().quiet_inproc(s.addr);
            } else {
                let _ = self.shm.shm().set_site_action(s.key, 0);
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
        self.disabled.clear();
        self.installed.clear();
        self.removals += 1;
        self.heartbeat = None;
        self.detached = true;
        Ok(())
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
        }
        self.installed.clear();
        self.disabled.clear();
        self.removals += 1;
        self.heartbeat = None;
        self.detached = true;
    }

    /// Forgets the byte ranges written inside `[start, end)` (a library
    /// that was unmapped) without restoring them; the other sites stay.
    pub fn forget_range(&mut self, start: u64, end: u64) {
        let shm = self.shm.clone();
        self.removals += 1;
        // A library mapped there again is probed afresh, enabled.
        self.disabled.retain(|a, _| *a < start || *a >= end);
        self.installed.retain(|s| {
            let inside = s.addr >= start && s.addr < end;
            if inside {
                let _ = shm.shm().set_site_action(s.key, 0);
            }
            !inside
        });
    }
}
