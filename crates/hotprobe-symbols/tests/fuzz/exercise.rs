//! What each fuzz pass does with one input, shared by the bounded passes of
//! `tests/fuzz.rs` and the cargo-fuzz targets of `fuzz/` (included there by
//! path): returns whether the parser accepted the input, panics on a broken
//! invariant. Depends on hotprobe-symbols and std only.
#![allow(dead_code)]

use hotprobe_symbols::pattern::{self, NamePattern};
use hotprobe_symbols::{
    parse_maps, ElfModule, KernelSymbols, LinkAddr, Mapping, Perms, ProbeSpec, RuntimeAddr,
};

fn mapping(start: u64, offset: u64, exec: bool) -> Mapping {
    Mapping {
        start: RuntimeAddr(start),
        end: RuntimeAddr(start.saturating_add(0x1000)),
        perms: Perms {
            read: true,
            write: !exec,
            exec,
            shared: false,
        },
        offset,
        dev: (0, 0),
        inode: 1,
        path: None,
        pseudo: None,
        deleted: false,
    }
}

/// `ElfModule::from_bytes` and everything a module answers without DWARF:
/// symbols, lookups (by every name form), symbolization, PLT and segment
/// queries, load biases.
pub fn elf(data: &[u8]) -> bool {
    let Ok(m) = ElfModule::from_bytes("fuzz.elf".into(), data.to_vec()) else {
        return false;
    };
    let _ = (m.is_pie(), m.entry(), m.build_id(), m.file_name());
    let _ = (m.plt_ranges(), m.exec_ranges());
    let fs = m.functions();
    let picks: Vec<usize> = if fs.is_empty() {
        vec![]
    } else {
        vec![0, fs.len() / 3, fs.len() / 2, fs.len() - 1]
    };
    for i in picks {
        let s = &fs[i];
        // Found, though maybe at another address (a static function's
        // name can be used in several files).
        assert!(m.find(&s.raw_name).is_some(), "{} not found", s.raw_name);
        let _ = m.lookup(&s.name);
        let _ = m.symbolize(s.addr);
        let _ = m.symbolize(LinkAddr(s.addr.0.wrapping_add(s.size)));
        let _ = (m.in_plt(s.addr), m.is_executable(s.addr));
    }
    for name in ["main", "compute", "ns::sum", "malloc"] {
        let _ = m.find(name);
    }
    let _ = m.similar("mian");
    let _ = m.symbolize(LinkAddr(u64::MAX));
    let maps = [
        mapping(0x5555_5555_4000, 0, false),
        mapping(0x5555_5555_5000, 0x1000, true),
        mapping(0x7fff_ffff_e000, u64::MAX - 0xfff, true),
    ];
    for map in &maps {
        let _ = m.load_bias(map);
    }
    let _ = m.load_bias_for(&maps);
    true
}

/// DWARF line tables: `file:LINE` to addresses, addresses to `file:line`.
pub fn dwarf_lines(data: &[u8]) -> bool {
    let Ok(m) = ElfModule::from_bytes("fuzz.elf".into(), data.to_vec()) else {
        return false;
    };
    if !m.has_dwarf() {
        return false;
    }
    for line in [3, 8, 14, 0, u32::MAX] {
        let _ = m.line_addresses("prog.c", line);
    }
    let _ = m.line_addresses("/", 1);
    let _ = m.line_addresses("", 1);
    for s in m.functions().iter().take(8) {
        let _ = m.source_location(s.addr);
        let _ = m.source_location(LinkAddr(s.addr.0.wrapping_add(5)));
    }
    let _ = m.source_location(LinkAddr(u64::MAX));
    true
}

/// kallsyms / System.map text: lookups agree with symbolization.
pub fn kallsyms(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let Ok(k) = KernelSymbols::parse(&text) else {
        return false;
    };
    assert!(!k.is_empty());
    for s in k.symbols().iter().step_by(k.len() / 16 + 1) {
        let found = k.lookup(&s.name).expect("every symbol can be looked up");
        let _ = k.module_of(found);
        let (hit, off) = k.symbolize(s.addr.0).expect("a symbol's start symbolizes");
        assert_eq!(hit.addr.0 + off, s.addr.0);
    }
    let _ = k.with_modules().count();
    let _ = k.symbolize(u64::MAX);
    // `find`, not `lookup`: the error's suggestions (edit distances to every
    // name) would take most of the time, and the demangle pass covers them.
    let _ = k.find("no_such_symbol");
    true
}

/// /proc/PID/maps text: parsed mappings are well formed.
pub fn maps(data: &[u8]) -> bool {
    let Ok(maps) = parse_maps(&String::from_utf8_lossy(data)) else {
        return false;
    };
    for m in &maps {
        assert!(m.start <= m.end);
        let _ = (m.perms.to_string(), m.len(), m.contains(m.start));
    }
    true
}

/// Probe specs: what parses round-trips through its display.
pub fn probe_spec(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let Ok(spec) = text.parse::<ProbeSpec>() else {
        return false;
    };
    let shown = spec.to_string();
    let again: ProbeSpec = shown
        .parse()
        .unwrap_or_else(|e| panic!("{spec:?} displays as {shown:?}, which fails: {e}"));
    assert_eq!(again, spec, "round trip via {shown:?}");
    let _ = (spec.is_return(), spec.module());
    true
}

/// Name patterns: the first line is the pattern, the others (and a few
/// fixed names) are matched against it.
pub fn name_pattern(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let mut lines = text.split('\n');
    let pat = lines.next().unwrap_or("");
    let _ = pattern::is_pattern(pat);
    let compiled = NamePattern::new(pat);
    let fixed = [
        "compute",
        "sys_getuid",
        "operator[]",
        "ns::f::{{closure}}",
        "ünïcode",
        "",
    ];
    for name in lines.chain(fixed).chain([pat]) {
        let _ = pattern::matches(pat, name);
        if let Ok(p) = &compiled {
            let _ = p.matches(name);
        }
    }
    compiled.is_ok()
}

/// An ELF file's USDT notes: what parses has sizes sdt.h allows.
pub fn usdt(data: &[u8]) -> bool {
    let Ok(markers) = hotprobe_symbols::usdt_markers(data) else {
        return false;
    };
    for m in &markers {
        assert!(m.args.len() <= hotprobe_symbols::MAX_USDT_ARGS);
        assert!(m.args.iter().all(|a| matches!(a.size, 1 | 2 | 4 | 8)));
    }
    true
}

/// USDT argument strings.
pub fn usdt_args(data: &[u8]) -> bool {
    hotprobe_symbols::parse_usdt_args(&String::from_utf8_lossy(data)).is_ok()
}
