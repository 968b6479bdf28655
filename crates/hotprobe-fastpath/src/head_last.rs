//! Writing sites so that a tracer killed mid-write leaves none half
//! written that a thread could run.
//!
//! A write through `/proc/PID/mem` goes page by page in address order, and
//! the kernel stops it short once the writer has a fatal signal pending:
//! hotprobe killed with SIGKILL in the middle of a span's write left a
//! jump with its first four bytes new and its fifth the original's, which
//! the program then ran (a jump 208 MiB away: SIGSEGV; `tracer_killed`,
//! seen once in a few dozen runs). So every site of more than one byte
//! goes in in two writes: first with an `int3` over its first byte and its
//! other bytes new, then with its first byte. Within a site the first byte
//! comes first in address order, so a write cut anywhere leaves each site
//! whole, as it was, or starting with `int3`; a thread that runs into that
//! `int3` after the tracer's death traps into the agent, which puts the
//! site back (the agent's `undo` accepts a site whose bytes are each the
//! original's or the written's). While the tracer lives, the threads are
//! stopped across both writes and never see the `int3`.

use hotprobe_target::{RuntimeAddr, Target, TargetError};

const INT3: u8 = 0xcc;

/// Writes `bytes` at `addr` as one site: the first byte last (see the
/// module docs); one write for a single byte.
pub(crate) fn write_site(t: &mut dyn Target, addr: u64, bytes: &[u8]) -> Result<(), TargetError> {
    if bytes.len() > 1 {
        let mut staged = bytes.to_vec();
        staged[0] = INT3;
        t.write_memory(RuntimeAddr(addr), &staged)?;
        t.write_memory(RuntimeAddr(addr), &bytes[..1])
    } else {
        t.write_memory(RuntimeAddr(addr), bytes)
    }
}

/// Writes span `new` at `start`, which held `old`, where `sites` (address
/// and length) start: first with an `int3` over the first byte of each
/// site of more than one byte that changes, then `new` (see the module
/// docs). One write when no such site changes.
pub(crate) fn write_span(
    t: &mut dyn Target,
    start: u64,
    old: &[u8],
    new: &[u8],
    sites: impl Iterator<Item = (u64, usize)>,
) -> Result<(), TargetError> {
    let staged = staged_span(start, old, new, sites);
    if let Some(staged) = &staged {
        t.write_memory(RuntimeAddr(start), staged)?;
    }
    t.write_memory(RuntimeAddr(start), new)
}

/// The first of [`write_span`]'s two writes; `None` when no site of more
/// than one byte changes.
fn staged_span(
    start: u64,
    old: &[u8],
    new: &[u8],
    sites: impl Iterator<Item = (u64, usize)>,
) -> Option<Vec<u8>> {
    let mut staged: Option<Vec<u8>> = None;
    for (addr, len) in sites {
        let Some(o) = addr.checked_sub(start).map(|o| o as usize) else {
            continue;
        };
        let Some(range) = (len > 1).then(|| o..o + len).filter(|r| r.end <= new.len()) else {
            continue;
        };
        if old.get(range.clone()) != new.get(range) {
            staged.get_or_insert_with(|| new.to_vec())[o] = INT3;
        }
    }
    staged
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_changed_site_is_staged_with_an_int3_head_and_unchanged_ones_are_not() {
        let old = [0x90u8; 16];
        let mut new = old;
        // A 5-byte jump at +2; a 5-byte site at +9 written as it was.
        new[2..7].copy_from_slice(&[0xe9, 1, 2, 3, 4]);
        let staged = staged_span(0x1000, &old, &new, [(0x1002, 5), (0x1009, 5)].into_iter())
            .expect("a site changes");
        let mut want = new;
        want[2] = INT3;
        assert_eq!(staged, want);
        // Nothing changes: one write.
        assert_eq!(
            staged_span(0x1000, &old, &old, [(0x1002, 5)].into_iter()),
            None
        );
        // Single bytes (in-process int3s) need no staging.
        let mut one = old;
        one[4] = INT3;
        assert_eq!(
            staged_span(0x1000, &old, &one, [(0x1004, 1)].into_iter()),
            None
        );
    }

    #[test]
    fn every_cut_of_a_staged_write_leaves_a_site_whole_old_or_int3_first() {
        let old = [0x48u8, 0x8d, 0x84, 0x7f, 0xf2, 0x00, 0x00, 0x00];
        let new = [0xe9u8, 0x56, 0x89, 0xfd, 0xff, 0xcc, 0xcc, 0xcc];
        let staged = staged_span(0, &old, &new, [(0, 8)].into_iter()).unwrap();
        // The memory after the first write cut at `cut` bytes, then after
        // the second cut likewise.
        for cut in 0..=8 {
            let mut mem = old;
            mem[..cut].copy_from_slice(&staged[..cut]);
            assert!(
                mem == old || mem[0] == INT3,
                "first write cut at {cut}: {mem:x?}"
            );
        }
        for cut in 0..=8 {
            let mut mem = staged.clone();
            mem[..cut].copy_from_slice(&new[..cut]);
            assert!(
                mem == new || mem[0] == INT3,
                "second write cut at {cut}: {mem:x?}"
            );
        }
    }
}
