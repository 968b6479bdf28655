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

use std::io::Write;

pub use crate::decoder::Decoder;
use crate::event::{Args, Record};
pub use crate::lz4::Lz4Blocks;
use crate::varint::zigzag;

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

pub(crate) const T_CALL: u8 = 0;
pub(crate) const T_ENTRY: u8 = 1;
pub(crate) const T_EXIT: u8 = 2;
pub(crate) const T_HIT: u8 = 3;
pub(crate) const T_LOST: u8 = 4;
pub(crate) const T_END: u8 = 5;
pub(crate) const PAYLOAD: u8 = 0x08;
pub(crate) const P_IMPLIED: u8 = 14;
pub(crate) const P_VARINT: u8 = 15;
pub(crate) const F_ARGS: u8 = 1;
pub(crate) const F_RET: u8 = 2;
pub(crate) const F_UNWOUND: u8 = 4;

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
    pub(crate) fn count(&mut self, r: &Record) {
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
pub(crate) fn apply_exit(open: &mut Vec<u32>, probe: u32) {
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
/// the records after it are discarded, counted ([`Encoder::finish_lost`]
/// ends such a stream with a lost record counting them).
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
    /// Events the lost records encoded so far count.
    lost_events: u64,
    /// `counts` and `lost_events` when the last chunk was written whole.
    flushed: (KindCounts, u64),
    /// Bytes handed to `out` (header included).
    written: u64,
    error: Option<std::io::Error>,
    /// A write failed or [`Encoder::stop`] was called: records are only
    /// counted from then on.
    stopped: bool,
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
            lost_events: 0,
            flushed: (KindCounts::default(), 0),
            written: HEADER_LEN as u64,
            error: None,
            stopped: false,
        }
    }

    /// Writes the records encoded so far (whole records: one LZ4 block
    /// when `out` makes blocks), so that a recorder killed later leaves
    /// them readable.
    pub fn flush_chunk(&mut self) {
        if self.len > 0 {
            self.flush_buf();
        }
    }

    /// Stops writing: the records still buffered and those encoded from
    /// now on are only counted (a sibling stream could not be written).
    pub fn stop(&mut self) {
        self.stopped = true;
        self.len = 0;
    }

    /// Whether writing stopped (a write failed, or [`Encoder::stop`]).
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Bytes written whole (header included): where the file should be cut
    /// back to after a failed write, for a plain stream.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The writer.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }

    /// Ends a stream whose writing stopped: the records not written are
    /// replaced by one lost record counting their function events (and
    /// the events of the lost records among them), then the end record.
    /// The caller cuts the file back to what was written whole first
    /// ([`Encoder::written`], or the block writer's count). Returns the
    /// writer, the records written per type and the function events not
    /// written (the lost record also counts the events of the lost records
    /// not written, already counted as lost where they were noted).
    pub fn finish_lost(mut self) -> std::io::Result<(W, KindCounts, u64)> {
        let (kept, kept_lost) = self.flushed;
        let dropped = self.counts.events().saturating_sub(kept.events());
        let lost = dropped + self.lost_events.saturating_sub(kept_lost);
        self.counts = kept;
        self.len = 0;
        self.error = None;
        self.stopped = false;
        if lost > 0 {
            self.write(&Record::Lost {
                ts: self.cursor,
                count: lost,
            });
        }
        let counts = self.counts;
        let (out, _) = self.finish()?;
        Ok((out, counts, dropped))
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
        if !self.stopped {
            match self.out.write_all(&self.buf[..self.len]) {
                Ok(()) => {
                    self.written += self.len as u64;
                    self.flushed = (self.counts, self.lost_events);
                }
                Err(e) => {
                    self.error = Some(e);
                    self.stopped = true;
                }
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
                    self.lost_events = self.lost_events.saturating_add(count);
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
        if self.stopped {
            return Err(self
                .error
                .take()
                .unwrap_or_else(|| std::io::Error::other("writing stopped")));
        }
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
