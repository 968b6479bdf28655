//! LZ4 blocks ([`FLAG_LZ4`](crate::format::FLAG_LZ4)): the compressed thread streams' framing,
//! `raw-length compressed-length` (varints) then one LZ4 block, each
//! block self-delimiting (docs/TRACE_FORMAT.md, "Compression").

use std::io::{Read, Write};

use crate::format::LZ4_MAX_BLOCK;

/// A writer of LZ4 blocks ([`FLAG_LZ4`](crate::format::FLAG_LZ4)): each `write` of up to
/// [`LZ4_MAX_BLOCK`] bytes becomes one block (the [`Encoder`](crate::format::Encoder) writes 64 KiB
/// chunks). Not the LZ4 frame format: its decoders take a file cut at a
/// block boundary or inside the end mark for a complete one, and a reader
/// of these streams must tell a cut at every byte (the block lengths make
/// any cut inside a block visible, and the stream's own end record does
/// the rest).
#[derive(Debug)]
pub struct Lz4Blocks<W: Write> {
    out: W,
    block: Vec<u8>,
    /// Bytes of the blocks written whole.
    written: u64,
}

impl<W: Write> Lz4Blocks<W> {
    /// Blocks into `out`.
    pub fn new(out: W) -> Lz4Blocks<W> {
        Lz4Blocks {
            out,
            block: Vec::new(),
            written: 0,
        }
    }

    /// Bytes of the blocks written whole so far (a failed write may leave
    /// part of one more block after them).
    pub fn written(&self) -> u64 {
        self.written
    }

    /// The underlying writer, borrowed.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
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
        self.written += (head + n) as u64;
        Ok(raw.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// The reading side of [`Lz4Blocks`]: a cut inside a block is an
/// `UnexpectedEof` error, a bad block `InvalidData`; the end of the input
/// at a block boundary is the end.
pub(crate) struct Lz4Reader<R: Read> {
    inner: R,
    comp: Vec<u8>,
    raw: Vec<u8>,
    pos: usize,
    /// Input bytes read.
    read: u64,
    /// Input bytes of the blocks decoded whole (`read` at the end of the
    /// last whole block), plus the offset given to [`Lz4Reader::new`].
    whole: u64,
}

impl<R: Read> Lz4Reader<R> {
    /// Blocks from `inner`, which starts at byte `at` of the file.
    pub(crate) fn new(inner: R, at: u64) -> Lz4Reader<R> {
        Lz4Reader {
            inner,
            comp: Vec::new(),
            raw: Vec::new(),
            pos: 0,
            read: at,
            whole: at,
        }
    }

    /// File offset of the end of the last block decoded whole.
    pub(crate) fn whole(&self) -> u64 {
        self.whole
    }

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
            self.read += 1;
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
            self.read += comp as u64;
            self.raw.resize(raw, 0);
            let n = lz4_flex::block::decompress_into(&self.comp, &mut self.raw)
                .map_err(|e| bad(format!("LZ4 block: {e}")))?;
            if n != raw {
                return Err(bad(format!(
                    "LZ4 block of {raw} bytes decompressed into {n}"
                )));
            }
            self.whole = self.read;
            self.pos = 0;
        }
        let n = buf.len().min(self.raw.len() - self.pos);
        buf[..n].copy_from_slice(&self.raw[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}
