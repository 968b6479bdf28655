//! Memory for stubs and trampolines near the sites (page pools), and
//! writing a batch span by span.

use hotprobe_abi::patch::jmp_rel32;
use hotprobe_process::ProcessTarget;
use hotprobe_target::{RuntimeAddr, Target};

use crate::head_last::{write_site, write_span};
use crate::{FastPath, FastPathError};

/// Size of the first page pool mapped for stubs and trampolines; each
/// further pool doubles, up to [`POOL_SIZE_MAX`], so that 100,000 stubs
/// take a dozen remote `mmap`s, not hundreds.
pub(crate) const POOL_SIZE: u64 = 64 * 1024;
/// The largest pool.
pub(crate) const POOL_SIZE_MAX: u64 = 4 << 20;
/// Room a pool must have for a stub to be assembled in place at its next
/// free address (the longest stub is well under this).
pub(crate) const STUB_ROOM: u64 = 512;
/// Pending writes of a batch closer than this are written as one span
/// (the bytes between read back first): one `pwrite` per page or so of
/// patched text instead of one per site.
pub(crate) const BATCH_GAP: u64 = 1024;
/// The longest span a batch writes at once.
pub(crate) const BATCH_SPAN: u64 = 256 * 1024;

/// A mapping of executable memory for stubs and trampolines
/// (`start..end`, bump-allocated from `next`).
#[derive(Debug)]
pub(crate) struct Pool {
    pub(crate) start: u64,
    pub(crate) next: u64,
    pub(crate) end: u64,
}

impl FastPath {
    /// The pages this fast path mapped for its stubs and trampolines
    /// (start, end): no probe may go there.
    pub fn pages(&self) -> Vec<(u64, u64)> {
        self.pools.iter().map(|p| (p.start, p.end)).collect()
    }

    /// The first pool within ±2 GiB of `near` with `len` bytes free.
    pub(crate) fn pool_with_room(&self, near: u64, len: u64) -> Option<usize> {
        self.pools.iter().position(|p| {
            p.next + len <= p.end
                && jmp_rel32(near, p.next).is_some()
                && jmp_rel32(near, p.end).is_some()
        })
    }

    /// `len` bytes of executable memory within ±2 GiB of `near` (64-byte
    /// aligned), from our pages or a new remote mapping. Never freed.
    pub(crate) fn alloc(
        &mut self,
        t: &mut ProcessTarget,
        near: u64,
        len: u64,
    ) -> Result<u64, FastPathError> {
        let len = (len + 63) & !63;
        self.page_cache = None;
        for p in &mut self.pools {
            if p.next + len <= p.end
                && jmp_rel32(near, p.next).is_some()
                && jmp_rel32(near, p.end).is_some()
            {
                let a = p.next;
                p.next += len;
                return Ok(a);
            }
        }
        let maps =
            std::fs::read_to_string(format!("/proc/{}/maps", t.live_task())).unwrap_or_default();
        let lines = hotprobe_process::parse_maps_lines(&maps);
        let grown = POOL_SIZE
            .checked_shl(self.pools.len() as u32)
            .unwrap_or(POOL_SIZE_MAX)
            .min(POOL_SIZE_MAX);
        let size = grown.max((len + 4095) & !4095);
        let addr = hotprobe_process::find_free_gap(&lines, near, size).ok_or_else(|| {
            FastPathError::NoTrampolineMemory {
                addr: near,
                why: "no free gap".into(),
            }
        })?;
        let r = hotprobe_process::remote_call::remote_syscall(
            t,
            libc::SYS_mmap as u64,
            &[
                addr,
                size,
                (libc::PROT_READ | libc::PROT_EXEC) as u64,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64,
                u64::MAX,
                0,
            ],
        )?;
        if r != addr {
            return Err(FastPathError::NoTrampolineMemory {
                addr: near,
                why: format!("remote mmap at {addr:#x} returned {r:#x}"),
            });
        }
        t.write_memory(RuntimeAddr(addr), &vec![0xcc; size as usize])?;
        self.pools.push(Pool {
            start: addr,
            next: addr + len,
            end: addr + size,
        });
        Ok(addr)
    }
}

/// Writes `writes` (address, bytes; none overlapping, except writes to the
/// same address, which go out in their order) in spans: writes closer than [`BATCH_GAP`] go out as one read and one
/// write of the span between them. Bytes under a breakpoint (`bps`; `None`:
/// unknown, so every write alone) must go through `write_memory` one write
/// at a time — it keeps the int3 and records the new original — so a span
/// never reaches over a breakpoint.
/// The span of address-sorted ranges starting at the `i`-th of `n`
/// (`range(k)`: address and length): ranges closer than [`BATCH_GAP`], up
/// to [`BATCH_SPAN`] bytes in all. Returns one past its last range, its
/// start and its end.
pub(crate) fn span_from(
    i: usize,
    n: usize,
    range: impl Fn(usize) -> (u64, usize),
) -> (usize, u64, u64) {
    let (start, len) = range(i);
    let mut end = start + len as u64;
    let mut j = i + 1;
    while j < n {
        let (a, len) = range(j);
        if a > end + BATCH_GAP || a + len as u64 - start > BATCH_SPAN {
            break;
        }
        end = end.max(a + len as u64);
        j += 1;
    }
    (j, start, end)
}

/// Writes `writes` (address and bytes, in order for one address) span by
/// span ([`span_from`]): one read and one write per span, or each alone
/// where a breakpoint of the engine lies in the span. `sites`: they are
/// sites a thread may run, written head last
/// ([`crate::head_last`]; pool memory no site reaches yet is not).
pub(crate) fn write_spans(
    t: &mut dyn Target,
    mut writes: Vec<(u64, Vec<u8>)>,
    bps: Option<&std::collections::BTreeSet<u64>>,
    sites: bool,
) -> Result<(), FastPathError> {
    // Stable: writes to one address keep their order.
    writes.sort_by_key(|w| w.0);
    let mut i = 0;
    while i < writes.len() {
        let (j, start, end) = span_from(i, writes.len(), |k| (writes[k].0, writes[k].1.len()));
        let group = &writes[i..j];
        if group.len() == 1 || bps.is_none_or(|b| b.range(start..end).next().is_some()) {
            for (a, b) in group {
                if sites {
                    write_site(t, *a, b)?;
                } else {
                    t.write_memory(RuntimeAddr(*a), b)?;
                }
            }
        } else {
            let mut buf = vec![0u8; (end - start) as usize];
            t.read_memory(RuntimeAddr(start), &mut buf)?;
            let old = sites.then(|| buf.clone());
            for (a, b) in group {
                let o = (a - start) as usize;
                buf[o..o + b.len()].copy_from_slice(b);
            }
            match old {
                Some(old) => {
                    let heads = group.iter().map(|(a, b)| (*a, b.len()));
                    write_span(t, start, &old, &buf, heads)?;
                }
                None => t.write_memory(RuntimeAddr(start), &buf)?,
            }
        }
        i = j;
    }
    Ok(())
}
