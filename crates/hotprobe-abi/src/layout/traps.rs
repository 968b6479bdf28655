//! The trap table: breakpoint slots, return instances, scratch regions,
//! in-process sites, shared-memory handler slots.

use super::*;

/// Entries of the trap table's breakpoint part ([`TrapSlot`]; a power of two).
pub const TRAP_SLOTS: usize = 8192;
/// Entries of the trap table's return part ([`TrapReturn`]).
pub const TRAP_RETURNS: usize = 1024;
/// Entries of the trap table's region part ([`TrapRegion`]).
pub const TRAP_REGIONS: usize = 32;
/// Offset of the [`TrapReturn`] array in the trap table.
pub const TRAP_RETURNS_OFFSET: usize = TRAP_REGIONS * size_of::<TrapRegion>();
/// Offset of the [`TrapSlot`] array in the trap table.
pub const TRAP_SLOTS_OFFSET: usize = TRAP_RETURNS_OFFSET + TRAP_RETURNS * size_of::<TrapReturn>();
/// Offset of the [`InprocSite`] array in the trap table.
pub const INPROC_OFFSET: usize = TRAP_SLOTS_OFFSET + TRAP_SLOTS * size_of::<TrapSlot>();
/// Entries of the in-process trap table ([`InprocSite`]; a power of two).
pub const INPROC_SITES: usize = 4096;
/// Offset of the shared-memory handler area in the trap table: a
/// [`HandlerCtl`], then [`HandlerSlot`] × [`HANDLER_SLOTS`].
pub const HANDLER_OFFSET: usize = INPROC_OFFSET + INPROC_SITES * size_of::<InprocSite>();
/// Threads that can be in a shared-memory handler call at once (one slot
/// per thread, claimed at its first call, released when it exits).
pub const HANDLER_SLOTS: usize = 256;
/// Bytes of the trap table.
pub const TRAP_TABLE_SIZE: usize =
    HANDLER_OFFSET + size_of::<HandlerCtl>() + HANDLER_SLOTS * size_of::<HandlerSlot>();

/// [`InprocSite::info`] bit: a handler of the tracer's runs at each hit,
/// through a [`HandlerSlot`] (before the displaced instruction).
pub const INPROC_HANDLER: u32 = 1 << 9;

/// [`HandlerSlot::state`]: owned by its thread, no call in progress.
pub const HANDLER_IDLE: u32 = 0;
/// [`HandlerSlot::state`]: the thread published its registers and waits.
pub const HANDLER_REQUEST: u32 = 1;
/// [`HandlerSlot::state`]: the tracer took the request and runs the handler.
pub const HANDLER_BUSY: u32 = 2;
/// [`HandlerSlot::state`]: the handler ran; the registers are the ones to
/// resume with.
pub const HANDLER_DONE: u32 = 3;
/// [`HandlerSlot::flags`] bit (tracer): the handler changed the registers.
pub const HANDLER_MODIFIED: u32 = 1;
/// [`HandlerSlot::flags`] bit (agent): the thread sleeps on `state` (futex):
/// the tracer wakes it after storing [`HANDLER_DONE`].
pub const HANDLER_SLEEPING: u32 = 2;
/// [`HandlerSlot::flags`] bit (agent): the call comes from the handler
/// trampoline of a patch or jump site, not from an in-process trap:
/// [`HandlerSlot::addr`] and the `rip` word hold the site key (the return
/// address of the site's `call`), which the tracer maps to the site; the
/// thread resumes at the `rip` word (the key: unchanged).
pub const HANDLER_STUB: u32 = 4;
/// [`HandlerSlot::flags`] bit (agent): the call is for the probe's post
/// handler (after the displaced instruction; `rip` is where the thread
/// goes next).
pub const HANDLER_POST: u32 = 8;
/// Registers of a [`HandlerSlot`], in the order of the first words of the
/// kernel's `ucontext` `gregs`: r8–r15, rdi, rsi, rbp, rbx, rdx, rax, rcx,
/// rsp, rip, rflags.
pub const HANDLER_REGS: usize = 18;

/// Control words of the shared-memory handler area.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct HandlerCtl {
    /// Bumped by the agent after each request (the tracer's futex word).
    pub doorbell: AtomicU32,
    /// Non-zero while the tracer sleeps on `doorbell`: the agent wakes it.
    pub tracer_sleeping: AtomicU32,
    /// Slots claimed so far (the tracer scans `0..in_use`).
    pub in_use: AtomicU32,
    /// Reserved, zero.
    pub reserved: u32,
    /// Nanoseconds a thread spins for the answer before it sleeps (tracer).
    pub spin_ns: AtomicU64,
    /// Nanoseconds after which a thread gives up a request the tracer has
    /// not taken, and resumes unmodified (tracer; 0: one second).
    pub timeout_ns: AtomicU64,
    /// Calls given up that way, or refused (no slot, a thread already in
    /// a call), all probes together (agent; each is also counted in the
    /// probe's missed counter, [`Header::missed_offset`]: its `nmissed`).
    pub missed: AtomicU64,
    /// Run-time address of `hotprobe_agent_handler_trampoline` (agent): a
    /// patched site or jump trampoline of a handler probe calls it; it
    /// saves the register file and makes the call through the thread's
    /// [`HandlerSlot`] (with [`HANDLER_STUB`]), no signal.
    pub handler_trampoline: AtomicU64,
    /// Reserved, zero.
    pub reserved2: [u64; 2],
}
const _: () = assert!(size_of::<HandlerCtl>() == 64);

/// One thread's shared-memory handler call: the agent's `SIGTRAP` handler
/// stores the registers and the site's counter, sets `state` to
/// [`HANDLER_REQUEST`] (Release) and waits for [`HANDLER_DONE`]; the tracer
/// moves it to [`HANDLER_BUSY`] (CAS), runs the handler, writes the
/// registers back with [`HANDLER_MODIFIED`], and stores `DONE` (Release).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct HandlerSlot {
    /// [`HANDLER_IDLE`], [`HANDLER_REQUEST`], [`HANDLER_BUSY`],
    /// [`HANDLER_DONE`]; the agent's futex word.
    pub state: AtomicU32,
    /// The owning thread (Linux tid); 0 = free.
    pub tid: AtomicU32,
    /// The site's counter (fast-path probe id) of the call.
    pub counter: AtomicU32,
    /// [`HANDLER_MODIFIED`], [`HANDLER_SLEEPING`].
    pub flags: AtomicU32,
    /// The probed address (the `int3`).
    pub addr: AtomicU64,
    /// The registers (see [`HANDLER_REGS`]).
    pub regs: [AtomicU64; HANDLER_REGS],
}
const _: () = assert!(size_of::<HandlerSlot>() == 192);

/// [`InprocSite::info`]: the thread resumes at [`InprocSite::resume`] (a
/// boosted copy of the displaced instruction followed by a `jmp` back).
pub const INPROC_BOOST: u32 = 1;
/// [`InprocSite::info`]: the displaced instruction is a `ret`, emulated
/// (`rip = [rsp]`, `rsp += 8`); `resume` is unused.
pub const INPROC_RET: u32 = 2;
/// [`InprocSite::info`]: the displaced instruction is a `call rel32`,
/// emulated (push `next`, `rip = resume`).
pub const INPROC_CALL: u32 = 3;
/// Mask of the execution kind in [`InprocSite::info`].
pub const INPROC_KIND_MASK: u32 = 0xff;
/// [`InprocSite::info`] bit: hits are counted (cleared at detach; the entry
/// stays, so that a thread whose `SIGTRAP` is still pending when the
/// original byte goes back is still sent to the copy).
pub const INPROC_COUNT: u32 = 1 << 8;
/// [`InprocSite::info`] bit: each hit (while [`INPROC_COUNT`] is set) also
/// writes an entry event into its thread's ring, as the fast path's
/// `ACTION_RECORD` does (the handler registers a thread at its first hit).
pub const INPROC_RECORD: u32 = 1 << 10;
/// [`InprocSite::info`] bit, with [`INPROC_HANDLER`]: the tracer's post
/// handler runs after the displaced instruction — in the same signal for
/// an emulated one; for a boosted one at the `int3` that follows its copy
/// (an [`INPROC_POST_SITE`] entry, whose address is this entry's `next`).
pub const INPROC_POST: u32 = 1 << 12;
/// [`InprocSite::info`] bit: this entry is the `int3` after a boosted copy
/// (see [`INPROC_POST`]): no count; with [`INPROC_HANDLER`] the post
/// handler runs; the thread resumes at `resume` (the instruction after
/// the probed one); `next` is the probed instruction's address.
pub const INPROC_POST_SITE: u32 = 1 << 13;
/// [`InprocSite::info`] bit, with [`INPROC_RECORD`] at a function's first
/// instruction: the return is hooked (the return address on top of the
/// stack swapped for the agent's return trampoline, which records the
/// exit), as the fast path's `ACTION_EXIT` does.
pub const INPROC_EXIT: u32 = 1 << 11;

/// An *in-process trap*: an `int3` the agent's `SIGTRAP` handler takes
/// inside the target (no ptrace stop): it counts into `counter` (the
/// thread's own counter array, or the global one), then executes the
/// displaced instruction as `info` says and returns from the signal.
/// Open addressing keyed by `addr` ([`site_hash`] with the shift of
/// [`INPROC_SITES`], linear probing); keys are never removed. Single writer:
/// the tracer, which fills every field before publishing `addr` (Release);
/// the agent reads it in its `SIGTRAP` handler.
#[repr(C)]
#[derive(Debug)]
pub struct InprocSite {
    /// Address of the `int3` (the probed instruction); 0 = empty.
    pub addr: AtomicU64,
    /// Where the thread resumes: the boosted copy, or the `call`'s target.
    pub resume: AtomicU64,
    /// For an emulated `call`: the return address it pushes.
    pub next: AtomicU64,
    /// Counter index (a fast-path probe id).
    pub counter: AtomicU32,
    /// [`INPROC_BOOST`], [`INPROC_RET`] or [`INPROC_CALL`], and [`INPROC_COUNT`],
    /// [`INPROC_HANDLER`], [`INPROC_RECORD`], [`INPROC_EXIT`].
    pub info: AtomicU32,
}
const _: () = assert!(size_of::<InprocSite>() == 32);

/// [`TrapSlot::info`] bit: the slot describes an `int3` the tracer wrote
/// (cleared when the tracer takes it out; the address stays as the key).
pub const TRAP_PRESENT: u32 = 1 << 8;
/// [`TrapSlot::info`] bit: this `int3` is the tracer's return trampoline:
/// a thread reaching it returns from a function whose return address the
/// tracer swapped; the real one is in a [`TrapReturn`].
pub const TRAP_RETURN: u32 = 1 << 9;
/// [`TrapSlot::info`] bit: this `int3` is a *guard*, one byte into an
/// instruction of 2 bytes or more whose first byte is a published `int3`.
/// No thread runs it while the tracer lives. It catches a thread the
/// tracer had stopped at that `int3` when it died: the kernel drops the
/// stop's `SIGTRAP` and resumes the thread one byte past the `int3` — on
/// the guard, whose `SIGTRAP` then reaches the agent.
pub const TRAP_GUARD: u32 = 1 << 10;

/// One `int3` the tracer wrote into the target (trap probes, the return
/// trampoline, the loader-rendezvous breakpoint), published so that the
/// agent can undo it when the tracer is gone (killed with SIGKILL: nothing
/// was restored). Open addressing keyed by the address ([`site_hash`] with
/// the shift of [`TRAP_SLOTS`], linear probing); keys are never removed,
/// an entry the tracer takes out loses [`TRAP_PRESENT`]. Single writer: the
/// tracer; the agent reads it in its `SIGTRAP` handler.
#[repr(C)]
#[derive(Debug)]
pub struct TrapSlot {
    /// Address of the `int3`; 0 = empty.
    pub addr: AtomicU64,
    /// The original byte (bits 0–7), [`TRAP_PRESENT`], [`TRAP_RETURN`],
    /// [`TRAP_GUARD`].
    pub info: AtomicU32,
    /// Reserved, zero.
    pub reserved: u32,
}
const _: () = assert!(size_of::<TrapSlot>() == 16);

/// A live call of a trap return probe: the tracer swapped the return
/// address at `slot` of thread `tid` for its return trampoline; the real
/// one is `real`. `tid` 0 = free. Single writer: the tracer (tid last on
/// publish, first on removal); the agent reads the entries of its own
/// thread in its `SIGTRAP` handler.
#[repr(C)]
#[derive(Debug)]
pub struct TrapReturn {
    /// The thread (Linux tid); 0 = free.
    pub tid: AtomicU32,
    /// Reserved, zero.
    pub reserved: u32,
    /// Address of the return-address slot on the thread's stack.
    pub slot: AtomicU64,
    /// The real return address.
    pub real: AtomicU64,
    /// Reserved, zero.
    pub reserved2: u64,
}
const _: () = assert!(size_of::<TrapReturn>() == 32);

/// Memory where the tracer runs displaced instructions out of line
/// (`start..end`; both 0 = unused). A thread the tracer had moved there
/// when it died runs on from there.
#[repr(C)]
#[derive(Debug)]
pub struct TrapRegion {
    /// First byte.
    pub start: AtomicU64,
    /// One past the last byte.
    pub end: AtomicU64,
}
const _: () = assert!(size_of::<TrapRegion>() == 16);
