//! Putting the program's code back when the tracer is gone.
//!
//! The tracer publishes every site its fast path writes (patch calls,
//! jumps and their padding, in-process trap `int3`s) in the shared
//! memory's code ledger (`hotprobe_abi::LedgerEntry`: address, original
//! bytes, the bytes written), and every `int3` of its trap mechanism in
//! the trap table (`hotprobe_abi::TrapSlot`). A tracer killed with SIGKILL
//! restores none of them. The agent then puts them back, once, on the
//! first of these:
//!
//! * the *hang-up pipe*: at attach the agent opens, through
//!   `/proc/TRACER/fd/N`, a pipe whose only writer is the tracer
//!   (`hotprobe_abi::LedgerCtl::hangup_fd`), moves it to a high descriptor
//!   and asks for a `SIGTRAP` (`F_SETSIG`, `O_ASYNC`) when it hangs up. It
//!   hangs up when the tracer's process dies, however it dies (the tracer
//!   never closes its end), so a program whose hits never enter the agent
//!   (per-site stubs) hears of it at once. The agent's `SIGTRAP` handler (`orphan`) takes it by its
//!   `si_code` (`SI_SIGIO`) and `si_fd`, and checks with `poll` that the
//!   current pipe did hang up (a signal left from an earlier tracer is
//!   ignored).
//! * a stale heartbeat seen on a hit (`hit`), when the tracer's process no
//!   longer exists or is a zombie (a tracer only frozen keeps its sites);
//! * an `int3` of the trap table hit after the tracer died (`orphan`).
//!
//! One thread does it ([`hotprobe_abi::LedgerCtl::undo`]); the others go
//! on meanwhile through the trampolines and stubs, which stay valid. Each
//! entry of the ledger is claimed (`LIVE` → `UNDOING`); where the site
//! holds the bytes the tracer wrote — whole, or torn by its death in the
//! middle of the write, each byte the written one or the original, the
//! first perhaps its `int3` ([`torn_or_whole`]) — a site of several bytes
//! gets an `int3` over its first byte, then its other original bytes, then
//! its first original byte, each by one write through `/proc/self/mem`
//! (which ignores page protections): no thread ever runs a half-restored
//! instruction. A thread that reaches the `int3` meanwhile traps; the
//! `SIGTRAP` handler finds the site in the ledger, finishes its restore
//! itself (the same bytes: harmless if both write them) and resumes the
//! thread at the site ([`resume_at_site`]), claiming the site first if the
//! undo has not come to it (a torn site's `int3` reached before the undo
//! began starts the undo). Bytes that are neither the tracer's nor the
//! original (another writer's) are left as found and counted. Then every
//! published `int3` of the trap table is put back, except the return
//! trampoline (threads still return through it, and the handler completes
//! those returns) and guarded sites (a thread the tracer had stopped there
//! may resume one byte in: the handler deals with it at its guard). Last, the `int3`s the process layer put on libc's
//! signal-state system calls go (`sigsites`: found by their bytes).
//!
//! Only raw system calls and atomics: it runs in a signal handler.

use core::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use core::sync::atomic::{AtomicBool, AtomicI32};

use hotprobe_abi::{
    LedgerEntry, LedgerSite, Shm, LEDGER_BYTES, LEDGER_LIVE, LEDGER_UNDOING, LEDGER_UNDONE,
    TRAP_GUARD, TRAP_RETURN, UNDO_DONE, UNDO_IDLE, UNDO_RUNNING,
};

use crate::orphan::syscall;

const INT3: u8 = 0xcc;
/// `si_code` of a signal `F_SETSIG` asked for, where the signal has
/// codes of its own (`SIGTRAP` has; `POLL_IN` would be `TRAP_BRKPT`):
/// `SI_SIGIO`.
const SI_SIGIO: i32 = -5;
/// `si_code` of a signal sent by `tgkill` ([`request_check`]).
const SI_TKILL: i32 = -6;

/// `fcntl`'s `F_SETSIG` (Linux; not in the libc crate).
const F_SETSIG: i32 = 10;

/// The agent's descriptor on the current tracer's hang-up pipe; -1: none.
static HANGUP_FD: AtomicI32 = AtomicI32::new(-1);

/// Opens the hang-up pipe of the tracer of `shm` (see the module docs),
/// replacing the previous tracer's. Called at attach.
pub(crate) fn arm(shm: &Shm) {
    let old = HANGUP_FD.swap(-1, Relaxed);
    if old >= 0 {
        syscall(libc::SYS_close, [old as u64, 0, 0, 0]);
    }
    let ctl = shm.ledger_ctl();
    let (pid, n) = (ctl.tracer_pid.load(Relaxed), ctl.hangup_fd.load(Relaxed));
    if pid == 0 || n == 0 {
        return;
    }
    let mut path = [0u8; 48];
    let mut w = Writer {
        buf: &mut path,
        at: 0,
    };
    w.put(b"/proc/");
    w.num(pid as u64);
    w.put(b"/fd/");
    w.num(n as u64);
    let flags = libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC;
    let fd = syscall(libc::SYS_open, [path.as_ptr() as u64, flags as u64, 0, 0]) as i64;
    if fd < 0 {
        // A process that changed its uid or is not dumpable may not open
        // the tracer's descriptors: the tracer hands it a pipe of its own
        // ([`arm_fd`]).
        return;
    }
    arm_fd(fd as i32);
    syscall(libc::SYS_close, [fd as u64, 0, 0, 0]);
}

/// Arms the hang-up pipe whose read end is `fd` (a descriptor the caller
/// keeps and closes: a copy is made), replacing the current one. True
/// when armed.
pub(crate) fn arm_fd(fd: i32) -> bool {
    let old = HANGUP_FD.swap(-1, Relaxed);
    if old >= 0 {
        syscall(libc::SYS_close, [old as u64, 0, 0, 0]);
    }
    // Out of the program's way: the program's next `open` gets the number
    // it would have got without the agent.
    let high = syscall(
        libc::SYS_fcntl,
        [fd as u64, libc::F_DUPFD_CLOEXEC as u64, high_fd_base(), 0],
    ) as i64;
    if high < 0 {
        return false;
    }
    let ok = syscall(
        libc::SYS_fcntl,
        [
            high as u64,
            libc::F_SETOWN as u64,
            crate::threads::getpid() as u64,
            0,
        ],
    ) == 0
        && syscall(
            libc::SYS_fcntl,
            [high as u64, F_SETSIG as u64, libc::SIGTRAP as u64, 0],
        ) == 0
        && syscall(
            libc::SYS_fcntl,
            [
                high as u64,
                libc::F_SETFL as u64,
                (libc::O_NONBLOCK | libc::O_ASYNC) as u64,
                0,
            ],
        ) == 0;
    if !ok {
        syscall(libc::SYS_close, [high as u64, 0, 0, 0]);
        return false;
    }
    HANGUP_FD.store(high as i32, Release);
    true
}

/// Closes the hang-up pipe (at release, see `release`): the tracer's
/// exit no longer raises a `SIGTRAP` here.
pub(crate) fn disarm() {
    let fd = HANGUP_FD.swap(-1, AcqRel);
    if fd >= 0 {
        syscall(libc::SYS_close, [fd as u64, 0, 0, 0]);
    }
}

/// Where the hang-up descriptor goes: 64 below the soft limit of open
/// files (and at least 10).
fn high_fd_base() -> u64 {
    let mut lim = [0u64; 2];
    let r = crate::orphan::syscall6(
        libc::SYS_prlimit64,
        [
            0,
            libc::RLIMIT_NOFILE as u64,
            0,
            lim.as_mut_ptr() as u64,
            0,
            0,
        ],
    );
    if r != 0 || lim[0] == 0 {
        return 10;
    }
    lim[0].min(1 << 20).saturating_sub(64).max(10)
}

/// A small formatter into a NUL-terminated stack buffer.
struct Writer<'a> {
    buf: &'a mut [u8],
    at: usize,
}

impl Writer<'_> {
    fn put(&mut self, s: &[u8]) {
        for &b in s {
            // Keep the last byte for the NUL.
            if self.at + 1 < self.buf.len() {
                self.buf[self.at] = b;
                self.at += 1;
            }
        }
    }

    fn num(&mut self, mut v: u64) {
        let mut digits = [0u8; 20];
        let mut i = digits.len();
        loop {
            i -= 1;
            digits[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        self.put(&digits[i..]);
    }
}

/// Whether `info` is the hang-up pipe's signal; if so, and the current
/// pipe did hang up, every published site is put back (see the module
/// docs). Called first by the `SIGTRAP` handler.
pub(crate) fn on_signal(info: &libc::siginfo_t) -> bool {
    if info.si_code == SI_TKILL {
        // SAFETY: a `tgkill` signal carries the sender's pid in `si_pid`
        // (an int at 16 of the 128-byte `siginfo_t`).
        let from =
            unsafe { *((info as *const libc::siginfo_t as *const u8).add(16) as *const i32) };
        if from as u32 != crate::threads::getpid() || !CHECK_REQUESTED.swap(false, AcqRel) {
            return false;
        }
        if let Some(shm) = crate::shm() {
            check_requested(shm);
        }
        return true;
    }
    if info.si_code != SI_SIGIO {
        return false;
    }
    // SAFETY: for a SIGIO-style signal the kernel fills the `sigpoll`
    // member of the union: `si_band` (a long at 16) and `si_fd` (an int at
    // 24); `siginfo_t` is 128 bytes.
    let si_fd = unsafe { *((info as *const libc::siginfo_t as *const u8).add(24) as *const i32) };
    let fd = HANGUP_FD.load(Acquire);
    if fd < 0 || si_fd != fd {
        return false;
    }
    if hung_up(fd) {
        if HANGUP_FD.compare_exchange(fd, -1, AcqRel, Relaxed).is_ok() {
            syscall(libc::SYS_close, [fd as u64, 0, 0, 0]);
        }
        if let Some(shm) = crate::shm() {
            undo_all(shm);
        }
    }
    true
}

/// Whether the pipe `fd` hung up (its writer is gone).
fn hung_up(fd: i32) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let n = syscall(
        libc::SYS_ppoll,
        [&mut p as *mut _ as u64, 1, &ts as *const _ as u64, 0],
    ) as i64;
    n == 1 && p.revents & libc::POLLHUP != 0
}

/// A check asked for by [`request_check`], not yet made.
static CHECK_REQUESTED: AtomicBool = AtomicBool::new(false);

/// The heartbeat of the tracer of `shm` is stale (seen on a hit): asks
/// this thread's `SIGTRAP` handler to check whether the tracer's process
/// is gone, and if so to put every published site back. By a signal to
/// itself (`tgkill`), since the hit path may not touch what the check
/// needs (vector registers, buffers): the kernel saves everything around
/// a handler. Only atomics and raw system calls.
pub(crate) fn request_check(shm: &Shm) {
    let ctl = shm.ledger_ctl();
    if ctl.undo.load(Relaxed) != UNDO_IDLE || ctl.tracer_pid.load(Relaxed) == 0 {
        return;
    }
    if CHECK_REQUESTED.swap(true, AcqRel) {
        return;
    }
    let (pid, tid) = (crate::threads::getpid(), crate::threads::gettid());
    syscall(
        libc::SYS_tgkill,
        [pid as u64, tid as u64, libc::SIGTRAP as u64, 0],
    );
}

/// The requested check (see [`request_check`]), in the `SIGTRAP` handler.
fn check_requested(shm: &Shm) {
    let ctl = shm.ledger_ctl();
    let pid = ctl.tracer_pid.load(Relaxed);
    if ctl.undo.load(Relaxed) == UNDO_IDLE && pid != 0 && process_gone(pid) {
        undo_all(shm);
    }
}

/// Whether process `pid` no longer exists, or is a zombie.
fn process_gone(pid: u32) -> bool {
    let r = syscall(libc::SYS_kill, [pid as u64, 0, 0, 0]) as i64;
    if r == -(libc::ESRCH as i64) {
        return true;
    }
    let mut path = [0u8; 32];
    let mut w = Writer {
        buf: &mut path,
        at: 0,
    };
    w.put(b"/proc/");
    w.num(pid as u64);
    w.put(b"/stat");
    let fd = syscall(
        libc::SYS_open,
        [
            path.as_ptr() as u64,
            libc::O_RDONLY as u64 | libc::O_CLOEXEC as u64,
            0,
            0,
        ],
    ) as i64;
    if fd < 0 {
        return true;
    }
    // "pid (comm) S …": comm is at most 16 bytes, so the state is within
    // the first 64.
    let mut buf = [0u8; 64];
    let n = syscall(
        libc::SYS_read,
        [fd as u64, buf.as_mut_ptr() as u64, buf.len() as u64, 0],
    ) as i64;
    syscall(libc::SYS_close, [fd as u64, 0, 0, 0]);
    let Some(buf) = buf.get(..n.max(0) as usize) else {
        return false;
    };
    // "pid (comm) S ...": the state follows the last ')'.
    match buf.iter().rposition(|&b| b == b')') {
        Some(i) => matches!(buf.get(i + 2), Some(b'Z' | b'X' | b'x')),
        None => false,
    }
}

/// Puts every site of the ledger and every plain `int3` of the trap table
/// back (see the module docs); once per memory, by the first caller.
pub(crate) fn undo_all(shm: &Shm) {
    let ctl = shm.ledger_ctl();
    if ctl
        .undo
        .compare_exchange(UNDO_IDLE, UNDO_RUNNING, AcqRel, Relaxed)
        .is_err()
    {
        return;
    }
    let Some(mem) = Mem::open() else {
        ctl.undo.store(UNDO_DONE, Release);
        return;
    };
    for e in shm.ledger_in_use() {
        if e.state
            .compare_exchange(LEDGER_LIVE, LEDGER_UNDOING, AcqRel, Relaxed)
            .is_err()
        {
            continue;
        }
        if let Some(site) = site_of(e) {
            match restore(&mem, &site) {
                Some(true) => {
                    ctl.undone.fetch_add(1, Relaxed);
                }
                Some(false) => {}
                None => {
                    ctl.left.fetch_add(1, Relaxed);
                }
            }
        }
        e.state.store(LEDGER_UNDONE, Release);
    }
    for s in shm.trap_slots() {
        let addr = s.addr.load(Acquire);
        if addr == 0 {
            continue;
        }
        let Some((orig, flags)) = shm.lookup_trap(addr) else {
            continue;
        };
        if flags & (TRAP_RETURN | TRAP_GUARD) != 0
            || shm
                .lookup_trap(addr.wrapping_add(1))
                .is_some_and(|(_, f)| f & TRAP_GUARD != 0)
        {
            continue;
        }
        if mem.read_byte(addr) == Some(INT3) && mem.write_raw(addr, &orig as *const u8 as u64, 1) {
            ctl.traps_undone.fetch_add(1, Relaxed);
        }
    }
    // The process layer's signal-state sites (see `sigsites`).
    let sites = crate::sigsites::undo_all(mem.0);
    ctl.traps_undone.fetch_add(sites, Relaxed);
    mem.close();
    ctl.undo.store(UNDO_DONE, Release);
}

/// The site of an entry this thread or another claimed ([`LEDGER_UNDOING`]
/// or [`LEDGER_UNDONE`]): the fields as the tracer published them.
fn site_of(e: &LedgerEntry) -> Option<LedgerSite> {
    let state = e.state.load(Acquire);
    if state != LEDGER_UNDOING && state != LEDGER_UNDONE {
        return None;
    }
    // The fields were published with LIVE (Release) and are not written
    // again by anyone once the entry left LIVE.
    let info = e.info.load(Relaxed);
    let len = (info & 0xff) as usize;
    if len == 0 || len > hotprobe_abi::LEDGER_BYTES {
        return None;
    }
    let word = |w: &[core::sync::atomic::AtomicU64]| {
        let mut b = [0u8; hotprobe_abi::LEDGER_BYTES];
        for (chunk, w) in b.chunks_exact_mut(8).zip(w) {
            chunk.copy_from_slice(&w.load(Relaxed).to_le_bytes());
        }
        b
    };
    Some(LedgerSite {
        addr: e.addr.load(Relaxed),
        len,
        owner: info & hotprobe_abi::LEDGER_OWNER_MASK,
        original: word(&e.original),
        written: word(&e.written),
    })
}

/// Whether `a` and `b` agree on bytes `from..len` (a loop of its own:
/// no `memcmp`, which a probe could be on).
fn same(a: &[u8; LEDGER_BYTES], b: &[u8; LEDGER_BYTES], from: usize, len: usize) -> bool {
    let mut i = from;
    while i < len && i < LEDGER_BYTES {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The `len` bytes at `addr` (the rest zero), or None when unreadable.
fn read_site(mem: &Mem, addr: u64, len: usize) -> Option<[u8; LEDGER_BYTES]> {
    let mut live = [0u8; LEDGER_BYTES];
    let n = syscall(
        libc::SYS_pread64,
        [
            mem.0,
            live.as_mut_ptr() as u64,
            len.min(LEDGER_BYTES) as u64,
            addr,
        ],
    ) as i64;
    (n == len as i64).then_some(live)
}

/// Whether bytes `from..len` of `live` are each the original's or the
/// written's: the tracer's bytes, whole or torn. A write through
/// `/proc/PID/mem` goes page by page in address order and stops short when
/// its writer gets SIGKILL (the kernel checks for a fatal signal before
/// each page), so a tracer killed mid-write may leave a site with its
/// first bytes new and its last ones old. The tracer writes a site's first
/// byte as an `int3` before the others and its real first byte last
/// (`hotprobe-fastpath`'s `head_last` module): a torn site
/// starts with `int3`, unless it was written by an older tracer. Loops of
/// its own (no `memcmp`, which a probe could be on).
fn torn_or_whole(live: &[u8; LEDGER_BYTES], site: &LedgerSite, from: usize) -> bool {
    let mut i = from;
    while i < site.len && i < LEDGER_BYTES {
        if live[i] != site.original[i] && live[i] != site.written[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Puts `site`'s original back where it holds the tracer's bytes, whole
/// or torn ([`torn_or_whole`]; the first byte may be the tracer's `int3`),
/// int3 first: `Some(true)` restored, `Some(false)` the original was there
/// already (a disabled site, or one not written yet), `None` other bytes
/// there (another writer's: left as found) or unreadable.
fn restore(mem: &Mem, site: &LedgerSite) -> Option<bool> {
    let live = read_site(mem, site.addr, site.len)?;
    if same(&live, &site.original, 0, site.len) {
        return Some(false);
    }
    let head_ours = live[0] == INT3 || live[0] == site.original[0] || live[0] == site.written[0];
    if !head_ours || !torn_or_whole(&live, site, 1) {
        return None;
    }
    finish(mem, site);
    Some(true)
}

/// The three writes of a restore (a single byte: one).
fn finish(mem: &Mem, site: &LedgerSite) {
    let orig = site.original.as_ptr() as u64;
    if site.len > 1 {
        mem.write_raw(site.addr, &INT3 as *const u8 as u64, 1);
        mem.write_raw(site.addr + 1, orig + 1, site.len as u64 - 1);
    }
    mem.write_raw(site.addr, orig, 1);
}

/// A thread trapped on `at` (`rip - 1`), an `int3` no table of the trap
/// mechanism knows: if it is the first byte of a ledger site being put
/// back, its restore is finished here and the thread resumes at the site.
///
/// A site still [`LEDGER_LIVE`] (the tracer was writing it when it died:
/// its first byte goes in as an `int3`, and the undo, on another thread,
/// has not come to it yet) is claimed and put back here; the undo then
/// skips it. A memory's undo runs only once its tracer is gone (each
/// session has a memory of its own), so no live tracer's site is claimed.
pub(crate) fn resume_at_site(shm: &Shm, at: u64, gregs: &mut [libc::greg_t]) -> bool {
    let ctl = shm.ledger_ctl();
    if ctl.undo.load(Acquire) == UNDO_IDLE {
        return false;
    }
    let Some(e) = shm
        .ledger_in_use()
        .iter()
        .find(|e| e.addr.load(Relaxed) == at && e.state.load(Acquire) >= LEDGER_LIVE)
    else {
        return false;
    };
    let Some(mem) = Mem::open() else {
        return false;
    };
    if e.state
        .compare_exchange(LEDGER_LIVE, LEDGER_UNDOING, AcqRel, Acquire)
        .is_ok()
    {
        if let Some(site) = site_of(e) {
            match restore(&mem, &site) {
                Some(true) => ctl.undone.fetch_add(1, Relaxed),
                Some(false) => 0,
                None => ctl.left.fetch_add(1, Relaxed),
            };
        }
        e.state.store(LEDGER_UNDONE, Release);
    }
    let Some(site) = site_of(e) else {
        mem.close();
        return false;
    };
    let ours = match read_site(&mem, at, site.len) {
        // Our int3 with the rest the tracer's, the original, or a mix of
        // the two (a torn write, see `torn_or_whole`): a restore under
        // way, or a site the tracer was writing when it died, finished
        // here; anything else is not ours.
        Some(live) if live[0] == INT3 => {
            let rest = torn_or_whole(&live, &site, 1);
            if rest {
                finish(&mem, &site);
            }
            rest
        }
        // Put back since the trap: the thread runs the original.
        Some(_) => true,
        None => false,
    };
    mem.close();
    if ours {
        if let Some(rip) = gregs.get_mut(libc::REG_RIP as usize) {
            *rip = at as i64;
        }
    }
    ours
}

/// Whether a site of the ledger starts at `at` (published, or being put
/// back): an `int3` there may be the first byte of a site the tracer was
/// writing when it died (see [`resume_at_site`]).
pub(crate) fn is_site_at(shm: &Shm, at: u64) -> bool {
    shm.ledger_in_use()
        .iter()
        .any(|e| e.addr.load(Relaxed) == at && e.state.load(Acquire) >= LEDGER_LIVE)
}

/// `/proc/self/mem` opened with `flags` (close-on-exec added). A process
/// that is not dumpable (it changed its uid, or asked) may not open its
/// own: it is made dumpable for the `open`, and not dumpable again right
/// after (the descriptor stays usable). Raw system calls only (a signal
/// handler calls it).
pub(crate) fn open_self_mem(flags: i32) -> Option<u64> {
    let open = || {
        syscall(
            libc::SYS_open,
            [
                c"/proc/self/mem".as_ptr() as u64,
                (flags | libc::O_CLOEXEC) as u64,
                0,
                0,
            ],
        ) as i64
    };
    let mut fd = open();
    if fd == -(libc::EACCES as i64)
        && syscall(libc::SYS_prctl, [libc::PR_GET_DUMPABLE as u64, 0, 0, 0]) == 0
        && syscall(libc::SYS_prctl, [libc::PR_SET_DUMPABLE as u64, 1, 0, 0]) == 0
    {
        fd = open();
        syscall(libc::SYS_prctl, [libc::PR_SET_DUMPABLE as u64, 0, 0, 0]);
    }
    (fd >= 0).then_some(fd as u64)
}

/// `/proc/self/mem`, open for reading and writing.
struct Mem(u64);

impl Mem {
    fn open() -> Option<Mem> {
        open_self_mem(libc::O_RDWR).map(Mem)
    }

    fn read_byte(&self, addr: u64) -> Option<u8> {
        let mut b = 0u8;
        let n = syscall(
            libc::SYS_pread64,
            [self.0, &mut b as *mut u8 as u64, 1, addr],
        ) as i64;
        (n == 1).then_some(b)
    }

    fn close(self) {
        syscall(libc::SYS_close, [self.0, 0, 0, 0]);
    }

    /// Writes `len` bytes from address `from` of ours at `addr`.
    fn write_raw(&self, addr: u64, from: u64, len: u64) -> bool {
        let n = syscall(libc::SYS_pwrite64, [self.0, from, len, addr]) as i64;
        n == len as i64
    }
}
