//! Patterns through `ProcessResolver` on a running gcc-compiled program:
//! `comp*` gives exactly the `comp...` functions of the main executable, one
//! per address, at the addresses the program prints; matches the checks
//! refuse are still returned; no match and bad patterns are errors.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hotprobe_resolve::{ProcessResolver, Resolver};
use hotprobe_symbols::{ProbeSpec, ResolvedProbe, SymbolError};
use hotprobe_target::{
    Registers, ResumeMode, RuntimeAddr, Target, TargetError, TargetEvent, ThreadId,
};

const PROG_C: &str = r#"#include <stdio.h>
#include <unistd.h>

__attribute__((noinline)) int compute(int x) { return x * 3 + 1; }
int compute_alias(int x) __attribute__((alias("compute")));
__attribute__((noinline)) int compare(int a, int b) { return a < b; }
__attribute__((noinline)) static int compress(int x) { return x >> 1; }
__attribute__((noinline)) int decompose(int x) { return x - 1; }
__attribute__((noinline)) int recompute(int x) { return compute(x) + 1; }
__attribute__((noinline)) int Comp(int x) { return x; }

int main(void) {
    printf("%p %p %p\n", (void *)&compute, (void *)&compare, (void *)&compress);
    fflush(stdout);
    int c = getchar(); /* block until the test closes stdin */
    return compute(c) + compare(c, 1) + compress(c) + decompose(c) + recompute(c) + Comp(c)
           + getppid() == 0;
}
"#;

/// The program, running until dropped; the addresses it printed.
struct Running {
    child: Child,
    compute: u64,
    compare: u64,
    compress: u64,
    _dir: TempDir,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn start() -> Running {
    let dir = std::env::temp_dir().join(format!("hotprobe-resolve-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let dir = TempDir(dir);
    let src = dir.0.join("prog.c");
    std::fs::write(&src, PROG_C).unwrap();
    let exe = dir.0.join("prog");
    // No endbr64: `+0x2` is then inside `mov %rsp,%rbp` of every function.
    hotprobe_testkit::compile(
        "gcc",
        &src,
        &exe,
        &["-g", "-O0", "-fcf-protection=none"],
        &[],
    );
    let mut child = Command::new(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let n: Vec<u64> = line
        .split_whitespace()
        .map(|s| u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap())
        .collect();
    assert_eq!(n.len(), 3, "{line}");
    Running {
        child,
        compute: n[0],
        compare: n[1],
        compress: n[2],
        _dir: dir,
    }
}

/// A target that only reads memory (through /proc/PID/mem), for checks.
struct MemOnly(u32);

impl MemOnly {
    fn no(&self) -> TargetError {
        TargetError::Protocol {
            target: self.describe(),
            why: "read-only test target".into(),
        }
    }
}

impl Target for MemOnly {
    fn describe(&self) -> String {
        format!("pid {}", self.0)
    }
    fn threads(&self) -> Vec<ThreadId> {
        Vec::new()
    }
    fn read_memory(&mut self, addr: RuntimeAddr, buf: &mut [u8]) -> Result<(), TargetError> {
        let mem = Path::new("/proc").join(self.0.to_string()).join("mem");
        std::fs::File::open(mem)
            .and_then(|f| f.read_exact_at(buf, addr.0))
            .map_err(|_| TargetError::Memory {
                op: "read",
                addr: addr.0,
                len: buf.len(),
                target: self.describe(),
            })
    }
    fn write_memory(&mut self, _: RuntimeAddr, _: &[u8]) -> Result<(), TargetError> {
        Err(self.no())
    }
    fn registers(&mut self, _: ThreadId) -> Result<Registers, TargetError> {
        Err(self.no())
    }
    fn set_registers(&mut self, _: ThreadId, _: &Registers) -> Result<(), TargetError> {
        Err(self.no())
    }
    fn resume(&mut self, _: ThreadId, _: ResumeMode) -> Result<(), TargetError> {
        Err(self.no())
    }
    fn wait(&mut self, _: Option<Duration>) -> Result<TargetEvent, TargetError> {
        Err(self.no())
    }
    fn insert_breakpoint(&mut self, _: RuntimeAddr) -> Result<(), TargetError> {
        Err(self.no())
    }
    fn remove_breakpoint(&mut self, _: RuntimeAddr) -> Result<(), TargetError> {
        Err(self.no())
    }
    fn stop_all(&mut self) -> Result<(), TargetError> {
        Err(self.no())
    }
    fn resume_all(&mut self) -> Result<(), TargetError> {
        Err(self.no())
    }
    fn detach(&mut self) -> Result<(), TargetError> {
        Ok(())
    }
}

fn resolve(
    r: &mut ProcessResolver,
    t: &mut MemOnly,
    spec: &str,
) -> Result<Vec<ResolvedProbe>, SymbolError> {
    let spec: ProbeSpec = spec.parse().unwrap();
    r.resolve(&spec, t)
}

#[test]
fn process_patterns() {
    let p = start();
    let pid = p.child.id();
    let mut r = ProcessResolver::new(pid as i32).unwrap();
    let mut t = MemOnly(pid);

    // Exactly compute (or its alias: one per address), compare, compress:
    // not recompute, decompose or Comp, nothing from the libraries.
    let found = resolve(&mut r, &mut t, "comp*").unwrap();
    let addrs: BTreeSet<u64> = found.iter().map(|f| f.addr.0).collect();
    assert_eq!(found.len(), 3, "{found:#?}");
    assert_eq!(addrs, BTreeSet::from([p.compute, p.compare, p.compress]));
    let main = r.symbols().main_module().unwrap().name.clone();
    for f in &found {
        let name = f.function.as_deref().unwrap();
        match f.addr.0 {
            a if a == p.compute => assert!(["compute", "compute_alias"].contains(&name)),
            a if a == p.compare => assert_eq!(name, "compare"),
            _ => assert_eq!(name, "compress"),
        }
        assert_eq!(f.module, main);
        assert_eq!(f.offset, 0);
        assert!(!f.is_return);
        assert!(f.function_range.is_some());
        assert_eq!(r.check(f, &mut t), Ok(()), "{f}");
    }
    // The same functions through a qualified, `?` and class pattern.
    let by = |spec: &str, r: &mut ProcessResolver, t: &mut MemOnly| -> BTreeSet<u64> {
        resolve(r, t, spec)
            .unwrap()
            .iter()
            .map(|f| f.addr.0)
            .collect()
    };
    assert_eq!(by(&format!("{main}:comp*"), &mut r, &mut t), addrs);
    assert_eq!(by("compute*", &mut r, &mut t), BTreeSet::from([p.compute]));
    assert_eq!(by("compre??", &mut r, &mut t), BTreeSet::from([p.compress]));
    assert_eq!(
        by("comp[abc]re", &mut r, &mut t),
        BTreeSet::from([p.compare])
    );
    assert_eq!(
        by("comp*%return", &mut r, &mut t),
        addrs,
        "return probes on every match"
    );

    // A library pattern searches that library.
    let libc = resolve(&mut r, &mut t, "libc:getpp*").unwrap();
    assert!(libc
        .iter()
        .any(|f| f.function.as_deref() == Some("getppid")));
    assert!(libc.iter().all(|f| f.module.starts_with("libc")));
    assert!(libc
        .iter()
        .all(|f| f.function.as_deref().unwrap().starts_with("getpp")));

    // Matches the checks refuse are still returned: `+0x2` is inside the
    // `mov %rsp,%rbp` after `push %rbp` of each.
    let inside = resolve(&mut r, &mut t, "comp*+0x2").unwrap();
    assert_eq!(inside.len(), 3);
    for f in &inside {
        assert_eq!(f.offset, 2);
        let e = r.check(f, &mut t).unwrap_err();
        assert!(e.contains("middle of an instruction"), "{e}");
    }

    // No match, and a bad pattern: errors naming the pattern.
    let e = resolve(&mut r, &mut t, "nothing_like_this*").unwrap_err();
    assert!(matches!(e, SymbolError::NoMatch { .. }), "{e}");
    assert!(e.to_string().contains("nothing_like_this*"), "{e}");
    let e = resolve(&mut r, &mut t, "comp[z-a]").unwrap_err();
    assert!(matches!(e, SymbolError::BadPattern(_)), "{e}");
    assert!(e.to_string().contains("comp[z-a]"), "{e}");
    // Plain names resolve as before.
    let one = resolve(&mut r, &mut t, "compute").unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].addr.0, p.compute);
}
