//! The memory a thread's hits write besides the agent's table: its ring
//! start in the shared memory and its shadow stack, made ready before its
//! first events so that its first hits take no page fault, and so that
//! threads starting at once do not queue on the process's address-space
//! lock (`hotprobe-bench threadstart`, issue 23).

use core::sync::atomic::AtomicU64;
use core::sync::atomic::Ordering::{AcqRel, Acquire, Release};

use hotprobe_abi::Shm;

use crate::hit::SHADOW_BYTES;

/// Makes the pages of thread slot `slot`'s ring that its next events go
/// to (from `head` on: [`Shm::ring_pages_from`]) ready in this process
/// before the thread writes there (one fault per page on the hot path
/// otherwise), when some site writes events at all (`count` alone writes
/// none: its threads prepare nothing).
///
/// A fresh ring (`head` 0) of the tracer's ring pool has its pages in the
/// memory already (`hotprobe_abi::RING_POOL_RECORDING`): they are only
/// mapped here ([`map_pooled`]), if [`map_ring_pool`] has not mapped them
/// ahead. Other pages are put in memory here by one `madvise` (zeroing
/// 64 KiB of fresh shared memory, ≈ 20 µs: what an 8-thread program's
/// start under `record` paid per thread before the pool). That includes
/// a slot another thread of the process wrote into (given back, claimed
/// again): its new owner's events go on past the pages written so far,
/// where each first write took a fault of a fresh page, ≈ 8 µs each here
/// (15 faults a thread that took the slot of one that had exited, in
/// `hotprobe-bench threadstart`). The slot's counters are not touched:
/// only the pages of the probes this thread hits are ever touched (with
/// 2^20 probe ids they are 8 MB).
pub(crate) fn prepare_ring(shm: &Shm, slot: u32, head: u64) {
    let fresh = head == 0;
    if fresh && mapped_ahead(MAPPED_AHEAD.load(Acquire), slot) {
        return;
    }
    let (recording, ready) = shm.ring_pool();
    let Some((start, len)) = shm.ring_pages_from(slot, head).filter(|_| recording) else {
        return;
    };
    if fresh && slot < ready {
        map_pooled(start, len);
    } else {
        // Best effort (older kernels answer EINVAL: the pages fault in as
        // the ring is written). Populating changes no content.
        populate(start, len, MADV_POPULATE_WRITE);
    }
}

/// The thread slots whose control page and ring start are mapped in this
/// process already ([`map_ring_pool`]): `first << 32 | end`; 0 when none
/// are, as after a fork (a child's shared mappings start with no pages
/// mapped), a release or a new attach.
static MAPPED_AHEAD: AtomicU64 = AtomicU64::new(0);

/// Maps, in this process, the control page and the ring start of every
/// slot of the tracer's ring pool not handed out yet, so that the threads
/// that claim them next map nothing at their first hit. Called by the
/// tracer (a remote call, every thread stopped) once a recording site is
/// in: the threads of a program starting at once then each skipped ≈ 10
/// µs of `madvise` and the page tables of their slot, where they queued
/// on the address-space lock and on each other's faults (perf of
/// `hotprobe-bench threadstart --calls 1` under `record`). The memory is
/// the tracer's already; this maps it. Returns the slots mapped.
pub(crate) fn map_ring_pool(shm: &Shm) -> u32 {
    let (recording, ready) = shm.ring_pool();
    let claimed = shm.header().threads_claimed.load(Acquire);
    if !recording || claimed >= ready {
        return 0;
    }
    let mut mapped = 0;
    for slot in claimed..ready {
        let (Some(ctl), Some((start, len))) = (shm.ring_ctl(slot), shm.ring_start(slot)) else {
            break;
        };
        let page = (ctl as *const hotprobe_abi::RingCtl as usize) & !(hotprobe_abi::PAGE - 1);
        if !populate(page, hotprobe_abi::PAGE, MADV_POPULATE_READ)
            || !populate(start, len, MADV_POPULATE_READ)
        {
            // Before Linux 5.14: the threads map their own as before.
            break;
        }
        mapped += 1;
    }
    MAPPED_AHEAD.store(mapped_range(claimed, claimed + mapped), Release);
    mapped
}

/// [`MAPPED_AHEAD`]'s word for slots `first..end`.
fn mapped_range(first: u32, end: u32) -> u64 {
    u64::from(first) << 32 | u64::from(end)
}

/// Whether `slot` is in the range [`MAPPED_AHEAD`]'s `word` holds.
fn mapped_ahead(word: u64, slot: u32) -> bool {
    (word >> 32..word & u64::from(u32::MAX)).contains(&u64::from(slot))
}

/// Forgets what [`map_ring_pool`] mapped (a release, a new attach, a
/// fork's child).
pub(crate) fn forget_ring_pool() {
    MAPPED_AHEAD.store(0, Release);
}

/// Faults `len` bytes from `start` in by one `madvise` of `advice`
/// ([`MADV_POPULATE_READ`]: mapped readable, and writable too for shared
/// memory, see [`map_pooled`]; [`MADV_POPULATE_WRITE`]: put in memory,
/// writable); false on a kernel without it (before 5.14). By the system
/// call: libc's `madvise` may be probed.
fn populate(start: usize, len: usize, advice: u64) -> bool {
    crate::orphan::syscall(libc::SYS_madvise, [start as u64, len as u64, advice, 0]) == 0
}

/// Maps a pool slot's ring start (`start`, `len` bytes) in this process:
/// the tracer made the pages, so a read maps them writable (shared memory
/// has no write notification), and one `madvise` maps them all (≈ 2.5 µs
/// for 17 pages here, where a read of each page, fault-around and all,
/// took 4–7 µs). On kernels before 5.14, a read of each page.
fn map_pooled(start: usize, len: usize) {
    if !populate(start, len, MADV_POPULATE_READ) {
        for p in (start..start + len).step_by(hotprobe_abi::PAGE) {
            // SAFETY: a page of this thread's own ring (in the shared
            // mapping, never unmapped while attached); the read changes
            // nothing.
            unsafe { core::ptr::read_volatile(p as *const u8) };
        }
    }
}

/// `madvise` advice (Linux 5.14): fault the range in, readable.
const MADV_POPULATE_READ: u64 = 22;
/// `madvise` advice (Linux 5.14): fault the range in, writable.
const MADV_POPULATE_WRITE: u64 = 23;

/// Shadow stacks mapped by one `mmap` ([`map_shadow`]): 16 × 96 KiB of
/// address space, faulted in as used.
const SHADOW_ARENA_STACKS: u64 = 16;
const _: () = assert!(
    SHADOW_BYTES.is_multiple_of(hotprobe_abi::PAGE)
        && (SHADOW_ARENA_STACKS as usize) < hotprobe_abi::PAGE
);

/// The shadow-stack arena stacks are handed out of: its base (page
/// aligned) plus the number handed out so far (low bits); 0 before the
/// first. Each thread's first hooked return used to `mmap` its own stack:
/// 8 threads starting at once then queued on the address-space lock with
/// each other's page faults (≈ 12 µs a thread, perf of
/// `hotprobe-bench threadstart` under `record`).
static SHADOW_ARENA: AtomicU64 = AtomicU64::new(0);

/// A fresh shadow stack ([`SHADOW_BYTES`], private, zero-filled; 0 when
/// no memory could be mapped): the next one of the arena, or the first of
/// a new arena. Lock-free; an arena another thread installed first is
/// used instead of one's own, which is unmapped. Each stack is unmapped
/// on its own at release ([`forget_shadow_arena`] unmaps what is left).
pub(crate) fn map_shadow() -> u64 {
    loop {
        let w = SHADOW_ARENA.load(Acquire);
        let (base, used) = (
            w & !(hotprobe_abi::PAGE as u64 - 1),
            w & (hotprobe_abi::PAGE as u64 - 1),
        );
        if base != 0 && used < SHADOW_ARENA_STACKS {
            if SHADOW_ARENA
                .compare_exchange(w, w + 1, AcqRel, Acquire)
                .is_ok()
            {
                return base + used * SHADOW_BYTES as u64;
            }
            continue;
        }
        let fresh = map_anonymous(SHADOW_ARENA_STACKS * SHADOW_BYTES as u64);
        if fresh == 0 {
            return 0;
        }
        if SHADOW_ARENA
            .compare_exchange(w, fresh | 1, AcqRel, Acquire)
            .is_ok()
        {
            return fresh;
        }
        crate::orphan::syscall(
            libc::SYS_munmap,
            [fresh, SHADOW_ARENA_STACKS * SHADOW_BYTES as u64, 0, 0],
        );
    }
}

/// Maps the first shadow arena ahead of the threads, at an attach (the
/// program's threads stopped; a spawned program has not started): its
/// threads' first hooked returns then neither race to map one nor make
/// the first page of their stack come in, each a fault the others' wait
/// on. 64 KiB of memory (one page of each stack) and 1.5 MiB of address
/// space, unmapped at release.
pub(crate) fn prepare_shadow_arena() {
    if SHADOW_ARENA.load(Acquire) != 0 {
        return;
    }
    let fresh = map_anonymous(SHADOW_ARENA_STACKS * SHADOW_BYTES as u64);
    if fresh == 0 {
        return;
    }
    for i in 0..SHADOW_ARENA_STACKS {
        // SAFETY: the first word of stack `i` of the fresh private mapping,
        // which nothing else knows yet; it is zero, and stays so.
        unsafe { core::ptr::write_volatile((fresh + i * SHADOW_BYTES as u64) as *mut u64, 0) };
    }
    if SHADOW_ARENA
        .compare_exchange(0, fresh, AcqRel, Acquire)
        .is_err()
    {
        crate::orphan::syscall(
            libc::SYS_munmap,
            [fresh, SHADOW_ARENA_STACKS * SHADOW_BYTES as u64, 0, 0],
        );
    }
}

/// Unmaps the stacks of the current shadow arena never handed out (at
/// release, every thread stopped; the handed-out ones are unmapped with
/// their entries), and forgets the arena.
pub(crate) fn forget_shadow_arena() {
    let w = SHADOW_ARENA.swap(0, AcqRel);
    let (base, used) = (
        w & !(hotprobe_abi::PAGE as u64 - 1),
        w & (hotprobe_abi::PAGE as u64 - 1),
    );
    if base != 0 && used < SHADOW_ARENA_STACKS {
        crate::orphan::syscall(
            libc::SYS_munmap,
            [
                base + used * SHADOW_BYTES as u64,
                (SHADOW_ARENA_STACKS - used) * SHADOW_BYTES as u64,
                0,
                0,
            ],
        );
    }
}

/// A fresh private anonymous read-write mapping of `len` bytes (0 when
/// `mmap` failed), by the system call: libc's `mmap` may be probed, and
/// this runs inside a hit (a thread's first).
fn map_anonymous(len: u64) -> u64 {
    let p = crate::orphan::syscall6(
        libc::SYS_mmap,
        [
            0,
            len,
            (libc::PROT_READ | libc::PROT_WRITE) as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
            u64::MAX,
            0,
        ],
    );
    // Errors are -4095..-1.
    if p > u64::MAX - 4095 {
        0
    } else {
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots mapped ahead are those of the range only: not the ones
    /// claimed before the pool was mapped (a thread's slot from before the
    /// first recording site, whose ring start nobody prepared), nor the
    /// ones past it; none after a release or in a fork's child.
    #[test]
    fn only_the_slots_of_the_range_count_as_mapped_ahead() {
        let w = mapped_range(2, 18);
        assert!(!mapped_ahead(w, 0) && !mapped_ahead(w, 1));
        assert!(mapped_ahead(w, 2) && mapped_ahead(w, 17));
        assert!(!mapped_ahead(w, 18) && !mapped_ahead(w, u32::MAX));
        assert!(!mapped_ahead(0, 0) && !mapped_ahead(0, 5));
        assert!(!mapped_ahead(mapped_range(3, 3), 3));
    }
}
