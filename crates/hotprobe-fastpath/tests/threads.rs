//! Entry and return probes on the fast path under 16 threads, 20 times
//! over: every call of `work` (16 × 10^5 per run) is counted and recorded
//! as an entry and an exit, nothing is dropped or refused, every exit
//! carries the return value the program computed, and the program prints
//! what it prints without probes.

use std::ffi::OsString;
use std::fs::File;
use std::path::PathBuf;
use std::process::Command;

use hotprobe_fastpath::*;
use hotprobe_process::{ProcessTarget, SpawnOptions};

mod fastpath_support;
use fastpath_support::*;

const THREADS: u64 = 16;
const CALLS: u64 = 100_000;
const RUNS: usize = 20;

#[test]
fn sixteen_threads_entry_and_return_exact_twenty_times() {
    // The release agent embedded in this crate (the one hotprobe ships).
    let agent = embedded_agent().unwrap();
    let args = [CALLS.to_string(), THREADS.to_string()];
    // Patch (a placeholder) and jump (a relocated entry), in turns.
    let builds: Vec<(&str, PathBuf, Vec<u8>)> = [
        ("threads-pfe", &["-O2", "-fpatchable-function-entry=5"][..]),
        ("threads-plain", &["-O1", "-fno-optimize-sibling-calls"][..]),
    ]
    .into_iter()
    .map(|(tag, flags)| {
        let exe = compile("loop.c", tag, flags);
        let native = Command::new(&exe).args(&args).output().unwrap();
        assert!(native.status.success());
        (tag, exe, native.stdout)
    })
    .collect();
    for run in 0..RUNS {
        let (tag, exe, native) = &builds[run % builds.len()];
        {
            let out = tmp().join(format!("{tag}.out"));
            let mut opts = SpawnOptions {
                stdout: Some(File::create(&out).unwrap()),
                ..Default::default()
            };
            let config = FastPathConfig {
                max_threads: 32,
                // 2 × 10^5 events per thread, drained at the end.
                ring_capacity: 1 << 18,
                record_args: 2,
                ..Default::default()
            };
            let pending = FastPath::for_spawn(&mut opts, &agent, config).unwrap();
            let args: Vec<OsString> = args.iter().map(OsString::from).collect();
            let mut t = ProcessTarget::spawn_with(exe, &args, &opts).unwrap();
            let mut fp = pending.attach(&mut t).unwrap();
            let info = fp
                .add(
                    &mut t,
                    "work",
                    Action::record().with_exit(),
                    MechanismChoice::Auto,
                )
                .unwrap();
            assert_eq!(info.exits, "return hook", "{tag}: {info:?}");
            // The recording site put the ring pool in place before the
            // program runs: 16 slots, one for each of its threads (their
            // first hits map their rings with no system call).
            assert_eq!(fp.shm().ring_pool(), (true, 16), "{tag}: ring pool");
            run_to_exit(&mut t);
            assert_eq!(
                &std::fs::read(&out).unwrap(),
                native,
                "{tag} run {run}: output"
            );
            assert_eq!(fp.count(info.probe_id), THREADS * CALLS, "{tag} run {run}");
            let (mut entries, mut exits, mut wrong) = (0u64, 0u64, 0u64);
            // Ring by ring, each one thread's events in order: an entry of
            // `work` (a leaf) and its exit are consecutive.
            let mut open: Option<(u32, u64, u64)> = None;
            fp.drain(|e| {
                if e.probe_id != info.probe_id {
                    wrong += 1;
                    return;
                }
                match e.kind {
                    KIND_ENTRY => {
                        entries += 1;
                        if open.replace((e.tid, e.args[0], e.args[1])).is_some() {
                            wrong += 1;
                        }
                    }
                    KIND_EXIT => {
                        exits += 1;
                        // work(a, b) returns a * 2 + b.
                        match open.take() {
                            Some((tid, a, b)) if tid == e.tid && e.args[0] == a * 2 + b => {}
                            _ => wrong += 1,
                        }
                    }
                    _ => wrong += 1,
                }
            });
            assert_eq!(entries, THREADS * CALLS, "{tag} run {run}: entries");
            assert_eq!(exits, THREADS * CALLS, "{tag} run {run}: exits");
            assert_eq!(wrong, 0, "{tag} run {run}: unmatched exits");
            assert_eq!(fp.drops(), 0, "{tag} run {run}: drops");
            assert_eq!(fp.missed(info.probe_id), 0, "{tag} run {run}: missed");
            assert_eq!(fp.return_misses(), 0, "{tag} run {run}: return misses");
        }
    }
}
