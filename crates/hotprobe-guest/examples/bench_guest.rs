//! Per-hit cost of a null probe on a guest kernel, hotprobe (emulated entry,
//! stepped, boosted) next to gdb (a Python `gdb.Breakpoint` whose `stop`
//! returns False) on the same QEMU TCG stub, in one run, and the guest's
//! getppid latency with and without a probe. Each hotprobe row is measured
//! twice: reading the whole `g` block at every hit (as before partial
//! registers) and reading `rip` alone (the default), with the RSP packets
//! exchanged per hit. Then the cost of a handler's 64-byte memory read
//! through the mapped guest RAM (page walk from cr3) against the stub's `m`.
//!
//! Then, on a second guest started by hotprobe with its QEMU plugin (the
//! workload as init), per hit in one run: no probe, a plugin count, a
//! plugin event with two values (asynchronous ring), a plugin event answered
//! by a synchronous handler in this process, a boosted stub probe, and gdb
//! (on a third guest: gdb needs a stub of its own), each in host time and
//! in the guest's own time (what a probe steals from the guest's clock);
//! `boot`: boot time with 10,000 candidate sites armed against no plugin;
//! `guest`: both. `BENCH_QEMU_EXTRA` adds QEMU arguments (`-icount
//! shift=0`), `HOTPROBE_PLUGIN_TIME_CONTROL=1` makes the plugin take QEMU's
//! time control, `BENCH_NO_GDB=1` leaves gdb out.
//!
//! `cargo run --release -p hotprobe-guest --example bench_guest [CALLS [ROUNDS [plugin|boot|guest]]]`
//! (needs scripts/setup.sh's kernel and QEMU; boots two guests; `plugin`
//! runs the plugin rows only). Every mode and gdb run once per round,
//! interleaved, and the medians are compared, so that load from other
//! processes hits them alike.

#[path = "../tests/guest/harness.rs"]
mod harness;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use harness::Guest;
use hotprobe::{Probe, Session, TargetId};
use hotprobe_guest::{
    load_symbols, text_bounds, GuestConfig, GuestStats, GuestTarget, KernelResolver, StatsHandle,
    StubAddr,
};
use hotprobe_symbols::KernelSymbols;
use hotprobe_target::{GuestVirt, ResumeMode, RuntimeAddr, Target, TargetEvent};

const LONG: Duration = Duration::from_secs(600);

/// Milliseconds for the workload's `getppid n` round trip, with the session
/// (if any) handling hits meanwhile.
fn timed(g: &mut Guest, s: Option<(&mut Session, TargetId)>, n: u64) -> f64 {
    let marker = format!("@getppid {n} done");
    g.send_line(&format!("getppid {n}"));
    let t0 = Instant::now();
    match s {
        None => {
            g.wait_for(&marker, LONG);
        }
        Some((s, t)) => loop {
            s.engine(t)
                .unwrap()
                .poll(Some(Duration::from_millis(2)))
                .unwrap();
            if g.seen(&marker) {
                break;
            }
        },
    }
    t0.elapsed().as_secs_f64() * 1e3
}

/// A session on the booted guest (as the CLI makes it), with a
/// handle on the target's counters; `partial`: breakpoint hits read `rip`
/// alone.
fn attach(g: &Guest, syms: &KernelSymbols, partial: bool) -> (Session, TargetId, StatsHandle) {
    let mut cfg = GuestConfig::new(StubAddr::Unix(g.gdb_socket.clone()));
    cfg.ram_file = Some(g.ram_file.clone());
    cfg.kernel_text = text_bounds(syms);
    cfg.partial_registers = partial;
    let target = GuestTarget::connect(cfg).unwrap();
    let stats = target.stats_handle();
    let mut s = Session::new();
    let t = s.add_target(
        Box::new(target),
        Some(Box::new(KernelResolver::new(syms.clone()))),
    );
    s.engine(t).unwrap().set_step_unsupported_in_place(true);
    s.start().unwrap();
    (s, t, stats)
}

/// Microseconds per 64-byte read, `reads` times each way, of a kernel text
/// address and of the `pt_regs` a getppid call passes in `rdi`: through the
/// mapped RAM (page walk from cr3) and through the stub's `m` packet.
fn memory_reads(g: &mut Guest, getppid: u64) {
    const READS: u32 = 1000;
    let mut cfg = GuestConfig::new(StubAddr::Unix(g.gdb_socket.clone()));
    cfg.ram_file = Some(g.ram_file.clone());
    let mut t = GuestTarget::connect(cfg).unwrap();
    t.insert_breakpoint(RuntimeAddr(getppid)).unwrap();
    t.resume_all().unwrap();
    g.send_line("getppid 1");
    let thread = loop {
        match t.wait(Some(LONG)).unwrap() {
            TargetEvent::Breakpoint { thread, addr, .. } if addr.0 == getppid => break thread,
            TargetEvent::Breakpoint { thread, .. } => {
                t.resume(thread, ResumeMode::Continue).unwrap()
            }
            other => panic!("unexpected {other:?}"),
        }
    };
    let pt_regs = t.registers(thread).unwrap().rdi;
    for (what, addr) in [
        ("kernel text", getppid),
        ("pt_regs (kernel stack)", pt_regs),
    ] {
        let mut direct = [0u8; 64];
        let mut stub = [0u8; 64];
        let t0 = Instant::now();
        for _ in 0..READS {
            t.read_memory_direct(GuestVirt(addr), &mut direct).unwrap();
        }
        let us_direct = t0.elapsed().as_secs_f64() * 1e6 / READS as f64;
        let t0 = Instant::now();
        for _ in 0..READS {
            t.read_memory_stub(GuestVirt(addr), &mut stub).unwrap();
        }
        let us_stub = t0.elapsed().as_secs_f64() * 1e6 / READS as f64;
        assert_eq!(direct, stub, "{what}: both ways read the same bytes");
        println!(
            "64-byte read of {what:<24} mapped RAM {us_direct:7.2} us, stub m {us_stub:7.2} us: {:.0}x faster",
            us_stub / us_direct
        );
    }
    t.remove_breakpoint(RuntimeAddr(getppid)).unwrap();
    t.resume(thread, ResumeMode::Continue).unwrap();
    t.detach().unwrap();
    g.wait_for("@getppid 1 done", LONG);
}

/// One gdb run on the same stub and instruction: per-hit milliseconds, TB
/// flushes per hit, and gdb's own hit count line.
fn gdb_run(g: &mut Guest, addr: u64, n: u64, base: f64) -> (f64, f64, String) {
    let script = g.dir.join("nullbp.py");
    std::fs::write(
        &script,
        format!(
            r#"import gdb
gdb.execute("set pagination off")
gdb.execute("set confirm off")
gdb.execute("target remote {sock}")
class NullBP(gdb.Breakpoint):
    def stop(self):
        self.n += 1
        return False
b = NullBP("*{addr:#x}")
b.n = 0
print("GDB-READY", flush=True)
try:
    gdb.execute("continue")
except Exception as e:
    print("continue ended:", e)
print("GDB-HITS", b.n, flush=True)
b.delete()
gdb.execute("detach")
"#,
            sock = g.gdb_socket.display(),
        ),
    )
    .unwrap();
    let mut gdb = Command::new("gdb")
        .args(["-nx", "-batch", "-x"])
        .arg(&script)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("gdb");
    let mut out = BufReader::new(gdb.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "gdb ended before READY"
        );
        if line.contains("GDB-READY") {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    let f0 = g.tb_flushes();
    let ms = timed(g, None, n);
    let f1 = g.tb_flushes();
    // SAFETY: kill(2) on our own child.
    unsafe { libc::kill(gdb.id() as i32, libc::SIGINT) };
    let mut hits = String::new();
    for l in out.lines() {
        let l = l.unwrap();
        if l.starts_with("GDB-HITS") {
            hits = l;
        }
    }
    let _ = gdb.wait();
    ((ms - base) / n as f64, (f1 - f0) as f64 / n as f64, hits)
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

fn main() {
    if let Some(why) = harness::missing_prerequisite() {
        eprintln!("cannot run: {why}");
        std::process::exit(1);
    }
    let arg = |i: usize, default: u64| {
        std::env::args()
            .nth(i)
            .and_then(|a| a.parse().ok())
            .unwrap_or(default)
    };
    let n: u64 = arg(1, 200);
    let rounds = arg(2, 5) as usize;
    match std::env::args().nth(3).as_deref() {
        Some("plugin") => {
            plugin_rows(n, rounds);
            return;
        }
        Some("boot") => {
            boot_rows(rounds);
            return;
        }
        Some("guest") => {
            plugin_rows(n, rounds);
            boot_rows(rounds);
            return;
        }
        _ => {}
    }
    let mut g = Guest::boot("bench");
    println!(
        "guest booted in {:.1} s; {n} getppid calls per run, {rounds} rounds \
         (every mode and gdb once per round, interleaved)",
        g.boot_time.as_secs_f64()
    );
    let getppid = g.sym("__x64_sys_getppid");
    let (syms, _) = load_symbols(&g.kallsyms_file()).unwrap();

    // Baseline (no client at all), a few runs.
    let base: f64 = (0..3)
        .map(|_| timed(&mut g, None, n))
        .fold(f64::MAX, f64::min);
    let base_big = timed(&mut g, None, n * 100);
    println!(
        "no probe: {:.3} ms per {n}-call round trip (console included); {:.2} us per getppid ({}-call run)",
        base,
        (base_big - base) * 1e3 / (n * 99) as f64,
        n * 100
    );

    let inner = "__x64_sys_getppid+0xb";
    let modes = [
        ("entry NOP (emulated)", "__x64_sys_getppid", false),
        ("stepped (post handler)", inner, true),
        ("boosted", inner, false),
    ];
    // (label, per-hit ms of each round, counters line of the first round,
    // per-hit microseconds the VM waited on us in each round)
    type Row = (String, Vec<f64>, String, Vec<f64>);
    let mut rows: Vec<Row> = Vec::new();
    let mut gdb_ms = Vec::new();
    let mut gdb_line = String::new();
    for round in 0..rounds {
        let mut row = 0;
        for partial in [false, true] {
            let (mut s, t, stats) = attach(&g, &syms, partial);
            for (label, spec, post) in modes {
                let label = format!(
                    "hotprobe, {label}{}",
                    if partial { "" } else { ", g per hit" }
                );
                let mut p = Probe::new().pre(|_| {});
                if post {
                    p = p.post(|_| {});
                }
                let id = s.probe(t, spec, p).unwrap();
                let f0 = g.tb_flushes();
                let c0 = stats.get();
                let ms = timed(&mut g, Some((&mut s, t)), n);
                let c1 = stats.get();
                let f1 = g.tb_flushes();
                assert_eq!(s.stats(id).unwrap().hits, n, "{label}: exact count");
                let per = |f: fn(&GuestStats) -> u64| (f(&c1) - f(&c0)) as f64 / n as f64;
                let counters = format!(
                    "{:.2} TB flushes, {:.2} packets, {:.2} round trips: {:.2} g, {:.2} p, \
                     {:.2} rip writes, {:.2} stops",
                    (f1 - f0) as f64 / n as f64,
                    per(|c| c.packets_sent + c.packets_received),
                    per(|c| c.round_trips),
                    per(|c| c.register_reads),
                    per(|c| c.pc_reads),
                    per(|c| c.pc_writes),
                    per(|c| c.stops),
                );
                if round == 0 {
                    rows.push((label, Vec::new(), counters, Vec::new()));
                }
                rows[row].1.push((ms - base) / n as f64);
                rows[row].3.push(per(|c| c.stopped_us));
                row += 1;
                s.remove_probe(id).unwrap();
            }
            s.detach().unwrap();
        }
        let (ms, flushes, hits) = gdb_run(&mut g, getppid + 0xb, n, base);
        gdb_ms.push(ms);
        gdb_line = format!("{flushes:.2} TB flushes; {hits}");
    }

    println!(
        "per hit, ms: median (min..max) over {rounds} rounds; us the VM stood stopped \
         waiting on hotprobe (median); counters per hit"
    );
    for (label, v, counters, stopped) in &rows {
        let (lo, hi) = v
            .iter()
            .fold((f64::MAX, 0f64), |(l, h), x| (l.min(*x), h.max(*x)));
        println!(
            "{label:<42} {:7.3} ({lo:.3}..{hi:.3}) {:5.0} us  [{counters}]",
            median(v),
            median(stopped)
        );
    }
    let (lo, hi) = gdb_ms
        .iter()
        .fold((f64::MAX, 0f64), |(l, h), x| (l.min(*x), h.max(*x)));
    println!(
        "{:<42} {:7.3} ({lo:.3}..{hi:.3})  [{gdb_line}]",
        "gdb, Python Breakpoint.stop -> False",
        median(&gdb_ms)
    );
    println!(
        "ratio to gdb: median/median, min/min (the least disturbed runs), and per \
         round (same round's gdb run)"
    );
    let gm = median(&gdb_ms);
    let min = |v: &[f64]| v.iter().copied().fold(f64::MAX, f64::min);
    for (label, v, _, _) in &rows {
        let per_round: Vec<String> = v
            .iter()
            .zip(&gdb_ms)
            .map(|(x, g)| format!("{:.2}", x / g))
            .collect();
        println!(
            "{label:<42} {:.2}x gdb, min {:.2}x  [{}]",
            median(v) / gm,
            min(v) / min(&gdb_ms),
            per_round.join(" ")
        );
    }

    memory_reads(&mut g, getppid);
    g.send_line("getppid 3");
    g.wait_for("@getppid 3 done", LONG);
    drop(g);
    plugin_rows(n, rounds);
}

/// Milliseconds for the workload's `getppid n` round trip on a console.
/// `timed n` on the console: (host ms for the round trip, guest ms the
/// workload measured on its own clock for the loop).
fn timed_console(c: &mut harness::Console, n: u64) -> (f64, f64) {
    let marker = format!("@timed {n} ns=");
    c.send_line(&format!("timed {n}"));
    let t0 = Instant::now();
    c.wait_for(&marker, LONG);
    let host = t0.elapsed().as_secs_f64() * 1e3;
    let line = c.wait_for("\n", LONG);
    let ns: f64 = String::from_utf8_lossy(&line).trim().parse().unwrap();
    (host, ns / 1e6)
}

/// Extra QEMU arguments from `BENCH_QEMU_EXTRA` (split on spaces), e.g.
/// `-icount shift=0`.
fn qemu_extra() -> Vec<std::ffi::OsString> {
    std::env::var("BENCH_QEMU_EXTRA")
        .unwrap_or_default()
        .split_whitespace()
        .map(Into::into)
        .collect()
}

/// The plugin rows: one guest started with the plugin, every mode once per
/// round, interleaved; per hit = (run - run without probe) / calls, in host
/// time and in the guest's own time (what a probe steals from the guest).
/// gdb on a second guest (its own stub) in the same rounds.
fn plugin_rows(n_stub: u64, rounds: usize) {
    use hotprobe_qemu::{Delivery, Fetch, PluginConfig, PluginProbe, Reg};
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    let n = 1_000_000u64;
    let syms_path = harness::kallsyms_cached();
    let (syms, _) = load_symbols(&syms_path).unwrap();
    let getppid = syms.lookup("__x64_sys_getppid").unwrap().addr.0;
    let dir = std::env::temp_dir().join(format!("hp-bench-plugin-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut qargs = harness::qemu_args(&dir, "rdinit=/workload");
    qargs.extend(qemu_extra());
    let mut launched = hotprobe_guest::launch(
        &qargs,
        syms.clone(),
        hotprobe_guest::LaunchOptions {
            plugin: PluginConfig {
                ring_capacity: 1 << 20,
                max_vcpus: 1,
                sync_spin: std::env::var("SYNC_SPIN_US")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .map_or(PluginConfig::default().sync_spin, Duration::from_micros),
                host_spin: std::env::var("HOST_SPIN_US")
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .map_or(PluginConfig::default().host_spin, Duration::from_micros),
                ..PluginConfig::default()
            },
            stdin: Some(Stdio::piped()),
            stdout: Some(Stdio::piped()),
            ..Default::default()
        },
    )
    .unwrap();
    launched.qemu.kill_on_drop = true;
    let mut con = harness::Console::new(
        launched.qemu.child.stdin.take(),
        launched.qemu.child.stdout.take().unwrap(),
    );
    let mut host = launched.plugin;
    let probe = |delivery, values: Vec<Fetch>| PluginProbe {
        delivery,
        values,
        sites: vec![getppid],
        ..PluginProbe::default()
    };
    let two = vec![Fetch::Reg(Reg::Rdi), Fetch::pt_regs_field(14)];
    let p_count = host.add_probe(&probe(Delivery::Count, vec![])).unwrap();
    let p_async = host
        .add_probe(&probe(Delivery::Async, two.clone()))
        .unwrap();
    let p_sync = host.add_probe(&probe(Delivery::Sync, two)).unwrap();
    let answered = Arc::new(AtomicU64::new(0));
    let a2 = answered.clone();
    host.set_sync_handler(Box::new(move |ev, _| {
        a2.fetch_add(1, Ordering::Relaxed);
        ev.values[0]
    }));
    host.freeze().unwrap();
    // The stub, on the same QEMU, through a session.
    let mut s = Session::new();
    let t = s.add_target(Box::new(launched.target), Some(Box::new(launched.resolver)));
    s.engine(t).unwrap().set_step_unsupported_in_place(true);
    s.start().unwrap();
    con.wait_for("@READY", LONG);
    // gdb needs a stub of its own: a second guest.
    let with_gdb = std::env::var_os("BENCH_NO_GDB").is_none();
    let mut gg = with_gdb.then(|| Guest::boot("bench-gdb"));
    let flushes = || harness::tb_flushes_at(&dir.join("monitor.sock"));
    // (label, calls, host us per hit, guest us per hit, note)
    type Row = (&'static str, u64, Vec<f64>, Vec<f64>, String);
    let n_sync = n / 10;
    let row = |l, c| (l, c, Vec::new(), Vec::new(), String::new());
    let mut rows: Vec<Row> = vec![
        row("no probe (us per getppid)", n),
        row("plugin count", n),
        row("plugin event, 2 values, async ring", n),
        row("plugin event, 2 values, sync handler", n_sync),
        row("stub, boosted, null handler", n_stub),
        row("gdb, Python Breakpoint.stop -> False", n_stub),
    ];
    let inner = "__x64_sys_getppid+0xb";
    let mut hits = [0u64; 3];
    let mut sync_notes: Vec<String> = Vec::new();
    for round in 0..rounds {
        // Each mode against a run without probe of the same length taken
        // just before it: the difference per call is the hit's cost.
        let small = timed_console(&mut con, 1);
        let base = timed_console(&mut con, n);
        rows[0].2.push((base.0 - small.0) * 1e3 / n as f64);
        rows[0].3.push(base.1 * 1e3 / n as f64);
        for (row, p) in [(1, p_count), (2, p_async), (3, p_sync)] {
            let calls = rows[row].1;
            let base = timed_console(&mut con, calls);
            host.set_enabled(p, true).unwrap();
            let f0 = flushes();
            let a0 = answered.load(Ordering::Relaxed);
            let st0 = host.stats();
            let ms = timed_console(&mut con, calls);
            let st1 = host.stats();
            let f1 = flushes();
            host.set_enabled(p, false).unwrap();
            if row == 3 {
                // Where a synchronous hit's time goes: how often the vCPU
                // slept (no answer within its spin), how often it had to
                // wake the service thread, and its mean wait post->answer.
                let ev = (st1.sync_answered - st0.sync_answered).max(1) as f64;
                sync_notes.push(format!(
                    "r{round}: vCPU slept {:.0}%, woke host {:.0}%, wait {:.1} us",
                    100.0 * (st1.sync_vcpu_sleeps - st0.sync_vcpu_sleeps) as f64 / ev,
                    100.0 * (st1.sync_host_wakes - st0.sync_host_wakes) as f64 / ev,
                    (st1.sync_wait_ns - st0.sync_wait_ns) as f64 / ev / 1e3
                ));
            }
            let mut events = 0u64;
            host.drain(&mut |_, _| events += 1, &mut |_, _| {});
            hits[row - 1] += calls;
            assert_eq!(host.counts(p).hits, hits[row - 1], "exact counts");
            if round == 0 {
                rows[row].4 = format!(
                    "{} TB flushes; {} events drained, {} answered",
                    f1 - f0,
                    events,
                    answered.load(Ordering::Relaxed) - a0
                );
            }
            rows[row].2.push((ms.0 - base.0) * 1e3 / calls as f64);
            rows[row].3.push((ms.1 - base.1) * 1e3 / calls as f64);
        }
        let base = timed_console(&mut con, n_stub);
        let id = s.probe(t, inner, Probe::new().pre(|_| {})).unwrap();
        let f0 = flushes();
        let ms = loop_stub(&mut s, t, &mut con, n_stub);
        let f1 = flushes();
        assert_eq!(s.stats(id).unwrap().hits, n_stub);
        s.remove_probe(id).unwrap();
        if round == 0 {
            rows[4].4 = format!("{:.2} TB flushes per hit", (f1 - f0) as f64 / n_stub as f64);
        }
        rows[4].2.push((ms.0 - base.0) * 1e3 / n_stub as f64);
        rows[4].3.push((ms.1 - base.1) * 1e3 / n_stub as f64);
        if let Some(g) = gg.as_mut() {
            let gaddr = g.sym("__x64_sys_getppid") + 0xb;
            let base = timed(g, None, n_stub);
            let (ms, fl, hits) = gdb_run(g, gaddr, n_stub, base);
            rows[5].2.push(ms * 1e3);
            if round == 0 {
                rows[5].4 = format!("{fl:.2} TB flushes per hit; {hits}");
            }
        }
    }
    println!(
        "plugin guest: getppid calls per run: {n} ({n_sync} synchronous, {n_stub} with the stub \
         and gdb), {rounds} rounds, each mode against a run without probe just before it; \
         per hit, us: median (min..max), host time | guest time (the guest's own clock)"
    );
    for (label, _, v, gv, note) in &rows {
        if v.is_empty() {
            continue;
        }
        let mm = |v: &[f64]| {
            v.iter()
                .fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(*x), h.max(*x)))
        };
        let (lo, hi) = mm(v);
        let guest = if gv.is_empty() {
            "–".to_string()
        } else {
            let (glo, ghi) = mm(gv);
            format!("{:.3} ({glo:.3}..{ghi:.3})", median(gv))
        };
        println!(
            "{label:<40} {:9.3} ({lo:.3}..{hi:.3}) | {guest}  [{note}]",
            median(v)
        );
    }
    let gdb = median(&rows[5].2);
    if gdb.is_finite() {
        for r in &rows[1..5] {
            println!(
                "{:<40} {:.0}x below gdb (median/median)",
                r.0,
                gdb / median(&r.2)
            );
        }
    }
    println!("synchronous hits: {}", sync_notes.join("; "));
    println!("plugin: {:?}", host.stats());
    con.send_line("exit");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Boot time to the workload's READY: no plugin, and the plugin with
/// 10,000 candidate sites (kernel function entries) armed as one counting
/// probe; `rounds` boots each, interleaved.
fn boot_rows(rounds: usize) {
    use hotprobe_qemu::{Delivery, PluginConfig, PluginProbe};
    let (syms, _) = load_symbols(&harness::kallsyms_cached()).unwrap();
    // Every function's entry, but not the idle loop's or the stub's own
    // paths, up to 10,000, spread over the kernel text.
    let all: Vec<u64> = syms
        .symbols()
        .iter()
        .filter(|s| !s.name.contains('.') && !s.name.starts_with("__pfx_"))
        .map(|s| s.addr.0)
        .collect();
    let step = (all.len() / 10_000).max(1);
    let sites: Vec<u64> = all.iter().step_by(step).take(10_000).copied().collect();
    let mut plain = Vec::new();
    let mut armed = Vec::new();
    let mut hits = Vec::new();
    for round in 0..rounds {
        let dir =
            std::env::temp_dir().join(format!("hp-bench-boot-{}-{round}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut args = harness::qemu_args(&dir, "rdinit=/workload");
        args.extend(qemu_extra());
        // No plugin: QEMU as the user would start it.
        let t0 = Instant::now();
        let mut child = Command::new(&args[0])
            .args(&args[1..])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut con = harness::Console::new(child.stdin.take(), child.stdout.take().unwrap());
        con.wait_for("@READY", LONG);
        plain.push(t0.elapsed().as_secs_f64());
        let _ = child.kill();
        let _ = child.wait();
        // The plugin with the sites armed.
        let t0 = Instant::now();
        let mut g = hotprobe_guest::launch(
            &args,
            syms.clone(),
            hotprobe_guest::LaunchOptions {
                plugin: PluginConfig {
                    max_sites: 16_384,
                    ..PluginConfig::default()
                },
                stdin: Some(Stdio::piped()),
                stdout: Some(Stdio::piped()),
                ..Default::default()
            },
        )
        .unwrap();
        g.qemu.kill_on_drop = true;
        let mut con = harness::Console::new(
            g.qemu.child.stdin.take(),
            g.qemu.child.stdout.take().unwrap(),
        );
        let mut host = g.plugin;
        let p = host
            .add_probe(&PluginProbe {
                delivery: Delivery::Count,
                sites: sites.clone(),
                enabled: true,
                ..PluginProbe::default()
            })
            .unwrap();
        host.freeze().unwrap();
        let mut s = Session::new();
        let t = s.add_target(Box::new(g.target), Some(Box::new(g.resolver)));
        let _ = t;
        s.start().unwrap();
        con.wait_for("@READY", LONG);
        armed.push(t0.elapsed().as_secs_f64());
        hits.push(host.counts(p).hits);
        drop(s);
        g.qemu.kill();
        let _ = std::fs::remove_dir_all(&dir);
    }
    println!(
        "boot to READY, s, median (min..max) of {rounds}: no plugin {:.2} ({:.2}..{:.2}); \
         plugin, {} candidate sites armed (counting) {:.2} ({:.2}..{:.2}); ratio {:.3}; \
         hits during boot {:?}",
        median(&plain),
        plain.iter().cloned().fold(f64::MAX, f64::min),
        plain.iter().cloned().fold(0.0, f64::max),
        sites.len(),
        median(&armed),
        armed.iter().cloned().fold(f64::MAX, f64::min),
        armed.iter().cloned().fold(0.0, f64::max),
        median(&armed) / median(&plain),
        hits
    );
}

/// `getppid n` on the console while the session handles the stub's hits.
fn loop_stub(s: &mut Session, t: TargetId, con: &mut harness::Console, n: u64) -> (f64, f64) {
    let marker = format!("@timed {n} ns=");
    con.send_line(&format!("timed {n}"));
    let t0 = Instant::now();
    loop {
        s.engine(t)
            .unwrap()
            .poll(Some(Duration::from_millis(2)))
            .unwrap();
        if con.seen(&marker) {
            break;
        }
    }
    let host = t0.elapsed().as_secs_f64() * 1e3;
    let line = con.wait_for("\n", LONG);
    let ns: f64 = String::from_utf8_lossy(&line).trim().parse().unwrap();
    (host, ns / 1e6)
}
