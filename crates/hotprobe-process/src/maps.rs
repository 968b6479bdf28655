//! Just enough of /proc/PID/maps for placing scratch pages (the full parser
//! with module paths lives in hotprobe-symbols).

/// One line of /proc/PID/maps: range, exec flag and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MapLine {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Mapped executable.
    pub exec: bool,
    /// Path or pseudo-name (`[heap]`, `[stack]`, `[vdso]`), empty if anonymous.
    pub name: String,
}

/// Parse /proc/PID/maps text; malformed lines are skipped.
pub fn parse_maps_lines(text: &str) -> Vec<MapLine> {
    text.lines()
        .filter_map(|line| {
            let mut it = line.splitn(6, ' ');
            let range = it.next()?;
            let perms = it.next()?;
            let (s, e) = range.split_once('-')?;
            let start = u64::from_str_radix(s, 16).ok()?;
            let end = u64::from_str_radix(e, 16).ok()?;
            let _off = it.next()?;
            let _dev = it.next()?;
            let _inode = it.next()?;
            let name = it.next().unwrap_or("").trim_start().to_string();
            Some(MapLine {
                start,
                end,
                exec: perms.as_bytes().get(2) == Some(&b'x'),
                name,
            })
        })
        .collect()
}

/// Lowest address user mappings may use here (vm.mmap_min_addr).
const MIN_ADDR: u64 = 0x10000;
/// How far scratch pages may be from the code they serve: well inside the
/// ±2 GiB reach of rel32 branches and RIP-relative operands.
const REACH: u64 = 1 << 30;
/// Room left free above the heap so brk can keep growing.
const HEAP_ROOM: u64 = 256 << 20;
/// Top of the user address space on x86-64 (47-bit).
const USER_TOP: u64 = 0x7fff_ffff_f000;

/// A page-aligned address for `len` bytes in a free gap of `lines`, as close
/// to `near` as possible and within ±1 GiB of it, not right above the heap
/// (brk grows there) nor just below the stack.
pub fn find_free_gap(lines: &[MapLine], near: u64, len: u64) -> Option<u64> {
    let mut sorted: Vec<&MapLine> = lines.iter().collect();
    sorted.sort_by_key(|l| l.start);
    let mut best: Option<(u64, u64)> = None; // (distance, addr)
    let mut prev_end = MIN_ADDR;
    let mut prev_name = String::new();
    for i in 0..=sorted.len() {
        let (gap_end, next_name) = match sorted.get(i) {
            Some(l) => (l.start, l.name.as_str()),
            None => (USER_TOP, ""),
        };
        let mut lo = prev_end;
        if prev_name == "[heap]" {
            lo = lo.saturating_add(HEAP_ROOM);
        }
        // Leave a guard page on both sides.
        lo = lo.saturating_add(0x1000);
        let hi = gap_end.saturating_sub(0x1000);
        if next_name != "[stack]" && hi > lo && hi - lo >= len {
            let cand = near.clamp(lo, hi - len) & !0xfff;
            let cand = if cand < lo { cand + 0x1000 } else { cand };
            if cand >= lo && cand + len <= hi {
                let dist = if cand >= near {
                    cand + len - near
                } else {
                    near - cand
                };
                if dist < REACH && best.is_none_or(|(d, _)| dist < d) {
                    best = Some((dist, cand));
                }
            }
        }
        if let Some(l) = sorted.get(i) {
            prev_end = prev_end.max(l.end);
            prev_name = l.name.clone();
        }
    }
    best.map(|(_, a)| a)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
555555554000-555555555000 r--p 00000000 fe:01 123 /tmp/prog
555555555000-555555556000 r-xp 00001000 fe:01 123 /tmp/prog
555555559000-55555557a000 rw-p 00000000 00:00 0 [heap]
7ffff7d80000-7ffff7da8000 r--p 00000000 fe:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffff7da8000-7ffff7f3d000 r-xp 00028000 fe:01 99 /usr/lib/x86_64-linux-gnu/libc.so.6
7ffff7fc5000-7ffff7fc7000 r-xp 00000000 00:00 0 [vdso]
7ffffffde000-7ffffffff000 rw-p 00000000 00:00 0 [stack]
";

    #[test]
    fn parses_lines() {
        let l = parse_maps_lines(MAPS);
        assert_eq!(l.len(), 7);
        assert!(l[1].exec);
        assert_eq!(l[2].name, "[heap]");
        assert_eq!(l[0].name, "/tmp/prog");
    }

    #[test]
    fn gap_below_pie_executable() {
        let l = parse_maps_lines(MAPS);
        let a = find_free_gap(&l, 0x555555555000, 0x10000).unwrap();
        assert!(a + 0x10000 <= 0x555555554000 - 0x1000, "{a:#x}");
        assert!(0x555555555000 - a < REACH);
        assert_eq!(a & 0xfff, 0);
    }

    #[test]
    fn gap_near_libc_not_over_heap() {
        let l = parse_maps_lines(MAPS);
        let a = find_free_gap(&l, 0x7ffff7da8000, 0x10000).unwrap();
        assert!(a + 0x10000 <= 0x7ffff7d80000);
        assert!(0x7ffff7da8000 - a < REACH);
        // Nothing overlaps an existing mapping.
        for m in &l {
            assert!(a + 0x10000 <= m.start || a >= m.end);
        }
    }

    #[test]
    fn no_gap_in_reach() {
        let l = vec![MapLine {
            start: MIN_ADDR,
            end: USER_TOP,
            exec: true,
            name: String::new(),
        }];
        assert_eq!(find_free_gap(&l, 0x400000, 0x1000), None);
    }
}
