//! Test helpers: synthetic kallsyms tables laid out as `scripts/kallsyms.c`
//! writes them, and a minimal bzImage around a payload.

#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

use hotprobe_kimage::KernelSymbol;

/// Which kernel generation's table order to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Gen {
    /// offsets, relative_base, num_syms, names, markers, token_table,
    /// token_index (4.6 … 6.1).
    V61,
    /// As V61 with kallsyms_seqs_of_names between markers and token_table
    /// (6.2, 6.3, Debian's 6.1).
    V62,
    /// num_syms, names, markers, token_table, token_index, offsets,
    /// relative_base, seqs_of_names (6.4+).
    V64,
    /// addresses (absolute, 8 bytes), num_syms, names, markers,
    /// token_table, token_index (no CONFIG_KALLSYMS_BASE_RELATIVE).
    Absolute,
}

/// Where the builder put each table.
#[derive(Debug, Default)]
pub struct Built {
    pub data: Vec<u8>,
    pub token_table: usize,
    pub token_index: usize,
    pub markers: usize,
    pub names: usize,
    pub num_syms: usize,
    pub addresses: usize,
}

/// A deterministic xorshift generator.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const WORDS: &[&str] = &[
    "sys", "do", "open", "at", "read", "write", "get", "ppid", "irq", "sched", "task", "mm",
    "page", "fault", "lock", "unlock", "init", "exit", "x64", "net", "sock", "bpf", "cpu",
];

/// `n` symbols sorted by address: a few absolute per-CPU ones (`A`, small
/// addresses) first if `percpu`, then text and data in kernel space; one
/// name longer than 127 compressed bytes.
pub fn symbols(n: usize, percpu: bool, seed: u64) -> Vec<KernelSymbol> {
    let mut r = Rng(seed | 1);
    let mut v = Vec::new();
    if percpu {
        for i in 0..5u64 {
            v.push(KernelSymbol {
                addr: i * 0x1000,
                kind: 'A',
                name: format!("percpu_var{i}"),
            });
        }
    }
    let mut addr = 0xffff_ffff_8100_0000u64;
    let kinds = ['T', 't', 't', 'T', 'W', 'd', 'r', 'b', 'D'];
    while v.len() < n {
        let i = v.len();
        let mut name = String::new();
        for k in 0..1 + r.below(3) {
            if k > 0 {
                name.push('_');
            }
            name.push_str(WORDS[r.below(WORDS.len() as u64) as usize]);
        }
        name.push_str(&format!("_{i}"));
        if i == n / 2 {
            // Random characters do not compress: a length of two bytes.
            name = (0..200)
                .map(|_| (b'A' + r.below(26) as u8) as char)
                .collect::<String>()
                + "_long";
        }
        v.push(KernelSymbol {
            addr,
            kind: kinds[r.below(kinds.len() as u64) as usize],
            name,
        });
        // Some symbols share an address.
        addr += if r.below(8) == 0 {
            0
        } else {
            0x10 * r.below(64)
        };
    }
    v
}

fn align(v: &mut Vec<u8>, a: usize) {
    while !v.len().is_multiple_of(a) {
        v.push(0);
    }
}

/// The token table (256 strings) and each symbol's token numbers.
fn compress(syms: &[KernelSymbol]) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let full: Vec<Vec<u8>> = syms
        .iter()
        .map(|s| {
            let mut b = vec![s.kind as u8];
            b.extend_from_slice(s.name.as_bytes());
            b
        })
        .collect();
    let mut tokens: Vec<Vec<u8>> = vec![Vec::new(); 256];
    for f in &full {
        for &c in f {
            tokens[c as usize] = vec![c];
        }
    }
    // Fill the free slots with the most frequent substrings of 2..4 bytes.
    let mut freq: HashMap<&[u8], usize> = HashMap::new();
    for f in &full {
        for l in 2..=4 {
            for w in f.windows(l) {
                *freq.entry(w).or_default() += 1;
            }
        }
    }
    let mut best: Vec<(&[u8], usize)> = freq.into_iter().collect();
    best.sort_by(|a, b| (b.1 * b.0.len()).cmp(&(a.1 * a.0.len())).then(a.0.cmp(b.0)));
    let mut best = best.into_iter();
    for t in tokens.iter_mut() {
        if t.is_empty() {
            if let Some((s, _)) = best.next() {
                *t = s.to_vec();
            }
        }
    }
    let mut by_bytes: HashMap<&[u8], u8> = HashMap::new();
    for (i, t) in tokens.iter().enumerate() {
        if !t.is_empty() {
            by_bytes.entry(t.as_slice()).or_insert(i as u8);
        }
    }
    let encoded = full
        .iter()
        .map(|f| {
            let mut out = Vec::new();
            let mut p = 0;
            while p < f.len() {
                let (len, tok) = (1..=4.min(f.len() - p))
                    .rev()
                    .find_map(|l| by_bytes.get(&f[p..p + l]).map(|&t| (l, t)))
                    .unwrap();
                out.push(tok);
                p += len;
            }
            out
        })
        .collect();
    (tokens, encoded)
}

/// Writes the kallsyms tables of `syms` (sorted by address) after `prefix`
/// bytes of filler, the way `gen` kernels lay them out.
pub fn build(syms: &[KernelSymbol], gen: Gen, prefix: usize) -> Built {
    let n = syms.len();
    let (tokens, encoded) = compress(syms);
    let mut d = vec![0xccu8; prefix];
    align(&mut d, 8);
    let mut b = Built::default();

    let percpu = syms.iter().any(|s| s.kind == 'A');
    let base = syms.iter().find(|s| s.kind != 'A').map_or(0, |s| s.addr);
    let offsets = |d: &mut Vec<u8>| {
        for s in syms {
            let off: i32 = match (percpu, s.kind == 'A') {
                // Absolute per-CPU symbols: the value itself.
                (true, true) => s.addr as i32,
                // Else relative_base - 1 - off == addr.
                (true, false) => -((s.addr - base) as i64) as i32 - 1,
                (false, _) => (s.addr - base) as u32 as i32,
            };
            d.extend_from_slice(&off.to_le_bytes());
        }
    };
    let seqs = |d: &mut Vec<u8>| {
        let mut idx: Vec<usize> = (0..n).collect();
        idx.sort_by(|&a, &c| syms[a].name.cmp(&syms[c].name));
        for i in idx {
            d.extend_from_slice(&(i as u32).to_be_bytes()[1..]);
        }
    };
    let names_markers = |d: &mut Vec<u8>, b: &mut Built| {
        b.num_syms = d.len();
        d.extend_from_slice(&(n as u32).to_le_bytes());
        align(d, 8);
        b.names = d.len();
        let mut markers = Vec::new();
        for (i, e) in encoded.iter().enumerate() {
            if i % 256 == 0 {
                markers.push((d.len() - b.names) as u32);
            }
            if e.len() >= 0x80 {
                d.push((e.len() & 0x7f) as u8 | 0x80);
                d.push((e.len() >> 7) as u8);
            } else {
                d.push(e.len() as u8);
            }
            d.extend_from_slice(e);
        }
        align(d, 8);
        b.markers = d.len();
        for m in markers {
            d.extend_from_slice(&m.to_le_bytes());
        }
        align(d, 8);
    };
    let token_tables = |d: &mut Vec<u8>, b: &mut Built| {
        b.token_table = d.len();
        let mut index = Vec::new();
        for t in &tokens {
            index.push((d.len() - b.token_table) as u16);
            d.extend_from_slice(t);
            d.push(0);
        }
        align(d, 8);
        b.token_index = d.len();
        for i in index {
            d.extend_from_slice(&i.to_le_bytes());
        }
        align(d, 8);
    };
    match gen {
        Gen::V61 | Gen::V62 => {
            b.addresses = d.len();
            offsets(&mut d);
            align(&mut d, 8);
            d.extend_from_slice(&base.to_le_bytes());
            names_markers(&mut d, &mut b);
            if gen == Gen::V62 {
                seqs(&mut d);
                align(&mut d, 8);
            }
            token_tables(&mut d, &mut b);
        }
        Gen::V64 => {
            names_markers(&mut d, &mut b);
            token_tables(&mut d, &mut b);
            b.addresses = d.len();
            offsets(&mut d);
            align(&mut d, 8);
            d.extend_from_slice(&base.to_le_bytes());
            seqs(&mut d);
            align(&mut d, 8);
        }
        Gen::Absolute => {
            b.addresses = d.len();
            for s in syms {
                d.extend_from_slice(&s.addr.to_le_bytes());
            }
            names_markers(&mut d, &mut b);
            token_tables(&mut d, &mut b);
        }
    }
    d.extend(std::iter::repeat_n(0xcc, 4096));
    b.data = d;
    b
}

/// A bzImage (boot protocol 2.15, 2 setup sectors) carrying `payload`.
pub fn bzimage(payload: &[u8]) -> Vec<u8> {
    let setup_sects = 2u8;
    let mut v = vec![0u8; (usize::from(setup_sects) + 1) * 512];
    v[0x1f1] = setup_sects;
    v[0x1fe] = 0x55;
    v[0x1ff] = 0xaa;
    v[0x202..0x206].copy_from_slice(b"HdrS");
    v[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
    let payload_offset = 0x100u32;
    v[0x248..0x24c].copy_from_slice(&payload_offset.to_le_bytes());
    v[0x24c..0x250].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    v.resize(v.len() + payload_offset as usize, 0x90);
    v.extend_from_slice(payload);
    v.extend_from_slice(&[0u8; 64]);
    v
}

/// The Debian kernel the guest tests boot (`.cache/kernel/vmlinuz`);
/// `None` only with `HOTPROBE_SKIP_GUEST=1`.
pub fn debian_kernel() -> Option<Vec<u8>> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/kernel/vmlinuz");
    match std::fs::read(&p) {
        Ok(b) => Some(b),
        // Skipped only when asked: a missing kernel fails the test.
        Err(_) if std::env::var_os("HOTPROBE_SKIP_GUEST").is_some_and(|v| v == "1") => None,
        Err(e) => panic!(
            "{}: {e} (./scripts/setup.sh puts it there; set HOTPROBE_SKIP_GUEST=1 to skip)",
            p.display()
        ),
    }
}

/// The bytes the fixtures in `tests/data/` compress (see
/// `tests/data/make-fixtures.sh`): 64 KiB of x86-like code with `call`
/// instructions for the BCJ filter.
pub fn pattern() -> Vec<u8> {
    (0..65536u32)
        .map(|i| match i % 16 {
            0 => 0xe8,
            k @ 1..=4 => ((i / 16 * 37) >> (8 * (k - 1))) as u8,
            _ => (i.wrapping_mul(7) % 251) as u8,
        })
        .collect()
}
