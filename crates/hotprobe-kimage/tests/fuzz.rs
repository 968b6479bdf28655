//! Bounded mutation fuzzing (a few seconds, fixed seeds): nothing in the
//! crate may panic on a malformed image; every input gives symbols or an
//! error. A crashing input is written under the target's tmp dir.
//! The open-ended fuzzer is `fuzz/` (cargo-fuzz).

mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::{Duration, Instant};

use common::{build, bzimage, symbols, Gen, Rng};
use hotprobe_kimage::kallsyms::Kallsyms;
use hotprobe_kimage::{decompress, kernel_symbols, vmlinux_symbols, BzImage};

/// Runs `f` on `input`; a panic saves the input and fails with its name.
fn check(what: &str, iter: usize, input: &[u8], f: impl FnOnce(&[u8])) {
    if catch_unwind(AssertUnwindSafe(|| f(input))).is_err() {
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("kimage-fuzz-crash-{what}-{iter}.bin"));
        let _ = std::fs::write(&path, input);
        panic!(
            "{what}: iteration {iter} panicked; input saved to {}",
            path.display()
        );
    }
}

/// Flips, overwrites, inserts or deletes a few bytes, biased to `focus`.
fn mutate(r: &mut Rng, data: &mut Vec<u8>, focus: &[(usize, usize)]) {
    for _ in 0..1 + r.below(8) {
        if data.is_empty() {
            data.push(r.next() as u8);
            continue;
        }
        let at = match focus.get(r.below(focus.len() as u64 + 1) as usize) {
            Some(&(s, e)) if s < e && e <= data.len() => s + r.below((e - s) as u64) as usize,
            _ => r.below(data.len() as u64) as usize,
        };
        match r.below(6) {
            0 => data[at] ^= 1 << r.below(8),
            1 => data[at] = r.next() as u8,
            2 => data[at] = [0, 0xff, 0x80, 0x7f][r.below(4) as usize],
            3 => {
                let v = (r.next() as u32).to_le_bytes();
                let end = (at + 4).min(data.len());
                data[at..end].copy_from_slice(&v[..end - at]);
            }
            4 => data.insert(at, r.next() as u8),
            _ => {
                data.remove(at);
            }
        }
    }
    if r.below(16) == 0 {
        let n = r.below(data.len() as u64 + 1) as usize;
        data.truncate(n);
    }
}

fn run_for(budget: Duration, min_iters: usize, mut f: impl FnMut(usize)) -> usize {
    let t0 = Instant::now();
    let mut i = 0;
    while i < min_iters || t0.elapsed() < budget {
        f(i);
        i += 1;
    }
    i
}

#[test]
fn small_crafted_inputs() {
    let mut r = Rng(0x5eed_0001);
    let magics: &[&[u8]] = &[
        b"\x1f\x8b\x08\x00",
        b"\xfd7zXZ\x00\x00\x01\x69\x22\xde\x36",
        b"\x5d\x00\x00\x80\x00",
        b"\x28\xb5\x2f\xfd",
        b"\x02\x21\x4c\x18",
        b"BZh9",
        b"\x89LZO",
        b"\x7fELF\x02\x01\x01\x00",
        b"0\x001\x002\x003\x004\x005\x006\x007\x008\x009\x00",
        b"",
    ];
    let n = run_for(Duration::from_secs(2), 3000, |i| {
        let mut v = magics[i % magics.len()].to_vec();
        for _ in 0..r.below(if i % 7 == 0 { 4096 } else { 64 }) {
            v.push(r.next() as u8);
        }
        check("payload", i, &v, |d| {
            let _ = decompress(d, None);
            let _ = Kallsyms::find(d);
            let _ = vmlinux_symbols(d);
        });
        let img = bzimage(&v);
        let mut img2 = img.clone();
        mutate(&mut r, &mut img2, &[(0x1f0, 0x270)]);
        for im in [&img, &img2] {
            check("bzimage", i, im, |d| {
                let _ = kernel_symbols(d);
            });
        }
    });
    eprintln!("{n} crafted inputs");
}

#[test]
fn mutated_compressed_fixtures() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let fixtures: Vec<Vec<u8>> = [
        "pattern.gz",
        "pattern.xz",
        "pattern.lzma",
        "pattern.zst",
        "pattern.lz4",
    ]
    .iter()
    .map(|f| std::fs::read(dir.join(f)).unwrap())
    .collect();
    let mut r = Rng(0x5eed_0002);
    let n = run_for(Duration::from_secs(3), 500, |i| {
        let mut v = fixtures[i % fixtures.len()].clone();
        // Headers are where most decisions are made.
        let tail = (v.len().saturating_sub(16), v.len());
        mutate(&mut r, &mut v, &[(0, 32), (0, 32), tail]);
        check("fixture", i, &v, |d| {
            let _ = decompress(d, None);
        });
    });
    eprintln!("{n} mutated compressed payloads");
}

#[test]
fn mutated_synthetic_tables() {
    let mut r = Rng(0x5eed_0003);
    let built: Vec<_> = [Gen::V61, Gen::V62, Gen::V64, Gen::Absolute]
        .iter()
        .map(|&g| build(&symbols(700, g != Gen::Absolute, 11), g, 256))
        .collect();
    let n = run_for(Duration::from_secs(3), 300, |i| {
        let b = &built[i % built.len()];
        let mut v = b.data.clone();
        let focus = [
            (b.token_table, b.token_index + 512),
            (b.markers, b.token_table),
            (b.num_syms, b.num_syms + 16),
            (b.addresses, b.addresses + 64),
            (b.names, b.markers),
        ];
        mutate(&mut r, &mut v, &focus);
        check("tables", i, &v, |d| {
            if let Ok(k) = Kallsyms::find(d) {
                assert!(!k.symbols.is_empty() || d.is_empty());
            }
        });
    });
    eprintln!("{n} mutated synthetic tables");
}

#[test]
fn mutated_debian_image() {
    let Some(img) = common::debian_kernel() else {
        eprintln!(
            "SKIPPED LOUDLY mutated_debian_image: no .cache/kernel/vmlinuz (HOTPROBE_SKIP_GUEST=1)"
        );
        return;
    };
    let mut r = Rng(0x5eed_0004);
    let bz = BzImage::parse(&img).unwrap();
    // The header and the first 64 KiB of the payload, its length cut to match.
    let cut = bz.payload_start + 65536;
    let mut head = img[..cut].to_vec();
    head[0x24c..0x250].copy_from_slice(&65536u32.to_le_bytes());
    let n1 = run_for(Duration::from_secs(2), 300, |i| {
        let mut v = head.clone();
        mutate(
            &mut r,
            &mut v,
            &[(0x1f0, 0x270), (bz.payload_start, bz.payload_start + 64)],
        );
        check("debian-head", i, &v, |d| {
            let _ = kernel_symbols(d);
        });
    });
    // The vmlinux: its first 2 MiB (ELF headers, text) and the kallsyms
    // region, mutated.
    let vmlinux = bz.decompress().unwrap();
    let k = Kallsyms::find(&vmlinux).unwrap();
    let l = &k.layout;
    let start = l.addresses.min(l.num_syms).saturating_sub(4096);
    let end = (l.token_index + 512 + 4096).min(vmlinux.len());
    let region = &vmlinux[start..end];
    let rel = |x: usize| x - start;
    let focus = [
        (rel(l.token_table), rel(l.token_index + 512)),
        (rel(l.markers), rel(l.token_table)),
        (rel(l.num_syms), rel(l.names + 64)),
        (rel(l.addresses), rel(l.addresses + 4096)),
        (rel(l.num_syms - 16), rel(l.num_syms)),
    ];
    let first = &vmlinux[..2 << 20];
    let n2 = run_for(Duration::from_secs(3), 40, |i| {
        let mut v = region.to_vec();
        mutate(&mut r, &mut v, &focus);
        check("debian-kallsyms", i, &v, |d| {
            let _ = Kallsyms::find(d);
        });
        if i % 4 == 0 {
            let mut v = first.to_vec();
            mutate(&mut r, &mut v, &[(0, 64), (0x40, 0x1000)]);
            check("debian-elf", i, &v, |d| {
                let _ = vmlinux_symbols(d);
            });
        }
    });
    eprintln!("{n1} mutated image heads, {n2} mutated kallsyms regions");
}

/// A small valid BTF: int, `struct task_struct { int pid; int tgid; int
/// comm; }` (bitfield offsets), an anonymous union in it, a variable and a
/// `.data..percpu` section holding it.
fn btf_seed() -> Vec<u8> {
    let strings = b"\0int\0task_struct\0pid\0tgid\0comm\0current_task\0.data..percpu\0";
    let s = |n: &str| {
        let pat = [n.as_bytes(), b"\0"].concat();
        strings.windows(pat.len()).position(|w| w == pat).unwrap() as u32
    };
    let mut t: Vec<u32> = vec![s("int"), 1 << 24, 4, 32];
    t.extend([s("task_struct"), 4 << 24 | 1 << 31 | 4, 32]);
    t.extend([s("pid"), 1, 0, s("tgid"), 1, 32, s("comm"), 1, 64, 0, 3, 96]);
    t.extend([0, 5 << 24 | 1, 4, s("comm"), 1, 0]);
    t.extend([s("current_task"), 14 << 24, 1, 1]);
    t.extend([s(".data..percpu"), 15 << 24 | 1, 64, 4, 8, 8]);
    let types: Vec<u8> = t.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut b = vec![0x9f, 0xeb, 1, 0];
    for v in [
        24u32,
        0,
        types.len() as u32,
        types.len() as u32,
        strings.len() as u32,
    ] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&types);
    b.extend_from_slice(strings);
    b
}

#[test]
fn mutated_btf() {
    use hotprobe_kimage::btf::{task_offsets, Btf};
    let seed = btf_seed();
    let b = Btf::parse(&seed).expect("the seed parses");
    let o = task_offsets(&b).expect("the seed has the offsets");
    assert_eq!((o.current, o.pid, o.tgid, o.comm), (8, 0, 4, 8));
    let mut r = Rng(0x5eed_0b7f);
    let n = run_for(Duration::from_secs(2), 2000, |i| {
        let mut v = seed.clone();
        // The header and the type records decide everything.
        mutate(&mut r, &mut v, &[(0, 24), (24, 24 + 120), (24, seed.len())]);
        check("btf", i, &v, |d| {
            if let Ok(b) = Btf::parse(d) {
                let _ = task_offsets(&b);
                let _ = b.member_offset("task_struct", "comm");
                let _ = b.var_offset(".data..percpu", "current_task");
            }
        });
    });
    eprintln!("{n} mutated BTF blobs");
}
