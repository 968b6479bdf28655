//! Speed of the writer alone: events per second through
//! [`TraceEvent::from_abi`] + [`TraceWriter::write_event`] on one core, on
//! synthetic agent events (`hotprobe_abi::Event`, as `hotprobe record`
//! drains them from the rings), written to a trace directory in the
//! temporary directory. No target, no rings: what the drain thread of
//! `record` can sustain at most.
//!
//! Workloads (TSC time base, 3 GHz):
//! * `loop`: the iProbe loop — one function called over and over (entry,
//!   exit; 30–60 ticks between calls, 60–90 per call), as
//!   `examples/bench_trace/loop.c` under `hotprobe record` (2 values per
//!   event, as 32-byte ring slots carry);
//! * `nested`: a call tree of 15 functions up to 20 deep (recursion, fan-out
//!   1–4, 1–300 ticks between events), like `bench_trace/calc.c`.
//!
//! Each with aggregation (the default), without (`--no-aggregate`) and with
//! a minimum duration (`--min-duration 20ns`). Prints one line per
//! configuration: events, bytes/event, ns/event and M events/s in CPU time
//! of the writing thread (best of `--reps` runs, each of `--events` events;
//! CPU time, so that other load on the machine does not count).
//!
//! ```text
//! cargo run --release -p hotprobe-trace --example writer_speed -- [--events 20000000] [--reps 3]
//! ```

use hotprobe_abi::{Event, KIND_ENTRY, KIND_EXIT};
use hotprobe_trace::{Filter, Symbol, TimeBase, TraceEvent, TraceMeta, TraceWriter};

/// CPU time of the calling thread, in seconds (the machine may be shared:
/// wall time would count the time other processes had the core).
fn cpu_secs() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

const TID: u32 = 4242;

fn abi(tsc: u64, probe: u32, kind: u8, a0: u64, a1: u64) -> Event {
    Event {
        tsc,
        probe_id: probe,
        tid: TID,
        kind,
        nargs: 2,
        reserved: 0,
        reserved2: 0,
        args: [a0, a1, 0, 0, 0, 0],
    }
}

/// One block of the loop workload: `n` calls of probe 1 (probe 0, `main`,
/// stays open around all blocks).
fn loop_block(n: usize, rng: &mut Rng, ts: &mut u64) -> Vec<Event> {
    let mut v = Vec::with_capacity(2 * n);
    for i in 0..n as u64 {
        *ts += rng.range(30, 60);
        v.push(abi(*ts, 1, KIND_ENTRY, i, 0x7ffc_1234_5678));
        *ts += rng.range(60, 90);
        v.push(abi(*ts, 1, KIND_EXIT, 0, 0));
    }
    v
}

/// One block of the nested workload: top-level calls until `n` events.
fn nested_block(n: usize, rng: &mut Rng, ts: &mut u64) -> Vec<Event> {
    fn call(v: &mut Vec<Event>, rng: &mut Rng, ts: &mut u64, probe: u32, depth: u32) {
        *ts += rng.range(1, 300);
        v.push(abi(*ts, probe, KIND_ENTRY, depth as u64, 7));
        if depth < 20 {
            let kids = match rng.next() % 10 {
                0..=4 => 0,
                5..=8 => 1,
                _ => rng.range(2, 4),
            };
            for _ in 0..kids {
                let p = rng.range(1, 15) as u32;
                call(v, rng, ts, p, depth + 1);
            }
        }
        *ts += rng.range(1, 300);
        v.push(abi(*ts, probe, KIND_EXIT, 42, 0));
    }
    let mut v = Vec::with_capacity(n + 1024);
    while v.len() < n {
        let p = rng.range(1, 15) as u32;
        call(&mut v, rng, ts, p, 1);
    }
    v
}

fn arg_of(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Run {
    events: u64,
    bytes: u64,
    events_out: u64,
    secs: f64,
}

/// Writes `total` events (blocks of `block`, shifted in time after each
/// pass) into a fresh trace; times the conversion and writing, `finish`
/// included.
fn run(
    block: &mut [Event],
    span: u64,
    total: u64,
    filter: &Filter,
    aggregate: bool,
    compress: bool,
) -> Run {
    let dir = std::env::temp_dir().join(format!("hotprobe-writer-speed-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let symbols: Vec<Symbol> = (0..16)
        .map(|id| Symbol::function(id, format!("f{id}")))
        .collect();
    let mut meta = TraceMeta::new("writer_speed", symbols);
    meta.time_base = TimeBase::tsc_hz(3_000_000_000);
    meta.filter = filter.clone();
    meta.aggregate = aggregate;
    let mut w = TraceWriter::create(&dir, meta).expect("create the trace");
    w.compress(compress);
    let main_entry = TraceEvent::from_abi(&abi(block[0].tsc - 1, 0, KIND_ENTRY, 0, 0)).unwrap();
    w.write_event(&main_entry).expect("write");
    let mut done = 0u64;
    let mut elapsed = 0.0;
    while done < total {
        let t = cpu_secs();
        for e in block.iter() {
            // `record`'s drain does the same per event.
            if let Some(te) = TraceEvent::from_abi(e) {
                w.write_event(&te).expect("write");
            }
        }
        elapsed += cpu_secs() - t;
        done += block.len() as u64;
        // Next pass later in time (untimed).
        for e in block.iter_mut() {
            e.tsc += span;
        }
    }
    let t = cpu_secs();
    let last = block[block.len() - 1].tsc;
    let main_exit = TraceEvent::from_abi(&abi(last + 1, 0, KIND_EXIT, 0, 0)).unwrap();
    w.write_event(&main_exit).expect("write");
    let st = w.finish().expect("finish");
    elapsed += cpu_secs() - t;
    let _ = std::fs::remove_dir_all(&dir);
    Run {
        events: done + 2,
        bytes: st.bytes,
        events_out: st.events_out,
        secs: elapsed,
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let total = arg_of(&args, "--events", 20_000_000);
    let reps = arg_of(&args, "--reps", 3).max(1);
    let block_len = 1 << 20;
    println!("| workload | writer | events | bytes/event | ns/event | M events/s |");
    println!("|---|---|---:|---:|---:|---:|");
    for name in ["loop", "nested"] {
        let mut rng = Rng(0x5eed);
        let mut ts = 1u64 << 40;
        let start = ts;
        let mut block = if name == "loop" {
            loop_block(block_len / 2, &mut rng, &mut ts)
        } else {
            nested_block(block_len, &mut rng, &mut ts)
        };
        let span = ts - start + 100;
        for (label, filter, aggregate, compress) in [
            ("aggregated", Filter::none(), true, true),
            ("aggregated, uncompressed", Filter::none(), true, false),
            ("--no-aggregate", Filter::none(), false, true),
            (
                "--min-duration 20ns",
                Filter::none().min_duration_ns(20),
                true,
                true,
            ),
        ] {
            let mut best: Option<Run> = None;
            for _ in 0..reps {
                let r = run(&mut block, span, total, &filter, aggregate, compress);
                if best.as_ref().is_none_or(|b| r.secs < b.secs) {
                    best = Some(r);
                }
            }
            let r = best.expect("one run");
            println!(
                "| {name} | {label} | {} | {:.2} | {:.1} | {:.1} |",
                r.events,
                r.bytes as f64 / r.events_out.max(1) as f64,
                r.secs * 1e9 / r.events as f64,
                r.events as f64 / r.secs / 1e6
            );
        }
    }
    println!(
        "\nbest of {reps} runs of {total} events each, from_abi + write_event + finish, CPU time of one thread"
    );
}
