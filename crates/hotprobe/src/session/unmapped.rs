//! Sites whose module went (issue 21): at each change of a process's
//! loaded modules, one walk of its code ledger against its mappings finds
//! the sites no mapping holds any more (a library the program unloaded
//! while probes placed in it were armed). Every mechanism forgets them,
//! as for a pending probe's module (`Slot::forget_unmapped`: nothing is
//! written, the memory is gone), and a notice names how many went and
//! says that their probes count nothing from then on. A pending probe's
//! module is handled before (`refresh_pending`: it is armed again when the
//! module comes back), so its sites are no longer in the ledger here.

use super::*;

impl Slot {
    /// See the module docs.
    pub(super) fn forget_unmapped_sites(&mut self) {
        let Some(pid) = self.pid else { return };
        self.sync_ledger();
        if self.ledger.sites().is_empty() {
            return;
        }
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
            return;
        };
        let mut mapped: Vec<(u64, u64)> = maps
            .lines()
            .filter_map(|l| {
                let (s, e) = l.split_whitespace().next()?.split_once('-')?;
                Some((
                    u64::from_str_radix(s, 16).ok()?,
                    u64::from_str_radix(e, 16).ok()?,
                ))
            })
            .collect();
        mapped.sort_unstable();
        let gaps = self.ledger.unmapped_gaps(&mapped);
        if gaps.is_empty() {
            return;
        }
        for (start, end, sites) in gaps {
            self.forget_unmapped(start, end);
            if sites == 0 {
                // Guards alone (their probe's site went before).
                continue;
            }
            self.notice(format!(
                "pid {pid}: {sites} probe site(s) at {start:#x}..{end:#x} went with a module \
                 the program unloaded: their probes count nothing from now on (a probe \
                 placed while its module is not loaded is armed again when it comes back)"
            ));
        }
        // The guards of the `int3`s that went, forgotten with them (their
        // memory is gone too).
        let (mut cx, mechs) = self.parts();
        mechs.trap.publish(&mut cx);
    }
}
