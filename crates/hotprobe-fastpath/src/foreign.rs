//! Sites another writer changed while hotprobe's bytes were in them,
//! and taking hotprobe's bytes out of sites.

use hotprobe_target::{RuntimeAddr, Target};

use crate::pool::span_from;
use crate::FastPathError;

/// A probe site another writer changed while hotprobe's bytes were in it.
/// A kernel uprobe (bpftrace, `perf probe`) placed on the same instruction
/// writes its `int3` over the first byte, and puts the file's byte back
/// when it goes if its `int3` is still there. When hotprobe takes its code
/// out it recognises those two cases; anything else it leaves as found
/// (see `docs/DESIGN.md`, "Code shared with other tools").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForeignWrite {
    /// The site's address.
    pub addr: u64,
    /// The bytes hotprobe left there.
    pub expected: Vec<u8>,
    /// The bytes found there.
    pub found: Vec<u8>,
    /// What hotprobe did about it.
    pub outcome: ForeignOutcome,
}

/// What hotprobe did at a site another writer changed ([`ForeignWrite`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForeignOutcome {
    /// An `int3` over the first byte, the rest hotprobe's: the `int3` was
    /// kept, over the original instructions (the uprobe works on).
    Int3Kept,
    /// The first byte back to the original, the rest hotprobe's (a uprobe
    /// that came and went): the original was put back whole.
    Restored,
    /// Bytes hotprobe cannot account for: the site was left as found.
    LeftAsFound,
    /// A disabled probe's site changed since the disable: it was not
    /// enabled again (writing over the other writer's bytes would break
    /// its probe, and its removal would then break hotprobe's).
    LeftDisabled,
}

/// Whether `bytes` decode as NOP instructions to their end.
pub(crate) fn all_nops(bytes: &[u8]) -> bool {
    use hotprobe_x86::iced_x86::{Decoder, DecoderOptions, Mnemonic};
    // The usual placeholders, without a decoder.
    if bytes == hotprobe_abi::patch::NOP5 || (!bytes.is_empty() && bytes.iter().all(|b| *b == 0x90))
    {
        return true;
    }
    let mut d = Decoder::new(64, bytes, DecoderOptions::NONE);
    while d.can_decode() {
        if d.decode().mnemonic() != Mnemonic::Nop {
            return false;
        }
    }
    !bytes.is_empty()
}

/// Takes hotprobe's bytes out of `live` (a site's bytes now), where
/// hotprobe wrote `expected` over `original`. Decided per site, never per
/// byte (another writer's code merged with the original would be neither):
/// hotprobe's bytes untouched give the original (`None`); the two changes
/// a kernel uprobe makes are recognised; anything else is left as found.
pub(crate) fn take_own_bytes_out(
    live: &mut [u8],
    expected: &[u8],
    original: &[u8],
) -> Option<ForeignOutcome> {
    if live == expected {
        live.copy_from_slice(original);
        return None;
    }
    let rest_ours = !live.is_empty() && live[1..] == expected[1..];
    if rest_ours && live[0] == 0xcc {
        live[1..].copy_from_slice(&original[1..]);
        return Some(ForeignOutcome::Int3Kept);
    }
    if rest_ours && live[0] == original[0] {
        live.copy_from_slice(original);
        return Some(ForeignOutcome::Restored);
    }
    Some(ForeignOutcome::LeftAsFound)
}

/// A site to take hotprobe's bytes out of (see [`restore_spans`]).
pub(crate) struct Restore<'a> {
    pub(crate) addr: u64,
    /// The bytes hotprobe left there.
    pub(crate) expected: &'a [u8],
    pub(crate) original: &'a [u8],
}

/// Takes hotprobe's bytes out of every site of `sites` (in their order for
/// sites at one address), span by span as [`write_spans`] writes: each span
/// is read, each site's bytes still hotprobe's get their original back
/// ([`take_own_bytes_out`]), and the span is written. The sites another
/// writer changed go to `foreign`.
pub(crate) fn restore_spans(
    t: &mut dyn Target,
    mut sites: Vec<Restore<'_>>,
    bps: Option<&std::collections::BTreeSet<u64>>,
    foreign: &mut Vec<ForeignWrite>,
) -> Result<(), FastPathError> {
    let mut check = |s: &Restore<'_>, live: &mut [u8]| {
        let found = (live != s.expected).then(|| live.to_vec());
        if let (Some(outcome), Some(found)) =
            (take_own_bytes_out(live, s.expected, s.original), found)
        {
            if !foreign.iter().any(|f: &ForeignWrite| f.addr == s.addr) {
                foreign.push(ForeignWrite {
                    addr: s.addr,
                    expected: s.expected.to_vec(),
                    found,
                    outcome,
                });
            }
        }
    };
    // Stable: sites at one address keep their order.
    sites.sort_by_key(|s| s.addr);
    // A span that cannot be read or written (its mapping gone) is no
    // reason to leave the others: the first error is returned at the end.
    let mut first_err = None;
    let mut i = 0;
    while i < sites.len() {
        let (j, start, end) =
            span_from(i, sites.len(), |k| (sites[k].addr, sites[k].expected.len()));
        let group = &sites[i..j];
        if group.len() == 1 || bps.is_none_or(|b| b.range(start..end).next().is_some()) {
            for s in group {
                let mut live = vec![0u8; s.expected.len()];
                let r = t
                    .read_memory(RuntimeAddr(s.addr), &mut live)
                    .and_then(|()| {
                        check(s, &mut live);
                        crate::head_last::write_site(t, s.addr, &live)
                    });
                if let Err(e) = r {
                    first_err.get_or_insert(e);
                }
            }
        } else {
            let mut buf = vec![0u8; (end - start) as usize];
            let r = t.read_memory(RuntimeAddr(start), &mut buf).and_then(|()| {
                let old = buf.clone();
                for s in group {
                    let o = (s.addr - start) as usize;
                    check(s, &mut buf[o..o + s.expected.len()]);
                }
                let heads = group.iter().map(|s| (s.addr, s.expected.len()));
                crate::head_last::write_span(t, start, &old, &buf, heads)
            });
            if let Err(e) = r {
                first_err.get_or_insert(e);
            }
        }
        i = j;
    }
    match first_err {
        Some(e) => Err(e.into()),
        None => Ok(()),
    }
}

/// One site for [`restore_sites`]: hotprobe wrote `expected` at `addr`
/// over `original` (the same length).
#[derive(Clone, Copy, Debug)]
pub struct SiteRestore<'a> {
    /// The first byte written.
    pub addr: u64,
    /// The bytes hotprobe left there.
    pub expected: &'a [u8],
    /// The bytes they replaced.
    pub original: &'a [u8],
}

/// Takes hotprobe's bytes out of every site of `sites`, whoever wrote
/// them, in one pass: a write per span of nearby sites, each site's
/// original back where its bytes are still hotprobe's, the two changes a
/// kernel uprobe makes recognised, anything else left as found and added
/// to `foreign` (see [`ForeignWrite`]). Sites at one address are taken in
/// their order. `bps`: `int3`s of the process target still tracked (its
/// reads show the byte under them, its writes keep them; `None`: do not
/// batch). A site whose `expected` and `original` differ in length is
/// skipped. A span that cannot be written does not stop the others: the
/// first error is returned once all were tried. Expects every thread
/// stopped, none inside a site's bytes.
pub fn restore_sites(
    t: &mut dyn Target,
    sites: &[SiteRestore<'_>],
    bps: Option<&std::collections::BTreeSet<u64>>,
    foreign: &mut Vec<ForeignWrite>,
) -> Result<(), FastPathError> {
    let restore = sites
        .iter()
        .filter(|s| s.expected.len() == s.original.len())
        .map(|s| Restore {
            addr: s.addr,
            expected: s.expected,
            original: s.original,
        })
        .collect();
    restore_spans(t, restore, bps, foreign)
}

#[cfg(test)]
mod tests {
    use super::{all_nops, take_own_bytes_out, ForeignOutcome};

    #[test]
    fn only_hotprobes_own_bytes_are_taken_out() {
        let original = [0x48, 0x85, 0xff, 0x7e, 0x23, 0x31];
        let jump = [0xe9, 0x2b, 0xde, 0xfe, 0xff, 0xcc];
        // Untouched: the original comes back whole.
        let mut live = jump;
        assert_eq!(take_own_bytes_out(&mut live, &jump, &original), None);
        assert_eq!(live, original);
        // A uprobe's int3 over the first byte stays, over the original
        // instructions (the kernel runs the first one out of line).
        let mut live = jump;
        live[0] = 0xcc;
        assert_eq!(
            take_own_bytes_out(&mut live, &jump, &original),
            Some(ForeignOutcome::Int3Kept)
        );
        assert_eq!(live, [0xcc, 0x85, 0xff, 0x7e, 0x23, 0x31]);
        // A uprobe gone put the file's byte back: the original, whole.
        let mut live = jump;
        live[0] = 0x48;
        assert_eq!(
            take_own_bytes_out(&mut live, &jump, &original),
            Some(ForeignOutcome::Restored)
        );
        assert_eq!(live, original);
    }

    #[test]
    fn code_hotprobe_cannot_account_for_is_left_as_found() {
        // A patch site (NOP5 -> call) where the kernel optimised a uprobe
        // into its own call: same first byte, other target. Merging byte
        // by byte would give `0f` + the kernel's rel32, neither's code.
        let nop5 = [0x0f, 0x1f, 0x44, 0x00, 0x00];
        let ours = [0xe8, 0x10, 0x20, 0x30, 0x00];
        let theirs = [0xe8, 0x99, 0x88, 0x77, 0x66];
        let mut live = theirs;
        assert_eq!(
            take_own_bytes_out(&mut live, &ours, &nop5),
            Some(ForeignOutcome::LeftAsFound)
        );
        assert_eq!(live, theirs);
    }

    #[test]
    fn placeholders_are_nops_only() {
        assert!(all_nops(&[0x0f, 0x1f, 0x44, 0x00, 0x00]));
        assert!(all_nops(&[0x66, 0x90, 0x0f, 0x1f, 0x00]));
        assert!(!all_nops(&[0xcc, 0x1f, 0x44, 0x00, 0x00]));
        assert!(!all_nops(&[0xe8, 0x10, 0x20, 0x30, 0x00]));
        assert!(!all_nops(&[0x0f, 0x1f, 0x44, 0x00]), "cut short");
        assert!(!all_nops(&[]));
    }
}
