//! Instruction boundaries and function entries through `ProcessResolver`
//! on a running gcc -O2 program with a `.cold` partition, whole and
//! stripped (with and without `.eh_frame`): an address is accepted where
//! decoding from a known boundary (the function's start, else the FDE's)
//! lands on it, refused otherwise unless forced; the blacklist holds even
//! when forced; entries are told from cold parts.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use hotprobe_resolve::{
    check_probe_point, BlacklistEntry, CheckOptions, ProcessResolver, Resolver,
};
use hotprobe_symbols::{BoundarySource, FunctionKind, ProbeSpec, ResolvedProbe};
use hotprobe_target::{
    Registers, ResumeMode, RuntimeAddr, Target, TargetError, TargetEvent, ThreadId,
};

struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `coldsplit serve`, running until dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Running {
    fn start(exe: &Path) -> Running {
        let mut child = Command::new(exe)
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert!(line.starts_with("ready "), "{line}");
        Running(child)
    }
    fn pid(&self) -> u32 {
        self.0.id()
    }
}

fn gcc(dir: &Path, out: &str, flags: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/coldsplit.c");
    hotprobe_testkit::compile("gcc", &src, &dir.join(out), flags, &[])
}

fn strip(exe: &Path, out: &Path) {
    let o = Command::new("strip")
        .arg("-o")
        .arg(out)
        .arg(exe)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn nm(exe: &Path, name: &str) -> u64 {
    let o = Command::new("nm").arg(exe).output().unwrap();
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] == name).then(|| u64::from_str_radix(f[0], 16).unwrap())
        })
        .unwrap_or_else(|| panic!("no {name} in {}", exe.display()))
}

fn one(r: &mut ProcessResolver, t: &mut MemOnly, spec: &str) -> ResolvedProbe {
    let parsed: ProbeSpec = spec.parse().unwrap();
    let mut v = r
        .resolve(&parsed, t)
        .unwrap_or_else(|e| panic!("{spec}: {e}"));
    assert_eq!(v.len(), 1, "{spec}: {v:#?}");
    v.remove(0)
}

const FORCE: CheckOptions = CheckOptions { force: true };

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

#[test]
fn boundaries_and_entries_with_symbols() {
    let dir = std::env::temp_dir().join(format!("hotprobe-resolve-b1-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dir = TempDir(dir);
    let exe = gcc(&dir.0, "coldsplit", &["-O2", "-g"]);
    let p = Running::start(&exe);
    let mut r = ProcessResolver::new(p.pid() as i32).unwrap();
    let mut t = MemOnly(p.pid());

    let g = one(&mut r, &mut t, "g");
    assert!(g.is_entry(), "{g:#?}");
    assert_eq!(g.kind, Some(FunctionKind::Entry));
    assert_eq!(r.check(&g, &mut t), Ok(()));

    let cold = one(&mut r, &mut t, "g.cold");
    assert!(!cold.is_entry());
    assert_eq!(
        cold.kind,
        Some(FunctionKind::ColdPart { parent: "g".into() })
    );
    assert!(
        cold.not_entry
            .as_deref()
            .unwrap()
            .starts_with("g.cold is a cold partition of g"),
        "{cold:#?}"
    );
    let b = cold.boundary.clone().unwrap();
    assert_eq!(b.start, cold.addr);
    assert_eq!(b.source, BoundarySource::Function("g.cold".into()));
    // Counting at its start is fine: it starts an instruction.
    assert_eq!(r.check(&cold, &mut t), Ok(()));
    // g.cold's first instruction is longer than a byte: +1 is inside it.
    let inside = one(&mut r, &mut t, "g.cold+1");
    assert!(!inside.is_entry());
    let e = r.check(&inside, &mut t).unwrap_err();
    assert!(
        e.contains("is in the middle of an instruction (decoded from g.cold's start"),
        "{e}"
    );
    assert_eq!(r.check_with(&inside, &mut t, FORCE), Ok(()));

    // The label: a boundary (decoded from asm_twice), not an entry.
    let label = one(&mut r, &mut t, "asm_twice_done");
    assert_eq!(label.kind, Some(FunctionKind::Label));
    assert!(!label.is_entry());
    assert_eq!(
        label.boundary.as_ref().unwrap().source,
        BoundarySource::Function("asm_twice".into())
    );
    assert_eq!(r.check(&label, &mut t), Ok(()));

    // Forcing never passes the blacklist.
    let bl = [BlacklistEntry {
        start: g.addr,
        end: RuntimeAddr(g.addr.0 + 1),
        what: "test".into(),
    }];
    let e = check_probe_point(&g, &bl, &mut t, FORCE).unwrap_err();
    assert!(e.contains("blacklisted"), "{e}");
}

#[test]
fn stripped_binaries_decode_from_fdes_or_refuse() {
    let dir = std::env::temp_dir().join(format!("hotprobe-resolve-b2-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let dir = TempDir(dir);
    let exe = gcc(&dir.0, "coldsplit", &["-O2"]);
    let (g, cold) = (nm(&exe, "g"), nm(&exe, "g.cold"));
    let stripped = dir.0.join("stripped");
    strip(&exe, &stripped);
    let p = Running::start(&stripped);
    let mut r = ProcessResolver::new(p.pid() as i32).unwrap();
    let mut t = MemOnly(p.pid());

    // g's start: an FDE start with the return address on top.
    let at_g = one(&mut r, &mut t, &format!("stripped:{g:#x}"));
    assert_eq!(at_g.function, None);
    assert!(at_g.is_entry(), "{at_g:#?}");
    let b = at_g.boundary.clone().unwrap();
    assert_eq!((b.start, b.source), (at_g.addr, BoundarySource::Fde));
    assert_eq!(r.check(&at_g, &mut t), Ok(()));

    // g.cold's start: an FDE start entered with g's registers pushed.
    let at_cold = one(&mut r, &mut t, &format!("stripped:{cold:#x}"));
    let why = at_cold.not_entry.clone().unwrap();
    assert!(
        why.contains("starts an .eh_frame FDE but has no symbol, and [rsp] is not the return address there (CFA = rsp+"),
        "{why}"
    );
    assert_eq!(r.check(&at_cold, &mut t), Ok(()));
    // Inside its first instruction: decoded from the FDE start.
    let inside = one(&mut r, &mut t, &format!("stripped:{:#x}", cold + 1));
    let e = r.check(&inside, &mut t).unwrap_err();
    assert!(
        e.contains(&format!(
            "is in the middle of an instruction (decoded from the FDE start {:#x})",
            at_cold.addr.0
        )),
        "{e}"
    );
    assert_eq!(r.check_with(&inside, &mut t, FORCE), Ok(()));
    drop(p);

    // No unwind tables: nothing is known about g.
    let bare = gcc(
        &dir.0,
        "bare",
        &[
            "-O2",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
        ],
    );
    let g = nm(&bare, "g");
    let bare_stripped = dir.0.join("bare_stripped");
    strip(&bare, &bare_stripped);
    let p = Running::start(&bare_stripped);
    let mut r = ProcessResolver::new(p.pid() as i32).unwrap();
    let mut t = MemOnly(p.pid());
    let at_g = one(&mut r, &mut t, &format!("bare_stripped:{g:#x}"));
    assert_eq!(at_g.boundary, None);
    assert!(!at_g.is_entry());
    let e = r.check(&at_g, &mut t).unwrap_err();
    assert!(
        e.starts_with(&format!(
            "no known instruction boundary before {:#x} (bare_stripped:{g:#x})",
            at_g.addr.0
        )) && e.ends_with("pass --force to probe it anyway"),
        "{e}"
    );
    assert_eq!(r.check_with(&at_g, &mut t, FORCE), Ok(()));
}
