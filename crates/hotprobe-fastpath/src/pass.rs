//! Files handed to a running target as descriptors of its own (issue 23):
//! a target that changed its uid, or is not dumpable, cannot open the
//! tracer's memfds through `/proc/TRACER/fd/N` (the kernel checks the
//! target's ptrace access to the tracer). So the target creates the memfd
//! itself (a remote `memfd_create`), the tracer takes the same file with
//! `pidfd_getfd` (a tracer has ptrace access to its target) and fills it:
//! the agent library, which the target then `dlopen`s as
//! `/proc/self/fd/N` (a process may always open its own descriptors), or
//! the shared memory, whose descriptor the agent's attach maps directly.
//! Where this fails (a seccomp filter refusing `memfd_create`, a kernel
//! without `pidfd_getfd`), the caller falls back to the `/proc/TRACER`
//! path and names both reasons if that fails too.

use hotprobe_os::Memfd;
use hotprobe_process::remote_call::remote_syscall;
use hotprobe_process::ProcessTarget;
use hotprobe_target::{RuntimeAddr, Target};

/// `MFD_EXEC` (Linux 6.3): executable even where `vm.memfd_noexec`
/// makes memfds non-executable by default.
const MFD_EXEC: u64 = 0x10;

/// A memfd in the target and the same file here: its descriptor number
/// there (close-on-exec), and ours.
#[derive(Debug)]
pub(crate) struct PassedMemfd {
    /// The target's descriptor.
    pub(crate) target_fd: u64,
    /// Ours.
    pub(crate) memfd: Memfd,
}

/// Creates a memfd named `name` in the stopped target (a remote
/// `memfd_create`, the name written at `scratch`, a page of the target's
/// we may write) and takes the same file into ours; `exec`: for a
/// library. `Err(reason)` names the call that failed.
pub(crate) fn target_memfd(
    t: &mut ProcessTarget,
    scratch: u64,
    name: &str,
    exec: bool,
) -> Result<PassedMemfd, String> {
    let name_c = format!("{name}\0");
    t.write_memory(RuntimeAddr(scratch), name_c.as_bytes())
        .map_err(|e| e.to_string())?;
    let flags = libc::MFD_CLOEXEC as u64;
    let create = |t: &mut ProcessTarget, flags: u64| {
        remote_syscall(t, hotprobe_os::shm::MEMFD_CREATE_NR, &[scratch, flags])
            .map_err(|e| e.to_string())
    };
    let mut fd = create(t, if exec { flags | MFD_EXEC } else { flags })?;
    if exec && fd as i64 == -(libc::EINVAL as i64) {
        // A kernel older than MFD_EXEC: memfds are executable there.
        fd = create(t, flags)?;
    }
    if (fd as i64) < 0 {
        return Err(format!(
            "memfd_create in the target failed: {} (a seccomp filter?)",
            std::io::Error::from_raw_os_error(-(fd as i64) as i32)
        ));
    }
    match hotprobe_os::pidfd::take_fd(t.pid(), fd as i32) {
        Ok(ours) => Ok(PassedMemfd {
            target_fd: fd,
            memfd: Memfd::from_fd(ours),
        }),
        Err(e) => {
            close_in_target(t, fd);
            Err(e.to_string())
        }
    }
}

/// Closes descriptor `fd` of the stopped target (best effort).
pub(crate) fn close_in_target(t: &mut ProcessTarget, fd: u64) {
    let _ = remote_syscall(t, libc::SYS_close as u64, &[fd]);
}

/// Gives the stopped target's agent a hang-up pipe of the target's own
/// (see the agent's `undo`): a remote `pipe2` there, its write end taken
/// into ours and kept open for the life of this process (it hangs up when
/// we die, however we die), its read end armed by the agent's
/// `hangup_fn` (`hotprobe_agent_hangup_fd`, which keeps a copy); both of
/// the target's descriptors are closed afterwards.
pub(crate) fn pass_hangup(t: &mut ProcessTarget, hangup_fn: u64) -> Result<(), String> {
    use hotprobe_process::remote_call::remote_call;
    let page = crate::agent::remote_page(t).map_err(|e| e.to_string())?;
    let r = (|| {
        let rc = remote_syscall(t, libc::SYS_pipe2 as u64, &[page, libc::O_CLOEXEC as u64])
            .map_err(|e| e.to_string())?;
        if rc != 0 {
            return Err(format!(
                "pipe2 in the target failed: {}",
                std::io::Error::from_raw_os_error(-(rc as i64) as i32)
            ));
        }
        let mut fds = [0u8; 8];
        t.read_memory(RuntimeAddr(page), &mut fds)
            .map_err(|e| e.to_string())?;
        let read_end = u32::from_le_bytes([fds[0], fds[1], fds[2], fds[3]]) as u64;
        let write_end = u32::from_le_bytes([fds[4], fds[5], fds[6], fds[7]]) as u64;
        let taken = hotprobe_os::pidfd::take_fd(t.pid(), write_end as i32);
        let armed = match &taken {
            Ok(_) => remote_call(
                t,
                hangup_fn,
                &[read_end],
                std::time::Duration::from_secs(10),
            )
            .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        close_in_target(t, read_end);
        close_in_target(t, write_end);
        match (taken, armed) {
            (Ok(w), Ok(r)) if r as i32 == 0 => {
                // Ours for the life of this process: closed by our death.
                std::mem::forget(w);
                Ok(())
            }
            (_, Ok(r)) => Err(format!("hotprobe_agent_hangup_fd returned {}", r as i32)),
            (_, Err(e)) => Err(e),
        }
    })();
    let _ = remote_syscall(t, libc::SYS_munmap as u64, &[page, 4096]);
    r
}
