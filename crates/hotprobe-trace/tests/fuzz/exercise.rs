//! What the fuzz passes do with one input, shared by the bounded passes of
//! `tests/fuzz.rs` and the cargo-fuzz targets of `fuzz/` (included there by
//! path, with `tests/common`). Depends on hotprobe-trace and std only.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use crate::common::*;
use hotprobe_trace::*;

/// One thread stream (`tid-N.hpt`) decoded to the end or the first error,
/// its records fed to a call stack. True if it decoded to the end.
pub fn read_stream(data: &[u8]) -> bool {
    let Ok(mut dec) = format::Decoder::new(data, "fuzz.hpt") else {
        return false;
    };
    let _ = (dec.tid(), dec.base(), dec.offset());
    let mut stack = CallStack::new();
    let mut n = 0u64;
    let ok = loop {
        match dec.next_record() {
            Ok(Some(r)) => {
                let _ = (r.ts(), r.probe(), r.event_count());
                stack.feed(&r, |_| {});
                n += 1;
                assert!(n <= data.len() as u64, "more records than bytes");
            }
            Ok(None) => break true,
            Err(e) => {
                // What a reader of an unfinished trace keeps: whole
                // records (or blocks) of the input, never more.
                if let TraceError::Truncated { .. } = e {
                    assert!(dec.whole_bytes() <= data.len() as u64, "{e}");
                    assert_eq!(dec.records(), n);
                }
                break false;
            }
        }
    };
    stack.finish(|_| {});
    let _ = dec.counts().events();
    ok
}

/// A small recorded trace (two threads, a few nested calls each, with
/// arguments and return values): small enough to be read thousands of
/// times in a few seconds.
pub fn small_trace(dir: &Path) {
    let lists: Vec<_> = (0..2)
        .map(|t| thread_events(0x77 + t as u64, 1 + t, 8, true))
        .collect();
    let events = interleave(lists, 3);
    let mut meta = TraceMeta::new("fuzz", symbols(true));
    meta.start_unix_ns = 1;
    // `main` is typed (format version 2): an int and a string at the
    // entry, a double at the exit, captured into the values files.
    let mut w = TraceWriter::create(dir, meta).unwrap();
    let mut types = ValueTypes::default();
    let item = |label: &str, shape| ShapeItem {
        label: label.into(),
        shape,
    };
    types.insert(
        MAIN,
        vec![item("", Shape::Signed(4)), item("p->name", Shape::Str)],
        vec![item("", Shape::F64)],
    );
    w.set_value_types(&types).unwrap();
    // Probe costs: readers then take them out of the times.
    let mut costs = ProbeCosts::default();
    let jump = costs.mechanism(MechanismCost {
        label: "jump".into(),
        ns_per_hit: 30.0,
        how: "fuzz seed".into(),
    });
    let trap = costs.mechanism(MechanismCost {
        label: "in-process trap".into(),
        ns_per_hit: 600.0,
        how: "fuzz seed".into(),
    });
    costs.probes.insert(MAIN, trap);
    costs.probes.insert(MAIN + 1, jump);
    w.set_probe_costs(&costs).unwrap();
    for e in &events {
        if e.probe != MAIN {
            w.write_event(e).unwrap();
            continue;
        }
        let mut data = Vec::new();
        if e.kind == EventKind::Exit {
            data.push(0);
            data.extend(1.5f64.to_bits().to_le_bytes());
        } else {
            data.push(0);
            data.extend((-7i64 as u64).to_le_bytes());
            data.extend([1, 0, 3, 0]);
            data.extend(b"abc");
        }
        w.write_event_values(e, &data).unwrap();
    }
    // The host kernel's events of thread 1 (format version 3): a read,
    // an error, an off-CPU interval inside the read, over its calls.
    let (first, last) = (events[0].ts, events[events.len() - 1].ts);
    let mid = first + (last - first) / 2;
    let kernel = [
        KernelEvent {
            start: first,
            end: mid,
            kind: KernelKind::Syscall { nr: 0, ret: 3 },
        },
        KernelEvent {
            start: first + 1,
            end: mid - 1,
            kind: KernelKind::OffCpu { preempted: false },
        },
        KernelEvent {
            start: mid + 1,
            end: last,
            kind: KernelKind::Syscall { nr: 1, ret: -11 },
        },
    ];
    w.write_kernel_thread(1, 1, &kernel).unwrap();
    w.note_kernel(5, 1, 1, 0);
    w.finish().unwrap();
}

/// The files of a trace directory the first input byte picks from.
pub const FILES: [&str; 7] = [
    INFO_FILE,
    SYMBOLS_FILE,
    "tid-1.hpt",
    TYPES_FILE,
    "values-1.hpv",
    "kernel-1.hpk",
    COSTS_FILE,
];

/// A whole trace directory with one file replaced by the input.
pub struct TraceDir {
    originals: Vec<(PathBuf, Vec<u8>)>,
    work: PathBuf,
    ctf: PathBuf,
}

impl TraceDir {
    /// Writes [`small_trace`] to `src` and keeps its files; `work` gets the
    /// trace under test, `ctf` the CTF export (both folders must exist).
    pub fn new(src: &Path, work: &Path, ctf: &Path) -> TraceDir {
        small_trace(src);
        let originals = std::fs::read_dir(src)
            .unwrap()
            .map(|e| {
                let p = e.unwrap().path();
                let bytes = std::fs::read(&p).unwrap();
                (PathBuf::from(p.file_name().unwrap()), bytes)
            })
            .collect();
        TraceDir {
            originals,
            work: work.to_path_buf(),
            ctf: ctf.to_path_buf(),
        }
    }

    /// The seed of file `i` of [`FILES`]: its index, then its bytes.
    pub fn seed(&self, i: usize) -> Vec<u8> {
        let mut s = vec![i as u8];
        let (_, bytes) = self
            .originals
            .iter()
            .find(|(n, _)| n.as_os_str() == FILES[i])
            .unwrap();
        s.extend(bytes);
        s
    }

    /// The first byte picks the file of [`FILES`] the rest replaces (its
    /// low 7 bits) and whether the trace is marked unfinished (its high
    /// bit: `"complete": false`, as a killed recorder leaves it); the
    /// trace is then read through every analysis and exporter. True if
    /// all of them succeeded.
    pub fn check(&self, data: &[u8]) -> bool {
        let Some((&which, content)) = data.split_first() else {
            return false;
        };
        let replaced = FILES[usize::from(which & 0x7f) % FILES.len()];
        let unfinished = which & 0x80 != 0;
        if replaced == "kernel-1.hpk" {
            // The decoder itself, whatever size info.json gives.
            for tb in [TimeBase::Ns, TimeBase::tsc_hz(3_000_000_000)] {
                if let Ok(ev) = kernel::decode(content, Path::new(replaced), 1, &tb) {
                    assert!(ev.iter().all(|e| e.end >= e.start));
                    for e in &ev {
                        let _ = (e.name(), e.ret_text(), e.dur());
                    }
                }
            }
        }
        for (name, bytes) in &self.originals {
            let bytes = if name.as_os_str() == replaced {
                content.to_vec()
            } else if unfinished && name.as_os_str() == INFO_FILE {
                String::from_utf8_lossy(bytes)
                    .replace("\"complete\": true", "\"complete\": false")
                    .into_bytes()
            } else {
                bytes.clone()
            };
            std::fs::write(self.work.join(name), bytes).unwrap();
        }
        read_everything(&self.work, &self.ctf)
    }
}

/// Everything a reader of a whole trace does.
fn read_everything(dir: &Path, ctf: &Path) -> bool {
    let Ok(r) = TraceReader::open(dir) else {
        return false;
    };
    let _ = (r.time_base().hz(), r.total_bytes(), r.symbols().id_bound());
    let _ = r.symbols().name(u32::MAX);
    let mut ok = true;
    for tid in [1, 2] {
        if let Ok(v) = r.thread_values(tid) {
            for i in 0..v.len() as u64 + 1 {
                if let Some(d) = v.get(i) {
                    let _ = r.value_types().format(MAIN, i % 2 == 1, d);
                }
            }
        }
    }
    if let Ok(threads) = r.threads() {
        for st in threads {
            for rec in st {
                ok &= rec.is_ok();
            }
        }
    }
    ok &= replay(&r, &mut std::io::sink(), None).is_ok();
    ok &= report(&r, None).map(|rep| rep.to_text()).is_ok();
    ok &= report_phases(&r, &PhaseSpec::from_trace(&r), None)
        .map(|p| p.to_text())
        .is_ok();
    ok &= export_chrome(&r, &mut std::io::sink(), None).is_ok();
    for value in [FoldedValue::Calls, FoldedValue::SelfNs] {
        let opts = FoldedOptions {
            value,
            per_thread: true,
        };
        ok &= export_folded(&r, &mut std::io::sink(), opts, None).is_ok();
    }
    ok &= export_ctf(&r, ctf, None).is_ok();
    ok &= summarize(&r, None).map(|s| s.to_text()).is_ok();
    ok
}
