//! The kernel's own symbol tables (`CONFIG_KALLSYMS`, written by
//! `scripts/kallsyms.c`), found in a vmlinux without its ELF headers' help.
//!
//! Layout (each table 8-aligned on 64-bit kernels):
//!
//! ```text
//! up to 6.1/6.3:  offsets[N] (or addresses[N]), relative_base, num_syms,
//!                 names, markers, token_table, token_index
//! 6.4 and later:  num_syms, names, markers, token_table, token_index,
//!                 offsets[N], relative_base
//! ```
//!
//! - `token_table`: 256 NUL-terminated strings; a character used in symbol
//!   names is its own token, so tokens `0x30..=0x39` are `"0"`..`"9"`;
//! - `token_index`: 256 `u16` offsets of the tokens in the table;
//! - `names`: per symbol a length (one byte, or two, ULEB128, when ≥ 0x80:
//!   6.1+) and that many token numbers; the expansion is the type letter
//!   followed by the name;
//! - `markers`: the offset in `names` of every 256th symbol;
//! - `offsets` + `relative_base` (`CONFIG_KALLSYMS_BASE_RELATIVE`): with
//!   `CONFIG_KALLSYMS_ABSOLUTE_PERCPU` (x86-64 SMP) a non-negative offset
//!   is an absolute value and a negative one is `relative_base - 1 - off`;
//!   without it, `relative_base + (u32)off`. Older kernels store absolute
//!   `addresses` instead.
//!
//! The search follows vmlinux-to-elf: find the token table by the digits,
//! check it against the token index that follows, walk back to the markers,
//! find `num_syms`/`names` consistent with the markers, then the addresses.
//! Little-endian 64-bit kernels (x86-64) are what is supported.

use memchr::memmem;

use crate::{Error, KernelSymbol};

/// The digit tokens `"0"`..`"9"`, consecutive in every token table.
const DIGITS: &[u8] = b"0\x001\x002\x003\x004\x005\x006\x007\x008\x009\x00";

/// Longest token accepted (tokens are at most a symbol name long).
const MAX_TOKEN: usize = 512;

/// Longest compressed name entry expected: a 2-byte length and at most
/// `KSYM_NAME_LEN` (512 since 6.1) tokens. Bounds the search for the names.
const MAX_ENTRY: usize = 2 + 512;

/// Most markers accepted (16 M symbols).
const MAX_MARKERS: usize = 1 << 16;

/// How addresses are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AddressEncoding {
    /// `kallsyms_addresses`: one absolute 64-bit address per symbol.
    Absolute,
    /// `kallsyms_offsets`: `relative_base + (u32)offset`.
    Relative,
    /// `kallsyms_offsets` with absolute per-CPU symbols: a non-negative
    /// offset is absolute, a negative one is `relative_base - 1 - offset`.
    RelativeAbsolutePercpu,
}

/// Where the tables were found (offsets into the searched bytes).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// `kallsyms_token_table`.
    pub token_table: usize,
    /// `kallsyms_token_index`.
    pub token_index: usize,
    /// `kallsyms_markers`.
    pub markers: usize,
    /// `kallsyms_names`.
    pub names: usize,
    /// `kallsyms_num_syms`.
    pub num_syms: usize,
    /// `kallsyms_offsets` or `kallsyms_addresses`.
    pub addresses: usize,
    /// `kallsyms_relative_base` (position, value), if base-relative.
    pub relative_base: Option<(usize, u64)>,
    /// How addresses are stored.
    pub encoding: AddressEncoding,
    /// Whether name lengths ≥ 0x80 take two bytes (6.1+; equal to the old
    /// encoding when no compressed name is that long).
    pub big_lengths: bool,
}

/// A decoded kallsyms table.
#[derive(Clone, Debug)]
pub struct Kallsyms {
    /// The symbols, in table order (sorted by address).
    pub symbols: Vec<KernelSymbol>,
    /// Where the tables are.
    pub layout: Layout,
}

fn u16_at(d: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        d.get(at..at.checked_add(2)?)?.try_into().ok()?,
    ))
}

fn u32_at(d: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        d.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn u64_at(d: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        d.get(at..at.checked_add(8)?)?.try_into().ok()?,
    ))
}

fn zeros(d: &[u8], from: usize, to: usize) -> bool {
    from <= to && d.get(from..to).is_some_and(|s| s.iter().all(|&b| b == 0))
}

/// The end of the NUL-terminated string at `at` (past its NUL). Tokens
/// are empty only in tables too small to fill all 256.
fn string_end(d: &[u8], at: usize) -> Option<usize> {
    let rest = d.get(at..)?;
    let rest = rest.get(..rest.len().min(MAX_TOKEN + 1))?;
    Some(at + memchr::memchr(0, rest)? + 1)
}

/// A token table checked against its token index.
struct TokenTable {
    start: usize,
    index: usize,
    /// The 256 tokens, as ranges of the data.
    tokens: Vec<(usize, usize)>,
}

/// Token tables: at each occurrence of the digit tokens, walk to the end
/// of the table, read the index after it (past alignment padding), and
/// keep the table if the index describes it exactly.
fn token_tables(d: &[u8]) -> Vec<TokenTable> {
    let mut found = Vec::new();
    'cand: for zero in memmem::find_iter(d, DIGITS) {
        let mut p = zero;
        for _ in 0x30..0x100 {
            match string_end(d, p) {
                Some(e) => p = e,
                None => continue 'cand,
            }
        }
        let end = p;
        for pad in 0..8 {
            if !zeros(d, end, end + pad) {
                break;
            }
            let index = end + pad;
            let Some(idx) = (0..256)
                .map(|i| u16_at(d, index + 2 * i).map(usize::from))
                .collect::<Option<Vec<usize>>>()
            else {
                break;
            };
            if idx[0] != 0 || idx[0x30] > zero {
                continue;
            }
            let start = zero - idx[0x30];
            let mut tokens = Vec::with_capacity(256);
            let mut p = start;
            for &off in &idx {
                let Some(e) = string_end(d, p).filter(|_| off == p - start) else {
                    break;
                };
                tokens.push((p, e - 1));
                p = e;
            }
            if tokens.len() == 256 && p == end {
                found.push(TokenTable {
                    start,
                    index,
                    tokens,
                });
                break;
            }
        }
    }
    found
}

/// Most symbols accepted when looking past `kallsyms_seqs_of_names`.
const MAX_SEQS: usize = 1 << 22;

/// A candidate `kallsyms_markers`.
struct Markers {
    start: usize,
    vals: Vec<u64>,
    /// The symbol count implied by a `kallsyms_seqs_of_names` (3 bytes per
    /// symbol) between the markers and the token table, if there is one.
    count: Option<usize>,
}

/// A marker table ending at `end`: `width`-byte values read backwards,
/// strictly decreasing by plausible steps down to 0 (`markers[0]`).
fn markers_ending_at(d: &[u8], end: usize, width: usize) -> Option<(usize, Vec<u64>)> {
    let read = |at: usize| {
        if width == 4 {
            u32_at(d, at).map(u64::from)
        } else {
            u64_at(d, at)
        }
    };
    // Walk back without allocating (most positions fail at once).
    let mut q = end;
    let mut next: Option<u64> = None;
    let mut k = 0usize;
    loop {
        let at = q.checked_sub(width)?;
        let v = read(at)?;
        if let Some(next) = next {
            let step = next.checked_sub(v)?;
            if !(512..=256 * MAX_ENTRY as u64).contains(&step) {
                return None;
            }
        }
        q = at;
        k += 1;
        if v == 0 {
            break;
        }
        if k > MAX_MARKERS {
            return None;
        }
        next = Some(v);
    }
    let vals = (0..k)
        .map(|i| read(q + i * width))
        .collect::<Option<Vec<u64>>>()?;
    Some((q, vals))
}

/// Offers `visit` the marker tables before the token table at
/// `table_start`, nearest first, until it returns `true`: right before the
/// table (after at most 7 bytes of zero padding; `u32` values, or `u64` in
/// old kernels), then before a `kallsyms_seqs_of_names` (3 bytes per
/// symbol: 6.2, 6.3, and 6.1 stable kernels with its backport such as
/// Debian 12's; moved after the offsets in 6.4). Tables are 8-aligned, so
/// candidates starting elsewhere (a lone marker 0 next to 4 bytes of
/// padding reads the same either way round) are offered only after all
/// aligned ones.
fn visit_marker_tables(d: &[u8], table_start: usize, mut visit: impl FnMut(Markers) -> bool) {
    for aligned in [true, false] {
        let fits = |start: usize| start.is_multiple_of(8) == aligned;
        for width in [4usize, 8] {
            for pad in 0..8 {
                let Some(end) = table_start.checked_sub(pad) else {
                    break;
                };
                if !zeros(d, end, table_start) {
                    break;
                }
                if let Some((start, vals)) = markers_ending_at(d, end, width) {
                    if fits(start)
                        && visit(Markers {
                            start,
                            vals,
                            count: None,
                        })
                    {
                        return;
                    }
                }
            }
        }
        let lo = table_start.saturating_sub(3 * MAX_SEQS + 16);
        let mut end = table_start & !3;
        while end > lo {
            end -= 4;
            let Some((start, vals)) = markers_ending_at(d, end, 4) else {
                continue;
            };
            if !fits(start) {
                continue;
            }
            let k = vals.len();
            let range = 256 * (k - 1) + 1..=256 * k;
            for seqs in [end, end.div_ceil(8) * 8] {
                if !zeros(d, end, seqs) {
                    continue;
                }
                let gap = table_start - seqs;
                for pad in 0..8 {
                    let Some(bytes) = gap.checked_sub(pad).filter(|b| b % 3 == 0) else {
                        continue;
                    };
                    if range.contains(&(bytes / 3))
                        && zeros(d, table_start - pad, table_start)
                        && visit(Markers {
                            start,
                            vals: vals.clone(),
                            count: Some(bytes / 3),
                        })
                    {
                        return;
                    }
                }
            }
        }
    }
}

/// A names table consistent with the markers.
struct Names {
    start: usize,
    num_syms: usize,
    count: usize,
    big_lengths: bool,
    /// Each entry's token numbers, as ranges of the data.
    entries: Vec<(usize, usize)>,
}

/// Walks `count` entries from `start`, checking every 256th against the
/// markers; the table must end at `markers_start` (after zero padding).
fn walk_names(
    d: &[u8],
    start: usize,
    count: usize,
    markers: &[u64],
    markers_start: usize,
    big: bool,
) -> Option<Vec<(usize, usize)>> {
    let mut entries = Vec::with_capacity(count);
    let mut p = start;
    for i in 0..count {
        if i % 256 == 0 && markers.get(i / 256).copied() != Some((p - start) as u64) {
            return None;
        }
        let b0 = *d.get(p)?;
        let (len, hdr) = if big && b0 & 0x80 != 0 {
            let b1 = *d.get(p + 1)?;
            (usize::from(b0 & 0x7f) | usize::from(b1) << 7, 2)
        } else {
            (usize::from(b0), 1)
        };
        if len == 0 {
            return None;
        }
        let s = p + hdr;
        p = s + len;
        if p > markers_start {
            return None;
        }
        entries.push((s, p));
    }
    (markers_start - p < 8 && zeros(d, p, markers_start)).then_some(entries)
}

/// `kallsyms_num_syms` and `kallsyms_names` before the markers: the count
/// (a `u32`, 4 or 8 bytes before the names) must be in the markers' range
/// and the names must match every marker and end at the markers.
fn names_table(
    d: &[u8],
    markers_start: usize,
    markers: &[u64],
    count: Option<usize>,
) -> Option<Names> {
    let k = markers.len();
    let last = usize::try_from(*markers.last()?).ok()?;
    let (lo_n, hi_n) = (256 * (k - 1) + 1, 256 * k);
    let hi = markers_start.checked_sub(last)?;
    let lo = hi.saturating_sub(256 * MAX_ENTRY + 8);
    for start in (lo..=hi).rev() {
        for gap in [8usize, 4] {
            let Some(at) = start.checked_sub(gap) else {
                continue;
            };
            let Some(n) = u32_at(d, at).map(|n| n as usize) else {
                continue;
            };
            if !(lo_n..=hi_n).contains(&n)
                || count.is_some_and(|c| c != n)
                || !zeros(d, at + 4, start)
            {
                continue;
            }
            for big in [true, false] {
                if let Some(entries) = walk_names(d, start, n, markers, markers_start, big) {
                    return Some(Names {
                        start,
                        num_syms: at,
                        count: n,
                        big_lengths: big,
                        entries,
                    });
                }
            }
        }
    }
    None
}

/// The decoded addresses and where they were.
struct Addresses {
    addrs: Vec<u64>,
    at: usize,
    relative_base: Option<(usize, u64)>,
    encoding: AddressEncoding,
}

/// Whether decoded addresses look like a symbol table's: sorted, and
/// mostly distinct (kernels alias some addresses, ~10 % of Debian's; a
/// table read from filler bytes gives one value many times).
fn plausible(addrs: &[u64]) -> bool {
    let sorted = addrs.windows(2).all(|w| w[0] <= w[1]);
    let distinct = 1 + addrs.windows(2).filter(|w| w[0] != w[1]).count();
    sorted && distinct * 2 > addrs.len()
}

/// The addresses of `count` symbols: from `kallsyms_offsets` with
/// `kallsyms_relative_base` before `num_syms` (≤ 6.3) or after the token
/// index (6.4+), else from absolute `kallsyms_addresses`. The first
/// candidate giving sorted addresses wins.
fn addresses(d: &[u8], num_syms: usize, index_end: usize, count: usize) -> Option<Addresses> {
    let bytes = count.checked_mul(4)?;
    let mut candidates: Vec<(usize, usize)> = Vec::new(); // (offsets, relative_base)
    if let Some(rb) = num_syms.checked_sub(8) {
        for pad in [0usize, 4] {
            if let Some(o) = rb.checked_sub(bytes + pad) {
                if zeros(d, o + bytes, rb) {
                    candidates.push((o, rb));
                }
            }
        }
    }
    for o in [index_end, index_end.div_ceil(8) * 8] {
        if !zeros(d, index_end, o) {
            continue;
        }
        let Some(e) = o.checked_add(bytes) else {
            continue;
        };
        for rb in [e, e.div_ceil(8) * 8] {
            if zeros(d, e, rb) && !candidates.contains(&(o, rb)) {
                candidates.push((o, rb));
            }
        }
    }
    for (o, rb) in candidates {
        let Some(base) = u64_at(d, rb).filter(|&b| b != 0) else {
            continue;
        };
        let Some(raw) = (0..count)
            .map(|i| u32_at(d, o + 4 * i))
            .collect::<Option<Vec<u32>>>()
        else {
            continue;
        };
        let percpu = raw.iter().any(|&v| (v as i32) < 0);
        let addrs: Vec<u64> = raw
            .iter()
            .map(|&v| {
                if !percpu {
                    base.wrapping_add(u64::from(v))
                } else if (v as i32) >= 0 {
                    u64::from(v)
                } else {
                    base.wrapping_sub(1)
                        .wrapping_sub(i64::from(v as i32) as u64)
                }
            })
            .collect();
        if plausible(&addrs) {
            let enc = if percpu {
                AddressEncoding::RelativeAbsolutePercpu
            } else {
                AddressEncoding::Relative
            };
            return Some(Addresses {
                addrs,
                at: o,
                relative_base: Some((rb, base)),
                encoding: enc,
            });
        }
    }
    // Absolute addresses, right before num_syms.
    let a = num_syms.checked_sub(count.checked_mul(8)?)?;
    let addrs = (0..count)
        .map(|i| u64_at(d, a + 8 * i))
        .collect::<Option<Vec<u64>>>()?;
    plausible(&addrs).then_some(Addresses {
        addrs,
        at: a,
        relative_base: None,
        encoding: AddressEncoding::Absolute,
    })
}

impl Kallsyms {
    /// Finds and decodes the kallsyms tables in `data` (a vmlinux: ELF or
    /// raw).
    pub fn find(data: &[u8]) -> Result<Kallsyms, Error> {
        let tables = token_tables(data);
        if tables.is_empty() {
            return Err(Error::KallsymsNotFound {
                what: "kallsyms_token_table",
                detail: "no table of 256 strings with tokens \"0\"..\"9\" at 0x30..0x39 \
                         matching a kallsyms_token_index after it"
                    .into(),
            });
        }
        // The most advanced failure is the one reported.
        let mut deepest = (
            0,
            Error::KallsymsNotFound {
                what: "kallsyms_markers",
                detail: format!(
                    "no increasing table from 0 before the token table at {:#x}",
                    tables[0].start
                ),
            },
        );
        for t in &tables {
            let mut found = None;
            visit_marker_tables(data, t.start, |m| {
                let Some(names) = names_table(data, m.start, &m.vals, m.count) else {
                    if deepest.0 < 1 {
                        deepest = (
                            1,
                            Error::KallsymsNotFound {
                                what: "kallsyms_num_syms/kallsyms_names",
                                detail: format!(
                                    "no names table matching the {} markers at {:#x}",
                                    m.vals.len(),
                                    m.start
                                ),
                            },
                        );
                    }
                    return false;
                };
                let Some(a) = addresses(data, names.num_syms, t.index + 512, names.count) else {
                    deepest = (
                        2,
                        Error::KallsymsNotFound {
                            what: "kallsyms_offsets/kallsyms_addresses",
                            detail: format!(
                                "no sorted offsets+relative_base or addresses for {} symbols \
                                 (num_syms at {:#x})",
                                names.count, names.num_syms
                            ),
                        },
                    );
                    return false;
                };
                found = Some((m.start, names, a));
                true
            });
            if let Some((markers, names, a)) = found {
                return Ok(Kallsyms {
                    symbols: decode(data, t, &names.entries, &a.addrs),
                    layout: Layout {
                        token_table: t.start,
                        token_index: t.index,
                        markers,
                        names: names.start,
                        num_syms: names.num_syms,
                        addresses: a.at,
                        relative_base: a.relative_base,
                        encoding: a.encoding,
                        big_lengths: names.big_lengths,
                    },
                });
            }
        }
        Err(deepest.1)
    }
}

fn decode(
    d: &[u8],
    t: &TokenTable,
    entries: &[(usize, usize)],
    addrs: &[u64],
) -> Vec<KernelSymbol> {
    let mut out = Vec::with_capacity(entries.len());
    let mut buf = Vec::with_capacity(128);
    for (&(s, e), &addr) in entries.iter().zip(addrs) {
        buf.clear();
        for &tok in d.get(s..e).unwrap_or(&[]) {
            let (ts, te) = t.tokens[usize::from(tok)];
            buf.extend_from_slice(d.get(ts..te).unwrap_or(&[]));
        }
        let (kind, name) = match buf.split_first() {
            Some((&k, rest)) => (char::from(k), String::from_utf8_lossy(rest).into_owned()),
            None => ('?', String::new()),
        };
        out.push(KernelSymbol { addr, kind, name });
    }
    out
}
