//! End-to-end tests of the fast path on programs compiled here with gcc:
//! exact counts per mechanism over 4 threads × 10^6 calls, recorded
//! arguments and return values nested per thread (recursion, a C++
//! exception), ColdPatch (output equal, stripped binary through its probe
//! list), fallbacks to trap with their reasons, inject/detach on a running
//! process with the text unchanged afterwards.

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hotprobe_fastpath::*;
use hotprobe_process::{ProcessTarget, SpawnOptions};
use hotprobe_target::{Target, TargetEvent};

fn tmp() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

fn agent() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().join("libhotprobe_agent.so");
    assert!(p.exists(), "{} not built", p.display());
    p
}

fn compile(src: &str, out: &str, flags: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(src);
    let cc = if src.extension().unwrap() == "cc" {
        "g++"
    } else {
        "gcc"
    };
    hotprobe_testkit::compile(cc, &src, &tmp().join(out), flags, &["-lpthread"])
}

/// Spawns `exe` with the agent, returns the target and fast path.
fn spawn(exe: &Path, args: &[&str], out: &Path) -> (ProcessTarget, FastPath) {
    spawn_config(exe, args, out, FastPathConfig::default())
}

/// [`spawn`] with the shared memory sized by `config`.
fn spawn_config(
    exe: &Path,
    args: &[&str],
    out: &Path,
    config: FastPathConfig,
) -> (ProcessTarget, FastPath) {
    spawn_agent(exe, args, out, config, &agent())
}

/// [`spawn_config`] with the agent library at `agent`.
fn spawn_agent(
    exe: &Path,
    args: &[&str],
    out: &Path,
    config: FastPathConfig,
    agent: &Path,
) -> (ProcessTarget, FastPath) {
    // -pg builds write gmon.out at exit: keep it out of the source tree.
    let gmon = tmp().join("gmon").into_os_string();
    let mut opts = SpawnOptions {
        stdout: Some(File::create(out).unwrap()),
        env: vec![("GMON_OUT_PREFIX".into(), gmon)],
        ..Default::default()
    };
    let pending = FastPath::for_spawn(&mut opts, agent, config).unwrap();
    let args: Vec<OsString> = args.iter().map(OsString::from).collect();
    let mut t = ProcessTarget::spawn_with(exe, &args, &opts).unwrap();
    let fp = pending.attach(&mut t).unwrap();
    (t, fp)
}

fn run_to_exit(t: &mut ProcessTarget) {
    t.resume_all().unwrap();
    loop {
        match t.wait(None).unwrap() {
            TargetEvent::Exited(st) => {
                assert_eq!(
                    st.to_string(),
                    hotprobe_target::ExitStatus::Code(0).to_string()
                );
                return;
            }
            TargetEvent::ModulesChanged { thread } => t
                .resume(thread, hotprobe_target::ResumeMode::Continue)
                .unwrap(),
            TargetEvent::Breakpoint { thread, .. } | TargetEvent::Stepped { thread, .. } => t
                .resume(thread, hotprobe_target::ResumeMode::Continue)
                .unwrap(),
            _ => {}
        }
    }
}

fn native_output(exe: &Path, args: &[&str]) -> String {
    let o = Command::new(exe)
        .args(args)
        .env("GMON_OUT_PREFIX", tmp().join("gmon"))
        .output()
        .unwrap();
    assert!(o.status.success());
    String::from_utf8(o.stdout).unwrap()
}

const N: u64 = 1_000_000;

fn count_work(exe: &Path, tag: &str, expect: fn(Mechanism) -> bool, choice: MechanismChoice) {
    let args = [&N.to_string()[..], "4"];
    let out = tmp().join(format!("{tag}.out"));
    let (mut t, mut fp) = spawn(exe, &args, &out);
    let info = fp.add(&mut t, "work", Action::count(), choice).unwrap();
    assert!(expect(info.mechanism), "{tag}: {info:?}");
    run_to_exit(&mut t);
    assert_eq!(fp.count(info.probe_id), 4 * N, "{tag}: exact count");
    assert_eq!(
        fp.shm()
            .header()
            .site_misses
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        native_output(exe, &args)
    );
    eprintln!("{tag}: {} — {}", info.mechanism, info.reason);
}

#[test]
fn count_exact_patchable_entry() {
    let exe = compile(
        "loop.c",
        "loop-pfe",
        &["-O2", "-fpatchable-function-entry=5"],
    );
    count_work(
        &exe,
        "pfe",
        |m| m == Mechanism::Patch(PatchKind::PatchableEntry),
        MechanismChoice::Auto,
    );
}

#[test]
fn count_exact_mcount_nops() {
    for (tag, rec) in [("mcount", false), ("mcount-loc", true)] {
        let mut flags = vec![
            "-O2",
            "-fno-pie",
            "-no-pie",
            "-pg",
            "-mfentry",
            "-mnop-mcount",
        ];
        if rec {
            flags.push("-mrecord-mcount");
        }
        let exe = compile("loop.c", &format!("loop-{tag}"), &flags);
        count_work(
            &exe,
            tag,
            |m| m == Mechanism::Patch(PatchKind::Mcount),
            MechanismChoice::Auto,
        );
    }
}

#[test]
fn count_exact_jump() {
    let exe = compile("loop.c", "loop-plain", &["-O2"]);
    count_work(
        &exe,
        "jump",
        |m| m == Mechanism::Jump,
        MechanismChoice::Auto,
    );
}

fn coldpatched() -> (PathBuf, PathBuf) {
    static ONCE: std::sync::OnceLock<(PathBuf, PathBuf)> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let inst = compile("loop.c", "loop-inst", &["-O2", "-finstrument-functions"]);
        let (bytes, list) = hotprobe_coldpatch::coldpatch(&std::fs::read(&inst).unwrap()).unwrap();
        let out = tmp().join("loop-cold");
        std::fs::write(&out, bytes).unwrap();
        std::fs::set_permissions(&out, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        std::fs::write(probe_list_path(&out), list.to_text()).unwrap();
        let stripped = tmp().join("loop-cold-stripped");
        assert!(Command::new("strip")
            .arg("-o")
            .arg(&stripped)
            .arg(&out)
            .status()
            .unwrap()
            .success());
        std::fs::write(probe_list_path(&stripped), list.to_text()).unwrap();
        // The coldpatched binary runs like the original.
        assert_eq!(
            native_output(&out, &["1000", "3"]),
            native_output(&inst, &["1000", "3"])
        );
        (out, stripped)
    })
    .clone()
}

#[test]
fn count_exact_coldpatch_and_stripped() {
    let (cold, stripped) = coldpatched();
    count_work(
        &cold,
        "cold",
        |m| m == Mechanism::Patch(PatchKind::Coldpatch),
        MechanismChoice::Auto,
    );
    count_work(
        &stripped,
        "cold-stripped",
        |m| m == Mechanism::Patch(PatchKind::Coldpatch),
        MechanismChoice::Patch,
    );
}

#[test]
fn coldpatch_exit_placeholders_record_nested() {
    let (cold, _) = coldpatched();
    let out = tmp().join("cold-rec.out");
    let (mut t, mut fp) = spawn(&cold, &["10", "1"], &out);
    let info = fp
        .add(
            &mut t,
            "fact",
            Action::record().with_exit(),
            MechanismChoice::Auto,
        )
        .unwrap();
    assert_eq!(info.exits, "exit placeholders");
    run_to_exit(&mut t);
    let mut kinds = vec![];
    fp.drain(|e| {
        if e.probe_id == info.probe_id {
            kinds.push(e.kind)
        }
    });
    assert_eq!(kinds, [[KIND_ENTRY; 5], [KIND_EXIT; 5]].concat());
}

fn check_nested(events: &[RecordedEvent]) {
    let mut stack = vec![];
    for e in events {
        if e.kind == KIND_ENTRY {
            stack.push(e.probe_id);
        } else {
            assert_eq!(stack.pop(), Some(e.probe_id), "exit without its entry");
        }
    }
    assert!(stack.is_empty(), "unmatched entries {stack:?}");
}

#[test]
fn record_args_and_return_values_through_recursion() {
    for (tag, flags) in [
        ("rec-pfe", &["-O2", "-fpatchable-function-entry=5"][..]),
        ("rec-plain", &["-O1", "-fno-optimize-sibling-calls"][..]),
    ] {
        let exe = compile("loop.c", tag, flags);
        let out = tmp().join(format!("{tag}.out"));
        let (mut t, mut fp) = spawn(&exe, &["100", "2"], &out);
        let fact = fp
            .add(
                &mut t,
                "fact",
                Action::record().with_exit(),
                MechanismChoice::Auto,
            )
            .unwrap();
        let work = fp
            .add(
                &mut t,
                "work",
                Action::record().with_exit(),
                MechanismChoice::Auto,
            )
            .unwrap();
        assert_eq!(fact.exits, "return hook", "{tag}: {fact:?}");
        run_to_exit(&mut t);
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            native_output(&exe, &["100", "2"])
        );
        let mut per_tid = std::collections::BTreeMap::<u32, Vec<RecordedEvent>>::new();
        fp.drain(|e| per_tid.entry(e.tid).or_default().push(*e));
        assert_eq!(fp.drops(), 0);
        let mut fact_events = vec![];
        let mut work_threads = 0;
        for evs in per_tid.values() {
            check_nested(evs);
            let w: Vec<_> = evs.iter().filter(|e| e.probe_id == work.probe_id).collect();
            if !w.is_empty() {
                work_threads += 1;
                assert_eq!(w.len(), 200);
                for (i, pair) in w.chunks(2).enumerate() {
                    let (a, b) = (pair[0].args[0], pair[0].args[1]);
                    assert_eq!(b, i as u64 & 7);
                    assert_eq!(pair[1].args[0], a * 2 + b, "return value");
                }
            }
            fact_events.extend(evs.iter().filter(|e| e.probe_id == fact.probe_id).copied());
        }
        assert_eq!(work_threads, 2);
        let args: Vec<u64> = fact_events.iter().map(|e| e.args[0]).collect();
        assert_eq!(
            args,
            [5, 4, 3, 2, 1, 1, 2, 6, 24, 120],
            "{tag}: entries n, exits n!"
        );
        eprintln!(
            "{tag}: fact via {}, work via {}",
            fact.mechanism, work.mechanism
        );
    }
}

/// A probe never changes what the program computes. leaves.c's frameless
/// `-O2` leaves are called from a loop that keeps its state in
/// call-clobbered registers the leaves leave alone (rcx, rsi, r8-r11:
/// gcc's `-fipa-ra`); jump probes with exits (entry trampoline, return
/// hook) on all three, recording with 64- and 32-byte slots, and counting:
/// the output equals the unprobed output, and the recorded arguments and
/// return values equal what the program printed.
#[test]
fn jump_probes_with_exits_keep_every_register_of_the_caller() {
    let exe = compile("leaves.c", "leaves-o2", &["-O2"]);
    let native = native_output(&exe, &[]);
    // "i digit rand scaled" per call, then the sums.
    let printed: Vec<[u64; 3]> = native
        .lines()
        .filter(|l| !l.contains('='))
        .map(|l| {
            let w: Vec<u64> = l.split(' ').map(|w| w.parse().unwrap()).collect();
            [w[1], w[2], w[3]]
        })
        .collect();
    assert_eq!(printed.len(), 300);
    let funcs = ["is_digit", "next_rand", "scale"];
    for (tag, record_args, action) in [
        ("record-6", 6, Action::record().with_exit()),
        ("record-2", 2, Action::record().with_exit()),
        ("count", 6, Action::count().with_exit()),
    ] {
        let out = tmp().join(format!("leaves-{tag}.out"));
        let config = FastPathConfig {
            record_args,
            ..FastPathConfig::default()
        };
        let (mut t, mut fp) = spawn_config(&exe, &[], &out, config);
        let infos: Vec<SiteInfo> = funcs
            .iter()
            .map(|f| fp.add(&mut t, f, action, MechanismChoice::Jump).unwrap())
            .collect();
        for i in &infos {
            assert_eq!(i.mechanism, Mechanism::Jump, "{tag}: {i:?}");
            assert_eq!(i.exits, "return hook", "{tag}: {i:?}");
        }
        run_to_exit(&mut t);
        assert_eq!(std::fs::read_to_string(&out).unwrap(), native, "{tag}");
        for i in &infos {
            assert_eq!(fp.count(i.probe_id), 300, "{tag}: {}", i.function);
        }
        let mut events = vec![];
        fp.drain(|e| events.push(*e));
        assert_eq!(fp.drops(), 0, "{tag}");
        if !action.record {
            assert!(events.is_empty(), "{tag}");
            continue;
        }
        check_nested(&events);
        assert_eq!(events.len(), 3 * 2 * 300, "{tag}");
        for (f, info) in infos.iter().enumerate() {
            let evs: Vec<_> = events
                .iter()
                .filter(|e| e.probe_id == info.probe_id)
                .collect();
            for (i, pair) in evs.chunks(2).enumerate() {
                let (entry, exit) = (pair[0], pair[1]);
                assert_eq!((entry.kind, exit.kind), (KIND_ENTRY, KIND_EXIT));
                let ret = exit.args[0];
                match funcs[f] {
                    "is_digit" => {
                        assert_eq!(entry.args[0], i as u64 & 127, "{tag}: call {i}");
                        assert_eq!(ret & 0xffff_ffff, printed[i][0], "{tag}: call {i}");
                    }
                    "next_rand" => assert_eq!(ret, printed[i][1], "{tag}: call {i}"),
                    _ => {
                        // scale(v, k) = v * k + 3
                        let (v, k) = (entry.args[0], entry.args[1]);
                        assert_eq!(k, entry.args[1] & 31, "{tag}: call {i}");
                        assert_eq!(v.wrapping_mul(k).wrapping_add(3), printed[i][2]);
                        assert_eq!(ret, printed[i][2], "{tag}: call {i}");
                    }
                }
            }
        }
    }
}

#[test]
fn cxx_exception_crosses_probed_frames() {
    let exe = compile(
        "throw.cc",
        "throw-pfe",
        &["-O2", "-fpatchable-function-entry=5"],
    );
    let out = tmp().join("throw.out");
    let (mut t, mut fp) = spawn(&exe, &[], &out);
    let m = fp
        .add(
            &mut t,
            "middle",
            Action::record().with_exit(),
            MechanismChoice::Auto,
        )
        .unwrap();
    let th = fp
        .add(
            &mut t,
            "thrower",
            Action::record().with_exit(),
            MechanismChoice::Auto,
        )
        .unwrap();
    run_to_exit(&mut t);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "706\n");
    let mut evs = vec![];
    fp.drain(|e| evs.push(*e));
    check_nested(&evs);
    let unwound = evs
        .iter()
        .filter(|e| e.kind == KIND_EXIT && e.reserved == EXIT_UNWOUND)
        .count();
    assert_eq!(unwound, 4, "thrower and middle unwound twice");
    assert_eq!(evs.len(), 20);
    let _ = (m, th);
}

#[test]
fn short_and_jumped_into_functions_fall_back_to_trap() {
    let exe = compile("loop.c", "loop-plain2", &["-O2"]);
    let m = ModuleInfo::open(&exe).unwrap();
    let tiny = m
        .plan(m.function("tiny").unwrap(), MechanismChoice::Auto)
        .unwrap();
    assert_eq!(tiny.mechanism, Mechanism::Trap);
    assert!(
        tiny.reason.starts_with("function shorter than 5 bytes"),
        "{}",
        tiny.reason
    );
    let bj = m
        .plan(m.function("backjump").unwrap(), MechanismChoice::Auto)
        .unwrap();
    assert_eq!(bj.mechanism, Mechanism::Trap);
    assert!(
        bj.reason
            .starts_with("a jump lands inside the first 5 bytes at +2"),
        "{}",
        bj.reason
    );
    let e = m
        .plan(m.function("backjump").unwrap(), MechanismChoice::Jump)
        .unwrap_err();
    assert!(e.to_string().contains("a jump lands inside"), "{e}");
    let e = m
        .plan(m.function("work").unwrap(), MechanismChoice::Patch)
        .unwrap_err();
    assert!(e.to_string().contains("no placeholder"), "{e}");
    // Through a live process: the API reports trap and installs nothing.
    let (mut t, mut fp) = spawn(&exe, &["10", "1"], &tmp().join("trap.out"));
    let info = fp
        .add(&mut t, "tiny", Action::count(), MechanismChoice::Auto)
        .unwrap();
    assert_eq!(info.mechanism, Mechanism::Trap);
    run_to_exit(&mut t);
    let plans = explain(&exe).unwrap();
    assert!(plans
        .iter()
        .any(|p| p.function.name == "work" && p.plan.mechanism == Mechanism::Jump));
}

fn text_of(pid: i32) -> Vec<(u64, Vec<u8>)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut v = vec![];
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f[1] != "r-xp" || f.len() < 6 || f[5].contains("hotprobe_agent") || f[5].starts_with('[')
        {
            continue;
        }
        let (a, b) = f[0].split_once('-').unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        let mut buf = vec![0; (b - a) as usize];
        use std::os::unix::fs::FileExt;
        mem.read_exact_at(&mut buf, a).unwrap();
        v.push((a, buf));
    }
    v
}

/// Starts tests/programs/sleeper.c (built as `tag`) for `calls` calls,
/// waiting at its "ready" line for a line on stdin; returns the child and
/// its stdout, past "ready".
fn start_sleeper(
    tag: &str,
    calls: u64,
) -> (std::process::Child, BufReader<std::process::ChildStdout>) {
    let exe = compile("sleeper.c", tag, &["-O2"]);
    let mut child = Command::new(&exe)
        .arg(calls.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    (child, stdout)
}

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
    t.resume_all().unwrap();
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
    if let Some(pid) = std::env::var_os("HOTPROBE_TRACER_CHILD") {
        tracer_child(pid.to_str().unwrap().parse().unwrap());
    }
    const CALLS: u64 = 200_000;
    let (mut target, mut stdout) = start_sleeper("sleeper-kill", CALLS);
    let mut tracer = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "sigkill_of_the_tracer_leaves_the_target_running",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("HOTPROBE_TRACER_CHILD", target.id().to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
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
    // Past the heartbeat timeout, then let the target run its calls.
    std::thread::sleep(std::time::Duration::from_millis(300));
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
    assert_eq!(ledger.undo.load(Relaxed), hotprobe_abi::UNDO_DONE, "undone");
    assert_eq!(ledger.undone.load(Relaxed), 1, "the one site put back");
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

/// What the tracer of `forks.c` does at the child's fork stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum AtFork {
    /// Writes the original bytes of every site back into the child
    /// ([`FastPath::written_bytes`]), as the engine does.
    Restore,
    /// Leaves the child's code patched: the agent's dormancy alone keeps
    /// the child out of the shared memory.
    LeavePatched,
    /// Sets `CONTROL_FOLLOW_FORKS` before the run and leaves the child's
    /// code patched: the child counts and records in slots of its own.
    Follow,
}

/// `forks.c`: `f` (recorded, with its return hook) forks inside its 4th
/// call; the child returns from it through the return trampoline, calls
/// `f` and `g` (counted through a per-site stub) 5 times each, and exits 0;
/// the parent calls each 10 times. Whatever happens to the child, the
/// parent's counters and ring hold the parent's calls only, and the child
/// runs correctly.
fn fork_inside_a_probed_function(tag: &str, flags: &[&str], mode: AtFork, agent: &Path) {
    let exe = compile("forks.c", tag, flags);
    let out = tmp().join(format!("{tag}-{mode:?}.out"));
    let (mut t, mut fp) = spawn_agent(&exe, &[], &out, FastPathConfig::default(), agent);
    let parent = t.pid() as u32;
    let f = fp
        .add(
            &mut t,
            "f",
            Action::record().with_exit(),
            MechanismChoice::Auto,
        )
        .unwrap();
    let g = fp
        .add(&mut t, "g", Action::count(), MechanismChoice::Auto)
        .unwrap();
    assert_eq!(f.exits, "return hook", "{f:?}");
    assert!(g.stub, "{g:?}");
    assert_eq!(f.mechanism, g.mechanism, "{f:?} {g:?}");
    if mode == AtFork::Follow {
        fp.shm().header().control.fetch_or(
            hotprobe_abi::CONTROL_FOLLOW_FORKS,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
    t.resume_all().unwrap();
    let mut child = None;
    loop {
        match t.wait(None).unwrap() {
            TargetEvent::Exited(st) => {
                assert_eq!(
                    st.to_string(),
                    hotprobe_target::ExitStatus::Code(0).to_string()
                );
                break;
            }
            TargetEvent::Forked { thread, child: c } => {
                child = Some(c as u32);
                if mode == AtFork::Restore {
                    let mem = std::fs::OpenOptions::new()
                        .write(true)
                        .open(format!("/proc/{c}/mem"))
                        .unwrap();
                    use std::os::unix::fs::FileExt;
                    let written = fp.written_bytes();
                    assert_eq!(written.len(), 2, "{written:?}");
                    for (addr, original) in written {
                        mem.write_all_at(&original, addr).unwrap();
                    }
                }
                t.release_fork_child(c, &[]).unwrap();
                t.resume(thread, hotprobe_target::ResumeMode::Continue)
                    .unwrap();
            }
            TargetEvent::Breakpoint { thread, .. } | TargetEvent::Stepped { thread, .. } => t
                .resume(thread, hotprobe_target::ResumeMode::Continue)
                .unwrap(),
            _ => {}
        }
    }
    let child = child.expect("a fork event");
    assert_eq!(
        std::fs::read_to_string(&out).unwrap(),
        "child 16 24 1025 545\nparent 100 115 status 0\n",
        "{tag} {mode:?}: both processes computed right, the child exited 0"
    );
    // Counters per owning process.
    let shm = fp.shm();
    let mut per_pid = std::collections::BTreeMap::<u32, (u64, u64)>::new();
    for slot in 0..shm.threads_in_use() {
        let (pid, _) = shm.thread_owner(slot).expect("claimed");
        let c = shm.thread_counters(slot).unwrap();
        let e = per_pid.entry(pid).or_default();
        e.0 += c[f.probe_id as usize].load(std::sync::atomic::Ordering::Relaxed);
        e.1 += c[g.probe_id as usize].load(std::sync::atomic::Ordering::Relaxed);
    }
    let globals = shm.global_counters();
    assert_eq!(
        globals[f.probe_id as usize].load(std::sync::atomic::Ordering::Relaxed)
            + globals[g.probe_id as usize].load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    // Events per thread (the child's one thread has tid = its pid).
    let mut events = std::collections::BTreeMap::<u32, Vec<RecordedEvent>>::new();
    fp.drain(|e| events.entry(e.tid).or_default().push(*e));
    let kinds = |tid: u32| -> String {
        events
            .get(&tid)
            .map(|v| {
                v.iter()
                    .map(|e| match e.kind {
                        KIND_ENTRY => 'e',
                        KIND_EXIT => 'x',
                        _ => '?',
                    })
                    .collect()
            })
            .unwrap_or_default()
    };
    assert_eq!(
        per_pid.get(&parent),
        Some(&(10, 10)),
        "{tag} {mode:?}: {per_pid:?}"
    );
    assert_eq!(kinds(parent), "ex".repeat(10), "{tag} {mode:?}");
    let exit_values: Vec<u64> = events[&parent]
        .iter()
        .filter(|e| e.kind == KIND_EXIT)
        .map(|e| e.args[0])
        .collect();
    assert_eq!(
        exit_values,
        (0..10).map(|i| 2 * i + 1).collect::<Vec<u64>>()
    );
    if mode == AtFork::Follow {
        assert_eq!(per_pid.get(&child), Some(&(5, 5)), "{tag}: {per_pid:?}");
        assert_eq!(per_pid.len(), 2, "{per_pid:?}");
        // The child's first event is the return of the call that forked.
        assert_eq!(kinds(child), format!("x{}", "ex".repeat(5)), "{tag}");
        assert_eq!(events[&child][0].args[0], 7);
        assert_eq!(fp.count(f.probe_id), 15);
        assert_eq!(fp.count(g.probe_id), 15);
    } else {
        assert_eq!(per_pid.len(), 1, "{tag} {mode:?}: {per_pid:?}");
        assert!(!events.contains_key(&child), "{tag} {mode:?}");
        assert_eq!(fp.count(f.probe_id), 10);
        assert_eq!(fp.count(g.probe_id), 10);
    }
    assert_eq!(fp.drops(), 0);
}

/// With the agent of this build (debug) and the embedded one (release).
#[test]
fn fork_in_a_probed_function_patch() {
    for agent in [agent(), embedded_agent().unwrap()] {
        for mode in [AtFork::Restore, AtFork::LeavePatched, AtFork::Follow] {
            fork_inside_a_probed_function(
                "forks-pfe",
                &["-O2", "-fpatchable-function-entry=5"],
                mode,
                &agent,
            );
        }
    }
}

#[test]
fn fork_in_a_probed_function_jump() {
    for agent in [agent(), embedded_agent().unwrap()] {
        for mode in [AtFork::Restore, AtFork::LeavePatched, AtFork::Follow] {
            fork_inside_a_probed_function("forks-plain", &["-O2"], mode, &agent);
        }
    }
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

/// `fork_throw.cc`: the child of a fork inside `forker` (return hooked in
/// the parent) throws through `forker`'s frame, which still holds the
/// swapped return address: the preloaded agent's unwinder hooks put the
/// real one back even when dormant, so the child catches and exits 0.
#[test]
fn a_forked_child_throws_through_a_hooked_frame() {
    let exe = compile(
        "fork_throw.cc",
        "fork-throw-pfe",
        &["-O2", "-fpatchable-function-entry=5"],
    );
    for mode in [AtFork::Restore, AtFork::LeavePatched, AtFork::Follow] {
        let out = tmp().join(format!("fork-throw-{mode:?}.out"));
        let (mut t, mut fp) = spawn(&exe, &[], &out);
        let parent = t.pid() as u32;
        for f in ["forker", "thrower"] {
            let info = fp
                .add(
                    &mut t,
                    f,
                    Action::record().with_exit(),
                    MechanismChoice::Auto,
                )
                .unwrap();
            assert_eq!(info.exits, "return hook", "{info:?}");
        }
        if mode == AtFork::Follow {
            fp.shm().header().control.fetch_or(
                hotprobe_abi::CONTROL_FOLLOW_FORKS,
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        t.resume_all().unwrap();
        loop {
            match t.wait(None).unwrap() {
                TargetEvent::Exited(st) => {
                    assert_eq!(
                        st.to_string(),
                        hotprobe_target::ExitStatus::Code(0).to_string()
                    );
                    break;
                }
                TargetEvent::Forked { thread, child } => {
                    if mode == AtFork::Restore {
                        let mem = std::fs::OpenOptions::new()
                            .write(true)
                            .open(format!("/proc/{child}/mem"))
                            .unwrap();
                        use std::os::unix::fs::FileExt;
                        for (addr, original) in fp.written_bytes() {
                            mem.write_all_at(&original, addr).unwrap();
                        }
                    }
                    t.release_fork_child(child, &[]).unwrap();
                    t.resume(thread, hotprobe_target::ResumeMode::Continue)
                        .unwrap();
                }
                _ => {}
            }
        }
        assert_eq!(
            std::fs::read_to_string(&out).unwrap(),
            "child caught 5\nparent child-status 0\n",
            "{mode:?}"
        );
        let mut parent_events = vec![];
        fp.drain(|e| {
            if e.tid == parent {
                parent_events.push((e.kind, e.args[0]));
            }
        });
        // forker's entry and its return value (the child's exit status).
        assert_eq!(parent_events.len(), 2, "{mode:?}: {parent_events:?}");
        assert_eq!(parent_events[1], (KIND_EXIT, 0), "{mode:?}");
    }
}

/// The agent preloaded from the tracer's memfd (`/proc/TRACER/fd/N`) takes
/// that entry out of `LD_PRELOAD` (it opens only while the tracer lives);
/// other entries stay.
#[test]
fn the_embedded_agent_leaves_ld_preload_without_its_memfd() {
    let out = tmp().join("preload.out");
    let mut opts = SpawnOptions {
        stdout: Some(File::create(&out).unwrap()),
        ..Default::default()
    };
    let agent = embedded_agent().unwrap();
    let pending = FastPath::for_spawn(&mut opts, &agent, FastPathConfig::default()).unwrap();
    for (k, v) in opts.env.iter_mut() {
        if k == "LD_PRELOAD" {
            assert!(v.to_string_lossy().starts_with(&*agent.to_string_lossy()));
            v.push(":libm.so.6");
        }
    }
    let args: Vec<OsString> = ["-c", "echo \"[$LD_PRELOAD]\""]
        .iter()
        .map(OsString::from)
        .collect();
    let mut t = ProcessTarget::spawn_with(Path::new("/bin/sh"), &args, &opts).unwrap();
    let _fp = pending.attach(&mut t).unwrap();
    run_to_exit(&mut t);
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "[libm.so.6]\n");
}

/// A jump probe is refused where a branch of *another* function lands in
/// the bytes it would rewrite (glibc's memcpy/mempcpy pair, found by
/// probing every libc function): the entry gets a trap, with the reason.
#[test]
fn a_branch_from_another_function_into_the_entry_refuses_a_jump() {
    let exe = compile("branch_into.c", "branch_into", &["-O2"]);
    let out = Command::new(&exe).arg("10").output().unwrap();
    // sum over i < 10 of (i + 1 + 3) + (2i + 2 + 3) = 3 * 45 + 90
    assert_eq!(String::from_utf8_lossy(&out.stdout), "225\n");
    let m = ModuleInfo::open(&exe).unwrap();
    let add3 = m.function("add3").unwrap();
    let p = m.plan(add3, MechanismChoice::Auto).unwrap();
    assert_eq!(p.mechanism, Mechanism::Trap);
    assert!(
        p.reason.contains("elsewhere in the module lands at +0x3"),
        "{}",
        p.reason
    );
    let e = m.plan(add3, MechanismChoice::Jump).unwrap_err();
    assert!(e.to_string().contains("lands at +0x3"), "{e}");
    assert_eq!(m.branch_into(add3.addr, 3).map(|(t, _)| t), None);
    assert_eq!(
        m.branch_into(add3.addr, 5).map(|(t, _)| t),
        Some(add3.addr + 3)
    );
    // Nothing lands inside add3_twice's first bytes: it takes a jump.
    let q = m
        .plan(m.function("add3_twice").unwrap(), MechanismChoice::Auto)
        .unwrap();
    assert_eq!(q.mechanism, Mechanism::Jump, "{}", q.reason);
}
