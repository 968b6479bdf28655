//! Leaving a live process as found: what an injected agent takes back
//! before its tracer `dlclose`s it (issue 23).
//!
//! The tracer calls [`hotprobe_agent_release`] by a remote call at detach,
//! after every byte it wrote into the program's code is back and with
//! every other thread stopped, none of them with its PC in hotprobe's
//! code. The agent then:
//!
//! 1. refuses (changing nothing) while a thread is inside the agent or a
//!    stub (its `busy` flag: a signal handler, or a libc function the
//!    agent called, interrupted it there) — it would come back into code
//!    about to go;
//! 2. puts every hooked return address back (each shadow-stack entry
//!    whose stack slot still holds the return trampoline gets the real
//!    return address; the others are dead frames), so that no thread
//!    returns into the agent;
//! 3. forgets the shared memory (every path into it checks [`crate::shm`]
//!    first), closes the hang-up pipe (the tracer's exit would otherwise
//!    raise a `SIGTRAP` for a handler about to go), and gives `SIGTRAP`
//!    back to the disposition it had before the agent;
//! 4. deletes its thread-exit key (glibc would call its destructor in
//!    every registered thread's exit: code about to go);
//! 5. unmaps what it mapped: every shared memory it attached to, each
//!    thread's shadow stack and the near page, and the tracer's stub and
//!    trampoline pages it is given.
//!
//! The tracer's code that called it then `dlclose`s the library (its
//! `pthread_atfork` handler goes with it: glibc drops the handlers of an
//! unloaded object). If the library cannot be unloaded it stays, dormant:
//! a later attach starts it again.

use core::sync::atomic::Ordering::{Relaxed, Release};
use core::sync::atomic::{AtomicU64, AtomicUsize};

use crate::hit::{Shadow, EMPTY, SHADOW_BYTES, SHADOW_RESTORED, TOMBSTONE};
use crate::orphan::{syscall, syscall6};
use crate::threads::used_entries;

/// The most shared memories one process attaches to in its life (one per
/// tracer that attached; each is unmapped at release).
const MAX_MAPPINGS: usize = 64;
/// Every shared-memory mapping made by an attach: address and length
/// (address 0: a free entry).
static MAPPINGS: [(AtomicU64, AtomicU64); MAX_MAPPINGS] =
    [const { (AtomicU64::new(0), AtomicU64::new(0)) }; MAX_MAPPINGS];
/// Mappings past [`MAX_MAPPINGS`], which release cannot unmap.
static UNTRACKED: AtomicUsize = AtomicUsize::new(0);

/// [`hotprobe_agent_release`]: a thread is inside the agent or a stub.
pub const RELEASE_BUSY: i32 = 1;

/// Notes a shared-memory mapping an attach made (see [`MAPPINGS`]).
pub(crate) fn note_mapping(addr: u64, len: u64) {
    for (a, l) in MAPPINGS.iter() {
        if a.compare_exchange(0, addr, Relaxed, Relaxed).is_ok() {
            l.store(len, Relaxed);
            return;
        }
    }
    UNTRACKED.fetch_add(1, Relaxed);
}

/// Takes back everything the agent set up in the process (see the module
/// docs), with every other thread stopped by the tracer, and unmaps the
/// tracer's `n` stub and trampoline pages at `pages` (start, end pairs).
/// Returns 0, or -[`RELEASE_BUSY`] having changed nothing; a positive
/// count is the number of shared-memory mappings it could not unmap (past
/// its table), everything else done.
///
/// # Safety
/// `pages` points at `n` pairs of readable words (or `n` is 0), ranges
/// the tracer mapped, which no thread uses any more.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_agent_release(pages: *const [u64; 2], n: usize) -> i32 {
    // Nothing here unwinds (atomics and raw system calls, and libc's
    // `pthread_key_delete` and `sigaction`).
    if used_entries().any(|(_, e)| live(e) && e.fast.busy.load(Relaxed) != 0) {
        return -RELEASE_BUSY;
    }
    let ret = crate::trampoline::hotprobe_agent_return_trampoline as *const () as usize as u64;
    for (_, e) in used_entries() {
        let shadow = e.shadow.load(Relaxed);
        if live(e) && shadow != 0 {
            let depth = (e.depth.load(Relaxed) as usize).min(crate::hit::SHADOW_CAP);
            for i in 0..depth {
                // SAFETY: `shadow` is the thread's shadow stack (SHADOW_CAP
                // entries, mapped at registration and unmapped only below),
                // and `i` is under its depth; its thread is stopped.
                let s: Shadow = unsafe { *(shadow as *const Shadow).add(i) };
                if s.flags & SHADOW_RESTORED == 0 && read_word(s.slot) == Some(ret) {
                    write_word(s.slot, s.real);
                }
            }
        }
    }
    // The thread-slot chunks the view mapped past the attach's mapping.
    let chunks = crate::shm();
    crate::forget_shm();
    if let Some(s) = chunks {
        s.unmap_chunks();
    }
    crate::undo::disarm();
    crate::orphan::uninstall();
    crate::forget_exit_key();
    // Untouched pages of the table hold nothing to reset (and writing
    // them would put 2 MiB of it in memory).
    for (_, e) in used_entries() {
        let shadow = e.shadow.swap(0, Relaxed);
        if shadow != 0 {
            syscall(libc::SYS_munmap, [shadow, SHADOW_BYTES as u64, 0, 0]);
        }
        e.depth.store(0, Relaxed);
        e.slot.store(crate::hit::NO_SLOT, Relaxed);
        e.hslot.store(0, Relaxed);
        let f = &e.fast;
        // Stubs compare the key first: 0 matches no memory's.
        f.stub_key.store(0, Relaxed);
        f.counters.store(0, Relaxed);
        f.ctl.store(0, Relaxed);
        f.events.store(0, Relaxed);
        f.header.store(0, Relaxed);
        f.hook_entry.store(0, Relaxed);
        f.limit.store(0, Relaxed);
        e.key.store(EMPTY, Release);
    }
    crate::vfork::forget_spare_shadows();
    crate::thread_memory::forget_shadow_arena();
    crate::thread_memory::forget_ring_pool();
    for (a, l) in MAPPINGS.iter() {
        let addr = a.swap(0, Relaxed);
        if addr != 0 {
            syscall(libc::SYS_munmap, [addr, l.swap(0, Relaxed), 0, 0]);
        }
    }
    crate::forget_near_page();
    for i in 0..n {
        // SAFETY: `i < n` pairs at `pages` (the caller's promise).
        let [start, end] = unsafe { *pages.add(i) };
        if end > start {
            syscall(libc::SYS_munmap, [start, end - start, 0, 0]);
        }
    }
    UNTRACKED.swap(0, Relaxed) as i32
}

/// Whether entry `e` belongs to a registered thread.
fn live(e: &crate::hit::ThreadEntry) -> bool {
    let k = e.key.load(Relaxed);
    k != EMPTY && k != TOMBSTONE
}

/// The word at `addr` (a stopped thread's stack slot), read so that an
/// unmapped address is an error, not a fault: `process_vm_readv` on the
/// process itself (allowed even when it is not dumpable, unlike
/// `/proc/self/mem`).
fn read_word(addr: u64) -> Option<u64> {
    let mut w = 0u64;
    let local = libc::iovec {
        iov_base: &mut w as *mut u64 as *mut libc::c_void,
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: 8,
    };
    let n = syscall6(
        libc::SYS_process_vm_readv,
        [
            crate::threads::getpid() as u64,
            &local as *const libc::iovec as u64,
            1,
            &remote as *const libc::iovec as u64,
            1,
            0,
        ],
    );
    (n == 8).then_some(w)
}

/// Writes `value` at `addr` (see [`read_word`]).
fn write_word(addr: u64, value: u64) -> bool {
    let local = libc::iovec {
        iov_base: &value as *const u64 as *mut libc::c_void,
        iov_len: 8,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: 8,
    };
    let n = syscall6(
        libc::SYS_process_vm_writev,
        [
            crate::threads::getpid() as u64,
            &local as *const libc::iovec as u64,
            1,
            &remote as *const libc::iovec as u64,
            1,
            0,
        ],
    );
    n == 8
}
