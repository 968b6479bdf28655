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

mod fetch;
pub use fetch::*;
mod view;
pub use view::*;

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
