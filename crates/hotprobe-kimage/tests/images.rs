//! Kernel images end to end: synthetic kallsyms tables of each kernel
//! generation, payloads of each compression (fixtures made by the real
//! tools, as the kernel build makes them), and the Debian kernel the guest
//! tests boot.

mod common;

use std::io::Write;
use std::time::Instant;

use common::{build, bzimage, symbols, Gen};
use hotprobe_kimage::kallsyms::{AddressEncoding, Kallsyms};
use hotprobe_kimage::{decompress, kernel_symbols, BzImage, Compression, Error, SymbolSource};

#[test]
fn every_table_layout_decodes() {
    for (gen, percpu, n) in [
        (Gen::V61, true, 3000),
        (Gen::V61, false, 257),
        (Gen::V62, true, 3000),
        // One marker, free token slots left empty (all ten digits must be
        // used, as in every kernel: names end in _0.._19).
        (Gen::V62, false, 20),
        (Gen::V64, true, 2000),
        (Gen::V64, false, 512),
        (Gen::Absolute, false, 1500),
    ] {
        let syms = symbols(n, percpu, n as u64);
        for prefix in [0, 5, 4096] {
            let b = build(&syms, gen, prefix);
            let k = Kallsyms::find(&b.data)
                .unwrap_or_else(|e| panic!("{gen:?} percpu={percpu} n={n}: {e}"));
            assert!(
                k.symbols == syms,
                "{gen:?} percpu={percpu} n={n}: symbols differ"
            );
            let l = &k.layout;
            assert_eq!(
                (
                    l.token_table,
                    l.token_index,
                    l.markers,
                    l.names,
                    l.num_syms,
                    l.addresses
                ),
                (
                    b.token_table,
                    b.token_index,
                    b.markers,
                    b.names,
                    b.num_syms,
                    b.addresses
                ),
                "{gen:?}"
            );
            let enc = match (gen, percpu) {
                (Gen::Absolute, _) => AddressEncoding::Absolute,
                (_, true) => AddressEncoding::RelativeAbsolutePercpu,
                (_, false) => AddressEncoding::Relative,
            };
            assert_eq!(l.encoding, enc, "{gen:?} percpu={percpu}");
        }
    }
}

#[test]
fn missing_tables_are_named() {
    let syms = symbols(1000, true, 7);
    let b = build(&syms, Gen::V61, 64);
    let what = |d: &[u8]| match Kallsyms::find(d) {
        Err(Error::KallsymsNotFound { what, .. }) => what,
        Err(e) => panic!("expected a missing table, got {e}"),
        Ok(k) => panic!("expected a missing table, found {:x?}", k.layout),
    };
    assert_eq!(what(&[]), "kallsyms_token_table");
    assert_eq!(what(&b.data[b.token_table..]), "kallsyms_markers");
    // Break the token index: the table no longer checks out.
    let mut d = b.data.clone();
    d[b.token_index + 2] ^= 0x40;
    assert_eq!(what(&d), "kallsyms_token_table");
    // Break a marker.
    let mut d = b.data.clone();
    d[b.markers + 4] ^= 1;
    assert!(matches!(
        what(&d),
        "kallsyms_markers" | "kallsyms_num_syms/kallsyms_names"
    ));
    // Break num_syms.
    let mut d = b.data.clone();
    d[b.num_syms..b.num_syms + 4].copy_from_slice(&5000u32.to_le_bytes());
    assert_eq!(what(&d), "kallsyms_num_syms/kallsyms_names");
    // Unsorted addresses and a zero relative base.
    let mut d = b.data.clone();
    let rb = b.num_syms - 8;
    d[rb..rb + 8].fill(0);
    assert_eq!(what(&d), "kallsyms_offsets/kallsyms_addresses");
    let e = Kallsyms::find(&d).unwrap_err().to_string();
    assert!(e.contains("1000 symbols"), "{e}");
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

#[test]
fn bzimages_with_kallsyms_payloads() {
    let syms = symbols(2000, true, 3);
    let b = build(&syms, Gen::V62, 1 << 16);
    let mut xz = Vec::new();
    lzma_rs::xz_compress(&mut &b.data[..], &mut xz).unwrap();
    xz.extend_from_slice(&(b.data.len() as u32).to_le_bytes());
    for (payload, c) in [(gzip(&b.data), Compression::Gzip), (xz, Compression::Xz)] {
        let img = bzimage(&payload);
        let bz = BzImage::parse(&img).unwrap();
        assert_eq!(bz.compression, c);
        assert_eq!(bz.payload, &payload[..]);
        assert_eq!(bz.decompress().unwrap(), b.data, "{c:?}");
        let k = kernel_symbols(&img).unwrap();
        assert_eq!(k.source, SymbolSource::Kallsyms);
        assert!(k.symbols == syms, "{c:?}: symbols differ");
        let text = k.to_kallsyms_text();
        assert!(
            text.starts_with("0000000000000000 A percpu_var0\n"),
            "{text:.80}"
        );
    }
    // A truncated image says so.
    let img = bzimage(&gzip(&b.data));
    assert!(matches!(
        kernel_symbols(&img[..img.len() - 100]),
        Err(Error::Truncated { .. })
    ));
    assert!(matches!(
        kernel_symbols(b"not a kernel"),
        Err(Error::NotKernelImage)
    ));
}

#[test]
fn payload_fixtures_of_every_format() {
    let want = common::pattern();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    for (file, c) in [
        ("pattern.gz", Compression::Gzip),
        ("pattern.xz", Compression::Xz),
        ("pattern.lzma", Compression::Lzma),
        ("pattern.zst", Compression::Zstd),
        ("pattern.lz4", Compression::Lz4),
    ] {
        let payload = std::fs::read(dir.join(file)).unwrap();
        assert_eq!(Compression::detect(&payload).unwrap(), c);
        let out = decompress(&payload, None).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(out == want, "{file}: {} bytes, not the pattern", out.len());
        // Through a bzImage too, with the size hint.
        let img = bzimage(&payload);
        let bz = BzImage::parse(&img).unwrap();
        if c != Compression::Gzip {
            assert_eq!(bz.size_hint(), Some(want.len() as u32), "{file}");
        }
        assert!(bz.decompress().unwrap() == want, "{file}");
        // No kallsyms in there: the error says which table is missing.
        let e = kernel_symbols(&img).unwrap_err();
        assert!(
            matches!(
                e,
                Error::KallsymsNotFound {
                    what: "kallsyms_token_table",
                    ..
                }
            ),
            "{file}: {e}"
        );
        // Cut short: an error, not a panic.
        let cut = &payload[..payload.len() / 2];
        assert!(decompress(cut, None).is_err(), "{file} cut in half");
    }
    // The BCJ filter in the xz fixture changed bytes: without undoing it the
    // pattern would not come back (checked above); the fixture does use it.
    let xz = std::fs::read(dir.join("pattern.xz")).unwrap();
    assert_eq!(xz[13] & 3, 1, "two filters");
    assert_eq!(xz[14], 0x04, "x86 BCJ first");
}

#[test]
fn debian_kernel_image() {
    let Some(img) = common::debian_kernel() else {
        eprintln!(
            "SKIPPED LOUDLY debian_kernel_image: no .cache/kernel/vmlinuz (HOTPROBE_SKIP_GUEST=1)"
        );
        return;
    };
    let bz = BzImage::parse(&img).unwrap();
    assert!(bz.protocol >= (2, 8));
    eprintln!(
        "Debian bzImage: protocol {}.{:02}, {} payload of {} bytes",
        bz.protocol.0,
        bz.protocol.1,
        bz.compression.name(),
        bz.payload.len()
    );
    let t0 = Instant::now();
    let vmlinux = bz.decompress().unwrap();
    let t_dec = t0.elapsed();
    assert_eq!(Some(vmlinux.len() as u32), bz.size_hint());
    assert!(vmlinux.starts_with(b"\x7fELF"));
    let t0 = Instant::now();
    let k = Kallsyms::find(&vmlinux).unwrap();
    let t_find = t0.elapsed();
    eprintln!(
        "FIGURE kimage Debian: decompressed {} bytes in {t_dec:?}, {} symbols found in {t_find:?}; {:x?}",
        vmlinux.len(),
        k.symbols.len(),
        k.layout
    );
    assert_eq!(k.layout.encoding, AddressEncoding::RelativeAbsolutePercpu);
    assert_eq!(
        k.layout.relative_base.map(|r| r.1),
        Some(0xffff_ffff_8100_0000)
    );
    assert!(k.symbols.len() > 50_000);
    assert!(k.symbols.windows(2).all(|w| w[0].addr <= w[1].addr));
    let find = |n: &str| {
        k.symbols
            .iter()
            .find(|s| s.name == n)
            .map(|s| (s.addr, s.kind))
    };
    assert_eq!(find("_text"), Some((0xffff_ffff_8100_0000, 'T')));
    let (stext, etext) = (find("_stext").unwrap().0, find("_etext").unwrap().0);
    let (getppid, kind) = find("__x64_sys_getppid").unwrap();
    assert!(stext < getppid && getppid < etext && kind == 'T');
    // The stripped ELF has no .symtab: kallsyms it is.
    let all = hotprobe_kimage::vmlinux_symbols(&vmlinux).unwrap();
    assert_eq!(all.source, SymbolSource::Kallsyms);
    assert_eq!(all.symbols, k.symbols);
}
