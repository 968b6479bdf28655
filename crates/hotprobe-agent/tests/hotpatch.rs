//! End-to-end: a C program built with `-fpatchable-function-entry=5` runs with
//! the agent preloaded; the test plays the tracer without ptrace: it creates
//! the shared memory, waits for the program to say "ready" (it then blocks on
//! stdin, so no thread runs the NOPs), rewrites the NOPs into a `call` to the
//! agent's near stub through /proc/PID/mem, fills the site table, and lets
//! the program go. The program knows nothing about the agent.

use std::fs::OpenOptions;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::{Acquire, Relaxed};

use hotprobe_abi::patch::{call_rel32, NEAR_STUB_ENTRY};
use hotprobe_abi::*;
use object::{Object, ObjectSegment, ObjectSymbol};

fn tmp() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

fn agent_so() -> PathBuf {
    // `cargo test` builds the cdylib next to this test binary, in
    // target/<dir>/<profile>/deps/ (only `cargo build` copies it one level up).
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().join("libhotprobe_agent.so");
    assert!(p.exists(), "{} not built", p.display());
    p
}

fn compile(src: &str, out: &str, flags: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(src);
    hotprobe_testkit::compile("gcc", &src, &tmp().join(out), flags, &["-lpthread"])
}

/// The shared memory: a file in /dev/shm, mapped, removed on drop.
struct ShmFile {
    path: PathBuf,
    shm: Shm,
    ptr: *mut libc::c_void,
    len: usize,
}
impl ShmFile {
    fn new(tag: &str, params: Params) -> ShmFile {
        let l = Layout::new(params).unwrap();
        let path = PathBuf::from(format!(
            "/dev/shm/hotprobe-test-{}-{tag}",
            std::process::id()
        ));
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        f.set_len(l.total_size as u64).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh shared mapping of our file.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                l.total_size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(ptr, libc::MAP_FAILED);
        // SAFETY: valid zeroed mapping, unmapped only in Drop after `shm` is gone.
        let shm = unsafe { Shm::create(ptr as *mut u8, l.total_size, params) }.unwrap();
        ShmFile {
            path,
            shm,
            ptr,
            len: l.total_size,
        }
    }
}
impl Drop for ShmFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        // SAFETY: our mapping; `shm` is not used after this.
        unsafe { libc::munmap(self.ptr, self.len) };
    }
}

/// A child killed on drop.
struct Target {
    child: Child,
    stdout: BufReader<std::process::ChildStdout>,
}
impl Drop for Target {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
impl Target {
    fn spawn(exe: &Path, args: &[&str], shm: Option<&ShmFile>) -> Target {
        let mut c = Command::new(exe);
        c.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some(s) = shm {
            c.env("LD_PRELOAD", agent_so())
                .env("HOTPROBE_SHM_PATH", &s.path);
        }
        let mut child = c.spawn().unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n");
        Target { child, stdout }
    }
    fn pid(&self) -> u32 {
        self.child.id()
    }
    /// Releases the program and returns its last stdout line and stderr.
    fn finish(mut self) -> (String, String) {
        self.child.stdin.take().unwrap().write_all(b"g").unwrap();
        let mut line = String::new();
        self.stdout.read_line(&mut line).unwrap();
        let out = self.child.wait_with_output_ref();
        (line, out)
    }
}
trait WaitRef {
    fn wait_with_output_ref(&mut self) -> String;
}
impl WaitRef for Child {
    fn wait_with_output_ref(&mut self) -> String {
        let mut err = String::new();
        use std::io::Read;
        self.stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        let st = self.wait().unwrap();
        assert!(st.success(), "target failed: {st:?} {err}");
        err
    }
}

/// Link-time address of `sym` and the load bias of `exe` in process `pid`.
fn runtime_addr(exe: &Path, sym: &str, pid: u32) -> u64 {
    let data = std::fs::read(exe).unwrap();
    let obj = object::File::parse(&*data).unwrap();
    let link = obj
        .symbols()
        .find(|s| s.name() == Ok(sym))
        .unwrap()
        .address();
    let min_vaddr = obj.segments().map(|s| s.address()).min().unwrap() & !0xfff;
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let exe = std::fs::canonicalize(exe).unwrap();
    let start = maps
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 6 && Path::new(f[5]) == exe && u64::from_str_radix(f[2], 16) == Ok(0))
                .then(|| u64::from_str_radix(f[0].split('-').next().unwrap(), 16).unwrap())
        })
        .unwrap();
    start - min_vaddr + link
}

/// Rewrites the 5 NOPs at `site` into `call near_stub`; returns the site key.
fn patch(pid: u32, shm: &Shm, site: u64, stub_off: u64) -> u64 {
    let h = shm.header();
    // Acquire pairs with the agent's `status.fetch_or(ATTACHED, Release)`.
    assert_ne!(
        h.status.load(Acquire) & STATUS_ATTACHED,
        0,
        "agent did not attach"
    );
    let near = h.near_page.load(Relaxed);
    assert_ne!(near, 0, "agent mapped no near page");
    let mem = OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/proc/{pid}/mem"))
        .unwrap();
    let mut old = [0u8; 5];
    mem.read_exact_at(&mut old, site).unwrap();
    assert_eq!(old, [0x90; 5], "patchable NOPs expected at {site:#x}");
    let bytes = call_rel32(site, near + stub_off).expect("near stub within ±2 GiB");
    mem.write_all_at(&bytes, site).unwrap();
    site + 5
}

fn expected_checksum(n: u64, t: u64) -> u64 {
    (0..t).map(|id| (id + 6) * n).sum()
}

fn loop_exe() -> PathBuf {
    // Compiled once: tests run in parallel, and rewriting a running
    // executable fails with ETXTBSY.
    static EXE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    EXE.get_or_init(|| {
        compile(
            "loop.c",
            "loop-pfe",
            &["-O2", "-fpatchable-function-entry=5"],
        )
    })
    .clone()
}

#[test]
fn count_is_exact_over_4_threads() {
    let exe = loop_exe();
    const N: u64 = 1_000_000;
    let s = ShmFile::new(
        "count",
        Params {
            n_probes: 4,
            n_site_slots: 16,
            n_threads: 16,
            ring_capacity: 16,
            event_size: EVENT_SIZE_FULL,
        },
    );
    s.shm.header().control.store(CONTROL_ENABLED, Relaxed);
    let t = Target::spawn(&exe, &[&N.to_string(), "4"], Some(&s));
    let site = runtime_addr(&exe, "target_fn", t.pid());
    let key = patch(t.pid(), &s.shm, site, NEAR_STUB_ENTRY);
    s.shm.insert_site(key, 2, ACTION_COUNT).unwrap();
    let (out, err) = t.finish();
    assert_eq!(out, format!("done {}\n", expected_checksum(N, 4)));
    assert_eq!(s.shm.counter(2), 4 * N, "exact count");
    assert_eq!(s.shm.counter(0), 0);
    assert_eq!(s.shm.header().site_misses.load(Relaxed), 0);
    assert_eq!(s.shm.threads_in_use(), 4, "one slot per thread that hit");
    eprintln!("patched count: {err}");
}

fn drain_all(shm: &Shm) -> Vec<Vec<Event>> {
    (0..shm.threads_in_use())
        .map(|t| {
            let mut v = vec![];
            shm.consumer(t).unwrap().drain(|e| v.push(*e)).unwrap();
            v
        })
        .collect()
}

#[test]
fn record_carries_arguments_in_order_per_thread() {
    for event_size in [EVENT_SIZE_FULL, EVENT_SIZE_COMPACT] {
        record_in_order(event_size);
    }
}

/// The generic trampoline writes the slot format of the memory: 6
/// arguments in 64-byte slots, the first 2 in 32-byte ones.
fn record_in_order(event_size: u32) {
    let exe = loop_exe();
    const N: u64 = 1000;
    let s = ShmFile::new(
        &format!("record{event_size}"),
        Params {
            n_probes: 4,
            n_site_slots: 16,
            n_threads: 16,
            ring_capacity: 1024,
            event_size,
        },
    );
    s.shm
        .header()
        .control
        .store(CONTROL_ENABLED | CONTROL_RECORD, Relaxed);
    let t = Target::spawn(&exe, &[&N.to_string(), "4"], Some(&s));
    let pid = t.pid();
    let key = patch(
        pid,
        &s.shm,
        runtime_addr(&exe, "target_fn", pid),
        NEAR_STUB_ENTRY,
    );
    s.shm
        .insert_site(key, 1, ACTION_COUNT | ACTION_RECORD)
        .unwrap();
    let (out, _) = t.finish();
    assert_eq!(out, format!("done {}\n", expected_checksum(N, 4)));
    let rings = drain_all(&s.shm);
    assert_eq!(rings.len(), 4);
    let mut ids = vec![];
    for (slot, evs) in rings.iter().enumerate() {
        assert_eq!(evs.len() as u64, N);
        let tid = s.shm.ring_ctl(slot as u32).unwrap().owner_tid.load(Relaxed);
        assert_ne!(tid, pid, "workers, not the main thread");
        let id = evs[0].args[0];
        ids.push(id);
        for (i, e) in evs.iter().enumerate() {
            let full = event_size == EVENT_SIZE_FULL;
            assert_eq!(
                (e.probe_id, e.kind, e.nargs, e.tid),
                (1, KIND_ENTRY, if full { 6 } else { 2 }, tid)
            );
            if full {
                assert_eq!(e.args, [id, i as u64, 3, 4, 5, 6]);
            } else {
                assert_eq!(e.args, [id, i as u64, 0, 0, 0, 0]);
            }
        }
        assert!(
            evs.windows(2).all(|w| w[0].tsc <= w[1].tsc),
            "time stamps ordered"
        );
    }
    ids.sort();
    assert_eq!(ids, [0, 1, 2, 3]);
    assert_eq!(s.shm.total_drops(), 0);
    assert_eq!(s.shm.counter(1), 4 * N);
}

#[test]
fn full_rings_drop_and_count_without_blocking() {
    let exe = loop_exe();
    const N: u64 = 5000;
    let s = ShmFile::new(
        "drops",
        Params {
            n_probes: 1,
            n_site_slots: 2,
            n_threads: 8,
            ring_capacity: 64,
            event_size: EVENT_SIZE_FULL,
        },
    );
    s.shm
        .header()
        .control
        .store(CONTROL_ENABLED | CONTROL_RECORD, Relaxed);
    let t = Target::spawn(&exe, &[&N.to_string(), "2"], Some(&s));
    let pid = t.pid();
    let key = patch(
        pid,
        &s.shm,
        runtime_addr(&exe, "target_fn", pid),
        NEAR_STUB_ENTRY,
    );
    s.shm.insert_site(key, 0, ACTION_RECORD).unwrap();
    let (out, _) = t.finish();
    assert_eq!(out, format!("done {}\n", expected_checksum(N, 2)));
    let rings = drain_all(&s.shm);
    for (slot, evs) in rings.iter().enumerate() {
        let dropped = s.shm.ring_ctl(slot as u32).unwrap().dropped.load(Relaxed);
        assert_eq!(evs.len(), 64, "first 64 kept");
        assert_eq!(
            evs.len() as u64 + dropped,
            N,
            "every other event counted as dropped"
        );
        assert!(evs.iter().enumerate().all(|(i, e)| e.args[1] == i as u64));
    }
}

#[test]
fn stale_heartbeat_stops_recording_and_the_target_runs_on() {
    let exe = loop_exe();
    const N: u64 = 100_000;
    let s = ShmFile::new(
        "orphan",
        Params {
            n_probes: 1,
            n_site_slots: 2,
            n_threads: 8,
            ring_capacity: 1 << 17,
            event_size: EVENT_SIZE_FULL,
        },
    );
    let h = s.shm.header();
    h.control.store(CONTROL_ENABLED | CONTROL_RECORD, Relaxed);
    // A tracer that "died" long ago: heartbeat 0, timeout 1 tick.
    h.heartbeat_tsc.store(0, Relaxed);
    h.heartbeat_timeout_tsc.store(1, Relaxed);
    let t = Target::spawn(&exe, &[&N.to_string(), "2"], Some(&s));
    let pid = t.pid();
    let key = patch(
        pid,
        &s.shm,
        runtime_addr(&exe, "target_fn", pid),
        NEAR_STUB_ENTRY,
    );
    s.shm
        .insert_site(key, 0, ACTION_COUNT | ACTION_RECORD)
        .unwrap();
    let (out, _) = t.finish();
    assert_eq!(out, format!("done {}\n", expected_checksum(N, 2)));
    assert_ne!(h.status.load(Relaxed) & STATUS_ORPHANED, 0);
    assert_eq!(h.control.load(Relaxed) & CONTROL_RECORD, 0);
    let recorded: usize = drain_all(&s.shm).iter().map(|v| v.len()).sum();
    assert!(
        recorded < 2 * 2048 + 2,
        "recording stopped early: {recorded}"
    );
    assert_eq!(s.shm.counter(0), 2 * N, "counting goes on");
}

#[test]
fn dormant_without_shared_memory_and_unpatched_output_equal() {
    let exe = loop_exe();
    let native = Target::spawn(&exe, &["1000", "3"], None).finish().0;
    let mut c = Command::new(&exe);
    c.args(["1000", "3"])
        .env("LD_PRELOAD", agent_so())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = c.spawn().unwrap();
    child.stdin.take().unwrap().write_all(b"g").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8(out.stdout).unwrap(),
        format!("ready\n{native}")
    );
}

/// Every function the trampolines' fast path and the return trampoline can
/// reach, in the release build, uses general registers only (the
/// trampolines save no vector register unless the slow path runs).
/// In a debug build the trampolines save xmm0-15 on every hit: nothing to
/// check there, so it is ignored, and scripts/test.sh runs it in release.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "the release build's property: scripts/test.sh runs it with --release"
)]
fn fast_path_uses_no_vector_registers() {
    let so = agent_so();
    let dis = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", "-M", "intel"])
        .arg(&so)
        .output()
        .unwrap();
    let text = String::from_utf8(dis.stdout).unwrap();
    let mut funcs = std::collections::HashMap::<String, Vec<String>>::new();
    let mut cur = None;
    for l in text.lines() {
        if let Some(name) = l
            .strip_suffix(">:")
            .and_then(|l| l.split_once(" <"))
            .map(|(_, n)| n.to_string())
        {
            cur = Some(name.clone());
            funcs.entry(name).or_default();
        } else if let Some(c) = &cur {
            funcs.get_mut(c).unwrap().push(l.to_string());
        }
    }
    // Indirect calls through a pointer the loader relocates (`call [rip+x]`
    // with an `R_X86_64_RELATIVE` slot): the slot's address → the agent's
    // function it points to, by address.
    let relocs = Command::new("objdump").arg("-R").arg(&so).output().unwrap();
    let relative: std::collections::HashMap<String, u64> = String::from_utf8(relocs.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let value = w.get(2)?.strip_prefix("*ABS*+0x")?;
            (w.get(1) == Some(&"R_X86_64_RELATIVE")).then(|| {
                let slot = w[0].trim_start_matches('0').to_string();
                (slot, u64::from_str_radix(value, 16).unwrap_or(0))
            })
        })
        .collect();
    let syms = Command::new("nm").arg(&so).output().unwrap();
    let by_addr: std::collections::HashMap<u64, String> = String::from_utf8(syms.stdout)
        .unwrap()
        .lines()
        .filter_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            Some((
                u64::from_str_radix(w.first()?, 16).ok()?,
                w.get(2)?.to_string(),
            ))
        })
        .collect();
    // fast_hit (entry trampolines) and ret_hit (return trampoline, which
    // saves the general registers only).
    let mut todo: Vec<String> = ["fast_hit", "ret_hit"]
        .iter()
        .map(|r| {
            funcs
                .keys()
                .find(|k| k.contains(r))
                .unwrap_or_else(|| panic!("{r} symbol"))
                .clone()
        })
        .collect();
    let mut seen = std::collections::HashSet::new();
    // Who first called each function: the chain from a root is printed when
    // a vector register is found, to say how the fast path got there.
    let mut called_from = std::collections::HashMap::<String, String>::new();
    let chain = |called_from: &std::collections::HashMap<String, String>, f: &str| {
        let mut names = vec![f.to_string()];
        while let Some(caller) = called_from.get(names.last().unwrap()) {
            if names.contains(caller) {
                break;
            }
            names.push(caller.clone());
        }
        names.reverse();
        names.join(" -> ")
    };
    while let Some(f) = todo.pop() {
        if !seen.insert(f.clone()) {
            continue;
        }
        for l in &funcs[&f] {
            assert!(
                !["xmm", "ymm", "zmm"].iter().any(|r| l.contains(r)),
                "{}: {l}",
                chain(&called_from, &f)
            );
            if l.contains("call") {
                if let Some(n) = l.split_once('<').and_then(|(_, n)| n.strip_suffix('>')) {
                    let mut n = n.split('+').next().unwrap().to_string();
                    // `call [rip+x]  # SLOT <_DYNAMIC+...>`: the function the
                    // slot holds.
                    if l.contains("QWORD PTR [rip") {
                        let slot = l
                            .split_once("# ")
                            .map(|(_, r)| r.split(' ').next().unwrap_or(""));
                        if let Some(to) = slot.and_then(|s| relative.get(s)) {
                            n = by_addr.get(to).cloned().unwrap_or(n);
                        }
                    }
                    if n.contains("panic_cannot_unwind") || n.contains("panic_nounwind") {
                        // The compiler's guard after a call that cannot
                        // unwind out of an extern "C" function: it aborts.
                        continue;
                    }
                    if n.starts_with("abort@") {
                        // ret_hit's lost return: never comes back.
                        continue;
                    }
                    assert!(
                        funcs.contains_key(&n),
                        "fast path calls outside the agent: {}: {l}",
                        chain(&called_from, &f)
                    );
                    called_from.entry(n.clone()).or_insert_with(|| f.clone());
                    todo.push(n);
                }
            }
        }
    }
    eprintln!("checked {} functions: {:?}", seen.len(), seen);
}

/// Not a test: ns per call of the 1-thread loop, native vs patched `count`
/// vs `count+record`. Run with
/// `cargo test --release -p hotprobe-agent --test hotpatch -- --ignored --nocapture bench`
/// (add `--features noop` for the bare trampoline).
#[test]
#[ignore]
fn bench_ns_per_call() {
    let exe = loop_exe();
    let n = std::env::var("BENCH_N").unwrap_or("10000000".into());
    let native = Target::spawn(&exe, &[&n, "1"], None).finish().1;
    eprintln!("native: {}", native.trim());
    for (name, action) in [
        ("count", ACTION_COUNT),
        ("count+record", ACTION_COUNT | ACTION_RECORD),
    ] {
        let s = ShmFile::new(
            name,
            Params {
                n_probes: 1,
                n_site_slots: 2,
                n_threads: 4,
                ring_capacity: 1 << 20,
                event_size: EVENT_SIZE_FULL,
            },
        );
        s.shm
            .header()
            .control
            .store(CONTROL_ENABLED | CONTROL_RECORD, Relaxed);
        let t = Target::spawn(&exe, &[&n, "1"], Some(&s));
        let pid = t.pid();
        let key = patch(
            pid,
            &s.shm,
            runtime_addr(&exe, "target_fn", pid),
            NEAR_STUB_ENTRY,
        );
        s.shm.insert_site(key, 0, action).unwrap();
        let err = t.finish().1;
        eprintln!("{name}: {} (count {})", err.trim(), s.shm.counter(0));
    }
}
