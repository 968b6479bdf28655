//! hotprobe's QEMU TCG plugin: probes on a guest kernel without stopping
//! the VM and without flushing QEMU's translated code.
//!
//! QEMU (≥ 9.2, plugin API 4) loads it when hotprobe starts the guest:
//! `-plugin /proc/HOTPROBE/fd/N,shm=/proc/HOTPROBE/fd/M`. It maps the shared
//! memory named by `shm=` (layout: `hotprobe_abi::plugin`), and:
//!
//! - **at translation** (`vcpu_tb_trans`, once the sites are frozen), for
//!   each instruction whose address is a candidate site, registers a
//!   conditional callback per probe on that site, gated by the probe's
//!   entry in a per-vCPU scoreboard (`enable[probe] != 0`): a disabled
//!   probe costs no call. In a return probe's function it registers, on
//!   every `ret` (and `jmp` to the kernel's return thunk), a callback gated
//!   by the vCPU's count of live instances (`depth[probe] > 0`).
//! - **enabling** is a flag in shared memory and a generation bump: the
//!   plugin's control thread copies the flags into every vCPU's scoreboard
//!   entry and acknowledges the generation. Nothing is retranslated.
//! - **in the callback**: registers through `qemu_plugin_read_register`,
//!   guest virtual memory through `qemu_plugin_read_memory_vaddr` (values
//!   at `reg + offset`, a field of a structure a value points to, a string);
//!   filters by cr3 or a value; counts into the vCPU's own counters; an
//!   event goes into the vCPU's ring (asynchronous: a full ring drops, the
//!   guest never waits) or its mailbox (synchronous: the vCPU spins, then
//!   sleeps on a futex, until hotprobe answers, at most the timeout, and not
//!   at all while hotprobe's heartbeat is stale, so a dead hotprobe never
//!   holds the guest).
//!
//! Read-only: QEMU 10.0's API cannot write registers or memory, nor move
//! the PC; probes that do go through the GDB stub.

#![allow(clippy::missing_safety_doc)]

mod ffi;
mod hit;
mod read;

use std::cell::UnsafeCell;
use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicU32, AtomicU64};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use ffi::*;
use hotprobe_abi::plugin::{is_return_insn, same_kernel_stack};
use hotprobe_abi::plugin::{
    Fetch, PluginEvent, PluginShm, ProbeCounters, Reg, StringFetch, TaskField, TaskLayout,
    DELIVER_ASYNC, DELIVER_COUNT, DELIVER_SYNC, EV_ENTRY, EV_EXIT, EV_HIT, MAX_VALUES,
    MBOX_ANSWERED, MBOX_FREE, MBOX_POSTED, NO_FILTER, N_REGS, PLUGIN_EXITED, PLUGIN_INSTALLED,
    PROBE_RETURN,
};

/// The plugin API version this plugin is built against (QEMU 10.0 speaks 4).
#[no_mangle]
pub static qemu_plugin_version: c_int = 4;

/// A probe's definition, copied out of shared memory at freeze.
#[derive(Clone, Debug)]
struct ProbeCfg {
    kind: u32,
    delivery: u32,
    fetch: Vec<Fetch>,
    string: Option<StringFetch>,
    filter_cr3: u64,
    filter_index: u32,
    filter_value: u64,
    maxactive: usize,
    range: (u64, u64),
}

/// What a callback's userdata points to.
#[derive(Debug)]
struct CbData {
    probe: u32,
    /// The instrumented instruction.
    vaddr: u64,
}

/// The instrumentation tables, built once when hotprobe freezes the sites.
struct Tables {
    probes: Vec<ProbeCfg>,
    /// Site address → callbacks' userdata (one per probe on the site).
    entry: HashMap<u64, Vec<*const CbData>>,
    /// Return probes' function ranges: (start, end, probe), sorted.
    ranges: Vec<(u64, u64, u32)>,
    /// Userdata of `ret` callbacks, per (instruction, probe), made as the
    /// plugin finds them.
    ret_data: Mutex<HashMap<(u64, u32), usize>>,
    /// The guest's current-task layout (copied at the freeze).
    task: TaskLayout,
}

// SAFETY: the raw pointers are leaked, immutable CbData.
unsafe impl Send for Tables {}
// SAFETY: as above.
unsafe impl Sync for Tables {}

/// A live return instance.
#[derive(Clone, Copy, Debug)]
struct Instance {
    /// rsp at entry: the address of the return address.
    sp: u64,
    /// The current task at entry (0 without a task layout): a `ret` at the
    /// same rsp in another task (a dead task's stack reused) is not this
    /// call's return.
    task: u64,
}

/// Per-vCPU state, touched only by that vCPU's thread.
struct Vcpu {
    buf: *mut GByteArray,
    /// Live instances per probe.
    live: Vec<Vec<Instance>>,
    /// Probes with live instances.
    live_probes: Vec<u32>,
    /// Live instances of every probe.
    total: usize,
    data: Vec<u8>,
}

struct VcpuCell(UnsafeCell<Option<Vcpu>>);
// SAFETY: each cell is used by one vCPU thread only (indexed by its vCPU
// index, which QEMU gives every callback).
unsafe impl Sync for VcpuCell {}

struct Plugin {
    shm: PluginShm,
    /// Per vCPU: `enable[max_probes]` then `depth[max_probes]`, u64 each.
    score: *mut qemu_plugin_scoreboard,
    max_probes: usize,
    tables: OnceLock<Tables>,
    regs: OnceLock<[usize; N_REGS]>,
    vcpus: Box<[VcpuCell]>,
    smp_vcpus: u32,
    inited: AtomicU32,
    /// QEMU's time-control handle, when `HOTPROBE_PLUGIN_TIME_CONTROL=1`
    /// asked for it (an experiment, see docs/DESIGN.md "Guest time"): held,
    /// never used to move the clock (QEMU only moves it forward).
    _time_control: usize,
}

// SAFETY: the scoreboard pointer is QEMU's, valid for the plugin's life;
// everything else is Sync.
unsafe impl Send for Plugin {}
// SAFETY: as above.
unsafe impl Sync for Plugin {}

static PLUGIN: OnceLock<Plugin> = OnceLock::new();

fn say(msg: &str) {
    if let Ok(c) = CString::new(format!("hotprobe-qemu-plugin: {msg}\n")) {
        // SAFETY: a NUL-terminated string.
        unsafe { qemu_plugin_outs(c.as_ptr()) };
    }
}

fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn futex_wait(word: &AtomicU32, val: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_nsec: timeout.subsec_nanos() as libc::c_long,
    };
    // SAFETY: a shared futex word in a MAP_SHARED mapping; the timeout is
    // valid. Spurious returns are fine (callers loop).
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            val,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0,
        )
    };
}

fn futex_wake(word: &AtomicU32) {
    // SAFETY: a shared futex word; waking has no memory effect.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
            std::ptr::null::<u32>(),
            0,
        )
    };
}

impl Plugin {
    fn score_entry(&self, vcpu: u32, index: usize) -> *mut u64 {
        // SAFETY: `score` is our scoreboard; QEMU sizes it for every vCPU
        // initialised (we only ask for those).
        let base = unsafe { qemu_plugin_scoreboard_find(self.score, vcpu) } as *mut u64;
        // SAFETY: the entry holds 2 * max_probes u64s.
        unsafe { base.add(index) }
    }

    fn u64_entry(&self, index: usize) -> qemu_plugin_u64 {
        qemu_plugin_u64 {
            score: self.score,
            offset: index * 8,
        }
    }

    /// Copies the probes' enable flags into vCPU `v`'s scoreboard entry.
    fn apply_enables(&self, v: u32) {
        let n = (self.shm.header().n_probes.load(Acquire) as usize).min(self.max_probes);
        for p in 0..n {
            let on = self
                .shm
                .probe(p as u32)
                .is_some_and(|d| d.enabled.load(Acquire) != 0);
            // SAFETY: our scoreboard entry; a racing reader (the vCPU's
            // generated code) sees the old or the new aligned word.
            unsafe {
                (self.score_entry(v, p) as *const AtomicU64)
                    .as_ref()
                    .unwrap()
                    .store(on as u64, Relaxed)
            };
        }
    }

    /// Builds the tables from the frozen definitions.
    fn build_tables(&self) -> Tables {
        let h = self.shm.header();
        let n = (h.n_probes.load(Acquire) as usize).min(self.max_probes);
        let mut probes = Vec::with_capacity(n);
        for p in 0..n {
            let d = self.shm.probe(p as u32).expect("probe in range");
            let nf = (d.nfetch as usize).min(MAX_VALUES);
            probes.push(ProbeCfg {
                kind: d.kind,
                delivery: d.delivery,
                fetch: d.fetch[..nf]
                    .iter()
                    .map(|w| Fetch::decode(*w).unwrap_or(Fetch::Reg(Reg::Rdi)))
                    .collect(),
                string: StringFetch::decode(d.string),
                filter_cr3: d.filter_cr3,
                filter_index: d.filter_index,
                filter_value: d.filter_value,
                maxactive: d.maxactive.clamp(1, 4096) as usize,
                range: (d.range_start, d.range_end),
            });
        }
        let leak = |p: u32, vaddr: u64| {
            Box::into_raw(Box::new(CbData { probe: p, vaddr })) as *const CbData
        };
        let mut entry: HashMap<u64, Vec<*const CbData>> = HashMap::new();
        let ns = h.n_sites.load(Acquire);
        for i in 0..ns {
            let Some(s) = self.shm.site(i) else { break };
            if (s.probe as usize) < n {
                entry
                    .entry(s.vaddr)
                    .or_default()
                    .push(leak(s.probe, s.vaddr));
            }
        }
        let mut ranges = Vec::new();
        for (p, c) in probes.iter().enumerate() {
            if c.kind == PROBE_RETURN && c.range.0 < c.range.1 {
                ranges.push((c.range.0, c.range.1, p as u32));
            }
        }
        ranges.sort();
        let ret_data = Mutex::new(HashMap::new());
        // SAFETY: hotprobe wrote it before the freeze (Acquire above) and
        // never after.
        let task = unsafe { std::ptr::addr_of!(h.task).read_volatile() };
        Tables {
            probes,
            entry,
            ranges,
            ret_data,
            task,
        }
    }

    /// vCPU `v`'s private state.
    ///
    /// # Safety
    /// Only vCPU `v`'s thread may call this for `v` (QEMU runs a vCPU's
    /// callbacks on its thread), and not while an earlier result is live.
    #[allow(clippy::mut_from_ref)]
    unsafe fn vcpu(&self, v: u32) -> Option<&mut Vcpu> {
        let cell = self.vcpus.get(v as usize)?;
        // SAFETY: the caller's contract: no other reference to this cell.
        let slot = unsafe { &mut *cell.0.get() };
        if slot.is_none() {
            // SAFETY: plain GLib allocation.
            let buf = unsafe { g_byte_array_new() };
            *slot = Some(Vcpu {
                buf,
                live: vec![Vec::new(); self.max_probes],
                live_probes: Vec::new(),
                total: 0,
                data: vec![0u8; self.shm.data_cap()],
            });
        }
        slot.as_mut()
    }
}

/// Single-writer increment (the vCPU's own counter: no lock prefix).
fn bump(c: &AtomicU64) {
    c.store(c.load(Relaxed).wrapping_add(1), Relaxed);
}

fn add(c: &AtomicU64, n: u64) {
    c.store(c.load(Relaxed).wrapping_add(n), Relaxed);
}

extern "C" fn entry_cb(vcpu: c_uint, ud: *mut c_void) {
    // SAFETY: `ud` is a leaked CbData.
    let cb = unsafe { &*(ud as *const CbData) };
    if let Some(p) = PLUGIN.get() {
        p.on_entry(vcpu, cb.probe, cb.vaddr);
    }
}

extern "C" fn any_ret_cb(vcpu: c_uint, ud: *mut c_void) {
    if let Some(p) = PLUGIN.get() {
        p.on_any_return(vcpu, ud as u64);
    }
}

extern "C" fn ret_cb(vcpu: c_uint, ud: *mut c_void) {
    // SAFETY: `ud` is a leaked CbData.
    let cb = unsafe { &*(ud as *const CbData) };
    if let Some(p) = PLUGIN.get() {
        p.on_return(vcpu, cb.probe, cb.vaddr);
    }
}

/// The userdata of `ret` callbacks at `va` for `probe` (made once, kept
/// for the plugin's life: a retranslation reuses it).
fn ret_userdata(t: &Tables, va: u64, probe: u32) -> *mut c_void {
    let mut m = t.ret_data.lock().unwrap_or_else(|e| e.into_inner());
    *m.entry((va, probe))
        .or_insert_with(|| Box::into_raw(Box::new(CbData { probe, vaddr: va })) as usize)
        as *mut c_void
}

extern "C" fn vcpu_tb_trans(_id: qemu_plugin_id_t, tb: *mut qemu_plugin_tb) {
    let Some(p) = PLUGIN.get() else { return };
    let h = p.shm.header();
    h.translations.fetch_add(1, Relaxed);
    let t = match p.tables.get() {
        Some(t) => t,
        None if h.frozen.load(Acquire) != 0 => p.tables.get_or_init(|| p.build_tables()),
        None => {
            h.early_translations.fetch_add(1, Relaxed);
            return;
        }
    };
    let thunk = h.return_thunk;
    // SAFETY: `tb` is QEMU's handle, valid during this callback.
    let n = unsafe { qemu_plugin_tb_n_insns(tb) };
    for i in 0..n {
        // SAFETY: i < n.
        let insn = unsafe { qemu_plugin_tb_get_insn(tb, i) };
        // SAFETY: a valid instruction handle.
        let va = unsafe { qemu_plugin_insn_vaddr(insn) };
        if let Some(cbs) = t.entry.get(&va) {
            for &ud in cbs {
                // SAFETY: ud is a leaked CbData.
                let probe = unsafe { (*ud).probe } as usize;
                // SAFETY: valid handle, our scoreboard, leaked userdata.
                unsafe {
                    qemu_plugin_register_vcpu_insn_exec_cond_cb(
                        insn,
                        entry_cb,
                        QEMU_PLUGIN_CB_R_REGS,
                        QEMU_PLUGIN_COND_NE,
                        p.u64_entry(probe),
                        0,
                        ud as *mut c_void,
                    )
                };
                h.instrumented.fetch_add(1, Relaxed);
            }
        }
        if t.ranges.is_empty() {
            continue;
        }
        let mut bytes: Option<[u8; 8]> = None;
        // Every kernel return: a probed call that tail-called out returns
        // through another function's `ret` (gated by the vCPU's count of
        // live instances: free while none is live).
        if va >= 0xffff_8000_0000_0000 {
            let b = *bytes.get_or_insert_with(|| {
                let mut b = [0u8; 8];
                // SAFETY: valid handle; copies at most 8 bytes.
                unsafe { qemu_plugin_insn_data(insn, b.as_mut_ptr() as *mut c_void, 8) };
                b
            });
            // SAFETY: valid handle.
            let size = unsafe { qemu_plugin_insn_size(insn) }.min(8);
            if is_return_insn(&b[..size], va, thunk) {
                // SAFETY: valid handle, our scoreboard; the userdata is
                // the address itself.
                unsafe {
                    qemu_plugin_register_vcpu_insn_exec_cond_cb(
                        insn,
                        any_ret_cb,
                        QEMU_PLUGIN_CB_R_REGS,
                        QEMU_PLUGIN_COND_GT,
                        p.u64_entry(2 * p.max_probes),
                        0,
                        va as *mut c_void,
                    )
                };
                h.instrumented.fetch_add(1, Relaxed);
                // The in-range callbacks below would find nothing left.
                continue;
            }
        }
        let idx = t.ranges.partition_point(|r| r.0 <= va);
        for &(s, e, probe) in t.ranges[..idx].iter().rev() {
            if va < s || va >= e {
                continue;
            }
            let b = *bytes.get_or_insert_with(|| {
                let mut b = [0u8; 8];
                // SAFETY: valid handle; copies at most 8 bytes.
                unsafe { qemu_plugin_insn_data(insn, b.as_mut_ptr() as *mut c_void, 8) };
                b
            });
            // SAFETY: valid handle.
            let size = unsafe { qemu_plugin_insn_size(insn) }.min(8);
            if !is_return_insn(&b[..size], va, thunk) {
                continue;
            }
            // SAFETY: valid handle, our scoreboard, leaked userdata.
            unsafe {
                qemu_plugin_register_vcpu_insn_exec_cond_cb(
                    insn,
                    ret_cb,
                    QEMU_PLUGIN_CB_R_REGS,
                    QEMU_PLUGIN_COND_GT,
                    p.u64_entry(p.max_probes + probe as usize),
                    0,
                    ret_userdata(t, va, probe),
                )
            };
            h.instrumented.fetch_add(1, Relaxed);
        }
    }
}

extern "C" fn vcpu_init(_id: qemu_plugin_id_t, vcpu: c_uint) {
    let Some(p) = PLUGIN.get() else { return };
    p.regs.get_or_init(|| {
        let mut regs = [0usize; N_REGS];
        // SAFETY: called in vCPU context (QEMU's vcpu_init callback); the
        // array is freed with its contents (descriptors hold const strings).
        unsafe {
            let arr = qemu_plugin_get_registers();
            if !arr.is_null() {
                let descs = std::slice::from_raw_parts(
                    (*arr).data as *const qemu_plugin_reg_descriptor,
                    (*arr).len as usize,
                );
                for d in descs {
                    if d.name.is_null() {
                        continue;
                    }
                    let name = CStr::from_ptr(d.name).to_string_lossy();
                    if let Some(r) = Reg::from_name(&name) {
                        regs[r as usize] = d.handle as usize;
                    }
                }
                g_array_free(arr, 1);
            }
        }
        for r in [Reg::Rdi, Reg::Rsp, Reg::Cr3, Reg::Rip] {
            if regs[r as usize] == 0 {
                say(&format!("QEMU describes no register {}", r.name()));
            }
        }
        regs
    });
    let h = p.shm.header();
    if let Some(c) = p.shm.vcpu(vcpu) {
        c.live.store(1, Relaxed);
    }
    h.vcpus.fetch_max(vcpu + 1, Relaxed);
    p.apply_enables(vcpu);
    p.inited.fetch_add(1, Release);
}

extern "C" fn at_exit(_id: qemu_plugin_id_t, _ud: *mut c_void) {
    if let Some(p) = PLUGIN.get() {
        p.shm.header().plugin_state.store(PLUGIN_EXITED, Release);
        futex_wake(&p.shm.header().applied);
    }
}

/// Applies enable-flag generations to every vCPU's scoreboard entry.
fn control_thread() {
    let Some(p) = PLUGIN.get() else { return };
    let h = p.shm.header();
    loop {
        let gen = h.generation.load(Acquire);
        // Once every vCPU QEMU started has its scoreboard entry (the
        // scoreboard is not resized after that: no vCPU hotplug).
        if p.inited.load(Acquire) >= p.smp_vcpus && h.applied.load(Relaxed) != gen {
            // SAFETY: QEMU's API, callable from any thread.
            let n = unsafe { qemu_plugin_num_vcpus() }.max(0) as u32;
            for v in 0..n {
                p.apply_enables(v);
            }
            // Release pairs with hotprobe's `applied.load(Acquire)`.
            h.applied.store(gen, Release);
            futex_wake(&h.applied);
        }
        if h.plugin_state.load(Relaxed) == PLUGIN_EXITED {
            return;
        }
        futex_wait(&h.generation, gen, Duration::from_millis(20));
    }
}

/// Opens and maps the shared memory at `path`.
fn map_shm(path: &str) -> Result<PluginShm, String> {
    let c = CString::new(path).map_err(|_| "shm path has a NUL".to_string())?;
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(format!("open {path}: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a zeroed stat buffer for our descriptor.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: our descriptor, a valid out-pointer.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        // SAFETY: our descriptor.
        unsafe { libc::close(fd) };
        return Err(format!("fstat {path}: {}", std::io::Error::last_os_error()));
    }
    let len = st.st_size as usize;
    // SAFETY: a fresh shared mapping of our descriptor.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    // SAFETY: our descriptor; the mapping keeps the memory.
    unsafe { libc::close(fd) };
    if ptr == libc::MAP_FAILED {
        return Err(format!("mmap {path}: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: the mapping is valid for `len` bytes for the plugin's life
    // (never unmapped).
    unsafe { PluginShm::attach(ptr as *mut u8, len) }.map_err(|e| format!("{path}: {e}"))
}

/// Called by QEMU when it loads the plugin: `shm=PATH` is the shared memory.
///
/// # Safety
/// QEMU's contract: `info` valid during the call, `argv` holds `argc`
/// NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn qemu_plugin_install(
    id: qemu_plugin_id_t,
    info: *const qemu_info_t,
    argc: c_int,
    argv: *mut *mut c_char,
) -> c_int {
    let mut shm_path = None;
    for i in 0..argc.max(0) as usize {
        // SAFETY: QEMU's contract.
        let a = unsafe { CStr::from_ptr(*argv.add(i)) }.to_string_lossy();
        if let Some(v) = a.strip_prefix("shm=") {
            shm_path = Some(v.to_string());
        } else {
            say(&format!("unknown argument {a:?}"));
            return 1;
        }
    }
    let Some(path) = shm_path else {
        say("missing shm=PATH (hotprobe starts QEMU with it)");
        return 1;
    };
    // SAFETY: QEMU's contract.
    let info = unsafe { &*info };
    if !info.system_emulation {
        say("system emulation only");
        return 1;
    }
    let shm = match map_shm(&path) {
        Ok(s) => s,
        Err(e) => {
            say(&e);
            return 1;
        }
    };
    let max_probes = shm.layout().params.max_probes as usize;
    let max_vcpus = shm.layout().params.max_vcpus as usize;
    // SAFETY: QEMU's API, during install.
    let score = unsafe { qemu_plugin_scoreboard_new(16 * max_probes + 8) };
    let h = shm.header();
    h.qemu_api.store(info.version_cur as u32, Relaxed);
    // SAFETY: getpid has no preconditions.
    h.plugin_pid
        .store(unsafe { libc::getpid() } as u32, Relaxed);
    let plugin = Plugin {
        shm,
        score,
        max_probes,
        tables: OnceLock::new(),
        regs: OnceLock::new(),
        vcpus: (0..max_vcpus)
            .map(|_| VcpuCell(UnsafeCell::new(None)))
            .collect(),
        smp_vcpus: info.smp_vcpus.max(1) as u32,
        inited: AtomicU32::new(0),
        _time_control: if std::env::var_os("HOTPROBE_PLUGIN_TIME_CONTROL").is_some_and(|v| v == "1")
        {
            // SAFETY: QEMU's API, during install.
            let h = unsafe { qemu_plugin_request_time_control() };
            say(if h.is_null() {
                "time control refused (another plugin has it)"
            } else {
                "time control granted"
            });
            h as usize
        } else {
            0
        },
    };
    if PLUGIN.set(plugin).is_err() {
        say("loaded twice");
        return 1;
    }
    // SAFETY: QEMU's API, during install, with our callbacks.
    unsafe {
        qemu_plugin_register_vcpu_init_cb(id, vcpu_init);
        qemu_plugin_register_vcpu_tb_trans_cb(id, vcpu_tb_trans);
        qemu_plugin_register_atexit_cb(id, at_exit, std::ptr::null_mut());
    }
    if std::thread::Builder::new()
        .name("hotprobe-ctl".into())
        .spawn(control_thread)
        .is_err()
    {
        say("cannot start the control thread");
        return 1;
    }
    if let Some(p) = PLUGIN.get() {
        p.shm.header().plugin_state.store(PLUGIN_INSTALLED, Release);
        futex_wake(&p.shm.header().applied);
    }
    0
}
