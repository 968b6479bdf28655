//! [`TraceReader`]: opens a trace directory and decodes its thread streams.

use std::fs::File;
use std::path::{Path, PathBuf};

use crate::error::{Result, TraceError};
use crate::event::{Record, TimeBase};
use crate::format::Decoder;
use crate::info::{Info, FORMAT_NAME, FORMAT_VERSION};
use crate::symbols::SymbolTable;
use crate::values::{values_file_name, ThreadValues, ValueTypes, TYPES_FILE};
use crate::writer::{INFO_FILE, SYMBOLS_FILE};

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

/// An opened trace directory.
#[derive(Clone, Debug)]
pub struct TraceReader {
    dir: PathBuf,
    info: Info,
    symbols: SymbolTable,
    streams: Vec<StreamFile>,
    value_types: ValueTypes,
}

impl TraceReader {
    /// Reads `info.json` and `symbols.tsv` and lists the streams; every
    /// inconsistency (unknown format or version, symbol count, a listed
    /// stream missing or of another size) is an error naming the file.
    pub fn open(dir: impl AsRef<Path>) -> Result<TraceReader> {
        let dir = dir.as_ref().to_path_buf();
        let ip = dir.join(INFO_FILE);
        let text = std::fs::read_to_string(&ip).map_err(|e| TraceError::io(&ip, e))?;
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
        // Version 1 has no typed values; everything else is the same.
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
                what: format!("unusable time base {:?}", info.time_base),
            });
        }
        let sp = dir.join(SYMBOLS_FILE);
        let stext = std::fs::read_to_string(&sp).map_err(|e| TraceError::io(&sp, e))?;
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
        let value_types = match std::fs::read_to_string(&tp) {
            Ok(text) => ValueTypes::parse(&text, &tp)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => ValueTypes::default(),
            Err(e) => return Err(TraceError::io(&tp, e)),
        };
        Ok(TraceReader {
            dir,
            info,
            symbols,
            streams,
            value_types,
        })
    }

    /// The shapes of the typed probes' values (`types.tsv`; empty without).
    pub fn value_types(&self) -> &ValueTypes {
        &self.value_types
    }

    /// Thread `tid`'s captured values (`values-TID.hpv`; empty without).
    pub fn thread_values(&self, tid: u32) -> Result<ThreadValues> {
        let p = self.dir.join(values_file_name(tid));
        match std::fs::read(&p) {
            Ok(bytes) => ThreadValues::parse(bytes, &p),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ThreadValues::default()),
            Err(e) => Err(TraceError::io(&p, e)),
        }
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
        let s = self
            .streams
            .iter()
            .find(|s| s.tid == tid)
            .ok_or_else(|| TraceError::Invalid(format!("no stream for thread {tid}")))?;
        ThreadStream::open(&s.path, self.info.time_base, Some(tid))
    }

    /// Opens every stream, in tid order.
    pub fn threads(&self) -> Result<Vec<ThreadStream>> {
        self.streams.iter().map(|s| self.thread(s.tid)).collect()
    }
}

/// Iterator over one thread's records (`Result` per record; after the
/// first error or the end record it yields `None`).
pub struct ThreadStream {
    dec: Decoder<File>,
    time: TimeBase,
    raw: bool,
    done: bool,
}

impl ThreadStream {
    /// Opens a stream file; times are converted with `time` to ns.
    /// `expect_tid` checks the header's tid.
    pub fn open(path: &Path, time: TimeBase, expect_tid: Option<u32>) -> Result<ThreadStream> {
        let f = File::open(path).map_err(|e| TraceError::io(path, e))?;
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
            dec,
            time,
            raw: false,
            done: false,
        })
    }

    /// Yields timestamps in raw ticks of the time base instead of ns.
    pub fn raw(mut self) -> ThreadStream {
        self.raw = true;
        self
    }

    /// Thread id.
    pub fn tid(&self) -> u32 {
        self.dec.tid()
    }

    /// Byte offset of the next record.
    pub fn offset(&self) -> u64 {
        self.dec.offset()
    }

    /// The file.
    pub fn path(&self) -> &Path {
        self.dec.path()
    }

    fn convert(&self, r: Record) -> Record {
        if self.raw || self.time == TimeBase::Ns {
            return r;
        }
        let t = |x: u64| self.time.to_ns(x);
        match r {
            Record::Entry { ts, probe, args } => Record::Entry {
                ts: t(ts),
                probe,
                args,
            },
            Record::Exit {
                ts,
                probe,
                ret,
                unwound,
            } => Record::Exit {
                ts: t(ts),
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
                let s = t(ts);
                Record::Call {
                    ts: s,
                    dur: t(ts.saturating_add(dur)).saturating_sub(s),
                    probe,
                    args,
                    ret,
                }
            }
            Record::Hit { ts, probe, args } => Record::Hit {
                ts: t(ts),
                probe,
                args,
            },
            Record::Lost { ts, count } => Record::Lost { ts: t(ts), count },
        }
    }
}

impl Iterator for ThreadStream {
    type Item = Result<Record>;

    fn next(&mut self) -> Option<Result<Record>> {
        if self.done {
            return None;
        }
        match self.dec.next_record() {
            Ok(Some(r)) => Some(Ok(self.convert(r))),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}
