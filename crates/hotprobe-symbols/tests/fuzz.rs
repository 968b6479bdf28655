//! Bounded fuzz passes (hotprobe-fuzzcheck, a few seconds each): the
//! parsers of untrusted input never panic. The longer runs are the
//! cargo-fuzz targets in `fuzz/` (docs/FUZZING.md).

mod common;

use common::{compile, TempDir};
use hotprobe_fuzzcheck::Fuzz;
use hotprobe_symbols::pattern::{self, NamePattern};
use hotprobe_symbols::{
    parse_maps, ElfModule, KernelSymbols, LinkAddr, Mapping, Perms, ProbeSpec, RuntimeAddr,
};

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
fn small_programs(dir: &TempDir) -> Vec<Vec<u8>> {
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

fn mapping(start: u64, offset: u64, exec: bool) -> Mapping {
    Mapping {
        start: RuntimeAddr(start),
        end: RuntimeAddr(start + 0x1000),
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

/// Everything a module answers without DWARF.
fn exercise_module(m: &ElfModule) {
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
}

#[test]
fn fuzz_elf_module() {
    let exe = std::env::current_exe().unwrap();
    let dir = TempDir::new("fuzz-elf");
    let mut seeds = small_programs(&dir);
    seeds.push(std::fs::read("/bin/ls").unwrap_or_default());
    // libc is big, so only some of its mutants fit in the time; its headers
    // and symbol tables are what gets mutated most (mutation offsets favour
    // the start and the end of a file). This test binary takes seconds to
    // parse (tens of thousands of Rust symbols): long runs only.
    if hotprobe_fuzzcheck::long_run() {
        seeds.push(std::fs::read(&exe).unwrap());
    }
    let libc = hotprobe_symbols::find_library("libc.so.6", None);
    Fuzz::new("elf_module")
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
        .run(|data| {
            let Ok(m) = ElfModule::from_bytes("fuzz.elf".into(), data.to_vec()) else {
                return false;
            };
            exercise_module(&m);
            true
        });
}

#[test]
fn fuzz_dwarf_lines() {
    let dir = TempDir::new("fuzz-dwarf");
    let seeds = small_programs(&dir);
    Fuzz::new("dwarf_lines")
        .seeds(seeds)
        .tokens([&b".debug_line"[..], b".debug_info", b"prog.c", b".zdebug"])
        .iterations(5_000)
        .run(|data| {
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
        });
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
        .run(|data| {
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
            let _ = k.lookup("no_such_symbol");
            true
        });
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
        .run(|data| {
            let Ok(maps) = parse_maps(&String::from_utf8_lossy(data)) else {
                return false;
            };
            for m in &maps {
                assert!(m.start <= m.end);
                let _ = (m.perms.to_string(), m.len(), m.contains(m.start));
            }
            true
        });
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
    ];
    Fuzz::new("probe_spec")
        .seeds(specs)
        .tokens([
            "%return", ":", "::", "+", "0x", ".c:", "*", "[", "]", "operator",
        ])
        .iterations(30_000)
        .max_len(600)
        .run(|data| {
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
        });
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
    let names = [
        "compute",
        "sys_getuid",
        "operator[]",
        "_start",
        "ns::f::{{closure}}",
        "{lambda()#1}",
        "ünïcode",
        "жaж",
        "",
        "]",
    ];
    Fuzz::new("name_pattern")
        .seeds(patterns)
        .tokens([
            "*", "?", "[", "]", "[!", "[^", "-", "\\", "{", "}", ",", "**", "é",
        ])
        .iterations(20_000)
        .max_len(300)
        .run(|data| {
            let text = String::from_utf8_lossy(data);
            let _ = pattern::is_pattern(&text);
            let _ = pattern::matches(&text, "compute");
            let Ok(p) = NamePattern::new(&text) else {
                return false;
            };
            for n in names {
                let _ = p.matches(n);
            }
            let _ = p.matches(&text);
            true
        });
}
