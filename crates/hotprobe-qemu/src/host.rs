//! [`PluginHost`]: hotprobe's side of the plugin's shared memory.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hotprobe_abi::plugin::{
    Fetch, PluginEvent, PluginParams, PluginShm, SiteDef, StringFetch, TaskLayout, DELIVER_ASYNC,
    DELIVER_COUNT, DELIVER_SYNC, MAX_VALUES, MBOX_ANSWERED, MBOX_POSTED, NO_FILTER,
    PLUGIN_INSTALLED, PROBE_ENTRY, PROBE_RETURN,
};

use crate::PluginError;
use hotprobe_os::{Mapping, Memfd};

mod service;

use service::{futex_wait, futex_wake, service};

/// Sizes and timeouts of a plugin's shared memory.
#[derive(Clone, Copy, Debug)]
pub struct PluginConfig {
    /// Probes at most.
    pub max_probes: u32,
    /// Candidate sites at most.
    pub max_sites: u32,
    /// vCPUs followed (higher vCPU indexes count nothing).
    pub max_vcpus: u32,
    /// Events per vCPU ring (a power of two).
    pub ring_capacity: u32,
    /// Bytes of guest string an event can carry (the slot is the next power
    /// of two ≥ 80 + this).
    pub max_string: u32,
    /// A synchronous event waits at most this long for an answer.
    pub sync_timeout: Duration,
    /// A heartbeat this old means hotprobe is gone: synchronous events stop
    /// waiting at once.
    pub stale: Duration,
    /// How long a waiting vCPU spins before it sleeps on the futex.
    pub sync_spin: Duration,
    /// How long hotprobe's service thread keeps polling the mailboxes after
    /// its last answer before it sleeps on the doorbell.
    pub host_spin: Duration,
}

impl Default for PluginConfig {
    fn default() -> Self {
        PluginConfig {
            max_probes: 256,
            max_sites: 4096,
            max_vcpus: 16,
            ring_capacity: 1 << 14,
            max_string: 176,
            sync_timeout: Duration::from_secs(1),
            stale: Duration::from_millis(300),
            // Bounded spins on both sides: on cores shared with other
            // runnable threads a long spin only burns the time slice the
            // other side needs (docs/PERFORMANCE.md, the synchronous row).
            sync_spin: Duration::from_micros(5),
            host_spin: Duration::from_micros(20),
        }
    }
}

/// How a probe's events reach hotprobe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Delivery {
    /// No events: counts only.
    #[default]
    Count,
    /// Per-vCPU rings, drained by [`PluginHost::drain`]; a full ring drops
    /// (counted); the guest never waits.
    Async,
    /// The vCPU waits until the [`SyncHandler`] answered (or the timeout).
    Sync,
}

/// One probe for the plugin (before the freeze).
#[derive(Clone, Debug, Default)]
pub struct PluginProbe {
    /// Entries at `sites` are followed to the function's returns (the `ret`
    /// instructions the plugin finds in `range`).
    pub return_probe: bool,
    /// How its events travel.
    pub delivery: Delivery,
    /// The values its entry events carry (≤ 6).
    pub values: Vec<Fetch>,
    /// A guest string its entry events carry.
    pub string: Option<StringFetch>,
    /// Only hits with this cr3 (page-table base; low 12 bits ignored).
    pub filter_cr3: Option<u64>,
    /// Only hits whose value `.0` equals `.1`.
    pub filter_value: Option<(u8, u64)>,
    /// Live return instances per vCPU (return probes).
    pub maxactive: u32,
    /// Candidate addresses (instruction starts).
    pub sites: Vec<u64>,
    /// A return probe's function range.
    pub range: Option<(u64, u64)>,
    /// Enabled from the start.
    pub enabled: bool,
}

/// A probe's counts, summed over the vCPUs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PluginCounts {
    /// Hits that passed the filters.
    pub hits: u64,
    /// Returns matched.
    pub returns: u64,
    /// Entries not followed (maxactive) or abandoned.
    pub nmissed: u64,
    /// Hits the filters left out.
    pub filtered: u64,
}

/// What the plugin and the service thread counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PluginStats {
    /// QEMU's plugin API version, once installed.
    pub qemu_api: u32,
    /// vCPUs seen.
    pub vcpus: u32,
    /// Translation blocks seen by the plugin.
    pub translations: u64,
    /// Instructions instrumented (each translation counts).
    pub instrumented: u64,
    /// Translations before the freeze (not instrumented).
    pub early_translations: u64,
    /// Events dropped in full rings.
    pub ring_drops: u64,
    /// Synchronous events answered.
    pub sync_answered: u64,
    /// Synchronous events released by the timeout.
    pub sync_timeouts: u64,
    /// Synchronous events not sent (hotprobe's heartbeat stale).
    pub orphaned: u64,
    /// Guest memory reads that failed.
    pub read_errors: u64,
    /// Hits on vCPUs beyond `max_vcpus`.
    pub vcpu_overflow: u64,
    /// Synchronous events whose vCPU slept on the futex (no answer within
    /// `PluginConfig::sync_spin`).
    pub sync_vcpu_sleeps: u64,
    /// Synchronous events that had to wake the sleeping service thread.
    pub sync_host_wakes: u64,
    /// Total time vCPUs waited for answers (ns), post to answer.
    pub sync_wait_ns: u64,
}

/// Counts of the service thread's synchronous work.
#[derive(Debug, Default)]
pub struct SyncStats {
    /// Requests answered.
    pub answered: AtomicU64,
    /// Times it slept on the doorbell.
    pub sleeps: AtomicU64,
}

/// Answers a synchronous event (runs on the service thread; the vCPU waits
/// meanwhile). The answer is stored in the mailbox (reserved: the plugin
/// is read-only and ignores it).
pub type SyncHandler = Box<dyn FnMut(&PluginEvent, &[u8]) -> u64 + Send>;

/// The memfd, its mapping and the view.
struct Mapped {
    shm: PluginShm,
    handler: Mutex<Option<SyncHandler>>,
    stop: AtomicBool,
    sync: SyncStats,
    host_spin: Duration,
    // Dropped after `shm`, which points into it; then the memfd.
    mapping: Mapping,
    memfd: Memfd,
}

/// hotprobe's side of one plugin (one QEMU).
pub struct PluginHost {
    m: Arc<Mapped>,
    service: Option<std::thread::JoinHandle<()>>,
    n_probes: u32,
    n_sites: u32,
    frozen: bool,
    seen_drops: Vec<u64>,
    data: Vec<u8>,
}

impl std::fmt::Debug for PluginHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginHost")
            .field("shm", &self.shm_path())
            .field("probes", &self.n_probes)
            .field("sites", &self.n_sites)
            .field("frozen", &self.frozen)
            .finish()
    }
}

pub(crate) use hotprobe_os::clock::monotonic_ns as now_ns;

impl PluginHost {
    /// Creates the shared memory (a memfd) and starts the service thread
    /// (heartbeat, synchronous answers).
    pub fn create(config: PluginConfig) -> Result<PluginHost, PluginError> {
        let slot_size = (80 + config.max_string.min(4096 - 80))
            .next_power_of_two()
            .max(128);
        let params = PluginParams {
            max_probes: config.max_probes,
            max_sites: config.max_sites,
            max_vcpus: config.max_vcpus,
            ring_capacity: config.ring_capacity,
            slot_size,
        };
        let layout = hotprobe_abi::plugin::PluginLayout::new(params).map_err(PluginError::Abi)?;
        let err = |e: hotprobe_os::OsError| PluginError::Shm(e.to_string());
        // Close-on-exec: QEMU opens it by its /proc path.
        let memfd = Memfd::new("hotprobe-qemu").map_err(err)?;
        memfd.set_len(layout.total_size as u64).map_err(err)?;
        let mapping = Mapping::shared(&memfd, layout.total_size).map_err(err)?;
        let ptr = mapping.as_ptr();
        // SAFETY: zero-filled, page-aligned, ours until `Mapped` drops
        // (`mapping` after `shm`).
        let shm = unsafe { PluginShm::create(ptr, layout.total_size, params) }
            .map_err(PluginError::Abi)?;
        // SAFETY: the header is ours before QEMU starts: plain fields.
        unsafe {
            let h = ptr as *mut hotprobe_abi::plugin::PluginHeader;
            std::ptr::addr_of_mut!((*h).host_pid).write(std::process::id());
            std::ptr::addr_of_mut!((*h).sync_timeout_ms)
                .write(config.sync_timeout.as_millis().clamp(1, u32::MAX as u128) as u32);
            std::ptr::addr_of_mut!((*h).stale_ms)
                .write(config.stale.as_millis().clamp(1, u32::MAX as u128) as u32);
            std::ptr::addr_of_mut!((*h).sync_spin_ns)
                .write(config.sync_spin.as_nanos().min(u32::MAX as u128) as u32);
        }
        shm.header().heartbeat_ns.store(now_ns(), Relaxed);
        let data_cap = shm.data_cap();
        let m = Arc::new(Mapped {
            shm,
            handler: Mutex::new(None),
            stop: AtomicBool::new(false),
            sync: SyncStats::default(),
            host_spin: config.host_spin,
            mapping,
            memfd,
        });
        let m2 = m.clone();
        let service = std::thread::Builder::new()
            .name("hotprobe-plugin".into())
            .spawn(move || service(&m2))
            .map_err(|e| PluginError::Shm(format!("cannot start the service thread: {e}")))?;
        Ok(PluginHost {
            m,
            service: Some(service),
            n_probes: 0,
            n_sites: 0,
            frozen: false,
            seen_drops: vec![0; config.max_vcpus as usize],
            data: vec![0; data_cap],
        })
    }

    fn shm(&self) -> &PluginShm {
        &self.m.shm
    }

    /// The path QEMU opens the shared memory by: `/proc/OUR_PID/fd/N`.
    pub fn shm_path(&self) -> PathBuf {
        self.m.memfd.proc_path()
    }

    /// QEMU's `-plugin LIBRARY,shm=PATH` arguments.
    pub fn qemu_args(&self, library: &Path) -> Vec<OsString> {
        let mut a = OsString::from(library);
        a.push(",shm=");
        a.push(self.shm_path());
        vec!["-plugin".into(), a]
    }

    /// Sets the address whose `jmp` counts as a return (the kernel's
    /// `__x86_return_thunk`), before the freeze.
    pub fn set_return_thunk(&mut self, addr: u64) -> Result<(), PluginError> {
        if self.frozen {
            return Err(PluginError::Refused("the plugin's sites are frozen".into()));
        }
        let h = self.m.mapping.as_ptr() as *mut hotprobe_abi::plugin::PluginHeader;
        // SAFETY: before the freeze the plugin reads nothing but the
        // frozen flag; a plain field of our mapping.
        unsafe { std::ptr::addr_of_mut!((*h).return_thunk).write_volatile(addr) };
        Ok(())
    }

    /// Where the guest kernel keeps its current task (for
    /// [`Fetch::Task`](hotprobe_abi::plugin::Fetch::Task) and the task of
    /// exit events); before the freeze.
    pub fn set_task_layout(&mut self, layout: TaskLayout) -> Result<(), PluginError> {
        if self.frozen {
            return Err(PluginError::Refused("the plugin's sites are frozen".into()));
        }
        let h = self.m.mapping.as_ptr() as *mut hotprobe_abi::plugin::PluginHeader;
        // SAFETY: before the freeze the plugin reads nothing but the
        // frozen flag; a plain field of our mapping.
        unsafe { std::ptr::addr_of_mut!((*h).task).write_volatile(layout) };
        Ok(())
    }

    /// Adds a probe and its sites (before the freeze); returns its index.
    pub fn add_probe(&mut self, p: &PluginProbe) -> Result<u32, PluginError> {
        if self.frozen {
            return Err(PluginError::Refused(
                "the plugin's sites are frozen (a site must be a candidate before the VM runs)"
                    .into(),
            ));
        }
        let lay = *self.shm().layout();
        if self.n_probes >= lay.params.max_probes {
            return Err(PluginError::Refused(format!(
                "more than {} plugin probes",
                lay.params.max_probes
            )));
        }
        if self.n_sites as usize + p.sites.len() > lay.params.max_sites as usize {
            return Err(PluginError::Refused(format!(
                "more than {} plugin sites",
                lay.params.max_sites
            )));
        }
        if p.values.len() > MAX_VALUES {
            return Err(PluginError::Refused(format!(
                "at most {MAX_VALUES} values per event"
            )));
        }
        if p.return_probe && p.range.is_none_or_empty() {
            return Err(PluginError::Refused(
                "a return probe needs its function's range".into(),
            ));
        }
        let idx = self.n_probes;
        // SAFETY: before the freeze; idx < max_probes.
        unsafe {
            let d = self.shm().probe_mut(idx);
            std::ptr::addr_of_mut!((*d).kind).write(if p.return_probe {
                PROBE_RETURN
            } else {
                PROBE_ENTRY
            });
            std::ptr::addr_of_mut!((*d).delivery).write(match p.delivery {
                Delivery::Count => DELIVER_COUNT,
                Delivery::Async => DELIVER_ASYNC,
                Delivery::Sync => DELIVER_SYNC,
            });
            std::ptr::addr_of_mut!((*d).nfetch).write(p.values.len() as u32);
            for (k, f) in p.values.iter().enumerate() {
                std::ptr::addr_of_mut!((*d).fetch[k]).write(f.encode());
            }
            std::ptr::addr_of_mut!((*d).string).write(StringFetch::encode(p.string));
            std::ptr::addr_of_mut!((*d).filter_cr3).write(p.filter_cr3.unwrap_or(0));
            let (fi, fv) = match p.filter_value {
                Some((i, v)) => (i as u32, v),
                None => (NO_FILTER, 0),
            };
            std::ptr::addr_of_mut!((*d).filter_index).write(fi);
            std::ptr::addr_of_mut!((*d).filter_value).write(fv);
            std::ptr::addr_of_mut!((*d).maxactive).write(p.maxactive.max(1));
            let (s, e) = p.range.unwrap_or((0, 0));
            std::ptr::addr_of_mut!((*d).range_start).write(s);
            std::ptr::addr_of_mut!((*d).range_end).write(e);
            (*d).enabled.store(p.enabled as u32, Relaxed);
        }
        for &va in &p.sites {
            self.shm()
                .set_site(
                    self.n_sites,
                    SiteDef {
                        vaddr: va,
                        probe: idx,
                        flags: 0,
                    },
                )
                .map_err(PluginError::Abi)?;
            self.n_sites += 1;
        }
        self.n_probes += 1;
        let h = self.shm().header();
        h.n_sites.store(self.n_sites, Release);
        h.n_probes.store(self.n_probes, Release);
        Ok(idx)
    }

    /// Makes the sites and probe definitions final: the plugin instruments
    /// what it translates from now on. Call before the VM runs its first
    /// instruction (QEMU is started with `-S`).
    /// The enable flags given with the probes are in the plugin's
    /// scoreboard when this returns (the error says if the plugin did not
    /// apply them in time).
    pub fn freeze(&mut self) -> Result<(), PluginError> {
        if !self.frozen {
            self.frozen = true;
            // Release pairs with the plugin's `frozen.load(Acquire)`: the
            // definitions are written before.
            self.shm().header().frozen.store(1, Release);
            return self.apply_flags();
        }
        Ok(())
    }

    /// Whether [`PluginHost::freeze`] was called.
    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// Probes defined.
    pub fn probes(&self) -> u32 {
        self.n_probes
    }

    /// Whether QEMU loaded the plugin and it mapped this memory.
    pub fn installed(&self) -> bool {
        self.shm().header().plugin_state.load(Acquire) >= PLUGIN_INSTALLED
    }

    /// Waits until the plugin is installed, `alive` says QEMU still runs,
    /// or `timeout`.
    pub fn wait_installed(
        &self,
        timeout: Duration,
        mut alive: impl FnMut() -> bool,
    ) -> Result<(), PluginError> {
        let t0 = Instant::now();
        while !self.installed() {
            if !alive() {
                return Err(PluginError::Qemu(
                    "QEMU exited before loading hotprobe's plugin (see its messages above)".into(),
                ));
            }
            if t0.elapsed() > timeout {
                return Err(PluginError::Timeout {
                    what: "load",
                    secs: timeout.as_secs(),
                });
            }
            futex_wait(
                &self.shm().header().plugin_state,
                0,
                Duration::from_millis(20),
            );
        }
        Ok(())
    }

    /// Enables or disables probe `p`: a flag and a generation the plugin
    /// copies into its scoreboard (nothing is retranslated). Returns once the
    /// plugin applied it (at most 2 s; at once if the plugin is not running).
    pub fn set_enabled(&self, p: u32, on: bool) -> Result<(), PluginError> {
        let d = self
            .shm()
            .probe(p)
            .filter(|_| p < self.n_probes)
            .ok_or_else(|| PluginError::Refused(format!("no plugin probe {p}")))?;
        d.enabled.store(on as u32, Release);
        self.apply_flags()
    }

    /// Bumps the generation and waits until the plugin copied every enable
    /// flag into its scoreboard (at most 2 s; at once if it is not running).
    fn apply_flags(&self) -> Result<(), PluginError> {
        let h = self.shm().header();
        let gen = h.generation.fetch_add(1, AcqRel).wrapping_add(1);
        futex_wake(&h.generation);
        if h.plugin_state.load(Acquire) != PLUGIN_INSTALLED {
            return Ok(());
        }
        let t0 = Instant::now();
        loop {
            // Acquire pairs with the plugin's `applied.store(Release)`.
            let a = h.applied.load(Acquire);
            if a.wrapping_sub(gen) as i32 >= 0 {
                return Ok(());
            }
            if h.plugin_state.load(Acquire) != PLUGIN_INSTALLED {
                return Ok(());
            }
            if t0.elapsed() > Duration::from_secs(2) {
                return Err(PluginError::Timeout {
                    what: "apply the enable flags",
                    secs: 2,
                });
            }
            futex_wait(&h.applied, a, Duration::from_millis(10));
        }
    }

    /// Whether probe `p` is enabled.
    pub fn is_enabled(&self, p: u32) -> bool {
        self.shm()
            .probe(p)
            .is_some_and(|d| d.enabled.load(Relaxed) != 0)
    }

    /// Probe `p`'s counts, summed over the vCPUs.
    pub fn counts(&self, p: u32) -> PluginCounts {
        let (hits, returns, nmissed, filtered) = self.shm().totals(p);
        PluginCounts {
            hits,
            returns,
            nmissed,
            filtered,
        }
    }

    /// Hands every event waiting in the rings to `event`, and each vCPU's
    /// new drops to `lost(vcpu, n)`; returns the events drained.
    pub fn drain(
        &mut self,
        event: &mut dyn FnMut(&PluginEvent, &[u8]),
        lost: &mut dyn FnMut(u32, u64),
    ) -> u64 {
        let m = self.m.clone();
        let shm = &m.shm;
        let nv = shm
            .header()
            .vcpus
            .load(Acquire)
            .min(shm.layout().params.max_vcpus);
        let mut total = 0;
        for v in 0..nv {
            match shm.drain(v, &mut self.data, |e, d| event(e, d)) {
                Ok(n) => total += n,
                Err(_) => lost(v, 0),
            }
            let d = shm.vcpu(v).map_or(0, |c| c.dropped.load(Relaxed));
            let seen = &mut self.seen_drops[v as usize];
            if d > *seen {
                lost(v, d - *seen);
                *seen = d;
            }
        }
        total
    }

    /// Events waiting in the rings.
    pub fn pending(&self) -> u64 {
        let shm = self.shm();
        let nv = shm
            .header()
            .vcpus
            .load(Acquire)
            .min(shm.layout().params.max_vcpus);
        (0..nv).map(|v| shm.pending(v)).sum()
    }

    /// Installs the handler that answers synchronous events (on the service
    /// thread).
    pub fn set_sync_handler(&self, h: SyncHandler) {
        *self.m.handler.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
    }

    /// What the plugin counted.
    pub fn stats(&self) -> PluginStats {
        let shm = self.shm();
        let h = shm.header();
        let nv = h.vcpus.load(Acquire).min(shm.layout().params.max_vcpus);
        let mut s = PluginStats {
            qemu_api: h.qemu_api.load(Relaxed),
            vcpus: nv,
            translations: h.translations.load(Relaxed),
            instrumented: h.instrumented.load(Relaxed),
            early_translations: h.early_translations.load(Relaxed),
            sync_timeouts: h.sync_timeouts.load(Relaxed),
            orphaned: h.orphaned.load(Relaxed),
            read_errors: h.read_errors.load(Relaxed),
            vcpu_overflow: h.vcpu_overflow.load(Relaxed),
            sync_vcpu_sleeps: h.sync_vcpu_sleeps.load(Relaxed),
            sync_host_wakes: h.sync_host_wakes.load(Relaxed),
            sync_wait_ns: h.sync_wait_ns.load(Relaxed),
            ..PluginStats::default()
        };
        for v in 0..nv {
            if let Some(c) = shm.vcpu(v) {
                s.ring_drops += c.dropped.load(Relaxed);
                s.sync_answered += c.sync_answered.load(Relaxed);
            }
        }
        s
    }

    /// Disables every probe (the guest runs on without callbacks' work):
    /// one generation for all of them.
    pub fn disable_all(&self) -> Result<(), PluginError> {
        for p in 0..self.n_probes {
            if let Some(d) = self.shm().probe(p) {
                d.enabled.store(0, Release);
            }
        }
        self.apply_flags()
    }
}

trait RangeExt {
    fn is_none_or_empty(&self) -> bool;
}

impl RangeExt for Option<(u64, u64)> {
    fn is_none_or_empty(&self) -> bool {
        !matches!(self, Some((s, e)) if s < e)
    }
}

impl Drop for PluginHost {
    fn drop(&mut self) {
        self.m.stop.store(true, Relaxed);
        futex_wake(&self.m.shm.header().doorbell);
        if let Some(t) = self.service.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_sites_freeze_and_flags() {
        let mut h = PluginHost::create(PluginConfig {
            max_probes: 2,
            max_sites: 3,
            max_vcpus: 1,
            ring_capacity: 4,
            ..PluginConfig::default()
        })
        .unwrap();
        assert!(h.shm_path().to_string_lossy().starts_with("/proc/"));
        let a = h.qemu_args(Path::new("/lib.so"));
        assert_eq!(a[0], "-plugin");
        assert!(a[1].to_string_lossy().starts_with("/lib.so,shm=/proc/"));
        let p = PluginProbe {
            delivery: Delivery::Async,
            values: vec![Fetch::Reg(hotprobe_abi::plugin::Reg::Rdi)],
            sites: vec![0x1000, 0x2000],
            ..PluginProbe::default()
        };
        assert_eq!(h.add_probe(&p).unwrap(), 0);
        let ret = PluginProbe {
            return_probe: true,
            sites: vec![0x3000],
            ..PluginProbe::default()
        };
        assert!(h.add_probe(&ret).is_err(), "a return probe needs a range");
        let too_many = PluginProbe {
            sites: vec![1, 2],
            ..PluginProbe::default()
        };
        assert!(h.add_probe(&too_many).is_err(), "3 sites at most");
        assert!(!h.is_enabled(0));
        // No plugin attached: applied at once.
        h.set_enabled(0, true).unwrap();
        assert!(h.is_enabled(0));
        h.freeze().unwrap();
        assert!(h.add_probe(&p).is_err(), "frozen");
        assert!(h.set_return_thunk(1).is_err(), "frozen");
        assert_eq!(h.counts(0), PluginCounts::default());
        assert_eq!(h.pending(), 0);
        h.disable_all().unwrap();
        assert!(!h.is_enabled(0));
        assert!(h.set_enabled(5, true).is_err());
    }
}
