//! The shared memory between hotprobe and its QEMU TCG plugin
//! (`hotprobe-qemu-plugin`, loaded into a QEMU that hotprobe starts).
//!
//! One memfd, created by hotprobe, opened by the plugin through
//! `/proc/HOTPROBE_PID/fd/N` (the `shm=` plugin argument), laid out as:
//!
//! - a [`PluginHeader`] (magic [`PLUGIN_MAGIC`], version [`PLUGIN_VERSION`],
//!   sizes and offsets, the control words hotprobe writes, the status words
//!   the plugin writes);
//! - `max_probes` [`ProbeDef`]s: each probe's kind, delivery, what its
//!   events carry ([`Fetch`] values, a guest string), its filters, and its
//!   `enabled` flag;
//! - `max_sites` [`SiteDef`]s: the candidate addresses, each naming its
//!   probe. The plugin instruments them when it translates guest code; a
//!   return probe's `ret` instructions are found by the plugin in the
//!   function's range ([`ProbeDef::range_start`]..[`ProbeDef::range_end`])
//!   as it translates it;
//! - one block per vCPU ([`VcpuCtl`], then the synchronous mailbox's event
//!   slot, the vCPU's [`ProbeCounters`] per probe, then its ring of event
//!   slots). The vCPU's thread is the only writer of its counters and the
//!   only producer of its ring; hotprobe is the only consumer.
//!
//! Sites and probe definitions are written before the VM runs and frozen
//! ([`PluginHeader::frozen`]); afterwards hotprobe only flips
//! [`ProbeDef::enabled`] and bumps [`PluginHeader::generation`], which the
//! plugin applies to its conditional-callback scoreboard and acknowledges in
//! [`PluginHeader::applied`] (both futex words). Nothing is retranslated.
//!
//! An event slot is `slot_size` bytes (a power of two ≥ 128): words
//! `[tsc, meta, cr3, pc, v0..v5]` ([`EVENT_FIXED`] bytes) then up to
//! `slot_size - EVENT_FIXED` bytes of data (a guest string). `meta` is
//! `probe | kind << 24 | nvalues << 26 | flags << 29 | data_len << 32`.

use core::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use core::sync::atomic::{AtomicU32, AtomicU64};

use crate::AbiError;

/// First word of the mapping.
pub const PLUGIN_MAGIC: u64 = u64::from_le_bytes(*b"HPQEMUPL");
/// Layout version; both sides refuse any other.
pub const PLUGIN_VERSION: u32 = 2;
/// Bytes of the header.
pub const PLUGIN_HEADER_SIZE: usize = 512;
/// Bytes of an event slot before its data.
pub const EVENT_FIXED: usize = 80;
/// Values an event carries at most.
pub const MAX_VALUES: usize = 6;

/// [`ProbeDef::kind`]: hits at the site(s).
pub const PROBE_ENTRY: u32 = 0;
/// [`ProbeDef::kind`]: entries at the site, returns at the function's `ret`s
/// (matched by stack pointer per vCPU, bounded by `maxactive`).
pub const PROBE_RETURN: u32 = 1;

/// [`ProbeDef::delivery`]: counts only.
pub const DELIVER_COUNT: u32 = 0;
/// [`ProbeDef::delivery`]: events into the vCPU's ring; a full ring drops
/// (counted); the guest never waits.
pub const DELIVER_ASYNC: u32 = 1;
/// [`ProbeDef::delivery`]: the vCPU posts the event in its mailbox and waits
/// for hotprobe's answer (spinning, then a futex), at most
/// [`PluginHeader::sync_timeout_ms`], and not at all while hotprobe's
/// heartbeat is stale.
pub const DELIVER_SYNC: u32 = 2;

/// Event kinds (the values of `hotprobe_abi::KIND_*`).
pub const EV_ENTRY: u8 = crate::KIND_ENTRY;
/// A return (values: rax, rdx, rsp at the `ret` — the entry's rsp — and
/// the current task's pid when the header has a [`TaskLayout`], else 0).
pub const EV_EXIT: u8 = crate::KIND_EXIT;
/// A hit of an entry probe that is not followed to its return.
pub const EV_HIT: u8 = crate::KIND_HIT;

/// [`PluginHeader::plugin_state`]: not attached yet.
pub const PLUGIN_NONE: u32 = 0;
/// The plugin mapped the memory and is installed.
pub const PLUGIN_INSTALLED: u32 = 1;
/// QEMU is exiting (atexit callback ran).
pub const PLUGIN_EXITED: u32 = 2;

/// Mailbox states ([`VcpuCtl::mbox_state`]).
pub const MBOX_FREE: u32 = 0;
/// The vCPU posted an event and waits.
pub const MBOX_POSTED: u32 = 1;
/// hotprobe answered ([`VcpuCtl::mbox_answer`]).
pub const MBOX_ANSWERED: u32 = 2;

/// [`ProbeDef::filter_index`] for "no value filter".
pub const NO_FILTER: u32 = u32::MAX;

/// Guest registers a [`Fetch`] can name (the plugin reads them through
/// QEMU's register API, by their gdb names).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reg {
    /// rax
    Rax = 0,
    /// rbx
    Rbx,
    /// rcx
    Rcx,
    /// rdx
    Rdx,
    /// rsi
    Rsi,
    /// rdi
    Rdi,
    /// rbp
    Rbp,
    /// rsp
    Rsp,
    /// r8
    R8,
    /// r9
    R9,
    /// r10
    R10,
    /// r11
    R11,
    /// r12
    R12,
    /// r13
    R13,
    /// r14
    R14,
    /// r15
    R15,
    /// rip
    Rip,
    /// eflags
    Eflags,
    /// cr3
    Cr3,
    /// gs_base (in the kernel: this CPU's per-cpu area)
    GsBase,
}

/// Number of [`Reg`]s.
pub const N_REGS: usize = 20;

impl Reg {
    /// Every register, in number order.
    pub const ALL: [Reg; N_REGS] = [
        Reg::Rax,
        Reg::Rbx,
        Reg::Rcx,
        Reg::Rdx,
        Reg::Rsi,
        Reg::Rdi,
        Reg::Rbp,
        Reg::Rsp,
        Reg::R8,
        Reg::R9,
        Reg::R10,
        Reg::R11,
        Reg::R12,
        Reg::R13,
        Reg::R14,
        Reg::R15,
        Reg::Rip,
        Reg::Eflags,
        Reg::Cr3,
        Reg::GsBase,
    ];

    /// The System V argument registers, in order (a kernel function's
    /// arguments; `__x64_sys_*` take a `struct pt_regs *` in rdi).
    pub const ARGS: [Reg; 6] = [Reg::Rdi, Reg::Rsi, Reg::Rdx, Reg::Rcx, Reg::R8, Reg::R9];

    /// Its gdb name (QEMU's x86-64 register description).
    pub const fn name(self) -> &'static str {
        [
            "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11",
            "r12", "r13", "r14", "r15", "rip", "eflags", "cr3", "gs_base",
        ][self as usize]
    }

    /// The register numbered `n`.
    pub const fn from_index(n: usize) -> Option<Reg> {
        if n < N_REGS {
            Some(Reg::ALL[n])
        } else {
            None
        }
    }

    /// The register named `name` (gdb names).
    pub fn from_name(name: &str) -> Option<Reg> {
        Reg::ALL.iter().copied().find(|r| r.name() == name)
    }
}

/// How one value of an event is obtained in the plugin's callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// A register.
    Reg(Reg),
    /// `size` bytes (1, 2, 4 or 8, zero-extended) of guest memory at
    /// `reg + offset` (a guest virtual address).
    Load {
        /// Base register.
        reg: Reg,
        /// Byte offset.
        offset: i32,
        /// 1, 2, 4 or 8.
        size: u8,
    },
    /// `size` bytes at `value[index] + offset`, `index` an earlier value
    /// of the same event (a field of a structure pointed to by a field).
    LoadValue {
        /// The earlier value.
        index: u8,
        /// Byte offset.
        offset: i32,
        /// 1, 2, 4 or 8.
        size: u8,
    },
    /// A field of the guest's current task (Linux): read through the
    /// per-cpu `current_task` pointer at `gs_base` + the header's
    /// [`TaskLayout`] (0 when hotprobe gave no layout).
    Task(TaskField),
}

/// A field of the current task a [`Fetch::Task`] reads.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskField {
    /// `task_struct.pid` (the thread id).
    Pid = 0,
    /// `task_struct.tgid` (the process id).
    Tgid = 1,
    /// The first 8 bytes of `task_struct.comm`, little-endian.
    Comm = 2,
    /// The `task_struct *` itself.
    Pointer = 3,
}

/// Where Linux keeps the current task and its fields, for [`Fetch::Task`]:
/// byte offsets (from the kernel's BTF), written by hotprobe before the
/// freeze. All zero: unknown.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskLayout {
    /// Offset of the `current_task` pointer in the per-cpu area (gs_base).
    pub current: u64,
    /// `task_struct.pid`.
    pub pid: u32,
    /// `task_struct.tgid`.
    pub tgid: u32,
    /// `task_struct.comm`.
    pub comm: u32,
    /// Reserved.
    pub _pad: u32,
}

impl TaskLayout {
    /// Whether hotprobe gave one.
    pub const fn is_known(&self) -> bool {
        self.pid != 0 && self.comm != 0
    }
}

const FETCH_REG: u64 = 1;
const FETCH_LOAD: u64 = 2;
const FETCH_LOAD_VALUE: u64 = 3;
const FETCH_TASK: u64 = 4;

impl Fetch {
    /// `struct pt_regs` field `index` (0 = r15 … 14 = di, 15 = orig_ax, 16
    /// = ip …) as a load through `rdi`: the `pt_regs *` a `__x64_sys_*`
    /// wrapper gets.
    pub const fn pt_regs_field(index: u32) -> Fetch {
        Fetch::Load {
            reg: Reg::Rdi,
            offset: (index * 8) as i32,
            size: 8,
        }
    }

    /// The packed form stored in [`ProbeDef::fetch`]: `op | reg << 4 |
    /// size_log2 << 9 | index << 12 | offset << 32`.
    pub const fn encode(self) -> u64 {
        const fn log2(s: u8) -> u64 {
            match s {
                1 => 0,
                2 => 1,
                4 => 2,
                _ => 3,
            }
        }
        match self {
            Fetch::Reg(r) => FETCH_REG | (r as u64) << 4,
            Fetch::Load { reg, offset, size } => {
                FETCH_LOAD | (reg as u64) << 4 | log2(size) << 9 | (offset as u32 as u64) << 32
            }
            Fetch::LoadValue {
                index,
                offset,
                size,
            } => {
                FETCH_LOAD_VALUE
                    | log2(size) << 9
                    | ((index & 7) as u64) << 12
                    | (offset as u32 as u64) << 32
            }
            Fetch::Task(f) => FETCH_TASK | (f as u64) << 4,
        }
    }

    /// The fetch packed in `w` (`None` for 0 or garbage).
    pub const fn decode(w: u64) -> Option<Fetch> {
        let size = 1u8 << ((w >> 9) & 3);
        let offset = (w >> 32) as u32 as i32;
        let reg = match Reg::from_index(((w >> 4) & 31) as usize) {
            Some(r) => r,
            None => return None,
        };
        match w & 15 {
            FETCH_REG => Some(Fetch::Reg(reg)),
            FETCH_LOAD => Some(Fetch::Load { reg, offset, size }),
            FETCH_LOAD_VALUE => Some(Fetch::LoadValue {
                index: ((w >> 12) & 7) as u8,
                offset,
                size,
            }),
            FETCH_TASK => match (w >> 4) & 31 {
                0 => Some(Fetch::Task(TaskField::Pid)),
                1 => Some(Fetch::Task(TaskField::Tgid)),
                2 => Some(Fetch::Task(TaskField::Comm)),
                3 => Some(Fetch::Task(TaskField::Pointer)),
                _ => None,
            },
            _ => None,
        }
    }
}

/// A guest string an event carries: the NUL-terminated bytes at
/// `value[index]`, at most `max_len` (and what the slot holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StringFetch {
    /// The value holding the string's guest address.
    pub index: u8,
    /// Bytes at most.
    pub max_len: u16,
}

impl StringFetch {
    /// Packed: `1 | index << 8 | max_len << 16` (0: none).
    pub const fn encode(s: Option<StringFetch>) -> u64 {
        match s {
            None => 0,
            Some(s) => 1 | (s.index as u64) << 8 | (s.max_len as u64) << 16,
        }
    }

    /// See [`StringFetch::encode`].
    pub const fn decode(w: u64) -> Option<StringFetch> {
        if w & 1 == 0 {
            return None;
        }
        Some(StringFetch {
            index: ((w >> 8) & 7) as u8,
            max_len: (w >> 16) as u16,
        })
    }
}

/// The mapping's header.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct PluginHeader {
    /// [`PLUGIN_MAGIC`], written last by the creator.
    pub magic: u64,
    /// [`PLUGIN_VERSION`].
    pub version: u32,
    /// [`PLUGIN_HEADER_SIZE`].
    pub header_size: u32,
    /// Bytes of the mapping.
    pub total_size: u64,
    /// Probe definitions.
    pub max_probes: u32,
    /// Site definitions.
    pub max_sites: u32,
    /// vCPU blocks (vCPUs with a higher index count nothing and record
    /// nothing; [`PluginHeader::vcpu_overflow`] says how often).
    pub max_vcpus: u32,
    /// Events per vCPU ring, a power of two.
    pub ring_capacity: u32,
    /// Bytes per event slot, a power of two ≥ 128.
    pub slot_size: u32,
    /// Reserved.
    pub _pad0: u32,
    /// Offset of the [`ProbeDef`] array.
    pub probes_offset: u64,
    /// Offset of the [`SiteDef`] array.
    pub sites_offset: u64,
    /// Offset of vCPU 0's block.
    pub vcpus_offset: u64,
    /// Bytes between vCPU blocks.
    pub vcpu_stride: u64,
    /// A `jmp` to this address is a return (the kernel's
    /// `__x86_return_thunk`), 0 if none.
    pub return_thunk: u64,

    // --- written by hotprobe ---
    /// Probes defined (≤ `max_probes`).
    pub n_probes: AtomicU32,
    /// Sites defined (≤ `max_sites`).
    pub n_sites: AtomicU32,
    /// 1 once sites and probe definitions are final (before the VM runs);
    /// the plugin instruments nothing before.
    pub frozen: AtomicU32,
    /// Bumped after `enabled` flags change (futex word).
    pub generation: AtomicU32,
    /// hotprobe's `CLOCK_MONOTONIC` time, ns, refreshed every few ms.
    pub heartbeat_ns: AtomicU64,
    /// hotprobe's pid.
    pub host_pid: u32,
    /// A synchronous event waits at most this long (ms).
    pub sync_timeout_ms: u32,
    /// A heartbeat older than this (ms) means hotprobe is gone: synchronous
    /// events do not wait.
    pub stale_ms: u32,
    /// How long (ns) a vCPU spins (`pause`, the clock read every few
    /// spins) waiting for an answer before it sleeps on the futex.
    pub sync_spin_ns: u32,
    /// Bumped by a vCPU posting a synchronous event (futex word).
    pub doorbell: AtomicU32,
    /// hotprobe sleeps on `doorbell`: a vCPU that posts wakes it.
    pub host_sleeping: AtomicU32,

    // --- written by the plugin ---
    /// The last `generation` applied to the plugin's scoreboard (futex word).
    pub applied: AtomicU32,
    /// `PLUGIN_*`.
    pub plugin_state: AtomicU32,
    /// vCPUs initialised.
    pub vcpus: AtomicU32,
    /// QEMU's plugin API version (`info->version.cur`).
    pub qemu_api: AtomicU32,
    /// Translation blocks seen.
    pub translations: AtomicU64,
    /// Instructions instrumented (a site translated again counts again).
    pub instrumented: AtomicU64,
    /// Translations before `frozen` (not instrumented).
    pub early_translations: AtomicU64,
    /// Synchronous events released by the timeout.
    pub sync_timeouts: AtomicU64,
    /// Synchronous events not delivered because hotprobe was gone.
    pub orphaned: AtomicU64,
    /// Guest memory reads that failed (value 0, or no string).
    pub read_errors: AtomicU64,
    /// Hits on vCPUs beyond `max_vcpus`.
    pub vcpu_overflow: AtomicU64,
    /// The plugin's process id (QEMU's).
    pub plugin_pid: AtomicU32,
    /// Reserved.
    pub _pad1: u32,
    /// Where the guest kernel keeps its current task ([`Fetch::Task`],
    /// exit events' task), written by hotprobe before the freeze.
    pub task: TaskLayout,
    /// Synchronous events whose vCPU slept on the futex (the answer did
    /// not come within `sync_spin_ns`).
    pub sync_vcpu_sleeps: AtomicU64,
    /// Synchronous events whose vCPU had to wake hotprobe's service thread
    /// (it slept on `doorbell`).
    pub sync_host_wakes: AtomicU64,
    /// Total time (ns) vCPUs waited for answers, from posting the event to
    /// reading the answer.
    pub sync_wait_ns: AtomicU64,
}

const _: () = assert!(core::mem::size_of::<PluginHeader>() <= PLUGIN_HEADER_SIZE);

/// One probe.
#[repr(C)]
#[derive(Debug)]
pub struct ProbeDef {
    /// 1 when enabled (hotprobe writes, bumps the generation).
    pub enabled: AtomicU32,
    /// `PROBE_*`.
    pub kind: u32,
    /// `DELIVER_*`.
    pub delivery: u32,
    /// Values its entry events carry (≤ [`MAX_VALUES`]).
    pub nfetch: u32,
    /// [`Fetch::encode`]d, `nfetch` of them.
    pub fetch: [u64; MAX_VALUES],
    /// [`StringFetch::encode`]d.
    pub string: u64,
    /// Only hits whose cr3 (page-table base, low 12 bits masked) equals
    /// this count (0: any).
    pub filter_cr3: u64,
    /// Only hits whose value `filter_index` equals this count.
    pub filter_value: u64,
    /// [`NO_FILTER`] or a value index.
    pub filter_index: u32,
    /// Live return instances per vCPU (return probes).
    pub maxactive: u32,
    /// A return probe's function: its `ret`s in `[range_start, range_end)`.
    pub range_start: u64,
    /// End of the range.
    pub range_end: u64,
    /// Reserved.
    pub _reserved: [u64; 2],
}

const _: () = assert!(core::mem::size_of::<ProbeDef>() == 128);

/// A candidate address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SiteDef {
    /// Guest virtual address of the instruction.
    pub vaddr: u64,
    /// The probe.
    pub probe: u32,
    /// Reserved (0).
    pub flags: u32,
}

/// A probe's counts on one vCPU (one writer: that vCPU's thread).
#[repr(C)]
#[derive(Debug, Default)]
pub struct ProbeCounters {
    /// Hits (entries) that passed the filters.
    pub hits: AtomicU64,
    /// Returns matched.
    pub returns: AtomicU64,
    /// Entries not followed to their return (`maxactive` live already), and
    /// instances abandoned (a `ret` above them).
    pub nmissed: AtomicU64,
    /// Hits the filters left out.
    pub filtered: AtomicU64,
}

/// The control block of one vCPU.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct VcpuCtl {
    /// Events pushed (the producer's counter).
    pub head: AtomicU64,
    _p0: [u64; 7],
    /// Events consumed (hotprobe's).
    pub tail: AtomicU64,
    _p1: [u64; 7],
    /// Events dropped because the ring was full.
    pub dropped: AtomicU64,
    /// 1 once this vCPU was seen by the plugin.
    pub live: AtomicU32,
    /// 1 while the vCPU sleeps on `mbox_state` (hotprobe wakes it only
    /// then; a spinning vCPU costs it no system call).
    pub mbox_waiting: AtomicU32,
    _p2: [u64; 6],
    /// `MBOX_*`.
    pub mbox_state: AtomicU32,
    /// Requests posted (sequence).
    pub mbox_seq: AtomicU32,
    /// hotprobe's answer.
    pub mbox_answer: AtomicU64,
    /// Synchronous events answered.
    pub sync_answered: AtomicU64,
    _p3: [u64; 5],
}

const _: () = assert!(core::mem::size_of::<VcpuCtl>() == 256);

/// Sizes hotprobe picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PluginParams {
    /// Probe definitions.
    pub max_probes: u32,
    /// Candidate sites.
    pub max_sites: u32,
    /// vCPU blocks.
    pub max_vcpus: u32,
    /// Events per vCPU ring (power of two ≥ 2).
    pub ring_capacity: u32,
    /// Bytes per event slot (power of two, 128..=4096).
    pub slot_size: u32,
}

/// Offsets computed from [`PluginParams`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PluginLayout {
    /// The parameters.
    pub params: PluginParams,
    /// See [`PluginHeader::probes_offset`].
    pub probes_offset: usize,
    /// See [`PluginHeader::sites_offset`].
    pub sites_offset: usize,
    /// See [`PluginHeader::vcpus_offset`].
    pub vcpus_offset: usize,
    /// Inside a vCPU block: the mailbox's event slot.
    pub mbox_offset: usize,
    /// Inside a vCPU block: the counters.
    pub counters_offset: usize,
    /// Inside a vCPU block: the ring.
    pub ring_offset: usize,
    /// See [`PluginHeader::vcpu_stride`].
    pub vcpu_stride: usize,
    /// Bytes of the mapping.
    pub total_size: usize,
}

const fn align_up(x: usize, a: usize) -> usize {
    (x + a - 1) & !(a - 1)
}

impl PluginLayout {
    /// The layout for `p`, refusing sizes that are zero, not powers of two
    /// where required, or absurd.
    pub fn new(p: PluginParams) -> Result<PluginLayout, AbiError> {
        if p.max_probes == 0 || p.max_probes > 1 << 16 {
            return Err(AbiError::BadParams("max_probes in 1..=65536"));
        }
        if p.max_sites == 0 || p.max_sites > 1 << 20 {
            return Err(AbiError::BadParams("max_sites in 1..=2^20"));
        }
        if p.max_vcpus == 0 || p.max_vcpus > 1024 {
            return Err(AbiError::BadParams("max_vcpus in 1..=1024"));
        }
        if p.ring_capacity < 2 || !p.ring_capacity.is_power_of_two() || p.ring_capacity > 1 << 22 {
            return Err(AbiError::BadParams(
                "ring_capacity a power of two in 2..=2^22",
            ));
        }
        if p.slot_size < 128 || !p.slot_size.is_power_of_two() || p.slot_size > 4096 {
            return Err(AbiError::BadParams(
                "slot_size a power of two in 128..=4096",
            ));
        }
        let probes_offset = PLUGIN_HEADER_SIZE;
        let sites_offset = align_up(
            probes_offset + p.max_probes as usize * core::mem::size_of::<ProbeDef>(),
            64,
        );
        let vcpus_offset = align_up(
            sites_offset + p.max_sites as usize * core::mem::size_of::<SiteDef>(),
            4096,
        );
        let mbox_offset = core::mem::size_of::<VcpuCtl>();
        let counters_offset = mbox_offset + p.slot_size as usize;
        let ring_offset = align_up(
            counters_offset + p.max_probes as usize * core::mem::size_of::<ProbeCounters>(),
            64,
        );
        let vcpu_stride = align_up(
            ring_offset + p.ring_capacity as usize * p.slot_size as usize,
            4096,
        );
        let total_size = vcpus_offset + vcpu_stride * p.max_vcpus as usize;
        Ok(PluginLayout {
            params: p,
            probes_offset,
            sites_offset,
            vcpus_offset,
            mbox_offset,
            counters_offset,
            ring_offset,
            vcpu_stride,
            total_size,
        })
    }
}

/// A validated view of a plugin mapping (both sides).
#[derive(Debug)]
pub struct PluginShm {
    base: *mut u8,
    layout: PluginLayout,
}

// SAFETY: shared state is reached through atomics and volatile copies; the
// pointer is an address inside a mapping that outlives the view (contract
// of `create` / `attach`).
unsafe impl Send for PluginShm {}
// SAFETY: as above.
unsafe impl Sync for PluginShm {}

/// One decoded event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PluginEvent {
    /// Host time stamp counter at the hit.
    pub tsc: u64,
    /// The plugin probe index.
    pub probe: u32,
    /// `EV_*`.
    pub kind: u8,
    /// Values meaningful.
    pub nvalues: u8,
    /// Flags (reserved).
    pub flags: u8,
    /// The vCPU.
    pub vcpu: u32,
    /// cr3 at the hit.
    pub cr3: u64,
    /// The instruction's address.
    pub pc: u64,
    /// Values.
    pub values: [u64; MAX_VALUES],
    /// Bytes of data in the slot.
    pub data_len: u16,
}

/// Packs an event's meta word.
pub const fn pack_event_meta(probe: u32, kind: u8, nvalues: u8, data_len: u16) -> u64 {
    (probe as u64 & 0xff_ffff)
        | ((kind as u64) & 3) << 24
        | ((nvalues as u64) & 7) << 26
        | (data_len as u64) << 32
}

impl PluginShm {
    /// Writes a fresh header for `params` (hotprobe's side). The memory must
    /// be zero-filled (a new memfd is).
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes, page-aligned,
    /// for as long as the view lives, and nobody else may use it before this
    /// returns.
    pub unsafe fn create(ptr: *mut u8, len: usize, params: PluginParams) -> Result<Self, AbiError> {
        let layout = PluginLayout::new(params)?;
        if ptr.is_null() {
            return Err(AbiError::Null);
        }
        if (ptr as usize) & 4095 != 0 {
            return Err(AbiError::Misaligned);
        }
        if len < layout.total_size {
            return Err(AbiError::TooSmall {
                needed: layout.total_size,
                len,
            });
        }
        let h = ptr as *mut PluginHeader;
        // SAFETY: valid, exclusive, aligned memory (contract, checked above);
        // plain fields written through raw field pointers.
        unsafe {
            core::ptr::addr_of_mut!((*h).version).write(PLUGIN_VERSION);
            core::ptr::addr_of_mut!((*h).header_size).write(PLUGIN_HEADER_SIZE as u32);
            core::ptr::addr_of_mut!((*h).total_size).write(layout.total_size as u64);
            core::ptr::addr_of_mut!((*h).max_probes).write(params.max_probes);
            core::ptr::addr_of_mut!((*h).max_sites).write(params.max_sites);
            core::ptr::addr_of_mut!((*h).max_vcpus).write(params.max_vcpus);
            core::ptr::addr_of_mut!((*h).ring_capacity).write(params.ring_capacity);
            core::ptr::addr_of_mut!((*h).slot_size).write(params.slot_size);
            core::ptr::addr_of_mut!((*h).probes_offset).write(layout.probes_offset as u64);
            core::ptr::addr_of_mut!((*h).sites_offset).write(layout.sites_offset as u64);
            core::ptr::addr_of_mut!((*h).vcpus_offset).write(layout.vcpus_offset as u64);
            core::ptr::addr_of_mut!((*h).vcpu_stride).write(layout.vcpu_stride as u64);
            core::ptr::addr_of_mut!((*h).sync_timeout_ms).write(1000);
            core::ptr::addr_of_mut!((*h).stale_ms).write(300);
            core::ptr::addr_of_mut!((*h).sync_spin_ns).write(5_000);
            for p in 0..params.max_probes as usize {
                let d = ptr.add(layout.probes_offset + p * core::mem::size_of::<ProbeDef>())
                    as *mut ProbeDef;
                core::ptr::addr_of_mut!((*d).filter_index).write(NO_FILTER);
            }
            core::ptr::addr_of_mut!((*h).magic).write_volatile(PLUGIN_MAGIC);
        }
        Ok(PluginShm { base: ptr, layout })
    }

    /// Validates an existing mapping (the plugin's side).
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long as
    /// the view lives.
    pub unsafe fn attach(ptr: *mut u8, len: usize) -> Result<Self, AbiError> {
        if ptr.is_null() {
            return Err(AbiError::Null);
        }
        if (ptr as usize) & 63 != 0 {
            return Err(AbiError::Misaligned);
        }
        if len < PLUGIN_HEADER_SIZE {
            return Err(AbiError::TooSmall {
                needed: PLUGIN_HEADER_SIZE,
                len,
            });
        }
        let h = ptr as *const PluginHeader;
        // SAFETY: valid for PLUGIN_HEADER_SIZE bytes (checked), aligned;
        // volatile reads of plain fields.
        let (magic, version, params, offsets) = unsafe {
            (
                core::ptr::addr_of!((*h).magic).read_volatile(),
                core::ptr::addr_of!((*h).version).read_volatile(),
                PluginParams {
                    max_probes: core::ptr::addr_of!((*h).max_probes).read_volatile(),
                    max_sites: core::ptr::addr_of!((*h).max_sites).read_volatile(),
                    max_vcpus: core::ptr::addr_of!((*h).max_vcpus).read_volatile(),
                    ring_capacity: core::ptr::addr_of!((*h).ring_capacity).read_volatile(),
                    slot_size: core::ptr::addr_of!((*h).slot_size).read_volatile(),
                },
                [
                    core::ptr::addr_of!((*h).probes_offset).read_volatile(),
                    core::ptr::addr_of!((*h).sites_offset).read_volatile(),
                    core::ptr::addr_of!((*h).vcpus_offset).read_volatile(),
                    core::ptr::addr_of!((*h).vcpu_stride).read_volatile(),
                    core::ptr::addr_of!((*h).total_size).read_volatile(),
                ],
            )
        };
        if magic != PLUGIN_MAGIC {
            return Err(AbiError::BadMagic(magic));
        }
        if version != PLUGIN_VERSION {
            return Err(AbiError::Version {
                found: version,
                expected: PLUGIN_VERSION,
            });
        }
        let layout = PluginLayout::new(params)?;
        if offsets
            != [
                layout.probes_offset as u64,
                layout.sites_offset as u64,
                layout.vcpus_offset as u64,
                layout.vcpu_stride as u64,
                layout.total_size as u64,
            ]
        {
            return Err(AbiError::Inconsistent("offsets differ from the layout"));
        }
        if len < layout.total_size {
            return Err(AbiError::TooSmall {
                needed: layout.total_size,
                len,
            });
        }
        Ok(PluginShm { base: ptr, layout })
    }

    /// The layout.
    pub fn layout(&self) -> &PluginLayout {
        &self.layout
    }

    /// The header.
    pub fn header(&self) -> &PluginHeader {
        // SAFETY: the mapping holds a header at its start (validated).
        unsafe { &*(self.base as *const PluginHeader) }
    }

    /// Probe `i` (`i < max_probes`).
    pub fn probe(&self, i: u32) -> Option<&ProbeDef> {
        if i >= self.layout.params.max_probes {
            return None;
        }
        // SAFETY: inside the probe array (bounds checked), aligned.
        Some(unsafe {
            &*(self
                .base
                .add(self.layout.probes_offset + i as usize * core::mem::size_of::<ProbeDef>())
                as *const ProbeDef)
        })
    }

    /// A raw pointer to probe `i`'s definition, for hotprobe to fill in
    /// before freezing.
    ///
    /// # Safety
    /// Only before `frozen` (the plugin reads definitions once, after), and
    /// `i < max_probes`.
    pub unsafe fn probe_mut(&self, i: u32) -> *mut ProbeDef {
        debug_assert!(i < self.layout.params.max_probes);
        // SAFETY: caller contract.
        unsafe {
            self.base
                .add(self.layout.probes_offset + i as usize * core::mem::size_of::<ProbeDef>())
                as *mut ProbeDef
        }
    }

    /// Site `i` (a copy).
    pub fn site(&self, i: u32) -> Option<SiteDef> {
        if i >= self.layout.params.max_sites {
            return None;
        }
        // SAFETY: inside the site array (bounds checked), aligned.
        Some(unsafe {
            (self
                .base
                .add(self.layout.sites_offset + i as usize * core::mem::size_of::<SiteDef>())
                as *const SiteDef)
                .read_volatile()
        })
    }

    /// Writes site `i` (hotprobe, before freezing).
    pub fn set_site(&self, i: u32, s: SiteDef) -> Result<(), AbiError> {
        if i >= self.layout.params.max_sites {
            return Err(AbiError::SiteTableFull);
        }
        // SAFETY: inside the site array (bounds checked), aligned.
        unsafe {
            (self
                .base
                .add(self.layout.sites_offset + i as usize * core::mem::size_of::<SiteDef>())
                as *mut SiteDef)
                .write_volatile(s)
        };
        Ok(())
    }

    fn vcpu_base(&self, v: u32) -> Option<*mut u8> {
        if v >= self.layout.params.max_vcpus {
            return None;
        }
        // SAFETY: inside the mapping (bounds checked).
        Some(unsafe {
            self.base
                .add(self.layout.vcpus_offset + v as usize * self.layout.vcpu_stride)
        })
    }

    /// vCPU `v`'s control block.
    pub fn vcpu(&self, v: u32) -> Option<&VcpuCtl> {
        // SAFETY: a vCPU block starts with its control block, 4096-aligned.
        self.vcpu_base(v)
            .map(|b| unsafe { &*(b as *const VcpuCtl) })
    }

    /// Probe `p`'s counters on vCPU `v`.
    pub fn counters(&self, v: u32, p: u32) -> Option<&ProbeCounters> {
        if p >= self.layout.params.max_probes {
            return None;
        }
        let b = self.vcpu_base(v)?;
        // SAFETY: inside the vCPU's counter array (bounds checked), 8-aligned.
        Some(unsafe {
            &*(b.add(self.layout.counters_offset + p as usize * 32) as *const ProbeCounters)
        })
    }

    /// Sums probe `p`'s counters over every vCPU: (hits, returns, nmissed,
    /// filtered).
    pub fn totals(&self, p: u32) -> (u64, u64, u64, u64) {
        let mut t = (0, 0, 0, 0);
        for v in 0..self.layout.params.max_vcpus {
            if let Some(c) = self.counters(v, p) {
                t.0 += c.hits.load(Relaxed);
                t.1 += c.returns.load(Relaxed);
                t.2 += c.nmissed.load(Relaxed);
                t.3 += c.filtered.load(Relaxed);
            }
        }
        t
    }

    /// The data bytes a slot holds.
    pub fn data_cap(&self) -> usize {
        self.layout.params.slot_size as usize - EVENT_FIXED
    }

    /// Pointer to vCPU `v`'s mailbox slot.
    pub fn mbox_slot(&self, v: u32) -> Option<*mut u8> {
        // SAFETY: inside the vCPU block.
        self.vcpu_base(v)
            .map(|b| unsafe { b.add(self.layout.mbox_offset) })
    }

    fn ring_slot(&self, v: u32, n: u64) -> Option<*mut u8> {
        let b = self.vcpu_base(v)?;
        let i = (n & (self.layout.params.ring_capacity as u64 - 1)) as usize;
        // SAFETY: inside the vCPU's ring (index masked).
        Some(unsafe { b.add(self.layout.ring_offset + i * self.layout.params.slot_size as usize) })
    }

    /// Writes an event into a slot: the fixed words, then `data` (cut to
    /// what the slot holds).
    ///
    /// # Safety
    /// `slot` must be a slot of this mapping that nobody else reads or
    /// writes meanwhile.
    pub unsafe fn write_slot(&self, slot: *mut u8, ev: &PluginEvent, data: &[u8]) {
        let n = data.len().min(self.data_cap());
        let nv = (ev.nvalues as usize).min(MAX_VALUES);
        let w = slot as *mut u64;
        // SAFETY: caller contract; the slot holds EVENT_FIXED + data_cap bytes.
        unsafe {
            w.write_volatile(ev.tsc);
            w.add(1)
                .write_volatile(pack_event_meta(ev.probe, ev.kind, nv as u8, n as u16));
            w.add(2).write_volatile(ev.cr3);
            w.add(3).write_volatile(ev.pc);
            for (k, v) in ev.values.iter().enumerate().take(nv) {
                w.add(4 + k).write_volatile(*v);
            }
            core::ptr::copy_nonoverlapping(data.as_ptr(), slot.add(EVENT_FIXED), n);
        }
    }

    /// Reads the event in a slot, its data into `data` (returns the event;
    /// `data_len` bytes of `data` are meaningful).
    ///
    /// # Safety
    /// As [`PluginShm::write_slot`].
    pub unsafe fn read_slot(&self, slot: *const u8, vcpu: u32, data: &mut [u8]) -> PluginEvent {
        let w = slot as *const u64;
        // SAFETY: caller contract.
        unsafe {
            let meta = w.add(1).read_volatile();
            let nv = (((meta >> 26) & 7) as usize).min(MAX_VALUES);
            let dl = ((meta >> 32) as u16 as usize)
                .min(self.data_cap())
                .min(data.len());
            let mut values = [0u64; MAX_VALUES];
            for (k, v) in values.iter_mut().enumerate().take(nv) {
                *v = w.add(4 + k).read_volatile();
            }
            core::ptr::copy_nonoverlapping(slot.add(EVENT_FIXED), data.as_mut_ptr(), dl);
            PluginEvent {
                tsc: w.read_volatile(),
                probe: (meta & 0xff_ffff) as u32,
                kind: ((meta >> 24) & 3) as u8,
                nvalues: nv as u8,
                flags: ((meta >> 29) & 7) as u8,
                vcpu,
                cr3: w.add(2).read_volatile(),
                pc: w.add(3).read_volatile(),
                values,
                data_len: dl as u16,
            }
        }
    }

    /// Pushes an event into vCPU `v`'s ring, or counts a drop (false).
    ///
    /// # Safety
    /// Only vCPU `v`'s thread may push to its ring.
    pub unsafe fn push(&self, v: u32, ev: &PluginEvent, data: &[u8]) -> bool {
        let Some(ctl) = self.vcpu(v) else {
            return false;
        };
        // Relaxed: only this producer writes head.
        let head = ctl.head.load(Relaxed);
        // Acquire pairs with the consumer's `tail.store(Release)` in `drain`:
        // its reads of the freed slots happen before we overwrite them.
        let tail = ctl.tail.load(Acquire);
        if head.wrapping_sub(tail) >= self.layout.params.ring_capacity as u64 {
            let d = ctl.dropped.load(Relaxed);
            ctl.dropped.store(d.wrapping_add(1), Relaxed);
            return false;
        }
        let Some(slot) = self.ring_slot(v, head) else {
            return false;
        };
        // SAFETY: the slot is free (head - tail < capacity): the consumer
        // does not read it until head moves.
        unsafe { self.write_slot(slot, ev, data) };
        // Release pairs with the consumer's `head.load(Acquire)`: the slot's
        // words are visible before the new head.
        ctl.head.store(head.wrapping_add(1), Release);
        true
    }

    /// Hands every event published in vCPU `v`'s ring to `f` (with its data),
    /// in order, then frees their slots; returns how many. A head more than
    /// a capacity ahead (corrupt) resynchronises the ring and returns an
    /// error.
    pub fn drain(
        &self,
        v: u32,
        data: &mut [u8],
        mut f: impl FnMut(&PluginEvent, &[u8]),
    ) -> Result<u64, AbiError> {
        let Some(ctl) = self.vcpu(v) else {
            return Ok(0);
        };
        // Relaxed: only the consumer writes tail.
        let tail = ctl.tail.load(Relaxed);
        // Acquire pairs with the producer's `head.store(Release)` in `push`.
        let head = ctl.head.load(Acquire);
        let n = head.wrapping_sub(tail);
        if n > self.layout.params.ring_capacity as u64 {
            // Release pairs with the producer's `tail.load(Acquire)`.
            ctl.tail.store(head, Release);
            return Err(AbiError::RingCorrupt { head, tail });
        }
        let mut i = tail;
        while i != head {
            let Some(slot) = self.ring_slot(v, i) else {
                break;
            };
            // SAFETY: slots in [tail, head) are published and not rewritten
            // until tail moves past them.
            let ev = unsafe { self.read_slot(slot, v, data) };
            f(&ev, &data[..ev.data_len as usize]);
            i = i.wrapping_add(1);
        }
        // Release pairs with the producer's `tail.load(Acquire)` in `push`.
        ctl.tail.store(head, Release);
        Ok(n)
    }

    /// Events waiting in vCPU `v`'s ring.
    pub fn pending(&self, v: u32) -> u64 {
        self.vcpu(v).map_or(0, |c| {
            c.head.load(Acquire).wrapping_sub(c.tail.load(Relaxed))
        })
    }
}

/// Whether an instruction (its first bytes, at `vaddr`) leaves its function
/// as a return does: `ret`, `ret imm16`, `rep ret`, or a `jmp` to the
/// kernel's return thunk `thunk` (0: none; kernels built with
/// `CONFIG_RETHUNK` end functions with `jmp __x86_return_thunk`).
pub fn is_return_insn(bytes: &[u8], vaddr: u64, thunk: u64) -> bool {
    match bytes {
        [0xc3, ..] | [0xc2, _, _, ..] | [0xf3, 0xc3, ..] => true,
        [0xe9, a, b, c, d, ..] if thunk != 0 => {
            let rel = i32::from_le_bytes([*a, *b, *c, *d]) as i64;
            vaddr.wrapping_add(5).wrapping_add(rel as u64) == thunk
        }
        [0xeb, r, ..] if thunk != 0 => {
            vaddr.wrapping_add(2).wrapping_add(*r as i8 as i64 as u64) == thunk
        }
        _ => false,
    }
}

/// Whether two stack pointers are on the same 16 KiB (`THREAD_SIZE`,
/// aligned) x86-64 kernel stack: return instances are matched by stack
/// pointer only against instances of the same task's stack.
pub fn same_kernel_stack(a: u64, b: u64) -> bool {
    a >> 14 == b >> 14
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;

    fn params() -> PluginParams {
        PluginParams {
            max_probes: 4,
            max_sites: 16,
            max_vcpus: 2,
            ring_capacity: 4,
            slot_size: 128,
        }
    }

    #[test]
    fn fetch_round_trip() {
        for f in [
            Fetch::Reg(Reg::Rdi),
            Fetch::Reg(Reg::Cr3),
            Fetch::Reg(Reg::GsBase),
            Fetch::Task(TaskField::Pid),
            Fetch::Task(TaskField::Comm),
            Fetch::Task(TaskField::Pointer),
            Fetch::pt_regs_field(13),
            Fetch::Load {
                reg: Reg::Rsp,
                offset: -8,
                size: 4,
            },
            Fetch::LoadValue {
                index: 2,
                offset: 0x40,
                size: 1,
            },
        ] {
            assert_eq!(Fetch::decode(f.encode()), Some(f));
        }
        assert_eq!(Fetch::decode(0), None);
        let s = Some(StringFetch {
            index: 1,
            max_len: 255,
        });
        assert_eq!(StringFetch::decode(StringFetch::encode(s)), s);
        assert_eq!(StringFetch::decode(0), None);
        assert_eq!(Reg::from_name("r10"), Some(Reg::R10));
    }

    #[test]
    fn returns_are_recognised() {
        let va = 0xffff_ffff_8100_0000u64;
        assert!(is_return_insn(&[0xc3], va, 0));
        assert!(is_return_insn(&[0xc2, 8, 0], va, 0));
        assert!(is_return_insn(&[0xf3, 0xc3], va, 0));
        assert!(!is_return_insn(&[0xcc], va, 0));
        let thunk = va + 0x100;
        let rel = (0x100i32 - 5).to_le_bytes();
        let jmp = [0xe9, rel[0], rel[1], rel[2], rel[3]];
        assert!(is_return_insn(&jmp, va, thunk));
        assert!(!is_return_insn(&jmp, va, 0));
        assert!(!is_return_insn(&jmp, va, thunk + 1));
        assert!(is_return_insn(&[0xeb, 0x10], va, va + 0x12));
        assert!(same_kernel_stack(
            0xffff_c900_0001_3f00,
            0xffff_c900_0001_0008
        ));
        assert!(!same_kernel_stack(
            0xffff_c900_0001_3f00,
            0xffff_c900_0001_4008
        ));
    }

    #[test]
    fn create_attach_push_drain() {
        let l = PluginLayout::new(params()).unwrap();
        let mut mem = vec![0u64; l.total_size / 8 + 512];
        let base = ((mem.as_mut_ptr() as usize + 4095) & !4095) as *mut u8;
        // SAFETY: inside `mem`, zeroed, page-aligned, lives for the test.
        let host = unsafe { PluginShm::create(base, l.total_size, params()) }.unwrap();
        // SAFETY: as above.
        let plugin = unsafe { PluginShm::attach(base, l.total_size) }.unwrap();
        assert_eq!(plugin.probe(0).unwrap().filter_index, NO_FILTER);
        let mut ev = PluginEvent {
            tsc: 7,
            probe: 3,
            kind: EV_ENTRY,
            nvalues: 2,
            values: [1, 2, 0, 0, 0, 0],
            cr3: 0x1000,
            pc: 0xffff_ffff_8100_0000,
            ..PluginEvent::default()
        };
        for i in 0..5 {
            ev.tsc = i;
            // SAFETY: one producer (this thread) for vCPU 1.
            let ok = unsafe { plugin.push(1, &ev, b"/tmp/x") };
            assert_eq!(ok, i < 4, "the fifth event is dropped");
        }
        assert_eq!(host.vcpu(1).unwrap().dropped.load(Relaxed), 1);
        let mut got = vec::Vec::new();
        let mut buf = [0u8; 64];
        let n = host
            .drain(1, &mut buf, |e, d| {
                got.push((e.tsc, e.probe, e.values[1], d.to_vec()))
            })
            .unwrap();
        assert_eq!(n, 4);
        assert_eq!(got[3], (3, 3, 2, b"/tmp/x".to_vec()));
        assert_eq!(host.pending(1), 0);
        plugin.counters(0, 2).unwrap().hits.store(5, Relaxed);
        plugin.counters(1, 2).unwrap().hits.store(6, Relaxed);
        assert_eq!(host.totals(2).0, 11);
        assert!(plugin.counters(2, 0).is_none());
    }
}
