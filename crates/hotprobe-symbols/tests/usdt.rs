//! USDT markers read from `.note.stapsdt`, checked against binutils'
//! `readelf -n` on a program compiled with `<sys/sdt.h>` (semaphore,
//! register, memory and constant operands), on python3 and on libstdc++.

mod common;

use common::*;
use hotprobe_symbols::{usdt_markers, UsdtMarker, UsdtOperand};
use std::path::Path;
use std::process::Command;

const PROG_C: &str = r#"#define _SDT_HAS_SEMAPHORES 1
#include <sys/sdt.h>
#include <stdio.h>
unsigned short demo_tick_semaphore __attribute__((unused)) __attribute__((section(".probes")));
unsigned short demo_done_semaphore __attribute__((unused)) __attribute__((section(".probes")));
long total;
__attribute__((noinline)) void tick(int i, long *acc) {
    *acc += i;
    DTRACE_PROBE3(demo, tick, i, *acc, 42);
}
int main(void) {
    long acc = 0;
    for (int i = 0; i < 5; i++) tick(i, &acc);
    DTRACE_PROBE(demo, done);
    printf("%ld\n", acc);
    return 0;
}
"#;

/// (provider, name, location, semaphore, arguments) of each note, as
/// `readelf -n` prints them.
fn readelf_notes(path: &Path) -> Vec<(String, String, u64, u64, String)> {
    let out = Command::new("readelf")
        .arg("-n")
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut notes = Vec::new();
    let mut cur: Option<(String, String, u64, u64, String)> = None;
    let hex = |s: &str| u64::from_str_radix(s.trim().trim_start_matches("0x"), 16).unwrap();
    for line in text.lines().map(str::trim) {
        if let Some(p) = line.strip_prefix("Provider: ") {
            if let Some(n) = cur.take() {
                notes.push(n);
            }
            cur = Some((p.into(), String::new(), 0, 0, String::new()));
        } else if let (Some(n), Some(c)) = (line.strip_prefix("Name: "), cur.as_mut()) {
            c.1 = n.into();
        } else if let (Some(l), Some(c)) = (line.strip_prefix("Location: "), cur.as_mut()) {
            let parts: Vec<&str> = l.split(", ").collect();
            c.2 = hex(parts[0]);
            c.3 = hex(parts[2].trim_start_matches("Semaphore: "));
        } else if let (Some(a), Some(c)) = (line.strip_prefix("Arguments: "), cur.as_mut()) {
            c.4 = a.into();
        }
    }
    notes.extend(cur);
    notes
}

fn check_against_readelf(path: &Path) -> Vec<UsdtMarker> {
    let ours = usdt_markers(&std::fs::read(path).unwrap()).unwrap();
    let theirs = readelf_notes(path);
    assert_eq!(ours.len(), theirs.len(), "{}", path.display());
    for (m, (p, n, loc, sem, args)) in ours.iter().zip(&theirs) {
        assert_eq!((&m.provider, &m.name), (p, n));
        assert_eq!(m.addr, *loc, "{p}:{n}");
        assert_eq!(m.semaphore.unwrap_or(0), *sem, "{p}:{n}");
        assert_eq!(
            m.args.len(),
            args.split_whitespace().count(),
            "{p}:{n} {args}"
        );
    }
    ours
}

#[test]
fn a_program_built_with_sdt_h() {
    let dir = TempDir::new("usdt");
    let exe = compile(dir.path(), "gcc", "prog.c", PROG_C, "prog", &["-O1"]);
    let markers = check_against_readelf(&exe);
    let tick = markers.iter().find(|m| m.name == "tick").unwrap();
    assert_eq!(tick.provider, "demo");
    assert!(tick.semaphore.is_some());
    assert_eq!(tick.args.len(), 3);
    assert_eq!(tick.args[0].size, 4);
    assert!(tick.args[0].signed);
    assert_eq!(tick.args[2].operand, UsdtOperand::Constant(42));
    let done = markers.iter().find(|m| m.name == "done").unwrap();
    assert!(done.args.is_empty());
    // The marker is a nop in the text.
    let text = Command::new("objdump")
        .args(["-d", "--start-address", &format!("{:#x}", tick.addr)])
        .arg("--stop-address")
        .arg(format!("{:#x}", tick.addr + 1))
        .arg(&exe)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&text.stdout).contains("nop"));
}

#[test]
fn python3_and_libstdcxx_markers_match_readelf() {
    let py = Path::new("/usr/bin/python3").canonicalize().unwrap();
    let markers = check_against_readelf(&py);
    assert!(
        markers
            .iter()
            .any(|m| m.provider == "python" && m.name == "gc__start" && m.semaphore.is_some()),
        "{markers:?}"
    );
    let stdcxx = Path::new("/usr/lib/x86_64-linux-gnu/libstdc++.so.6");
    let markers = check_against_readelf(stdcxx);
    assert!(markers
        .iter()
        .any(|m| m.provider == "libstdcxx" && m.name == "throw"));
}
