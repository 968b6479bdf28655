//! [`TraceWriter`]: filters, aggregates and encodes events into a trace directory.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::error::{Result, TraceError};
use crate::event::{Record, TimeBase, TraceEvent};
use crate::filter::{CompiledFilter, Filter, FilterStats, ThreadFilter};
use crate::format::{Encoder, KindCounts};
use crate::info::{Info, ThreadInfo, WriteStats, FORMAT_NAME, FORMAT_VERSION};
use crate::symbols::{Symbol, SymbolTable};
use crate::values::{values_file_name, ValueTypes, ValuesWriter, TYPES_FILE};

/// File names inside a trace directory.
pub const INFO_FILE: &str = "info.json";
/// See [`INFO_FILE`].
pub const SYMBOLS_FILE: &str = "symbols.tsv";

/// Stream file name of a thread.
pub fn stream_file_name(tid: u32) -> String {
    format!("tid-{tid}.hpt")
}

/// What a recording is about, given to [`TraceWriter::create`].
#[derive(Clone, Debug)]
pub struct TraceMeta {
    /// What is traced (executable path, `pid 42`, …).
    pub target: String,
    /// Command line of a spawned target.
    pub command: Vec<String>,
    /// Process id, if known.
    pub pid: Option<u32>,
    /// Unit of [`TraceEvent::ts`].
    pub time_base: TimeBase,
    /// Wall-clock start, ns since the Unix epoch (0: now).
    pub start_unix_ns: u64,
    /// The probes.
    pub symbols: Vec<Symbol>,
    /// Function names marking phases.
    pub phase_markers: Vec<String>,
    /// Filters run before anything is written.
    pub filter: Filter,
    /// Merge an entry and its exit with nothing between into one call record
    /// (default true; false only to measure what aggregation saves).
    pub aggregate: bool,
}

impl TraceMeta {
    /// Metadata with defaults: ns time base, no filter, aggregation on.
    pub fn new(target: impl Into<String>, symbols: Vec<Symbol>) -> TraceMeta {
        TraceMeta {
            target: target.into(),
            command: Vec::new(),
            pid: None,
            time_base: TimeBase::Ns,
            start_unix_ns: 0,
            symbols,
            phase_markers: Vec::new(),
            filter: Filter::none(),
            aggregate: true,
        }
    }
}

/// A stream file after its header: plain, or LZ4 blocks
/// ([`crate::format::FLAG_LZ4`]); or none (a thread first seen after
/// writing stopped: its events are only counted).
enum StreamOut {
    Plain(File),
    Lz4(crate::format::Lz4Blocks<File>),
    None,
}

impl StreamOut {
    /// Writes the header (flagged when compressed) to `f`.
    fn start(mut f: File, tid: u32, base: u64, compress: bool) -> std::io::Result<StreamOut> {
        use crate::format::{header, FLAG_LZ4};
        f.write_all(&header(tid, base, if compress { FLAG_LZ4 } else { 0 }))?;
        Ok(if compress {
            StreamOut::Lz4(crate::format::Lz4Blocks::new(f))
        } else {
            StreamOut::Plain(f)
        })
    }

    /// The file.
    fn finish(self) -> std::io::Result<File> {
        match self {
            StreamOut::Plain(f) => Ok(f),
            StreamOut::Lz4(e) => Ok(e.into_inner()),
            StreamOut::None => Err(std::io::Error::other("no stream file")),
        }
    }

    /// Cuts the file back to the header and the records (or blocks) that
    /// were written whole, `plain_written` bytes for a plain stream: what
    /// a failed write left after them goes.
    fn cut_back(&mut self, plain_written: u64) -> std::io::Result<()> {
        use std::io::{Seek, SeekFrom};
        let (f, len) = match self {
            StreamOut::Plain(f) => (f, plain_written),
            StreamOut::Lz4(b) => {
                let len = crate::format::HEADER_LEN as u64 + b.written();
                (b.get_mut(), len)
            }
            StreamOut::None => return Ok(()),
        };
        f.set_len(len)?;
        f.seek(SeekFrom::Start(len)).map(|_| ())
    }
}

impl Write for StreamOut {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            StreamOut::Plain(f) => f.write(buf),
            StreamOut::Lz4(e) => e.write(buf),
            StreamOut::None => Err(std::io::Error::other("no stream file")),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            StreamOut::Plain(f) => f.flush(),
            StreamOut::Lz4(e) => e.flush(),
            StreamOut::None => Ok(()),
        }
    }
}

struct ThreadState {
    tid: u32,
    filter: ThreadFilter,
    /// Buffers its output itself (64 KiB chunks).
    enc: Encoder<StreamOut>,
    file: String,
}

/// Writes a trace directory; see docs/TRACE_FORMAT.md.
///
/// Events of a thread must come in that thread's order (timestamps going
/// backwards are clamped and counted); threads may interleave freely.
pub struct TraceWriter {
    dir: PathBuf,
    info: Info,
    filter: CompiledFilter,
    /// The probes (more come with [`TraceWriter::add_symbols`]).
    symbols: SymbolTable,
    /// Thread states, and where each thread's is (most events come in runs
    /// of one thread: the last one looked up is remembered).
    threads: Vec<ThreadState>,
    index: HashMap<u32, usize>,
    last: Option<(u32, usize)>,
    events_in: u64,
    lost: u64,
    /// Typed probes' captured values, per thread (format version 2).
    values: HashMap<u32, ValuesWriter>,
    /// Streams are LZ4 blocks ([`TraceWriter::compress`]).
    compress: bool,
    /// The first write that failed (file and error): nothing is written
    /// from then on, events are only counted ([`TraceWriter::stopped`]).
    stopped: Option<String>,
    /// Events of threads whose stream file could not be created.
    unwritten: u64,
    /// When the buffered records were last written out.
    last_flush: Instant,
    /// The event time (time-base ticks) from which they are written out
    /// again, and [`FLUSH_EVERY`] in ticks.
    flush_at: u64,
    flush_ticks: u64,
}

/// How long at most records stay in memory before they are written (whole
/// records, one block per thread) while events come: what a killed
/// recorder can lose. Measured on the events' own timestamps (no clock
/// read per event); [`TraceWriter::idle`] covers a pause in the events.
pub const FLUSH_EVERY: Duration = Duration::from_millis(500);
/// How old the last write-out must be before [`TraceWriter::idle`] writes
/// again (a trickle of events between idle passes makes no tiny blocks).
pub const IDLE_FLUSH: Duration = Duration::from_millis(100);
/// A file of this size is kept in the trace directory while recording and
/// removed when the trace is finished: on a full disk, the room it frees
/// takes the end records and the final `info.json`.
const RESERVE_BYTES: usize = 64 * 1024;
/// The reserve's file name.
const RESERVE_FILE: &str = ".reserve";

impl TraceWriter {
    /// Whether the thread streams created from now on are compressed (LZ4
    /// blocks after the header, [`crate::format::FLAG_LZ4`]); on by
    /// default: SQLite's 1,500 functions recorded whole take 5.7 bytes a
    /// call plain, 1.5 compressed (docs/PERFORMANCE.md). Off gives the
    /// plain encoding byte for byte (docs/TRACE_FORMAT.md's example).
    pub fn compress(&mut self, on: bool) {
        self.compress = on;
    }

    /// Creates `dir` (and parents) and writes `symbols.tsv` and a provisional
    /// `info.json` (`"complete": false`). Existing stream files are removed.
    pub fn create(dir: impl AsRef<Path>, meta: TraceMeta) -> Result<TraceWriter> {
        let dir = dir.as_ref().to_path_buf();
        if !meta.time_base.is_valid() {
            return Err(TraceError::Invalid(format!(
                "unusable time base {:?}",
                meta.time_base
            )));
        }
        std::fs::create_dir_all(&dir).map_err(|e| TraceError::io(&dir, e))?;
        let rd = std::fs::read_dir(&dir).map_err(|e| TraceError::io(&dir, e))?;
        for ent in rd {
            let ent = ent.map_err(|e| TraceError::io(&dir, e))?;
            let name = ent.file_name();
            let name = name.to_string_lossy();
            let values = (name.starts_with("values-") && name.ends_with(".hpv"))
                || (name.starts_with("kernel-") && name.ends_with(".hpk"));
            if (name.starts_with("tid-") && name.ends_with(".hpt")) || values || name == TYPES_FILE
            {
                std::fs::remove_file(ent.path()).map_err(|e| TraceError::io(ent.path(), e))?;
            }
        }
        let symbols = SymbolTable::new(meta.symbols)?;
        let filter = CompiledFilter::new(&meta.filter, &symbols, &meta.time_base, meta.aggregate)?;
        let sp = dir.join(SYMBOLS_FILE);
        let mut f = BufWriter::new(File::create(&sp).map_err(|e| TraceError::io(&sp, e))?);
        symbols
            .write_tsv(&mut f)
            .and_then(|_| f.flush())
            .map_err(|e| TraceError::io(&sp, e))?;
        let start = if meta.start_unix_ns == 0 {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
        } else {
            meta.start_unix_ns
        };
        let info = Info {
            format: FORMAT_NAME.into(),
            version: FORMAT_VERSION,
            target: meta.target,
            command: meta.command,
            pid: meta.pid,
            time_base: meta.time_base,
            start_unix_ns: start,
            aggregate: meta.aggregate,
            filter: meta.filter,
            phase_markers: meta.phase_markers,
            symbols: symbols.len(),
            complete: false,
            threads: Vec::new(),
            stats: None,
            kernel: None,
            processes: Vec::new(),
        };
        let mut w = TraceWriter {
            dir,
            info,
            filter,
            symbols,
            threads: Vec::new(),
            index: HashMap::new(),
            last: None,
            events_in: 0,
            lost: 0,
            values: HashMap::new(),
            compress: true,
            stopped: None,
            unwritten: 0,
            last_flush: Instant::now(),
            flush_at: 0,
            flush_ticks: 0,
        };
        let ticks = |hz: u64| (u128::from(hz) * FLUSH_EVERY.as_nanos() / 1_000_000_000) as u64;
        w.flush_ticks = w.info.time_base.hz().map_or(u64::MAX, ticks).max(1);
        let rp = w.dir.join(RESERVE_FILE);
        std::fs::write(&rp, vec![0u8; RESERVE_BYTES]).map_err(|e| TraceError::io(&rp, e))?;
        w.write_info()?;
        Ok(w)
    }

    /// Adds probes while recording (the functions of a program a followed
    /// process executed): `symbols.tsv` and `info.json` are written again,
    /// the filters cover them from the next event on.
    pub fn add_symbols(&mut self, symbols: impl IntoIterator<Item = Symbol>) -> Result<()> {
        for s in symbols {
            self.symbols.insert(s)?;
        }
        self.filter = CompiledFilter::new(
            &self.info.filter,
            &self.symbols,
            &self.info.time_base,
            self.info.aggregate,
        )?;
        let sp = self.dir.join(SYMBOLS_FILE);
        let tmp = self.dir.join(".symbols.tsv.tmp");
        let mut f = BufWriter::new(File::create(&tmp).map_err(|e| TraceError::io(&tmp, e))?);
        self.symbols
            .write_tsv(&mut f)
            .and_then(|_| f.flush())
            .map_err(|e| TraceError::io(&tmp, e))?;
        std::fs::rename(&tmp, &sp).map_err(|e| TraceError::io(&sp, e))?;
        self.info.symbols = self.symbols.len();
        self.write_info()
    }

    /// Notes a process the recording followed into a program (listed in
    /// `info.json`'s `processes`).
    pub fn note_process(&mut self, process: crate::info::ProcessInfo) -> Result<()> {
        self.info.processes.push(process);
        self.write_info()
    }

    fn write_info(&self) -> Result<()> {
        let p = self.dir.join(INFO_FILE);
        let tmp = self.dir.join(".info.json.tmp");
        let text = serde_json::to_string_pretty(&self.info).map_err(|e| TraceError::Info {
            path: p.clone(),
            what: e.to_string(),
        })?;
        // No trailing newline: every strict prefix is then invalid JSON.
        std::fs::write(&tmp, text).map_err(|e| TraceError::io(&tmp, e))?;
        std::fs::rename(&tmp, &p).map_err(|e| TraceError::io(&p, e))
    }

    /// The index of thread `tid`'s state in `threads` (created, with its
    /// stream file, on its first event).
    #[inline(always)]
    fn thread(&mut self, tid: u32, ts: u64) -> Result<usize> {
        match self.last {
            Some((t, i)) if t == tid => Ok(i),
            _ => self.thread_slow(tid, ts),
        }
    }

    #[cold]
    fn thread_slow(&mut self, tid: u32, ts: u64) -> Result<usize> {
        let i = match self.index.get(&tid) {
            Some(&i) => i,
            None => {
                let file = stream_file_name(tid);
                let p = self.dir.join(&file);
                let started = match self.stopped {
                    Some(_) => Ok(StreamOut::None),
                    None => {
                        File::create(&p).and_then(|f| StreamOut::start(f, tid, ts, self.compress))
                    }
                };
                let out = started.unwrap_or_else(|e| {
                    // No stream file rather than one cut inside its header.
                    let _ = std::fs::remove_file(&p);
                    self.stop(format!("{}: {e}", p.display()));
                    StreamOut::None
                });
                let mut enc = Encoder::after_header(out, ts);
                if self.stopped.is_some() {
                    enc.stop();
                }
                self.threads.push(ThreadState {
                    tid,
                    filter: ThreadFilter::new(),
                    enc,
                    file,
                });
                let i = self.threads.len() - 1;
                self.index.insert(tid, i);
                i
            }
        };
        self.last = Some((tid, i));
        Ok(i)
    }

    /// Filters, aggregates and encodes one event. A failed write does not
    /// fail it: writing stops there ([`TraceWriter::stopped`]) and the
    /// events are counted from then on, so that the recording goes on.
    #[inline]
    pub fn write_event(&mut self, ev: &TraceEvent) -> Result<()> {
        self.events_in += 1;
        let i = self.thread(ev.tid, ev.ts)?;
        let t = &mut self.threads[i];
        t.filter.push(&self.filter, ev, &mut t.enc);
        if let Some(e) = t.enc.take_error() {
            self.stop(self.io_error(i, e).to_string());
        }
        if ev.ts >= self.flush_at {
            if self.flush_at != 0 {
                self.flush();
            }
            self.flush_at = ev.ts.saturating_add(self.flush_ticks);
        }
        Ok(())
    }

    /// Called when no event came for a while (a drain pass found the rings
    /// empty): writes out what is buffered once it is [`IDLE_FLUSH`] old,
    /// so that a recorder killed while the program pauses loses nothing
    /// it drained.
    pub fn idle(&mut self) {
        if self.last_flush.elapsed() >= IDLE_FLUSH {
            self.flush();
        }
    }

    /// Writes every thread's buffered records (whole records: one LZ4
    /// block per thread), so that they survive the recorder being killed.
    /// `write_event` does so every [`FLUSH_EVERY`] while events come.
    pub fn flush(&mut self) {
        self.last_flush = Instant::now();
        if self.stopped.is_none() {
            let mut failed = None;
            for (tid, v) in &mut self.values {
                if let Err(e) = v.flush() {
                    failed = Some(format!(
                        "{}: {e}",
                        self.dir.join(values_file_name(*tid)).display()
                    ));
                }
            }
            if let Some(why) = failed {
                self.stop(why);
            }
        }
        for i in 0..self.threads.len() {
            let t = &mut self.threads[i];
            t.enc.flush_chunk();
            if let Some(e) = t.enc.take_error() {
                self.stop(self.io_error(i, e).to_string());
            }
        }
    }

    /// Stops writing (the first failed write, `why`): every stream keeps
    /// what was written whole, later events are only counted, and
    /// [`TraceWriter::finish`] ends each stream with a lost record
    /// counting them.
    #[cold]
    fn stop(&mut self, why: String) {
        if self.stopped.is_none() {
            self.stopped = Some(why);
        }
        for t in &mut self.threads {
            t.enc.stop();
        }
    }

    /// The write that failed, if writing stopped (the file and the OS
    /// error, e.g. "No space left on device"); events are only counted
    /// since, and the streams end with a lost record counting them.
    pub fn stopped(&self) -> Option<&str> {
        self.stopped.as_deref()
    }

    /// Writes `types.tsv`: the shapes of the typed probes' values. Their
    /// symbols should keep one argument and the return value (the index of
    /// each event's captured record, see [`TraceWriter::write_event_values`]).
    pub fn set_value_types(&mut self, types: &ValueTypes) -> Result<()> {
        types.write(&self.dir.join(TYPES_FILE))
    }

    /// Writes the probes' calibrated costs (`costs.tsv`): readers then take
    /// them out of the recorded times ([`crate::ProbeCosts`]).
    pub fn set_probe_costs(&mut self, costs: &crate::ProbeCosts) -> Result<()> {
        costs.write(&self.dir.join(crate::COSTS_FILE))
    }

    /// Writes an event of a typed probe with the bytes captured at its hit:
    /// they go to the thread's values file, and the event keeps their
    /// index as its argument (entry, hit) or return value (exit).
    pub fn write_event_values(&mut self, ev: &TraceEvent, data: &[u8]) -> Result<()> {
        if self.stopped.is_some() {
            return self.write_event(ev);
        }
        let pushed = match self.values.entry(ev.tid) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut().push(data),
            std::collections::hash_map::Entry::Vacant(v) => {
                let p = self.dir.join(values_file_name(ev.tid));
                ValuesWriter::create(&p).and_then(|w| v.insert(w).push(data))
            }
        };
        let i = match pushed {
            Ok(i) => i,
            Err(e) => {
                let p = self.dir.join(values_file_name(ev.tid));
                self.stop(format!("{}: {e}", p.display()));
                return self.write_event(ev);
            }
        };
        let mut ev = *ev;
        match ev.kind {
            crate::EventKind::Exit => ev.ret = Some(i),
            _ => ev.args = crate::Args::from_slice(&[i]),
        }
        self.write_event(&ev)
    }

    #[cold]
    fn io_error(&self, i: usize, e: std::io::Error) -> TraceError {
        TraceError::io(self.dir.join(&self.threads[i].file), e)
    }

    /// Records that `count` events of thread `tid` were lost (full ring)
    /// at this point of its stream.
    pub fn note_lost(&mut self, tid: u32, ts: u64, count: u64) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        self.lost += count;
        let i = self.thread(tid, ts)?;
        let t = &mut self.threads[i];
        t.enc.write(&Record::Lost { ts, count });
        if let Some(e) = t.enc.take_error() {
            self.stop(self.io_error(i, e).to_string());
        }
        Ok(())
    }

    /// Writes thread `tid`'s host-kernel events (times in CLOCK_MONOTONIC
    /// ns, converted to the time base's ticks through its calibration
    /// pairs) to `kernel-TID.hpk`, listed in `info.json` at
    /// [`TraceWriter::finish`]. Once per thread.
    pub fn write_kernel_thread(
        &mut self,
        tid: u32,
        pid: u32,
        events_ns: &[crate::kernel::KernelEvent],
    ) -> Result<()> {
        let tb = self.info.time_base;
        let mut ev: Vec<_> = events_ns
            .iter()
            .map(|e| crate::kernel::KernelEvent {
                start: tb.ticks_at_ns(e.start),
                end: tb.ticks_at_ns(e.end),
                kind: e.kind,
            })
            .collect();
        let syscalls = ev.iter().filter(|e| e.is_syscall()).count() as u64;
        let bytes = crate::kernel::encode(tid, pid, &mut ev);
        let file = crate::kernel::kernel_file_name(tid);
        let p = self.dir.join(&file);
        std::fs::write(&p, &bytes).map_err(|e| TraceError::io(&p, e))?;
        let k = self.info.kernel.get_or_insert_with(Default::default);
        k.threads.push(crate::kernel::KernelThreadInfo {
            tid,
            pid,
            file,
            syscalls,
            off_cpu: ev.len() as u64 - syscalls,
            bytes: bytes.len() as u64,
        });
        Ok(())
    }

    /// Records the counts of the host kernel's events: records taken,
    /// lost by the kernel, left unpaired, ring reads not parsed whole.
    pub fn note_kernel(&mut self, taken: u64, lost: u64, unpaired: u64, corrupt: u64) {
        let k = self.info.kernel.get_or_insert_with(Default::default);
        k.taken += taken;
        k.lost += lost;
        k.unpaired += unpaired;
        k.corrupt += corrupt;
    }

    /// Filter counters so far, summed over threads.
    pub fn filter_stats(&self) -> FilterStats {
        let mut s = FilterStats::default();
        for t in &self.threads {
            s.add(t.filter.stats());
        }
        s
    }

    /// Writes held entries and end records, closes the streams and writes
    /// the final `info.json`. After a failed write ([`TraceWriter::stopped`])
    /// each stream is cut back to what was written whole and ends with a
    /// lost record counting the events not written (`stats.dropped`).
    pub fn finish(mut self) -> Result<WriteStats> {
        // The reserve's room takes the end records and info.json.
        let rp = self.dir.join(RESERVE_FILE);
        match std::fs::remove_file(&rp) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(TraceError::io(&rp, e))
            }
            _ => {}
        }
        let mut stats = WriteStats {
            events_in: self.events_in,
            lost: self.lost,
            dropped: self.unwritten,
            ..WriteStats::default()
        };
        for (tid, w) in std::mem::take(&mut self.values) {
            let p = self.dir.join(values_file_name(tid));
            if let Err(e) = w.finish() {
                self.stop(format!("{}: {e}", p.display()));
            }
        }
        // Held entries first: writing them may fail too.
        for i in 0..self.threads.len() {
            let t = &mut self.threads[i];
            t.filter.finish(&mut t.enc);
            t.enc.flush_chunk();
            if let Some(e) = t.enc.take_error() {
                self.stop(self.io_error(i, e).to_string());
            }
        }
        let mut states = std::mem::take(&mut self.threads);
        states.sort_by_key(|t| t.tid);
        for mut t in states {
            let tid = t.tid;
            stats.filtered.add(t.filter.stats());
            let p = self.dir.join(&t.file);
            let (f, counts) = if t.enc.stopped() {
                let whole = t.enc.written();
                if matches!(t.enc.get_mut(), StreamOut::None) {
                    stats.dropped += t.enc.counts().events();
                    continue;
                }
                t.enc
                    .get_mut()
                    .cut_back(whole)
                    .map_err(|e| TraceError::io(&p, e))?;
                let (out, counts, lost) = t.enc.finish_lost().map_err(|e| TraceError::io(&p, e))?;
                stats.dropped += lost;
                (out.finish().map_err(|e| TraceError::io(&p, e))?, counts)
            } else {
                let counts: KindCounts = *t.enc.counts();
                let f = t
                    .enc
                    .finish()
                    .and_then(|(out, _)| out.finish())
                    .map_err(|e| TraceError::io(&p, e))?;
                (f, counts)
            };
            f.sync_all().map_err(|e| TraceError::io(&p, e))?;
            // The file's size (compressed), which a reader checks.
            let bytes = f.metadata().map_err(|e| TraceError::io(&p, e))?.len();
            stats.kinds.add(&counts);
            stats.bytes += bytes;
            stats.threads += 1;
            self.info.threads.push(ThreadInfo {
                tid,
                file: t.file,
                records: counts.records(),
                events: counts.events(),
                bytes,
            });
        }
        stats.records = stats.kinds.records();
        stats.events_out = stats.kinds.events();
        stats.write_error = self.stopped.clone();
        if let Some(k) = &mut self.info.kernel {
            k.threads.sort_by_key(|t| t.tid);
        }
        self.info.complete = true;
        self.info.stats = Some(stats.clone());
        self.write_info()?;
        Ok(stats)
    }
}
