//! The `.eh_frame` compiler of `--stacks` (`hotprobe::stacks::cfi`): real
//! modules give the rows their code needs, and malformed input is an
//! error, never a panic (a bounded fuzz pass, hotprobe-fuzzcheck).

use std::path::Path;

use hotprobe::stacks::cfi::{compile_eh_frame, compile_module};
use hotprobe_abi::stacks::{find_row, StackRow, CFA_NONE, CFA_RBP, CFA_RSP, RBP_AT, RBP_SAME};
use hotprobe_fuzzcheck::Fuzz;
use hotprobe_testkit::{compile, write_source, TempDir};
use object::{Object, ObjectSection, ObjectSymbol};

const PROG: &str = r#"#include <stdio.h>
#include <stdlib.h>
__attribute__((noinline)) long leaf(long n) { asm volatile(""); return n * 3 + 1; }
__attribute__((noinline)) long middle(long n) {
    char buf[64];
    snprintf(buf, sizeof buf, "%ld", n);
    long r = leaf(atol(buf));
    asm volatile("");
    return r + 1;
}
__attribute__((noinline)) long with_fp(long n) {
    volatile long a[n + 1];
    for (long i = 0; i <= n; i++)
        a[i] = i;
    long r = middle(a[n]);
    asm volatile("");
    return r;
}
int main(int argc, char **argv) { (void)argv; printf("%ld\n", with_fp(argc)); return 0; }
"#;

fn build(dir: &Path, flags: &[&str]) -> Vec<u8> {
    let src = write_source(dir, "prog.c", PROG);
    let out = dir.join(format!("prog{}", flags.join("")));
    std::fs::read(compile("gcc", &src, &out, flags, &[])).unwrap()
}

fn symbol(data: &[u8], name: &str) -> (u64, u64) {
    let file = object::File::parse(data).unwrap();
    let s = file
        .symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("no symbol {name}"));
    (s.address(), s.size())
}

#[test]
fn rows_of_an_omit_frame_pointer_build() {
    let dir = TempDir::new("stacks-cfi");
    let data = build(dir.path(), &["-O2", "-fomit-frame-pointer"]);
    let bias = 0x5555_0000_0000;
    let rows = compile_module(&data, bias).unwrap();
    assert!(rows.windows(2).all(|w| w[0].pc < w[1].pc), "sorted, unique");
    for f in ["leaf", "middle", "with_fp", "main"] {
        let (addr, size) = symbol(&data, f);
        // At a function's first instruction: CFA = rsp + 8, rbp untouched.
        let first = find_row(&rows, bias + addr).unwrap();
        assert_eq!(
            (first.cfa_reg, first.cfa_off, first.rbp_rule),
            (CFA_RSP, 8, RBP_SAME),
            "{f}: {first:?}"
        );
        // Past the function's end, no row of its own covers it any more.
        let past = find_row(&rows, bias + addr + size).unwrap();
        assert!(past.pc >= bias + addr + size || past.cfa_reg == CFA_NONE);
    }
    // middle keeps a 64-byte buffer: somewhere inside it CFA = rsp + ≥ 72.
    let (addr, size) = symbol(&data, "middle");
    let inside = rows
        .iter()
        .filter(|r| r.pc > bias + addr && r.pc < bias + addr + size);
    assert!(
        inside
            .clone()
            .any(|r| r.cfa_reg == CFA_RSP && r.cfa_off >= 72),
        "{:?}",
        inside.collect::<Vec<_>>()
    );
    // with_fp has a variable-length array: gcc sets up rbp and the CFA
    // moves to rbp + 16 with rbp saved at CFA - 16.
    let (addr, size) = symbol(&data, "with_fp");
    assert!(rows.iter().any(|r| r.pc > bias + addr
        && r.pc < bias + addr + size
        && r.cfa_reg == CFA_RBP
        && r.cfa_off == 16
        && r.rbp_rule == RBP_AT
        && r.rbp_off == -16));
}

#[test]
fn rows_of_libc() {
    let libc = hotprobe_testkit_libc();
    let data = std::fs::read(&libc).unwrap();
    let rows = compile_module(&data, 0).unwrap();
    assert!(rows.len() > 1000, "{} rows", rows.len());
    let file = object::File::parse(&*data).unwrap();
    let malloc = file
        .dynamic_symbols()
        .find(|s| s.name() == Ok("malloc"))
        .unwrap()
        .address();
    let r = find_row(&rows, malloc).unwrap();
    assert_eq!((r.cfa_reg, r.cfa_off), (CFA_RSP, 8), "{r:?}");
}

/// The C library the test process itself maps.
fn hotprobe_testkit_libc() -> String {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so") || p.contains("/libc-"))
        .expect("libc mapped")
        .to_string()
}

fn eh_frame_of(data: &[u8]) -> (Vec<u8>, u64) {
    let file = object::File::parse(data).unwrap();
    let s = file.section_by_name(".eh_frame").unwrap();
    (s.data().unwrap().to_vec(), s.address())
}

fn compile_raw(data: &[u8]) -> bool {
    let mut eh = gimli::EhFrame::new(data, gimli::LittleEndian);
    eh.set_address_size(8);
    let bases = gimli::BaseAddresses::default()
        .set_eh_frame(0x2000)
        .set_text(0x1000);
    match compile_eh_frame(&eh, &bases, 0x10_0000) {
        Ok(rows) => {
            assert!(rows.windows(2).all(|w| w[0].pc < w[1].pc));
            !rows.is_empty()
        }
        Err(_) => false,
    }
}

#[test]
fn fuzz_eh_frame() {
    let dir = TempDir::new("stacks-fuzz");
    let mut seeds = Vec::new();
    for flags in [&["-O2", "-fomit-frame-pointer"][..], &["-O0"][..]] {
        seeds.push(eh_frame_of(&build(dir.path(), flags)).0);
    }
    let report = Fuzz::new("eh_frame")
        .seeds(seeds)
        .tokens([
            &[0u8; 4][..],
            &[0xff; 4],
            &[0x0c, 0x07, 0x08],
            &[0x90, 0x01],
            &[0x0e, 0x10],
            &[0x0d, 0x06],
            &[0x0f, 0x03],
        ])
        .iterations(20_000)
        .run(compile_raw);
    assert!(report.accepted > 0, "{report:?}");
}

#[test]
fn fuzz_eh_frame_elf() {
    let dir = TempDir::new("stacks-fuzz-elf");
    let seed = build(dir.path(), &["-O2", "-fomit-frame-pointer", "-s"]);
    let report = Fuzz::new("eh_frame_elf")
        .seed(seed)
        .iterations(2_000)
        .run(|data| compile_module(data, 0).is_ok_and(|r: Vec<StackRow>| !r.is_empty()));
    assert!(report.accepted > 0, "{report:?}");
}
