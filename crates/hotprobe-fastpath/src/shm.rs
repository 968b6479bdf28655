//! The tracer's side of the shared memory: a memfd, mapped, with a
//! heartbeat thread.

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hotprobe_abi::stacks::{stacks_size, StacksParams, StacksView};
use hotprobe_abi::{rdtsc, Layout, Params, Shm, EVENT_SIZE_COMPACT, EVENT_SIZE_FULL};

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
        let params = Params {
            n_probes: config.max_probes,
            // Two slots per probe id: the site table's index keeps neighbouring
            // sites on neighbouring slots (`hotprobe_abi::site_index`), so
            // only the pages under probed text are ever touched, whatever
            // the reserved size.
            n_site_slots: (config.max_probes.max(1) * 2).next_power_of_two(),
            n_threads: config.max_threads,
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
        memfd.set_len(total as u64).map_err(err)?;
        let mapping = Mapping::shared(&memfd, total).map_err(err)?;
        // SAFETY: zero-filled, page-aligned, valid until `mapping` drops,
        // after `shm`.
        let shm = unsafe { Shm::create(mapping.as_ptr(), total, params) }
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
        })
    }

    pub(crate) fn fd(&self) -> i32 {
        self.memfd.as_raw_fd()
    }

    pub(crate) fn shm(&self) -> &Shm {
        &self.shm
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
