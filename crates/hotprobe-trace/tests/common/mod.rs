//! Synthetic workloads shared by the tests.
#![allow(dead_code)]

use hotprobe_trace::*;

/// xorshift64*: deterministic, no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
}

pub const MAIN: u32 = 0;
pub const RECURSE: u32 = 1;
pub const HIT: u32 = 2;
/// Probes 3.. are ordinary functions.
pub const NFUNCS: u32 = 40;

pub fn symbols(keep_args: bool) -> Vec<Symbol> {
    (0..NFUNCS)
        .map(|id| {
            let name = match id {
                MAIN => "main".to_string(),
                RECURSE => "fib".to_string(),
                HIT => "loop_top".to_string(),
                _ => format!("func_{id}"),
            };
            let mut s = Symbol::function(id, name);
            s.module = "/usr/bin/synthetic".into();
            s.addr = 0x401000 + id as u64 * 0x40;
            if id == HIT {
                s.kind = ProbeKind::Hit;
            }
            if keep_args {
                s.nargs = 6;
                s.retval = true;
            }
            s
        })
        .collect()
}

struct Gen<'a> {
    rng: &'a mut Rng,
    ts: u64,
    tid: u32,
    out: Vec<TraceEvent>,
    with_args: bool,
}

impl Gen<'_> {
    fn tick(&mut self) {
        self.ts += self.rng.range(1, 300);
    }
    fn args(&mut self) -> Vec<u64> {
        if !self.with_args {
            return vec![];
        }
        let n = self.rng.below(7) as usize;
        (0..n)
            .map(|_| match self.rng.below(3) {
                0 => self.rng.below(100),
                1 => (-(self.rng.below(50) as i64)) as u64,
                _ => 0x7ffc_0000_0000 + self.rng.below(1 << 20),
            })
            .collect()
    }
    fn call(&mut self, probe: u32, depth: u32) {
        self.tick();
        let a = self.args();
        self.out
            .push(TraceEvent::entry(self.ts, self.tid, probe).with_args(&a));
        if probe == RECURSE {
            let n = self.rng.below(4);
            if n > 0 && depth < 12 {
                self.call(RECURSE, depth + 1);
                if n > 1 {
                    self.call(RECURSE, depth + 1);
                }
            }
        } else if depth < 6 {
            let kids = match self.rng.below(10) {
                0..=4 => 0,
                5..=7 => self.rng.range(1, 3),
                _ => self.rng.range(3, 6),
            };
            for _ in 0..kids {
                if self.rng.below(12) == 0 {
                    self.tick();
                    let a = self.args();
                    self.out
                        .push(TraceEvent::hit(self.ts, self.tid, HIT).with_args(&a));
                }
                let p = if self.rng.below(8) == 0 {
                    RECURSE
                } else {
                    self.rng.range(3, NFUNCS as u64 - 1) as u32
                };
                self.call(p, depth + 1);
            }
        }
        self.tick();
        let mut ex = TraceEvent::exit(self.ts, self.tid, probe);
        if self.with_args {
            if self.rng.below(40) == 0 {
                ex.unwound = true;
            } else if self.rng.below(2) == 0 {
                ex.ret = Some(self.rng.below(1000).wrapping_sub(500));
            }
        }
        self.out.push(ex);
    }
}

/// One thread's events: `main` calling `calls` random subtrees.
pub fn thread_events(seed: u64, tid: u32, calls: usize, with_args: bool) -> Vec<TraceEvent> {
    let mut rng = Rng(seed | 1);
    let mut g = Gen {
        rng: &mut rng,
        ts: 1_000_000 + tid as u64 * 17,
        tid,
        out: Vec::new(),
        with_args,
    };
    g.tick();
    g.out.push(TraceEvent::entry(g.ts, tid, MAIN));
    for _ in 0..calls {
        let p = g.rng.range(3, NFUNCS as u64 - 1) as u32;
        g.call(p, 1);
    }
    g.tick();
    g.out.push(TraceEvent::exit(g.ts, tid, MAIN));
    g.out
}

/// Interleaves per-thread event lists randomly, keeping each thread's order.
pub fn interleave(mut lists: Vec<Vec<TraceEvent>>, seed: u64) -> Vec<TraceEvent> {
    let mut rng = Rng(seed | 1);
    let mut idx = vec![0usize; lists.len()];
    let mut out = Vec::new();
    loop {
        let live: Vec<usize> = (0..lists.len())
            .filter(|&i| idx[i] < lists[i].len())
            .collect();
        if live.is_empty() {
            break;
        }
        let i = live[rng.below(live.len() as u64) as usize];
        let n = rng.range(1, 20) as usize;
        let end = (idx[i] + n).min(lists[i].len());
        out.extend_from_slice(&lists[i][idx[i]..end]);
        idx[i] = end;
    }
    lists.clear();
    out
}

/// Expands records back to events (a call is an entry and an exit).
pub fn expand(tid: u32, recs: &[Record]) -> Vec<TraceEvent> {
    let mut out = Vec::new();
    for r in recs {
        match *r {
            Record::Entry { ts, probe, args } => {
                out.push(TraceEvent::entry(ts, tid, probe).with_args(args.as_slice()))
            }
            Record::Exit {
                ts,
                probe,
                ret,
                unwound,
            } => out.push(TraceEvent {
                ret,
                unwound,
                ..TraceEvent::exit(ts, tid, probe)
            }),
            Record::Call {
                ts,
                dur,
                probe,
                args,
                ret,
            } => {
                out.push(TraceEvent::entry(ts, tid, probe).with_args(args.as_slice()));
                out.push(TraceEvent {
                    ret,
                    ..TraceEvent::exit(ts + dur, tid, probe)
                });
            }
            Record::Hit { ts, probe, args } => {
                out.push(TraceEvent::hit(ts, tid, probe).with_args(args.as_slice()))
            }
            Record::Lost { .. } => {}
        }
    }
    out
}

pub fn write_trace(dir: &std::path::Path, meta: TraceMeta, events: &[TraceEvent]) -> WriteStats {
    let mut w = TraceWriter::create(dir, meta).unwrap();
    for e in events {
        w.write_event(e).unwrap();
    }
    w.finish().unwrap()
}

pub fn read_thread(r: &TraceReader, tid: u32) -> Vec<Record> {
    r.thread(tid).unwrap().collect::<Result<Vec<_>>>().unwrap()
}

/// A standard multi-threaded nested trace in `dir` (ns time base).
pub fn standard_trace(dir: &std::path::Path, with_args: bool) -> (WriteStats, Vec<TraceEvent>) {
    let lists: Vec<_> = (0..4)
        .map(|t| thread_events(0x1234 + t as u64, 100 + t, 60, with_args))
        .collect();
    let events = interleave(lists, 99);
    let mut meta = TraceMeta::new("synthetic", symbols(with_args));
    meta.start_unix_ns = 1;
    let s = write_trace(dir, meta, &events);
    (s, events)
}
