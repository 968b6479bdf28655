//! ElfModule against real compiler output, cross-checked with binutils.

mod common;

use common::*;
use hotprobe_symbols::{ElfModule, LinkAddr, SymbolError};

const PROG_C: &str = r#"#include <stdio.h>
#include <unistd.h>

int counter;

__attribute__((noinline)) int work(int x) {
    counter += x * 3; // LINE_WORK
    return counter * 2;
}

static __attribute__((noinline)) int helper(int x) {
    return work(x) + 1; // LINE_HELPER
}

int main(int argc, char **argv) {
    (void)argv;
    printf("%d\n", helper(argc));
    return getpid() == 0;
}
"#;

fn check_prog(flags: &[&str], pie: bool) {
    let dir = TempDir::new("elf");
    let exe = compile(dir.path(), "gcc", "prog.c", PROG_C, "prog", flags);
    let m = ElfModule::open(&exe).unwrap();
    assert_eq!(m.is_pie(), pie);
    assert_eq!(m.path(), exe.as_path());
    for f in ["main", "work", "helper"] {
        let s = m.lookup(f).unwrap_or_else(|e| panic!("{flags:?}: {e}"));
        assert_eq!(s.addr.0, nm_addr(&exe, f), "{f} with {flags:?}");
        assert!(s.size > 0);
        assert_eq!(m.symbolize(s.addr).unwrap().0.name, f);
        assert_eq!(m.symbolize(LinkAddr(s.addr.0 + 1)).unwrap(), (s, 1));
    }
    // Sorted and executable.
    let fns = m.functions();
    assert!(fns.windows(2).all(|w| w[0].addr <= w[1].addr));
    let exec = m.exec_ranges();
    let main = m.lookup("main").unwrap();
    assert!(exec.iter().any(|r| r.contains(&main.addr)));
    assert!(exec.iter().any(|r| r.contains(&m.entry())));
    assert!(!m.plt_ranges().is_empty(), "printf goes through a PLT");
    assert!(m.build_id().is_some_and(|b| !b.is_empty()));

    // Unknown names suggest close ones.
    let e = m.lookup("wrok").unwrap_err();
    assert!(matches!(e, SymbolError::SymbolNotFound { .. }));
    assert!(e.to_string().contains("work"), "{e}");

    // Lines: every address lies in the right function, addr2line agrees.
    let work = m.lookup("work").unwrap();
    let line = line_of(PROG_C, "LINE_WORK");
    for file in ["prog.c", dir.path().join("prog.c").to_str().unwrap()] {
        let addrs = m.line_addresses(file, line).unwrap();
        assert!(!addrs.is_empty());
        for a in &addrs {
            let (s, _) = m.symbolize(*a).unwrap();
            // At -O2 work may be inlined into helper as well.
            assert!(s.name == "work" || s.name == "helper", "{} at {a}", s.name);
            let (f, l) = addr2line(&exe, a.0);
            assert!(f.ends_with("prog.c"), "{f}");
            assert_eq!(l, line, "addr2line at {a}");
            assert_eq!(m.source_location(*a).map(|(_, l)| l), Some(line));
        }
        assert!(addrs.iter().any(|a| work.contains(*a)));
    }
    let loc = m.source_location(work.addr).unwrap();
    assert!(loc.0.ends_with("prog.c"), "{loc:?}");
    assert!(matches!(
        m.line_addresses("prog.c", 2000),
        Err(SymbolError::LineNotFound { .. })
    ));
    let e = m.line_addresses("nosuch.c", line).unwrap_err().to_string();
    assert!(e.contains("nosuch.c"), "{e}");
    assert!(m.line_addresses("rog.c", line).is_err());
}

#[test]
fn pie_o2() {
    check_prog(&["-g", "-O2", "-fPIE", "-pie"], true);
}

#[test]
fn non_pie_o0() {
    check_prog(&["-g", "-O0", "-no-pie"], false);
}

#[test]
fn no_debug_info() {
    let dir = TempDir::new("nodebug");
    let exe = compile(dir.path(), "gcc", "prog.c", PROG_C, "prog", &["-O0"]);
    let m = ElfModule::open(&exe).unwrap();
    assert!(m.lookup("work").is_ok());
    let e = m.line_addresses("prog.c", 7).unwrap_err();
    assert!(matches!(e, SymbolError::NoDebugInfo { .. }), "{e}");
    assert!(e.to_string().contains("-g"));
    assert!(m.source_location(m.lookup("work").unwrap().addr).is_none());
}

#[test]
fn stripped_keeps_dynsym() {
    let dir = TempDir::new("strip");
    let exe = compile(
        dir.path(),
        "gcc",
        "prog.c",
        PROG_C,
        "prog",
        &["-O0", "-rdynamic", "-s"],
    );
    let m = ElfModule::open(&exe).unwrap();
    // -rdynamic exports work in .dynsym; the static helper is gone.
    assert!(m.lookup("work").is_ok());
    assert!(m.lookup("helper").is_err());
}

const LIB_C: &str = r#"
static int hidden(int a) { return a * 7; }

int foo_add(int a, int b) {
    return hidden(a) + b; // LINE_FOO
}

int foo_mul(int a, int b) { return a * b; }
"#;

#[test]
fn shared_library() {
    let dir = TempDir::new("lib");
    let lib = compile(
        dir.path(),
        "gcc",
        "foo.c",
        LIB_C,
        "libfoo.so",
        &["-g", "-O0", "-shared", "-fPIC"],
    );
    let m = ElfModule::open(&lib).unwrap();
    assert!(m.is_pie());
    for f in ["foo_add", "foo_mul", "hidden"] {
        assert_eq!(m.lookup(f).unwrap().addr.0, nm_addr(&lib, f));
    }
    let addrs = m
        .line_addresses("foo.c", line_of(LIB_C, "LINE_FOO"))
        .unwrap();
    assert_eq!(addrs.len(), 1);
    assert!(m.lookup("foo_add").unwrap().contains(addrs[0]));
}

const PROG_CC: &str = r#"
namespace ns {
__attribute__((noinline)) int func(int x) { return x * 3; }
struct K {
    int v;
    __attribute__((noinline)) int method(int y) const { return v + y; }
};
}
int main(int argc, char **) {
    ns::K k{argc};
    return ns::func(argc) + k.method(2);
}
"#;

#[test]
fn cpp_names() {
    let dir = TempDir::new("cpp");
    let exe = compile(
        dir.path(),
        "g++",
        "prog.cc",
        PROG_CC,
        "prog",
        &["-g", "-O1"],
    );
    let m = ElfModule::open(&exe).unwrap();
    let want = nm_addr(&exe, "_ZN2ns4funcEi");
    for name in ["ns::func", "ns::func(int)", "_ZN2ns4funcEi"] {
        let s = m.lookup(name).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(s.addr.0, want, "{name}");
        assert_eq!(s.name, "ns::func(int)");
        assert_eq!(s.raw_name, "_ZN2ns4funcEi");
    }
    let method = m.lookup("ns::K::method").unwrap();
    assert_eq!(method.addr.0, nm_addr(&exe, "_ZNK2ns1K6methodEi"));
    assert_eq!(method.name, "ns::K::method(int) const");
    assert_eq!(m.lookup("ns::K::method(int) const").unwrap(), method);
    assert!(m.lookup("ns").is_err());
}

const PROG_RS: &str = r#"
#[inline(never)]
fn helper(x: u32) -> u32 { x.wrapping_mul(3) }
fn main() { std::process::exit(helper(std::env::args().count() as u32) as i32 & 1) }
"#;

#[test]
fn rust_names() {
    let dir = TempDir::new("rust");
    let exe = compile(
        dir.path(),
        "rustc",
        "rsprog.rs",
        PROG_RS,
        "rsprog",
        &["-C", "opt-level=1"],
    );
    let m = ElfModule::open(&exe).unwrap();
    let s = m.lookup("rsprog::helper").unwrap();
    // Legacy mangling keeps a ::h<hash> suffix, v0 has none.
    assert!(s.name.starts_with("rsprog::helper"), "{}", s.name);
    assert!(s.raw_name.starts_with("_ZN") || s.raw_name.starts_with("_R"));
    assert_eq!(m.lookup(&s.name).unwrap(), s);
    assert_eq!(s.addr.0, nm_addr(&exe, &s.raw_name));
}

#[test]
fn not_elf() {
    let dir = TempDir::new("notelf");
    let p = dir.path().join("x.txt");
    std::fs::write(&p, "hello").unwrap();
    let e = ElfModule::open(&p).unwrap_err();
    assert!(matches!(e, SymbolError::NotElf { .. }), "{e}");
    assert!(e.to_string().contains("x.txt"));
    let e = ElfModule::open(&dir.path().join("missing")).unwrap_err();
    assert!(matches!(e, SymbolError::Io { .. }), "{e}");
}

#[test]
fn libc_with_optional_debug_file() {
    let Some(libc) = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6"]
        .iter()
        .map(std::path::Path::new)
        .find(|p| p.exists())
    else {
        return;
    };
    let m = ElfModule::open(libc).unwrap();
    let getpid = m.lookup("getpid").unwrap();
    assert!(m.is_executable(getpid.addr));
    assert!(m.lookup("malloc").is_ok());
    eprintln!("libc debug file: {:?}", m.debug_file());
    if m.debug_file().is_some() {
        // Local functions only the debug file's .symtab knows.
        assert!(m.functions().len() > 3000);
        assert!(m.source_location(getpid.addr).is_some());
    }
}
