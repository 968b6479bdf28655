//! [`GuestFleet`] on real QEMUs started with hotprobe's plugin (they wait
//! paused, `-S`, for a session that never starts): dropping the fleet kills
//! and reaps every QEMU it started; a released fleet leaves them running.

#[path = "guest/harness.rs"]
mod harness;

use hotprobe_guest::{load_symbols, GuestFleet, LaunchOptions};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

/// Whether process `pid` exists and is a QEMU (not reaped, not reused).
fn is_qemu(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.starts_with("qemu"))
}

/// Starts `n` guests into `fleet`.
fn launch(fleet: &mut GuestFleet, dir: &Path, n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| {
            let d = dir.join(format!("g{i}"));
            std::fs::create_dir_all(&d).unwrap();
            let (syms, _) = load_symbols(&harness::kallsyms_cached()).unwrap();
            let g = fleet
                .launch(
                    &harness::qemu_args(&d, "rdinit=/workload"),
                    syms,
                    LaunchOptions {
                        stdin: Some(Stdio::null()),
                        stdout: Some(Stdio::null()),
                        ..LaunchOptions::default()
                    },
                )
                .unwrap();
            assert_eq!(g.index, i);
            assert_eq!(fleet.pid(i), Some(g.pid));
            g.pid
        })
        .collect()
}

#[test]
fn dropping_the_fleet_kills_its_qemus_and_releasing_it_does_not() {
    if let Some(why) = harness::missing_prerequisite() {
        eprintln!("\n!!!!!!!! SKIPPED fleet: {why} !!!!!!!!\n");
        return;
    }
    let dir = std::env::temp_dir().join(format!("hp-fleet-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    // Two guests, as `guest count -- QEMU -- QEMU` starts them; the fleet
    // drops (an error while placing probes): both QEMUs are gone.
    let mut fleet = GuestFleet::new();
    let pids = launch(&mut fleet, &dir, 2);
    assert_eq!(fleet.len(), 2);
    for &pid in &pids {
        assert!(is_qemu(pid), "QEMU {pid} runs while the fleet holds it");
    }
    drop(fleet);
    for &pid in &pids {
        assert!(!is_qemu(pid), "QEMU {pid} outlived its fleet");
    }

    // Released (the probes are placed, the guests may outlive hotprobe):
    // QEMU runs on after the fleet is gone.
    let mut fleet = GuestFleet::new();
    let pid = launch(&mut fleet, &dir, 1)[0];
    let mut qemus = fleet.release();
    assert!(is_qemu(pid), "a released QEMU was killed");
    assert_eq!(qemus.len(), 1);
    assert_eq!(qemus[0].pid(), pid);
    assert!(qemus[0].wait_timeout(Duration::from_millis(200)).is_none());
    qemus[0].kill();
    assert!(!is_qemu(pid));
    let _ = std::fs::remove_dir_all(&dir);
}
