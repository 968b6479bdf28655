//! Disabling, enabling and removing one fast-path probe while the target
//! runs.
//!
//! Per-site stubs count with one `inc` and never read the site table, so
//! flipping a site's action in shared memory alone would not stop them.
//! A disabled probe's sites therefore get their original bytes back (the
//! patchable NOP or the displaced instructions): a disabled hit costs
//! nothing at all, whatever sits behind the site (stub, generic
//! trampoline, handler trampoline). The site's action is cleared first, so
//! a thread already past the site (in a stub or trampoline; their memory
//! is never freed before detach) finishes in the generic path as a hit of
//! a quiet site. The rewrite is done with every thread stopped and none
//! strictly inside the bytes written (the scheme of [`FastPath::detach`]).
//! Enabling writes the patched bytes back and restores the action bits.
//! Removing restores the original bytes for good and forgets the sites;
//! their stubs and trampolines stay mapped until detach.
//!
//! Taking hotprobe's bytes out reads the site first: another writer's
//! change (a kernel uprobe's `int3`) is dealt with as `detach` does
//! (`take_own_bytes_out`), and a disabled site another writer changed
//! since stays disabled; both are reported by
//! [`FastPath::take_foreign_writes`].

use crate::foreign::take_own_bytes_out;
use crate::install::wait_pcs_outside;
use crate::{FastPath, FastPathError, ForeignOutcome, ForeignWrite};
use hotprobe_process::ProcessTarget;
use hotprobe_target::{RuntimeAddr, Target};

impl FastPath {
    /// The spans `(start, end)` of [`FastPath::written_bytes`] from the
    /// `from`-th write on, without copying their bytes (the session's index
    /// of its sites).
    pub fn written_spans_since(&self, from: usize) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.installed
            .get(from..)
            .unwrap_or_default()
            .iter()
            .map(|i| (i.addr, i.addr + i.original.len() as u64))
    }

    /// Takes hotprobe's bytes out of site `i` (see
    /// [`take_own_bytes_out`]), noting another writer's change.
    fn take_out(&mut self, t: &mut ProcessTarget, i: usize) -> Result<(), FastPathError> {
        let s = &self.installed[i];
        let mut live = vec![0u8; s.written.len()];
        t.read_memory(RuntimeAddr(s.addr), &mut live)?;
        let found = live.clone();
        if let Some(outcome) = take_own_bytes_out(&mut live, &s.written, &s.original) {
            self.foreign.push(ForeignWrite {
                addr: s.addr,
                expected: s.written.clone(),
                found,
                outcome,
            });
        }
        crate::head_last::write_site(t, s.addr, &live)?;
        Ok(())
    }

    /// Indices in `installed` of the sites of fast probe `probe_id` (its
    /// entry site and any exit placeholders); in-process traps (key 0)
    /// are not among them.
    fn sites_of(&self, probe_id: u32) -> Vec<usize> {
        let shm = self.shm();
        self.installed
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.key != 0 && shm.lookup_site(s.key).is_some_and(|(p, _)| p == probe_id)
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// Whether fast probe `probe_id` has sites installed (armed or
    /// disabled).
    pub fn has_sites(&self, probe_id: u32) -> bool {
        !self.sites_of(probe_id).is_empty()
    }

    /// Disables or enables every site of fast probe `probe_id` (see the
    /// module docs); idempotent. Stops every thread and leaves them
    /// stopped (resume the target afterwards). Returns how many sites
    /// changed.
    pub fn set_probe_enabled(
        &mut self,
        t: &mut ProcessTarget,
        probe_id: u32,
        enabled: bool,
    ) -> Result<usize, FastPathError> {
        let sites = self.sites_of(probe_id);
        if sites.is_empty() {
            return Ok(0);
        }
        t.stop_all()?;
        let mut changed = 0;
        for i in sites {
            let (addr, key, len) = {
                let s = &self.installed[i];
                (s.addr, s.key, s.original.len())
            };
            if enabled {
                let Some((patched, action)) = self.disabled.remove(&addr) else {
                    continue;
                };
                wait_pcs_outside(t, addr, len as u64)?;
                let mut live = vec![0u8; len];
                t.read_memory(RuntimeAddr(addr), &mut live)?;
                if live != self.installed[i].original {
                    // Another writer's bytes (a kernel uprobe's int3) are
                    // there: rewriting them would break its probe, and its
                    // removal would then break hotprobe's. The site stays
                    // disabled.
                    self.foreign.push(ForeignWrite {
                        addr,
                        expected: self.installed[i].original.clone(),
                        found: live,
                        outcome: ForeignOutcome::LeftDisabled,
                    });
                    self.disabled.insert(addr, (patched, action));
                    continue;
                }
                crate::head_last::write_site(t, addr, &patched)?;
                self.shm()
                    .set_site_action(key, action)
                    .map_err(|e| FastPathError::Shm(e.to_string()))?;
            } else {
                if self.disabled.contains_key(&addr) {
                    continue;
                }
                let action = self.shm().lookup_site(key).map_or(0, |(_, a)| a);
                self.shm()
                    .set_site_action(key, 0)
                    .map_err(|e| FastPathError::Shm(e.to_string()))?;
                wait_pcs_outside(t, addr, len as u64)?;
                self.take_out(t, i)?;
                let patched = self.installed[i].written.clone();
                self.disabled.insert(addr, (patched, action));
            }
            changed += 1;
        }
        Ok(changed)
    }

    /// Writes this fast path's bytes again at the sites of `addrs` that
    /// hold the original code again (the program mapped its text again,
    /// or dropped its pages with `MADV_DONTNEED`), as enabling does: every
    /// thread stopped, none strictly inside the bytes. A disabled site, a
    /// site not this fast path's, or one whose bytes are neither the
    /// original nor ours, is left alone. Returns the sites rewritten.
    /// Leaves the threads stopped.
    pub fn rearm_reverted(
        &mut self,
        t: &mut ProcessTarget,
        addrs: &[u64],
    ) -> Result<Vec<u64>, FastPathError> {
        let sites: Vec<usize> = (0..self.installed.len())
            .filter(|&i| {
                let a = self.installed[i].addr;
                addrs.contains(&a) && !self.disabled.contains_key(&a)
            })
            .collect();
        if sites.is_empty() {
            return Ok(Vec::new());
        }
        t.stop_all()?;
        let mut done = Vec::new();
        for i in sites {
            let (addr, len) = (self.installed[i].addr, self.installed[i].original.len());
            let mut live = vec![0u8; len];
            t.read_memory(RuntimeAddr(addr), &mut live)?;
            if live != self.installed[i].original {
                continue;
            }
            wait_pcs_outside(t, addr, len as u64)?;
            let written = self.installed[i].written.clone();
            crate::head_last::write_site(t, addr, &written)?;
            done.push(addr);
        }
        Ok(done)
    }

    /// Removes fast probe `probe_id` for good: its sites are quieted, get
    /// their original bytes back and leave the list of written bytes; its
    /// stubs and trampolines stay mapped until detach (a thread may still
    /// be inside one). Its counters keep their values. Stops every thread
    /// and leaves them stopped. Returns how many sites were removed.
    pub fn remove_probe(
        &mut self,
        t: &mut ProcessTarget,
        probe_id: u32,
    ) -> Result<usize, FastPathError> {
        let mut sites = self.sites_of(probe_id);
        if sites.is_empty() {
            return Ok(0);
        }
        t.stop_all()?;
        // Reverse order of installation, as detach restores.
        sites.reverse();
        for &i in &sites {
            let (addr, key, len) = {
                let s = &self.installed[i];
                (s.addr, s.key, s.original.len())
            };
            let _ = self.shm().set_site_action(key, 0);
            if self.disabled.remove(&addr).is_none() {
                wait_pcs_outside(t, addr, len as u64)?;
                self.take_out(t, i)?;
            }
            self.handler_keys.remove(&key);
        }
        // `sites` is in descending index order: removal keeps the rest valid.
        for &i in &sites {
            let s = self.installed.remove(i);
            self.ledger_unpublish(s.ledger);
        }
        self.removals += 1;
        Ok(sites.len())
    }
}
