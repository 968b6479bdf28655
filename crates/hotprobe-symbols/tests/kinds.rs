//! Which symbols are function entries, on gcc and g++ -O2 output: `.cold`
//! partitions and labels are not, `.part`/`.isra`/`.constprop` clones are;
//! DWARF finds a cold part whatever its symbol is called; `.eh_frame` FDEs
//! give instruction boundaries and say where `[rsp]` is a return address.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use hotprobe_symbols::{ElfModule, FunctionKind, LinkAddr};

fn program_source(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/programs")
        .join(name);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn build(dir: &TempDir, compiler: &str, src: &str, out: &str, flags: &[&str]) -> PathBuf {
    compile(dir.path(), compiler, src, &program_source(src), out, flags)
}

fn run(cmd: &mut Command) {
    let o = cmd.output().expect("runs");
    assert!(
        o.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

fn by_raw<'m>(m: &'m ElfModule, raw: &str) -> &'m hotprobe_symbols::Symbol {
    m.functions()
        .iter()
        .find(|s| s.raw_name == raw)
        .unwrap_or_else(|| panic!("no symbol {raw} in {}", m.path().display()))
}

#[test]
fn gcc_cold_partition_and_label() {
    let dir = TempDir::new("kinds-c");
    let exe = build(&dir, "gcc", "coldsplit.c", "coldsplit", &["-O2", "-g"]);
    let m = ElfModule::open(&exe).unwrap();

    let g = m.lookup("g").unwrap();
    assert_eq!(g.kind, FunctionKind::Entry);
    assert!(g.is_entry() && g.not_entry_reason().is_none());
    let cold = by_raw(&m, "g.cold");
    assert_eq!(cold.addr.0, nm_addr(&exe, "g.cold"));
    assert_eq!(cold.kind, FunctionKind::ColdPart { parent: "g".into() });
    assert_eq!(m.function_kind(cold), cold.kind);
    assert_eq!(
        cold.not_entry_reason().unwrap(),
        "g.cold is a cold partition of g (gcc -freorder-blocks-and-partition), not a \
         function entry: its [rsp] is not a return address"
    );
    // Addresses inside g.cold are g.cold's, not g's.
    assert_eq!(m.symbolize(LinkAddr(cold.addr.0 + 1)).unwrap().0, cold);

    // The local label of asm_twice: listed, not an entry, never the name
    // of an address (asm_twice+0x4 is).
    let twice = m.lookup("asm_twice").unwrap();
    let label = by_raw(&m, "asm_twice_done");
    assert_eq!(label.kind, FunctionKind::Label);
    assert_eq!(label.addr.0, twice.addr.0 + 4);
    assert!(label.not_entry_reason().unwrap().contains("label"));
    let (s, off) = m.symbolize(label.addr).unwrap();
    assert_eq!((s.name.as_str(), off), ("asm_twice", 4));

    // .eh_frame: g.cold has an FDE of its own, entered with g's registers
    // pushed (its CFA is not rsp+8); g's FDE starts at g with the return
    // address on top.
    let f = m.fde_containing(g.addr).unwrap();
    assert_eq!(f.start, g.addr);
    assert!(f.return_address_on_top(), "{f:?}");
    let f = m.fde_containing(LinkAddr(cold.addr.0 + 2)).unwrap();
    assert_eq!(f.start, cold.addr);
    assert!(!f.return_address_on_top(), "{f:?}");
    assert!(f.cfa_rsp_offset.is_some_and(|o| o > 8), "{f:?}");
}

#[test]
fn dwarf_finds_a_cold_part_under_another_name() {
    let dir = TempDir::new("kinds-dwarf");
    let exe = build(&dir, "gcc", "coldsplit.c", "coldsplit", &["-O2", "-g"]);
    let renamed = dir.path().join("renamed");
    run(Command::new("objcopy")
        .args(["--redefine-sym", "g.cold=g_unlikely"])
        .arg(&exe)
        .arg(&renamed));
    let m = ElfModule::open(&renamed).unwrap();
    let s = by_raw(&m, "g_unlikely");
    // The symbol table alone says nothing; DWARF says it is a piece of g.
    assert_eq!(s.kind, FunctionKind::Entry);
    assert_eq!(
        m.function_kind(s),
        FunctionKind::ColdPart { parent: "g".into() }
    );
    assert_eq!(m.dwarf_piece_of(s.addr).as_deref(), Some("g"));
    let g = m.lookup("g").unwrap();
    assert_eq!(m.function_kind(g), FunctionKind::Entry);
    assert_eq!(m.dwarf_piece_of(g.addr), None);
}

#[test]
fn stripped_binary_keeps_its_fdes() {
    let dir = TempDir::new("kinds-strip");
    let exe = build(&dir, "gcc", "coldsplit.c", "coldsplit", &["-O2"]);
    let (g, cold) = (nm_addr(&exe, "g"), nm_addr(&exe, "g.cold"));
    let stripped = dir.path().join("stripped");
    run(Command::new("strip").arg("-o").arg(&stripped).arg(&exe));
    let m = ElfModule::open(&stripped).unwrap();
    assert!(m.functions().iter().all(|s| s.raw_name != "g"));
    assert!(m.symbolize(LinkAddr(g + 1)).is_none());
    let f = m.fde_containing(LinkAddr(g + 1)).unwrap();
    assert_eq!(f.start.0, g);
    assert!(f.return_address_on_top());
    let f = m.fde_containing(LinkAddr(cold)).unwrap();
    assert_eq!(f.start.0, cold);
    assert!(!f.return_address_on_top());

    // Without unwind tables there is no FDE for g.
    let bare = build(
        &dir,
        "gcc",
        "coldsplit.c",
        "bare",
        &[
            "-O2",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
        ],
    );
    let g = nm_addr(&bare, "g");
    let m = ElfModule::open(&bare).unwrap();
    assert!(m.fde_containing(LinkAddr(g)).is_none());
}

#[test]
fn gxx_clones_are_entries_and_cold_parts_are_not() {
    let dir = TempDir::new("kinds-cxx");
    let exe = build(&dir, "g++", "clones.cc", "clones", &["-O2", "-g"]);
    let m = ElfModule::open(&exe).unwrap();
    let mut seen = Vec::new();
    for s in m.functions() {
        let raw = s.raw_name.as_str();
        let suffix = ["cold", "part", "isra", "constprop"]
            .into_iter()
            .find(|k| raw.contains(&format!(".{k}")));
        let Some(suffix) = suffix else { continue };
        seen.push(suffix);
        let kind = m.function_kind(s);
        if suffix == "cold" {
            assert!(
                matches!(&kind, FunctionKind::ColdPart { parent } if !parent.contains(".cold")),
                "{raw}: {kind:?}"
            );
            assert!(!s.is_entry(), "{raw}");
        } else {
            assert_eq!(kind, FunctionKind::Entry, "{raw}");
            assert!(s.is_entry(), "{raw}");
        }
    }
    for k in ["cold", "part", "isra", "constprop"] {
        assert!(seen.contains(&k), "g++ -O2 made no .{k} symbol: {seen:?}");
    }
    // The demangled parent of work's cold part.
    let cold = by_raw(&m, "_Z4workRSt6vectorIlSaIlEEl.cold");
    assert_eq!(
        cold.kind,
        FunctionKind::ColdPart {
            parent: "work(std::vector<long, std::allocator<long> >&, long)".into()
        }
    );
}
