//! What a hit does: the fast path (site lookup, per-thread state, count,
//! record) and the slow path (a thread's first hit).
//!
//! Per-thread state lives in a static open-addressing table keyed by the
//! thread pointer (`fs:[0]`, which the x86-64 TLS ABI makes point to
//! itself): no `#[thread_local]`, no `__tls_get_addr` (which may `malloc`
//! when the agent was `dlopen`ed), no lock, no allocation. A thread's first
//! hit claims an entry with a CAS and a thread slot (ring + counters) in the
//! shared memory with an atomic add; a `pthread_key` destructor releases the
//! entry when the thread exits.

use core::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use core::sync::atomic::{compiler_fence, AtomicU32, AtomicU64};

use hotprobe_abi::{
    rdtsc, Event, Shm, ACTION_COUNT, ACTION_RECORD, CONTROL_ENABLED, CONTROL_RECORD, KIND_EXIT,
    STATUS_ORPHANED, THREAD_EXITED,
};

use crate::trampoline::Frame;

/// Entries of the thread table (threads alive at once, with some slack).
pub(crate) const MAX_THREADS: usize = 4096;
const EMPTY: u64 = 0;
const TOMBSTONE: u64 = u64::MAX;
const NO_SLOT: u32 = u32::MAX;
/// Check the tracer's heartbeat every this many hits of a thread (mask).
const HEARTBEAT_EVERY: u32 = 1024 - 1;

/// Agent-private state of one thread (single writer: that thread, except
/// for `key` which is claimed by CAS and reset at thread exit or fork).
#[repr(C, align(64))]
pub(crate) struct ThreadEntry {
    key: AtomicU64,
    slot: AtomicU32,
    tid: AtomicU32,
    busy: AtomicU32,
    hits: AtomicU32,
    cached_tail: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const ENTRY_INIT: ThreadEntry = ThreadEntry {
    key: AtomicU64::new(EMPTY),
    slot: AtomicU32::new(NO_SLOT),
    tid: AtomicU32::new(0),
    busy: AtomicU32::new(0),
    hits: AtomicU32::new(0),
    cached_tail: AtomicU64::new(0),
};

pub(crate) static THREADS: [ThreadEntry; MAX_THREADS] = [ENTRY_INIT; MAX_THREADS];

#[inline(always)]
fn thread_pointer() -> u64 {
    let tp: u64;
    // SAFETY: reads the first word of the TCB, which the x86-64 TLS ABI
    // (glibc and musl) makes hold the thread pointer itself; always mapped.
    unsafe {
        core::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags))
    };
    tp
}

#[inline(always)]
fn table_index(tp: u64) -> usize {
    (tp.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52) as usize
}

#[inline(always)]
fn find_thread(tp: u64) -> Option<&'static ThreadEntry> {
    let mut i = table_index(tp);
    let mut n = 0;
    while n < MAX_THREADS {
        let e = THREADS.get(i % MAX_THREADS)?;
        let k = e.key.load(Relaxed);
        if k == tp {
            return Some(e);
        }
        if k == EMPTY {
            return None;
        }
        i = i.wrapping_add(1);
        n += 1;
    }
    None
}

/// The tracer is gone when its heartbeat is older than the timeout: stop
/// recording (counting goes on: it only adds into shared memory).
#[inline(never)]
fn check_heartbeat(shm: &Shm) {
    let h = shm.header();
    let timeout = h.heartbeat_timeout_tsc.load(Relaxed);
    if timeout == 0 {
        return;
    }
    let age = rdtsc().wrapping_sub(h.heartbeat_tsc.load(Relaxed)) as i64;
    if age > timeout as i64 {
        h.control.fetch_and(!CONTROL_RECORD, Relaxed);
        h.status.fetch_or(STATUS_ORPHANED, Relaxed);
    }
}

#[inline(always)]
fn act(
    shm: &Shm,
    t: &ThreadEntry,
    frame: &Frame,
    kind: u32,
    probe: u32,
    action: u32,
    control: u32,
) {
    let slot = t.slot.load(Relaxed);
    if action & ACTION_COUNT != 0 {
        match shm
            .thread_counters(slot)
            .and_then(|c| c.get(probe as usize))
        {
            // Single writer (this thread): load + store, no lock prefix.
            Some(c) => c.store(c.load(Relaxed).wrapping_add(1), Relaxed),
            None => {
                if let Some(c) = shm.global_counters().get(probe as usize) {
                    c.fetch_add(1, Relaxed);
                }
            }
        }
    }
    if action & ACTION_RECORD != 0 && control & CONTROL_RECORD != 0 {
        let args = if kind == KIND_EXIT as u32 {
            [frame.rax, frame.args[2], 0, 0, 0, 0]
        } else {
            frame.args
        };
        let ev = Event {
            tsc: rdtsc(),
            probe_id: probe,
            tid: t.tid.load(Relaxed),
            kind: kind as u8,
            nargs: if kind == KIND_EXIT as u32 { 2 } else { 6 },
            reserved: 0,
            reserved2: 0,
            args,
        };
        match shm.producer(slot) {
            Some(p) => {
                let mut cached = t.cached_tail.load(Relaxed);
                // SAFETY: the ring of `slot` belongs to this thread alone, and
                // the busy flag keeps a signal handler on this thread out.
                let ok = unsafe { p.push(&mut cached, &ev) };
                t.cached_tail.store(cached, Relaxed);
                if !ok {
                    check_heartbeat(shm);
                }
            }
            None => {
                shm.header().drops_no_thread.fetch_add(1, Relaxed);
            }
        }
    }
    let hits = t.hits.load(Relaxed).wrapping_add(1);
    t.hits.store(hits, Relaxed);
    if hits & HEARTBEAT_EVERY == 0 {
        check_heartbeat(shm);
    }
}

/// The fast path, called by every trampoline with the saved registers.
/// Returns 1 when the slow path must run (first hit of this thread).
/// Integer-only, panic-free by construction (no indexing, wrapping
/// arithmetic, `get` everywhere): it runs with only the general registers
/// saved.
pub(crate) extern "C" fn fast_hit(frame: *mut Frame, kind: u32) -> u32 {
    if cfg!(feature = "noop") {
        return 0;
    }
    let Some(shm) = crate::shm() else { return 0 };
    let h = shm.header();
    // Relaxed: a switch; seeing a change a few hits late is fine.
    let control = h.control.load(Relaxed);
    if control & CONTROL_ENABLED == 0 {
        return 0;
    }
    // SAFETY: the trampoline passes a pointer to the Frame on its stack.
    let frame = unsafe { &*frame };
    let Some((probe, action)) = shm.lookup_site(frame.key) else {
        h.site_misses.fetch_add(1, Relaxed);
        return 0;
    };
    if action == 0 {
        return 0;
    }
    let Some(t) = find_thread(thread_pointer()) else {
        return 1;
    };
    if t.busy.load(Relaxed) != 0 {
        h.reentries.fetch_add(1, Relaxed);
        return 0;
    }
    t.busy.store(1, Relaxed);
    // Signal fence: a handler interrupting this thread sees busy = 1.
    compiler_fence(SeqCst);
    act(shm, t, frame, kind, probe, action, control);
    compiler_fence(SeqCst);
    t.busy.store(0, Relaxed);
    0
}

/// The slow path: registers this thread (thread-table entry, shared-memory
/// thread slot, exit destructor), then handles the hit. xmm0–15 are saved
/// by the trampoline; libc may be called. Never unwinds.
pub(crate) extern "C" fn slow_hit(frame: *mut Frame, kind: u32) -> u32 {
    let r = std::panic::catch_unwind(|| {
        let Some(shm) = crate::shm() else { return };
        let tp = thread_pointer();
        if find_thread(tp).is_none() {
            register_thread(shm, tp);
        }
        if find_thread(tp).is_some() {
            fast_hit(frame, kind);
        } else {
            // No table entry to guard with: count globally, drop the event.
            // SAFETY: the trampoline passes a pointer to its Frame.
            let key = unsafe { (*frame).key };
            if let Some((probe, action)) = shm.lookup_site(key) {
                if action & ACTION_COUNT != 0 {
                    if let Some(c) = shm.global_counters().get(probe as usize) {
                        c.fetch_add(1, Relaxed);
                    }
                }
                if action & ACTION_RECORD != 0 {
                    shm.header().drops_no_thread.fetch_add(1, Relaxed);
                }
            }
        }
    });
    let _ = r;
    0
}

fn register_thread(shm: &Shm, tp: u64) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as u32;
    let mut i = table_index(tp);
    for _ in 0..MAX_THREADS {
        let e = &THREADS[i % MAX_THREADS];
        let k = e.key.load(Relaxed);
        if k == EMPTY || k == TOMBSTONE {
            // Only this thread uses key `tp`; the CAS arbitrates the entry
            // with other threads registering concurrently. Acquire pairs
            // with the Release store of TOMBSTONE in `thread_exit`.
            if e.key.compare_exchange(k, tp, Acquire, Relaxed).is_ok() {
                // A signal handler on this thread that hits between the CAS
                // and this store sees slot NO_SLOT (left by thread_exit):
                // it counts globally and drops, never touches a ring.
                e.busy.store(1, Relaxed);
                e.slot
                    .store(shm.claim_thread(tid).unwrap_or(NO_SLOT), Relaxed);
                e.tid.store(tid, Relaxed);
                e.hits.store(0, Relaxed);
                e.cached_tail.store(0, Relaxed);
                if let Some(key) = crate::exit_key() {
                    // SAFETY: key was created by pthread_key_create; the value
                    // is a pointer to a static entry.
                    unsafe {
                        libc::pthread_setspecific(
                            key,
                            e as *const ThreadEntry as *const libc::c_void,
                        )
                    };
                }
                e.busy.store(0, Relaxed);
                return;
            }
        }
        i = i.wrapping_add(1);
    }
}

/// `pthread_key` destructor: the thread is exiting.
pub(crate) extern "C" fn thread_exit(p: *mut libc::c_void) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: the value set in register_thread: a pointer into THREADS.
        let e = unsafe { &*(p as *const ThreadEntry) };
        if let Some(ctl) = crate::shm().and_then(|s| s.ring_ctl(e.slot.load(Relaxed))) {
            // Release pairs with the tracer's `state.load(Acquire)`: the ring's
            // last head is visible once EXITED is.
            ctl.state.store(THREAD_EXITED, Release);
        }
        e.slot.store(NO_SLOT, Relaxed);
        // Release pairs with the Acquire CAS in register_thread.
        e.key.store(TOMBSTONE, Release);
    });
}

/// `pthread_atfork` child handler: the child has one thread, whose thread
/// pointer equals its parent's; forget every entry so it claims its own
/// thread slot instead of writing into the parent's ring.
pub(crate) extern "C" fn after_fork_child() {
    for e in THREADS.iter() {
        e.key.store(EMPTY, Relaxed);
        e.busy.store(0, Relaxed);
    }
}
