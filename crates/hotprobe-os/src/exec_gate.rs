//! Holding processes at their exec: `fanotify` permission events
//! (`FAN_OPEN_EXEC_PERM`) on a program file, or on every mount, stop each
//! `execve` of it inside the kernel until the gate answers. Between the
//! event and the answer the tracer can `PTRACE_SEIZE` the process: its
//! exec then ends in a ptrace exec stop, before the new program's first
//! instruction. Needs `CAP_SYS_ADMIN` (root).
//!
//! Every event must be answered ([`ExecGate::allow`]); the kernel allows
//! those still pending when the gate is dropped (its descriptor closed).

use crate::OsError;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A fanotify group holding the execs it is marked for.
#[derive(Debug)]
pub struct ExecGate {
    fd: OwnedFd,
}

/// One `execve` held by the gate, until [`ExecGate::allow`].
#[derive(Debug)]
pub struct HeldExec {
    /// The process executing (its thread group id).
    pub pid: i32,
    /// The program file it opened for the exec.
    pub program: PathBuf,
    /// The event's descriptor of that file (the answer names it).
    file: OwnedFd,
}

fn last(call: &'static str) -> OsError {
    OsError::new(call, std::io::Error::last_os_error())
}

impl ExecGate {
    fn new() -> Result<ExecGate, OsError> {
        // SAFETY: plain syscall; returns a new descriptor or -1.
        let fd = unsafe {
            libc::fanotify_init(
                libc::FAN_CLASS_CONTENT | libc::FAN_CLOEXEC | libc::FAN_NONBLOCK,
                (libc::O_RDONLY | libc::O_CLOEXEC | libc::O_LARGEFILE) as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(last("fanotify_init"));
        }
        // SAFETY: `fd` is a descriptor we own from here on.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(ExecGate { fd })
    }

    fn mark(&self, flags: libc::c_uint, path: &Path) -> Result<(), OsError> {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|e| OsError::new("fanotify_mark", std::io::Error::other(e)))?;
        // SAFETY: `c` is a NUL-terminated path alive for the call.
        let r = unsafe {
            libc::fanotify_mark(
                self.fd.as_raw_fd(),
                libc::FAN_MARK_ADD | flags,
                libc::FAN_OPEN_EXEC_PERM,
                libc::AT_FDCWD,
                c.as_ptr(),
            )
        };
        if r < 0 {
            return Err(last("fanotify_mark"));
        }
        Ok(())
    }

    /// Holds every exec of the program file `path`.
    pub fn for_program(path: &Path) -> Result<ExecGate, OsError> {
        let g = ExecGate::new()?;
        g.mark(0, path)?;
        Ok(g)
    }

    /// Holds every exec on every mount listed in `/proc/self/mountinfo`
    /// (mounts that refuse a mark, e.g. pseudo file systems, are skipped).
    pub fn for_all_mounts() -> Result<ExecGate, OsError> {
        let g = ExecGate::new()?;
        let info = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| OsError::new("read /proc/self/mountinfo", e))?;
        let mut marked = 0;
        for line in info.lines() {
            let Some(mount_point) = line.split(' ').nth(4) else {
                continue;
            };
            // Octal escapes (`\040` for a space) as the kernel writes them.
            let unescaped = mount_point.replace("\\040", " ");
            if g.mark(libc::FAN_MARK_MOUNT, Path::new(&unescaped)).is_ok() {
                marked += 1;
            }
        }
        if marked == 0 {
            return Err(OsError::new(
                "fanotify_mark",
                std::io::Error::other("no mount accepted an exec mark"),
            ));
        }
        Ok(g)
    }

    /// The execs held since the last call, waiting up to `timeout` for one
    /// when there is none.
    pub fn poll(&self, timeout: Duration) -> Result<Vec<HeldExec>, OsError> {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd for the call.
        let n = unsafe { libc::poll(&mut pfd, 1, ms) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(Vec::new());
            }
            return Err(OsError::new("poll", e));
        }
        let mut held = Vec::new();
        let mut buf = [0u8; 4096];
        loop {
            // SAFETY: reads into our buffer, at most its length.
            let r = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if r < 0 {
                let e = std::io::Error::last_os_error();
                match e.kind() {
                    std::io::ErrorKind::WouldBlock => break,
                    std::io::ErrorKind::Interrupted => continue,
                    _ => return Err(OsError::new("read fanotify", e)),
                }
            }
            let r = r as usize;
            if r == 0 {
                break;
            }
            let meta_len = std::mem::size_of::<libc::fanotify_event_metadata>();
            let mut at = 0;
            while at + meta_len <= r {
                // SAFETY: `meta_len` bytes at `at` are within what was
                // read; read_unaligned copes with any alignment.
                let m: libc::fanotify_event_metadata =
                    unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
                let len = (m.event_len as usize).max(meta_len);
                at += len;
                if m.fd < 0 {
                    continue;
                }
                // SAFETY: the event's descriptor is ours to close.
                let file = unsafe { OwnedFd::from_raw_fd(m.fd) };
                let program =
                    std::fs::read_link(format!("/proc/self/fd/{}", m.fd)).unwrap_or_default();
                held.push(HeldExec {
                    pid: m.pid,
                    program,
                    file,
                });
            }
        }
        Ok(held)
    }

    /// Lets the held exec go on (its descriptor is closed).
    pub fn allow(&self, held: HeldExec) -> Result<(), OsError> {
        let resp = libc::fanotify_response {
            fd: held.file.as_raw_fd(),
            response: libc::FAN_ALLOW,
        };
        // SAFETY: writes the response struct, whose size is given.
        let r = unsafe {
            libc::write(
                self.fd.as_raw_fd(),
                (&resp as *const libc::fanotify_response).cast(),
                std::mem::size_of::<libc::fanotify_response>(),
            )
        };
        if r < 0 {
            return Err(last("write fanotify response"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An exec of a marked program is held until allowed (root only: a
    /// refusal of fanotify_init without it fails the test's assertion
    /// with the reason).
    #[test]
    fn holds_an_exec_of_the_marked_program_until_allowed() {
        let gate = match ExecGate::for_program(Path::new("/bin/true")) {
            Ok(g) => g,
            Err(e) => panic!("fanotify exec gate (needs root): {e}"),
        };
        // `spawn` waits for the exec to succeed: it runs on a thread.
        let runner = std::thread::spawn(|| std::process::Command::new("/bin/true").status());
        let me = std::process::id().to_string();
        let parent_of = |pid: i32| {
            std::fs::read_to_string(format!("/proc/{pid}/status"))
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix("PPid:").map(|p| p.trim().to_string()))
        };
        let mut mine = None;
        while mine.is_none() {
            // Other processes of the machine may run /bin/true meanwhile:
            // let them go.
            for h in gate.poll(Duration::from_secs(5)).unwrap() {
                if parent_of(h.pid).as_deref() == Some(me.as_str()) {
                    mine = Some(h);
                } else {
                    gate.allow(h).unwrap();
                }
            }
        }
        let h = mine.unwrap();
        assert!(h.program.ends_with("true"), "{:?}", h.program);
        assert!(!runner.is_finished(), "held, not exited");
        gate.allow(h).unwrap();
        assert!(runner.join().unwrap().unwrap().success());
    }
}
