//! The tracer's side of the shared memory: a memfd, mapped, with a
//! heartbeat thread.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hotprobe_abi::stacks::{stacks_size, StacksParams, StacksView};
use hotprobe_abi::{
    growable_file_len, rdtsc, Layout, Params, Shm, DEFAULT_CHUNK_SLOTS, EVENT_SIZE_COMPACT,
    EVENT_SIZE_FULL, MAX_SLOTS,
};

use crate::{FastPathConfig, FastPathError};
use hotprobe_os::{clock, Mapping, Memfd};

/// A memfd holding the shared memory, mapped in the tracer.
#[derive(Debug)]
pub(crate) struct OwnedShm {
    // Dropped in this order: `shm` (which points into the mapping), the
    // mapping (held for its `Drop` only), the memfd.
    shm: Shm,
    _mapping: Mapping,
    memfd: Memfd,
    /// The kernel refused to populate ring starts (see
    /// [`OwnedShm::keep_rings_ready`]): not tried again.
    pool_refused: AtomicBool,
}

impl OwnedShm {
    /// In a memfd of ours, which the target opens through
    /// `/proc/OUR_PID/fd/FD` (close-on-exec: no child of ours inherits it).
    pub(crate) fn create(config: FastPathConfig) -> Result<OwnedShm, FastPathError> {
        let memfd = Memfd::new("hotprobe").map_err(|e| FastPathError::Shm(e.to_string()))?;
        OwnedShm::create_in(config, memfd)
    }

    /// In `memfd`, empty (one the target created and we took: see the
    /// `pass` module).
    pub(crate) fn create_in(
        config: FastPathConfig,
        memfd: Memfd,
    ) -> Result<OwnedShm, FastPathError> {
        // `max_threads` is the cap; the main layout holds the first chunk
        // of slots, and the others are mapped when threads need them
        // (`hotprobe_abi::SlotDirectory`).
        let cap = config.max_threads.clamp(1, MAX_SLOTS);
        let params = Params {
            n_probes: config.max_probes,
            // Two slots per probe id: the site table's index keeps neighbouring
            // sites on neighbouring slots (`hotprobe_abi::site_index`), so
            // only the pages under probed text are ever touched, whatever
            // the reserved size.
            n_site_slots: (config.max_probes.max(1) * 2).next_power_of_two(),
            n_threads: cap.min(DEFAULT_CHUNK_SLOTS),
            ring_capacity: config.ring_capacity,
            event_size: if config.record_args <= 2 {
                EVENT_SIZE_COMPACT
            } else {
                EVENT_SIZE_FULL
            },
        };
        let layout = Layout::new(params).map_err(|e| FastPathError::Shm(e.to_string()))?;
        let err = |e: hotprobe_os::OsError| FastPathError::Shm(e.to_string());
        // The stacks region (issue 24) goes after the main layout; the
        // agent maps the whole file and finds it there.
        let stacks = StacksParams::default();
        let stacks_len = match config.stacks {
            true => stacks_size(stacks).ok_or(FastPathError::Shm("stacks region size".into()))?,
            false => 0,
        };
        let total = layout.total_size + stacks_len;
        let grows = cap > params.n_threads;
        let file_len = match grows {
            // Sparse: a chunk costs nothing until a thread writes into it.
            true => growable_file_len(params, total, cap)
                .map_err(|e| FastPathError::Shm(e.to_string()))?,
            false => total,
        };
        memfd.set_len(file_len as u64).map_err(err)?;
        let mapping = Mapping::shared(&memfd, total).map_err(err)?;
        // SAFETY: zero-filled, page-aligned, valid until `mapping` drops,
        // after `shm`; a shared mapping of the first `total` bytes of a
        // file of `file_len` bytes.
        let shm = unsafe {
            match grows {
                true => Shm::create_growable(mapping.as_ptr(), total, params, cap),
                false => Shm::create(mapping.as_ptr(), total, params),
            }
        }
        .map_err(|e| FastPathError::Shm(e.to_string()))?;
        if config.stacks {
            // SAFETY: the last `stacks_len` bytes of the same mapping,
            // zero-filled and 64-byte aligned (every section of the layout is).
            unsafe {
                StacksView::create(mapping.as_ptr().add(layout.total_size), stacks_len, stacks)
            }
            .map_err(|e| FastPathError::Shm(e.to_string()))?;
        }
        let ticks = clock::tsc_per_sec(TSC_CALIBRATION);
        shm.header().heartbeat_tsc.store(rdtsc(), Relaxed);
        // For threads that may not run `rdtsc` (the agent's clock module):
        // the frequency and a (TSC, CLOCK_MONOTONIC) pair.
        shm.header().tsc_hz.store(ticks, Relaxed);
        let (t, ns) = clock::tsc_monotonic_pair();
        shm.header().calib_tsc.store(t, Relaxed);
        shm.header().calib_ns.store(ns, Relaxed);
        shm.header().heartbeat_timeout_tsc.store(
            (ticks as f64 * config.heartbeat_timeout.as_secs_f64()) as u64,
            Relaxed,
        );
        let ledger = shm.ledger_ctl();
        ledger.tracer_pid.store(std::process::id(), Relaxed);
        let hangup = hangup_pipe();
        if hangup >= 0 {
            ledger.hangup_fd.store(hangup as u32, Relaxed);
        }
        Ok(OwnedShm {
            shm,
            _mapping: mapping,
            memfd,
            pool_refused: AtomicBool::new(false),
        })
    }

    pub(crate) fn fd(&self) -> i32 {
        self.memfd.as_raw_fd()
    }

    pub(crate) fn shm(&self) -> &Shm {
        &self.shm
    }
}

/// Thread slots whose ring start the tracer keeps in memory beyond the
/// slots handed out so far (see [`OwnedShm::keep_rings_ready`]): 16 × 68
/// KiB, put in memory in ≈ 0.3 ms.
const RING_POOL_AHEAD: u32 = 16;

/// Ring starts put in memory by one call of [`OwnedShm::keep_rings_ready`]
/// at most once the pool exists (≈ 0.1 ms): a drain pass that refills it
/// is not held up for long.
const RING_POOL_STEP: u32 = 4;

impl OwnedShm {
    /// Keeps the ring pool ahead of the threads (see
    /// `hotprobe_abi::Header::ring_pool`): once a recording site exists,
    /// the ring starts of the next [`RING_POOL_AHEAD`] thread slots not yet
    /// handed out are put in memory here, in the tracer, so that a thread's
    /// first hit maps its ring without a system call instead of zeroing 64
    /// KiB (≈ 20 µs a thread: an 8-thread program's start under `record`
    /// was 5–20× native, `hotprobe-bench threadstart`). Called when a
    /// recording site is installed and at every drain pass; a few loads
    /// when the pool is full. Populating changes no content, so it may run
    /// while threads write their rings.
    pub(crate) fn keep_rings_ready(&self) {
        let shm = &self.shm;
        let n = shm.slot_capacity();
        let claimed = shm.header().threads_claimed.load(Relaxed).min(n);
        let want = claimed.saturating_add(RING_POOL_AHEAD).min(n);
        let (recording, ready) = shm.ring_pool();
        // Refilled once half of it is taken, not at every thread: a burst
        // of threads is not met by the tracer's populating on the same
        // CPUs.
        let low = claimed.saturating_add(RING_POOL_AHEAD / 2).min(n);
        if recording && ready >= low {
            return;
        }
        // The first fill (at install, before the program runs) in full;
        // refills by steps.
        let want = if recording {
            want.min(ready.saturating_add(RING_POOL_STEP))
        } else {
            want
        };
        let mut reached = ready;
        if !self.pool_refused.load(Relaxed) {
            for slot in ready..want {
                let ctl = shm.ring_ctl(slot).map(|c| c as *const _ as usize);
                let (Some(ctl), Some((start, len))) = (ctl, shm.ring_start(slot)) else {
                    break;
                };
                let page = ctl & !(hotprobe_abi::PAGE - 1);
                // SAFETY: both ranges lie in our shared mapping (the slot's
                // control page, its ring start: page-aligned, inside the
                // layout), which outlives `self.shm`; populating writes
                // nothing.
                let r = unsafe {
                    libc::madvise(
                        page as *mut _,
                        hotprobe_abi::PAGE,
                        libc::MADV_POPULATE_WRITE,
                    ) | libc::madvise(start as *mut _, len, libc::MADV_POPULATE_WRITE)
                };
                if r != 0 {
                    // Older kernels (before 5.14) answer EINVAL: no pool,
                    // threads prepare their rings themselves.
                    self.pool_refused.store(true, Relaxed);
                    break;
                }
                reached = slot + 1;
            }
        }
        shm.set_ring_pool(reached);
    }
}

impl crate::FastPath {
    /// Keeps thread slots' ring starts in memory ahead of the threads that
    /// will claim them, once a recording site exists (the session's drain
    /// calls this at every pass); see `OwnedShm::keep_rings_ready`.
    pub fn keep_rings_ready(&self) {
        if self.shm.shm().ring_pool().0 {
            self.shm.keep_rings_ready();
        }
    }

    /// Has the agent map the ring pool in the stopped target `t` (its
    /// `hotprobe_agent_map_rings`, by a remote call), once, after the
    /// first recording site: the program's next threads then find their
    /// slot's control page and ring start mapped, instead of each paying
    /// ≈ 10 µs of `madvise` and page tables at its first hit, queued on
    /// the others' (`hotprobe-bench threadstart --calls 1`, issue 23). Best
    /// effort: an agent without the export, or a failed call, leaves each
    /// thread to map its own, as before. No call when the pool holds no
    /// slot yet to hand out (a kernel without `MADV_POPULATE_WRITE`: the
    /// tracer made none).
    pub(crate) fn map_ring_pool(&mut self, t: &mut hotprobe_process::ProcessTarget) {
        let shm = self.shm.shm();
        if shm.ring_pool().1 <= shm.header().threads_claimed.load(Relaxed) {
            return;
        }
        if let Some(f) = self.map_rings.take() {
            let _ = hotprobe_process::remote_call::remote_call(
                t,
                f,
                &[],
                std::time::Duration::from_secs(10),
            );
        }
    }
}

/// How long the TSC rate is measured (it sizes the heartbeat timeout: a
/// part in a thousand is plenty; every session start waits for it).
const TSC_CALIBRATION: Duration = Duration::from_millis(2);

/// The write end of a pipe whose read end is closed at once, made once
/// per tracer process and never closed: the agent opens the pipe again
/// through `/proc/OUR_PID/fd/N` and asks for a `SIGTRAP` when it hangs
/// up, which it does only when this process dies, however it dies (see
/// `hotprobe_abi::LedgerCtl::hangup_fd`) — not when a fast path is
/// dropped (a process still traced would take that `SIGTRAP` as its
/// tracer's). Close-on-exec: no program the tracer starts keeps it open.
/// -1 when no pipe could be made (the agent then relies on the heartbeat
/// alone).
fn hangup_pipe() -> i32 {
    static PIPE: std::sync::OnceLock<i32> = std::sync::OnceLock::new();
    *PIPE.get_or_init(|| {
        let mut fds = [-1i32; 2];
        // SAFETY: a valid two-int array for the new descriptors.
        if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return -1;
        }
        // SAFETY: our fresh read end, used nowhere else.
        unsafe { libc::close(fds[0]) };
        fds[1]
    })
}

/// A thread writing the heartbeat every 100 ms until dropped (woken at
/// once then: dropping does not wait out its nap).
#[derive(Debug)]
pub(crate) struct Heartbeat {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Heartbeat {
    pub(crate) fn start(shm: Arc<OwnedShm>) -> Heartbeat {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                shm.shm().header().heartbeat_tsc.store(rdtsc(), Relaxed);
                std::thread::park_timeout(Duration::from_millis(100));
            }
        });
        Heartbeat {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
