//! Another hotprobe session's hold on a process (issue 22): a second
//! session must not take over the agent of a process a first session
//! still probes — held by ptrace, or released (running untraced with its
//! patch calls, jumps and in-process traps in): re-attached to a second
//! shared memory, the agent would no longer know the first session's
//! `int3`s, and their next hit would kill the program with `SIGTRAP`.
//!
//! The first session is found in the process's own mappings, before
//! anything is done to it (no ptrace, no code run): every shared memfd
//! mapping that holds a hotprobe header of this layout version is read
//! through `/proc/PID/mem`. Its code ledger names the session's process
//! ([`hotprobe_abi::LedgerCtl::tracer_pid`], which a session clears once
//! it detached) and says whether the agent put the sites back after that
//! session died ([`hotprobe_abi::LedgerCtl::undo`]). So, mirroring what the
//! agent itself does (it keeps a session's sites as long as that process
//! exists, even frozen):
//!
//! * the session's process exists (not a zombie): the process is
//!   refused, naming it ([`FastPathError::ProbedByAnotherSession`]);
//! * it is gone and its agent put every site back, or nothing of it
//!   remains in the ledger and trap table: the agent may be taken over;
//! * it is gone and its sites are still in (the agent has not heard of
//!   the death yet): waited for a moment, then refused with the reason
//!   ([`FastPathError::AbandonedSites`]).
//!
//! A memory the process inherited from its parent without following forks
//! (its agent went dormant there), or one of this very process, is no
//! other session's hold.

use std::os::unix::fs::FileExt;
use std::time::{Duration, Instant};

use hotprobe_abi::{
    Header, HeaderFields, Layout, LedgerCtl, LedgerEntry, TrapSlot, CONTROL_FOLLOW_FORKS,
    HEADER_SIZE, LEDGER_LIVE, LEDGER_UNDOING, LEDGER_WRITING, MAGIC, TRAP_PRESENT, TRAP_SLOTS,
    TRAP_SLOTS_OFFSET, UNDO_DONE,
};

use crate::FastPathError;

/// How long a dead session's sites are waited for (the agent puts them
/// back as soon as it hears of the death: the hang-up pipe, a hit).
const UNDO_WAIT: Duration = Duration::from_secs(3);

/// What one hotprobe memory in a process says of its session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hold {
    /// No session holds the process through it.
    Free,
    /// Session process `0` exists.
    Live(u32),
    /// Session process `0` is gone; `1` of its sites are still in.
    Abandoned(u32, u64),
}

/// Refuses process `pid` when another hotprobe session probes it (see the
/// module docs): [`FastPathError::ProbedByAnotherSession`], or
/// [`FastPathError::AbandonedSites`] when a dead session's sites are still
/// in after a short wait. A process whose memory cannot be read is not
/// refused here (attaching says why).
pub fn check_not_probed(pid: i32) -> Result<(), FastPathError> {
    let deadline = Instant::now() + UNDO_WAIT;
    loop {
        match hold_of(pid) {
            Hold::Free => return Ok(()),
            Hold::Live(session) => {
                return Err(FastPathError::ProbedByAnotherSession { pid, session })
            }
            Hold::Abandoned(session, sites) if Instant::now() >= deadline => {
                return Err(FastPathError::AbandonedSites {
                    pid,
                    session,
                    sites,
                })
            }
            Hold::Abandoned(..) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

/// [`check_not_probed`] without waiting (the process is stopped: its
/// agent cannot put anything back meanwhile).
pub(crate) fn check_not_probed_now(pid: i32) -> Result<(), FastPathError> {
    match hold_of(pid) {
        Hold::Free => Ok(()),
        Hold::Live(session) => Err(FastPathError::ProbedByAnotherSession { pid, session }),
        Hold::Abandoned(session, sites) => Err(FastPathError::AbandonedSites {
            pid,
            session,
            sites,
        }),
    }
}

/// The strongest hold any hotprobe memory of `pid` shows.
fn hold_of(pid: i32) -> Hold {
    // A live thread's entries where the leader is a zombie (its own maps
    // read empty, its mem does not open).
    let dir = hotprobe_symbols::proc_dir(pid as u32);
    let Ok(maps) = std::fs::read_to_string(dir.join("maps")) else {
        return Hold::Free;
    };
    let Ok(mem) = std::fs::File::open(dir.join("mem")) else {
        return Hold::Free;
    };
    let mut hold = Hold::Free;
    for (start, len) in shared_memfd_mappings(&maps) {
        match memory_hold(&mem, pid, start, len) {
            Hold::Free => {}
            h @ Hold::Live(_) => return h,
            h @ Hold::Abandoned(..) => hold = h,
        }
    }
    hold
}

/// Shared mappings of memfds or `/dev/shm` files from their offset 0
/// (start, length): where a hotprobe memory may be.
fn shared_memfd_mappings(maps: &str) -> Vec<(u64, u64)> {
    maps.lines()
        .filter_map(|line| {
            let mut it = line.split_whitespace();
            let (s, e) = it.next()?.split_once('-')?;
            let perms = it.next()?;
            let offset = it.next()?;
            let name = it.nth(2).unwrap_or("");
            let shared = perms.as_bytes().get(3) == Some(&b's');
            let named = name.starts_with("/memfd:") || name.starts_with("/dev/shm/");
            if !shared || !named || u64::from_str_radix(offset, 16).ok()? != 0 {
                return None;
            }
            let (s, e) = (
                u64::from_str_radix(s, 16).ok()?,
                u64::from_str_radix(e, 16).ok()?,
            );
            (e > s).then_some((s, e - s))
        })
        .collect()
}

/// Reads a `u64`/`u32` at `addr` of the process.
fn read_u64(mem: &std::fs::File, addr: u64) -> Option<u64> {
    let mut b = [0u8; 8];
    mem.read_exact_at(&mut b, addr).ok()?;
    Some(u64::from_le_bytes(b))
}

fn read_u32(mem: &std::fs::File, addr: u64) -> Option<u32> {
    let mut b = [0u8; 4];
    mem.read_exact_at(&mut b, addr).ok()?;
    Some(u32::from_le_bytes(b))
}

/// What the mapping at `start` (`len` bytes) of process `pid` says, when
/// it holds a hotprobe header of this version.
fn memory_hold(mem: &std::fs::File, pid: i32, start: u64, len: u64) -> Hold {
    memory_hold_inner(mem, pid, start, len).unwrap_or(Hold::Free)
}

fn memory_hold_inner(mem: &std::fs::File, pid: i32, start: u64, len: u64) -> Option<Hold> {
    use std::mem::offset_of;
    if len < HEADER_SIZE as u64 || read_u64(mem, start)? != MAGIC {
        return None;
    }
    let mut h = [0u8; HEADER_SIZE];
    mem.read_exact_at(&mut h, start).ok()?;
    let u64_at = |off: usize| Some(u64::from_le_bytes(h.get(off..off + 8)?.try_into().ok()?));
    let u32_at = |off: usize| Some(u32::from_le_bytes(h.get(off..off + 4)?.try_into().ok()?));
    let fields = HeaderFields {
        magic: u64_at(offset_of!(Header, magic))?,
        version: u32_at(offset_of!(Header, version))?,
        header_size: u32_at(offset_of!(Header, header_size))?,
        total_size: u64_at(offset_of!(Header, total_size))?,
        n_probes: u32_at(offset_of!(Header, n_probes))?,
        n_site_slots: u32_at(offset_of!(Header, n_site_slots))?,
        n_threads: u32_at(offset_of!(Header, n_threads))?,
        ring_capacity: u32_at(offset_of!(Header, ring_capacity))?,
        sites_offset: u64_at(offset_of!(Header, sites_offset))?,
        counters_offset: u64_at(offset_of!(Header, counters_offset))?,
        missed_offset: u64_at(offset_of!(Header, missed_offset))?,
        traps_offset: u64_at(offset_of!(Header, traps_offset))?,
        threads_offset: u64_at(offset_of!(Header, threads_offset))?,
        thread_stride: u64_at(offset_of!(Header, thread_stride))?,
        event_size: u32_at(offset_of!(Header, event_size))?,
    };
    let layout = Layout::from_header(&fields, usize::try_from(len).ok()?).ok()?;
    // Inherited from a parent that does not follow forks: the agent went
    // dormant in this process (see `hotprobe_abi::CONTROL_FOLLOW_FORKS`).
    let agent_pid = u32_at(offset_of!(Header, agent_pid))?;
    let control = u32_at(offset_of!(Header, control))?;
    if agent_pid != pid as u32 && control & CONTROL_FOLLOW_FORKS == 0 {
        return Some(Hold::Free);
    }
    let ledger = start + layout.ledger_offset as u64;
    let session = read_u32(mem, ledger + offset_of!(LedgerCtl, tracer_pid) as u64)?;
    let undo = read_u32(mem, ledger + offset_of!(LedgerCtl, undo) as u64)?;
    if session == 0 || session == std::process::id() || undo == UNDO_DONE {
        return Some(Hold::Free);
    }
    if !process_gone(session) {
        return Some(Hold::Live(session));
    }
    let sites = sites_in(mem, start, &layout, ledger)?;
    Some(match sites {
        0 => Hold::Free,
        n => Hold::Abandoned(session, n),
    })
}

/// The sites a session's ledger and trap table still hold in the code.
fn sites_in(mem: &std::fs::File, start: u64, layout: &Layout, ledger: u64) -> Option<u64> {
    use std::mem::{offset_of, size_of};
    let high = read_u32(mem, ledger + offset_of!(LedgerCtl, high_water) as u64)?;
    let capacity = hotprobe_abi::ledger_capacity(&layout.params) as u64;
    let entries = ledger + size_of::<LedgerCtl>() as u64;
    let mut n = 0u64;
    let stride = size_of::<LedgerEntry>();
    let mut buf = vec![0u8; (u64::from(high).min(capacity) as usize) * stride];
    mem.read_exact_at(&mut buf, entries).ok()?;
    for e in buf.chunks_exact(stride) {
        let at = offset_of!(LedgerEntry, state);
        let state = u32::from_le_bytes(e.get(at..at + 4)?.try_into().ok()?);
        if matches!(state, LEDGER_WRITING | LEDGER_LIVE | LEDGER_UNDOING) {
            n += 1;
        }
    }
    let stride = size_of::<TrapSlot>();
    let mut traps = vec![0u8; TRAP_SLOTS * stride];
    let table = start + (layout.traps_offset + TRAP_SLOTS_OFFSET) as u64;
    mem.read_exact_at(&mut traps, table).ok()?;
    for t in traps.chunks_exact(stride) {
        let at = offset_of!(TrapSlot, info);
        let info = u32::from_le_bytes(t.get(at..at + 4)?.try_into().ok()?);
        let addr = offset_of!(TrapSlot, addr);
        let addr = u64::from_le_bytes(t.get(addr..addr + 8)?.try_into().ok()?);
        if addr != 0 && info & TRAP_PRESENT != 0 {
            n += 1;
        }
    }
    Some(n)
}

/// Whether process `pid` no longer exists, or is a zombie (as the agent
/// decides it: `hotprobe-agent`'s `undo`).
fn process_gone(pid: u32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return true;
    };
    // "pid (comm) S ...": the state follows the last ')'.
    let state = stat
        .rfind(')')
        .and_then(|i| stat.get(i + 1..))
        .and_then(|s| s.split_whitespace().next());
    matches!(state, Some("Z" | "X"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_shared_memfd_and_dev_shm_mappings_from_offset_0_are_read() {
        let maps = "\
7f0000000000-7f0000100000 rw-s 00000000 00:01 1234 /memfd:hotprobe (deleted)
7f0000100000-7f0000200000 rw-p 00000000 00:01 1235 /memfd:hotprobe (deleted)
7f0000200000-7f0000300000 rw-s 00001000 00:01 1236 /memfd:other (deleted)
7f0000300000-7f0000301000 rw-s 00000000 00:17 99 /dev/shm/x
7f0000400000-7f0000401000 rw-s 00000000 08:01 77 /home/u/file
garbage line
";
        assert_eq!(
            shared_memfd_mappings(maps),
            vec![(0x7f00_0000_0000, 0x10_0000), (0x7f00_0030_0000, 0x1000)]
        );
    }

    #[test]
    fn a_process_that_does_not_exist_is_gone_and_this_one_is_not() {
        assert!(!process_gone(std::process::id()));
        assert!(process_gone(u32::MAX - 1));
    }
}
