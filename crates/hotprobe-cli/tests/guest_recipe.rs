//! The README's guest recipe, as a new user runs it: `scripts/guest-initramfs.sh`
//! builds a busybox initramfs whose /init runs `sync` five times and powers
//! off; `hotprobe guest count __x64_sys_sync` on it counts exactly 5, and
//! the guest's power-off ends the run silently (no "gone", no stub
//! disconnection). `guest record` refuses to replace a trace without
//! `--force` (before any QEMU starts) and replaces it with `--force`.

#[path = "../../hotprobe-guest/tests/guest/harness.rs"]
mod harness;

mod common;
use common::{hotprobe_within, text, CountTable};
use std::path::{Path, PathBuf};
use std::time::Duration;

const LONG: Duration = Duration::from_secs(180);

/// `scripts/guest-initramfs.sh DIR` (the default command), the cpio's path.
fn recipe_initramfs(dir: &Path) -> PathBuf {
    let script = harness::workspace_root().join("scripts/guest-initramfs.sh");
    let o = std::process::Command::new("bash")
        .arg(&script)
        .arg(dir)
        .output()
        .expect("run scripts/guest-initramfs.sh");
    assert!(
        o.status.success(),
        "guest-initramfs.sh: {}",
        text(&o.stderr)
    );
    let printed = PathBuf::from(text(&o.stdout).trim());
    assert_eq!(printed, dir.join("initramfs.cpio"));
    printed
}

/// The README's QEMU command line for that initramfs.
fn qemu_args(cpio: &Path) -> Vec<String> {
    let kernel = harness::workspace_root().join(".cache/kernel/vmlinuz");
    [
        "qemu-system-x86_64",
        "-accel",
        "tcg",
        "-m",
        "256M",
        "-display",
        "none",
        "-serial",
        "stdio",
        "-no-reboot",
        "-kernel",
        kernel.to_str().unwrap(),
        "-initrd",
        cpio.to_str().unwrap(),
        "-append",
        "console=ttyS0 nokaslr quiet",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn run(args: &[&str], qemu: &[String]) -> std::process::Output {
    let mut all: Vec<&str> = args.to_vec();
    all.push("--");
    all.extend(qemu.iter().map(String::as_str));
    hotprobe_within(&all, LONG)
}

#[test]
fn readme_guest_recipe_counts_five_syncs_and_ends_silently() {
    if let Some(why) = harness::missing_prerequisite() {
        eprintln!("\n!!!!!!!! SKIPPED: {why} !!!!!!!!\n");
        return;
    }
    let dir = hotprobe_testkit::TempDir::new("guest-recipe");
    let cpio = recipe_initramfs(dir.path());
    let o = run(&["guest", "count", "__x64_sys_sync"], &qemu_args(&cpio));
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "exit {:?}: {err}", o.status);
    // The guest's own console output passes through, then the table.
    assert!(out.contains("Linux (none) 6.1"), "uname's line: {out}");
    let table = CountTable::parse(&out, &err);
    assert_eq!(table.hits("__x64_sys_sync"), 5, "{out}");
    // A guest that powered off ends silently: the start lines only.
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].starts_with("hotprobe: started QEMU (pid "),
        "{err}"
    );
    assert_eq!(lines[1], "hotprobe: the guest runs: 1 probes", "{err}");
}

#[test]
fn guest_record_replaces_a_trace_only_with_force() {
    if let Some(why) = harness::missing_prerequisite() {
        eprintln!("\n!!!!!!!! SKIPPED: {why} !!!!!!!!\n");
        return;
    }
    let dir = hotprobe_testkit::TempDir::new("guest-force");
    let cpio = recipe_initramfs(&dir.path().join("initramfs"));
    let qemu = qemu_args(&cpio);
    let trace = dir.path().join("t.d");
    let t = trace.to_str().unwrap();
    let first = run(&["guest", "record", "-o", t, "__x64_sys_sync"], &qemu);
    assert!(first.status.success(), "{}", text(&first.stderr));
    // Refused before any QEMU starts: the error is the only line.
    let again = run(&["guest", "record", "-o", t, "__x64_sys_sync"], &qemu);
    assert_eq!(again.status.code(), Some(1), "{}", text(&again.stderr));
    assert_eq!(
        text(&again.stderr).trim(),
        format!(
            "hotprobe: error: {t} already holds a trace: give --force to replace it, or another -o DIR"
        )
    );
    // A file left in the old trace goes with it.
    std::fs::write(trace.join("old-export.json"), "{}").unwrap();
    let forced = run(
        &["guest", "record", "--force", "-o", t, "__x64_sys_sync"],
        &qemu,
    );
    assert!(forced.status.success(), "{}", text(&forced.stderr));
    assert!(!trace.join("old-export.json").exists());
    let report = hotprobe_within(&["report", t], LONG);
    let rows = text(&report.stdout);
    let calls: Vec<u64> = rows
        .lines()
        .filter(|l| l.trim_end().ends_with("__x64_sys_sync"))
        .map(|l| l.split_whitespace().nth(10).unwrap().parse().unwrap())
        .collect();
    assert_eq!(calls, vec![5], "{rows}");
}
