//! A thread's life as the agent sees it: registration at its first hit
//! (thread-table entry, thread slot, shadow stack, exit destructor), the
//! stubs' view of its slot, its exit (slots given back), and `fork`.

use core::sync::atomic::compiler_fence;
use core::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use hotprobe_abi::fast::ThreadBlock;
use hotprobe_abi::{Shm, CONTROL_FOLLOW_FORKS};

use crate::hit::{
    registering, ThreadEntry, EMPTY, ENTRY_INIT, MAX_THREADS, NO_SLOT, PENDING_SLOT, THREADS,
    TOMBSTONE,
};

/// What a thread's TLS word points at while the agent itself calls a
/// function of libc (`pthread_setspecific` at registration, the calls of
/// an attach, `dlsym`): a hit there is the agent's own, not the
/// program's, and is neither counted nor recorded. Its key (0) matches no
/// memory's, so stubs send such hits to the generic path, which checks
/// for it first. Asynchronous signals are blocked for the call
/// ([`as_own_call`]): a signal handler's hits are the program's, and run
/// after it.
#[allow(clippy::declare_interior_mutable_const)]
static OWN_CALL: ThreadBlock = ENTRY_INIT.fast;
/// What a thread's TLS word points at once its exit destructor gave its
/// slots back: its later hits (other destructors, libc's thread teardown)
/// count into the global counters and their events are counted as lost,
/// rather than claiming a slot no destructor would give back. A new
/// thread's word starts at 0 (the TLS image), even on a reused stack.
#[allow(clippy::declare_interior_mutable_const)]
static EXITED: ThreadBlock = ENTRY_INIT.fast;

/// The TLS word of a thread in an own call (see [`OWN_CALL`]).
#[inline(always)]
pub(crate) fn own_call() -> u64 {
    &OWN_CALL as *const ThreadBlock as u64
}

/// The TLS word of a thread past its exit destructor (see [`EXITED`]).
#[inline(always)]
pub(crate) fn exited() -> u64 {
    &EXITED as *const ThreadBlock as u64
}

/// Whether the calling thread is in one of the agent's own calls.
#[inline(always)]
pub(crate) fn in_own_call() -> bool {
    crate::tls::get() == own_call()
}

/// Runs `f` (which calls libc) as the agent's own call: hits of probed
/// functions it reaches on this thread are not the program's.
pub(crate) fn as_own_call<R>(f: impl FnOnce() -> R) -> R {
    // Every signal blocked but the synchronous ones (a fault, or the
    // `int3` of an in-process trap on the function called, must be
    // delivered: blocked, the kernel would kill the process), by the
    // system call (libc's `sigprocmask` may be probed).
    let sync = [
        libc::SIGILL,
        libc::SIGTRAP,
        libc::SIGBUS,
        libc::SIGFPE,
        libc::SIGSEGV,
    ];
    let block: u64 = sync.iter().fold(!0, |m, s| m & !(1u64 << (s - 1)));
    let mut old: u64 = 0;
    // rt_sigprocmask(SIG_SETMASK, &block, &old, 8): valid 8-byte sets.
    let r = crate::orphan::syscall(
        libc::SYS_rt_sigprocmask,
        [
            libc::SIG_SETMASK as u64,
            &block as *const u64 as u64,
            &mut old as *mut u64 as u64,
            8,
        ],
    );
    let was = crate::tls::get();
    crate::tls::set(own_call());
    // Signal fences: the word is set around the call, as the code runs.
    compiler_fence(SeqCst);
    let out = f();
    compiler_fence(SeqCst);
    crate::tls::set(was);
    if r == 0 {
        // Back to the thread's own mask (pending signals run now).
        crate::orphan::syscall(
            libc::SYS_rt_sigprocmask,
            [libc::SIG_SETMASK as u64, &old as *const u64 as u64, 0, 8],
        );
    }
    out
}

/// The thread table: [`MAX_THREADS`] entries, page-aligned so that each
/// page holds whole entries ([`ENTRIES_A_PAGE`]). Most pages are never
/// touched: see [`used_entries`].
#[repr(C, align(4096))]
pub(crate) struct ThreadTable(pub(crate) [ThreadEntry; MAX_THREADS]);

impl core::ops::Deref for ThreadTable {
    type Target = [ThreadEntry; MAX_THREADS];
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

/// [`ThreadEntry::slot`]: a thread slot, [`NO_SLOT`] or [`PENDING_SLOT`],
/// held as the slot + 1 so that a fresh entry ([`NO_SLOT`]) is all zeros:
/// the thread table is then zero-initialised memory (`.bss`, anonymous),
/// not 2 MiB of the agent's file (`.data`), whose pages a read maps
/// read-only, fault-around and all, and a thread's first write then
/// copies, flushing the TLB of every CPU (see [`USED_PAGES`]).
#[repr(transparent)]
pub(crate) struct SlotWord(AtomicU32);

impl SlotWord {
    /// A word holding [`NO_SLOT`].
    pub(crate) const fn no_slot() -> Self {
        Self(AtomicU32::new(0))
    }

    /// The slot held.
    #[inline(always)]
    pub(crate) fn load(&self, order: Ordering) -> u32 {
        self.0.load(order).wrapping_sub(1)
    }

    /// Holds `slot`.
    #[inline(always)]
    pub(crate) fn store(&self, slot: u32, order: Ordering) {
        self.0.store(slot.wrapping_add(1), order)
    }
}

/// Thread-table entries a page holds.
const ENTRIES_A_PAGE: usize = hotprobe_abi::PAGE / core::mem::size_of::<ThreadEntry>();
const _: () = assert!(hotprobe_abi::PAGE.is_multiple_of(core::mem::size_of::<ThreadEntry>()));

/// Bit `p`: page `p` of the thread table may hold a claimed entry (set
/// before the claim; never cleared). An untouched page is all
/// `ENTRY_INIT`, so the walks over every thread ([`used_entries`]) skip
/// it: a read would map the shared zero page there, and the next thread
/// to claim an entry of it would pay a copy-on-write fault and its TLB
/// flush of every CPU (≈ 24 µs a thread in a VM; the attach's re-homing
/// walk used to map all 512 pages so).
static USED_PAGES: [AtomicU64; MAX_THREADS / ENTRIES_A_PAGE / 64] =
    [const { AtomicU64::new(0) }; MAX_THREADS / ENTRIES_A_PAGE / 64];

/// Notes that entry `i` may be claimed (a load alone once noted: a
/// thread without a slot comes here at every hit, and the words are
/// shared by all threads).
#[inline(always)]
fn note_used(i: usize) {
    if let Some((w, bit)) = used_bit(i).filter(|(w, bit)| w.load(Relaxed) & bit == 0) {
        w.fetch_or(bit, Relaxed);
    }
}

/// The [`USED_PAGES`] word and bit of entry `i`'s page.
#[inline(always)]
fn used_bit(i: usize) -> Option<(&'static AtomicU64, u64)> {
    let page = (i % MAX_THREADS) / ENTRIES_A_PAGE;
    Some((USED_PAGES.get(page / 64)?, 1 << (page % 64)))
}

/// Every thread-table entry that may have been claimed, with its index:
/// those of the pages [`note_used`] marked (the others are all empty).
pub(crate) fn used_entries() -> impl Iterator<Item = (usize, &'static ThreadEntry)> {
    THREADS
        .iter()
        .enumerate()
        .filter(|(i, _)| used_bit(*i).is_some_and(|(w, bit)| w.load(Relaxed) & bit != 0))
}

/// Registers the calling thread (thread pointer `tp`): thread-table
/// entry, shared-memory thread slot, shadow stack, exit destructor. True
/// when it has an entry afterwards. Atomics and system calls (`mmap`,
/// `madvise`, `gettid`) plus glibc's `pthread_setspecific` of a key below
/// 32 (a store into the thread descriptor, no allocation): callable from
/// the in-process trap's `SIGTRAP` handler too.
pub(crate) fn register_current(shm: &Shm, tp: u64) -> bool {
    crate::tls::set(registering());
    touch_entry(tp);
    match find_thread(tp) {
        None => register_thread(shm, tp, getpid(), gettid()),
        Some(e) if e.slot.load(Relaxed) == PENDING_SLOT => claim_slot(e, shm),
        Some(e) => set_fast(e, shm, e.slot.load(Relaxed)),
    }
    find_thread(tp).is_some()
}

/// Touches the first thread-table entry of thread pointer `tp` for
/// writing, before anything reads it: called where an unregistered
/// thread's hit first looks itself up. A read of an untouched page of the
/// table would map the shared zero page, and the claim's write would then
/// replace it: a copy-on-write fault whose TLB flush interrupts every
/// other CPU the process runs on (in a VM, ≈ 24 µs of every thread's
/// first hit: perf of `hotprobe-bench threadstart`, `count`'s whole extra
/// start). Written first (adding 0), the page is a plain fresh one.
#[inline(always)]
pub(crate) fn touch_entry(tp: u64) {
    let i = table_index(tp);
    if let Some(e) = THREADS.get(i) {
        note_used(i);
        touch_for_write(&e.key);
    }
}

/// Writes `w` without changing it (a locked add of 0), so that its page,
/// if untouched, comes in as a fresh writable one rather than as the
/// shared zero page a read would map. (An atomic add of 0 is compiled to
/// a plain load: hence the asm.)
#[inline(always)]
fn touch_for_write(w: &AtomicU64) {
    // SAFETY: a locked add of 0 to an atomic word: its value is unchanged
    // for every thread.
    unsafe {
        core::arch::asm!(
            "lock add qword ptr [{}], 0",
            in(reg) w.as_ptr(),
            options(nostack)
        )
    };
}

/// A system call without arguments, made here rather than through libc:
/// the agent must not run code of the program's libraries a tracer may have
/// probed (libc's `getpid`, counted by a trap probe, would count the
/// agent's calls too).
#[inline(always)]
fn syscall0(nr: libc::c_long) -> u64 {
    let r: u64;
    // SAFETY: only used for getpid and gettid, which take no argument, touch
    // no user memory and cannot fail; `syscall` clobbers rcx and r11.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") nr as u64 => r,
            out("rcx") _,
            out("r11") _,
            options(nostack, nomem)
        )
    };
    r
}

pub(crate) fn gettid() -> u32 {
    syscall0(libc::SYS_gettid) as u32
}

pub(crate) fn getpid() -> u32 {
    syscall0(libc::SYS_getpid) as u32
}

/// Gives entry `e` of the calling thread (a forked child's forking thread,
/// or a vfork child's: [`PENDING_SLOT`]) a thread slot of its own, owned
/// by this process and thread.
fn claim_slot(e: &'static ThreadEntry, shm: &Shm) {
    let was = e.fast.busy.swap(1, Relaxed);
    let tid = gettid();
    e.tid.store(tid, Relaxed);
    let slot = shm.claim_thread_for(getpid(), tid).unwrap_or(NO_SLOT);
    e.slot.store(slot, Relaxed);
    set_fast(e, shm, slot);
    crate::vfork::claimed(e, slot);
    e.fast.busy.store(was, Relaxed);
}

/// Registers thread `tp`, owned by process `pid` and thread `tid`: the
/// calling thread's own ids, or (a vfork child the tracer saw, see
/// `vfork::hotprobe_agent_vfork_child`) its parent's, for the parent.
/// Inlined into its callers: the hit paths' one libc call
/// (`pthread_setspecific`) stays in `register_current`, as checked by
/// hotprobe-fastpath's `agent_imports` test.
#[inline(always)]
pub(crate) fn register_thread(shm: &Shm, tp: u64, pid: u32, tid: u32) {
    let mut i = table_index(tp);
    for _ in 0..MAX_THREADS {
        let e = &THREADS[i % MAX_THREADS];
        let k = e.key.load(Relaxed);
        if k == EMPTY || k == TOMBSTONE {
            note_used(i);
            // Only this thread uses key `tp`; the CAS arbitrates the entry
            // with other threads registering concurrently. Acquire pairs
            // with the Release store of TOMBSTONE in `thread_exit`.
            if e.key.compare_exchange(k, tp, Acquire, Relaxed).is_ok() {
                // A signal handler on this thread that hits between the CAS
                // and this store sees slot NO_SLOT (left by thread_exit):
                // it counts globally and drops, never touches a ring.
                e.fast.busy.store(1, Relaxed);
                let slot = shm.claim_thread_for(pid, tid).unwrap_or(NO_SLOT);
                e.slot.store(slot, Relaxed);
                e.tid.store(tid, Relaxed);
                e.hits.store(0, Relaxed);
                e.hslot.store(0, Relaxed);
                // Before the stubs' view: it is keyed off unless `rdtsc` works.
                e.clock.store(crate::clock::kernel_mode(), Relaxed);
                set_fast(e, shm, slot);
                // The shadow stack is mapped at the thread's first hooked
                // return (`shadow_stack`), not here: a thread whose returns
                // are never hooked (`count`) makes no `mmap`. An entry
                // keeps the one an earlier owner mapped.
                e.shadow_refused.store(0, Relaxed);
                if let Some(key) = crate::exit_key() {
                    // SAFETY: key was created by pthread_key_create; the value
                    // is a pointer to a static entry.
                    as_own_call(|| unsafe {
                        libc::pthread_setspecific(
                            key,
                            e as *const ThreadEntry as *const libc::c_void,
                        )
                    });
                }
                e.fast.busy.store(0, Relaxed);
                return;
            }
        }
        i = i.wrapping_add(1);
    }
}

/// After a re-attach to new shared memory: every registered thread gets a
/// slot in it, and its stubs' view is re-pointed (its TLS word, which
/// points at its entry, stays; threads are stopped by the tracer).
pub(crate) fn rehome_threads(shm: &Shm) {
    // Threads are stopped (or there is only one): a first write to the
    // page of the used-pages bits costs no other CPU an interrupt now, as
    // it would at a thread's registration (see `touch_entry`).
    for w in USED_PAGES.iter() {
        touch_for_write(w);
    }
    crate::thread_memory::prepare_shadow_arena();
    let pid = getpid();
    for (_, e) in used_entries() {
        let k = e.key.load(Relaxed);
        if k == EMPTY || k == TOMBSTONE {
            continue;
        }
        forget_shadow_actions(e);
        if e.fast.busy.load(Relaxed) != 0 {
            // Stopped inside a stub or the agent, half-way through an
            // event of the earlier memory: its block stays that memory's
            // until the event is done (filled now, the stub committed an
            // unwritten event into the new rings: injected.rs's
            // `stubs_of_a_vanished_tracer_…`, 3 runs in 10). Its next hit
            // goes to the generic path (a stub key of 0 matches none),
            // which claims it a slot of the new memory (PENDING_SLOT).
            e.slot.store(PENDING_SLOT, Relaxed);
            e.fast.stub_key.store(0, Relaxed);
            continue;
        }
        let tid = e.tid.load(Relaxed);
        let slot = shm.claim_thread_for(pid, tid).unwrap_or(NO_SLOT);
        e.slot.store(slot, Relaxed);
        fill_fast(e, shm, slot);
    }
}

/// The returns an earlier memory's probes hooked on `e`'s stack still
/// return through the trampoline, but act no more: their probe ids are
/// another memory's (an exit recorded into the new memory under such an
/// id was seen: `stubs_of_a_vanished_tracer_…`). Threads are stopped.
fn forget_shadow_actions(e: &ThreadEntry) {
    let base = e.shadow.load(Relaxed) as *mut crate::hit::Shadow;
    if base.is_null() {
        return;
    }
    let d = (e.depth.load(Relaxed) as usize).min(crate::hit::SHADOW_CAP);
    let actions = crate::hit::SHADOW_RECORD
        | crate::hit::SHADOW_XMM
        | crate::capture::SHADOW_CAPTURE
        | crate::agg::SHADOW_AGG;
    for i in 0..d {
        // SAFETY: i < depth <= SHADOW_CAP: an entry of the thread's shadow
        // mapping, which the stopped thread is not using.
        unsafe { (*base.add(i)).flags &= !actions };
    }
}

/// Fills the stubs' view of thread slot `slot` and points this thread's
/// TLS word at it (0 when the thread has no slot: the stubs then send every
/// hit to the generic path, which counts globally).
fn set_fast(e: &'static ThreadEntry, shm: &Shm, slot: u32) {
    let counters = fill_fast(e, shm, slot);
    crate::tls::set(if counters != 0 {
        &e.fast as *const ThreadBlock as u64
    } else {
        0
    });
}

/// Fills `e`'s stub view of slot `slot`; returns its counters' address.
fn fill_fast(e: &'static ThreadEntry, shm: &Shm, slot: u32) -> u64 {
    let f = &e.fast;
    // 0: the first event refreshes the limit from the (new) ring's tail.
    f.limit.store(0, Relaxed);
    // Stubs built for another memory (an earlier tracer's) now take the
    // generic path, which knows none of their sites.
    f.stub_key.store(shm.stub_key(), Relaxed);
    f.header.store(shm.as_ptr() as u64, Relaxed);
    f.hook_entry.store(
        crate::hooked::hotprobe_agent_hook_entry as *const () as usize as u64,
        Relaxed,
    );
    f.mask
        .store(shm.layout().params.ring_capacity as u64 - 1, Relaxed);
    let counters = shm.thread_counters(slot).map_or(0, |c| c.as_ptr() as u64);
    f.counters.store(counters, Relaxed);
    f.ctl.store(
        shm.ring_ctl(slot)
            .map_or(0, |c| c as *const hotprobe_abi::RingCtl as u64),
        Relaxed,
    );
    f.events
        .store(shm.ring_events(slot).map_or(0, |p| p as u64), Relaxed);
    // From its head: a slot an earlier thread of the process wrote events
    // into (given back, claimed again) goes on past the pages it wrote.
    if let Some(c) = shm.ring_ctl(slot) {
        crate::thread_memory::prepare_ring(shm, slot, c.head.load(Relaxed));
    }
    // Stubs read the TSC: keyed off for a thread that may not.
    crate::clock::set_mode(e, Some(shm), e.clock.load(Relaxed));
    counters
}

/// `pthread_key` destructor: the thread is exiting. Its thread slot and
/// handler slot are given back (see `hotprobe_abi`'s `slots`: a ring
/// still holding events retires until the tracer drained it), and its
/// later hits count globally (see [`EXITED`]).
pub(crate) extern "C" fn thread_exit(p: *mut libc::c_void) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: the value set in register_thread: a pointer into THREADS.
        let e = unsafe { &*(p as *const ThreadEntry) };
        // A signal handler's hit from here on refuses (counts, no event).
        let was = e.fast.busy.swap(1, Relaxed);
        compiler_fence(SeqCst);
        let slot = e.slot.load(Relaxed);
        // Later hits of this thread (other destructors) count globally:
        // the entry may be claimed by another thread once released.
        crate::tls::set(exited());
        e.slot.store(NO_SLOT, Relaxed);
        compiler_fence(SeqCst);
        if let Some(shm) = crate::shm() {
            // After the thread's last write into the slot (program order,
            // and Release inside): the tracer drains what is left first.
            shm.release_thread(slot);
            match e.hslot.swap(0, Relaxed) {
                0 => {}
                h => shm.release_handler_slot(h - 1, e.tid.load(Relaxed)),
            }
        }
        // The next owner starts with an empty shadow stack.
        e.depth.store(0, Relaxed);
        e.fast.busy.store(was, Relaxed);
        // Release pairs with the Acquire CAS in register_thread.
        e.key.store(TOMBSTONE, Release);
    });
}

/// `pthread_atfork` child handler. The child has one thread, the forking
/// one, whose thread pointer, stack and shadow stack (private memory) are
/// copies of its parent's, and the shared memory, which is the parent's.
/// Without [`CONTROL_FOLLOW_FORKS`] the agent goes dormant here; with it,
/// the child's threads get slots of their own (see there).
///
/// Either way: the other threads' table entries are dropped (those threads
/// do not exist here), the forking thread keeps its entry (its hooked
/// returns must still find their shadow entries: the return trampoline
/// stays correct in the child) but not its slot, which is the parent's,
/// and its TLS word is cleared, so that a per-site stub still reached sends
/// its hit to the generic path. No allocation; only `gettid`/`getpid`.
pub(crate) extern "C" fn after_fork_child() {
    let _ = std::panic::catch_unwind(|| {
        let follow = crate::shm()
            .is_some_and(|s| s.header().control.load(Relaxed) & CONTROL_FOLLOW_FORKS != 0);
        let tp = thread_pointer();
        let mine = find_thread(tp);
        forget_other_threads(tp, mine);
        crate::tls::set(0);
        // A child's shared mappings start with no page mapped.
        crate::thread_memory::forget_ring_pool();
        if follow {
            crate::forget_attaching();
        } else {
            crate::go_dormant();
        }
        let Some(e) = mine else { return };
        let was = e.fast.busy.swap(1, Relaxed);
        e.tid.store(gettid(), Relaxed);
        e.slot.store(NO_SLOT, Relaxed);
        // The parent's handler slot is the parent's thread's.
        e.hslot.store(0, Relaxed);
        clear_fast(e);
        match crate::shm() {
            // Hooked frames left by the parent return in the child: their
            // exits are recorded there, in a slot of the child's.
            Some(shm) if e.depth.load(Relaxed) > 0 => {
                let slot = shm
                    .claim_thread_for(getpid(), e.tid.load(Relaxed))
                    .unwrap_or(NO_SLOT);
                e.slot.store(slot, Relaxed);
                set_fast(e, shm, slot);
            }
            Some(_) => e.slot.store(PENDING_SLOT, Relaxed),
            None => {}
        }
        e.fast.busy.store(was, Relaxed);
    });
}

/// Drops every thread-table entry but `mine` (the calling thread's, keyed
/// `tp`). Open addressing: the entries on `tp`'s probe path, before its
/// own, become tombstones (its lookup walks over them), the others empty.
fn forget_other_threads(tp: u64, mine: Option<&'static ThreadEntry>) {
    let at = mine.map(|m| {
        THREADS
            .iter()
            .position(|e| core::ptr::eq(e, m))
            .unwrap_or(0)
    });
    let start = table_index(tp) % MAX_THREADS;
    for (i, e) in used_entries() {
        if Some(i) == at {
            continue;
        }
        // On the path from `start` to `at` (wrapping around the table).
        let on_path = at.is_some_and(|at| {
            let d_at = (at + MAX_THREADS - start) % MAX_THREADS;
            let d_i = (i + MAX_THREADS - start) % MAX_THREADS;
            d_i < d_at
        });
        e.key
            .store(if on_path { TOMBSTONE } else { EMPTY }, Relaxed);
        e.slot.store(NO_SLOT, Relaxed);
        e.hslot.store(0, Relaxed);
        e.depth.store(0, Relaxed);
        e.fast.busy.store(0, Relaxed);
    }
}

/// Points `e`'s stub view nowhere (the forked child's copy of the parent's
/// slot addresses).
pub(crate) fn clear_fast(e: &ThreadEntry) {
    let f = &e.fast;
    f.counters.store(0, Relaxed);
    f.ctl.store(0, Relaxed);
    f.events.store(0, Relaxed);
    f.limit.store(0, Relaxed);
    f.header.store(0, Relaxed);
    f.hook_entry.store(0, Relaxed);
    f.stub_key.store(0, Relaxed);
}

/// The shadow stack of thread entry `e` (of the calling thread, its busy
/// flag held: no signal handler of the thread hooks a return meanwhile),
/// mapped at its first hooked return; null when that failed (its returns
/// are then return misses, counted).
#[inline(always)]
pub(crate) fn shadow_stack(e: &ThreadEntry) -> *mut crate::hit::Shadow {
    let base = e.shadow.load(Relaxed);
    if base != 0 || e.shadow_refused.load(Relaxed) != 0 {
        return base as *mut crate::hit::Shadow;
    }
    new_shadow_stack(e)
}

#[cold]
fn new_shadow_stack(e: &ThreadEntry) -> *mut crate::hit::Shadow {
    let p = crate::thread_memory::map_shadow();
    if p == 0 {
        e.shadow_refused.store(1, Relaxed);
    } else {
        e.shadow.store(p, Relaxed);
    }
    p as *mut crate::hit::Shadow
}

/// The calling thread's handler slot, claimed at its first handler call
/// and kept in its entry (the thread is registered first if need be, so
/// that its exit gives the slot back). None when no slot is free, or the
/// thread has no entry (the table is full, or it is past its exit).
pub(crate) fn handler_slot(shm: &Shm) -> Option<&hotprobe_abi::HandlerSlot> {
    let tp = thread_pointer();
    let e = match find_thread(tp) {
        Some(e) => e,
        None => {
            let w = crate::tls::get();
            if w == exited() || w == registering() {
                return None;
            }
            register_current(shm, tp);
            find_thread(tp)?
        }
    };
    let tid = e.tid.load(Relaxed);
    if let Some(s) = e
        .hslot
        .load(Relaxed)
        .checked_sub(1)
        .and_then(|i| shm.handler_slot_of(i, tid))
    {
        return Some(s);
    }
    let (i, s) = shm.claim_handler_slot(tid)?;
    e.hslot.store(i + 1, Relaxed);
    Some(s)
}

/// The calling thread's thread pointer (`fs:0`), which keys its entry.
#[inline(always)]
pub(crate) fn thread_pointer() -> u64 {
    let tp: u64;
    // SAFETY: reads the first word of the TCB, which the x86-64 TLS ABI
    // (glibc and musl) makes hold the thread pointer itself; always mapped.
    unsafe {
        core::arch::asm!("mov {}, qword ptr fs:[0]", out(reg) tp, options(nostack, readonly, preserves_flags))
    };
    tp
}

/// The first slot of [`THREADS`] probed for thread pointer `tp`.
#[inline(always)]
pub(crate) fn table_index(tp: u64) -> usize {
    (tp.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - MAX_THREADS.trailing_zeros())) as usize
}

/// The registered entry of thread pointer `tp` (open addressing).
#[inline(always)]
pub(crate) fn find_thread(tp: u64) -> Option<&'static ThreadEntry> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The thread table must be zero-initialised memory (`.bss`): were a
    /// fresh entry not all zero bytes, the table would be 2 MiB of the
    /// agent's file, whose pages a read maps read-only (fault-around and
    /// all) and a thread's first write copies, flushing the TLB of every
    /// CPU the process runs on.
    #[test]
    fn a_fresh_thread_entry_is_all_zero_bytes_and_has_no_slot() {
        let e = ENTRY_INIT;
        // SAFETY: the bytes of a local value, read within its size.
        let bytes = unsafe {
            core::slice::from_raw_parts(
                &e as *const ThreadEntry as *const u8,
                core::mem::size_of::<ThreadEntry>(),
            )
        };
        assert!(bytes.iter().all(|b| *b == 0));
        assert_eq!(e.slot.load(Relaxed), NO_SLOT);
        e.slot.store(PENDING_SLOT, Relaxed);
        assert_eq!(e.slot.load(Relaxed), PENDING_SLOT);
        e.slot.store(0, Relaxed);
        assert_eq!(e.slot.load(Relaxed), 0);
    }

    /// Each page of the table holds whole entries, and the table starts on
    /// a page: the used-pages bits describe whole pages.
    #[test]
    fn the_thread_table_is_page_aligned() {
        assert_eq!(THREADS.as_ptr() as usize % hotprobe_abi::PAGE, 0);
        assert_eq!(
            ENTRIES_A_PAGE * core::mem::size_of::<ThreadEntry>(),
            hotprobe_abi::PAGE
        );
    }
}
