//! Decompression of a bzImage payload, by its magic bytes (the formats of
//! the kernel's `CONFIG_KERNEL_*` choices).
//!
//! The output is bounded ([`MAX_VMLINUX`]) before it is produced: xz and
//! lz4 chunk headers give the size up front, the other decoders write into
//! a sink that refuses to grow past the limit.

use std::io::{self, Write};

use crate::Error;

/// The largest decompressed vmlinux accepted (Debian's is 66 MB).
pub const MAX_VMLINUX: usize = 512 << 20;

/// Largest dictionary accepted for lzma (the kernel uses 1–64 MiB).
const MAX_DICT: usize = 256 << 20;

/// A payload's compression.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// gzip (`1f 8b`).
    Gzip,
    /// xz (`fd 37 7a 58 5a 00`), LZMA2 optionally behind the x86 BCJ filter.
    Xz,
    /// lzma "alone" (`5d 00 00`).
    Lzma,
    /// zstd (`28 b5 2f fd`).
    Zstd,
    /// lz4 legacy frames (`02 21 4c 18`).
    Lz4,
    /// bzip2 (`BZh`): recognised, not supported.
    Bzip2,
    /// lzo (`89 4c 5a 4f`): recognised, not supported.
    Lzo,
    /// No compression (`CONFIG_KERNEL_UNCOMPRESSED`): an ELF file.
    None,
}

impl Compression {
    /// The compression of `payload`, from its first bytes.
    pub fn detect(payload: &[u8]) -> Result<Self, Error> {
        let c = if payload.starts_with(&[0x1f, 0x8b]) || payload.starts_with(&[0x1f, 0x9e]) {
            Compression::Gzip
        } else if payload.starts_with(b"\xfd7zXZ\0") {
            Compression::Xz
        } else if payload.starts_with(&[0x5d, 0, 0]) {
            Compression::Lzma
        } else if payload.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
            Compression::Zstd
        } else if payload.starts_with(&[0x02, 0x21, 0x4c, 0x18]) {
            Compression::Lz4
        } else if payload.starts_with(b"BZh") {
            Compression::Bzip2
        } else if payload.starts_with(b"\x89LZO") {
            Compression::Lzo
        } else if payload.starts_with(b"\x7fELF") {
            Compression::None
        } else {
            return Err(Error::UnknownCompression {
                magic: payload.iter().take(8).copied().collect(),
            });
        };
        Ok(c)
    }

    /// Its name.
    pub fn name(self) -> &'static str {
        match self {
            Compression::Gzip => "gzip",
            Compression::Xz => "xz",
            Compression::Lzma => "lzma",
            Compression::Zstd => "zstd",
            Compression::Lz4 => "lz4",
            Compression::Bzip2 => "bzip2",
            Compression::Lzo => "lzo",
            Compression::None => "uncompressed",
        }
    }
}

/// Decompresses a payload (format from its magic). `size_hint` (the size
/// the kernel build appends) only sizes the first allocation.
pub fn decompress(payload: &[u8], size_hint: Option<u32>) -> Result<Vec<u8>, Error> {
    let format = Compression::detect(payload)?;
    let capacity = size_hint
        .map(|n| n as usize)
        .filter(|&n| n <= MAX_VMLINUX)
        .unwrap_or(0);
    let name = format.name();
    let bad = |reason: String| Error::Decompress {
        format: name,
        reason,
    };
    match format {
        Compression::Gzip => {
            let mut sink = Sink::new(capacity, MAX_VMLINUX);
            let r = io::copy(&mut flate2::bufread::GzDecoder::new(payload), &mut sink);
            sink.finish(r.map(drop), name)
        }
        Compression::Xz => xz::decompress(payload, MAX_VMLINUX).map_err(|e| match e {
            xz::XzError::TooLarge => Error::TooLarge {
                format: name,
                limit: MAX_VMLINUX,
            },
            xz::XzError::Bad(reason) => bad(reason),
        }),
        Compression::Lzma => {
            // The kernel build appends the size after the end marker, which
            // lzma-rs refuses as trailing data: try without it first.
            let trimmed = payload.get(..payload.len().saturating_sub(4));
            let mut first_error = None;
            for input in trimmed.into_iter().chain([payload]) {
                let mut sink = Sink::new(capacity, MAX_VMLINUX);
                let opts = lzma_rs::decompress::Options {
                    unpacked_size: lzma_rs::decompress::UnpackedSize::ReadFromHeader,
                    memlimit: Some(MAX_DICT),
                    allow_incomplete: false,
                };
                let r = lzma_rs::lzma_decompress_with_options(&mut &input[..], &mut sink, &opts);
                if sink.overflow {
                    return Err(Error::TooLarge {
                        format: name,
                        limit: MAX_VMLINUX,
                    });
                }
                match r {
                    Ok(()) => return Ok(sink.buf),
                    Err(e) => {
                        first_error.get_or_insert(e.to_string());
                    }
                }
            }
            Err(bad(first_error.unwrap_or_default()))
        }
        Compression::Zstd => {
            let mut input = payload;
            let mut dec = ruzstd::StreamingDecoder::new(&mut input)
                .map_err(|e| bad(format!("frame header: {e}")))?;
            let mut sink = Sink::new(capacity, MAX_VMLINUX);
            let r = io::copy(&mut dec, &mut sink);
            sink.finish(r.map(drop), name)
        }
        Compression::Lz4 => lz4_legacy(payload, MAX_VMLINUX).map_err(|e| match e {
            None => Error::TooLarge {
                format: name,
                limit: MAX_VMLINUX,
            },
            Some(reason) => bad(reason),
        }),
        Compression::Bzip2 | Compression::Lzo => {
            Err(Error::UnsupportedCompression { format: name })
        }
        Compression::None => Ok(payload.to_vec()),
    }
}

/// A `Write` into a vector that fails once `limit` would be passed.
struct Sink {
    buf: Vec<u8>,
    limit: usize,
    overflow: bool,
}

impl Sink {
    fn new(capacity: usize, limit: usize) -> Self {
        Sink {
            buf: Vec::with_capacity(capacity.min(limit)),
            limit,
            overflow: false,
        }
    }

    fn finish(self, r: io::Result<()>, format: &'static str) -> Result<Vec<u8>, Error> {
        if self.overflow {
            return Err(Error::TooLarge {
                format,
                limit: self.limit,
            });
        }
        r.map_err(|e| Error::Decompress {
            format,
            reason: e.to_string(),
        })?;
        Ok(self.buf)
    }
}

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        if self.buf.len().saturating_add(b.len()) > self.limit {
            self.overflow = true;
            return Err(io::Error::other("output limit"));
        }
        self.buf.extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The lz4 legacy format (`lz4 -l`, what the kernel uses): the magic, then
/// blocks each preceded by their compressed size (u32 LE), each
/// decompressing to at most 8 MiB; a repeated magic starts a new frame; the
/// kernel build's 4-byte size trailer ends it. `Err(None)`: over `limit`.
fn lz4_legacy(payload: &[u8], limit: usize) -> Result<Vec<u8>, Option<String>> {
    const MAGIC: u32 = 0x184c_2102;
    const CHUNK: usize = 8 << 20;
    let mut rest = payload.get(4..).unwrap_or(&[]);
    let mut out = Vec::new();
    let mut chunk = vec![0u8; CHUNK];
    while rest.len() > 4 {
        let (head, tail) = rest.split_at(4);
        let size = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        if size == MAGIC {
            rest = tail;
            continue;
        }
        let size = size as usize;
        let Some(block) = tail.get(..size) else {
            return Err(Some(format!(
                "block of {size} bytes at offset {:#x} runs past the payload",
                payload.len() - rest.len()
            )));
        };
        let n = lz4_flex::block::decompress_into(block, &mut chunk)
            .map_err(|e| Some(format!("block at {:#x}: {e}", payload.len() - rest.len())))?;
        if out.len() + n > limit {
            return Err(None);
        }
        out.extend_from_slice(chunk.get(..n).unwrap_or(&[]));
        rest = tail.get(size..).unwrap_or(&[]);
    }
    if out.is_empty() {
        return Err(Some("no block".into()));
    }
    Ok(out)
}

/// The xz container (a single stream of one or more blocks, LZMA2 behind
/// an optional x86 BCJ filter, as `xz --check=crc32 --x86 --lzma2` writes
/// for the kernel), decoded with lzma-rs's raw LZMA2 decoder and our BCJ
/// decoder (lzma-rs's xz reader knows no BCJ).
mod xz {
    pub enum XzError {
        TooLarge,
        Bad(String),
    }

    fn bad(s: impl Into<String>) -> XzError {
        XzError::Bad(s.into())
    }

    const FILTER_LZMA2: u64 = 0x21;
    const FILTER_X86: u64 = 0x04;

    /// An xz variable-length integer.
    fn varint(b: &[u8], pos: &mut usize) -> Result<u64, XzError> {
        let mut v: u64 = 0;
        for i in 0..9 {
            let byte = *b.get(*pos).ok_or_else(|| bad("truncated integer"))?;
            *pos += 1;
            v |= u64::from(byte & 0x7f) << (7 * i);
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(bad("integer longer than 9 bytes"))
    }

    /// The uncompressed and compressed sizes of raw LZMA2 data, from its
    /// chunk headers (which are not range-coded), without decoding it.
    pub(super) fn lzma2_sizes(data: &[u8]) -> Result<(usize, usize), XzError> {
        let mut pos = 0usize;
        let mut unpacked = 0usize;
        loop {
            let control = *data
                .get(pos)
                .ok_or_else(|| bad("LZMA2 data ends without an end marker"))?;
            let hdr = |n: usize| {
                data.get(pos..pos + n)
                    .ok_or_else(|| bad("truncated LZMA2 chunk header"))
            };
            let (u, p, header) = match control {
                0 => return Ok((unpacked, pos + 1)),
                1 | 2 => {
                    let h = hdr(3)?;
                    (usize::from(u16::from_be_bytes([h[1], h[2]])) + 1, 0, 3)
                }
                0x80..=0xff => {
                    let header = if control >= 0xc0 { 6 } else { 5 };
                    let h = hdr(header)?;
                    let u = (usize::from(control & 0x1f) << 16
                        | usize::from(u16::from_be_bytes([h[1], h[2]])))
                        + 1;
                    let p = usize::from(u16::from_be_bytes([h[3], h[4]])) + 1;
                    (u, p, header)
                }
                _ => return Err(bad(format!("bad LZMA2 control byte {control:#x}"))),
            };
            // An uncompressed chunk carries its bytes as they are.
            let packed = if p == 0 { u } else { p };
            unpacked = unpacked.saturating_add(u);
            pos = pos.saturating_add(header).saturating_add(packed);
        }
    }

    pub fn decompress(payload: &[u8], limit: usize) -> Result<Vec<u8>, XzError> {
        let header = payload
            .get(..12)
            .ok_or_else(|| bad("truncated stream header"))?;
        if header[6] != 0 || header[7] & 0xf0 != 0 {
            return Err(bad("unsupported stream flags"));
        }
        let crc = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
        if crc32fast::hash(&header[6..8]) != crc {
            return Err(bad("stream header CRC mismatch"));
        }
        let check = header[7] & 0x0f;
        let check_size = match check {
            0 => 0,
            1..=3 => 4,
            4..=6 => 8,
            7..=9 => 16,
            10..=12 => 32,
            _ => 64,
        };
        let mut pos = 12usize;
        let mut out = Vec::new();
        loop {
            let size_byte = *payload
                .get(pos)
                .ok_or_else(|| bad("truncated: no block header"))?;
            if size_byte == 0 {
                // The index: every block has been read.
                break;
            }
            let hsize = (usize::from(size_byte) + 1) * 4;
            let bh = payload
                .get(pos..pos + hsize)
                .ok_or_else(|| bad("truncated block header"))?;
            let (body, crc) = bh.split_at(hsize - 4);
            if crc32fast::hash(body) != u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]) {
                return Err(bad("block header CRC mismatch"));
            }
            let flags = body[1];
            if flags & 0x3c != 0 {
                return Err(bad("reserved block flags set"));
            }
            let mut p = 2usize;
            if flags & 0x40 != 0 {
                varint(body, &mut p)?;
            }
            if flags & 0x80 != 0 {
                varint(body, &mut p)?;
            }
            let mut filters = Vec::new();
            for _ in 0..=(flags & 3) {
                let id = varint(body, &mut p)?;
                let n = usize::try_from(varint(body, &mut p)?).unwrap_or(usize::MAX);
                let props = body
                    .get(p..p.saturating_add(n))
                    .ok_or_else(|| bad("filter properties past the block header"))?;
                p += n;
                filters.push((id, props));
            }
            let bcj_start = match filters.as_slice() {
                [(FILTER_LZMA2, _)] => None,
                [(FILTER_X86, props), (FILTER_LZMA2, _)] => Some(match props {
                    [] => 0u32,
                    [a, b, c, d] => u32::from_le_bytes([*a, *b, *c, *d]),
                    _ => return Err(bad("bad x86 BCJ properties")),
                }),
                other => {
                    let ids: Vec<String> = other.iter().map(|(id, _)| format!("{id:#x}")).collect();
                    return Err(bad(format!(
                        "unsupported filter chain [{}] (only LZMA2, optionally after x86 BCJ)",
                        ids.join(", ")
                    )));
                }
            };
            let data_start = pos + hsize;
            let data = payload.get(data_start..).unwrap_or(&[]);
            let (unpacked, packed) = lzma2_sizes(data)?;
            if unpacked > limit.saturating_sub(out.len()) {
                return Err(XzError::TooLarge);
            }
            if packed > data.len() {
                return Err(bad("LZMA2 chunks run past the payload"));
            }
            let mut block = Vec::with_capacity(unpacked);
            let mut input = data.get(..packed).unwrap_or(&[]);
            lzma_rs::lzma2_decompress(&mut input, &mut block)
                .map_err(|e| bad(format!("LZMA2: {e}")))?;
            if block.len() != unpacked {
                return Err(bad(format!(
                    "LZMA2 gave {} bytes, its chunk headers say {unpacked}",
                    block.len()
                )));
            }
            if let Some(start) = bcj_start {
                bcj_x86_decode(&mut block, start);
            }
            // Block padding to 4 bytes, then the check.
            let mut end = data_start + packed;
            end = end.div_ceil(4) * 4;
            let chk = payload
                .get(end..end + check_size)
                .ok_or_else(|| bad("truncated block check"))?;
            if check == 1
                && crc32fast::hash(&block) != u32::from_le_bytes([chk[0], chk[1], chk[2], chk[3]])
            {
                return Err(bad("CRC32 of the decompressed data does not match"));
            }
            pos = end + check_size;
            if out.is_empty() {
                out = block;
            } else {
                out.extend_from_slice(&block);
            }
        }
        if out.is_empty() {
            return Err(bad("no data"));
        }
        Ok(out)
    }

    /// Undoes the x86 BCJ filter (xz-embedded's `bcj_x86`): `E8`/`E9`
    /// relative call/jump targets made absolute by the encoder are made
    /// relative again. `start` is the stream position of `buf[0]`.
    pub fn bcj_x86_decode(buf: &mut [u8], start: u32) {
        const ALLOWED: [bool; 8] = [true, true, true, false, true, false, false, false];
        const BIT_NUM: [u32; 8] = [0, 1, 2, 2, 3, 3, 3, 3];
        fn msbyte(b: u8) -> bool {
            b == 0x00 || b == 0xff
        }
        if buf.len() <= 4 {
            return;
        }
        let size = buf.len() - 4;
        let mut prev_pos: usize = usize::MAX;
        let mut prev_mask: u32 = 0;
        let mut i = 0usize;
        while i < size {
            if buf[i] & 0xfe != 0xe8 {
                i += 1;
                continue;
            }
            let d = i.wrapping_sub(prev_pos);
            if d > 3 {
                prev_mask = 0;
            } else {
                prev_mask = (prev_mask << (d - 1)) & 7;
                if prev_mask != 0 {
                    let b = buf[i + 4 - BIT_NUM[prev_mask as usize] as usize];
                    if !ALLOWED[prev_mask as usize] || msbyte(b) {
                        prev_pos = i;
                        prev_mask = (prev_mask << 1) | 1;
                        i += 1;
                        continue;
                    }
                }
            }
            prev_pos = i;
            if msbyte(buf[i + 4]) {
                let mut src = u32::from_le_bytes([buf[i + 1], buf[i + 2], buf[i + 3], buf[i + 4]]);
                let mut dest;
                loop {
                    dest = src.wrapping_sub(start.wrapping_add(i as u32).wrapping_add(5));
                    if prev_mask == 0 {
                        break;
                    }
                    let j = BIT_NUM[prev_mask as usize] * 8;
                    let b = (dest >> (24 - j)) as u8;
                    if !msbyte(b) {
                        break;
                    }
                    src = dest ^ ((1u32 << (32 - j)) - 1);
                }
                dest &= 0x01ff_ffff;
                dest |= 0u32.wrapping_sub(dest & 0x0100_0000);
                buf[i + 1..i + 5].copy_from_slice(&dest.to_le_bytes());
                i += 5;
            } else {
                prev_mask = (prev_mask << 1) | 1;
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_magics() {
        assert_eq!(
            Compression::detect(b"\x1f\x8b\x08").unwrap(),
            Compression::Gzip
        );
        assert_eq!(
            Compression::detect(b"\xfd7zXZ\0\0\x01").unwrap(),
            Compression::Xz
        );
        assert_eq!(
            Compression::detect(b"\x5d\0\0\x80").unwrap(),
            Compression::Lzma
        );
        assert_eq!(
            Compression::detect(b"\x28\xb5\x2f\xfd").unwrap(),
            Compression::Zstd
        );
        assert_eq!(
            Compression::detect(b"\x02\x21\x4c\x18").unwrap(),
            Compression::Lz4
        );
        assert!(matches!(
            decompress(b"BZh91AY&SY", None),
            Err(Error::UnsupportedCompression { format: "bzip2" })
        ));
        assert!(matches!(
            decompress(b"\x89LZO\0", None),
            Err(Error::UnsupportedCompression { format: "lzo" })
        ));
        assert!(matches!(
            Compression::detect(b"hello"),
            Err(Error::UnknownCompression { .. })
        ));
        assert!(matches!(
            Compression::detect(b""),
            Err(Error::UnknownCompression { .. })
        ));
    }

    #[test]
    fn lzma2_chunk_sizes() {
        // An uncompressed chunk of 3 bytes, then the end marker.
        let d = [1u8, 0, 2, b'a', b'b', b'c', 0];
        assert!(matches!(xz::lzma2_sizes(&d), Ok((3, 7))));
        let mut out = Vec::new();
        lzma_rs::lzma2_decompress(&mut &d[..], &mut out).unwrap();
        assert_eq!(out, b"abc");
        assert!(xz::lzma2_sizes(&d[..6]).is_err());
        assert!(xz::lzma2_sizes(&[3]).is_err());
    }

    #[test]
    fn bcj_x86_is_undone() {
        // `call rel32` at 0x10 to 0x1000 (rel = 0x1000 - 0x15 = 0xfeb);
        // the encoder stores the absolute target 0x1000.
        let mut buf = vec![0x90u8; 0x20];
        buf[0x10] = 0xe8;
        buf[0x11..0x15].copy_from_slice(&0x1000u32.to_le_bytes());
        xz::bcj_x86_decode(&mut buf, 0);
        assert_eq!(&buf[0x11..0x15], &0xfebu32.to_le_bytes());
        // Too short to hold an instruction: untouched.
        let mut short = vec![0xe8, 0, 0, 0];
        xz::bcj_x86_decode(&mut short, 0);
        assert_eq!(short, [0xe8, 0, 0, 0]);
    }
}
