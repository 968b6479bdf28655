//! Placing a punned jump (see [`hotprobe_x86::PunPlan`]): the trampoline
//! must start at an address one of the encoding's windows reaches, in
//! memory of ours: the free end of a page pool already mapped there, else
//! pages mapped at exactly that address (`MAP_FIXED_NOREPLACE`), which
//! become a pool like any other (unmapped at detach with the rest).

use std::path::Path;

use hotprobe_process::ProcessTarget;
use hotprobe_target::{RuntimeAddr, Target};
use hotprobe_x86::PunPlan;

use crate::pool::Pool;
use crate::{FastPath, FastPathError, FunctionInfo, ModuleInfo};

/// Bytes a punned site's trampoline takes (as a plain jump's).
pub(crate) const PUN_TRAMPOLINE: u64 = 64;
/// Lowest address mapped (vm.mmap_min_addr's usual value).
const MIN_ADDR: u64 = 0x10000;
/// Top of the user address space on x86-64 (47-bit).
const USER_TOP: u64 = 0x7fff_ffff_f000;
/// Room kept free above the heap (brk grows there) and below the stack.
const GROWTH_ROOM: u64 = 256 << 20;

/// What a probe on the next function may write over its first byte, the
/// one fixed byte of the displacement: an `int3` (any trap, a uprobe), a
/// `jmp rel32`, a `call rel32` (a patch).
pub(crate) const NEXT_FIRST: [u8; 3] = [0xcc, 0xe9, 0xe8];

/// Where one trampoline of a punned site goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PunSpot {
    /// In pool `index`, whose free part starts at or before the address.
    Pool { index: usize },
    /// In pages to map at `start..end` (free now).
    Map { start: u64, end: u64 },
}

/// The room a trampoline at `t` would take: the free end of a pool
/// (`pools`: next free address, end), or free pages between the mappings
/// of `maps` (start, end, name, sorted by start), not right above the
/// heap nor right below the stack (they grow there), in user space.
fn spot_for(t: u64, pools: &[(u64, u64)], maps: &[(u64, u64, String)]) -> Option<PunSpot> {
    let end = t.checked_add(PUN_TRAMPOLINE)?;
    if let Some(index) = pools.iter().position(|&(n, e)| n <= t && end <= e) {
        return Some(PunSpot::Pool { index });
    }
    let (start, end) = (t & !0xfff, end.checked_add(0xfff)? & !0xfff);
    if start < MIN_ADDR || end > USER_TOP {
        return None;
    }
    let i = maps.partition_point(|m| m.0 < end);
    // The mapping before, and the one after: neither overlaps, neither grows into it.
    let before = i.checked_sub(1).map(|j| &maps[j]);
    if let Some((_, e, name)) = before {
        let room = if name == "[heap]" { GROWTH_ROOM } else { 0 };
        if e.saturating_add(room) > start {
            return None;
        }
    }
    if let Some((s, _, name)) = maps.get(i) {
        if name == "[stack]" && s.saturating_sub(GROWTH_ROOM) < end {
            return None;
        }
    }
    Some(PunSpot::Map { start, end })
}

/// Where a punned site's trampolines go: the first (where the jump lands)
/// and a copy for each first byte of [`NEXT_FIRST`] a probe on the next
/// function may write (where the jump lands then).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PunSpots {
    /// The jump as written (the owned bytes, then the next function's).
    pub(crate) bytes: Vec<u8>,
    /// (trampoline address, room), the one the jump lands at first.
    pub(crate) spots: Vec<(u64, PunSpot)>,
}

/// The first address in the window of `pun`'s one-fixed-byte encoding
/// where its trampoline and a copy for each of the next function's first
/// bytes `file_first` (the file's) and [`NEXT_FIRST`] other than the one
/// there now (`pun.code`'s) have room: addresses a pool's free end offers
/// first, then one every 64 KiB of the window. `None` when none does.
pub(crate) fn find_spots(
    pun: &PunPlan,
    file_first: u8,
    pools: &[(u64, u64)],
    maps: &[(u64, u64, String)],
) -> Option<PunSpots> {
    let w = pun.windows().into_iter().find(|w| w.fixed == 1)?;
    let next_first = *pun.code.get(pun.owned)?;
    let mut others: Vec<u8> = vec![file_first];
    others.extend(NEXT_FIRST);
    others.sort_unstable();
    others.dedup();
    others.retain(|&x| x != next_first);
    let from_pools = pools.iter().map(|&(n, _)| n.max(w.start));
    let stepped = (0..w.len).step_by(0x10000).map(|o| w.start.wrapping_add(o));
    for t in from_pools.chain(stepped) {
        let Some(bytes) = pun.patch_bytes(0, t) else {
            continue;
        };
        let Some(first) = spot_for(t, pools, maps) else {
            continue;
        };
        let mut spots = vec![(t, first)];
        for &x in &others {
            match pun
                .target_if_next_starts_with(&bytes, x)
                .and_then(|tx| Some((tx, spot_for(tx, pools, maps)?)))
            {
                Some(s) => spots.push(s),
                None => break,
            }
        }
        if spots.len() == 1 + others.len() {
            return Some(PunSpots { bytes, spots });
        }
    }
    None
}

/// Whether some trampoline address of `pun`'s one-fixed-byte window has
/// it and each copy (see the `pun` module: the addresses the jump lands at
/// with `int3`, `jmp` or `call` over the next function's first byte) in
/// user space, at the addresses planned (no load bias).
pub(crate) fn pun_in_user_space(pun: &PunPlan) -> bool {
    const LOW: i128 = 0x10000;
    const HIGH: i128 = 0x7fff_ffff_f000;
    let Some(w) = pun.windows().into_iter().find(|w| w.fixed == 1) else {
        return false;
    };
    let Some(&first) = pun.code.get(pun.owned) else {
        return false;
    };
    // The free offset `o` in 0..len: each copy is at its window's start + o.
    let (mut lo, mut hi) = (0i128, w.len as i128 - 64);
    for x in [first, 0xcc, 0xe9, 0xe8] {
        let delta = ((x as i8 as i128) - (first as i8 as i128)) << 24;
        // A window below 0 wrapped: as i64 it is negative again.
        let start = w.start as i64 as i128 + delta;
        lo = lo.max(LOW - start);
        hi = hi.min(HIGH - 64 - start);
    }
    lo <= hi
}

/// The mappings of `/proc/PID/maps` as (start, end, name), sorted.
fn read_maps(pid: i32) -> Vec<(u64, u64, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mut v: Vec<(u64, u64, String)> = hotprobe_process::parse_maps_lines(&text)
        .into_iter()
        .map(|l| (l.start, l.end, l.name))
        .collect();
    v.sort_by_key(|m| m.0);
    v
}

/// The load bias of the module at `path` in the process whose maps are
/// `text`: where the file's offset 0 is mapped, less its link address.
fn bias_in(text: &str, path: &Path, m: &ModuleInfo) -> Option<u64> {
    let first = m.first_segment_vaddr()?;
    let name = path.to_str()?;
    text.lines().find_map(|line| {
        let mut it = line.split_whitespace();
        let range = it.next()?;
        let _perms = it.next()?;
        let off = it.next()?;
        let (_dev, _inode) = (it.next()?, it.next()?);
        if it.next()? != name || u64::from_str_radix(off, 16).ok()? != 0 {
            return None;
        }
        let start = u64::from_str_radix(range.split_once('-')?.0, 16).ok()?;
        Some(start.wrapping_sub(first))
    })
}

impl FastPath {
    /// Whether a punned jump planned from the file for `f` (of the module
    /// at `path`) can go in now: the live bytes are the file's, and one
    /// window has room. `Err` says why not.
    pub(crate) fn pun_check(&mut self, path: &Path, f: &FunctionInfo) -> Result<(), String> {
        let pid = self.pid;
        let text = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        let pools: Vec<(u64, u64)> = self.pools.iter().map(|p| (p.next, p.end)).collect();
        let ours: Vec<u64> = self.installed.iter().map(|s| s.addr).collect();
        let m = self.module(path).map_err(|e| e.to_string())?;
        let bias = bias_in(&text, path, m).ok_or("its module is not mapped")?;
        let at = f.addr.wrapping_add(bias);
        if ours.iter().any(|&a| a >= at && a < at + 4) {
            return Err("bytes of this fast path are at its entry already".into());
        }
        let owned = m.plan_pun(f)?;
        let code = m
            .code(f.addr, owned as u64 + 4)
            .ok_or("the bytes after the function are not in the file")?;
        let pun = PunPlan::new(code, f.size as usize, owned, f.addr.wrapping_add(bias))
            .map_err(|e| e.to_string())?;
        match find_spots(&pun, code[owned], &pools, &read_maps(pid)) {
            Some(_) => Ok(()),
            None => Err(no_room(&pun)),
        }
    }

    /// Writes the trampolines of a punned jump at `f`'s entry (at run time
    /// `fstart`, owning `owned` bytes; `file` holds the file's bytes there,
    /// `owned + 4` of them, which memory must still hold): at each,
    /// `entry(tramp)`'s code (the call of the probe's entry, built for the
    /// trampoline's address) then the function relocated. Returns the
    /// bytes to write at the site (the owned ones) and the trampolines,
    /// the one the jump lands at first.
    pub(crate) fn place_pun(
        &mut self,
        t: &mut ProcessTarget,
        f: &FunctionInfo,
        fstart: u64,
        file: &[u8],
        mut entry: impl FnMut(&mut FastPath, &mut ProcessTarget, u64) -> Result<Vec<u8>, FastPathError>,
    ) -> Result<(Vec<u8>, Vec<u64>), FastPathError> {
        let owned = file.len().saturating_sub(4);
        let mut code = vec![0u8; file.len()];
        t.read_memory(RuntimeAddr(fstart), &mut code)?;
        let file_first = file[owned];
        let known = |b: u8| b == file_first || NEXT_FIRST.contains(&b);
        if code[..owned] != file[..owned] || !known(code[owned]) {
            return Err(FastPathError::Impossible {
                function: f.name.clone(),
                mechanism: "jump",
                why: format!(
                    "punned jump: in memory its bytes or the next function's first differ \
                     from the file's ({:02x?}, not {:02x?}: another writer's)",
                    code, file
                ),
            });
        }
        let pun = PunPlan::new(&code, f.size as usize, owned, fstart)?;
        let pools: Vec<(u64, u64)> = self.pools.iter().map(|p| (p.next, p.end)).collect();
        let found =
            find_spots(&pun, file_first, &pools, &read_maps(t.live_task())).ok_or_else(|| {
                FastPathError::NoTrampolineMemory {
                    addr: fstart,
                    why: no_room(&pun),
                }
            })?;
        let mut tramps = Vec::with_capacity(found.spots.len());
        for (tramp, spot) in found.spots {
            let index = match spot {
                PunSpot::Pool { index } => index,
                PunSpot::Map { start, end } => {
                    self.map_pool_at(t, start, end - start)?;
                    self.pools.len() - 1
                }
            };
            self.pools[index].next = (tramp + PUN_TRAMPOLINE + 63) & !63;
            let mut body = entry(self, t, tramp)?;
            let at = tramp + body.len() as u64;
            body.extend(pun.relocate(at)?);
            if body.len() as u64 > PUN_TRAMPOLINE {
                return Err(FastPathError::NoTrampolineMemory {
                    addr: fstart,
                    why: "trampoline longer than 64 bytes".into(),
                });
            }
            self.write(t, tramp, &body)?;
            tramps.push(tramp);
        }
        Ok((found.bytes[..owned].to_vec(), tramps))
    }

    /// Maps `size` bytes of executable memory at exactly `start` in the
    /// target (`MAP_FIXED_NOREPLACE`: never over a mapping), filled with
    /// `int3`, as a new pool.
    fn map_pool_at(
        &mut self,
        t: &mut ProcessTarget,
        start: u64,
        size: u64,
    ) -> Result<(), FastPathError> {
        self.page_cache = None;
        let r = hotprobe_process::remote_call::remote_syscall(
            t,
            libc::SYS_mmap as u64,
            &[
                start,
                size,
                (libc::PROT_READ | libc::PROT_EXEC) as u64,
                (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE) as u64,
                u64::MAX,
                0,
            ],
        )?;
        if r != start {
            return Err(FastPathError::NoTrampolineMemory {
                addr: start,
                why: format!("remote mmap at {start:#x} returned {r:#x}"),
            });
        }
        t.write_memory(RuntimeAddr(start), &vec![0xcc; size as usize])?;
        self.pools.push(Pool {
            start,
            next: start,
            end: start + size,
        });
        Ok(())
    }
}

/// Why no trampoline had room, naming the window.
fn no_room(pun: &PunPlan) -> String {
    let w = pun.windows().into_iter().find(|w| w.fixed == 1);
    format!(
        "no free user-space address for its trampoline in the 16 MiB its fixed \
         displacement byte allows ({}), with room for the copies where an int3, jmp or patch \
         on the next function would send it",
        w.map_or("none".into(), |w| format!(
            "{:#x}..{:#x}",
            w.start,
            w.start + w.len
        ))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn maps() -> Vec<(u64, u64, String)> {
        vec![
            (0x5555_0000_0000, 0x5555_0001_0000, "/bin/x".to_string()),
            (0x5555_0001_0000, 0x5555_0002_0000, "[heap]".to_string()),
            (0x7fff_f000_0000, 0x7fff_f100_0000, "[stack]".to_string()),
        ]
    }

    #[test]
    fn a_spot_is_free_pages_or_a_pools_free_end() {
        let m = maps();
        assert_eq!(
            spot_for(0x6000_0000_0fe0, &[], &m),
            Some(PunSpot::Map {
                start: 0x6000_0000_0000,
                end: 0x6000_0000_2000
            })
        );
        let pools = [(0x6000_0000_0800, 0x6000_0000_1000)];
        assert_eq!(
            spot_for(0x6000_0000_0900, &pools, &m),
            Some(PunSpot::Pool { index: 0 })
        );
        // Inside a mapping, above the heap, below the stack, out of user space.
        for t in [
            0x5555_0000_0100,
            0x5555_0002_0000,
            0x7fff_e000_0000,
            0x100,
            0xffff_8000_0000_0000,
        ] {
            assert_eq!(spot_for(t, &[], &m), None, "{t:#x}");
        }
    }

    #[test]
    fn at_a_non_pie_address_the_copies_fall_below_0() {
        let code = [0x8d, 0x47, 0x01, 0xc3, 0x48, 0x89, 0xe5, 0x90];
        let low = PunPlan::new(&code, 4, 4, 0x4e_0000).unwrap();
        assert!(!pun_in_user_space(&low));
        let pie = PunPlan::new(&code, 4, 4, 0x5555_0000_1000).unwrap();
        assert!(pun_in_user_space(&pie));
        // At the top of user space: the first window above it.
        let top = PunPlan::new(&code, 4, 4, 0x7fff_f000_0000).unwrap();
        assert!(!pun_in_user_space(&top));
    }

    #[test]
    fn the_trampoline_and_its_copies_all_have_room() {
        // lea eax, [rdi+1]; ret; then `push rbp` (0x55) at the next function.
        let code = [0x8d, 0x47, 0x01, 0xc3, 0x55, 0x48, 0x89, 0xe5];
        let site = 0x5555_0000_1000u64;
        let pun = PunPlan::new(&code, 4, 4, site).unwrap();
        let s = find_spots(&pun, 0x55, &[], &maps()).unwrap();
        assert_eq!(s.spots.len(), 4);
        let t = s.spots[0].0;
        assert_eq!(t, site + 5 + 0x5500_0000);
        // Each copy where the jump lands with 0xcc, 0xe9, 0xe8 there.
        for (i, x) in [0xcc, 0xe8, 0xe9].into_iter().enumerate() {
            let mut b = s.bytes.clone();
            b[4] = x;
            let rel = i32::from_le_bytes(b[1..5].try_into().unwrap()) as i64;
            assert_eq!(s.spots[i + 1].0, (site as i64 + 5 + rel) as u64);
        }
        // A mapping over the int3 copy's window: the next 64 KiB step.
        let tcc = s.spots[1].0;
        let mut m = maps();
        m.push((tcc & !0xfff, (tcc & !0xfff) + 0x10000, String::new()));
        m.sort_by_key(|m| m.0);
        let s2 = find_spots(&pun, 0x55, &[], &m).unwrap();
        assert_eq!(s2.spots[0].0, t + 0x10000);
        // Nothing free anywhere: none.
        let all = vec![(MIN_ADDR, USER_TOP, String::new())];
        assert!(find_spots(&pun, 0x55, &[], &all).is_none());
        // The next function under an int3 now: a copy for its own 0x55.
        let mut under = code;
        under[4] = 0xcc;
        let pun = PunPlan::new(&under, 4, 4, site).unwrap();
        let s3 = find_spots(&pun, 0x55, &[], &maps()).unwrap();
        assert_eq!(s3.spots.len(), 4);
        assert!(s3.spots.iter().any(|&(a, _)| a == t), "{s3:x?}");
    }
}
