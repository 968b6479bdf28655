//! Per-hit cost of a null probe on a guest kernel, hotprobe (emulated entry,
//! stepped, boosted) next to gdb (a Python `gdb.Breakpoint` whose `stop`
//! returns False) on the same QEMU TCG stub, in one run, and the guest's
//! getppid latency with and without a probe.
//!
//! `cargo run --release -p hotprobe-guest --example bench_guest [CALLS]`
//! (needs scripts/setup.sh's kernel and QEMU; boots one guest).

#[path = "../tests/guest/harness.rs"]
mod harness;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use harness::Guest;
use hotprobe::{Probe, Session, TargetId};
use hotprobe_guest::{connect_guest, load_symbols, GuestConfig, StubAddr};

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

fn main() {
    if let Some(why) = harness::missing_prerequisite() {
        eprintln!("cannot run: {why}");
        std::process::exit(1);
    }
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let mut g = Guest::boot("bench");
    println!(
        "guest booted in {:.1} s; {n} getppid calls per run",
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

    let mut rows = Vec::new();
    let mut cfg = GuestConfig::new(StubAddr::Unix(g.gdb_socket.clone()));
    cfg.ram_file = Some(g.ram_file.clone());
    let mut s = Session::new();
    let t = connect_guest(&mut s, cfg, syms).unwrap();
    s.start().unwrap();
    let inner = "__x64_sys_getppid+0xb";
    for (label, spec, post) in [
        ("hotprobe, entry NOP (emulated)", "__x64_sys_getppid", false),
        ("hotprobe, stepped (post handler)", inner, true),
        ("hotprobe, boosted", inner, false),
    ] {
        let mut p = Probe::new().pre(|_| {});
        if post {
            p = p.post(|_| {});
        }
        let id = s.probe(t, spec, p).unwrap();
        let f0 = g.tb_flushes();
        let ms = timed(&mut g, Some((&mut s, t)), n);
        let f1 = g.tb_flushes();
        assert_eq!(s.stats(id).unwrap().hits, n, "{label}: exact count");
        let per_hit = (ms - base) / n as f64;
        println!(
            "{label:<36} {per_hit:7.3} ms per hit ({:.2} TB flushes per hit) [{}]",
            (f1 - f0) as f64 / n as f64,
            s.execution_of(id).unwrap_or("?")
        );
        rows.push((label, per_hit));
        s.remove_probe(id).unwrap();
    }
    s.detach().unwrap();

    // gdb on the same stub, same instruction.
    let addr = getppid + 0xb;
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
        .stderr(Stdio::inherit())
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
    let ms = timed(&mut g, None, n);
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
    let gdb_hit = (ms - base) / n as f64;
    println!(
        "{:<36} {gdb_hit:7.3} ms per hit ({:.2} TB flushes per hit) [{hits}]",
        "gdb, Python Breakpoint.stop -> False",
        (f1 - f0) as f64 / n as f64
    );
    for (label, v) in &rows {
        println!("{label:<36} {:.2}x gdb", v / gdb_hit);
    }
    g.send_line("getppid 3");
    g.wait_for("@getppid 3 done", LONG);
}
