//! The x86 boot header of a bzImage (Documentation/x86/boot.rst) and the
//! compressed vmlinux it carries.

use crate::decompress::{self, Compression};
use crate::Error;

/// Offset of the `HdrS` magic.
const HEADER_MAGIC_AT: usize = 0x202;
/// Offset of `setup_sects`.
const SETUP_SECTS_AT: usize = 0x1f1;
/// Offset of the boot protocol version.
const VERSION_AT: usize = 0x206;
/// Offset of `payload_offset` (2.08+); `payload_length` follows.
const PAYLOAD_OFFSET_AT: usize = 0x248;
/// Offset of `init_size` (2.10+).
const INIT_SIZE_AT: usize = 0x260;

/// Whether `image` starts with an x86 boot header (`HdrS` at 0x202).
pub fn is_bzimage(image: &[u8]) -> bool {
    image.get(HEADER_MAGIC_AT..HEADER_MAGIC_AT + 4) == Some(b"HdrS")
}

/// A parsed bzImage: its boot header and compressed payload.
#[derive(Clone, Debug)]
pub struct BzImage<'a> {
    /// Boot protocol version (major, minor), e.g. (2, 15).
    pub protocol: (u8, u8),
    /// 512-byte setup sectors after the boot sector (0 read as 4).
    pub setup_sects: u8,
    /// Where the payload starts in the image.
    pub payload_start: usize,
    /// The compressed vmlinux (including the 4-byte size the kernel build
    /// appends).
    pub payload: &'a [u8],
    /// Its compression, from its magic bytes.
    pub compression: Compression,
    /// Memory the kernel needs to decompress itself (`init_size`, 2.10+).
    pub init_size: Option<u32>,
}

fn u16_at(b: &[u8], at: usize, what: &'static str) -> Result<u16, Error> {
    b.get(at..at + 2)
        .and_then(|s| s.try_into().ok())
        .map(u16::from_le_bytes)
        .ok_or(Error::Truncated {
            what,
            needed: (at + 2) as u64,
            len: b.len() as u64,
        })
}

fn u32_at(b: &[u8], at: usize, what: &'static str) -> Result<u32, Error> {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map(u32::from_le_bytes)
        .ok_or(Error::Truncated {
            what,
            needed: (at + 4) as u64,
            len: b.len() as u64,
        })
}

impl<'a> BzImage<'a> {
    /// Parses the boot header and locates the payload.
    pub fn parse(image: &'a [u8]) -> Result<Self, Error> {
        if !is_bzimage(image) {
            return Err(Error::NotKernelImage);
        }
        let version = u16_at(image, VERSION_AT, "the boot protocol version")?;
        let [minor, major] = version.to_le_bytes();
        if version < 0x0208 {
            return Err(Error::OldBootProtocol { major, minor });
        }
        let setup_sects = *image.get(SETUP_SECTS_AT).ok_or(Error::Truncated {
            what: "setup_sects",
            needed: SETUP_SECTS_AT as u64 + 1,
            len: image.len() as u64,
        })?;
        let sects = if setup_sects == 0 { 4 } else { setup_sects };
        let payload_offset = u32_at(image, PAYLOAD_OFFSET_AT, "payload_offset")?;
        let payload_length = u32_at(image, PAYLOAD_OFFSET_AT + 4, "payload_length")?;
        let init_size = if version >= 0x020a {
            Some(u32_at(image, INIT_SIZE_AT, "init_size")?)
        } else {
            None
        };
        // The protected-mode code follows the boot sector and the setup.
        let pm_start = (usize::from(sects) + 1) * 512;
        let start = pm_start
            .checked_add(payload_offset as usize)
            .ok_or(Error::Truncated {
                what: "the payload",
                needed: u64::MAX,
                len: image.len() as u64,
            })?;
        let end = start
            .checked_add(payload_length as usize)
            .ok_or(Error::Truncated {
                what: "the payload",
                needed: u64::MAX,
                len: image.len() as u64,
            })?;
        let payload = image.get(start..end).ok_or(Error::Truncated {
            what: "the payload (setup_sects, payload_offset, payload_length)",
            needed: end as u64,
            len: image.len() as u64,
        })?;
        let compression = Compression::detect(payload)?;
        Ok(BzImage {
            protocol: (major, minor),
            setup_sects,
            payload_start: start,
            payload,
            compression,
            init_size,
        })
    }

    /// The size of the decompressed vmlinux that the kernel build appended
    /// to the payload (its last 4 bytes), if the payload has them.
    pub fn size_hint(&self) -> Option<u32> {
        let n = self.payload.len();
        let tail = self.payload.get(n.checked_sub(4)?..)?;
        Some(u32::from_le_bytes(tail.try_into().ok()?))
    }

    /// Decompresses the payload: the kernel's vmlinux (an ELF file).
    pub fn decompress(&self) -> Result<Vec<u8>, Error> {
        decompress::decompress(self.payload, self.size_hint())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(version: u16, sects: u8, off: u32, len: u32) -> Vec<u8> {
        let mut v = vec![0u8; 0x1000];
        v[SETUP_SECTS_AT] = sects;
        v[HEADER_MAGIC_AT..HEADER_MAGIC_AT + 4].copy_from_slice(b"HdrS");
        v[VERSION_AT..VERSION_AT + 2].copy_from_slice(&version.to_le_bytes());
        v[PAYLOAD_OFFSET_AT..PAYLOAD_OFFSET_AT + 4].copy_from_slice(&off.to_le_bytes());
        v[PAYLOAD_OFFSET_AT + 4..PAYLOAD_OFFSET_AT + 8].copy_from_slice(&len.to_le_bytes());
        v
    }

    #[test]
    fn locates_the_payload() {
        let mut v = header(0x020f, 1, 0x10, 8);
        let at = 2 * 512 + 0x10;
        v[at..at + 4].copy_from_slice(&[0x1f, 0x8b, 8, 0]);
        let bz = BzImage::parse(&v).unwrap();
        assert_eq!(bz.protocol, (2, 15));
        assert_eq!(bz.payload_start, at);
        assert_eq!(bz.payload.len(), 8);
        assert_eq!(bz.compression, Compression::Gzip);
    }

    #[test]
    fn refuses_bad_headers() {
        assert!(matches!(
            BzImage::parse(&[0; 0x300]),
            Err(Error::NotKernelImage)
        ));
        assert!(matches!(
            BzImage::parse(&header(0x0206, 1, 0, 8)),
            Err(Error::OldBootProtocol { major: 2, minor: 6 })
        ));
        assert!(matches!(
            BzImage::parse(&header(0x020f, 1, 0xffff_fff0, 0xffff_fff0)),
            Err(Error::Truncated { .. })
        ));
        // Header cut right after the magic.
        let v = header(0x020f, 1, 0, 8);
        assert!(matches!(
            BzImage::parse(&v[..0x207]),
            Err(Error::Truncated { .. })
        ));
        let e = BzImage::parse(&header(0x020f, 1, 0x10, 8)).unwrap_err();
        assert!(
            matches!(e, Error::UnknownCompression { .. }),
            "{e}: zeroes are no known magic"
        );
    }
}
