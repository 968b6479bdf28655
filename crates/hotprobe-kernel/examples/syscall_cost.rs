//! What the host kernel's events cost a traced program per syscall
//! (docs/PERFORMANCE.md, "record --kernel"): a child process calls
//! getppid N times, timing the loop itself, once without events and once
//! under a [`KernelRecorder`] draining in the background (as
//! `record --kernel` runs it); each run is repeated and the median kept.
//!
//! `cargo run --release -p hotprobe-kernel --example syscall_cost -- [N] [RUNS]`
//! (as root, tracefs mounted).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};

use hotprobe_kernel::{KernelOptions, KernelRecorder};

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The child: waits for a line on stdin, then times `n` getppid calls
/// and prints the ns per call.
fn child(n: u64) {
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).unwrap();
    let t0 = now_ns();
    for _ in 0..n {
        // SAFETY: getppid has no arguments and cannot fail.
        unsafe { libc::syscall(libc::SYS_getppid) };
    }
    let dt = now_ns() - t0;
    println!("{}", dt as f64 / n as f64);
}

/// One run: ns per syscall, and (with events) the records and losses.
fn run(n: u64, traced: bool) -> (f64, u64, u64) {
    let exe = std::env::current_exe().unwrap();
    let mut c = Command::new(exe)
        .args(["child", &n.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let draining = traced.then(|| {
        let r = KernelRecorder::open(c.id() as i32, KernelOptions::default()).unwrap();
        r.enable().unwrap();
        r.drain_in_background().unwrap()
    });
    c.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let mut out = String::new();
    BufReader::new(c.stdout.take().unwrap())
        .read_line(&mut out)
        .unwrap();
    c.wait().unwrap();
    let per_call: f64 = out.trim().parse().unwrap();
    match draining {
        Some(d) => {
            let cap = d.finish().unwrap();
            (per_call, cap.stats.records, cap.stats.lost)
        }
        None => (per_call, 0, 0),
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("child") {
        child(args[2].parse().unwrap());
        return;
    }
    let n: u64 = args.get(1).map_or(200_000, |a| a.parse().unwrap());
    let runs: usize = args.get(2).map_or(5, |a| a.parse().unwrap());
    let mut plain = Vec::new();
    let mut traced = Vec::new();
    let (mut records, mut lost) = (0, 0);
    for _ in 0..runs {
        plain.push(run(n, false).0);
        let (t, r, l) = run(n, true);
        traced.push(t);
        records += r;
        lost += l;
    }
    let (p, t) = (median(plain), median(traced));
    println!("getppid x {n}, median of {runs} runs");
    println!("  without events: {p:.1} ns per syscall");
    println!(
        "  with events:    {t:.1} ns per syscall (+{:.1} ns: enter and exit records)",
        t - p
    );
    println!(
        "  records read {records}, lost by the kernel {lost} ({:.2} % of {} expected)",
        100.0 * lost as f64 / (2 * n * runs as u64) as f64,
        2 * n * runs as u64
    );
}
