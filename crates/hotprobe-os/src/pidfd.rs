//! Taking a descriptor out of another process (`pidfd_open`,
//! `pidfd_getfd`, Linux 5.6): how the tracer gets hold of a file a target
//! created (a memfd, a pipe), where the target could not open one of the
//! tracer's through `/proc/TRACER/fd/N` (a process that changed its uid or
//! is not dumpable: the kernel checks ptrace access to the tracer).

use std::os::fd::{FromRawFd, OwnedFd};

use crate::OsError;

/// A duplicate, in this process, of descriptor `fd` of process `pid`
/// (close-on-exec). Needs ptrace access to `pid` (a tracer has it).
pub fn take_fd(pid: i32, fd: i32) -> Result<OwnedFd, OsError> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new
    // descriptor or -1; no memory is passed.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if pidfd < 0 {
        return Err(OsError::new("pidfd_open", std::io::Error::last_os_error()));
    }
    // SAFETY: a descriptor just returned to us, owned from here on.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as i32) };
    use std::os::fd::AsRawFd;
    // SAFETY: pidfd_getfd takes a pidfd, a descriptor number of that
    // process and flags (0), and returns a new close-on-exec descriptor.
    let ours = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0) };
    if ours < 0 {
        return Err(OsError::new("pidfd_getfd", std::io::Error::last_os_error()));
    }
    // SAFETY: as above.
    Ok(unsafe { OwnedFd::from_raw_fd(ours as i32) })
}
