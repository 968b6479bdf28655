//! [`Decoder`]: reads one thread stream (`tid-<TID>.hpt`, plain or in
//! LZ4 blocks) record by record; see docs/TRACE_FORMAT.md.

use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::{Result, TraceError};
use crate::event::{Args, Record, MAX_ARGS};
use crate::format::{
    apply_exit, KindCounts, FLAG_LZ4, F_ARGS, F_RET, F_UNWOUND, HEADER_LEN, PAYLOAD, P_IMPLIED,
    P_VARINT, STREAM_MAGIC, STREAM_VERSION, T_CALL, T_END, T_ENTRY, T_EXIT, T_HIT, T_LOST,
};
use crate::lz4::Lz4Reader;
use crate::varint::unzigzag;

/// Buffered byte source counting the offset.
struct Bytes<R> {
    inner: R,
    buf: Box<[u8]>,
    pos: usize,
    len: usize,
    /// Offset of `buf[0]` in the file.
    base: u64,
}

impl<R: Read> Bytes<R> {
    fn offset(&self) -> u64 {
        self.base + self.pos as u64
    }

    fn fill(&mut self) -> std::io::Result<bool> {
        if self.pos < self.len {
            return Ok(true);
        }
        self.base += self.len as u64;
        self.pos = 0;
        self.len = 0;
        loop {
            match self.inner.read(&mut self.buf) {
                Ok(n) => {
                    self.len = n;
                    return Ok(n > 0);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    #[inline]
    fn byte(&mut self) -> std::io::Result<Option<u8>> {
        if self.pos == self.len && !self.fill()? {
            return Ok(None);
        }
        let b = self.buf[self.pos];
        self.pos += 1;
        Ok(Some(b))
    }
}

/// What a [`Decoder`] reads records from: the file after its header, or
/// the LZ4 block reader over it ([`FLAG_LZ4`]; the bytes already read
/// past the header come first).
enum Source<R: Read> {
    Plain(R),
    Lz4(Box<Lz4Reader<std::io::Chain<std::io::Cursor<Vec<u8>>, R>>>),
    /// Only while switching from `Plain` to `Lz4`.
    Gone,
}

impl<R: Read> Read for Source<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Source::Plain(r) => r.read(buf),
            Source::Lz4(d) => d.read(buf),
            Source::Gone => Ok(0),
        }
    }
}

/// Decodes one thread stream, never panicking on bad input. In a
/// compressed stream ([`FLAG_LZ4`]) the offsets of errors count
/// decompressed bytes (header included).
pub struct Decoder<R: Read> {
    src: Bytes<Source<R>>,
    path: PathBuf,
    tid: u32,
    base: u64,
    cursor: u64,
    open: Vec<u32>,
    records: u64,
    counts: KindCounts,
    done: bool,
    /// Offset after the last record decoded whole (plain streams).
    whole: u64,
}

impl<R: Read> Decoder<R> {
    /// Reads and checks the header; `path` names the stream in errors.
    pub fn new(inner: R, path: impl Into<PathBuf>) -> Result<Decoder<R>> {
        let mut d = Decoder {
            src: Bytes {
                inner: Source::Plain(inner),
                buf: vec![0; 64 * 1024].into_boxed_slice(),
                pos: 0,
                len: 0,
                base: 0,
            },
            path: path.into(),
            tid: 0,
            base: 0,
            cursor: 0,
            open: Vec::new(),
            records: 0,
            counts: KindCounts::default(),
            done: false,
            whole: 0,
        };
        let mut h = [0u8; HEADER_LEN];
        for (i, b) in h.iter_mut().enumerate() {
            *b = d.byte_or(|| format!("header (byte {i} of {HEADER_LEN})"))?;
        }
        if h[0..4] != STREAM_MAGIC {
            return Err(d.corrupt(
                0,
                format!("bad magic {:02x?} (not a hotprobe stream)", &h[0..4]),
            ));
        }
        let version = u16::from_le_bytes([h[4], h[5]]);
        if version != STREAM_VERSION {
            return Err(d.corrupt(
                4,
                format!("stream version {version}, this reader knows {STREAM_VERSION}"),
            ));
        }
        let flags = u16::from_le_bytes([h[6], h[7]]);
        if flags & !FLAG_LZ4 != 0 {
            return Err(d.corrupt(6, format!("unknown header flags {flags:#x}")));
        }
        if flags & FLAG_LZ4 != 0 {
            // The bytes read past the header start the frame.
            let rest = d.src.buf[d.src.pos..d.src.len].to_vec();
            if let Source::Plain(r) = std::mem::replace(&mut d.src.inner, Source::Gone) {
                let chain = std::io::Cursor::new(rest).chain(r);
                d.src.inner = Source::Lz4(Box::new(Lz4Reader::new(chain, HEADER_LEN as u64)));
            }
            d.src.base = HEADER_LEN as u64;
            d.src.pos = 0;
            d.src.len = 0;
        }
        d.tid = u32::from_le_bytes(h[8..12].try_into().unwrap_or_default());
        d.base = u64::from_le_bytes(h[12..20].try_into().unwrap_or_default());
        d.cursor = d.base;
        d.whole = HEADER_LEN as u64;
        Ok(d)
    }

    /// File bytes holding what was decoded whole so far: the header and
    /// the whole records (plain) or whole LZ4 blocks read (compressed).
    /// After a cut ([`TraceError::Truncated`]), what a reader could use.
    pub fn whole_bytes(&self) -> u64 {
        match &self.src.inner {
            Source::Lz4(r) => r.whole(),
            _ => self.whole,
        }
    }

    /// Records decoded so far (the end record not counted).
    pub fn records(&self) -> u64 {
        self.records
    }

    /// Thread id from the header.
    pub fn tid(&self) -> u32 {
        self.tid
    }

    /// Base timestamp from the header.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Byte offset of the next record.
    pub fn offset(&self) -> u64 {
        self.src.offset()
    }

    /// The stream's path (as given).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records decoded so far, per type.
    pub fn counts(&self) -> &KindCounts {
        &self.counts
    }

    fn corrupt(&self, offset: u64, what: String) -> TraceError {
        TraceError::Corrupt {
            path: self.path.clone(),
            offset,
            what,
        }
    }

    /// A read error: a compressed stream cut inside an LZ4 block is
    /// truncated, a bad block corrupt, anything else an I/O error.
    fn read_error(&self, e: std::io::Error, what: impl FnOnce() -> String) -> TraceError {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            return TraceError::Truncated {
                path: self.path.clone(),
                offset: self.src.offset(),
                what: format!("{} (inside an LZ4 block)", what()),
            };
        }
        if e.kind() == std::io::ErrorKind::InvalidData {
            return self.corrupt(self.src.offset(), e.to_string());
        }
        TraceError::io(self.path.clone(), e)
    }

    fn byte_or(&mut self, what: impl FnOnce() -> String) -> Result<u8> {
        match self.src.byte() {
            Ok(Some(b)) => Ok(b),
            Ok(None) => Err(TraceError::Truncated {
                path: self.path.clone(),
                offset: self.src.offset(),
                what: what(),
            }),
            Err(e) => Err(self.read_error(e, what)),
        }
    }

    fn varint(&mut self, what: &str) -> Result<u64> {
        let start = self.src.offset();
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.byte_or(|| format!("{what} varint"))?;
            if i == 9 && b > 1 {
                break;
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(self.corrupt(start, format!("{what} varint longer than 64 bits")))
    }

    fn time(&mut self, start: u64) -> Result<u64> {
        let d = self.varint("timestamp delta")?;
        self.cursor = self
            .cursor
            .checked_add(d)
            .ok_or_else(|| self.corrupt(start, "timestamp overflows 64 bits".into()))?;
        Ok(self.cursor)
    }

    fn payload(&mut self, start: u64, allowed: u8) -> Result<(Args, Option<u64>, bool)> {
        let flags = self.byte_or(|| "payload flags".into())?;
        if flags == 0 || flags & !allowed != 0 {
            return Err(self.corrupt(start, format!("bad payload flags {flags:#04x}")));
        }
        let mut args = Args::EMPTY;
        if flags & F_ARGS != 0 {
            let n = self.varint("argument count")?;
            if n == 0 || n > MAX_ARGS as u64 {
                return Err(self.corrupt(start, format!("{n} arguments (1..={MAX_ARGS} allowed)")));
            }
            for _ in 0..n {
                args.push(unzigzag(self.varint("argument")?) as u64);
            }
        }
        let ret = if flags & F_RET != 0 {
            Some(unzigzag(self.varint("return value")?) as u64)
        } else {
            None
        };
        Ok((args, ret, flags & F_UNWOUND != 0))
    }

    /// The next record (timestamps in ticks), `Ok(None)` after the end record.
    pub fn next_record(&mut self) -> Result<Option<Record>> {
        if self.done {
            return Ok(None);
        }
        let start = self.src.offset();
        let h = match self.src.byte() {
            Ok(Some(h)) => h,
            Ok(None) => {
                return Err(TraceError::Truncated {
                    path: self.path.clone(),
                    offset: start,
                    what: format!(
                        "no end record after {} records (recording interrupted?)",
                        self.records
                    ),
                })
            }
            Err(e) => return Err(self.read_error(e, || "a record".into())),
        };
        let ty = h & 7;
        let payload = h & PAYLOAD != 0;
        let code = h >> 4;
        let rec = match ty {
            T_END => {
                if h != T_END {
                    return Err(self.corrupt(start, format!("bad end record header {h:#04x}")));
                }
                let n = self.varint("record count")?;
                if n != self.records {
                    return Err(self.corrupt(
                        start,
                        format!("end record counts {n} records, stream has {}", self.records),
                    ));
                }
                match self.src.byte() {
                    Ok(None) => {}
                    Ok(Some(_)) => {
                        return Err(
                            self.corrupt(self.src.offset() - 1, "data after the end record".into())
                        )
                    }
                    Err(e) => return Err(self.read_error(e, || "the end of the stream".into())),
                }
                self.done = true;
                return Ok(None);
            }
            T_LOST => {
                if h != T_LOST {
                    return Err(self.corrupt(start, format!("bad lost record header {h:#04x}")));
                }
                let count = self.varint("lost count")?;
                Record::Lost {
                    ts: self.cursor,
                    count,
                }
            }
            T_CALL | T_ENTRY | T_EXIT | T_HIT => {
                let probe = match code {
                    P_VARINT => {
                        let p = self.varint("probe id")?;
                        u32::try_from(p)
                            .map_err(|_| self.corrupt(start, format!("probe id {p} too large")))?
                    }
                    P_IMPLIED if ty == T_EXIT => *self.open.last().ok_or_else(|| {
                        self.corrupt(
                            start,
                            "exit of the innermost entry, but none is open".into(),
                        )
                    })?,
                    P_IMPLIED => {
                        return Err(self.corrupt(start, "implied probe outside an exit".into()))
                    }
                    c => c.into(),
                };
                let ts = self.time(start)?;
                match ty {
                    T_CALL => {
                        let dur = self.varint("duration")?;
                        self.cursor = self.cursor.checked_add(dur).ok_or_else(|| {
                            self.corrupt(start, "call end overflows 64 bits".into())
                        })?;
                        let (args, ret, _) = if payload {
                            self.payload(start, F_ARGS | F_RET)?
                        } else {
                            (Args::EMPTY, None, false)
                        };
                        Record::Call {
                            ts,
                            dur,
                            probe,
                            args,
                            ret,
                        }
                    }
                    T_ENTRY | T_HIT => {
                        let (args, _, _) = if payload {
                            self.payload(start, F_ARGS)?
                        } else {
                            (Args::EMPTY, None, false)
                        };
                        if ty == T_ENTRY {
                            self.open.push(probe);
                            Record::Entry { ts, probe, args }
                        } else {
                            Record::Hit { ts, probe, args }
                        }
                    }
                    _ => {
                        let (_, ret, unwound) = if payload {
                            self.payload(start, F_RET | F_UNWOUND)?
                        } else {
                            (Args::EMPTY, None, false)
                        };
                        apply_exit(&mut self.open, probe);
                        Record::Exit {
                            ts,
                            probe,
                            ret,
                            unwound,
                        }
                    }
                }
            }
            _ => {
                return Err(
                    self.corrupt(start, format!("unknown record type {ty} (header {h:#04x})"))
                )
            }
        };
        self.records += 1;
        self.counts.count(&rec);
        self.whole = self.src.offset();
        Ok(Some(rec))
    }
}
