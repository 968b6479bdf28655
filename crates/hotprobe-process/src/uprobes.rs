//! The kernel uprobes registered on this machine, and who holds them: the
//! perf events of every process (bpftrace's, one per uprobe), asked with
//! `BPF_TASK_FD_QUERY` as `bpftool perf` does, and the uprobe events
//! defined in tracefs (`perf probe -x`). A uprobe lives on a file and an
//! offset and writes its `int3` into every process mapping that file, so
//! one placed on an instruction hotprobe rewrote breaks that process (see
//! docs/DESIGN.md, "Code shared with other tools"): hotprobe names them
//! when a process it rewrote crashes.
//!
//! Best effort: another user's processes, or a kernel without the query,
//! simply give nothing. No library lists uprobes; this is written by hand.

use std::path::PathBuf;

/// A kernel uprobe: the file and the offset in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelUprobe {
    /// The probed file, as the kernel names it.
    pub path: PathBuf,
    /// The probed instruction's offset in the file.
    pub offset: u64,
    /// The process holding it (a perf event's), `None` for a tracefs
    /// uprobe event.
    pub owner: Option<UprobeOwner>,
}

/// A process holding a uprobe's perf event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UprobeOwner {
    /// Its process id.
    pub pid: i32,
    /// Its command name (`/proc/PID/comm`).
    pub comm: String,
}

/// Every kernel uprobe this process can see: the perf events of every
/// process, then the tracefs uprobe events.
pub fn kernel_uprobes() -> Vec<KernelUprobe> {
    let mut all = perf_event_uprobes();
    for dir in ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"] {
        if let Ok(text) = std::fs::read_to_string(format!("{dir}/uprobe_events")) {
            all.extend(parse_uprobe_events(&text));
            break;
        }
    }
    all
}

/// The uprobes of a tracefs `uprobe_events` file: lines such as
/// `p:uprobes/p_bash_0x4245c0 /bin/bash:0x00000000000445c0 %ip`, an
/// optional `(0xREF)` after the offset. Lines it cannot read are skipped.
pub fn parse_uprobe_events(text: &str) -> Vec<KernelUprobe> {
    text.lines()
        .filter_map(|line| {
            let at = line.split_whitespace().nth(1)?;
            let (path, offset) = at.rsplit_once(':')?;
            let offset = offset.split('(').next()?;
            let offset = u64::from_str_radix(offset.strip_prefix("0x")?, 16).ok()?;
            (!path.is_empty()).then(|| KernelUprobe {
                path: PathBuf::from(path),
                offset,
                owner: None,
            })
        })
        .collect()
}

/// `BPF_TASK_FD_QUERY`'s part of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct TaskFdQuery {
    pid: u32,
    fd: u32,
    flags: u32,
    buf_len: u32,
    buf: u64,
    prog_id: u32,
    fd_type: u32,
    probe_offset: u64,
    probe_addr: u64,
}

const BPF_TASK_FD_QUERY: libc::c_long = 20;
const BPF_FD_TYPE_UPROBE: u32 = 4;
const BPF_FD_TYPE_URETPROBE: u32 = 5;

/// The uprobes behind every perf event with a BPF program (bpftrace's,
/// bcc's) of every process.
fn perf_event_uprobes() -> Vec<KernelUprobe> {
    let mut all = Vec::new();
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return all;
    };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(fds) = std::fs::read_dir(p.path().join("fd")) else {
            continue;
        };
        let mut owner = None;
        for fd in fds.flatten() {
            let is_perf_event = std::fs::read_link(fd.path())
                .is_ok_and(|l| l.as_os_str() == "anon_inode:[perf_event]");
            let Some(fd) = fd.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if !is_perf_event {
                continue;
            }
            let Some((path, offset)) = query_uprobe(pid, fd) else {
                continue;
            };
            let owner = owner
                .get_or_insert_with(|| UprobeOwner {
                    pid,
                    comm: std::fs::read_to_string(p.path().join("comm"))
                        .map(|c| c.trim_end().to_string())
                        .unwrap_or_default(),
                })
                .clone();
            all.push(KernelUprobe {
                path,
                offset,
                owner: Some(owner),
            });
        }
    }
    all
}

/// The file and offset of the uprobe behind perf event `fd` of `pid`, if
/// it is one with a BPF program attached.
fn query_uprobe(pid: i32, fd: u32) -> Option<(PathBuf, u64)> {
    let mut buf = vec![0u8; 4096];
    let mut q = TaskFdQuery {
        pid: pid as u32,
        fd,
        buf_len: buf.len() as u32,
        buf: buf.as_mut_ptr() as u64,
        ..Default::default()
    };
    // SAFETY: `q` is a valid `BPF_TASK_FD_QUERY` attribute of the size
    // passed, and `buf` outlives the call with the length it names; the
    // kernel writes only into `q` and `buf`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_TASK_FD_QUERY,
            &mut q as *mut TaskFdQuery,
            std::mem::size_of::<TaskFdQuery>() as u32,
        )
    };
    if r != 0 || !matches!(q.fd_type, BPF_FD_TYPE_UPROBE | BPF_FD_TYPE_URETPROBE) {
        return None;
    }
    let len = buf.iter().position(|b| *b == 0).unwrap_or(buf.len());
    buf.truncate(len);
    use std::os::unix::ffi::OsStringExt;
    Some((
        PathBuf::from(std::ffi::OsString::from_vec(buf)),
        q.probe_offset,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracefs_uprobe_events_are_read_and_odd_lines_skipped() {
        let text = "p:uprobes/p_bash_0x4245c0 /bin/bash:0x00000000000445c0 %ip\n\
                    r:probe_libc/free /usr/lib/x86_64-linux-gnu/libc.so.6:0x9a6d0(0x1234)\n\
                    garbage\n\
                    p:x /no/offset\n\
                    p:x /bad:0xzz\n\
                    p:x :0x10\n";
        let u = parse_uprobe_events(text);
        assert_eq!(u.len(), 2, "{u:?}");
        assert_eq!(u[0].path, PathBuf::from("/bin/bash"));
        assert_eq!(u[0].offset, 0x445c0);
        assert_eq!(u[1].offset, 0x9a6d0);
        assert_eq!(u[1].owner, None);
    }

    #[test]
    fn an_ordinary_fd_is_no_uprobe() {
        // This process's stdin is no perf event: the query fails cleanly.
        assert_eq!(query_uprobe(std::process::id() as i32, 0), None);
    }
}
