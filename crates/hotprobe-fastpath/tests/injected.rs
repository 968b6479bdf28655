//! The fast path injected into a running process (`sleeper.c`, compiled
//! here): inject, probe and detach leave the text identical; a tracer
//! killed with SIGKILL leaves the program running its own code (the agent
//! hears of the death and puts the site back); the stubs of a tracer that
//! vanished stay out of the next tracer's memory; the embedded agent is
//! injected from its memfd.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};

use hotprobe_fastpath::*;
use hotprobe_process::ProcessTarget;
use hotprobe_target::{Target, TargetEvent};

mod fastpath_support;
use fastpath_support::*;

#[test]
fn inject_probe_detach_leaves_text_identical() {
    let (mut child, mut stdout) = start_sleeper("sleeper-plain", 200_000);
    let pid = child.id() as i32;
    let mut t = ProcessTarget::attach(pid).unwrap();
    let before = text_of(pid);
    let mut fp = FastPath::inject(&mut t, &agent(), FastPathConfig::default()).unwrap();
    let info = fp
        .add(&mut t, "work", Action::count(), MechanismChoice::Auto)
        .unwrap();
    assert_eq!(info.mechanism, Mechanism::Jump);
    t.resume_all().unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    // Wait until some calls were counted, then detach mid-run.
    while fp.count(info.probe_id) < 1000 {
        if let TargetEvent::Exited(_) = t.wait(Some(std::time::Duration::from_millis(5))).unwrap() {
            panic!("ended early");
        }
    }
    fp.detach(&mut t).unwrap();
    let after = text_of(pid);
    for (addr, bytes) in &before {
        let same = after
            .iter()
            .find(|(a, _)| a == addr)
            .map(|(_, b)| b == bytes);
        assert_eq!(same, Some(true), "text at {addr:#x} identical after detach");
    }
    t.detach().unwrap();
    drop(t);
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert!(child.wait().unwrap().success());
    let total: u64 = (0..200000u64).map(|i| (i & 3) * 2 + 1).sum();
    assert_eq!(rest, format!("total {total}\n"));
}

/// The tracer side of `sigkill_of_the_tracer_leaves_the_target_running`,
/// run in a re-executed copy of this test binary: attach to the pid in
/// `HOTPROBE_TRACER_CHILD`, inject the agent, probe `work` with `record`,
/// let the target run, report the memfd, then drain forever (until killed).
fn tracer_child(pid: i32) -> ! {
    let mut t = ProcessTarget::attach(pid).unwrap();
    let config = FastPathConfig {
        ring_capacity: 1024,
        heartbeat_timeout: std::time::Duration::from_millis(200),
        ..Default::default()
    };
    let mut fp = FastPath::inject(&mut t, &agent(), config).unwrap();
    let info = fp
        .add(&mut t, "work", Action::record(), MechanismChoice::Auto)
        .unwrap();
    assert_eq!(info.probe_id, 0);
    match std::env::var("HOTPROBE_TORN").ok().as_deref() {
        // Killed while the program runs.
        None => t.resume_all().unwrap(),
        // Killed mid-write, the threads stopped: the site as a write cut
        // short by the kernel leaves it (new bytes first, old after).
        Some(mode) => {
            let w = &fp.live_writes()[0];
            let (now, original) = (w.now.to_vec(), w.original.to_vec());
            let torn: Vec<u8> = match mode {
                // A whole write cut before its last byte (an older
                // tracer's, or any write not made head last).
                "tail" => [&now[..now.len() - 1], &original[now.len() - 1..]].concat(),
                // The first of two head-last writes cut after two bytes.
                "int3" => [&[0xcc][..], &now[1..2], &original[2..]].concat(),
                m => panic!("HOTPROBE_TORN={m}"),
            };
            assert_ne!(torn, original);
            t.write_memory(hotprobe_target::RuntimeAddr(w.addr), &torn)
                .unwrap();
        }
    }
    // Every memfd of ours (the engine's scratch memory is one too); the
    // test keeps the one holding a valid hotprobe header.
    let fds: Vec<String> = std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            std::fs::read_link(e.path())
                .map(|l| l.to_string_lossy().starts_with("/memfd:hotprobe"))
                .unwrap_or(false)
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    println!("TRACER memfd {}", fds.join(","));
    std::io::stdout().flush().unwrap();
    loop {
        fp.drain(|_| {});
        let _ = t.wait(Some(std::time::Duration::from_millis(10)));
    }
}

#[test]
fn sigkill_of_the_tracer_leaves_the_target_running() {
    killed_tracer("sigkill_of_the_tracer_leaves_the_target_running", None);
}

/// A tracer killed in the middle of writing a site (a `/proc/PID/mem`
/// write stops short at a page when its writer gets SIGKILL) leaves the
/// site torn: the agent puts it back all the same before the program runs
/// it. Before, a jump with four new bytes and its last one old was left
/// ("another writer's") and the program jumped 208 MiB away (SIGSEGV; seen
/// in `hotprobe-cli`'s `tracer_killed`).
#[test]
fn a_site_torn_by_a_killed_tracer_is_put_back_before_the_program_runs_it() {
    let name = "a_site_torn_by_a_killed_tracer_is_put_back_before_the_program_runs_it";
    killed_tracer(name, Some("tail"));
    killed_tracer(name, Some("int3"));
}

/// Runs `tracer_child` (re-executing test `name`, `torn` its
/// `HOTPROBE_TORN`) on a sleeper program, SIGKILLs it, and checks that the
/// program runs its own code to the end, the site put back.
fn killed_tracer(name: &str, torn: Option<&str>) {
    if let Some(pid) = std::env::var_os("HOTPROBE_TRACER_CHILD") {
        tracer_child(pid.to_str().unwrap().parse().unwrap());
    }
    const CALLS: u64 = 200_000;
    let (mut target, mut stdout) = start_sleeper(&format!("sleeper-kill-{torn:?}"), CALLS);
    let mut tracer = Command::new(std::env::current_exe().unwrap());
    tracer
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env("HOTPROBE_TRACER_CHILD", target.id().to_string())
        .stdout(Stdio::piped());
    if let Some(mode) = torn {
        tracer.env("HOTPROBE_TORN", mode);
    }
    let mut tracer = tracer.spawn().unwrap();
    let tracer_out = BufReader::new(tracer.stdout.take().unwrap());
    let fds = tracer_out
        .lines()
        .map(|l| l.unwrap())
        .find_map(|l| {
            // The harness's "test NAME ... " has no newline before it.
            l.split("TRACER memfd ")
                .nth(1)
                .map(|s| s.trim().to_string())
        })
        .expect("the tracer probed the target");
    // Keep the shared memory alive to read the agent's counters afterwards.
    let shm_files: Vec<File> = fds
        .split(',')
        .map(|fd| {
            File::options()
                .read(true)
                .write(true)
                .open(format!("/proc/{}/fd/{fd}", tracer.id()))
                .unwrap()
        })
        .collect();
    // SIGKILL mid-run: the target was resumed, probes armed, recording on.
    // SAFETY: kill has no memory effects; the pid is our live child.
    assert_eq!(unsafe { libc::kill(tracer.id() as i32, libc::SIGKILL) }, 0);
    tracer.wait().unwrap();
    // The agent heard of the tracer's death (its hang-up pipe) and put the
    // probed site back before the calls (issue 22): the program ran its
    // own code, and no call was counted.
    use std::os::fd::AsRawFd;
    let (p, len, shm) = shm_files
        .iter()
        .find_map(|f| {
            let len = f.metadata().unwrap().len() as usize;
            // SAFETY: a fresh shared mapping of the memfd (kept: the test ends).
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    f.as_raw_fd(),
                    0,
                )
            };
            assert_ne!(p, libc::MAP_FAILED);
            // SAFETY: valid for len bytes until the munmap below.
            let shm = unsafe { hotprobe_abi::Shm::attach(p as *mut u8, len) }.ok()?;
            Some((p, len, shm))
        })
        .expect("the fast path's shared memory");
    use std::sync::atomic::Ordering::Relaxed;
    let ledger = shm.ledger_ctl();
    // Once the agent says it put the sites back, the target runs its calls.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while ledger.undo.load(Relaxed) != hotprobe_abi::UNDO_DONE {
        assert!(
            std::time::Instant::now() < deadline,
            "the agent never put the sites back"
        );
        std::thread::yield_now();
    }
    // The program's code equals its file again. (The loader's rendezvous
    // `int3` this bare ProcessTarget put in ld.so stays: a session
    // publishes it in the trap table, which this test does not.)
    let pid = target.id();
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    assert_eq!(
        hotprobe_testkit::text_differences(pid, &exe),
        vec![],
        "(address, in memory, in the file) of the program's code"
    );
    target.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert!(target.wait().unwrap().success());
    let total: u64 = (0..CALLS).map(|i| (i & 3) * 2 + 1).sum();
    assert_eq!(
        rest,
        format!("total {total}\n"),
        "correct output to the end"
    );
    assert_eq!(ledger.undo.load(Relaxed), hotprobe_abi::UNDO_DONE, "undone");
    assert_eq!(ledger.undone.load(Relaxed), 1, "the one site put back");
    assert_eq!(ledger.left.load(Relaxed), 0, "no site left as found");
    assert_eq!(shm.counter(0), 0, "no call went through the probe");
    // SAFETY: our mapping, no view left.
    unsafe { libc::munmap(p, len) };
}

/// A tracer that goes away without restoring the code leaves its stubs in
/// the target; when a second tracer injects the agent again (new memory,
/// another slot size), those stubs must not count or record into the new
/// memory: their hits take the generic path, which knows none of their
/// sites, and the program runs on to the right result.
#[test]
fn stubs_of_a_vanished_tracer_stay_out_of_the_next_tracers_memory() {
    let (mut child, mut stdout) = start_sleeper("sleeper-reattach", 200_000);
    let pid = child.id() as i32;
    let mut t = ProcessTarget::attach(pid).unwrap();
    // First tracer: 64-byte slots, `work` recorded through a stub.
    let first = FastPathConfig {
        record_args: 6,
        ..Default::default()
    };
    let mut fp1 = FastPath::inject(&mut t, &agent(), first).unwrap();
    let info = fp1
        .add(&mut t, "work", Action::record(), MechanismChoice::Auto)
        .unwrap();
    assert!(info.stub, "{info:?}");
    t.resume_all().unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    while fp1.count(info.probe_id) < 1000 {
        if let TargetEvent::Exited(_) = t.wait(Some(std::time::Duration::from_millis(5))).unwrap() {
            panic!("ended early");
        }
    }
    // It vanishes: no detach, its stubs stay patched in.
    t.stop_all().unwrap();
    let before = fp1.count(info.probe_id);
    drop(fp1);
    // Second tracer: a new memory with 32-byte slots and no probe at all.
    let second = FastPathConfig {
        record_args: 2,
        ..Default::default()
    };
    let mut fp2 = FastPath::inject(&mut t, &agent(), second).unwrap();
    assert_eq!(fp2.shm().layout().params.event_size, 32);
    t.resume_all().unwrap();
    let mut events = 0;
    loop {
        events += fp2.drain(|_| {});
        if let TargetEvent::Exited(_) = t.wait(Some(std::time::Duration::from_millis(5))).unwrap() {
            break;
        }
    }
    events += fp2.drain(|_| {});
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let total: u64 = (0..200000u64).map(|i| (i & 3) * 2 + 1).sum();
    assert_eq!(rest, format!("total {total}\n"), "the program ran on");
    assert!((1000..200_000).contains(&before), "{before}");
    assert_eq!(events, 0, "nothing recorded into the new memory");
    assert_eq!(fp2.counts(), Vec::<u64>::new());
    let shm = fp2.shm();
    for p in 0..shm.layout().params.n_probes {
        assert_eq!(shm.counter(p), 0, "counter {p} of the new memory");
    }
    let misses = shm
        .header()
        .site_misses
        .load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        misses + before,
        200_000,
        "every later call went to the generic path and missed there"
    );
    let _ = child.wait();
}

/// The embedded agent, injected from its memfd (`/proc/OUR_PID/fd/N`): the
/// target maps `/memfd:libhotprobe_agent.so`, which its symbols name
/// `libhotprobe_agent.so`; counts are exact; a second injection attaches
/// the agent already there.
#[test]
fn inject_the_embedded_agent() {
    let (mut child, mut stdout) = start_sleeper("sleeper-embedded", 20_000);
    let pid = child.id() as i32;
    let mut t = ProcessTarget::attach(pid).unwrap();
    let agent = embedded_agent().unwrap();
    assert!(
        agent.starts_with(format!("/proc/{}/fd", std::process::id())),
        "{}",
        agent.display()
    );
    let fp1 = FastPath::inject(&mut t, &agent, FastPathConfig::default()).unwrap();
    drop(fp1);
    let mut fp = FastPath::inject(&mut t, &agent, FastPathConfig::default()).unwrap();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let agent_lines: Vec<&str> = maps
        .lines()
        .filter(|l| l.contains("hotprobe_agent"))
        .collect();
    assert!(!agent_lines.is_empty(), "{maps}");
    assert!(
        agent_lines
            .iter()
            .all(|l| l.ends_with("/memfd:libhotprobe_agent.so (deleted)")),
        "{agent_lines:?}"
    );
    let inodes: std::collections::BTreeSet<&str> = agent_lines
        .iter()
        .map(|l| l.split_whitespace().nth(4).unwrap())
        .collect();
    assert_eq!(inodes.len(), 1, "one copy of the agent: {agent_lines:?}");
    let syms = hotprobe_symbols::ProcessSymbols::for_pid(pid as u32).unwrap();
    let m = syms.find_module("libhotprobe_agent").unwrap();
    assert_eq!(m.name, "libhotprobe_agent.so");
    assert!(m.module.find("hotprobe_agent_attach_fd").is_some());
    let info = fp
        .add(&mut t, "work", Action::count(), MechanismChoice::Auto)
        .unwrap();
    t.resume_all().unwrap();
    child.stdin.take().unwrap().write_all(b"go\n").unwrap();
    loop {
        if let TargetEvent::Exited(_) = t.wait(None).unwrap() {
            break;
        }
    }
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    let total: u64 = (0..20_000u64).map(|i| (i & 3) * 2 + 1).sum();
    assert_eq!(rest, format!("total {total}\n"));
    assert_eq!(fp.count(info.probe_id), 20_000);
    let _ = child.wait();
}
