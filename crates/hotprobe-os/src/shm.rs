//! Memory files and shared mappings: an RAII [`Memfd`] and an RAII
//! [`Mapping`].

use crate::OsError;
use rustix::fs::{MemfdFlags, SealFlags};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::path::PathBuf;

/// The number of the `memfd_create` system call, for a target to make it
/// by a remote system call (a memfd of its own: see
/// [`crate::pidfd::take_fd`]).
pub const MEMFD_CREATE_NR: u64 = libc::SYS_memfd_create as u64;

/// An anonymous memory file (`memfd_create`), closed on drop. Always
/// close-on-exec: a child of ours does not inherit it; another process
/// opens it through [`Memfd::proc_path`].
#[derive(Debug)]
pub struct Memfd {
    fd: OwnedFd,
}

impl Memfd {
    /// A memfd named `name` (the name shows in `/proc/PID/maps`), empty.
    pub fn new(name: &str) -> Result<Memfd, OsError> {
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC)
            .map_err(|e| OsError::new("memfd_create", e))?;
        Ok(Memfd { fd })
    }

    /// A memory file another process created, taken into ours
    /// ([`crate::pidfd::take_fd`]): the same file, shared with it.
    pub fn from_fd(fd: OwnedFd) -> Memfd {
        Memfd { fd }
    }

    /// A memfd that can be mapped executable and sealed: `MFD_EXEC`
    /// (Linux 6.3) keeps it executable where `vm.memfd_noexec` makes
    /// memfds non-executable by default; older kernels refuse the flag, and
    /// it is created without it.
    pub fn executable(name: &str) -> Result<Memfd, OsError> {
        let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        let fd = rustix::fs::memfd_create(name, flags | MemfdFlags::EXEC)
            .or_else(|_| rustix::fs::memfd_create(name, flags))
            .map_err(|e| OsError::new("memfd_create", e))?;
        Ok(Memfd { fd })
    }

    /// An [`Memfd::executable`] memfd holding `bytes`, sealed against any
    /// change ([`Memfd::seal`]): a library a target maps by its
    /// [`Memfd::proc_path`].
    pub fn sealed_executable(name: &str, bytes: &[u8]) -> Result<Memfd, OsError> {
        let m = Memfd::executable(name)?;
        m.write_all(bytes)?;
        m.seal()?;
        Ok(m)
    }

    /// Sets the size (`ftruncate`); new bytes read as zero.
    pub fn set_len(&self, len: u64) -> Result<(), OsError> {
        rustix::fs::ftruncate(&self.fd, len).map_err(|e| OsError::new("ftruncate", e))
    }

    /// Appends `bytes` at the file offset (0 for a fresh memfd).
    pub fn write_all(&self, bytes: &[u8]) -> Result<(), OsError> {
        let mut rest = bytes;
        while !rest.is_empty() {
            match rustix::io::write(&self.fd, rest) {
                Ok(0) => return Err(OsError::new("write", std::io::ErrorKind::WriteZero)),
                Ok(n) => rest = &rest[n..],
                Err(rustix::io::Errno::INTR) => {}
                Err(e) => return Err(OsError::new("write", e)),
            }
        }
        Ok(())
    }

    /// Seals the contents and size for good (`F_SEAL_SEAL | F_SEAL_SHRINK
    /// | F_SEAL_GROW | F_SEAL_WRITE`); needs [`Memfd::executable`]'s
    /// `MFD_ALLOW_SEALING`.
    pub fn seal(&self) -> Result<(), OsError> {
        let seals = SealFlags::SEAL | SealFlags::SHRINK | SealFlags::GROW | SealFlags::WRITE;
        rustix::fs::fcntl_add_seals(&self.fd, seals).map_err(|e| OsError::new("F_ADD_SEALS", e))
    }

    /// `/proc/OUR_PID/fd/N`: the path another process opens it by.
    pub fn proc_path(&self) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{}/fd/{}",
            std::process::id(),
            self.fd.as_raw_fd()
        ))
    }
}

impl AsFd for Memfd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl AsRawFd for Memfd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl From<Memfd> for OwnedFd {
    fn from(m: Memfd) -> OwnedFd {
        m.fd
    }
}

/// A shared, readable and writable mapping of a file (`mmap(MAP_SHARED)`),
/// unmapped on drop. It hands out its address only: whoever reads or
/// writes through it says why that is sound.
#[derive(Debug)]
pub struct Mapping {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a mapping is process-wide memory, valid on every thread; the type
// itself never reads or writes through the pointer.
unsafe impl Send for Mapping {}
// SAFETY: as above: `&Mapping` gives out the address only.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `fd` shared, readable and writable
    /// (`len` > 0; the file must be at least that long to touch them).
    pub fn shared(fd: impl AsFd, len: usize) -> Result<Mapping, OsError> {
        use rustix::mm::{MapFlags, ProtFlags};
        // SAFETY: a fresh mapping chosen by the kernel: it overlaps nothing
        // of ours; the descriptor is valid for the call.
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }
        .map_err(|e| OsError::new("mmap", e))?;
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }

    /// The first byte (page-aligned).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it is zero bytes long (never: `mmap` refuses those).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping, exactly as mapped; nothing of ours
        // points into it once its owner drops it.
        let _ = unsafe { rustix::mm::munmap(self.ptr.cast(), self.len) };
    }
}
