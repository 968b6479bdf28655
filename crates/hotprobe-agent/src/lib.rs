//! The hotprobe agent: a small shared library loaded into a process target
//! (`LD_PRELOAD` at spawn, or `dlopen` injected by the tracer) that runs the
//! fast in-target actions of the patch and jump mechanisms.
//!
//! On load, a constructor (`.init_array`) looks for the shared memory the
//! tracer prepared — `HOTPROBE_SHM_PATH` (a file: the tracer's memfd as
//! `/proc/TRACER/fd/N`, or one in `/dev/shm`) or `HOTPROBE_SHM_FD` (an
//! inherited descriptor) — maps it, removes the variable (so programs it
//! executes stay dormant),
//! validates it ([`hotprobe_abi::Shm::attach`]), maps a *near page* within
//! ±2 GiB of the main executable holding jump stubs to the trampolines, and
//! publishes the trampoline and near-page addresses in the header. Without
//! either variable it stays dormant (every hit returns at once).
//! [`hotprobe_agent_attach_fd`] does the same for an injected agent.
//!
//! Patched sites `call` a trampoline ([`trampoline`]), which looks the return
//! address up in the site table and counts or records (see [`hit`]'s docs in
//! the source). Most sites instead call a per-site stub the tracer wrote
//! (hotprobe-fastpath's `stub` module), which finds the thread's counters
//! and ring through an initial-exec TLS word the agent maintains (`tls`,
//! [`hotprobe_abi::fast`]) and falls back to the generic trampoline for a
//! thread's first hit. A second attach (a new tracer after the previous one
//! detached or died) switches to the new memory and re-homes every known
//! thread. In a child the process forks, the agent goes dormant, or with
//! [`hotprobe_abi::CONTROL_FOLLOW_FORKS`] re-registers the child's threads
//! in slots of their own (see there). The hot path allocates nothing, takes no lock, makes no
//! system call (but the clock of a thread that may not run `rdtsc`, see
//! `clock`), calls nothing of libc (the agent's few libc calls elsewhere
//! run as its own calls, which hits do not count: `threads`), and never panics; each `extern "C"` entry that can reach
//! libc or std catches unwinding. The agent never exits its host. It also
//! installs a `SIGTRAP` handler that undoes the `int3`s of a tracer that
//! died without restoring them (`orphan`).

use std::ffi::c_int;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64};

use hotprobe_abi::patch::{abs_jmp_stub, NEAR_STUB_ENTRY, NEAR_STUB_EXIT, NEAR_STUB_MID};
use hotprobe_abi::{rdtsc, Shm, STATUS_ATTACHED, STATUS_NO_NEAR_PAGE, VERSION};

mod agg;
mod altstack;
mod capture;
mod clock;
mod coro;
mod env;
mod gotbind;
mod hit;
mod hooked;
mod inproc;
mod next_symbol;
mod orphan;
mod progtrap;
mod rawcall;
mod release;
mod saferead;
mod shared_tls;
mod sigmask;
mod sigsites;
mod slots;
mod stackwalk;
mod thread_memory;
mod threads;
mod tls;
pub mod trampoline;
mod undo;
mod unwind;
mod vfork;

pub use clock::prctl;
pub use hotprobe_abi::patch::call_rel32;
pub use orphan::{sigaction, signal};
pub use release::{hotprobe_agent_release, RELEASE_BUSY};

/// The shared memory of the current tracer (a leaked `Box`: a mapping is
/// never unmapped, since a thread may still hold a reference into an older
/// one after a re-attach).
static SHM: AtomicPtr<Shm> = AtomicPtr::new(std::ptr::null_mut());
static EXIT_KEY: AtomicU32 = AtomicU32::new(u32::MAX);
static ATTACHING: AtomicBool = AtomicBool::new(false);
/// The process-wide hooks (thread-exit key, fork handler) are registered.
static HOOKS: AtomicBool = AtomicBool::new(false);
/// The near page, mapped once for the life of the process.
static NEAR_PAGE: AtomicU64 = AtomicU64::new(0);

#[inline(always)]
pub(crate) fn shm() -> Option<&'static Shm> {
    // Acquire pairs with the Release store in `map_and_attach`: the view
    // is fully built before it is seen.
    let p = SHM.load(Acquire);
    // SAFETY: non-null values are leaked boxes, valid forever.
    (!p.is_null()).then(|| unsafe { &*p })
}

pub(crate) fn exit_key() -> Option<libc::pthread_key_t> {
    match EXIT_KEY.load(Relaxed) {
        u32::MAX => None,
        k => Some(k as libc::pthread_key_t),
    }
}

/// Why attaching failed (returned negated by [`hotprobe_agent_attach_fd`]).
#[repr(i32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachError {
    /// Already attached (or attaching).
    Already = 1,
    /// `fstat` or `mmap` of the descriptor failed.
    Map = 2,
    /// The memory is not a valid hotprobe layout of this version.
    Layout = 3,
    /// The path could not be opened.
    Open = 4,
    /// A panic was caught.
    Panic = 5,
}

/// The layout version this agent speaks ([`hotprobe_abi::VERSION`]).
#[no_mangle]
pub extern "C" fn hotprobe_agent_version() -> u32 {
    VERSION
}

/// Arms the hang-up pipe whose read end is `fd` (the caller's, which it
/// closes: a copy is kept): the tracer's death raises a `SIGTRAP` that
/// puts its code back (see `undo`). For a process that cannot open the
/// tracer's pipe through `/proc/TRACER/fd/N` (another uid, not
/// dumpable): the tracer makes the pipe there and keeps its write end.
/// Returns 0, or -1 when it could not be armed.
#[no_mangle]
pub extern "C" fn hotprobe_agent_hangup_fd(fd: c_int) -> c_int {
    if undo::arm_fd(fd) {
        0
    } else {
        -1
    }
}

/// Maps, in this process, the ring starts of the tracer's ring pool (see
/// `thread_memory::map_ring_pool`), so that the next threads' first hits
/// map nothing. The tracer calls it once a recording site is in, with
/// every thread stopped. Returns the thread slots mapped (0 unattached).
#[no_mangle]
pub extern "C" fn hotprobe_agent_map_rings() -> c_int {
    match shm() {
        Some(s) => thread_memory::map_ring_pool(s) as c_int,
        None => 0,
    }
}

/// Maps the shared memory behind `fd` (which stays open, owned by the
/// caller) and attaches to it. Returns 0, or a negated [`AttachError`].
#[no_mangle]
pub extern "C" fn hotprobe_agent_attach_fd(fd: c_int) -> c_int {
    std::panic::catch_unwind(|| match attach_fd(fd) {
        Ok(()) => 0,
        Err(e) => -(e as c_int),
    })
    .unwrap_or(-(AttachError::Panic as c_int))
}

/// Attaches to the memory behind `fd`. A second attach (a new tracer after
/// the previous one detached or died) replaces the memory: every thread
/// already known claims a slot in the new one (the tracer calls this with
/// every thread of the process stopped).
fn attach_fd(fd: c_int) -> Result<(), AttachError> {
    if ATTACHING.swap(true, Acquire) {
        return Err(AttachError::Already);
    }
    // With the agent attached at the spawn stop, libc's functions may be
    // probed already: its calls of them are its own, not the program's.
    let r = threads::as_own_call(|| map_and_attach(fd));
    ATTACHING.store(false, Release);
    r
}

/// Maps `len` bytes of `fd` (shared, read-write) away from code: the
/// kernel would put it right below the libraries (top-down), where its
/// gigabytes of rings (64 threads × 32 MiB by default) fill the ±2 GiB
/// that jump trampolines for library functions need. Tries fixed hints in
/// the lower half of the address space (never replacing a mapping), then
/// lets the kernel choose.
fn map_far_from_code(fd: c_int, len: usize) -> *mut libc::c_void {
    // 32 TiB, 40 TiB, …: far from a non-PIE executable (4 MiB), a PIE
    // one and its heap (≈ 85 TiB) and the libraries (≈ 127 TiB).
    for k in 0..8u64 {
        let hint = (0x2000_0000_0000u64 + k * 0x0800_0000_0000) as *mut libc::c_void;
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping.
        let p = unsafe {
            libc::mmap(
                hint,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
                fd,
                0,
            )
        };
        if p == hint {
            return p;
        }
        if p != libc::MAP_FAILED {
            // Old kernels ignore the flag and treat it as a hint.
            // SAFETY: our own fresh mapping, unused.
            unsafe { libc::munmap(p, len) };
        }
    }
    // SAFETY: a fresh shared mapping of the descriptor; no existing memory affected.
    unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    }
}

fn map_and_attach(fd: c_int) -> Result<(), AttachError> {
    // What was mapped ahead was another memory's.
    thread_memory::forget_ring_pool();
    // SAFETY: an all-zero stat is a valid value to be overwritten.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat writes into `st`, a valid stat.
    if unsafe { libc::fstat(fd, &mut st) } != 0 || st.st_size <= 0 {
        return Err(AttachError::Map);
    }
    let file_len = st.st_size as usize;
    // A memory whose thread slots grow is mapped up to its first chunk;
    // the chunks are mapped as threads claim their slots.
    let len = slots::initial_len(fd).unwrap_or(file_len).min(file_len);
    let p = map_far_from_code(fd, len);
    if p == libc::MAP_FAILED {
        return Err(AttachError::Map);
    }
    // SAFETY: the mapping is valid for len bytes and is never unmapped.
    let mut shm = match unsafe { Shm::attach(p as *mut u8, len) } {
        Ok(s) => s,
        Err(_) => {
            // SAFETY: unmapping the mapping made above, unused.
            unsafe { libc::munmap(p, len) };
            return Err(AttachError::Layout);
        }
    };
    // No chunk past the end of the file: it would fault when touched.
    shm.limit_slots_to_file(file_len);
    // Unmapped at release (see `release`), never before.
    release::note_mapping(p as u64, len as u64);
    // Once per process (not per attach: a forked child that went dormant
    // and is attached again by a tracer of its own keeps them).
    if !HOOKS.swap(true, Relaxed) {
        let mut key: libc::pthread_key_t = 0;
        // SAFETY: key is a valid out-pointer; the destructor is an extern "C" fn.
        if unsafe { libc::pthread_key_create(&mut key, Some(threads::thread_exit)) } == 0 {
            EXIT_KEY.store(key as u32, Relaxed);
        }
        // The child side of fork: dormant, or following (see
        // `hotprobe_abi::CONTROL_FOLLOW_FORKS`).
        // SAFETY: registers a plain extern "C" fn for the child side of fork.
        unsafe { libc::pthread_atfork(None, None, Some(threads::after_fork_child)) };
    }
    let h = shm.header();
    h.agent_pid.store(threads::getpid(), Relaxed);
    h.agent_abi_version.store(VERSION, Relaxed);
    let entry = trampoline::hotprobe_agent_entry_trampoline as *const () as usize as u64;
    let exit = trampoline::hotprobe_agent_exit_trampoline as *const () as usize as u64;
    let mid = trampoline::hotprobe_agent_mid_trampoline as *const () as usize as u64;
    h.thread_tpoff.store(tls::offset(), Relaxed);
    h.entry_trampoline.store(entry, Relaxed);
    h.exit_trampoline.store(exit, Relaxed);
    h.mid_trampoline.store(mid, Relaxed);
    shm.handler_ctl().handler_trampoline.store(
        trampoline::hotprobe_agent_handler_trampoline as *const () as usize as u64,
        Relaxed,
    );
    h.return_trampoline.store(
        trampoline::hotprobe_agent_return_trampoline as *const () as usize as u64,
        Relaxed,
    );
    let near = match NEAR_PAGE.load(Relaxed) {
        0 => map_near_page(&[
            (NEAR_STUB_ENTRY, entry),
            (NEAR_STUB_EXIT, exit),
            (NEAR_STUB_MID, mid),
        ]),
        p => Some(p),
    };
    match near {
        Some(page) => {
            NEAR_PAGE.store(page, Relaxed);
            h.near_page.store(page, Relaxed);
            h.near_page_size.store(4096, Relaxed);
        }
        None => {
            h.status.fetch_or(STATUS_NO_NEAR_PAGE, Relaxed);
        }
    }
    // The tracer's calibration when it wrote one; else ours (by the
    // system call: the vDSO reads the TSC, which this thread may not).
    if h.calib_tsc.load(Relaxed) == 0 && clock::kernel_mode() == clock::CLOCK_TSC {
        let t = rdtsc();
        h.calib_tsc.store(t, Relaxed);
        h.calib_ns.store(clock::raw_ns(), Relaxed);
    }
    rawcall::resolve();
    let s: &'static Shm = Box::leak(Box::new(shm));
    threads::rehome_threads(s);
    inproc::set(s);
    // Int3s a tracer killed with SIGKILL leaves behind (see `orphan`).
    orphan::install();
    // Release pairs with the Acquire load in `shm()`.
    SHM.store(s as *const Shm as *mut Shm, Release);
    // The tracer's death, heard at once (see `undo`).
    undo::arm(s);
    // Release pairs with the tracer's `status.load(Acquire)`: the
    // addresses above are visible once ATTACHED is.
    s.header().status.fetch_or(STATUS_ATTACHED, Release);
    Ok(())
}

/// Whether the tracer of `shm` stopped beating (its heartbeat is older
/// than its timeout). Not "no tracer attached": a session may run its
/// process untraced. Async-signal-safe.
pub(crate) fn tracer_gone_now(shm: &Shm) -> bool {
    let h = shm.header();
    let timeout = h.heartbeat_timeout_tsc.load(Relaxed);
    // The calling thread's clock (see `clock`); none: cannot tell.
    let Some(now) = clock::now_tsc(shm, clock::current_mode()) else {
        return false;
    };
    timeout != 0 && now.wrapping_sub(h.heartbeat_tsc.load(Relaxed)) as i64 > timeout as i64
}

/// In a forked child that does not follow forks: forget the shared memory
/// (every path into it checks [`shm`] first), and the attach in progress
/// the parent may have had on another thread (it does not exist here).
/// Runs with one thread in the process (the fork handler).
pub(crate) fn go_dormant() {
    // Relaxed: the child has one thread; a null pointer publishes nothing.
    SHM.store(std::ptr::null_mut(), Relaxed);
    ATTACHING.store(false, Relaxed);
}

/// At release (see `release`): forget the shared memory, as a dormant
/// child does, and the process-wide hooks (registered again by the next
/// attach, if the library stays loaded). Every other thread is stopped.
pub(crate) fn forget_shm() {
    SHM.store(std::ptr::null_mut(), Release);
}

/// At release: the thread-exit key is deleted (glibc no longer calls its
/// destructor, code about to be unloaded) and the hooks are registered
/// again by a later attach.
pub(crate) fn forget_exit_key() {
    if let Some(key) = exit_key() {
        // SAFETY: a key this agent created; deleting it runs no destructor.
        unsafe { libc::pthread_key_delete(key) };
    }
    EXIT_KEY.store(u32::MAX, Relaxed);
    HOOKS.store(false, Relaxed);
}

/// At release: the near page is unmapped (its stubs jump into the agent).
pub(crate) fn forget_near_page() {
    let page = NEAR_PAGE.swap(0, Relaxed);
    if page != 0 {
        orphan::syscall(libc::SYS_munmap, [page, 4096, 0, 0]);
    }
}

/// In a forked child that follows forks: an attach in progress on another
/// thread of the parent does not exist here.
pub(crate) fn forget_attaching() {
    // Relaxed: the child has one thread.
    ATTACHING.store(false, Relaxed);
}

/// Maps one page within ±2 GiB of the main executable (found through
/// `AT_PHDR`), writes the stubs, makes it read+execute. Returns its address.
fn map_near_page(stubs: &[(u64, u64)]) -> Option<u64> {
    // SAFETY: getauxval has no preconditions.
    let phdr = unsafe { libc::getauxval(libc::AT_PHDR) };
    if phdr == 0 {
        return None;
    }
    let anchor = phdr & !0xfff;
    const STEP: u64 = 1 << 20;
    // Below the executable first (above it lies the heap), then above.
    let candidates = (1..1024u64)
        .filter_map(|k| anchor.checked_sub(k * STEP))
        .chain((1..512u64).filter_map(|k| anchor.checked_add((1 << 30) + k * STEP)));
    for hint in candidates {
        if hint < 0x10000 {
            continue;
        }
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping.
        let p = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            continue;
        }
        if p as u64 != hint {
            // Old kernels ignore the flag and treat it as a hint.
            // SAFETY: our own fresh mapping.
            unsafe { libc::munmap(p, 4096) };
            continue;
        }
        let page = p as *mut u8;
        for &(off, target) in stubs {
            let s = abs_jmp_stub(target);
            // SAFETY: off + 16 <= 64 < 4096, inside the fresh RW page.
            unsafe { std::ptr::copy_nonoverlapping(s.as_ptr(), page.add(off as usize), s.len()) };
        }
        // SAFETY: our page; RX from now on (the tracer writes through /proc/PID/mem).
        unsafe { libc::mprotect(p, 4096, libc::PROT_READ | libc::PROT_EXEC) };
        return Some(hint);
    }
    None
}

fn attach_from_env() {
    // No libc call here (see `env`): with the agent attached at the spawn
    // stop, libc's functions are probed already.
    if let Some(v) = env::var(b"HOTPROBE_SHM_FD") {
        // As for HOTPROBE_SHM_PATH below.
        env::remove(b"HOTPROBE_SHM_FD");
        // SAFETY: an environment value is a NUL-terminated string.
        if let Some(fd) = unsafe { env::parse_fd(v) } {
            let _ = attach_fd(fd);
            return;
        }
    }
    if let Some(path) = env::var(b"HOTPROBE_SHM_PATH") {
        let fd = orphan::syscall(
            libc::SYS_open,
            [path as u64, (libc::O_RDWR | libc::O_CLOEXEC) as u64, 0, 0],
        ) as i64;
        // The variable names the tracer's memory for this process only: a
        // program this one executes (still under LD_PRELOAD) must stay
        // dormant, not attach to the same memory. The constructor runs
        // before any thread of the program exists, so editing `environ` is
        // safe (the string itself stays where it is).
        env::remove(b"HOTPROBE_SHM_PATH");
        if fd >= 0 {
            let _ = attach_fd(fd as c_int);
            // Our descriptor; the mapping survives its close.
            orphan::syscall(libc::SYS_close, [fd as u64, 0, 0, 0]);
        }
    }
}

/// An agent preloaded from a descriptor path (`/proc/PID/fd/N`: the
/// tracer's memfd) takes its entry out of `LD_PRELOAD`: that path opens
/// only while the tracer lives, and every program this one executes after
/// the tracer is gone would print a loader error for it (the agents loaded
/// into those programs would stay dormant anyway). Other entries, and an
/// agent preloaded from a file, are left alone. Done without calling libc
/// (see `env`).
fn drop_ephemeral_preload() {
    env::drop_ephemeral_preload()
}

extern "C" fn constructor() {
    let _ = std::panic::catch_unwind(|| {
        drop_ephemeral_preload();
        attach_from_env();
    });
}

#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = constructor;
