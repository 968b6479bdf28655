//! The perf events and their rings: `perf_event_open` through
//! perf-event-open-sys, the ring's mapping, and ioctls. Every fd is an
//! [`OwnedFd`] (closed on drop) and every mapping unmapped on drop.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use perf_event_open_sys as pe;
use perf_event_open_sys::bindings as sys;

use crate::error::{paranoid_level, KernelError};
use crate::records::SAMPLE_TYPE;

/// Opens a tracepoint event (disabled) for thread `tid` (0: the calling
/// thread) on `cpu` (-1: any), inherited by the threads and processes it
/// creates, timestamps on CLOCK_MONOTONIC; with `switches`, it also
/// reports the thread's context switches (PERF_RECORD_SWITCH).
pub fn open_tracepoint(
    config: u16,
    tid: i32,
    cpu: i32,
    switches: bool,
    what: &'static str,
) -> Result<OwnedFd, KernelError> {
    // SAFETY: perf_event_attr is plain data (integers, bitfields, unions
    // of integers): all-zero is a valid value.
    let mut attr: sys::perf_event_attr = unsafe { std::mem::zeroed() };
    attr.type_ = sys::PERF_TYPE_TRACEPOINT;
    attr.size = std::mem::size_of::<sys::perf_event_attr>() as u32;
    attr.config = u64::from(config);
    attr.__bindgen_anon_1.sample_period = 1;
    attr.sample_type = SAMPLE_TYPE;
    attr.set_disabled(1);
    attr.set_inherit(1);
    attr.set_sample_id_all(1);
    attr.set_use_clockid(1);
    attr.clockid = libc::CLOCK_MONOTONIC;
    attr.set_context_switch(u64::from(switches));
    // SAFETY: attr is initialised above and outlives the call; the kernel
    // only reads it (and writes its size back on E2BIG).
    let fd = unsafe {
        pe::perf_event_open(
            &mut attr,
            tid,
            cpu,
            -1,
            libc::c_ulong::from(sys::PERF_FLAG_FD_CLOEXEC),
        )
    };
    if fd < 0 {
        let source = std::io::Error::last_os_error();
        return Err(match source.raw_os_error() {
            Some(libc::EACCES | libc::EPERM) => KernelError::PerfDenied {
                paranoid: paranoid_level(),
                source,
            },
            _ => KernelError::Open {
                what,
                tid,
                cpu,
                source,
            },
        });
    }
    // SAFETY: fd is a new descriptor this function owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `ioctl(fd, request)` with an integer argument, as an error naming `what`.
fn check(ret: libc::c_int, what: &'static str) -> Result<(), KernelError> {
    if ret < 0 {
        return Err(KernelError::Ioctl {
            what,
            source: std::io::Error::last_os_error(),
        });
    }
    Ok(())
}

/// Enables an event.
pub fn enable(fd: &OwnedFd) -> Result<(), KernelError> {
    // SAFETY: fd is an open perf event.
    check(unsafe { pe::ioctls::ENABLE(fd.as_raw_fd(), 0) }, "enable")
}

/// Disables an event.
pub fn disable(fd: &OwnedFd) -> Result<(), KernelError> {
    // SAFETY: fd is an open perf event.
    check(unsafe { pe::ioctls::DISABLE(fd.as_raw_fd(), 0) }, "disable")
}

/// Sends `fd`'s records to `leader`'s ring (same CPU).
pub fn set_output(fd: &OwnedFd, leader: &OwnedFd) -> Result<(), KernelError> {
    // SAFETY: both are open perf events.
    check(
        unsafe { pe::ioctls::SET_OUTPUT(fd.as_raw_fd(), leader.as_raw_fd()) },
        "set output",
    )
}

/// A CPU's ring: the metadata page and 2^n data pages, mapped read-write
/// (this side moves `data_tail`, so the kernel never overwrites records
/// not read yet: it counts them as lost instead).
pub struct Ring {
    base: *mut u8,
    len: usize,
    data_offset: usize,
    data_size: usize,
    /// Reads that found `data_head` more than a ring ahead (a corrupt
    /// metadata page): what was there is skipped.
    pub overruns: u64,
}

// SAFETY: the mapping is owned by the Ring (unmapped on drop) and only
// read through `&mut self`; the kernel side is synchronised through the
// atomic head and tail.
unsafe impl Send for Ring {}

impl Ring {
    /// Maps the ring of `fd` with `pages` data pages (a power of two).
    pub fn map(fd: &OwnedFd, pages: usize, cpu: i32) -> Result<Ring, KernelError> {
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let len = (pages + 1) * page;
        // SAFETY: a new shared mapping of a perf fd; checked below.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(KernelError::Mmap {
                cpu,
                bytes: len,
                source: std::io::Error::last_os_error(),
            });
        }
        let meta = base as *const sys::perf_event_mmap_page;
        // SAFETY: the first page is the metadata page the kernel filled.
        let (off, size) = unsafe { ((*meta).data_offset as usize, (*meta).data_size as usize) };
        // Kernels before 4.1 leave these 0: the data follows the first page.
        let (data_offset, data_size) =
            if size == 0 || !size.is_power_of_two() || off.checked_add(size) != Some(len) {
                (page, pages * page)
            } else {
                (off, size)
            };
        Ok(Ring {
            base: base as *mut u8,
            len,
            data_offset,
            data_size,
            overruns: 0,
        })
    }

    fn head_tail(&self) -> (&AtomicU64, &AtomicU64) {
        let meta = self.base as *mut sys::perf_event_mmap_page;
        // SAFETY: data_head and data_tail are 8-aligned u64 fields of the
        // mapped metadata page, valid for the Ring's life; the kernel
        // accesses them atomically too.
        unsafe {
            (
                AtomicU64::from_ptr(std::ptr::addr_of_mut!((*meta).data_head)),
                AtomicU64::from_ptr(std::ptr::addr_of_mut!((*meta).data_tail)),
            )
        }
    }

    /// Appends the records written since the last call to `out` (whole
    /// records: the kernel publishes `data_head` after a record) and
    /// frees their room. Returns the bytes read.
    pub fn read_into(&mut self, out: &mut Vec<u8>) -> usize {
        let (head, tail) = self.head_tail();
        let h = head.load(Ordering::Acquire);
        let t = tail.load(Ordering::Relaxed);
        let avail = h.wrapping_sub(t) as usize;
        if avail > self.data_size {
            tail.store(h, Ordering::Release);
            self.overruns += 1;
            return 0;
        }
        let start = (t as usize) & (self.data_size - 1);
        let first = avail.min(self.data_size - start);
        // SAFETY: [data_offset, data_offset + data_size) is inside the
        // mapping; start + first ≤ data_size and avail - first ≤ start.
        unsafe {
            let data = self.base.add(self.data_offset);
            out.extend_from_slice(std::slice::from_raw_parts(data.add(start), first));
            out.extend_from_slice(std::slice::from_raw_parts(data, avail - first));
        }
        tail.store(h, Ordering::Release);
        avail
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // SAFETY: base/len are the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}
