//! Converts `uftrace dump` text (stdin) into a hotprobe trace directory and
//! prints the sizes: a way to measure the format on real workloads.
//!
//! ```sh
//! gcc -O2 -pg -o work work.c && uftrace record -d ufdata ./work
//! uftrace dump -d ufdata | cargo run --example import_uftrace -- OUT [--no-aggregate] [--tsc-hz HZ]
//! ```
//!
//! `--tsc-hz HZ` stores the times as TSC ticks at that rate (as the agent
//! records them) instead of ns.

use std::collections::HashMap;
use std::io::BufRead;

use hotprobe_trace::{Symbol, TraceEvent, TraceMeta, TraceWriter};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = args
        .first()
        .ok_or("usage: import_uftrace OUT [--no-aggregate]")?;
    let aggregate = !args.iter().any(|a| a == "--no-aggregate");
    let tsc_hz: Option<u64> = args
        .iter()
        .position(|a| a == "--tsc-hz")
        .and_then(|i| args.get(i + 1))
        .map(|v| v.parse())
        .transpose()?;
    let scale = |ns: u64| match tsc_hz {
        Some(hz) => (ns as u128 * hz as u128 / 1_000_000_000) as u64,
        None => ns,
    };
    let mut ids: HashMap<String, u32> = HashMap::new();
    let mut events = Vec::new();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        // "3143.457063218  32250: [entry] name(addr) depth: 0"
        let kind = if line.contains(": [entry] ") {
            true
        } else if line.contains(": [exit ] ") {
            false
        } else {
            continue;
        };
        let mut it = line.split_whitespace();
        let (Some(ts), Some(tid)) = (it.next(), it.next()) else {
            continue;
        };
        let (s, frac) = ts.split_once('.').ok_or("bad timestamp")?;
        let ns = scale(s.parse::<u64>()? * 1_000_000_000 + frac.parse::<u64>()?);
        let tid: u32 = tid.trim_end_matches(':').parse()?;
        let rest = line.split_once("] ").ok_or("bad line")?.1;
        let name = rest.rsplit_once('(').ok_or("bad name")?.0.to_string();
        let n = ids.len() as u32;
        let id = *ids.entry(name).or_insert(n);
        events.push(if kind {
            TraceEvent::entry(ns, tid, id)
        } else {
            TraceEvent::exit(ns, tid, id)
        });
    }
    let mut syms: Vec<Symbol> = ids.iter().map(|(n, &i)| Symbol::function(i, n)).collect();
    syms.sort_by_key(|s| s.id);
    let mut meta = TraceMeta::new("uftrace import", syms);
    meta.aggregate = aggregate;
    if let Some(hz) = tsc_hz {
        meta.time_base = hotprobe_trace::TimeBase::tsc_hz(hz);
    }
    let t0 = std::time::Instant::now();
    let mut w = TraceWriter::create(out, meta)?;
    for e in &events {
        w.write_event(e)?;
    }
    let s = w.finish()?;
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{} events in, {} records ({} calls, {} entries, {} exits), {} bytes, {:.3} bytes/event, {:.1} M events/s written",
        s.events_in,
        s.records,
        s.kinds.calls,
        s.kinds.entries,
        s.kinds.exits,
        s.bytes,
        s.bytes_per_event(),
        s.events_in as f64 / secs / 1e6
    );
    Ok(())
}
