//! A library unloaded under armed probes (issue 21): the program
//! `dlopen`s `libgone.so`, and probes are placed in it while it is loaded
//! (a trap on `gone_trap`, the fast path on `gone_fast`), next to a trap
//! on the program's own `kept`. The program then `dlclose`s the library:
//! one walk of the ledger at that change of the modules finds the sites
//! no mapping holds any more, every mechanism forgets them and a notice
//! says so. The counts before the unload are exact, `kept` counts on, the
//! detach afterwards succeeds and leaves the program's code as the file
//! has it, and the program's output (up to its last line, printed before
//! it waits to end) is its own.

use hotprobe::{Action, MechanismChoice, Session, SpawnOptions};
use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Calls of each library function while it is loaded, and of `kept`
/// after the unload.
const CALLS: u64 = 6;
const KEPT: u64 = 4;

const LIB: &str = r#"
volatile long lib_sink;
__attribute__((noinline)) long gone_trap(long x) { lib_sink += x; return x + 1; }
__attribute__((noinline)) long gone_fast(long x) { lib_sink += x * 7; return x * 3; }
"#;

const MAIN: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>
volatile long sink;
__attribute__((noinline)) long kept(long x) { sink += x * 5; return x - 1; }
static void wait_line(void) {
  char c;
  do { if (read(0, &c, 1) <= 0) _exit(3); } while (c != '\n');
}
int main(int argc, char **argv) {
  setvbuf(stdout, NULL, _IONBF, 0);
  void *h = dlopen(argv[1], RTLD_NOW);
  if (!h) { printf("dlopen: %s\n", dlerror()); return 2; }
  long (*t)(long) = (long (*)(long))dlsym(h, "gone_trap");
  long (*f)(long) = (long (*)(long))dlsym(h, "gone_fast");
  printf("loaded\n");
  wait_line();
  long s = 0;
  for (int i = 0; i < CALLS; i++) s += t(i) + f(i);
  dlclose(h);
  printf("closed %ld\n", s);
  wait_line();
  for (int i = 0; i < KEPT; i++) s += kept(i);
  printf("end %ld\n", s);
  wait_line();
  return 0;
}
"#;

/// The program and its library.
fn build() -> (PathBuf, PathBuf) {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("unmapped_ledger");
    let lib_src = hotprobe_testkit::write_source(&dir, "gone.c", LIB);
    let lib = hotprobe_testkit::compile(
        "gcc",
        &lib_src,
        &dir.join("libgone.so"),
        &["-O2", "-g", "-shared", "-fPIC"],
        &[],
    );
    let main_src = hotprobe_testkit::write_source(&dir, "main.c", MAIN);
    let calls = format!("-DCALLS={CALLS}");
    let kept = format!("-DKEPT={KEPT}");
    let bin = hotprobe_testkit::compile(
        "gcc",
        &main_src,
        &dir.join("unloads"),
        &["-O2", "-g", &calls, &kept],
        &["-ldl"],
    );
    (bin.canonicalize().unwrap(), lib.canonicalize().unwrap())
}

/// The program's lines, and a flag raised at each.
fn reading(out: impl std::io::Read + Send + 'static) -> (Receiver<String>, Arc<AtomicBool>) {
    let seen = Arc::new(AtomicBool::new(false));
    let (tx, lines) = std::sync::mpsc::channel();
    let from = hotprobe_testkit::line_reader(out);
    let s = seen.clone();
    std::thread::spawn(move || {
        while let Ok(l) = from.recv() {
            if tx.send(l).is_err() {
                return;
            }
            s.store(true, Ordering::SeqCst);
        }
    });
    (lines, seen)
}

/// Runs `s` until the program printed a line: that line.
fn next_line(s: &mut Session, lines: &Receiver<String>, seen: &AtomicBool) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(l) = lines.try_recv() {
            seen.store(false, Ordering::SeqCst);
            return l;
        }
        assert!(
            Instant::now() < deadline,
            "no line from the program: {}",
            // Each test here has one target, the first.
            s.pid(hotprobe::TargetId(0))
                .map_or("no process".into(), |p| hotprobe_testkit::threads_at(
                    p as u32, "it"
                ))
        );
        s.set_wait_deadline(Some(Instant::now()));
        s.run_until(seen).unwrap();
    }
}

#[test]
fn a_library_unloaded_under_armed_probes_leaves_the_ledger_in_one_walk() {
    let (bin, lib) = build();
    let native = std::process::Command::new(&bin)
        .arg(&lib)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let native = {
        let mut c = native;
        c.stdin.take().unwrap().write_all(b"go\ngo\ngo\n").unwrap();
        let out = c.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    let mut s = Session::new();
    let (in_r, in_w) = std::io::pipe().unwrap();
    let (out_r, out_w) = std::io::pipe().unwrap();
    let opts = SpawnOptions {
        stdin: Some(File::from(OwnedFd::from(in_r))),
        stdout: Some(File::from(OwnedFd::from(out_w))),
        ..Default::default()
    };
    let t = s
        .spawn_with(&bin, &[lib.to_str().unwrap().into()], &opts)
        .unwrap();
    drop(opts);
    let mut stdin = File::from(OwnedFd::from(in_w));
    let (lines, seen) = reading(out_r);
    s.start().unwrap();
    let mut got = vec![next_line(&mut s, &lines, &seen)];
    assert_eq!(got, ["loaded"]);
    // Placed while the library is loaded: armed at once, not pending.
    let mut place = |spec: &str, choice: MechanismChoice, on: &str| {
        let added = s.add_using(t, spec, Action::Count, choice).unwrap();
        let [p] = &added.placements[..] else {
            panic!("{spec}: {} placements", added.placements.len());
        };
        let mechanism = p.mechanism.to_string();
        assert!(mechanism.starts_with(on), "{spec} on {mechanism}");
        p.id
    };
    let trap = place("gone_trap", MechanismChoice::Trap, "trap");
    let fast = place("gone_fast", MechanismChoice::Auto, "jump");
    let kept = place("kept", MechanismChoice::Trap, "trap");
    let lib_ranges = |s: &mut Session| -> Vec<(u64, u64)> {
        let text = std::fs::read_to_string(format!("/proc/{}/maps", s.pid(t).unwrap())).unwrap();
        let ranges: Vec<(u64, u64)> = text
            .lines()
            .filter(|l| l.ends_with(lib.to_str().unwrap()))
            .map(|l| {
                let (a, b) = l
                    .split_whitespace()
                    .next()
                    .unwrap()
                    .split_once('-')
                    .unwrap();
                (
                    u64::from_str_radix(a, 16).unwrap(),
                    u64::from_str_radix(b, 16).unwrap(),
                )
            })
            .collect();
        ranges
    };
    let in_ranges = |s: &mut Session, ranges: &[(u64, u64)]| {
        s.code_ledger(t)
            .unwrap()
            .iter()
            .filter(|site| ranges.iter().any(|r| (r.0..r.1).contains(&site.start)))
            .count()
    };
    // The library's mappings while it is loaded.
    let ranges = lib_ranges(&mut s);
    assert!(
        in_ranges(&mut s, &ranges) >= 2,
        "the library's sites are in the ledger"
    );
    let sites_before = s.code_ledger(t).unwrap().len();
    stdin.write_all(b"go\n").unwrap();
    got.push(next_line(&mut s, &lines, &seen));
    assert!(got[1].starts_with("closed "), "{got:?}");
    // The sites went with the library, and a notice says so.
    let ledger = s.code_ledger(t).unwrap().to_vec();
    assert!(ledger.len() + 2 <= sites_before, "{ledger:?}");
    assert_eq!(
        in_ranges(&mut s, &ranges),
        0,
        "no site left in the library's range"
    );
    let notices = s.take_notices();
    assert!(
        notices
            .iter()
            .any(|n| n.contains("went with a module the program unloaded")),
        "{notices:?}"
    );
    // The user's two probes there, the trap's guard not counted (it was:
    // 3 for 2 probes).
    assert!(
        notices.iter().any(|n| n.contains(": 2 probe site(s) at ")),
        "{notices:?}"
    );
    for (id, name) in [(trap, "gone_trap"), (fast, "gone_fast")] {
        let st = s.stats(id).unwrap();
        assert_eq!((st.hits, st.nmissed), (CALLS, 0), "{name}: {st:?}");
    }
    // The program's own probe counts on.
    stdin.write_all(b"go\n").unwrap();
    got.push(next_line(&mut s, &lines, &seen));
    assert!(got[2].starts_with("end "), "{got:?}");
    let st = s.stats(kept).unwrap();
    assert_eq!((st.hits, st.nmissed), (KEPT, 0), "kept: {st:?}");
    // The detach walks what is left: it succeeds, and the program's code
    // is the file's again; the program runs on to its end.
    s.detach().unwrap();
    let pid = s.pid(t).unwrap();
    assert_eq!(hotprobe_testkit::text_differences(pid as u32, &bin), vec![]);
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    drop(s);
    let native: Vec<&str> = native.lines().collect();
    assert_eq!(got, native);
}

/// Calls of `f` before the library is unloaded, and after it is loaded
/// again, by tests/programs/reloads.c.
const BEFORE: u64 = 5;
const AFTER: u64 = 7;

/// The reloading program (tests/programs/reloads.c) and its library
/// (`f`, long enough for a jump, with a patchable entry; `g`, too short
/// for a jump and without one: an in-process trap takes it under `auto`;
/// 3 bytes, as a 4-byte one would take a punned jump).
fn build_reload() -> (PathBuf, PathBuf) {
    hotprobe_testkit::reloading_program(
        &PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("unmapped_reload"),
    )
}

/// A probe placed on `func` while its library is loaded, with `choice`: the
/// program unloads the library (its mappings gone, as it says) and loads
/// it again. The probe is made pending at the unload (a notice names
/// it), armed again at the load under its id on the same mechanism, and
/// counts every call, before and after. After detach the reloaded
/// library's code is the file's; the program's output and exit status
/// are its own.
fn reloaded_probe_counts_on(choice: MechanismChoice, on: &str, func: &str) {
    let (bin, lib) = build_reload();
    let native = std::process::Command::new(&bin)
        .args([lib.to_str().unwrap(), "wait"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let native = {
        let mut c = native;
        c.stdin.take().unwrap().write_all(b"go\ngo\n").unwrap();
        let out = c.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(7), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    };
    assert!(native.contains("mappings 0\n"), "{native}");
    let mut s = Session::new();
    let (in_r, in_w) = std::io::pipe().unwrap();
    let (out_r, out_w) = std::io::pipe().unwrap();
    let opts = SpawnOptions {
        stdin: Some(File::from(OwnedFd::from(in_r))),
        stdout: Some(File::from(OwnedFd::from(out_w))),
        ..Default::default()
    };
    let args = [lib.to_str().unwrap().into(), "wait".into()];
    let t = s.spawn_with(&bin, &args, &opts).unwrap();
    drop(opts);
    let pid = s.pid(t).unwrap();
    let mut stdin = File::from(OwnedFd::from(in_w));
    let (lines, seen) = reading(out_r);
    s.start().unwrap();
    let mut got = vec![next_line(&mut s, &lines, &seen)];
    assert_eq!(got, ["loaded"]);
    let added = s.add_using(t, func, Action::Count, choice).unwrap();
    let [placed] = &added.placements[..] else {
        panic!("{} placements", added.placements.len());
    };
    assert!(
        placed.mechanism.to_string().starts_with(on),
        "{on}: {placed:?}"
    );
    assert_ne!(hotprobe_testkit::text_differences(pid as u32, &lib), vec![]);
    stdin.write_all(b"go\n").unwrap();
    got.push(next_line(&mut s, &lines, &seen));
    assert!(got[1].starts_with("closed "), "{got:?}");
    got.push(next_line(&mut s, &lines, &seen));
    assert!(got[2].starts_with("reloaded "), "{got:?}");
    // The unmap notice names the probe; nothing fails to arm.
    let notices = s.take_notices();
    let unloaded: Vec<&String> = notices
        .iter()
        .filter(|n| n.contains("went with a module the program unloaded"))
        .collect();
    assert_eq!(unloaded.len(), 1, "{notices:?}");
    assert!(
        unloaded[0].contains(": 1 probe site(s) at ")
            && unloaded[0].contains(&format!(": {func}: pending, armed again")),
        "{notices:?}"
    );
    assert!(
        !notices.iter().any(|n| n.contains("cannot arm")),
        "{notices:?}"
    );
    // Armed again at the load: its id, its mechanism.
    let armed = s.armed_pending().to_vec();
    assert_eq!(armed.len(), 1, "{armed:?}");
    assert_eq!(armed[0].placement.id, placed.id);
    assert_eq!(armed[0].placement.mechanism, placed.mechanism, "{armed:?}");
    assert_eq!(armed[0].placement.function.as_deref(), Some(func));
    // One row, every call counted.
    let rows = s.as_armed(vec![placed.clone()]);
    assert_eq!(rows.len(), 1);
    let st = s.stats(placed.id).unwrap();
    assert_eq!((st.hits, st.nmissed), (BEFORE + AFTER, 0), "{on}: {st:?}");
    // The reloaded library is probed until detach, the file's after.
    assert_ne!(hotprobe_testkit::text_differences(pid as u32, &lib), vec![]);
    s.detach().unwrap();
    assert_eq!(hotprobe_testkit::text_differences(pid as u32, &lib), vec![]);
    assert_eq!(hotprobe_testkit::text_differences(pid as u32, &bin), vec![]);
    stdin.write_all(b"go\n").unwrap();
    drop(stdin);
    let (_, status) = hotprobe::os::sys::waitpid(pid, 0)
        .expect("waitpid")
        .expect("an exit");
    assert_eq!(status, 7 << 8, "wait status {status:#x}");
    drop(s);
    got.extend(lines.iter());
    let native: Vec<&str> = native.lines().collect();
    assert_eq!(got, native);
}

#[test]
fn a_trap_probe_in_a_reloaded_library_counts_every_call() {
    reloaded_probe_counts_on(MechanismChoice::Trap, "trap", "f");
}

#[test]
fn a_jump_probe_in_a_reloaded_library_counts_every_call() {
    reloaded_probe_counts_on(MechanismChoice::Jump, "jump", "f");
}

#[test]
fn a_patch_probe_in_a_reloaded_library_counts_every_call() {
    reloaded_probe_counts_on(MechanismChoice::Patch, "patch", "f");
}

#[test]
fn an_in_process_trap_in_a_reloaded_library_counts_every_call() {
    reloaded_probe_counts_on(MechanismChoice::Auto, "in-process trap", "g");
}
