//! `vfork` and `clone(CLONE_VFORK)` children (issue 22). Such a child
//! runs in its parent's memory with the forking thread's thread pointer:
//! the same TLS word, thread-table entry, counters, ring and shadow stack,
//! and no `atfork` handler runs. Left alone, its hits count as the
//! parent's.
//!
//! The calls that make one, interposed — `vfork`, `__vfork`, `clone` with
//! `CLONE_VFORK` (`shared_tls`), `syscall(SYS_clone3 or SYS_clone, …)`
//! with `CLONE_VFORK` (`rawcall`), and `posix_spawn` — save the calling
//! thread's agent state (its entry's slot, tid, handler slot, shadow
//! stack, stubs' view, and its TLS word) into a save area of its entry
//! ([`SAVED`], same index:
//! no allocation), and leave the entry as a followed fork child's is
//! ([`PENDING_SLOT`], TLS word 0, a shadow stack of its own): the child's
//! first hit claims a thread slot owned by the child's pid and tid
//! (`threads::claim_slot`). The return address of the call is swapped for
//! [`vfork_return`] (the real one kept in the save area) and the call goes
//! on to glibc's. The parent thread is suspended until the child executes
//! or exits, so nothing else uses the entry meanwhile; when it returns
//! (through [`vfork_return`]: result non-zero) its state is put back and
//! the child's slots are given back (their counts stay the child's). A
//! child returning the same way (`vfork`, result 0) just returns. A hit
//! of the parent's own between the interposer and the system call (a
//! probe on glibc's `vfork`) finds the entry pending with its own pid:
//! it counts in the parent's state ([`parent_in_window`]). The swapped
//! return address assumes no CET shadow stack (glibc enables none in a
//! process with the agent, which is not marked for it).
//!
//! The child's hits are thus always its own, whether the tracer follows
//! forks or not: the session shows them as the child's row with `-f`, and
//! as not counted without it (see `hotprobe`'s session). A child that
//! finds no free thread slot counts each hit as missed for its probe
//! ([`unslotted`]): never into the process's global counters, which are
//! its parent's.
//!
//! `posix_spawn` and `posix_spawnp` make their child with glibc's internal
//! `clone`: they are interposed as plain calls, armed around glibc's
//! ([`spawn`]); the parent's state comes back when glibc's returns, so a
//! probe glibc reaches in the parent after the child executed (its
//! `munmap` of the child's stack) counts as the child's.
//!
//! Not seen: `system` and `popen` (glibc's internal `posix_spawn`), a
//! `syscall` instruction of the program's own, and an injected agent (its
//! interposers are not bound): those children count into the parent's
//! slot on the agent's paths.

#![cfg_attr(test, allow(dead_code))]

use core::sync::atomic::Ordering::Relaxed;
use core::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize};

use crate::hit::{
    find_thread, registering, thread_pointer, ThreadEntry, MAX_THREADS, NO_SLOT, PENDING_SLOT,
    THREADS,
};

/// `clone` flag: the parent sleeps until the child executes or exits.
pub(crate) const CLONE_VFORK: u64 = 0x4000;

/// One thread's agent state while a vfork child of it runs.
struct Saved {
    /// 1 while the state below is the parent's (a child runs).
    active: AtomicU32,
    slot: AtomicU32,
    tid: AtomicU32,
    hslot: AtomicU32,
    depth: AtomicU32,
    hits: AtomicU32,
    clock: AtomicU32,
    stub_key: AtomicU32,
    tls: AtomicU64,
    /// The real return address of the interposed call.
    ret: AtomicU64,
    /// The parent's pid.
    pid: AtomicU32,
    shadow: AtomicU64,
    /// The children's shadow stack (mapped at the first vfork, kept).
    spare_shadow: AtomicU64,
    /// The stubs' view: counters, ctl, events, mask, limit, header.
    fast: [AtomicU64; 6],
}

#[allow(clippy::declare_interior_mutable_const)]
const SAVED_INIT: Saved = Saved {
    active: AtomicU32::new(0),
    slot: AtomicU32::new(0),
    tid: AtomicU32::new(0),
    hslot: AtomicU32::new(0),
    depth: AtomicU32::new(0),
    hits: AtomicU32::new(0),
    clock: AtomicU32::new(0),
    stub_key: AtomicU32::new(0),
    tls: AtomicU64::new(0),
    ret: AtomicU64::new(0),
    pid: AtomicU32::new(0),
    shadow: AtomicU64::new(0),
    spare_shadow: AtomicU64::new(0),
    fast: [const { AtomicU64::new(0) }; 6],
};

/// The save area of each thread-table entry (same index as [`THREADS`]).
static SAVED: [Saved; MAX_THREADS] = [SAVED_INIT; MAX_THREADS];

fn saved_of(e: &ThreadEntry) -> Option<&'static Saved> {
    let at = (e as *const ThreadEntry as usize).wrapping_sub(THREADS.as_ptr() as usize);
    SAVED.get(at / core::mem::size_of::<ThreadEntry>())
}

/// Unmaps the vfork children's shadow stacks (at release, every thread
/// stopped), but one in use by a vfork child now (it is the thread
/// entry's shadow stack then, unmapped with it).
pub(crate) fn forget_spare_shadows() {
    for (_, e) in crate::threads::used_entries() {
        let spare = saved_of(e)
            .filter(|s| s.active.load(Relaxed) == 0)
            .map_or(0, |s| s.spare_shadow.swap(0, Relaxed));
        if spare != 0 {
            crate::orphan::syscall(
                libc::SYS_munmap,
                [spare, crate::hit::SHADOW_BYTES as u64, 0, 0],
            );
        }
    }
}

/// The stubs' view words of `e`, in [`Saved::fast`]'s order.
fn fast_words(e: &ThreadEntry) -> [&AtomicU64; 6] {
    let f = &e.fast;
    [&f.counters, &f.ctl, &f.events, &f.mask, &f.limit, &f.header]
}

/// Before a call that makes a vfork child, on the calling thread, whose
/// return address is at `ret_slot`: saves the thread's state and sets the
/// child's (see the module docs), and swaps the return address for
/// [`vfork_return`].
pub(crate) fn before(ret_slot: *mut u64) {
    let _ = std::panic::catch_unwind(|| {
        let Some((e, s)) = arm_caller() else { return };
        // SAFETY: the caller's return-address slot on its stack (the
        // naked interposers pass the address of the word `call` pushed).
        unsafe {
            s.ret.store(ret_slot.read(), Relaxed);
            ret_slot.write(vfork_return as *const () as usize as u64);
        }
        arm(e, s);
    });
}

/// The calling thread's entry and save area, ready to be armed for a
/// vfork child (registered first if need be, the parent's pid noted).
/// None when the agent is not attached, the thread cannot be registered,
/// or a vfork child is already running on its entry (a child's own
/// vfork: the grandchild counts as the child).
fn arm_caller() -> Option<(&'static ThreadEntry, &'static Saved)> {
    let shm = crate::shm()?;
    let w = crate::tls::get();
    if w == crate::threads::own_call() || w == crate::threads::exited() || w == registering() {
        return None;
    }
    let tp = thread_pointer();
    if crate::shared_tls::is_shared(tp) {
        // Counted globally, as the process's, either way.
        return None;
    }
    if find_thread(tp).is_none() || crate::tls::get() == 0 {
        // Its entry and slot now: the child's first hit must not register
        // the thread (its pthread_setspecific would be the parent's too).
        crate::threads::register_current(shm, tp);
    }
    let e = find_thread(tp)?;
    let s = saved_of(e)?;
    if s.active.load(Relaxed) != 0 {
        return None;
    }
    s.ret.store(0, Relaxed);
    s.pid.store(crate::threads::getpid(), Relaxed);
    if s.spare_shadow.load(Relaxed) == 0 {
        s.spare_shadow
            .store(crate::thread_memory::map_shadow(), Relaxed);
    }
    Some((e, s))
}

/// Saves `e`'s state into `s` and leaves `e` as the child's: a slot of
/// its own at its first hit, a shadow stack of its own (the parent's live
/// entries stay untouched).
fn arm(e: &'static ThreadEntry, s: &Saved) {
    let was = e.fast.busy.swap(1, Relaxed);
    s.slot.store(e.slot.load(Relaxed), Relaxed);
    s.tid.store(e.tid.load(Relaxed), Relaxed);
    s.hslot.store(e.hslot.load(Relaxed), Relaxed);
    s.depth.store(e.depth.load(Relaxed), Relaxed);
    s.hits.store(e.hits.load(Relaxed), Relaxed);
    s.clock.store(e.clock.load(Relaxed), Relaxed);
    s.stub_key.store(e.fast.stub_key.load(Relaxed), Relaxed);
    s.shadow.store(e.shadow.load(Relaxed), Relaxed);
    s.tls.store(crate::tls::get(), Relaxed);
    for (k, w) in fast_words(e).into_iter().enumerate() {
        s.fast[k].store(w.load(Relaxed), Relaxed);
    }
    e.shadow.store(s.spare_shadow.load(Relaxed), Relaxed);
    e.depth.store(0, Relaxed);
    e.tid.store(0, Relaxed);
    e.hits.store(0, Relaxed);
    e.hslot.store(0, Relaxed);
    e.slot.store(PENDING_SLOT, Relaxed);
    crate::threads::clear_fast(e);
    crate::tls::set(0);
    s.active.store(1, Relaxed);
    e.fast.busy.store(was, Relaxed);
}

/// A hit on the slow path of the thread with thread pointer `tp`, whose
/// entry waits for a vfork child's first hit: when the caller is the
/// parent itself (between the interposer and the system call: a probe on
/// glibc's `vfork` or `clone`), its state is put back for this hit and
/// the entry returned, to be armed again after it ([`rearm`]). One
/// `getpid` per such hit; None for every other thread and for the child.
pub(crate) fn parent_in_window(tp: u64) -> Option<&'static ThreadEntry> {
    let e = find_thread(tp)?;
    let s = saved_of(e)?;
    if s.active.load(Relaxed) == 0
        || e.slot.load(Relaxed) != PENDING_SLOT
        || crate::threads::getpid() != s.pid.load(Relaxed)
    {
        return None;
    }
    restore(e, s);
    Some(e)
}

/// What a vfork child's TLS word points at when it found no thread slot:
/// its hits must not count into the global counters (which are the
/// process's, its parent's), so each is counted as missed for its probe
/// ([`unslotted`]). Its key (0) matches no memory's: stubs send its hits
/// to the generic path.
#[allow(clippy::declare_interior_mutable_const)]
static UNSLOTTED: hotprobe_abi::fast::ThreadBlock = crate::hit::ENTRY_INIT.fast;

/// After the calling thread's slot claim for entry `e` (`slot`, or
/// [`NO_SLOT`]): a vfork child without a slot gets [`UNSLOTTED`].
pub(crate) fn claimed(e: &ThreadEntry, slot: u32) {
    if slot != NO_SLOT {
        return;
    }
    let child = saved_of(e).is_some_and(|s| {
        s.active.load(Relaxed) != 0 && s.pid.load(Relaxed) != crate::threads::getpid()
    });
    if child {
        crate::tls::set(&UNSLOTTED as *const _ as u64);
    }
}

/// Whether TLS word `word` is [`UNSLOTTED`]'s: then the hit of `probe` is
/// counted as missed, not as a hit (the generic path and the in-process
/// trap's handler).
#[inline(always)]
pub(crate) fn unslotted(shm: &hotprobe_abi::Shm, word: u64, probe: u32) -> bool {
    if word != &UNSLOTTED as *const _ as u64 {
        return false;
    }
    missed(shm, probe);
    true
}

#[cold]
#[inline(never)]
fn missed(shm: &hotprobe_abi::Shm, probe: u32) {
    shm.note_missed(probe);
}

/// Arms `e` again after [`parent_in_window`]'s hit.
pub(crate) fn rearm(e: &'static ThreadEntry) {
    if let Some(s) = saved_of(e) {
        arm(e, s);
    }
}

/// Where an interposed vfork-like call returns (`rax`: its result): in
/// the parent (non-zero: the child's pid, or an error) the thread's state
/// is put back. Returns the real return address.
extern "C" fn after(rax: i64) -> u64 {
    let found = find_thread(thread_pointer()).and_then(|e| Some((e, saved_of(e)?)));
    let Some((e, s)) = found else {
        // SAFETY: abort has no preconditions. The entry holding the
        // return address was found before the call and no code removes
        // it meanwhile (no thread exit, no fork handler).
        unsafe { libc::abort() };
    };
    let ret = s.ret.load(Relaxed);
    if rax != 0 {
        let _ = std::panic::catch_unwind(|| restore(e, s));
    }
    ret
}

/// Puts the parent thread's state back into `e`, giving the child's slots
/// back (it has executed or exited: it writes into them no more; their
/// counts stay its own).
fn restore(e: &'static ThreadEntry, s: &Saved) {
    if s.active.load(Relaxed) == 0 {
        return;
    }
    let was = e.fast.busy.swap(1, Relaxed);
    let slot = e.slot.load(Relaxed);
    if let Some(shm) = crate::shm() {
        if slot != NO_SLOT && slot != PENDING_SLOT && slot != s.slot.load(Relaxed) {
            shm.release_thread(slot);
        }
        if let Some(h) = e.hslot.load(Relaxed).checked_sub(1) {
            shm.release_handler_slot(h, e.tid.load(Relaxed));
        }
    }
    e.slot.store(s.slot.load(Relaxed), Relaxed);
    e.tid.store(s.tid.load(Relaxed), Relaxed);
    e.hslot.store(s.hslot.load(Relaxed), Relaxed);
    e.depth.store(s.depth.load(Relaxed), Relaxed);
    e.hits.store(s.hits.load(Relaxed), Relaxed);
    e.clock.store(s.clock.load(Relaxed), Relaxed);
    e.shadow.store(s.shadow.load(Relaxed), Relaxed);
    for (k, w) in fast_words(e).into_iter().enumerate() {
        w.store(s.fast[k].load(Relaxed), Relaxed);
    }
    e.fast.stub_key.store(s.stub_key.load(Relaxed), Relaxed);
    crate::tls::set(s.tls.load(Relaxed));
    s.active.store(0, Relaxed);
    e.fast.busy.store(was, Relaxed);
}

/// The return address an interposed vfork-like call gets: calls
/// [`after`] with the call's result and returns it to the real return
/// address.
#[unsafe(naked)]
extern "C" fn vfork_return() {
    core::arch::naked_asm!(
        // Reached by `ret` (or `jmp rdi` in glibc's vfork): rsp is 16-byte
        // aligned, as at the call's entry plus 8. A word for the real
        // return address, rax, and the call is aligned.
        "sub rsp, 8",
        "push rax",
        "mov rdi, rax",
        "call {after}",
        "mov [rsp + 8], rax",
        "pop rax",
        "ret",
        after = sym after,
    );
}

/// Called by the tracer (a remote call) in a vfork child it saw made —
/// by a call no interposer sees (`system`, `popen`, a `syscall`
/// instruction of the program's own, any call in a process the agent
/// was injected into) — at the child's first stop, before it runs: arms
/// the entry of the parent thread (`parent_pid`, `parent_tid`, whose
/// thread pointer the child has) as the interposers do (registered first,
/// on the parent's behalf, if it never was), so that the child's hits
/// claim a slot of its own. The tracer calls
/// [`hotprobe_agent_vfork_done`] in the parent when the child has
/// executed or exited. Returns 0 when nothing was armed (no shared
/// memory, a thread inside the agent, shared thread-local storage), 1
/// when an interposer had armed it already, 2 when armed here.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn hotprobe_agent_vfork_child(parent_pid: u32, parent_tid: u32) -> u32 {
    std::panic::catch_unwind(|| {
        let shm = crate::shm()?;
        let w = crate::tls::get();
        if w == crate::threads::own_call() || w == crate::threads::exited() || w == registering() {
            return None;
        }
        let tp = thread_pointer();
        if crate::shared_tls::is_shared(tp) {
            return None;
        }
        if find_thread(tp).is_none() {
            crate::threads::register_thread(shm, tp, parent_pid, parent_tid);
        }
        let e = find_thread(tp)?;
        let s = saved_of(e)?;
        if s.active.load(Relaxed) != 0 {
            return Some(1);
        }
        if e.slot.load(Relaxed) == PENDING_SLOT {
            // A followed fork child's forking thread, not yet claimed:
            // its first hit claims a slot as the caller's, the child's.
            return None;
        }
        s.ret.store(0, Relaxed);
        s.pid.store(parent_pid, Relaxed);
        if s.spare_shadow.load(Relaxed) == 0 {
            s.spare_shadow
                .store(crate::thread_memory::map_shadow(), Relaxed);
        }
        arm(e, s);
        Some(2)
    })
    .ok()
    .flatten()
    .unwrap_or(0)
}

/// Called by the tracer (a remote call) in the parent thread of a vfork
/// child when the child has executed or exited, before the parent runs
/// on: the parent's state comes back (see [`hotprobe_agent_vfork_child`];
/// for a child an interposer armed, earlier than the interposer would:
/// `posix_spawn`'s own work after its child executed is then the
/// parent's). Returns 1 when a state was put back, else 0.
#[cfg_attr(not(test), no_mangle)]
pub extern "C" fn hotprobe_agent_vfork_done() -> u32 {
    std::panic::catch_unwind(|| {
        let e = find_thread(thread_pointer())?;
        let s = saved_of(e)?;
        if s.active.load(Relaxed) == 0 || s.pid.load(Relaxed) != crate::threads::getpid() {
            return None;
        }
        restore(e, s);
        Some(1)
    })
    .ok()
    .flatten()
    .unwrap_or(0)
}

/// glibc's `vfork` and `__vfork`.
static NEXT_VFORK: AtomicUsize = AtomicUsize::new(0);
static NEXT_UNDER_VFORK: AtomicUsize = AtomicUsize::new(0);

/// [`before`], then the address of glibc's function `name`.
fn before_and_next(ret_slot: *mut u64, cache: &AtomicUsize, name: &core::ffi::CStr) -> usize {
    before(ret_slot);
    let f = crate::next_symbol::next_symbol(cache, name);
    if f == 0 {
        // SAFETY: abort has no preconditions; without glibc's vfork the
        // program could not have linked against it.
        unsafe { libc::abort() };
    }
    f
}

extern "C" fn before_vfork(ret_slot: *mut u64) -> usize {
    before_and_next(ret_slot, &NEXT_VFORK, c"vfork")
}

extern "C" fn before_under_vfork(ret_slot: *mut u64) -> usize {
    before_and_next(ret_slot, &NEXT_UNDER_VFORK, c"__vfork")
}

/// `vfork`, interposed (see the module docs).
///
/// # Safety
/// As glibc's `vfork`.
#[unsafe(naked)]
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn vfork() {
    core::arch::naked_asm!(
        // Entry rsp ≡ 8 (mod 16): the return address's slot, then one
        // word down for an aligned call.
        "mov rdi, rsp",
        "sub rsp, 8",
        "call {f}",
        "add rsp, 8",
        "jmp rax",
        f = sym before_vfork,
    );
}

/// `__vfork`, interposed (as [`vfork`]).
///
/// # Safety
/// As glibc's `__vfork`.
#[unsafe(naked)]
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __vfork() {
    core::arch::naked_asm!(
        "mov rdi, rsp",
        "sub rsp, 8",
        "call {f}",
        "add rsp, 8",
        "jmp rax",
        f = sym before_under_vfork,
    );
}

type SpawnFn = unsafe extern "C" fn(
    *mut libc::pid_t,
    *const libc::c_char,
    *const libc::posix_spawn_file_actions_t,
    *const libc::posix_spawnattr_t,
    *const *mut libc::c_char,
    *const *mut libc::c_char,
) -> libc::c_int;

/// glibc's `posix_spawn` and `posix_spawnp`.
static NEXT_SPAWN: AtomicUsize = AtomicUsize::new(0);
static NEXT_SPAWNP: AtomicUsize = AtomicUsize::new(0);

/// glibc's `name` (from `cache`), called with the calling thread armed for
/// a vfork child around it: glibc makes its child with an internal
/// `clone(CLONE_VM | CLONE_VFORK)` the other interposers do not see. The
/// parent gets its state back when glibc's function returns (the child
/// has executed or exited by then).
///
/// # Safety
/// As glibc's `posix_spawn`.
unsafe fn spawn(
    cache: &AtomicUsize,
    name: &core::ffi::CStr,
    args: (
        *mut libc::pid_t,
        *const libc::c_char,
        *const libc::posix_spawn_file_actions_t,
        *const libc::posix_spawnattr_t,
        *const *mut libc::c_char,
        *const *mut libc::c_char,
    ),
) -> libc::c_int {
    let f = crate::next_symbol::next_symbol(cache, name);
    if f == 0 {
        return libc::ENOSYS;
    }
    // SAFETY: dlsym's address of glibc's function of this type.
    let real = unsafe { core::mem::transmute::<usize, SpawnFn>(f) };
    let armed = std::panic::catch_unwind(|| {
        let (e, s) = arm_caller()?;
        arm(e, s);
        Some((e, s))
    })
    .ok()
    .flatten();
    // SAFETY: the caller's arguments, passed on unchanged.
    let r = unsafe { real(args.0, args.1, args.2, args.3, args.4, args.5) };
    if let Some((e, s)) = armed {
        let _ = std::panic::catch_unwind(|| restore(e, s));
    }
    r
}

/// `posix_spawn`, interposed (see [`spawn`]).
///
/// # Safety
/// As glibc's `posix_spawn`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const libc::c_char,
    file_actions: *const libc::posix_spawn_file_actions_t,
    attrp: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> libc::c_int {
    // SAFETY: as the caller's.
    unsafe {
        spawn(
            &NEXT_SPAWN,
            c"posix_spawn",
            (pid, path, file_actions, attrp, argv, envp),
        )
    }
}

/// `posix_spawnp`, interposed (see [`spawn`]).
///
/// # Safety
/// As glibc's `posix_spawnp`.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const libc::c_char,
    file_actions: *const libc::posix_spawn_file_actions_t,
    attrp: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> libc::c_int {
    // SAFETY: as the caller's.
    unsafe {
        spawn(
            &NEXT_SPAWNP,
            c"posix_spawnp",
            (pid, file, file_actions, attrp, argv, envp),
        )
    }
}
