//! Bounded fuzz passes (hotprobe-fuzzcheck, a few seconds each): the
//! parsers of untrusted input never panic. The longer runs are the
//! cargo-fuzz targets in `fuzz/` (docs/FUZZING.md).

mod common;
#[path = "fuzz/exercise.rs"]
mod exercise;

use common::{compile, TempDir};
use hotprobe_fuzzcheck::Fuzz;

const PROG_C: &str = r#"#include <stdio.h>
static int helper(int x) {
    int y = x * 3;
    return y + 1;
}
int compute(int n) {
    int s = 0;
    for (int i = 0; i < n; i++)
        s += helper(i);
    return s;
}
int main(int argc, char **argv) {
    (void)argv;
    printf("%d\n", compute(argc));
    return 0;
}
"#;

const PROG_CC: &str = r#"#include <vector>
namespace ns {
template <typename T> struct Box { T v; T get() const { return v; } };
int sum(const std::vector<int> &v) { int s = 0; for (int x : v) s += x; return s; }
}
int main(int argc, char **) {
    ns::Box<long> b{argc};
    std::vector<int> v(3, argc);
    auto f = [&](int k) { return k + b.get(); };
    return ns::sum(v) + f(1) > 100;
}
"#;

/// Small programs with DWARF, in several flavours (the DWARF seeds).
/// Built once for the tests that use them.
fn small_programs() -> Vec<Vec<u8>> {
    static BUILT: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_small_programs).clone()
}

fn build_small_programs() -> Vec<Vec<u8>> {
    let dir = TempDir::new("fuzz");
    let mut out = Vec::new();
    let builds: [(&str, &str, &str, &[&str]); 5] = [
        ("gcc", "prog.c", PROG_C, &["-g", "-O0"]),
        ("gcc", "prog.c", PROG_C, &["-g", "-O2", "-gdwarf-4"]),
        ("gcc", "prog.c", PROG_C, &["-g", "-O1", "-gz", "-no-pie"]),
        ("gcc", "prog.c", PROG_C, &["-O2", "-s"]),
        ("g++", "prog.cc", PROG_CC, &["-g", "-O1"]),
    ];
    for (i, (cc, name, src, flags)) in builds.iter().enumerate() {
        let exe = compile(dir.path(), cc, name, src, &format!("prog{i}"), flags);
        out.push(std::fs::read(exe).unwrap());
    }
    out
}

#[test]
fn fuzz_elf() {
    let exe = std::env::current_exe().unwrap();
    let mut seeds = small_programs();
    seeds.push(std::fs::read("/bin/ls").unwrap_or_default());
    // libc is big, so only some of its mutants fit in the time; its headers
    // and symbol tables are what gets mutated most (mutation offsets favour
    // the start and the end of a file). This test binary takes seconds to
    // parse (tens of thousands of Rust symbols): long runs only.
    if hotprobe_fuzzcheck::long_run() {
        seeds.push(std::fs::read(&exe).unwrap());
    }
    let libc = hotprobe_symbols::find_library("libc.so.6", None);
    Fuzz::new("elf")
        .seeds(seeds)
        .seed_file(libc.unwrap_or_default())
        .tokens([
            &b"\x7fELF"[..],
            b".symtab",
            b".dynsym",
            b".plt",
            b"_ZN",
            b"_R",
        ])
        .iterations(5_000)
        .run(exercise::elf);
}

#[test]
fn fuzz_dwarf_lines() {
    let seeds = small_programs();
    Fuzz::new("dwarf_lines")
        .seeds(seeds)
        .tokens([&b".debug_line"[..], b".debug_info", b"prog.c", b".zdebug"])
        .iterations(5_000)
        .run(exercise::dwarf_lines);
}

/// kallsyms text with addresses (zeroed ones, as read without privilege,
/// are replaced by made-up increasing ones).
fn kallsyms_seed() -> Vec<u8> {
    let text = std::fs::read_to_string("/proc/kallsyms").unwrap_or_default();
    let mut out = String::new();
    let mut fake = 0xffff_ffff_8100_0000u64;
    for line in text
        .lines()
        .take(400)
        .chain(text.lines().filter(|l| l.ends_with(']')).take(100))
    {
        let mut f = line.splitn(2, ' ');
        let (Some(addr), Some(rest)) = (f.next(), f.next()) else {
            continue;
        };
        fake += 0x40;
        if addr.bytes().all(|b| b == b'0') {
            out.push_str(&format!("{fake:016x} {rest}\n"));
        } else {
            out.push_str(&format!("{addr} {rest}\n"));
        }
    }
    out.into_bytes()
}

#[test]
fn fuzz_kallsyms() {
    let system_map = "ffffffff81000000 T _text\n\
                      ffffffff81000100 t helper\n\
                      ffffffff81000200 W weak_fn\n\
                      ffffffff81000300 D some_data\n\
                      ffffffff81000400 T __x64_sys_getppid\n\
                      ffffffffc0001000 t ext4_fill_super\t[ext4]\n";
    Fuzz::new("kallsyms")
        .seed(kallsyms_seed())
        .seed(system_map)
        .tokens([" T ", " t ", " W ", " D ", "\t[", "]", "ffffffff", "\n"])
        .iterations(3_000)
        .run(exercise::kallsyms);
}

#[test]
fn fuzz_maps() {
    let synthetic = "00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/dbus-daemon\n\
                     7ffd6c9fe000-7ffd6ca1f000 rw-p 00000000 00:00 0 [stack]\n\
                     7f0000000000-7f0000001000 rw-s 00000000 00:05 1234 /memfd:hotprobe (deleted)\n\
                     ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]\n\
                     55d0a1e4a000-55d0a1e6b000 rw-p 00000000 00:00 0\n";
    Fuzz::new("maps")
        .seed_file("/proc/self/maps")
        .seed(synthetic)
        .tokens([
            "-",
            " ",
            "\n",
            "r-xp",
            "rw-s",
            "[heap]",
            " (deleted)",
            "00:00",
            ":",
        ])
        .iterations(20_000)
        .run(exercise::maps);
}

#[test]
fn fuzz_probe_spec() {
    let specs = [
        "main",
        "main+0x1a",
        "main%return",
        "libc:malloc",
        "libc.so.6:malloc+4%return",
        "ns::inner::f+0x10",
        "prog:ns::f",
        "ns::f(int)",
        "libstdc++.so.6:std::terminate",
        "ns::operator++0x4",
        "malloc@@GLIBC_2.2.5",
        "0x401000",
        "prog:0x1139%return",
        "/usr/lib/x86_64-linux-gnu/libc.so.6:0x100",
        "prog.c:12",
        "src/a.rs:7%return",
        "comp*",
        "libc:getpp*",
        "sys_[gs]et?id",
        "usdt:python:gc__start",
        "usdt:libstdc++.so.6:libstdcxx:throw",
    ];
    Fuzz::new("probe_spec")
        .seeds(specs)
        .tokens([
            "%return", ":", "::", "+", "0x", ".c:", "*", "[", "]", "operator",
        ])
        .iterations(30_000)
        .max_len(600)
        .run(exercise::probe_spec);
}

#[test]
fn fuzz_name_pattern() {
    let patterns = [
        "comp*",
        "sys_[gs]et?id",
        "operator\\[\\]",
        "[!a-z]*",
        "[^_]*",
        "[]x]",
        "{lambda()#1}",
        "ns::*::{{closure}}",
        "ünï*",
        "ж?ж",
        "[é-z]",
        "a\\",
    ];
    Fuzz::new("name_pattern")
        .seeds(patterns)
        .tokens([
            "*", "?", "[", "]", "[!", "[^", "-", "\\", "{", "}", ",", "**", "é",
        ])
        .iterations(20_000)
        .max_len(300)
        .run(exercise::name_pattern);
}

#[test]
fn fuzz_usdt_notes() {
    let stdcxx = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6";
    assert!(
        std::path::Path::new(stdcxx).exists(),
        "{stdcxx}: libstdc++ carries USDT notes"
    );
    Fuzz::new("usdt")
        .seed_file(stdcxx)
        .tokens([&b"stapsdt"[..], b".note.stapsdt", b"libstdcxx", b"8@%rax"])
        .iterations(2_000)
        .run(exercise::usdt);
    Fuzz::new("usdt_args")
        .seeds([
            "-4@%edi 8@-8(%rbp) 4@$5",
            "8@8(%rax,%rdx,4) 2@%r9w",
            "-8@$-3 8@16(%rip)",
        ])
        .tokens(["@", "%", "$", "(", ")", ",", "-", "0x", "rax", "r8d"])
        .iterations(20_000)
        .run(exercise::usdt_args);
}
