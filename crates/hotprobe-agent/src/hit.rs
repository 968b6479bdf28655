//! What a hit does: the fast path (site lookup, per-thread state, count,
//! record) and the slow path (a thread's first hit).
//!
//! Per-thread state lives in a static open-addressing table keyed by the
//! thread pointer (`fs:[0]`, which the x86-64 TLS ABI makes point to
//! itself): no `#[thread_local]`, no `__tls_get_addr` (which may `malloc`
//! when the agent was `dlopen`ed), no lock, no allocation. A thread's first
//! hit claims an entry with a CAS and a thread slot (ring + counters) in the
//! shared memory; a `pthread_key` destructor gives both back when the thread
//! exits (`threads`: registration, exit, fork). Time stamps come from the
//! thread's clock (`clock`: `rdtsc`, or the `clock_gettime` system call
//! where `rdtsc` faults, or none in seccomp strict mode: the event is
//! refused, counted).
//!
//! Nothing is lost silently. A hit that finds its thread already inside the
//! agent or a stub (`busy`: a signal handler interrupting a probed function
//! on the same thread) or still registering (its TLS word points at
//! [`REGISTERING`]) still counts — a counter increment is one `inc` on the
//! thread's own counter, which a handler cannot split — but writes no
//! event and hooks no return: each event it cannot write is counted per
//! probe ([`Shm::note_missed`]) and per thread ([`hotprobe_abi::RingCtl::refused`],
//! or the header's `drops_no_thread` for a thread without a ring yet), as
//! are events lost to a full ring or to a thread without a slot.

use core::sync::atomic::Ordering::{Relaxed, SeqCst};
use core::sync::atomic::{compiler_fence, AtomicU32, AtomicU64};

use hotprobe_abi::fast::ThreadBlock;
use hotprobe_abi::{
    Event, Shm, ACTION_AGG, ACTION_ALT_COUNTER, ACTION_CAPTURE, ACTION_COUNT, ACTION_COUNTER_SHIFT,
    ACTION_EXIT, ACTION_RECORD, CONTROL_ENABLED, CONTROL_RECORD, EVENT_XMM, EXIT_UNWOUND,
    KIND_ENTRY, KIND_EXIT, KIND_HIT, STATUS_ORPHANED,
};

pub(crate) use crate::threads::{find_thread, thread_pointer};
use crate::trampoline::Frame;

/// Entries of the thread table (threads alive at once, with some slack;
/// a power of two): the most threads alive at once that get a thread
/// slot, whatever the tracer's cap.
pub(crate) const MAX_THREADS: usize = 16384;
pub(crate) const EMPTY: u64 = 0;
pub(crate) const TOMBSTONE: u64 = u64::MAX;
pub(crate) const NO_SLOT: u32 = u32::MAX;
/// [`ThreadEntry::slot`] of the forking thread in a child that follows
/// forks: it claims a slot of its own at its next hit (slow path).
pub(crate) const PENDING_SLOT: u32 = u32::MAX - 1;
/// Check the tracer's heartbeat every this many hits of a thread (mask).
const HEARTBEAT_EVERY: u32 = 1024 - 1;

/// Agent-private state of one thread (single writer: that thread, except
/// for `key` which is claimed by CAS and reset at thread exit or fork).
#[repr(C, align(64))]
pub(crate) struct ThreadEntry {
    /// What the tracer's per-site stubs read (first: the TLS word points
    /// at the entry and at this block alike); holds `busy` and the ring's
    /// write `limit`.
    pub(crate) fast: ThreadBlock,
    pub(crate) key: AtomicU64,
    pub(crate) slot: crate::threads::SlotWord,
    pub(crate) tid: AtomicU32,
    pub(crate) hits: AtomicU32,
    /// The thread's shadow stack ([`Shadow`] × [`SHADOW_CAP`], mapped at
    /// its first hooked return, see `threads::shadow_stack`; 0 before, or
    /// if that failed). An entry keeps it for its next owners.
    pub(crate) shadow: AtomicU64,
    /// Mapping the shadow stack failed for this owner: not tried again.
    pub(crate) shadow_refused: AtomicU32,
    /// Live entries of the shadow stack.
    pub(crate) depth: AtomicU32,
    /// The thread's clock mode (`clock::CLOCK_*`).
    pub(crate) clock: AtomicU32,
    /// Its handler slot's index + 1 (0: none yet).
    pub(crate) hslot: AtomicU32,
}

/// One shadow-stack entry: a hooked return.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Shadow {
    /// Address of the return-address slot on the thread's stack.
    pub(crate) slot: u64,
    /// The real return address.
    pub(crate) real: u64,
    /// Probe id of the function.
    pub(crate) probe: u32,
    /// [`SHADOW_RESTORED`] while an exception unwinds through the frame.
    pub(crate) flags: u32,
}
/// Entries per thread shadow stack (the `maxactive` of return probes).
pub(crate) const SHADOW_CAP: usize = 4096;
pub(crate) const SHADOW_BYTES: usize = SHADOW_CAP * core::mem::size_of::<Shadow>();
/// [`Shadow::flags`]: the real return address was put back in the slot.
pub(crate) const SHADOW_RESTORED: u32 = 1;
/// [`Shadow::flags`]: the return is recorded (the site's action has `record`).
pub(crate) const SHADOW_RECORD: u32 = 2;
/// [`Shadow::flags`]: the return also records xmm0 (the site's action has
/// an xmm layout: a `float`/`double` return value).
pub(crate) const SHADOW_XMM: u32 = 4;

#[allow(clippy::declare_interior_mutable_const)]
pub(crate) const ENTRY_INIT: ThreadEntry = ThreadEntry {
    fast: ThreadBlock {
        counters: AtomicU64::new(0),
        ctl: AtomicU64::new(0),
        events: AtomicU64::new(0),
        mask: AtomicU64::new(0),
        limit: AtomicU64::new(0),
        hook_entry: AtomicU64::new(0),
        header: AtomicU64::new(0),
        stub_key: AtomicU32::new(0),
        busy: AtomicU32::new(0),
    },
    key: AtomicU64::new(EMPTY),
    slot: crate::threads::SlotWord::no_slot(),
    tid: AtomicU32::new(0),
    hits: AtomicU32::new(0),
    shadow: AtomicU64::new(0),
    shadow_refused: AtomicU32::new(0),
    depth: AtomicU32::new(0),
    clock: AtomicU32::new(0),
    hslot: AtomicU32::new(0),
};

/// The thread table, page-aligned (see [`crate::threads::ThreadTable`]).
pub(crate) static THREADS: crate::threads::ThreadTable =
    crate::threads::ThreadTable([ENTRY_INIT; MAX_THREADS]);

/// What a thread's TLS word points at while the thread registers (the slow
/// path, which may take a while: a system call to fault its ring in): its
/// key (0) matches no memory's, so stubs send hits to the generic path, and
/// the generic path, finding it, counts them into the global counters and
/// refuses their events instead of registering the thread a second time
/// from a signal handler.
#[allow(clippy::declare_interior_mutable_const)]
static REGISTERING: ThreadBlock = ENTRY_INIT.fast;

#[inline(always)]
pub(crate) fn registering() -> u64 {
    &REGISTERING as *const ThreadBlock as u64
}

/// Adds one to a counter of the calling thread's own: one `inc` (no `lock`:
/// no other thread writes it), so that a signal handler on this thread
/// counting into the same counter cannot lose the increment it interrupts.
#[inline(always)]
pub(crate) fn bump(c: &AtomicU64) {
    // SAFETY: `c` is a valid, aligned u64 in memory this thread may write;
    // `inc` only changes that word and the flags.
    unsafe {
        core::arch::asm!("inc qword ptr [{}]", in(reg) c.as_ptr(), options(nostack));
    }
}

/// Counter index of a hit of `probe` with `action`.
#[inline(always)]
fn counter_of(probe: u32, action: u32) -> u32 {
    if action & ACTION_ALT_COUNTER != 0 {
        (action & hotprobe_abi::ACTION_COUNTER_MASK) >> ACTION_COUNTER_SHIFT
    } else {
        probe
    }
}

/// `n` events of `probe` were not written: counted per probe and per
/// thread (the ring's `refused`, or `drops_no_thread` for a thread
/// without a ring). Locked adds: this runs in signal handlers.
#[cold]
#[inline(never)]
pub(crate) fn refuse_events(shm: &Shm, ring: Option<&hotprobe_abi::RingCtl>, probe: u32, n: u64) {
    for _ in 0..n {
        shm.note_missed(probe);
    }
    match ring {
        Some(ctl) => {
            ctl.refused.fetch_add(n, Relaxed);
        }
        None => {
            shm.header().drops_no_thread.fetch_add(n, Relaxed);
        }
    }
}

/// A hit the agent cannot take in full: the thread is already inside the
/// agent or a stub (a signal handler interrupted it there), or registering
/// (`t` None). It counts (the thread's own counter with one `inc`, or the
/// global one), but writes no event and hooks no return; what it would
/// have recorded is counted as refused.
#[cold]
#[inline(never)]
fn refuse(shm: &Shm, t: Option<&ThreadEntry>, kind: u32, probe: u32, action: u32, control: u32) {
    let h = shm.header();
    h.reentries.fetch_add(1, Relaxed);
    let slot = t.map_or(NO_SLOT, |t| t.slot.load(Relaxed));
    if action & ACTION_COUNT != 0 {
        let counter = counter_of(probe, action) as usize;
        match shm.thread_counters(slot).and_then(|c| c.get(counter)) {
            Some(c) => bump(c),
            None => {
                if let Some(c) = shm.global_counters().get(counter) {
                    c.fetch_add(1, Relaxed);
                }
            }
        }
    }
    if action & ACTION_AGG != 0 {
        crate::agg::refused(shm, probe);
    }
    let hooks = action & ACTION_EXIT != 0 && kind == KIND_ENTRY as u32;
    if hooks {
        h.return_misses.fetch_add(1, Relaxed);
    }
    if action & ACTION_RECORD != 0 && control & CONTROL_RECORD != 0 {
        // The entry's event, and its exit's: the return is not hooked.
        refuse_events(shm, shm.ring_ctl(slot), probe, if hooks { 2 } else { 1 });
    }
}

/// The tracer is gone when its heartbeat is older than the timeout: stop
/// recording (counting goes on: it only adds into shared memory). The
/// clock is thread `t`'s (see `clock`): a thread in seccomp strict mode
/// leaves the check to the others.
#[inline(never)]
fn check_heartbeat(shm: &Shm, t: &ThreadEntry) {
    let h = shm.header();
    let timeout = h.heartbeat_timeout_tsc.load(Relaxed);
    if timeout == 0 {
        return;
    }
    let Some(now) = crate::clock::now_tsc(shm, t.clock.load(Relaxed)) else {
        return;
    };
    let age = now.wrapping_sub(h.heartbeat_tsc.load(Relaxed)) as i64;
    if age > timeout as i64 {
        h.control.fetch_and(!CONTROL_RECORD, Relaxed);
        h.status.fetch_or(STATUS_ORPHANED, Relaxed);
        crate::undo::request_check(shm);
    }
}

/// [`act`] for an entry whose return is hooked (the shadow stack is
/// resynchronised and pushed): out of line, so that the counting and
/// recording paths without it stay as short as they were.
#[inline(never)]
fn act_hooked(
    shm: &Shm,
    t: &ThreadEntry,
    frame: &Frame,
    kind: u32,
    probe: u32,
    action: u32,
    control: u32,
) {
    act::<true>(shm, t, frame, kind, probe, action, control)
}

/// What a hit does: count, record, hook the return (`HOOK`: the site's
/// action has `ACTION_EXIT` and the hit is an entry).
#[inline(always)]
fn act<const HOOK: bool>(
    shm: &Shm,
    t: &ThreadEntry,
    frame: &Frame,
    kind: u32,
    probe: u32,
    action: u32,
    control: u32,
) {
    let slot = t.slot.load(Relaxed);
    let hook = HOOK;
    // Resynchronise the shadow stack before anything is recorded: frames
    // at or below this function's return-address slot are dead (left by
    // longjmp, an exception, a tail call); their unwound exits go first,
    // so that this entry nests where it runs, not inside them.
    let (base, same) = if hook {
        let base = crate::threads::shadow_stack(t);
        let same = if !base.is_null() && frame.slot != 0 {
            pop_dead(Some(shm), t, base, frame.slot, true)
        } else {
            None
        };
        (base, same)
    } else {
        (core::ptr::null_mut(), None)
    };
    let record = action & ACTION_RECORD != 0 && control & CONTROL_RECORD != 0;
    // No clock in seccomp strict mode: the event is refused (counted).
    let tsc = if record {
        crate::clock::now_tsc(shm, t.clock.load(Relaxed))
    } else {
        None
    };
    if record && tsc.is_none() {
        refuse_events(shm, shm.ring_ctl(slot), probe, 1);
    }
    if let Some(tsc) = tsc {
        let xmm = hotprobe_abi::xmm_ints(action);
        let (args, nargs) = match (kind == KIND_EXIT as u32, xmm) {
            (true, None) => ([frame.rax, frame.args[2], 0, 0, 0, 0], 2),
            (true, Some(_)) => ([frame.rax, frame.args[2], frame.xmm[0], 0, 0, 0], 3),
            (false, None) => (frame.args, 6),
            (false, Some(k)) => {
                // The first k integer registers, then xmm0, xmm1, …
                let mut a = [0u64; 6];
                let values = frame.args.iter().take(k as usize).chain(frame.xmm.iter());
                for (w, v) in a.iter_mut().zip(values) {
                    *w = *v;
                }
                (a, 6)
            }
        };
        let ev = Event {
            tsc,
            probe_id: probe,
            tid: t.tid.load(Relaxed),
            kind: kind as u8,
            nargs,
            reserved: if xmm.is_some() { EVENT_XMM } else { 0 },
            // `--stacks`: the entry's stack, walked just before (stackwalk).
            reserved2: if action & hotprobe_abi::ACTION_STACK != 0 && kind == KIND_ENTRY as u32 {
                crate::stackwalk::last_stack(t)
            } else {
                0
            },
            args,
        };
        match shm.producer(slot) {
            Some(p) => {
                let mut limit = t.fast.limit.load(Relaxed);
                let ok = if action & ACTION_CAPTURE != 0 && kind == KIND_ENTRY as u32 {
                    // Typed values copied in the target, in front of the event.
                    crate::capture::push_entry(shm, t, frame, &p, &mut limit, &ev)
                } else {
                    // SAFETY: the ring of `slot` belongs to this thread alone,
                    // and the busy flag keeps a signal handler on this thread out.
                    unsafe { p.push(&mut limit, &ev) }
                };
                t.fast.limit.store(limit, Relaxed);
                if !ok {
                    shm.note_missed(probe);
                    check_heartbeat(shm, t);
                }
            }
            None => {
                shm.header().drops_no_thread.fetch_add(1, Relaxed);
                shm.note_missed(probe);
            }
        }
    }
    if hook {
        hook_return(
            shm,
            t,
            base,
            frame.slot,
            probe,
            match (action & ACTION_RECORD != 0, hotprobe_abi::xmm_ints(action)) {
                (false, _) => 0,
                (true, None) => SHADOW_RECORD,
                (true, Some(_)) => SHADOW_RECORD | SHADOW_XMM,
            } | crate::agg::shadow_flag(shm, probe, action)
                | crate::capture::shadow_flag(action),
            same,
        );
    }
    if action & ACTION_AGG != 0 {
        crate::agg::on_hit(shm, t, frame, probe, kind);
    }
    let hits = t.hits.load(Relaxed).wrapping_add(1);
    t.hits.store(hits, Relaxed);
    if hits & HEARTBEAT_EVERY == 0 {
        check_heartbeat(shm, t);
    }
    // Last: the `inc` is an asm block, after which the compiler reloads
    // whatever it had in registers.
    if action & ACTION_COUNT != 0 {
        let counter = counter_of(probe, action) as usize;
        match shm.thread_counters(slot).and_then(|c| c.get(counter)) {
            // Single writer (this thread): one `inc`, no lock prefix.
            Some(c) => bump(c),
            None => {
                if let Some(c) = shm.global_counters().get(counter) {
                    c.fetch_add(1, Relaxed);
                }
            }
        }
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
    take_hit(shm, frame, kind, probe, action, control)
}

/// The part of [`fast_hit`] after the site lookup: per-thread checks, then
/// [`act`]. Returns 1 when the thread must register first (slow path).
#[inline(always)]
fn take_hit(shm: &Shm, frame: &Frame, kind: u32, probe: u32, action: u32, control: u32) -> u32 {
    let word = crate::tls::get();
    // The agent's own call of a probed function (not the program's), or a
    // hit of a vfork child that found no slot (missed: `vfork::unslotted`).
    if word == crate::threads::own_call() || crate::vfork::unslotted(shm, word, probe) {
        return 0;
    }
    let tp = thread_pointer();
    if crate::shared_tls::is_shared(tp) {
        // Several threads on this block (see `shared_tls`): locked counts.
        refuse(shm, None, kind, probe, action, control);
        return 0;
    }
    if word == 0 {
        // Not registered (or without a slot): its entry's page may be
        // untouched.
        crate::threads::touch_entry(tp);
    }
    let Some(t) = find_thread(tp) else {
        if word == registering() || word == crate::threads::exited() {
            // A signal handler interrupting this thread's registration, or
            // the thread past its exit destructor (its slots given back).
            refuse(shm, None, kind, probe, action, control);
            return 0;
        }
        return 1;
    };
    if t.fast.busy.load(Relaxed) != 0 {
        refuse(shm, Some(t), kind, probe, action, control);
        return 0;
    }
    if t.slot.load(Relaxed) == PENDING_SLOT {
        if crate::tls::get() == registering() {
            // A signal handler interrupting this thread's slot claim.
            refuse(shm, Some(t), kind, probe, action, control);
            return 0;
        }
        return 1;
    }
    t.fast.busy.store(1, Relaxed);
    // Signal fence: a handler interrupting this thread sees busy = 1.
    compiler_fence(SeqCst);
    if action & hotprobe_abi::ACTION_STACK != 0 && kind == KIND_ENTRY as u32 {
        crate::stackwalk::capture(shm, t, frame, probe);
    }
    if action & ACTION_EXIT != 0 && kind == KIND_ENTRY as u32 {
        act_hooked(shm, t, frame, kind, probe, action, control);
    } else {
        act::<false>(shm, t, frame, kind, probe, action, control);
    }
    compiler_fence(SeqCst);
    t.fast.busy.store(0, Relaxed);
    0
}

/// The slow path: registers this thread (thread-table entry, shared-memory
/// thread slot, exit destructor), then handles the hit. xmm0–15 are saved
/// by the trampoline; libc may be called. Never unwinds.
pub(crate) extern "C" fn slow_hit(frame: *mut Frame, kind: u32) -> u32 {
    let r = std::panic::catch_unwind(|| {
        let Some(shm) = crate::shm() else { return };
        let tp = thread_pointer();
        let vfork_parent = crate::vfork::parent_in_window(tp);
        // Until the thread's block is set (or the registration gave up),
        // hits of a signal handler on this thread count globally instead of
        // registering it again (see REGISTERING).
        if vfork_parent.is_some() || crate::threads::register_current(shm, tp) {
            fast_hit(frame, kind);
            if let Some(e) = vfork_parent {
                crate::vfork::rearm(e);
            }
        } else {
            crate::tls::set(0);
            // No table entry to guard with: count globally, drop the event.
            // SAFETY: the trampoline passes a pointer to its Frame.
            let key = unsafe { (*frame).key };
            if let Some((probe, action)) = shm.lookup_site(key) {
                let control = shm.header().control.load(Relaxed);
                refuse(shm, None, kind, probe, action, control);
            }
        }
    });
    let _ = r;
    0
}

/// A recording hit of an in-process trap, from the agent's `SIGTRAP`
/// handler (`inproc`): `gregs` is the interrupted context at the probed
/// instruction `at`. Writes the entry event into the thread's ring (a hit
/// event without `exit`), hooks the return when `exit` (the site is a
/// function's first instruction: the return address is at `rsp`), and counts — what [`fast_hit`] does for
/// a trampoline's hit. A thread's first hit registers it here (see
/// [`crate::threads::register_current`]); a thread interrupted inside the agent or while
/// registering counts and refuses the events, as on the fast path.
pub(crate) fn inproc_hit(shm: &Shm, probe: u32, exit: bool, at: u64, gregs: &[libc::greg_t]) {
    let control = shm.header().control.load(Relaxed);
    if control & CONTROL_ENABLED == 0 {
        return;
    }
    let g = |r: i32| gregs.get(r as usize).map_or(0, |v| *v as u64);
    let frame = Frame {
        args: [
            g(libc::REG_RDI),
            g(libc::REG_RSI),
            g(libc::REG_RDX),
            g(libc::REG_RCX),
            g(libc::REG_R8),
            g(libc::REG_R9),
        ],
        rax: g(libc::REG_RAX),
        r10: g(libc::REG_R10),
        r11: g(libc::REG_R11),
        key: at,
        slot: if exit { g(libc::REG_RSP) } else { 0 },
        // In-process sites carry no xmm layout (their action has none):
        // the event's values are integer registers only.
        xmm: [0; 6],
    };
    let action = ACTION_COUNT | ACTION_RECORD | if exit { ACTION_EXIT } else { 0 };
    // Not at a function's entry: a hit event (no return to hook).
    let kind = if exit { KIND_ENTRY } else { KIND_HIT } as u32;
    if take_hit(shm, &frame, kind, probe, action, control) == 0 {
        return;
    }
    let tp = thread_pointer();
    let vfork_parent = crate::vfork::parent_in_window(tp);
    if vfork_parent.is_some() || crate::threads::register_current(shm, tp) {
        take_hit(shm, &frame, kind, probe, action, control);
        if let Some(e) = vfork_parent {
            crate::vfork::rearm(e);
        }
    } else {
        crate::tls::set(0);
        refuse(shm, None, kind, probe, action, control);
    }
}

#[inline(always)]
pub(crate) fn record_exit(
    shm: &Shm,
    t: &ThreadEntry,
    probe: u32,
    rax: u64,
    rdx: u64,
    xmm0: Option<u64>,
    flags: u16,
) {
    let Some(p) = shm.producer(t.slot.load(Relaxed)) else {
        shm.header().drops_no_thread.fetch_add(1, Relaxed);
        shm.note_missed(probe);
        return;
    };
    let Some(tsc) = crate::clock::now_tsc(shm, t.clock.load(Relaxed)) else {
        refuse_events(shm, shm.ring_ctl(t.slot.load(Relaxed)), probe, 1);
        return;
    };
    let ev = Event {
        tsc,
        probe_id: probe,
        tid: t.tid.load(Relaxed),
        kind: KIND_EXIT,
        // An unwound exit has no return value: store no value words.
        nargs: match (flags & EXIT_UNWOUND != 0, xmm0.is_some()) {
            (true, _) => 0,
            (false, false) => 2,
            (false, true) => 3,
        },
        reserved: flags | if xmm0.is_some() { EVENT_XMM } else { 0 },
        reserved2: 0,
        args: [rax, rdx, xmm0.unwrap_or(0), 0, 0, 0],
    };
    let mut limit = t.fast.limit.load(Relaxed);
    // SAFETY: the ring belongs to this thread; the busy flag is held.
    if !unsafe { p.push(&mut limit, &ev) } {
        shm.note_missed(probe);
    }
    t.fast.limit.store(limit, Relaxed);
}

/// The return trampoline's address as the agent publishes it.
#[inline(always)]
pub(crate) fn return_trampoline() -> u64 {
    crate::trampoline::hotprobe_agent_return_trampoline as *const () as usize as u64
}

/// Pops the entries of frames that are dead when the stack pointer is at
/// `limit` or above it (`inclusive`: also the entry of `limit` itself),
/// recording an unwound exit for each. Returns the real return address of
/// an entry whose slot equals `limit`, if one was popped.
///
/// `shm` is `None` in a dormant agent (a forked child): the entries are
/// popped all the same, nothing is counted or recorded.
#[inline(always)]
pub(crate) fn pop_dead(
    shm: Option<&Shm>,
    t: &ThreadEntry,
    base: *mut Shadow,
    limit: u64,
    inclusive: bool,
) -> Option<u64> {
    if crate::coro::any() {
        // Several stacks on this thread (see `coro`).
        return crate::coro::pop_dead(shm, t, base, limit, inclusive);
    }
    let mut d = t.depth.load(Relaxed) as usize;
    let mut same = None;
    let record = shm.is_some_and(|s| s.header().control.load(Relaxed) & CONTROL_RECORD != 0);
    while d > 0 {
        // SAFETY: d - 1 < depth <= SHADOW_CAP entries of the thread's mapping.
        let e = unsafe { *base.add(d - 1) };
        if e.slot < limit || (inclusive && e.slot == limit) {
            if e.slot == limit {
                same = Some(e.real);
            }
            d -= 1;
            if let Some(shm) = shm {
                shm.header().unwound_frames.fetch_add(1, Relaxed);
                if record && e.flags & SHADOW_RECORD != 0 {
                    record_exit(shm, t, e.probe, 0, 0, None, EXIT_UNWOUND);
                }
            }
        } else {
            break;
        }
    }
    t.depth.store(d as u32, Relaxed);
    same
}

/// Swaps the return address at `slot` for the return trampoline and pushes
/// the real one (entry hook of `ACTION_EXIT`). The caller ([`act`]) has
/// dropped the entries of frames at or below `slot` (dead: longjmp,
/// exceptions, tail calls) before recording the entry; `same` is the real
/// return address of an entry at `slot` itself it dropped (a tail call from
/// a hooked frame). A return that cannot be hooked (no shadow stack, or a
/// full one) is a return miss, and its exit event, when recorded, is
/// counted as refused. `flags` are the new shadow entry's (`SHADOW_RECORD`,
/// `SHADOW_XMM`).
#[inline(always)]
fn hook_return(
    shm: &Shm,
    t: &ThreadEntry,
    base: *mut Shadow,
    slot: u64,
    probe: u32,
    flags: u32,
    same: Option<u64>,
) {
    let record = flags & SHADOW_RECORD != 0;
    let miss = || {
        shm.header().return_misses.fetch_add(1, Relaxed);
        if record && shm.header().control.load(Relaxed) & CONTROL_RECORD != 0 {
            refuse_events(shm, shm.ring_ctl(t.slot.load(Relaxed)), probe, 1);
        }
    };
    if base.is_null() || slot == 0 {
        miss();
        return;
    }
    let tramp = return_trampoline();
    // SAFETY: `slot` is the return-address word of the function being
    // entered, on this thread's stack (the trampoline computed it).
    let mut real = unsafe { (slot as *const u64).read_volatile() };
    if real == tramp {
        // A tail call from a hooked frame: the slot is already swapped.
        match same {
            Some(r) => real = r,
            None => {
                miss();
                return;
            }
        }
    }
    let d = t.depth.load(Relaxed) as usize;
    if d >= SHADOW_CAP {
        miss();
        if real != tramp {
            // SAFETY: as above.
            unsafe { (slot as *mut u64).write_volatile(real) };
        }
        return;
    }
    // SAFETY: d < SHADOW_CAP: inside the thread's shadow mapping.
    unsafe {
        base.add(d).write(Shadow {
            slot,
            real,
            probe,
            flags,
        })
    };
    t.depth.store(d as u32 + 1, Relaxed);
    // SAFETY: as above; the function has not run yet, nobody else reads it.
    unsafe { (slot as *mut u64).write_volatile(tramp) };
}

/// Called by the return trampoline with the address of the slot the `ret`
/// popped and the return registers (rax, rdx, xmm0): records the exit and returns the real
/// return address. Integer-only and panic-free, like [`fast_hit`]. A
/// dormant agent (no shared memory: a forked child) still pops the shadow
/// stack and returns the real address, recording nothing.
pub(crate) extern "C" fn ret_hit(slot: u64, rax: u64, rdx: u64, xmm0: u64) -> u64 {
    let Some(t) = find_thread(thread_pointer()) else {
        return lost_return();
    };
    let base = t.shadow.load(Relaxed) as *mut Shadow;
    if base.is_null() {
        return lost_return();
    }
    let shm = crate::shm();
    let was = t.fast.busy.load(Relaxed);
    t.fast.busy.store(1, Relaxed);
    compiler_fence(SeqCst);
    pop_dead(shm, t, base, slot, false);
    let d = t.depth.load(Relaxed) as usize;
    let mut real = 0;
    // Several stacks on this thread: the newest entry of this slot,
    // wherever it is (see `coro`); else the top one.
    let taken = match (crate::coro::any(), d) {
        (true, _) => crate::coro::take_return(t, base, slot),
        (false, 0) => None,
        // SAFETY: d - 1 < SHADOW_CAP.
        (false, _) => Some(unsafe { *base.add(d - 1) })
            .filter(|e| e.slot == slot)
            .inspect(|_| t.depth.store(d as u32 - 1, Relaxed)),
    };
    if let Some(e) = taken {
        real = e.real;
        if let Some(shm) = shm {
            let control = shm.header().control.load(Relaxed);
            if e.flags & SHADOW_RECORD != 0
                && control & CONTROL_RECORD != 0
                && control & CONTROL_ENABLED != 0
            {
                let x = (e.flags & SHADOW_XMM != 0).then_some(xmm0);
                if e.flags & crate::capture::SHADOW_CAPTURE != 0 {
                    crate::capture::record_exit(shm, t, e.probe, rax, rdx);
                } else {
                    record_exit(shm, t, e.probe, rax, rdx, x, 0);
                }
            }
            if e.flags & crate::agg::SHADOW_AGG != 0 && control & CONTROL_ENABLED != 0 {
                crate::agg::on_return(shm, e.probe, rax);
            }
        }
    }
    compiler_fence(SeqCst);
    t.fast.busy.store(was, Relaxed);
    if real == 0 {
        return lost_return();
    }
    real
}

#[cold]
fn lost_return() -> u64 {
    // No shadow entry for this return: the stack is not what the agent
    // left. Nothing sane to return to.
    // SAFETY: abort has no preconditions.
    unsafe { libc::abort() }
}
