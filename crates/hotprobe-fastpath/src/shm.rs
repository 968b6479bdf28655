//! The tracer's side of the shared memory: a memfd, mapped, with a
//! heartbeat thread.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hotprobe_abi::{rdtsc, Layout, Params, Shm, EVENT_SIZE_COMPACT, EVENT_SIZE_FULL};

use crate::{FastPathConfig, FastPathError};

/// A memfd holding the shared memory, mapped in the tracer.
#[derive(Debug)]
pub(crate) struct OwnedShm {
    fd: i32,
    ptr: *mut libc::c_void,
    len: usize,
    shm: Shm,
}

// SAFETY: the mapping is process-wide and lives as long as the value; all
// access goes through `Shm`, which is Sync.
unsafe impl Send for OwnedShm {}
// SAFETY: as above.
unsafe impl Sync for OwnedShm {}

impl OwnedShm {
    pub(crate) fn create(config: FastPathConfig) -> Result<OwnedShm, FastPathError> {
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
        let err =
            |what: &str| FastPathError::Shm(format!("{what}: {}", std::io::Error::last_os_error()));
        // SAFETY: a NUL-terminated name. CLOEXEC: no child of ours inherits
        // it; the target opens it through `/proc/OUR_PID/fd/FD`.
        let fd = unsafe { libc::memfd_create(c"hotprobe".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(err("memfd_create"));
        }
        // SAFETY: our fresh descriptor.
        if unsafe { libc::ftruncate(fd, layout.total_size as i64) } != 0 {
            // SAFETY: our descriptor.
            unsafe { libc::close(fd) };
            return Err(err("ftruncate"));
        }
        // SAFETY: a fresh shared mapping of our memfd.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout.total_size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            // SAFETY: our descriptor.
            unsafe { libc::close(fd) };
            return Err(err("mmap"));
        }
        // SAFETY: zero-filled, page-aligned, valid until Drop unmaps it after `shm`.
        let shm = unsafe { Shm::create(ptr as *mut u8, layout.total_size, params) }
            .map_err(|e| FastPathError::Shm(e.to_string()))?;
        let ticks = tsc_per_sec();
        shm.header().heartbeat_tsc.store(rdtsc(), Relaxed);
        // For threads that may not run `rdtsc` (the agent's clock module):
        // the frequency and a (TSC, CLOCK_MONOTONIC) pair.
        shm.header().tsc_hz.store(ticks, Relaxed);
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let t = rdtsc();
        // SAFETY: a valid out-pointer.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
        shm.header().calib_tsc.store(t, Relaxed);
        shm.header().calib_ns.store(
            ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64,
            Relaxed,
        );
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
            fd,
            ptr,
            len: layout.total_size,
            shm,
        })
    }

    pub(crate) fn fd(&self) -> i32 {
        self.fd
    }

    pub(crate) fn shm(&self) -> &Shm {
        &self.shm
    }
}

impl Drop for OwnedShm {
    fn drop(&mut self) {
        // SAFETY: our mapping and descriptor; `shm` is not used afterwards.
        unsafe {
            libc::munmap(self.ptr, self.len);
            libc::close(self.fd);
        }
    }
}

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

/// TSC ticks per second, measured over 2 ms (it sizes the heartbeat
/// timeout: a part in a thousand is plenty; every session start waits
/// for it).
fn tsc_per_sec() -> u64 {
    let t0 = Instant::now();
    let c0 = rdtsc();
    std::thread::sleep(Duration::from_millis(2));
    let c1 = rdtsc();
    let dt = t0.elapsed().as_secs_f64();
    ((c1 - c0) as f64 / dt) as u64
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
