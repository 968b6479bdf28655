//! The iProbe micro-benchmark for the fast path, next to its peers, in one
//! run: a loop calling an empty function N times (`small`, a 5-byte body,
//! for the jump mechanism and Frida, which cannot hook a 1-byte function),
//! timed inside the program; ns per call and × native, for `count` and
//! `record`, per mechanism (patch via `-fpatchable-function-entry=5`, patch
//! via `-pg -mfentry -mnop-mcount` NOPs, a coldpatched
//! `-finstrument-functions` build with entry and exit placeholders, jump),
//! with the agent's generic trampolines for comparison, next to native,
//! `uftrace record` (`-pg` build), Frida Interceptor with a CModule counter,
//! and bpftrace uprobe+uretprobe.
//!
//! Command (from the workspace root; needs gcc, uftrace, bpftrace, `pip
//! install frida` — scripts/setup.sh puts it in .cache/peers-venv —, root for bpftrace):
//!
//! ```text
//! CARGO_TARGET_DIR=target/h-fast2 cargo run --release -p hotprobe-fastpath \
//!     --example bench_fastpath -- [--n 100000000] [--reps 3] [--no-peers] [--only BUILD]
//! ```
//!
//! `--only coldpatched` (any substring of the build column) runs the natives
//! and that build's rows only.
//!
//! Pinning: this process (the tracer: drain loop, heartbeat) runs on CPU 0,
//! every target on CPU 1 (`sched_setaffinity` before it runs; `taskset -c 1`
//! for the peers), all at nice −10 when permitted (root), so that other load
//! on the machine disturbs neither the drain nor the timed loops as much;
//! the drain loop itself runs SCHED_FIFO (priority 1) when permitted. Each row is run `--reps` times: the median and the
//! spread (min–max) are printed. Peers use smaller N (uftrace and Frida
//! 10^7, bpftrace 10^5: ≈ 5 µs per hit), stated in the table.
//! `record` rows drain the rings concurrently, in batches (a 100 µs nap after
//! a pass that found less than an eighth of a ring), and report the slot
//! size, the ring capacity, drops, and the drain's own cost per event. They
//! record 2 arguments (32-byte slots; `empty` and `small` take at most one),
//! plus one coldpatched row with 6 (64-byte slots).
//!
//! Knobs for experiments (environment): `BENCH_CPU=1` reports the target's
//! CPU time per call instead of wall time (comparing variants on a loaded
//! machine), `BENCH_RING_LOG2=k` rings of 2^k events (default 16),
//! `BENCH_BATCH_DIV=d` naps after passes under 1/d of a ring (default 8),
//! `BENCH_LAZY=1` no draining while the target runs (2^22-event rings).

use std::ffi::OsString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hotprobe_fastpath::{
    find_agent, probe_list_path, Action, FastPath, FastPathConfig, MechanismChoice,
};
use hotprobe_process::{ProcessTarget, SpawnOptions};
use hotprobe_target::{ResumeMode, Target, TargetEvent};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const TRACER_CPU: usize = 0;
const TARGET_CPU: usize = 1;

fn pin(pid: i32, cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is valid; CPU_SET writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: cpu < CPU_SETSIZE.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: valid set pointer and size.
    let r = unsafe { libc::sched_setaffinity(pid, std::mem::size_of_val(&set), &set) };
    if r != 0 {
        eprintln!("warning: cannot pin pid {pid} to CPU {cpu}");
    }
}

fn dir() -> PathBuf {
    let d = std::env::temp_dir().join(format!("hotprobe-bench-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/bench")
}

fn compile(d: &Path, name: &str, flags: &[&str]) -> Res<PathBuf> {
    let out = d.join(name);
    let st = Command::new("gcc")
        .args(flags)
        .arg(src().join("bench.c"))
        .arg("-o")
        .arg(&out)
        .status()?;
    if !st.success() {
        return Err(format!("gcc {flags:?} failed").into());
    }
    Ok(out)
}

/// The program's ns per call: wall time, or with `BENCH_CPU` set, the
/// process's CPU time (for comparing variants on a loaded machine).
fn ns_of(out: &str) -> Res<f64> {
    let line = out.lines().find(|l| l.contains("ns/call"));
    let cpu = std::env::var_os("BENCH_CPU").is_some();
    line.and_then(|l| {
        if cpu {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("cpu="))
                .and_then(|w| w.parse().ok())
        } else {
            l.split_whitespace().next().and_then(|w| w.parse().ok())
        }
    })
    .ok_or_else(|| format!("no timing in output: {out:?}").into())
}

fn native(bin: &Path, n: u64, func: &str) -> Res<f64> {
    let o = Command::new("taskset")
        .args(["-c", &TARGET_CPU.to_string()])
        .arg(bin)
        .args([n.to_string(), func.to_string()])
        .output()?;
    ns_of(&String::from_utf8_lossy(&o.stdout))
}

/// One run under the fast path; returns (ns/call, note).
#[allow(clippy::too_many_arguments)]
fn fast(
    bin: &Path,
    n: u64,
    func: &str,
    action: Action,
    choice: MechanismChoice,
    stubs: bool,
    record_args: u8,
    d: &Path,
) -> Res<(f64, String)> {
    let out = d.join("fast.out");
    let mut opts = SpawnOptions {
        stdout: Some(File::create(&out)?),
        env: vec![("GMON_OUT_PREFIX".into(), d.join("gmon").into_os_string())],
        ..Default::default()
    };
    let lazy = std::env::var_os("BENCH_LAZY").is_some();
    let ring_log2: u32 = std::env::var("BENCH_RING_LOG2")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if lazy { 22 } else { 16 });
    let config = FastPathConfig {
        stubs,
        max_threads: 4,
        ring_capacity: 1 << ring_log2,
        record_args,
        ..Default::default()
    };
    let pending = FastPath::for_spawn(&mut opts, &find_agent()?, config)?;
    let args: Vec<OsString> = vec![n.to_string().into(), func.into()];
    let mut t = ProcessTarget::spawn_with(bin, &args, &opts)?;
    pin(t.pid(), TARGET_CPU);
    let mut fp = pending.attach(&mut t)?;
    let info = fp.add(&mut t, func, action, choice)?;
    t.resume_all()?;
    let mut events = 0u64;
    // Drain in batches: nap unless the pass found an eighth of a ring or more
    // (a consumer right behind the producer slows it down).
    let batch_div: u64 = std::env::var("BENCH_BATCH_DIV")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(8);
    let batch = fp.ring_capacity() as u64 / batch_div;
    // Time spent in `drain` (the consumer's cost per event: can it keep up?).
    // The drain loop runs SCHED_FIFO (best effort, root): other load on the
    // tracer's CPU must not keep it off for milliseconds (the ring then
    // overflows). Only this thread, only while it drains: it sleeps most of
    // the time, and the target was forked before, at normal policy.
    let _rt = RealTime::enter();
    // The longest gap between two passes (a tracer kept off the CPU).
    let mut drain_time = Duration::ZERO;
    let mut max_gap = Duration::ZERO;
    let mut last: Option<std::time::Instant> = None;
    let mut drain = |fp: &mut FastPath| {
        let t0 = std::time::Instant::now();
        if let Some(l) = last {
            max_gap = max_gap.max(t0 - l);
        }
        let got = fp.drain(|e| {
            std::hint::black_box(e);
        });
        let t1 = std::time::Instant::now();
        drain_time += t1 - t0;
        last = Some(t1);
        got
    };
    loop {
        let got = if lazy { 0 } else { drain(&mut fp) };
        events += got;
        let nap = if got < batch {
            Duration::from_micros(100)
        } else {
            Duration::ZERO
        };
        match t.wait(Some(nap))? {
            TargetEvent::Exited(_) => break,
            TargetEvent::ModulesChanged { thread } => t.resume(thread, ResumeMode::Continue)?,
            TargetEvent::Breakpoint { thread, .. } | TargetEvent::Stepped { thread, .. } => {
                t.resume(thread, ResumeMode::Continue)?
            }
            _ => {}
        }
    }
    events += drain(&mut fp);
    let hits = fp.count(info.probe_id);
    if hits != n {
        return Err(format!("{}: counted {hits} of {n} calls", info.function).into());
    }
    let mut note = format!(
        "{}{}",
        info.mechanism,
        if info.stub {
            ", stub"
        } else {
            ", generic trampoline"
        }
    );
    if let Some(x) = info.exit_probe_id {
        let r = fp.count(x);
        if r != n {
            return Err(format!("{}: counted {r} of {n} returns", info.function).into());
        }
        note.push_str(", exits counted");
    }
    if action.record {
        note.push_str(&format!(
            ", {}-byte events, ring {}, {events} events, {} dropped, drain {:.1} ns/event, longest gap between drains {} µs",
            fp.shm().layout().params.event_size,
            fp.ring_capacity(),
            fp.drops(),
            drain_time.as_nanos() as f64 / events.max(1) as f64,
            max_gap.as_micros()
        ));
    }
    let text = std::fs::read_to_string(&out)?;
    Ok((ns_of(&text)?, note))
}

/// SCHED_FIFO priority 1 for the calling thread until dropped (best effort;
/// the previous policy is restored).
struct RealTime(Option<(i32, libc::sched_param)>);

impl RealTime {
    fn enter() -> RealTime {
        let mut old = libc::sched_param { sched_priority: 0 };
        // SAFETY: the calling thread; `old` is a valid out-pointer.
        let policy = unsafe { libc::sched_getscheduler(0) };
        // SAFETY: as above.
        if policy < 0 || unsafe { libc::sched_getparam(0, &mut old) } != 0 {
            return RealTime(None);
        }
        if policy == libc::SCHED_FIFO {
            return RealTime(None);
        }
        let p = libc::sched_param { sched_priority: 1 };
        // SAFETY: valid parameters for the calling thread.
        let ok = unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &p) } == 0;
        RealTime(ok.then_some((policy, old)))
    }
}

impl Drop for RealTime {
    fn drop(&mut self) {
        if let Some((policy, p)) = self.0 {
            // SAFETY: as above; back to the previous policy.
            unsafe { libc::sched_setscheduler(0, policy, &p) };
        }
    }
}

fn uftrace(bin: &Path, n: u64, d: &Path) -> Res<(f64, String)> {
    let data = d.join("uftrace.data");
    let o = Command::new("taskset")
        .args(["-c", &TARGET_CPU.to_string()])
        .args(["uftrace", "record", "--no-libcall", "-d"])
        .arg(&data)
        .arg(bin)
        .args([n.to_string(), "empty".into()])
        .output()?;
    let _ = std::fs::remove_dir_all(&data);
    let ns = ns_of(&String::from_utf8_lossy(&o.stdout))?;
    Ok((ns, "uftrace 0.13 record, -pg build, entry+exit".into()))
}

fn symbol_offset(bin: &Path, name: &str) -> Res<u64> {
    let o = Command::new("nm").arg(bin).output()?;
    let text = String::from_utf8_lossy(&o.stdout);
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] == name).then(|| u64::from_str_radix(f[0], 16).ok())?
        })
        .next()
        .ok_or_else(|| format!("no {name} in {}", bin.display()).into())
}

fn frida(bin: &Path, n: u64) -> Res<(f64, String)> {
    let off = symbol_offset(bin, "small")?;
    let o = Command::new("taskset")
        .args(["-c", &TARGET_CPU.to_string()])
        .arg(peer_python())
        .arg(src().join("frida_count.py"))
        .arg(bin)
        .arg(format!("{off:#x}"))
        .args([n.to_string(), "small".into()])
        .output()?;
    let text = String::from_utf8_lossy(&o.stdout);
    if !o.status.success() || !text.contains("ns/call") {
        return Err(format!(
            "frida failed: {}",
            String::from_utf8_lossy(&o.stderr)
                .lines()
                .last()
                .unwrap_or("")
        )
        .into());
    }
    let v = frida_version();
    Ok((
        ns_of(&text)?,
        format!("Frida {v} Interceptor + CModule onEnter counter, `small`"),
    ))
}

/// The Python with Frida: scripts/setup.sh's virtualenv, else the system's.
fn peer_python() -> PathBuf {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/peers-venv/bin/python3");
    if venv.exists() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

fn frida_version() -> String {
    Command::new(peer_python())
        .args(["-c", "import frida; print(frida.__version__)"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn bpftrace(bin: &Path, n: u64) -> Res<(f64, String)> {
    let b = bin.display();
    let prog =
        format!("uprobe:{b}:empty {{ @e = count(); }} uretprobe:{b}:empty {{ @r = count(); }}");
    let o = Command::new("bpftrace")
        .args(["-e", &prog, "-c"])
        .arg(format!("/usr/bin/taskset -c {TARGET_CPU} {b} {n} empty"))
        .output()?;
    let text = String::from_utf8_lossy(&o.stdout);
    let ns = ns_of(&text)?;
    let counts: Vec<&str> = text.lines().filter(|l| l.starts_with('@')).collect();
    Ok((
        ns,
        format!("bpftrace uprobe+uretprobe count ({})", counts.join(" ")),
    ))
}

struct Row {
    build: &'static str,
    what: String,
    action: &'static str,
    n: u64,
    samples: Vec<f64>,
    base: Option<f64>,
    note: String,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[s.len() / 2]
}

fn repeat(reps: usize, mut f: impl FnMut() -> Res<(f64, String)>) -> Res<(Vec<f64>, String)> {
    let mut v = Vec::new();
    let mut note = String::new();
    for _ in 0..reps {
        let (x, nt) = f()?;
        v.push(x);
        note = nt;
    }
    Ok((v, note))
}

fn main() -> Res<()> {
    let mut n: u64 = 100_000_000;
    let mut reps = 3;
    let mut peers = true;
    let mut only: Option<String> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--n" => n = args.next().ok_or("--n N")?.parse()?,
            "--reps" => reps = args.next().ok_or("--reps R")?.parse()?,
            "--no-peers" => peers = false,
            "--only" => only = Some(args.next().ok_or("--only SUBSTRING")?),
            _ => return Err(format!("unknown argument {a}").into()),
        }
    }
    pin(0, TRACER_CPU);
    // Best effort (root): a higher priority than other load on the machine,
    // inherited by every target, native or traced, and peer alike.
    // SAFETY: plain system call on this process.
    if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, -10) } != 0 {
        eprintln!("note: cannot raise priority (not root?); other load may disturb the timings");
    }
    let d = dir();
    let plain = compile(&d, "bench-plain", &["-O2"])?;
    let pfe = compile(&d, "bench-pfe", &["-O2", "-fpatchable-function-entry=5"])?;
    let mcount = compile(
        &d,
        "bench-mcount",
        &[
            "-O2",
            "-fno-pie",
            "-no-pie",
            "-pg",
            "-mfentry",
            "-mnop-mcount",
            "-mrecord-mcount",
        ],
    )?;
    let inst = compile(&d, "bench-inst", &["-O2", "-finstrument-functions"])?;
    let (bytes, list) = hotprobe_coldpatch::coldpatch(&std::fs::read(&inst)?)?;
    let cold = d.join("bench-cold");
    std::fs::write(&cold, bytes)?;
    std::fs::set_permissions(&cold, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    std::fs::write(probe_list_path(&cold), list.to_text())?;
    let pg = compile(&d, "bench-pg", &["-O2", "-pg"])?;

    let mut rows: Vec<Row> = Vec::new();
    let mut nat = |build: &'static str, bin: &Path, func: &str| -> Res<f64> {
        let (v, _) = repeat(reps, || Ok((native(bin, n, func)?, String::new())))?;
        let m = median(&v);
        rows.push(Row {
            build,
            what: format!("native `{func}`"),
            action: "-",
            n,
            samples: v,
            base: None,
            note: String::new(),
        });
        Ok(m)
    };
    let base_empty = nat("-O2", &plain, "empty")?;
    let base_small = nat("-O2", &plain, "small")?;
    nat("-O2 -fpatchable-function-entry=5", &pfe, "empty")?;
    nat("-O2 -pg -mfentry -mnop-mcount", &mcount, "empty")?;
    nat("-O2 -finstrument-functions, coldpatched", &cold, "empty")?;
    // (build, binary, function, mechanism, exits, base, entry arguments recorded)
    type Case<'a> = (
        &'static str,
        &'a Path,
        &'a str,
        MechanismChoice,
        bool,
        f64,
        u8,
    );
    let cases: Vec<Case> = vec![
        (
            "-O2 -fpatchable-function-entry=5",
            &pfe,
            "empty",
            MechanismChoice::Patch,
            false,
            base_empty,
            2,
        ),
        (
            "-O2 -pg -mfentry -mnop-mcount",
            &mcount,
            "empty",
            MechanismChoice::Patch,
            false,
            base_empty,
            2,
        ),
        (
            "-O2 -finstrument-functions, coldpatched",
            &cold,
            "empty",
            MechanismChoice::Patch,
            true,
            base_empty,
            2,
        ),
        (
            "-O2 -finstrument-functions, coldpatched",
            &cold,
            "empty",
            MechanismChoice::Patch,
            true,
            base_empty,
            6,
        ),
        (
            "-O2",
            &plain,
            "small",
            MechanismChoice::Jump,
            false,
            base_small,
            2,
        ),
    ];
    for stubs in [true, false] {
        for (i, &(build, bin, func, choice, exit, base, record_args)) in cases.iter().enumerate() {
            if !stubs && build.contains("mcount") {
                continue;
            }
            if only.as_deref().is_some_and(|o| !build.contains(o)) {
                continue;
            }
            // The same build again with 6 arguments: its record row only.
            let again = i > 0 && cases[i - 1].0 == build;
            for (aname, record) in [("count", false), ("record", true)] {
                if again && !record {
                    continue;
                }
                let mut action = if record {
                    Action::record()
                } else {
                    Action::count()
                };
                if exit {
                    action = action.with_exit();
                }
                let label: &'static str = match (record, exit, record_args > 2) {
                    (false, false, _) => "count (entry)",
                    (true, false, _) => "record (entry)",
                    (false, true, _) => "count (entry+exit)",
                    (true, true, false) => "record (entry+exit)",
                    (true, true, true) => "record (entry 6 args+exit)",
                };
                let _ = aname;
                let (v, note) = repeat(reps, || {
                    fast(bin, n, func, action, choice, stubs, record_args, &d)
                })?;
                rows.push(Row {
                    build,
                    what: format!("hotprobe `{func}`"),
                    action: label,
                    n,
                    samples: v,
                    base: Some(base),
                    note,
                });
            }
        }
    }
    if peers {
        let nu = n.min(10_000_000);
        match repeat(reps, || uftrace(&pg, nu, &d)) {
            Ok((v, note)) => rows.push(Row {
                build: "-O2 -pg",
                what: "uftrace `empty`".into(),
                action: "record (entry+exit)",
                n: nu,
                samples: v,
                base: Some(base_empty),
                note,
            }),
            Err(e) => eprintln!("uftrace: {e}"),
        }
        match repeat(reps, || frida(&plain, nu)) {
            Ok((v, note)) => rows.push(Row {
                build: "-O2",
                what: "Frida `small`".into(),
                action: "count (entry)",
                n: nu,
                samples: v,
                base: Some(base_small),
                note,
            }),
            Err(e) => eprintln!("frida: {e}"),
        }
        let nb = n.min(100_000);
        match repeat(reps.min(2), || bpftrace(&plain, nb)) {
            Ok((v, note)) => rows.push(Row {
                build: "-O2",
                what: "bpftrace `empty`".into(),
                action: "count (entry+exit)",
                n: nb,
                samples: v,
                base: Some(base_empty),
                note,
            }),
            Err(e) => eprintln!("bpftrace: {e}"),
        }
    }
    let _ = std::fs::remove_dir_all(&d);
    println!(
        "\nTracer on CPU {TRACER_CPU}, targets on CPU {TARGET_CPU}; median of {reps} runs (spread min–max); × native of the same function.\n"
    );
    println!("| build | probe | action | N | ns/call | spread | × native | notes |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in &rows {
        let m = median(&r.samples);
        let lo = r.samples.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = r.samples.iter().cloned().fold(0.0, f64::max);
        let x = r
            .base
            .map_or("1.00".to_string(), |b| format!("{:.2}", m / b));
        println!(
            "| {} | {} | {} | {} | {:.2} | {:.2}–{:.2} | {} | {} |",
            r.build, r.what, r.action, r.n, m, lo, hi, x, r.note
        );
    }
    Ok(())
}
