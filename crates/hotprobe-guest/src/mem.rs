//! Guest memory without the stub: guest RAM mapped from QEMU's shared
//! `memory-backend-file` (file offset = guest-physical address below the PCI
//! hole) and the x86-64 page-table walk that turns a guest-virtual address
//! into a guest-physical one from CR3 (4- or 5-level, 2 MiB and 1 GiB pages).

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use hotprobe_target::{GuestPhys, GuestVirt};

/// A failure reading guest memory or walking its page tables.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// The RAM file could not be opened or mapped.
    #[error("cannot map guest RAM file {path}: {source}")]
    Map {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A physical address outside the mapped RAM.
    #[error("guest-physical {addr:#x}+{len} lies outside the {size:#x} bytes of RAM mapped")]
    OutOfRange {
        /// The address.
        addr: u64,
        /// The length.
        len: usize,
        /// The RAM size mapped.
        size: u64,
    },
    /// The page-table walk found no mapping.
    #[error("guest-virtual {virt:#x} is not mapped (level-{level} entry {entry:#x} not present)")]
    NotMapped {
        /// The address.
        virt: u64,
        /// The paging level whose entry was not present (4 = PML4).
        level: u8,
        /// The entry.
        entry: u64,
    },
    /// The address is not canonical.
    #[error("guest-virtual {0:#x} is not canonical")]
    NonCanonical(u64),
    /// The physical reader behind the walk failed (e.g. the stub).
    #[error("reading guest-physical {addr:#x}: {why}")]
    Reader {
        /// The address.
        addr: u64,
        /// Why.
        why: String,
    },
}

/// Something that reads guest-physical memory: the mapped RAM file, or the
/// stub in physical mode.
pub trait PhysMemory {
    /// Reads `buf.len()` bytes at `addr`.
    fn read_phys(&mut self, addr: GuestPhys, buf: &mut [u8]) -> Result<(), MemError>;
}

/// Guest RAM mapped read-only from QEMU's shared `memory-backend-file`.
#[derive(Debug)]
pub struct RamFile {
    ptr: *const u8,
    len: usize,
    path: PathBuf,
}

// SAFETY: the mapping is a read-only shared file mapping owned by this value;
// reads through the raw pointer are plain byte copies valid from any thread.
unsafe impl Send for RamFile {}

impl RamFile {
    /// Maps the whole file read-only and shared (so guest writes show).
    pub fn open(path: &Path) -> Result<Self, MemError> {
        let err = |source| MemError::Map {
            path: path.to_path_buf(),
            source,
        };
        let f = File::open(path).map_err(err)?;
        let len = usize::try_from(f.metadata().map_err(err)?.len())
            .map_err(|_| err(std::io::Error::other("too big")))?;
        if len == 0 {
            return Err(err(std::io::Error::other("file is empty")));
        }
        // SAFETY: mapping a file we opened, length from its metadata, no fixed
        // address; the result is checked against MAP_FAILED below.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(err(std::io::Error::last_os_error()));
        }
        Ok(RamFile {
            ptr: ptr as *const u8,
            len,
            path: path.to_path_buf(),
        })
    }

    /// The number of bytes mapped (the guest RAM size).
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Whether the mapping is empty (never: opening refuses empty files).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The file mapped.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Copies guest-physical bytes out of the mapping.
    pub fn read(&self, addr: GuestPhys, buf: &mut [u8]) -> Result<(), MemError> {
        let start = usize::try_from(addr.0).ok();
        let end = start.and_then(|s| s.checked_add(buf.len()));
        match (start, end) {
            (Some(s), Some(e)) if e <= self.len => {
                // SAFETY: [s, e) lies inside the mapping (checked above); the
                // guest may write the bytes concurrently, so they are copied
                // as raw bytes and never referenced as a Rust slice.
                unsafe {
                    std::ptr::copy_nonoverlapping(self.ptr.add(s), buf.as_mut_ptr(), buf.len())
                };
                Ok(())
            }
            _ => Err(MemError::OutOfRange {
                addr: addr.0,
                len: buf.len(),
                size: self.len as u64,
            }),
        }
    }
}

impl Drop for RamFile {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned; nothing borrows them.
        unsafe {
            libc::munmap(self.ptr as *mut libc::c_void, self.len);
        }
    }
}

impl PhysMemory for RamFile {
    fn read_phys(&mut self, addr: GuestPhys, buf: &mut [u8]) -> Result<(), MemError> {
        self.read(addr, buf)
    }
}

/// The result of translating one guest-virtual address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    /// The guest-physical address.
    pub phys: GuestPhys,
    /// The size of the page mapping it (4 KiB, 2 MiB or 1 GiB).
    pub page_size: u64,
    /// Writable at every level.
    pub writable: bool,
    /// User-accessible at every level.
    pub user: bool,
    /// Executable (no NX bit at any level).
    pub executable: bool,
}

const ADDR_MASK: u64 = 0x000f_ffff_ffff_f000;
const PRESENT: u64 = 1;
const RW: u64 = 1 << 1;
const US: u64 = 1 << 2;
const PS: u64 = 1 << 7;
const NX: u64 = 1 << 63;
/// CR4.LA57: five-level paging.
pub const CR4_LA57: u64 = 1 << 12;

/// Walks the page tables rooted at `cr3` (4 levels, 5 with `cr4` LA57) for
/// `virt`, reading the tables through `mem`.
pub fn translate(
    mem: &mut dyn PhysMemory,
    cr3: u64,
    cr4: u64,
    virt: GuestVirt,
) -> Result<Translation, MemError> {
    let levels: u8 = if cr4 & CR4_LA57 != 0 { 5 } else { 4 };
    let va_bits = 12 + 9 * u32::from(levels);
    // canonical: bits above va_bits-1 all equal bit va_bits-1
    let shifted = (virt.0 as i64) << (64 - va_bits) >> (64 - va_bits);
    if shifted as u64 != virt.0 {
        return Err(MemError::NonCanonical(virt.0));
    }
    let mut table = cr3 & ADDR_MASK;
    let (mut writable, mut user, mut executable) = (true, true, true);
    for level in (1..=levels).rev() {
        let shift = 12 + 9 * u32::from(level - 1);
        let index = (virt.0 >> shift) & 0x1ff;
        let mut e = [0u8; 8];
        mem.read_phys(GuestPhys(table + index * 8), &mut e)?;
        let entry = u64::from_le_bytes(e);
        if entry & PRESENT == 0 {
            return Err(MemError::NotMapped {
                virt: virt.0,
                level,
                entry,
            });
        }
        writable &= entry & RW != 0;
        user &= entry & US != 0;
        executable &= entry & NX == 0;
        if level == 1 || (entry & PS != 0 && (level == 2 || level == 3)) {
            let page_size = 1u64 << shift;
            let base = entry & ADDR_MASK & !(page_size - 1);
            return Ok(Translation {
                phys: GuestPhys(base | (virt.0 & (page_size - 1))),
                page_size,
                writable,
                user,
                executable,
            });
        }
        table = entry & ADDR_MASK;
    }
    unreachable_walk(virt)
}

fn unreachable_walk(virt: GuestVirt) -> Result<Translation, MemError> {
    // The loop always returns at level 1; kept as an error, not a panic.
    Err(MemError::NotMapped {
        virt: virt.0,
        level: 0,
        entry: 0,
    })
}

/// Reads guest-virtual memory through `mem`, walking the tables page by page.
pub fn read_virt(
    mem: &mut dyn PhysMemory,
    cr3: u64,
    cr4: u64,
    virt: GuestVirt,
    buf: &mut [u8],
) -> Result<(), MemError> {
    let mut done = 0usize;
    while done < buf.len() {
        let va = GuestVirt(virt.0.wrapping_add(done as u64));
        let t = translate(mem, cr3, cr4, va)?;
        let room = (t.page_size - (va.0 & (t.page_size - 1))) as usize;
        let n = room.min(buf.len() - done);
        let dst = buf.get_mut(done..done + n).ok_or(MemError::OutOfRange {
            addr: t.phys.0,
            len: n,
            size: 0,
        })?;
        mem.read_phys(t.phys, dst)?;
        done += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Guest-physical memory as a vector, for building page tables in tests.
    struct Fake(Vec<u8>);
    impl PhysMemory for Fake {
        fn read_phys(&mut self, addr: GuestPhys, buf: &mut [u8]) -> Result<(), MemError> {
            let s = addr.0 as usize;
            let src = self.0.get(s..s + buf.len()).ok_or(MemError::OutOfRange {
                addr: addr.0,
                len: buf.len(),
                size: self.0.len() as u64,
            })?;
            buf.copy_from_slice(src);
            Ok(())
        }
    }
    impl Fake {
        fn set(&mut self, addr: u64, v: u64) {
            self.0[addr as usize..addr as usize + 8].copy_from_slice(&v.to_le_bytes());
        }
    }

    #[test]
    fn walks_4k_2m_1g_and_reports_holes() {
        let mut m = Fake(vec![0u8; 0x80_0000]);
        let cr3 = 0x1000;
        let va_4k = 0xffff_ffff_8100_0123u64; // kernel text style
        let pml4 = (va_4k >> 39) & 0x1ff;
        let pdpt = (va_4k >> 30) & 0x1ff;
        let pd = (va_4k >> 21) & 0x1ff;
        let pt = (va_4k >> 12) & 0x1ff;
        m.set(cr3 + pml4 * 8, 0x2000 | PRESENT | RW);
        m.set(0x2000 + pdpt * 8, 0x3000 | PRESENT | RW);
        m.set(0x3000 + pd * 8, 0x4000 | PRESENT | RW);
        m.set(0x4000 + pt * 8, 0x5000 | PRESENT);
        m.0[0x5123] = 0xaa;
        let t = translate(&mut m, cr3 | 0x800, 0, GuestVirt(va_4k)).unwrap();
        assert_eq!(t.phys, GuestPhys(0x5123));
        assert_eq!(t.page_size, 4096);
        assert!(!t.writable && t.executable && !t.user);
        // a 2 MiB page with NX
        let va_2m = va_4k + (1 << 21);
        m.set(0x3000 + (pd + 1) * 8, 0x20_0000 | PRESENT | PS | NX);
        let t = translate(&mut m, cr3, 0, GuestVirt(va_2m + 0x1234)).unwrap();
        assert_eq!(t.phys, GuestPhys(0x20_0000 + 0x0123 + 0x1234));
        assert_eq!(t.page_size, 2 << 20);
        assert!(!t.executable);
        // a 1 GiB page (user, writable)
        let va_1g = 0x0000_0040_0000_0000u64 + 0x1_2345;
        m.set(
            cr3 + ((va_1g >> 39) & 0x1ff) * 8,
            0x6000 | PRESENT | RW | US,
        );
        m.set(
            0x6000 + ((va_1g >> 30) & 0x1ff) * 8,
            0x4000_0000 | PRESENT | RW | US | PS,
        );
        let t = translate(&mut m, cr3, 0, GuestVirt(va_1g)).unwrap();
        assert_eq!(t.phys, GuestPhys(0x4001_2345));
        assert!(t.user && t.writable);
        // holes and bad addresses
        assert!(matches!(
            translate(&mut m, cr3, 0, GuestVirt(va_4k + (2 << 21))),
            Err(MemError::NotMapped { level: 2, .. })
        ));
        assert!(matches!(
            translate(&mut m, cr3, 0, GuestVirt(0x8000_0000_0000)),
            Err(MemError::NonCanonical(_))
        ));
        // a read across the 4 KiB page into an unmapped one fails cleanly
        let mut buf = [0u8; 2];
        read_virt(&mut m, cr3, 0, GuestVirt(va_4k), &mut buf[..1]).unwrap();
        assert_eq!(buf[0], 0xaa);
        let mut big = vec![0u8; 0x1000];
        assert!(read_virt(&mut m, cr3, 0, GuestVirt(va_4k), &mut big).is_err());
        // five-level paging changes the canonical width
        let r = translate(&mut m, cr3, CR4_LA57, GuestVirt(0x0020_0000_0000_0000));
        assert!(
            matches!(r, Err(MemError::NotMapped { level: 5, .. })),
            "{r:?}"
        );
    }

    #[test]
    fn ram_file_maps_and_bounds_checks() {
        let dir = std::env::temp_dir().join(format!("hotprobe-guest-ram-{}", std::process::id()));
        std::fs::write(&dir, (0..=255u8).cycle().take(8192).collect::<Vec<_>>()).unwrap();
        let ram = RamFile::open(&dir).unwrap();
        assert_eq!(ram.len(), 8192);
        let mut b = [0u8; 4];
        ram.read(GuestPhys(4094), &mut b).unwrap();
        assert_eq!(b, [254, 255, 0, 1]);
        assert!(ram.read(GuestPhys(8190), &mut b).is_err());
        assert!(ram.read(GuestPhys(u64::MAX), &mut b).is_err());
        drop(ram);
        std::fs::remove_file(&dir).unwrap();
        assert!(RamFile::open(Path::new("/nonexistent/ram")).is_err());
    }
}
