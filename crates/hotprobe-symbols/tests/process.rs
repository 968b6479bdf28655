//! ProcessSymbols against real running processes (PIE and non-PIE, with a
//! shared library): resolved addresses must equal what the program prints.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use common::*;
use hotprobe_symbols::{
    parse_maps, ModuleCache, ProbeSpec, ProcessSymbols, RuntimeAddr, SymbolError,
};

const LIB_C: &str = r#"
int foo_add(int a, int b) {
    return a + b; // LINE_FOO
}
"#;

const PROG_C: &str = r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

int foo_add(int a, int b);

__attribute__((noinline)) int work(int x) {
    return x * 3 + 1; // LINE_WORK
}

int main(void) {
    /* RTLD_NEXT finds libc's own getpid, not a canonical PLT entry. */
    printf("%p %p %p %p\n", dlsym(RTLD_NEXT, "getpid"), (void *)&main,
           (void *)&work, dlsym(RTLD_DEFAULT, "foo_add"));
    fflush(stdout);
    int c = getchar(); /* block until the test closes stdin */
    return work(c) + foo_add(c, 1) + getpid() == 0;
}
"#;

struct Running {
    child: Child,
    getpid: u64,
    main: u64,
    work: u64,
    foo_add: u64,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(dir: &TempDir, pie: bool) -> (Running, std::path::PathBuf) {
    compile(
        dir.path(),
        "gcc",
        "foo.c",
        LIB_C,
        "libfoo.so",
        &["-g", "-O0", "-shared", "-fPIC"],
    );
    let rpath = format!("-Wl,-rpath,{}", dir.path().display());
    let libdir = format!("-L{}", dir.path().display());
    let mut flags = vec!["-g", rpath.as_str(), libdir.as_str()];
    flags.extend(if pie {
        ["-O2", "-fPIE", "-pie"]
    } else {
        ["-O0", "-fno-pie", "-no-pie"]
    });
    let src = dir.path().join("prog.c");
    std::fs::write(&src, PROG_C).unwrap();
    let exe = dir.path().join("prog");
    hotprobe_testkit::compile("gcc", &src, &exe, &flags, &["-lfoo", "-ldl"]);
    let mut child = Command::new(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let nums: Vec<u64> = line
        .split_whitespace()
        .map(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap())
        .collect();
    assert_eq!(nums.len(), 4, "{line}");
    (
        Running {
            child,
            getpid: nums[0],
            main: nums[1],
            work: nums[2],
            foo_add: nums[3],
        },
        exe,
    )
}

fn one(ps: &ProcessSymbols, spec: &str) -> hotprobe_symbols::ResolvedProbe {
    let spec: ProbeSpec = spec.parse().unwrap();
    let mut v = ps
        .resolve(&spec)
        .unwrap_or_else(|e| panic!("resolve {spec}: {e}"));
    assert_eq!(v.len(), 1, "{spec}: {v:?}");
    v.remove(0)
}

fn check_process(pie: bool) {
    let dir = TempDir::new(if pie { "pie" } else { "nopie" });
    let (run, exe) = start(&dir, pie);
    let pid = run.child.id();
    let ps = ProcessSymbols::for_pid(pid).unwrap();

    let main_mod = ps.main_module().expect("main module");
    assert_eq!(main_mod.name, "prog");
    assert_eq!(main_mod.module.is_pie(), pie);
    if !pie {
        assert_eq!(main_mod.bias.0, 0);
    } else {
        assert_ne!(main_mod.bias.0, 0);
        assert_eq!(main_mod.bias.0 % 4096, 0);
    }

    let p = one(&ps, "main");
    assert_eq!(p.addr, RuntimeAddr(run.main));
    assert_eq!(p.module, "prog");
    assert_eq!(p.function.as_deref(), Some("main"));
    assert!(!p.in_plt && !p.is_return);
    let r = p.function_range.clone().unwrap();
    assert_eq!(r.start, p.addr);

    assert_eq!(one(&ps, "work").addr, RuntimeAddr(run.work));
    assert_eq!(one(&ps, "prog:work").addr, RuntimeAddr(run.work));
    let w1 = one(&ps, "work+1");
    assert_eq!((w1.addr.0, w1.offset), (run.work + 1, 1));
    assert!(one(&ps, "work%return").is_return);
    let e = ps.resolve(&"work+0x4000".parse().unwrap()).unwrap_err();
    assert!(matches!(e, SymbolError::OffsetPastEnd { .. }), "{e}");
    assert!(e.to_string().contains("past the end of work"), "{e}");

    // getpid lives in libc; the executable's PLT does not count.
    let g = one(&ps, "getpid");
    assert_eq!(g.addr, RuntimeAddr(run.getpid), "getpid");
    assert!(g.module.starts_with("libc"), "{}", g.module);
    assert_eq!(one(&ps, "libc:getpid").addr, RuntimeAddr(run.getpid));
    assert_eq!(one(&ps, "libc.so.6:getpid").addr, RuntimeAddr(run.getpid));

    // The shared library.
    let f = one(&ps, "libfoo:foo_add");
    assert_eq!(f.addr, RuntimeAddr(run.foo_add));
    assert_eq!(one(&ps, "foo_add").addr, RuntimeAddr(run.foo_add));
    let lib = ps.find_module("libfoo").unwrap();
    let link = lib.module.lookup("foo_add").unwrap().addr;
    let by_addr = one(&ps, &format!("libfoo.so:{link}"));
    assert_eq!(by_addr.addr, RuntimeAddr(run.foo_add));
    assert_eq!(by_addr.function.as_deref(), Some("foo_add"));
    let abs = one(&ps, &format!("{:#x}", run.foo_add));
    assert_eq!((abs.module.as_str(), abs.link_addr), ("libfoo.so", link));

    // Lines, in the executable and in the library.
    let lw = one(&ps, &format!("prog.c:{}", line_of(PROG_C, "LINE_WORK")));
    assert_eq!(lw.function.as_deref(), Some("work"));
    assert!(lw.function_range.unwrap().contains(&lw.addr));
    let lf = one(&ps, &format!("foo.c:{}", line_of(LIB_C, "LINE_FOO")));
    assert_eq!(
        (lf.module.as_str(), lf.function.as_deref()),
        ("libfoo.so", Some("foo_add"))
    );
    assert!(lf.addr.0 > run.foo_add);
    let e = ps.resolve(&"prog.c:3000".parse().unwrap()).unwrap_err();
    assert!(matches!(e, SymbolError::LineNotFound { .. }), "{e}");

    // Symbolize.
    let s = ps.symbolize(RuntimeAddr(run.main + 0x3)).unwrap();
    assert_eq!(s.to_string(), "main+0x3 [prog]");
    assert_eq!(
        ps.symbolize(RuntimeAddr(run.main)).unwrap().to_string(),
        "main [prog]"
    );
    let s = ps.symbolize(RuntimeAddr(run.getpid)).unwrap();
    assert!(s.module.starts_with("libc"));
    assert_eq!(s.offset, 0);
    assert!(ps.symbolize(RuntimeAddr(1)).is_none());

    // Modules.
    assert!(ps.find_module("prog").is_ok());
    let e = ps.find_module("nosuchlib").unwrap_err().to_string();
    assert!(e.contains("libc.so.6") && e.contains("prog"), "{e}");
    let e = ps
        .resolve(&"no_such_function".parse().unwrap())
        .unwrap_err();
    assert!(matches!(e, SymbolError::SymbolNotFound { .. }), "{e}");
    assert!(ps.resolve(&"0x10".parse().unwrap()).is_err());
    // The PLT: executable ranges contain it; the address is flagged.
    let plt = main_mod.module.plt_ranges();
    if let Some(r) = plt.first() {
        let p = one(&ps, &format!("prog:{}", r.start));
        assert!(p.in_plt);
    }

    // from_maps with an explicit cache gives the same answers and caches.
    let maps = hotprobe_symbols::read_maps(pid).unwrap();
    let cache = ModuleCache::new();
    let ps2 = ProcessSymbols::from_maps_with(&maps, &exe, &cache).unwrap();
    let n = cache.len();
    assert!(n >= 3, "{n}");
    let ps3 = ProcessSymbols::from_maps_with(&maps, &exe, &cache).unwrap();
    assert_eq!(cache.len(), n);
    assert!(std::sync::Arc::ptr_eq(
        &ps2.main_module().unwrap().module,
        &ps3.main_module().unwrap().module
    ));
    assert_eq!(one(&ps2, "getpid").addr, RuntimeAddr(run.getpid));
    // Each executable mapping's own bias equals the module's, and so does
    // the bias explaining all of a module's mappings.
    for lm in ps.modules() {
        let mine: Vec<_> = maps
            .iter()
            .filter(|m| m.path.as_deref() == Some(lm.path.as_path()))
            .collect();
        assert_eq!(lm.module.load_bias_for(mine.iter().copied()), Some(lm.bias));
        for m in mine.iter().filter(|m| m.perms.exec) {
            assert_eq!(
                lm.module.load_bias(m),
                Some(lm.bias),
                "{} at {}",
                lm.name,
                m.start
            );
        }
    }
}

#[test]
fn pie_process() {
    check_process(true);
}

#[test]
fn non_pie_process() {
    check_process(false);
}

#[test]
fn from_maps_text_skips_what_it_cannot_open() {
    let maps = parse_maps(
        "7f0000000000-7f0000001000 r-xp 00000000 08:01 5 /nonexistent/lib.so\n\
         7f0000001000-7f0000002000 r-xp 00000000 00:00 0 [vdso]\n",
    )
    .unwrap();
    let ps = ProcessSymbols::from_maps(&maps, std::path::Path::new("/nonexistent/prog")).unwrap();
    assert!(ps.modules().is_empty());
    assert!(ps.main_module().is_none());
    assert!(ps.find_module("lib").is_err());
}

#[test]
fn own_process() {
    let ps = ProcessSymbols::for_pid(std::process::id()).unwrap();
    let main = ps.main_module().expect("the test binary");
    assert!(main.name.starts_with("process"), "{}", main.name);
    let p = one(&ps, "getpid");
    assert_eq!(p.addr.0, libc_getpid_addr());
}

fn libc_getpid_addr() -> u64 {
    extern "C" {
        fn getpid() -> i32;
    }
    getpid as *const () as usize as u64
}

/// Loads `argv[1]` (a shared library) from a memfd named `libmemfoo.so`
/// through `/proc/self/fd/N`, prints `foo_add`'s address, closes the memfd
/// unless `argv[2]` is `keep`, and waits for stdin to close.
const MEMFD_PROG_C: &str = r#"#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    FILE *f = fopen(argv[1], "rb");
    int fd = memfd_create("libmemfoo.so", MFD_CLOEXEC);
    char buf[65536];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0)
        if (write(fd, buf, n) != (ssize_t)n)
            return 2;
    fclose(f);
    char path[64];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    void *h = dlopen(path, RTLD_NOW);
    if (!h)
        return 3;
    if (strcmp(argv[2], "keep") != 0)
        close(fd);
    printf("%p\n", dlsym(h, "foo_add"));
    fflush(stdout);
    getchar();
    return 0;
}
"#;

/// A library loaded from a memfd (`/memfd:libmemfoo.so (deleted)` in the
/// maps, like the hotprobe agent) is a module named `libmemfoo.so`, read
/// through the process's descriptor while it keeps one, else through
/// `/proc/PID/map_files` (privileged; skipped otherwise).
#[test]
fn library_loaded_from_a_memfd() {
    let dir = TempDir::new("memfd");
    let lib = compile(
        dir.path(),
        "gcc",
        "foo.c",
        LIB_C,
        "libfoo.so",
        &["-g", "-O0", "-shared", "-fPIC"],
    );
    let exe = compile(
        dir.path(),
        "gcc",
        "memfd.c",
        MEMFD_PROG_C,
        "memfd",
        &["-O2", "-ldl"],
    );
    for mode in ["keep", "close"] {
        let mut child = Command::new(&exe)
            .arg(&lib)
            .arg(mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let foo_add = u64::from_str_radix(line.trim().trim_start_matches("0x"), 16)
            .unwrap_or_else(|_| panic!("{mode}: {line:?}"));
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
        assert!(
            maps.contains("/memfd:libmemfoo.so (deleted)"),
            "{mode}: {maps}"
        );
        let ps = ProcessSymbols::for_pid(child.id()).unwrap();
        let range = maps
            .lines()
            .find(|l| l.contains("/memfd:libmemfoo.so"))
            .and_then(|l| l.split_whitespace().next())
            .unwrap();
        let map_files = format!("/proc/{}/map_files/{range}", child.id());
        let readable = mode == "keep" || std::fs::File::open(map_files).is_ok();
        if readable {
            let m = ps.find_module("libmemfoo").unwrap();
            assert_eq!(m.name, "libmemfoo.so", "{mode}");
            assert_eq!(one(&ps, "libmemfoo:foo_add").addr, RuntimeAddr(foo_add));
            assert_eq!(
                ps.symbolize(RuntimeAddr(foo_add)).unwrap().to_string(),
                "foo_add [libmemfoo.so]"
            );
        } else {
            eprintln!("{mode}: /proc/PID/map_files not readable here; module skipped");
        }
        drop(child.stdin.take());
        assert!(child.wait().unwrap().success());
    }
}

/// A module glob resolves in every matching module (issue 14): `'*:malloc'`
/// finds libc's malloc, `'lib*:*'` leaves out the main executable (not a
/// `lib*` file), `'*:*'` covers several modules, a glob matching no module
/// is `NoMatch`.
#[test]
fn module_globs_resolve_in_every_matching_module() {
    let ps = ProcessSymbols::for_pid(std::process::id()).unwrap();
    let malloc = ps.resolve(&"*:malloc".parse().unwrap()).unwrap();
    assert!(
        malloc
            .iter()
            .any(|p| p.module == "libc.so.6" && p.function.as_deref() == Some("malloc")),
        "{malloc:?}"
    );
    let main = ps.main_module().unwrap().name.clone();
    let libs = ps.resolve(&"lib*:*".parse().unwrap()).unwrap();
    assert!(libs.iter().all(|p| p.module.starts_with("lib")));
    assert!(libs.iter().any(|p| p.module == "libc.so.6"));
    let all = ps.resolve(&"*:*".parse().unwrap()).unwrap();
    let modules: std::collections::BTreeSet<&str> = all.iter().map(|p| p.module.as_str()).collect();
    assert!(
        modules.contains(main.as_str()) && modules.contains("libc.so.6") && modules.len() >= 3,
        "{modules:?}"
    );
    assert!(all.len() > libs.len());
    let e = ps.resolve(&"nomodule*:*".parse().unwrap()).unwrap_err();
    assert!(matches!(e, SymbolError::NoMatch { .. }), "{e}");
}
