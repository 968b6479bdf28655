//! Code that changes under a probe (issue 22): a program that maps its
//! text again from the file, or drops its pages with `MADV_DONTNEED`,
//! silently takes hotprobe's bytes out: the file's code runs again and the
//! probe would count nothing from then on. The ledger is walked for that
//! once a second while a target runs, and before detaching it: a site
//! whose bytes are all the original ones again is armed again and named
//! in a notice.
//!
//! The sites watched are the agent's (patch calls, jumps, in-process
//! traps): each found is written again by the fast path, as at placement
//! ([`hotprobe_fastpath::FastPath::rearm_reverted`]), and the notice says
//! that the calls made in between went uncounted; a site it cannot write
//! again is named as counting nothing from then on. The ptrace trap's
//! `int3`s are asked of the process target, which knows which it holds
//! (`ProcessTarget::rearm_reverted_breakpoints`): one whose byte is the
//! original again is written again and named the same way.

use super::*;

/// How often the running targets' ledgers are walked.
pub(super) const REVERTED_CHECK_EVERY: Duration = Duration::from_secs(1);

/// Bytes read at once around the sites (one read covers the sites of a
/// few pages of text).
const WINDOW: usize = 16 << 10;

/// What the walk keeps between two checks of one target.
#[derive(Debug, Default)]
pub(super) struct RevertedSites {
    /// When the ledger was last walked.
    last: Option<Instant>,
    /// Sites already named (their start).
    named: std::collections::HashSet<u64>,
}

impl Session {
    /// Walks the ledger of every live process target whose last walk is
    /// older than [`REVERTED_CHECK_EVERY`] (every one when `now_all`),
    /// naming the sites whose code is the original again.
    pub(super) fn check_reverted_sites(&mut self, now_all: bool) {
        let due = now_all
            || self
                .watch_check
                .is_none_or(|t| t.elapsed() >= REVERTED_CHECK_EVERY);
        if due && self.has_data_watches() {
            self.watch_check = Some(Instant::now());
            self.check_unseen_writes();
        }
        for slot in &mut self.slots {
            if !slot.is_process() || slot.engine.gone().is_some() {
                continue;
            }
            let due = now_all
                || slot
                    .reverted
                    .last
                    .is_none_or(|t| t.elapsed() >= REVERTED_CHECK_EVERY);
            if due {
                slot.reverted.last = Some(Instant::now());
                check_slot(slot);
            }
        }
    }

    /// Whether some live target has code in its ledger to watch over (the
    /// run loop then wakes at least every [`REVERTED_CHECK_EVERY`]).
    pub(super) fn has_code_to_watch(&self) -> bool {
        self.slots
            .iter()
            .any(|s| s.is_process() && s.engine.gone().is_none() && !s.ledger.sites().is_empty())
    }
}

/// One target's walk: every site not named yet whose bytes equal the
/// original ones again.
fn check_slot(slot: &mut Slot) {
    slot.sync_ledger();
    let pid = slot.pid.unwrap_or(0);
    let mut found: Vec<u64> = Vec::new();
    // The sites of the agent's mechanisms that serve a probe: their bytes
    // stay in place while armed. The process target's int3s are not
    // walked from the ledger (a failed placement or an exiting process
    // takes some out before the ledger hears of it, guards are there for
    // a moment): the target, which knows what it holds, is asked below.
    let watched: Vec<(u64, &[u8])> = slot
        .ledger
        .sites()
        .iter()
        .filter(|site| match site.owner {
            CodeOwner::Guard | CodeOwner::Trap | CodeOwner::Inherited => false,
            CodeOwner::Fast => site.has_probes(),
            CodeOwner::InProcess => true,
        })
        .map(|site| (site.start, site.original()))
        .filter(|(start, original)| !original.is_empty() && !slot.reverted.named.contains(start))
        .collect();
    {
        let target = slot.target.as_target();
        let mut window: (u64, Vec<u8>) = (0, Vec::new());
        for (start, original) in watched {
            let len = original.len();
            let inside =
                start >= window.0 && start + len as u64 <= window.0 + window.1.len() as u64;
            if !inside {
                window = (start, vec![0u8; WINDOW.max(len)]);
                if target
                    .read_memory(RuntimeAddr(start), &mut window.1)
                    .is_err()
                {
                    // The window runs past the mapping: this site alone.
                    window.1.truncate(len);
                    if target
                        .read_memory(RuntimeAddr(start), &mut window.1)
                        .is_err()
                    {
                        window.1.clear();
                        continue;
                    }
                }
            }
            let at = (start - window.0) as usize;
            if window.1[at..at + len] == *original {
                found.push(start);
            }
        }
    }
    // The trap's int3s: the target writes them again itself.
    let mut trap = slot
        .target
        .process()
        .map(|pt| pt.rearm_reverted_breakpoints())
        .unwrap_or_default();
    trap.lost.retain(|a| !slot.reverted.named.contains(a));
    if found.is_empty() && trap.rearmed.is_empty() && trap.lost.is_empty() {
        return;
    }
    // Armed again where the fast path can: its bytes written back, as at
    // placement; the calls made between the change and now went uncounted.
    let rearmed = match found.is_empty() {
        true => Vec::new(),
        false => match slot.agent.rearm(&mut slot.engine, &mut slot.target, &found) {
            Ok(r) => r,
            Err(e) => {
                slot.notice(format!(
                    "pid {pid}: cannot arm reverted probe sites again: {e}"
                ));
                Vec::new()
            }
        },
    };
    let (mut again, mut lost): (Vec<u64>, Vec<u64>) =
        found.into_iter().partition(|a| rearmed.contains(a));
    again.extend(trap.rearmed);
    lost.extend(trap.lost);
    let symbolizer = slot.engine.symbolizer();
    let names = |sites: &[u64]| -> String {
        let names: Vec<String> = sites
            .iter()
            .map(|&a| {
                symbolizer
                    .as_ref()
                    .and_then(|s| s.symbolize(RuntimeAddr(a)))
                    .map_or_else(|| format!("{a:#x}"), |n| format!("{n} at {a:#x}"))
            })
            .collect();
        let shown: Vec<&str> = names.iter().take(8).map(String::as_str).collect();
        let more = names.len().saturating_sub(shown.len());
        format!(
            "{}{}",
            shown.join(", "),
            if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            }
        )
    };
    let sites = |n: usize| {
        if n == 1 {
            "1 probe site".to_string()
        } else {
            format!("{n} probe sites")
        }
    };
    let mut notices = Vec::new();
    if !again.is_empty() {
        notices.push(format!(
            "pid {pid}: {} held the original code again (the text was mapped again, or its pages \
             dropped with MADV_DONTNEED) and {} armed again: {}; calls made in between (up to \
             {} s) were not counted",
            sites(again.len()),
            if again.len() == 1 { "is" } else { "are" },
            names(&again),
            REVERTED_CHECK_EVERY.as_secs()
        ));
    }
    if !lost.is_empty() {
        notices.push(format!(
            "pid {pid}: {} hold{} the original code again (the text was mapped again, or its \
             pages dropped with MADV_DONTNEED): {}; their probes count nothing from then on",
            sites(lost.len()),
            if lost.len() == 1 { "s" } else { "" },
            names(&lost)
        ));
        // Named once: nothing will change for them.
        slot.reverted.named.extend(lost);
    }
    for n in notices {
        slot.notice(n);
    }
}
