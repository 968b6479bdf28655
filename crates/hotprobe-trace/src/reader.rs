//! [`TraceReader`]: opens a trace directory and decodes its thread streams.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{Result, TraceError};
use crate::event::{Record, TimeBase};
use crate::files::{check_regular, open_regular, read_bytes, read_text};
use crate::format::Decoder;
use crate::info::{Info, FORMAT_NAME, FORMAT_VERSION};
use crate::overhead::{HeldCalls, LeafScan, OverheadClock, ProbeCosts, COSTS_FILE};
use crate::symbols::SymbolTable;
use crate::values::{values_file_name, ThreadValues, ValueTypes, TYPES_FILE};
use crate::writer::{INFO_FILE, SYMBOLS_FILE};

mod costs;
pub(crate) use costs::times_line;

/// One thread stream of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamFile {
    /// Thread id (from the file name; the header must agree).
    pub tid: u32,
    /// Full path.
    pub path: PathBuf,
    /// Size in bytes.
    pub bytes: u64,
}

/// A stream whose writer did not finish it (killed, or a cut copy of an
/// unfinished trace): what could be read of it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamCut {
    /// Thread id.
    pub tid: u32,
    /// The stream file.
    pub path: PathBuf,
    /// Records read (whole records, before the cut).
    pub records: u64,
    /// Bytes of the file they take (header included): whole records of a
    /// plain stream, whole blocks of a compressed one.
    pub bytes_read: u64,
    /// Size of the file.
    pub file_bytes: u64,
    /// Where the data ends (no end record, a block cut short...).
    pub what: String,
}

/// An opened trace directory.
#[derive(Clone, Debug)]
pub struct TraceReader {
    dir: PathBuf,
    info: Info,
    symbols: SymbolTable,
    streams: Vec<StreamFile>,
    value_types: ValueTypes,
    cuts: Vec<StreamCut>,
    /// The calibrated probe costs (`costs.tsv`), if the recorder wrote them.
    costs: Option<ProbeCosts>,
    /// Whether streams leave the probes' costs out of their times.
    correct: bool,
    /// `costs` as the streams' clocks read them (one table for all),
    /// capped by each mechanism's shortest call: scanned at the first
    /// corrected stream.
    scan: std::sync::OnceLock<CostScan>,
    /// The corrected streams' hits, and those the correction held.
    held: HeldCalls,
}

/// The probes' costs as taken out ([`LeafScan`]).
#[derive(Clone, Debug)]
struct CostScan {
    /// ns a hit by probe id, capped.
    table: std::sync::Arc<Vec<crate::overhead::HitCosts>>,
    /// Each mechanism's shortest leaf call as measured (ns), by index.
    shortest: Vec<Option<u64>>,
}

impl TraceReader {
    /// Reads `info.json` and `symbols.tsv` and lists the streams; every
    /// inconsistency (unknown format or version, unusable time base, symbol
    /// count, a listed stream missing or of another size, a file that is
    /// not a regular file) is an error naming the file.
    ///
    /// A trace its recorder did not finish (`"complete": false`: it was
    /// killed) is read up to the last whole block (or record) of each
    /// stream: its streams are read once here, and what each holds is in
    /// [`TraceReader::cut_short`].
    pub fn open(dir: impl AsRef<Path>) -> Result<TraceReader> {
        let dir = dir.as_ref().to_path_buf();
        let ip = dir.join(INFO_FILE);
        let not_found =
            |p: &Path| TraceError::io(p, std::io::Error::from(std::io::ErrorKind::NotFound));
        let text = read_text(&ip)?.ok_or_else(|| not_found(&ip))?;
        let info: Info = serde_json::from_str(&text).map_err(|e| TraceError::Info {
            path: ip.clone(),
            what: format!("not a hotprobe trace description: {e}"),
        })?;
        if info.format != FORMAT_NAME {
            return Err(TraceError::Info {
                path: ip,
                what: format!("format {:?}, expected {FORMAT_NAME:?}", info.format),
            });
        }
        // Version 1 has no typed values, 2 no kernel events, 3 no
        // processes, 4 no call stacks, 5 no probe costs (costs.tsv: read
        // wherever it is); everything else is the same.
        if !(1..=FORMAT_VERSION).contains(&info.version) {
            return Err(TraceError::Info {
                path: ip,
                what: format!(
                    "format version {}, this reader knows {FORMAT_VERSION}",
                    info.version
                ),
            });
        }
        if !info.time_base.is_valid() {
            return Err(TraceError::Info {
                path: ip,
                what: format!(
                    "corrupt time base {:?}: its two (TSC, ns) pairs must both advance, \
                     at 1 kHz to 1 THz",
                    info.time_base
                ),
            });
        }
        let sp = dir.join(SYMBOLS_FILE);
        let stext = read_text(&sp)?.ok_or_else(|| not_found(&sp))?;
        let symbols = SymbolTable::parse_tsv(&stext, &sp)?;
        if symbols.len() != info.symbols {
            return Err(TraceError::Symbols {
                path: sp,
                line: stext.lines().count(),
                what: format!(
                    "{} symbols, info.json says {} (file truncated?)",
                    symbols.len(),
                    info.symbols
                ),
            });
        }
        let mut streams = Vec::new();
        let rd = std::fs::read_dir(&dir).map_err(|e| TraceError::io(&dir, e))?;
        for ent in rd {
            let ent = ent.map_err(|e| TraceError::io(&dir, e))?;
            let name = ent.file_name();
            let name = name.to_string_lossy();
            let Some(tid) = name
                .strip_prefix("tid-")
                .and_then(|r| r.strip_suffix(".hpt"))
                .and_then(|t| t.parse::<u32>().ok())
            else {
                continue;
            };
            let p = ent.path();
            check_regular(&p)?;
            let bytes = ent.metadata().map_err(|e| TraceError::io(&p, e))?.len();
            streams.push(StreamFile {
                tid,
                path: p,
                bytes,
            });
        }
        streams.sort_by_key(|s| s.tid);
        if info.complete {
            for t in &info.threads {
                let Some(s) = streams.iter().find(|s| s.tid == t.tid) else {
                    return Err(TraceError::io(
                        dir.join(&t.file),
                        std::io::Error::new(
                            std::io::ErrorKind::NotFound,
                            "stream listed in info.json is missing",
                        ),
                    ));
                };
                if s.bytes != t.bytes {
                    return Err(TraceError::Truncated {
                        path: s.path.clone(),
                        offset: s.bytes,
                        what: format!("file has {} bytes, info.json says {}", s.bytes, t.bytes),
                    });
                }
            }
            if streams.len() != info.threads.len() {
                return Err(TraceError::Info {
                    path: ip,
                    what: format!(
                        "lists {} streams, the directory has {}",
                        info.threads.len(),
                        streams.len()
                    ),
                });
            }
        }
        let tp = dir.join(TYPES_FILE);
        let value_types = match read_text(&tp)? {
            Some(text) => ValueTypes::parse(&text, &tp)?,
            None => ValueTypes::default(),
        };
        let cp = dir.join(COSTS_FILE);
        let costs = match read_text(&cp)? {
            Some(text) => Some(ProbeCosts::parse(&text, &cp)?),
            None => None,
        };
        // Kernel events keep the measured clock: calls stay measured too,
        // so that both line up.
        let correct = costs.is_some() && info.kernel.is_none();
        let mut r = TraceReader {
            dir,
            info,
            symbols,
            streams,
            value_types,
            cuts: Vec::new(),
            costs,
            correct,
            scan: std::sync::OnceLock::new(),
            held: HeldCalls::default(),
        };
        if !r.info.complete {
            for s in &r.streams {
                let mut st = r.thread(s.tid)?;
                for rec in st.by_ref() {
                    rec?;
                }
                r.cuts.extend(st.cut().cloned());
            }
        }
        Ok(r)
    }

    /// The streams of an unfinished trace that end without their end
    /// record, and how much of each is read (empty for a finished trace).
    pub fn cut_short(&self) -> &[StreamCut] {
        &self.cuts
    }

    /// The shapes of the typed probes' values (`types.tsv`; empty without).
    pub fn value_types(&self) -> &ValueTypes {
        &self.value_types
    }

    /// Thread `tid`'s captured values (`values-TID.hpv`; empty without; in
    /// an unfinished trace, the records before a cut).
    pub fn thread_values(&self, tid: u32) -> Result<ThreadValues> {
        let p = self.dir.join(values_file_name(tid));
        match read_bytes(&p)? {
            Some(bytes) if self.info.complete => ThreadValues::parse(bytes, &p),
            Some(bytes) => ThreadValues::parse_unfinished(bytes, &p),
            None => Ok(ThreadValues::default()),
        }
    }

    /// What the host kernel's events gave (`record --kernel`), if any.
    pub fn kernel_info(&self) -> Option<&crate::kernel::KernelInfo> {
        self.info.kernel.as_ref()
    }

    /// Thread `tid`'s host-kernel events (ns), by start; empty when it has
    /// none. Its file must have the size `info.json` gives.
    pub fn kernel_events(&self, tid: u32) -> Result<Vec<crate::kernel::KernelEvent>> {
        let Some(t) = self
            .kernel_info()
            .and_then(|k| k.threads.iter().find(|t| t.tid == tid))
        else {
            return Ok(Vec::new());
        };
        let p = self.dir.join(crate::kernel::kernel_file_name(tid));
        let bytes = read_bytes(&p)?.ok_or_else(|| {
            TraceError::io(&p, std::io::Error::from(std::io::ErrorKind::NotFound))
        })?;
        if bytes.len() as u64 != t.bytes {
            return Err(TraceError::Truncated {
                path: p,
                offset: bytes.len() as u64,
                what: format!("file has {} bytes, info.json says {}", bytes.len(), t.bytes),
            });
        }
        crate::kernel::decode(&bytes, &p, tid, &self.info.time_base)
    }

    /// Every thread's host-kernel events, split into syscalls and off-CPU
    /// intervals (empty without).
    pub fn kernel_threads(&self) -> Result<HashMap<u32, crate::kernel::ThreadKernel>> {
        let mut out = HashMap::new();
        for t in self.kernel_info().map_or(&[][..], |k| &k.threads[..]) {
            out.insert(
                t.tid,
                crate::kernel::ThreadKernel::new(self.kernel_events(t.tid)?),
            );
        }
        Ok(out)
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `info.json`.
    pub fn info(&self) -> &Info {
        &self.info
    }

    /// The probe table.
    pub fn symbols(&self) -> &SymbolTable {
        &self.symbols
    }

    /// The time base of the streams.
    pub fn time_base(&self) -> TimeBase {
        self.info.time_base
    }

    /// The thread streams, by tid.
    pub fn streams(&self) -> &[StreamFile] {
        &self.streams
    }

    /// Sum of the stream sizes (for progress bars).
    pub fn total_bytes(&self) -> u64 {
        self.streams.iter().map(|s| s.bytes).sum()
    }

    /// Opens the stream of thread `tid`: records with absolute ns times.
    pub fn thread(&self, tid: u32) -> Result<ThreadStream> {
        let mut st = self.measured_thread(tid)?;
        if self.correct {
            if let Some(scan) = self.cost_scan() {
                st.clock = Some(OverheadClock::new(scan.table.clone()));
                st.held = Some(self.held.clone());
            }
        }
        Ok(st)
    }

    /// Thread `tid`'s stream on the measured clock.
    fn measured_thread(&self, tid: u32) -> Result<ThreadStream> {
        let s = self
            .streams
            .iter()
            .find(|s| s.tid == tid)
            .ok_or_else(|| TraceError::Invalid(format!("no stream for thread {tid}")))?;
        if self.info.complete {
            ThreadStream::open(&s.path, self.info.time_base, Some(tid))
        } else {
            ThreadStream::open_unfinished(&s.path, self.info.time_base, tid)
        }
    }

    /// The costs as taken out, scanned once (`None` without costs).
    fn cost_scan(&self) -> Option<&CostScan> {
        let costs = self.costs.as_ref()?;
        Some(self.scan.get_or_init(|| {
            let mut leaves = LeafScan::new(costs);
            for s in &self.streams {
                // A stream that cannot be read is the analysis's error
                // to give: the scan takes what it read.
                let Ok(st) = self.measured_thread(s.tid) else {
                    continue;
                };
                leaves.thread();
                for r in st {
                    let Ok(r) = r else { break };
                    leaves.record(&r);
                    if leaves.full() {
                        break;
                    }
                }
                if leaves.full() {
                    break;
                }
            }
            let shortest = leaves.finish();
            CostScan {
                table: OverheadClock::table(costs, &shortest),
                shortest,
            }
        }))
    }

    /// The probes' calibrated costs per hit and mechanisms, if the
    /// recorder wrote them (`costs.tsv`; traces before it have none).
    pub fn probe_costs(&self) -> Option<&ProbeCosts> {
        self.costs.as_ref()
    }

    /// Whether the streams' times leave the probes' costs out (on when the
    /// trace has calibrated costs and no host-kernel events).
    pub fn overhead_corrected(&self) -> bool {
        self.correct
    }

    /// Reads the streams with their measured times (`false`) or without
    /// the probes' costs (`true`: only where the trace has them).
    pub fn set_overhead_correction(&mut self, on: bool) {
        self.correct = on && self.costs.is_some() && self.info.kernel.is_none();
    }

    /// Opens every stream, in tid order.
    pub fn threads(&self) -> Result<Vec<ThreadStream>> {
        self.streams.iter().map(|s| self.thread(s.tid)).collect()
    }
}

/// Iterator over one thread's records (`Result` per record; after the
/// first error or the end record it yields `None`).
pub struct ThreadStream {
    /// `None`: an unfinished stream cut inside its header.
    dec: Option<Decoder<File>>,
    tid: u32,
    path: PathBuf,
    time: TimeBase,
    raw: bool,
    done: bool,
    /// Read as the stream of an unfinished trace.
    unfinished: bool,
    cut: Option<StreamCut>,
    /// The clock without the probes' costs (a trace with `costs.tsv`).
    clock: Option<OverheadClock>,
    /// Where the corrected clock's counts go when the stream ends.
    held: Option<HeldCalls>,
    /// Hits read on the corrected clock, and those it held.
    hits: (u64, u64),
}

/// One more hit on the corrected clock, `held` or not.
fn count_hit(hits: &mut (u64, u64), held: bool) {
    hits.0 += 1;
    hits.1 += u64::from(held);
}

impl Drop for ThreadStream {
    fn drop(&mut self) {
        if let Some(h) = &self.held {
            h.note(self.tid, self.hits.0, self.hits.1);
        }
    }
}

impl ThreadStream {
    /// Opens a stream file; times are converted with `time` to ns.
    /// `expect_tid` checks the header's tid.
    pub fn open(path: &Path, time: TimeBase, expect_tid: Option<u32>) -> Result<ThreadStream> {
        let f = open_regular(path)?;
        let dec = Decoder::new(f, path)?;
        if let Some(t) = expect_tid {
            if dec.tid() != t {
                return Err(TraceError::Corrupt {
                    path: path.to_path_buf(),
                    offset: 8,
                    what: format!("header says thread {}, file name says {t}", dec.tid()),
                });
            }
        }
        Ok(ThreadStream {
            tid: dec.tid(),
            dec: Some(dec),
            path: path.to_path_buf(),
            time,
            raw: false,
            done: false,
            unfinished: false,
            cut: None,
            clock: None,
            held: None,
            hits: (0, 0),
        })
    }

    /// Opens the stream of thread `tid` of a trace its writer did not
    /// finish (killed): the data ends at the last whole record (a plain
    /// stream) or block (compressed) instead of an end record, and that is
    /// not an error: the iterator ends there and [`ThreadStream::cut`]
    /// says where. Anything else wrong in the data still is an error.
    pub fn open_unfinished(path: &Path, time: TimeBase, tid: u32) -> Result<ThreadStream> {
        match ThreadStream::open(path, time, Some(tid)) {
            Ok(mut s) => {
                s.unfinished = true;
                Ok(s)
            }
            Err(TraceError::Truncated { what, .. }) => Ok(ThreadStream {
                dec: None,
                tid,
                path: path.to_path_buf(),
                time,
                raw: false,
                done: true,
                unfinished: true,
                clock: None,
                held: None,
                hits: (0, 0),
                cut: Some(StreamCut {
                    tid,
                    path: path.to_path_buf(),
                    records: 0,
                    bytes_read: 0,
                    file_bytes: std::fs::metadata(path).map_or(0, |m| m.len()),
                    what,
                }),
            }),
            Err(e) => Err(e),
        }
    }

    /// Where an unfinished stream ends, once the iterator has ended
    /// (`None` for a stream that ends with its end record).
    pub fn cut(&self) -> Option<&StreamCut> {
        self.cut.as_ref()
    }

    /// Yields timestamps in raw ticks of the time base instead of ns.
    pub fn raw(mut self) -> ThreadStream {
        self.raw = true;
        self
    }

    /// Thread id.
    pub fn tid(&self) -> u32 {
        self.tid
    }

    /// Byte offset of the next record.
    pub fn offset(&self) -> u64 {
        self.dec.as_ref().map_or(0, |d| d.offset())
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// `t` in ns; an error when the time base cannot convert it (a time
    /// base that does not belong to these streams: a corrupt `info.json`).
    fn ns(&self, t: u64) -> Result<u64> {
        self.time
            .to_ns_checked(t)
            .ok_or_else(|| TraceError::Corrupt {
                path: self.path.clone(),
                offset: self.offset(),
                what: format!(
                    "timestamp {t} is outside what the time base of info.json converts \
                 ({:?}): corrupt time base?",
                    self.time
                ),
            })
    }

    /// `r` on the clock without the probes' costs (unchanged without one,
    /// or for raw ticks).
    fn take_out_costs(&mut self, r: Record) -> Record {
        let Some(k) = self.clock.as_mut().filter(|_| !self.raw) else {
            return r;
        };
        match r {
            Record::Entry { ts, probe, args } => {
                let ts = k.entry(ts, probe);
                count_hit(&mut self.hits, k.was_held());
                Record::Entry { ts, probe, args }
            }
            Record::Exit {
                ts,
                probe,
                ret,
                unwound,
            } => {
                let ts = k.exit(ts, probe);
                count_hit(&mut self.hits, k.was_held());
                Record::Exit {
                    ts,
                    probe,
                    ret,
                    unwound,
                }
            }
            Record::Call {
                ts,
                dur,
                probe,
                args,
                ret,
            } => {
                let s = k.entry(ts, probe);
                count_hit(&mut self.hits, k.was_held());
                let e = k.exit(ts.saturating_add(dur), probe);
                count_hit(&mut self.hits, k.was_held());
                Record::Call {
                    ts: s,
                    dur: e - s,
                    probe,
                    args,
                    ret,
                }
            }
            Record::Hit { ts, probe, args } => {
                let ts = k.mid(ts, probe);
                count_hit(&mut self.hits, k.was_held());
                Record::Hit { ts, probe, args }
            }
            Record::Lost { ts, count } => Record::Lost {
                ts: k.plain(ts),
                count,
            },
        }
    }

    fn convert(&self, r: Record) -> Result<Record> {
        if self.raw || self.time == TimeBase::Ns {
            return Ok(r);
        }
        Ok(match r {
            Record::Entry { ts, probe, args } => Record::Entry {
                ts: self.ns(ts)?,
                probe,
                args,
            },
            Record::Exit {
                ts,
                probe,
                ret,
                unwound,
            } => Record::Exit {
                ts: self.ns(ts)?,
                probe,
                ret,
                unwound,
            },
            Record::Call {
                ts,
                dur,
                probe,
                args,
                ret,
            } => {
                let s = self.ns(ts)?;
                Record::Call {
                    ts: s,
                    dur: self.ns(ts.saturating_add(dur))?.saturating_sub(s),
                    probe,
                    args,
                    ret,
                }
            }
            Record::Hit { ts, probe, args } => Record::Hit {
                ts: self.ns(ts)?,
                probe,
                args,
            },
            // Not checked: the recorder stamps a loss 0 when its thread
            // had no event yet (before ns 0: clamped to 0).
            Record::Lost { ts, count } => Record::Lost {
                ts: self.time.to_ns(ts),
                count,
            },
        })
    }
}

impl Iterator for ThreadStream {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Result<Record>> {
        if self.done {
            return None;
        }
        let dec = self.dec.as_mut()?;
        match dec.next_record() {
            Ok(Some(r)) => {
                let r = self.convert(r).map(|r| self.take_out_costs(r));
                self.done = r.is_err();
                Some(r)
            }
            Ok(None) => {
                self.done = true;
                None
            }
            Err(TraceError::Truncated { what, .. }) if self.unfinished => {
                self.done = true;
                self.cut = Some(StreamCut {
                    tid: self.tid,
                    path: self.path.clone(),
                    records: dec.records(),
                    bytes_read: dec.whole_bytes(),
                    file_bytes: std::fs::metadata(&self.path).map_or(0, |m| m.len()),
                    what,
                });
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}
