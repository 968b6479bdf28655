//! Stacks at a hit (issue 24, `--stacks`): the agent walks the hitting
//! thread's user stack at a function entry and adds it to the stack table
//! of the stacks region ([`hotprobe_abi::stacks`]), where the tracer reads
//! and symbolizes it afterwards.
//!
//! The walk ([`hotprobe_abi::stacks::walk`]) follows the tracer's
//! compiled `.eh_frame` rows, frame pointers where a module has none, and
//! maps return addresses the agent swapped for its return trampoline back
//! through the thread's shadow stack, and those the tracer swapped for its
//! trap return trampoline (a trap `%return` probe) through the return
//! instances it publishes (`Shm::find_return`). It reads only the thread's own
//! stack, between the hit's stack pointer and the end of the readable
//! region (a stack mapping the tracer published) that holds it: never
//! memory the program could have unmapped, and no `SIGSEGV` handler. A
//! stack not published yet (a thread started since the last publication)
//! is read with `process_vm_readv` on the agent's own pid, a system call a
//! word, which fails where memory is not mapped instead of faulting.
//! The tables may change under the walk (a library loaded): the region's
//! sequence is read before and after, and a walk that saw a change is
//! made again, a few times, then dropped and counted (`torn`). No allocation, no lock, no system call.

use core::sync::atomic::Ordering::{Acquire, Relaxed};

use core::sync::atomic::{AtomicU32, AtomicU64};

use hotprobe_abi::stacks::{find_row, walk, StackRow, StacksView, WalkStart, MAX_FRAMES};
use hotprobe_abi::Shm;

use crate::hit::{return_trampoline, Shadow, ThreadEntry, MAX_THREADS, THREADS};
use crate::trampoline::Frame;

/// Captures the stack of an entry hit of `probe` (the trampoline's
/// `frame`: `slot` is the function's return-address slot) into the stack
/// table. Called with the thread's busy flag held.
#[inline(never)]
pub(crate) fn capture(shm: &Shm, t: &ThreadEntry, frame: &Frame, probe: u32) {
    // The entry event this hit records carries the stack's id (0: none).
    if let Some(last) = LAST_STACK.get(thread_index(t)) {
        last.store(0, Relaxed);
    }
    // Borrowed where `of` left it: moving the view would copy it with
    // vector moves, which the fast path may not use.
    let found = StacksView::of(shm);
    let Some(view) = found.as_ref() else {
        return;
    };
    let Some(scratch) = thread_scratch(t) else {
        return;
    };
    capture_with(shm, view, scratch, t, frame, probe);
}

/// Walks a torn walk gets before it is dropped and counted. The tracer
/// rewrites the tables at a library load and at each thread start (its
/// stack published); a thread whose own stack is not published yet walks
/// with a system call a word, long enough to see several of those while
/// other threads start: with 4 attempts a thread still lost all 5 of its
/// stacks in 1 run of 25 (`count_stacks_of_threads_started_later`), with
/// 64 none in 25. Bounded: a torn walk costs only while tables change.
const WALK_ATTEMPTS: usize = 64;

/// How one walk of [`walk_once`] ended.
enum Walk {
    /// Stored, or nothing to store (no return slot, an unreadable word).
    Done,
    /// The tables changed under it (or were being changed): walk again.
    Torn,
}

/// [`capture`] with the region's view and the thread's scratch memory
/// (out of line, so that the view is not copied: the fast path may touch
/// no vector register, and struct copies compile to `movups`). A walk the
/// tables changed under is made again, up to [`WALK_ATTEMPTS`] times,
/// before it is dropped and counted (`torn`): a thread started since the
/// last publication lost its first stack whenever the tracer published
/// its stack during the walk (1 stack in 20, 3 runs in 20).
#[inline(never)]
fn capture_with(
    shm: &Shm,
    view: &StacksView,
    scratch: &mut Scratch,
    t: &ThreadEntry,
    frame: &Frame,
    probe: u32,
) {
    for attempt in 0..WALK_ATTEMPTS {
        if let Walk::Done = walk_once(shm, view, scratch, t, frame, probe, attempt == 0) {
            return;
        }
        core::hint::spin_loop();
    }
    view.ctl().torn.fetch_add(1, Relaxed);
}

/// One walk of [`capture_with`]; `first`: count a stack without a
/// published region once, not per attempt.
#[inline(never)]
fn walk_once(
    shm: &Shm,
    view: &StacksView,
    scratch: &mut Scratch,
    t: &ThreadEntry,
    frame: &Frame,
    probe: u32,
    first: bool,
) -> Walk {
    let ctl = view.ctl();
    let slot = frame.slot;
    if slot == 0 {
        return Walk::Done;
    }
    // The trampoline pushed the program's rbp right below the site key,
    // which sits right below `slot` (see `trampoline`).
    // SAFETY: `slot - 16` is the trampoline's own saved-rbp word on this
    // thread's stack, written before the fast path was called.
    let rbp = unsafe { (slot.wrapping_sub(16) as *const u64).read() };
    let seq = ctl.seq.load(Acquire);
    if seq & 1 != 0 {
        return Walk::Torn;
    }
    // Reads stay on this thread's stack: [slot, end of its region).
    let end = view
        .regions()
        .iter()
        .find(|r| r.start <= slot && slot < r.end)
        .map_or(0, |r| r.end);
    // A stack the tracer has not published yet (a thread started since:
    // the tracer publishes its stack at the thread's creation event, after
    // the thread runs): words are read with `process_vm_readv` on our own
    // pid, which fails with EFAULT where memory is not mapped instead of
    // faulting — a system call a word, until the tables catch up. Never in
    // seccomp strict mode (any other system call kills the thread).
    let safe_reads = end == 0 && t.clock.load(Relaxed) != crate::clock::CLOCK_NONE;
    if end == 0 {
        if first {
            ctl.no_region.fetch_add(1, Relaxed);
        }
        if !safe_reads {
            return Walk::Done;
        }
    }
    let pid = if safe_reads {
        crate::threads::getpid()
    } else {
        0
    };
    let read = |addr: u64| -> Option<u64> {
        if addr < slot || !addr.is_multiple_of(8) {
            return None;
        }
        if safe_reads {
            // At most 8 MiB above the hit's stack pointer (the default
            // stack size): garbage pointers go no further.
            if addr - slot > STACK_SPAN {
                return None;
            }
            return read_word_safely(pid, addr);
        }
        if addr > end.checked_sub(8)? {
            return None;
        }
        // SAFETY: `addr` lies between this thread's stack pointer at the
        // hit and the end of the stack mapping holding it, as the tracer
        // read it from the maps: mapped, readable memory of this thread.
        Some(unsafe { (addr as *const u64).read_volatile() })
    };
    let tramp = return_trampoline();
    let shadow = t.shadow.load(Relaxed) as *const Shadow;
    let depth = t.depth.load(Relaxed) as usize;
    let rows = view.rows();
    let cache = thread_cache(t);
    let lookup = |pc: u64| -> Option<StackRow> {
        let key = pc | (seq & 0xffff) << 48;
        let e = cache.and_then(|c| c.get(cache_index(pc)));
        if let Some(e) = e {
            if e.key.load(Relaxed) == key {
                return Some(unpack(pc, e.rule.load(Relaxed)));
            }
        }
        let row = find_row(rows, pc).copied();
        if let (Some(e), Some(r)) = (e, row) {
            e.rule.store(pack(&r), Relaxed);
            e.key.store(key, Relaxed);
        }
        row
    };
    let tid = t.tid.load(Relaxed);
    // The tracer's out-of-line regions (its trap return trampoline among
    // them), read once: the few in use.
    let mut total = 0usize;
    for r in shm.trap_regions() {
        let end = r.end.load(Acquire);
        if end == 0 {
            continue;
        }
        if let (Some(s), Some(e)) = (
            scratch.region_starts.get_mut(total),
            scratch.region_ends.get_mut(total),
        ) {
            *s = r.start.load(Relaxed);
            *e = end;
        }
        total += 1;
    }
    let n_regions = total.min(SCRATCH_REGIONS);
    let many_regions = total > SCRATCH_REGIONS;
    let starts = scratch.region_starts.get(..n_regions).unwrap_or(&[]);
    let ends = scratch.region_ends.get(..n_regions).unwrap_or(&[]);
    let in_trap_region = |w: u64| {
        if many_regions {
            return shm.in_trap_region(w);
        }
        starts.iter().zip(ends).any(|(&s, &e)| w >= s && w < e)
    };
    let fix = |at: u64, word: u64| -> Option<u64> {
        if word != tramp {
            // A return through the tracer's trap return trampoline (a
            // trap `%return` probe): it published the real address.
            if in_trap_region(word) {
                return Some(shm.find_return(tid, at).unwrap_or(word));
            }
            return Some(word);
        }
        if shadow.is_null() {
            return None;
        }
        // The newest shadow entry of this slot holds the real address.
        (0..depth).rev().find_map(|i| {
            // SAFETY: i < depth ≤ SHADOW_CAP entries of the thread's
            // shadow mapping; only this thread writes it.
            let e = unsafe { *shadow.add(i) };
            (e.slot == at).then_some(e.real)
        })
    };
    let frames = &mut scratch.frames;
    let Some(first_word) = read(slot) else {
        return Walk::Done;
    };
    let start = WalkStart {
        ret: first_word,
        rsp: slot.wrapping_add(8),
        rbp,
    };
    let Some(ret) = fix(slot, first_word) else {
        return Walk::Done;
    };
    let start = WalkStart { ret, ..start };
    let out = walk(lookup, start, read, fix, frames);
    // Pairs with the tracer's Release increment after it rewrote tables.
    if ctl.seq.load(Acquire) != seq {
        return Walk::Torn;
    }
    ctl.captured.fetch_add(1, Relaxed);
    if out.truncated {
        ctl.truncated.fetch_add(1, Relaxed);
    }
    let id = view.add_with_id(probe, frames.get(..out.depth).unwrap_or(&[]), out.truncated);
    if let (Some(last), Some(id)) = (LAST_STACK.get(thread_index(t)), id) {
        last.store(id, Relaxed);
    }
    Walk::Done
}

#[allow(clippy::declare_interior_mutable_const)]
const NO_STACK: AtomicU32 = AtomicU32::new(0);

/// Per thread-table entry: the id of the stack its last [`capture`]
/// stored (0: none), which the entry event it records carries
/// (`hotprobe_abi::Event::reserved2`). Written and read by the thread
/// itself, with its busy flag held.
static LAST_STACK: [AtomicU32; MAX_THREADS] = [NO_STACK; MAX_THREADS];

/// The id of the stack thread `t`'s last [`capture`] stored (0: none).
#[inline(always)]
pub(crate) fn last_stack(t: &ThreadEntry) -> u32 {
    LAST_STACK
        .get(thread_index(t))
        .map_or(0, |l| l.load(Relaxed))
}

/// Rows cached per thread (direct-mapped by return address): a walk of
/// the same stacks again finds its rows without the binary search over
/// the whole table (12 frames: 1.1 µs → see docs/PERFORMANCE.md).
const CACHE_ROWS: usize = 64;

/// One cached row: `key` = the looked-up pc with the table's sequence in
/// bits 48–63 (a rewrite of the tables invalidates it), `rule` the row
/// packed by [`pack`]. Single writer: the thread (its busy flag keeps its
/// signal handlers out).
struct CacheEntry {
    key: AtomicU64,
    rule: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const ENTRY: CacheEntry = CacheEntry {
    key: AtomicU64::new(0),
    rule: AtomicU64::new(0),
};
#[allow(clippy::declare_interior_mutable_const)]
const THREAD_CACHE: [CacheEntry; CACHE_ROWS] = [ENTRY; CACHE_ROWS];

/// Per thread-table entry (zero pages until a thread walks: 1 KiB each).
static CACHE: [[CacheEntry; CACHE_ROWS]; MAX_THREADS] = [THREAD_CACHE; MAX_THREADS];

/// The cache of thread `t` (its index in the thread table).
fn thread_cache(t: &ThreadEntry) -> Option<&'static [CacheEntry; CACHE_ROWS]> {
    let base = THREADS.as_ptr() as usize;
    let i =
        (t as *const ThreadEntry as usize).wrapping_sub(base) / core::mem::size_of::<ThreadEntry>();
    CACHE.get(i)
}

#[inline(always)]
fn cache_index(pc: u64) -> usize {
    (pc.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 57) as usize % CACHE_ROWS
}

/// A row's rule in one word (its `pc` is not kept: the entry's key is).
fn pack(r: &StackRow) -> u64 {
    (r.cfa_off as u32 as u64)
        | (r.rbp_off as u16 as u64) << 32
        | (r.cfa_reg as u64) << 48
        | (r.rbp_rule as u64) << 56
}

fn unpack(pc: u64, w: u64) -> StackRow {
    StackRow {
        pc,
        cfa_off: w as u32 as i32,
        rbp_off: (w >> 32) as u16 as i16,
        cfa_reg: (w >> 48) as u8,
        rbp_rule: (w >> 56) as u8,
    }
}

/// How far above the hit's stack pointer a walk of an unpublished stack
/// reads.
const STACK_SPAN: u64 = 8 << 20;

/// The word at `addr` of this process, read with `process_vm_readv`:
/// `None` (EFAULT) where it is not mapped readable, never a fault (the
/// primitive typed captures share, `saferead`).
#[cold]
fn read_word_safely(pid: u32, addr: u64) -> Option<u64> {
    crate::saferead::read_word(pid, addr)
}

/// Trap regions a walk keeps at hand (more: scanned in shared memory).
const SCRATCH_REGIONS: usize = 8;

/// A thread's working memory for its walks (static, not on the stack:
/// zeroing or copying arrays compiles to vector stores or `memset`, which
/// the fast path may not use). Only the thread itself uses its scratch,
/// with its busy flag held (no signal handler of its own re-enters).
pub(crate) struct Scratch {
    frames: [u64; MAX_FRAMES],
    region_starts: [u64; SCRATCH_REGIONS],
    region_ends: [u64; SCRATCH_REGIONS],
}

struct ScratchCell(core::cell::UnsafeCell<Scratch>);
// SAFETY: each cell is used by one thread at a time (its thread-table
// entry's), with the thread's busy flag held.
unsafe impl Sync for ScratchCell {}

#[allow(clippy::declare_interior_mutable_const)]
const SCRATCH_INIT: ScratchCell = ScratchCell(core::cell::UnsafeCell::new(Scratch {
    frames: [0; MAX_FRAMES],
    region_starts: [0; SCRATCH_REGIONS],
    region_ends: [0; SCRATCH_REGIONS],
}));

/// Per thread-table entry (zero pages until a thread walks).
static SCRATCH: [ScratchCell; MAX_THREADS] = [SCRATCH_INIT; MAX_THREADS];

fn thread_index(t: &ThreadEntry) -> usize {
    let base = THREADS.as_ptr() as usize;
    (t as *const ThreadEntry as usize).wrapping_sub(base) / core::mem::size_of::<ThreadEntry>()
}

/// Thread `t`'s scratch memory.
#[allow(clippy::mut_from_ref)]
fn thread_scratch(t: &ThreadEntry) -> Option<&mut Scratch> {
    let cell = SCRATCH.get(thread_index(t))?;
    // SAFETY: only thread `t` walks with its entry's scratch, with its
    // busy flag held: no other reference to it exists meanwhile.
    Some(unsafe { &mut *cell.0.get() })
}
