//! The per-thread stream encoding (`tid-<TID>.hpt`); see docs/TRACE_FORMAT.md.
//!
//! Header (20 bytes, little-endian): magic `HPTS`, version u16, flags u16
//! (0, or [`FLAG_LZ4`]: the records after the header are one LZ4 frame), tid
//! u32, base timestamp u64. Then records, each starting with a header byte
//! `H`:
//!
//! | bits | meaning |
//! |------|---------|
//! | 0–2  | type: 0 call, 1 entry, 2 exit, 3 hit, 4 lost, 5 end |
//! | 3    | a payload follows |
//! | 4–7  | probe: 0–13 the id itself, 14 the innermost open entry's id (exits), 15 a varint id follows |
//!
//! then `[probe varint] delta varint [duration varint (call)] [payload]`;
//! lost: `H count` (no time); end: `H record-count`, then end of file.
//! Payload: flags byte (bit 0 args, bit 1 return value, bit 2 unwound),
//! `[nargs varint, nargs zigzag varints] [ret zigzag varint]`.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::error::{Result, TraceError};
use crate::event::{Args, Record, MAX_ARGS};
use crate::varint::{unzigzag, zigzag};

/// Stream magic.
pub const STREAM_MAGIC: [u8; 4] = *b"HPTS";
/// Stream format version.
pub const STREAM_VERSION: u16 = 1;
/// Header size in bytes.
pub const HEADER_LEN: usize = 20;
/// Header flag: the records after the (uncompressed) header come in LZ4
/// blocks, each `raw-length compressed-length` (varints) then the
/// compressed bytes ([`Lz4Blocks`]). A reader that knows only flags 0
/// refuses such a stream with "unknown header flags".
pub const FLAG_LZ4: u16 = 1;

/// The largest block [`Lz4Blocks`] writes or a reader accepts (raw bytes).
pub const LZ4_MAX_BLOCK: usize = 1 << 20;

/// A writer of LZ4 blocks ([`FLAG_LZ4`]): each `write` of up to
/// [`LZ4_MAX_BLOCK`] bytes becomes one block (the [`Encoder`] writes 64 KiB
/// chunks). Not the LZ4 frame format: its decoders take a file cut at a
/// block boundary or inside the end mark for a complete one, and a reader
/// of these streams must tell a cut at every byte (the block lengths make
/// any cut inside a block visible, and the stream's own end record does
/// the rest).
#[derive(Debug)]
pub struct Lz4Blocks<W: Write> {
    out: W,
    block: Vec<u8>,
}

impl<W: Write> Lz4Blocks<W> {
    /// Blocks into `out`.
    pub fn new(out: W) -> Lz4Blocks<W> {
        Lz4Blocks {
            out,
            block: Vec::new(),
        }
    }

    /// The underlying writer.
    pub fn into_inner(self) -> W {
        self.out
    }
}

impl<W: Write> Write for Lz4Blocks<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let raw = &buf[..buf.len().min(LZ4_MAX_BLOCK)];
        if raw.is_empty() {
            return Ok(0);
        }
        let max = lz4_flex::block::get_maximum_output_size(raw.len());
        self.block.resize(max + 20, 0);
        let mut head = 0;
        // Lengths first (the compressed one once known), then the data.
        let n = lz4_flex::block::compress_into(raw, &mut self.block[20..])
            .map_err(std::io::Error::other)?;
        let mut lens = [0u8; 20];
        for v in [raw.len() as u64, n as u64] {
            let mut v = v;
            loop {
                let b = (v & 0x7f) as u8;
                v >>= 7;
                if v == 0 {
                    lens[head] = b;
                    head += 1;
                    break;
                }
                lens[head] = b | 0x80;
                head += 1;
            }
        }
        self.block[20 - head..20].copy_from_slice(&lens[..head]);
        self.out.write_all(&self.block[20 - head..20 + n])?;
        Ok(raw.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// The reading side of [`Lz4Blocks`]: a cut inside a block is an
/// `UnexpectedEof` error, a bad block `InvalidData`; the end of the input
/// at a block boundary is the end.
struct Lz4Reader<R: Read> {
    inner: R,
    comp: Vec<u8>,
    raw: Vec<u8>,
    pos: usize,
}

impl<R: Read> Lz4Reader<R> {
    /// A length varint; `None` at the end of the input before its first byte.
    fn len(&mut self, first: bool) -> std::io::Result<Option<usize>> {
        let mut v = 0u64;
        for i in 0..10 {
            let mut b = [0u8];
            if i == 0 && first {
                if self.inner.read(&mut b)? == 0 {
                    return Ok(None);
                }
            } else {
                self.inner.read_exact(&mut b)?;
            }
            v |= u64::from(b[0] & 0x7f) << (7 * i);
            if b[0] & 0x80 == 0 {
                return Ok(Some(usize::try_from(v).unwrap_or(usize::MAX)));
            }
        }
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "LZ4 block length longer than 64 bits",
        ))
    }
}

impl<R: Read> Read for Lz4Reader<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pos == self.raw.len() {
            let bad = |what: String| std::io::Error::new(std::io::ErrorKind::InvalidData, what);
            let Some(raw) = self.len(true)? else {
                return Ok(0);
            };
            let comp = self.len(false)?.unwrap_or(0);
            if raw == 0 || raw > LZ4_MAX_BLOCK {
                return Err(bad(format!("LZ4 block of {raw} bytes")));
            }
            if comp > lz4_flex::block::get_maximum_output_size(raw) {
                return Err(bad(format!(
                    "LZ4 block of {raw} bytes compressed into {comp}"
                )));
            }
            self.comp.resize(comp, 0);
            self.inner.read_exact(&mut self.comp)?;
            self.raw.resize(raw, 0);
            let n = lz4_flex::block::decompress_into(&self.comp, &mut self.raw)
                .map_err(|e| bad(format!("LZ4 block: {e}")))?;
            if n != raw {
                return Err(bad(format!(
                    "LZ4 block of {raw} bytes decompressed into {n}"
                )));
            }
            self.pos = 0;
        }
        let n = buf.len().min(self.raw.len() - self.pos);
        buf[..n].copy_from_slice(&self.raw[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// The 20-byte stream header.
pub(crate) fn header(tid: u32, base: u64, flags: u16) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0..4].copy_from_slice(&STREAM_MAGIC);
    h[4..6].copy_from_slice(&STREAM_VERSION.to_le_bytes());
    h[6..8].copy_from_slice(&flags.to_le_bytes());
    h[8..12].copy_from_slice(&tid.to_le_bytes());
    h[12..20].copy_from_slice(&base.to_le_bytes());
    h
}

const T_CALL: u8 = 0;
const T_ENTRY: u8 = 1;
const T_EXIT: u8 = 2;
const T_HIT: u8 = 3;
const T_LOST: u8 = 4;
const T_END: u8 = 5;
const PAYLOAD: u8 = 0x08;
const P_IMPLIED: u8 = 14;
const P_VARINT: u8 = 15;
const F_ARGS: u8 = 1;
const F_RET: u8 = 2;
const F_UNWOUND: u8 = 4;

/// Records of each type written or read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct KindCounts {
    /// Aggregated calls.
    pub calls: u64,
    /// Entries.
    pub entries: u64,
    /// Exits.
    pub exits: u64,
    /// Hits.
    pub hits: u64,
    /// Lost-events records.
    pub lost: u64,
}

impl KindCounts {
    fn count(&mut self, r: &Record) {
        match r {
            Record::Call { .. } => self.calls += 1,
            Record::Entry { .. } => self.entries += 1,
            Record::Exit { .. } => self.exits += 1,
            Record::Hit { .. } => self.hits += 1,
            Record::Lost { .. } => self.lost += 1,
        }
    }
    /// Adds another count.
    pub fn add(&mut self, o: &KindCounts) {
        self.calls += o.calls;
        self.entries += o.entries;
        self.exits += o.exits;
        self.hits += o.hits;
        self.lost += o.lost;
    }
    /// Records in all.
    pub fn records(&self) -> u64 {
        self.calls + self.entries + self.exits + self.hits + self.lost
    }
    /// Function events they stand for (a call is two).
    pub fn events(&self) -> u64 {
        2 * self.calls + self.entries + self.exits + self.hits
    }
}

/// The open-entry stack both sides keep to resolve implied exit probes.
fn apply_exit(open: &mut Vec<u32>, probe: u32) {
    if let Some(p) = open.iter().rposition(|&o| o == probe) {
        open.truncate(p);
    }
}

/// Bytes an [`Encoder`] gathers before it hands them to its writer (one
/// `write` per 64 KiB: ≈ 40 000 events of a leaf-heavy trace).
const OUT_CHUNK: usize = 64 * 1024;
/// Most bytes one record takes: `H`, probe (5), delta (10), duration (10),
/// flags, nargs, 6 arguments (60), return value (10).
const MAX_RECORD: usize = 1 + 5 + 10 + 10 + 1 + 1 + 6 * 10 + 10;

/// One record being encoded into room for [`MAX_RECORD`] bytes.
struct Rec<'a> {
    s: &'a mut [u8; MAX_RECORD],
    n: usize,
}

impl Rec<'_> {
    #[inline(always)]
    fn byte(&mut self, b: u8) {
        self.s[self.n] = b;
        self.n += 1;
    }

    /// An unsigned LEB128 varint (the 1- and 2-byte cases without a loop:
    /// deltas and durations of a call-dense trace are nearly all there).
    #[inline(always)]
    fn uvarint(&mut self, mut v: u64) {
        if v < 0x80 {
            self.byte(v as u8);
        } else if v < 0x4000 {
            self.byte(v as u8 | 0x80);
            self.byte((v >> 7) as u8);
        } else {
            while v >= 0x80 {
                self.byte(v as u8 | 0x80);
                v >>= 7;
            }
            self.byte(v as u8);
        }
    }
}

/// Encodes records of one thread into a writer.
///
/// Records are encoded into an internal buffer that goes to the writer in
/// chunks of 64 KiB (and at [`Encoder::finish`]): the writer needs no
/// buffering of its own. A write error is kept ([`Encoder::take_error`]) and
/// the records after it are discarded.
#[derive(Debug)]
pub struct Encoder<W: Write> {
    out: W,
    cursor: u64,
    open: Vec<u32>,
    /// Encoded bytes not yet written: `buf[..len]`; always at least
    /// [`MAX_RECORD`] bytes of room after them.
    buf: Box<[u8]>,
    len: usize,
    counts: KindCounts,
    /// Bytes handed to `out` (header included).
    written: u64,
    error: Option<std::io::Error>,
}

impl<W: Write> Encoder<W> {
    /// Writes the header; `base` is the timestamp deltas start from.
    pub fn new(mut out: W, tid: u32, base: u64) -> std::io::Result<Encoder<W>> {
        out.write_all(&header(tid, base, 0))?;
        Ok(Self::after_header(out, base))
    }

    /// The encoder of a stream whose header is written already.
    pub(crate) fn after_header(out: W, base: u64) -> Encoder<W> {
        Encoder {
            out,
            cursor: base,
            open: Vec::new(),
            buf: vec![0u8; OUT_CHUNK + MAX_RECORD].into_boxed_slice(),
            len: 0,
            counts: KindCounts::default(),
            written: HEADER_LEN as u64,
            error: None,
        }
    }

    /// Records written per type.
    pub fn counts(&self) -> &KindCounts {
        &self.counts
    }

    /// Bytes encoded so far (header included; those still buffered too).
    pub fn bytes(&self) -> u64 {
        self.written + self.len as u64
    }

    /// The first write error, if any (later records are then discarded).
    #[inline]
    pub fn take_error(&mut self) -> Option<std::io::Error> {
        self.error.take()
    }

    /// Room for one record at the end of the buffer.
    #[inline(always)]
    fn rec(&mut self) -> Rec<'_> {
        let s = (&mut self.buf[self.len..self.len + MAX_RECORD])
            .try_into()
            .expect("MAX_RECORD bytes of room");
        Rec { s, n: 0 }
    }

    /// Keeps the `n` bytes just encoded; writes the buffer out when a
    /// chunk is full.
    #[inline(always)]
    fn commit(&mut self, n: usize) {
        self.len += n;
        if self.len >= OUT_CHUNK {
            self.flush_buf();
        }
    }

    #[cold]
    fn flush_buf(&mut self) {
        if self.error.is_none() {
            match self.out.write_all(&self.buf[..self.len]) {
                Ok(()) => self.written += self.len as u64,
                Err(e) => self.error = Some(e),
            }
        }
        self.len = 0;
    }

    /// `H` and the probe id (code 15 and a varint from 14 on).
    #[inline(always)]
    fn head(r: &mut Rec<'_>, ty: u8, probe: u32, payload: bool) {
        let p = if payload { PAYLOAD } else { 0 };
        if probe < P_IMPLIED as u32 {
            r.byte(ty | p | ((probe as u8) << 4));
        } else {
            r.byte(ty | p | (P_VARINT << 4));
            r.uvarint(probe.into());
        }
    }

    #[inline(always)]
    fn delta(cursor: &mut u64, r: &mut Rec<'_>, ts: u64) {
        // The filter clamps timestamps; clamp again so a caller feeding the
        // encoder directly cannot produce an undecodable stream.
        let ts = ts.max(*cursor);
        r.uvarint(ts - *cursor);
        *cursor = ts;
    }

    #[inline(always)]
    fn payload(r: &mut Rec<'_>, args: &Args, ret: Option<u64>, unwound: bool) {
        let flags = if args.is_empty() { 0 } else { F_ARGS }
            | if ret.is_some() { F_RET } else { 0 }
            | if unwound { F_UNWOUND } else { 0 };
        if flags == 0 {
            return;
        }
        Self::payload_bytes(r, flags, args, ret);
    }

    fn payload_bytes(r: &mut Rec<'_>, flags: u8, args: &Args, ret: Option<u64>) {
        r.byte(flags);
        if !args.is_empty() {
            r.uvarint(args.len() as u64);
            for &a in args.as_slice() {
                r.uvarint(zigzag(a as i64));
            }
        }
        if let Some(v) = ret {
            r.uvarint(zigzag(v as i64));
        }
    }

    /// Encodes one record (timestamps in ticks, non-decreasing).
    #[inline]
    pub fn write(&mut self, r: &Record) {
        let mut cursor = self.cursor;
        let n = {
            let (open, counts) = (&mut self.open, &mut self.counts);
            let len = self.len;
            let s: &mut [u8; MAX_RECORD] = (&mut self.buf[len..len + MAX_RECORD])
                .try_into()
                .expect("MAX_RECORD bytes of room");
            let mut b = Rec { s, n: 0 };
            match *r {
                Record::Call {
                    ts,
                    dur,
                    probe,
                    args,
                    ret,
                } => {
                    let p = !args.is_empty() || ret.is_some();
                    Self::head(&mut b, T_CALL, probe, p);
                    Self::delta(&mut cursor, &mut b, ts);
                    b.uvarint(dur);
                    cursor = cursor.saturating_add(dur);
                    Self::payload(&mut b, &args, ret, false);
                    counts.calls += 1;
                }
                Record::Entry { ts, probe, args } => {
                    Self::head(&mut b, T_ENTRY, probe, !args.is_empty());
                    Self::delta(&mut cursor, &mut b, ts);
                    Self::payload(&mut b, &args, None, false);
                    open.push(probe);
                    counts.entries += 1;
                }
                Record::Hit { ts, probe, args } => {
                    Self::head(&mut b, T_HIT, probe, !args.is_empty());
                    Self::delta(&mut cursor, &mut b, ts);
                    Self::payload(&mut b, &args, None, false);
                    counts.hits += 1;
                }
                Record::Exit {
                    ts,
                    probe,
                    ret,
                    unwound,
                } => {
                    let p = ret.is_some() || unwound;
                    if open.last() == Some(&probe) {
                        b.byte(T_EXIT | if p { PAYLOAD } else { 0 } | (P_IMPLIED << 4));
                        open.pop();
                    } else {
                        Self::head(&mut b, T_EXIT, probe, p);
                        apply_exit(open, probe);
                    }
                    Self::delta(&mut cursor, &mut b, ts);
                    Self::payload(&mut b, &Args::EMPTY, ret, unwound);
                    counts.exits += 1;
                }
                Record::Lost { count, .. } => {
                    b.byte(T_LOST);
                    b.uvarint(count);
                    counts.lost += 1;
                }
            }
            b.n
        };
        self.cursor = cursor;
        self.commit(n);
    }

    /// Writes the end record and flushes; returns the writer and the
    /// stream's size in bytes.
    pub fn finish(mut self) -> std::io::Result<(W, u64)> {
        let records = self.counts.records();
        let mut b = self.rec();
        b.byte(T_END);
        b.uvarint(records);
        let n = b.n;
        self.len += n;
        self.flush_buf();
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.out.flush()?;
        Ok((self.out, self.written))
    }
}

impl<W: Write> crate::filter::Sink for Encoder<W> {
    #[inline]
    fn record(&mut self, r: &Record) {
        self.write(r);
    }
}

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
                d.src.inner = Source::Lz4(Box::new(Lz4Reader {
                    inner: chain,
                    comp: Vec::new(),
                    raw: Vec::new(),
                    pos: 0,
                }));
            }
            d.src.base = HEADER_LEN as u64;
            d.src.pos = 0;
            d.src.len = 0;
        }
        d.tid = u32::from_le_bytes(h[8..12].try_into().unwrap_or_default());
        d.base = u64::from_le_bytes(h[12..20].try_into().unwrap_or_default());
        d.cursor = d.base;
        Ok(d)
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
        Ok(Some(rec))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leaf_call_is_three_bytes() {
        let mut e = Encoder::new(Vec::new(), 7, 1000).unwrap();
        e.write(&Record::Call {
            ts: 1010,
            dur: 20,
            probe: 0,
            args: Args::EMPTY,
            ret: None,
        });
        let (v, n) = e.finish().unwrap();
        assert_eq!(n as usize, v.len());
        assert_eq!(&v[HEADER_LEN..], &[0x00, 10, 20, 0x05, 1]);
        let mut d = Decoder::new(&v[..], "x").unwrap();
        assert_eq!(d.tid(), 7);
        assert!(matches!(
            d.next_record().unwrap(),
            Some(Record::Call {
                ts: 1010,
                dur: 20,
                ..
            })
        ));
        assert_eq!(d.next_record().unwrap(), None);
    }
}
