//! [`KernelRecorder`]: the events of one process's threads, their rings,
//! the drain, and what it gives at the end ([`KernelCapture`]).
//!
//! Layout: the kernel refuses to map an inherited event that follows a
//! thread on every CPU (`cpu == -1 && inherit`), so each thread gets one
//! `sys_enter` and one `sys_exit` event per online CPU, all inherited (the
//! threads and processes it creates get theirs, writing into the same
//! rings); the `sys_enter` events also report context switches. Each CPU
//! has one ring; the other events of that CPU write into it
//! (`PERF_EVENT_IOC_SET_OUTPUT`).

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::error::KernelError;
use crate::perf::{self, Ring};
use crate::records::{parse_records, KernelRecord, RawLayout};
use crate::spans::{pair, KernelSpan};
use crate::tracefs::raw_syscalls_layout;

/// How the events are opened.
#[derive(Clone, Copy, Debug)]
pub struct KernelOptions {
    /// Data pages of each CPU's ring (a power of two).
    pub ring_pages: usize,
    /// How long the background drain waits for records at most between
    /// two passes.
    pub drain_every: Duration,
}

impl Default for KernelOptions {
    fn default() -> KernelOptions {
        KernelOptions {
            // 4 MiB a CPU: ~25,000 syscalls (168 bytes of records each)
            // between two drains.
            ring_pages: 1024,
            drain_every: Duration::from_millis(10),
        }
    }
}

/// Counts of a recording (what `info` shows).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelStats {
    /// Threads followed from the start (their children inherit).
    pub threads: u64,
    /// Events opened (file descriptors).
    pub fds: u64,
    /// Records read: syscall enters and exits, switches.
    pub records: u64,
    /// Records the kernel lost (full ring, PERF_RECORD_LOST).
    pub lost: u64,
    /// Reads of a ring that could not be parsed whole (the rest of that
    /// read is dropped), and rings found overrun.
    pub corrupt: u64,
    /// Exits without their enter, and enters followed by another enter.
    pub unpaired: u64,
    /// Calls still open at the end.
    pub unfinished: u64,
}

/// What a recording gives: the spans and the counts.
#[derive(Clone, Debug, Default)]
pub struct KernelCapture {
    /// Syscall and off-CPU spans, by start time.
    pub spans: Vec<KernelSpan>,
    /// Counts.
    pub stats: KernelStats,
}

/// The events following one process's threads (observe-only: nothing is
/// written into the process, no handler runs in it). Closed on drop.
pub struct KernelRecorder {
    layout: RawLayout,
    rings: Vec<Ring>,
    /// Every event; the rings' leaders among them. Dropped after the
    /// rings (fields drop in order).
    fds: Vec<OwnedFd>,
    /// One per ring: the fd to poll.
    leaders: Vec<usize>,
    records: Vec<KernelRecord>,
    stats: KernelStats,
    scratch: Vec<u8>,
    options: KernelOptions,
}

/// The online CPUs (`/sys/devices/system/cpu/online`: `0-3,5`).
pub fn online_cpus() -> Vec<i32> {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap_or_default();
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        let (a, b) = part.split_once('-').unwrap_or((part, part));
        if let (Ok(a), Ok(b)) = (a.parse::<i32>(), b.parse::<i32>()) {
            cpus.extend(a..=b.min(a.saturating_add(4096)));
        }
    }
    if cpus.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        cpus.extend(0..n as i32);
    }
    cpus
}

/// Checks that this process may open the syscall tracepoints (tracefs
/// mounted and readable, perf_event_open permitted), opening one on its
/// own thread and closing it: the error says what is missing.
pub fn check_access() -> Result<(), KernelError> {
    let layout = raw_syscalls_layout()?;
    perf::open_tracepoint(layout.enter_type, 0, -1, true, "sys_enter").map(drop)
}

impl KernelRecorder {
    /// Opens the events for every thread of `pid` (disabled: see
    /// [`KernelRecorder::enable`]). The process should be stopped (under
    /// ptrace) so that no thread is created between the listing and the
    /// opening; threads and processes created later inherit the events.
    pub fn open(pid: i32, options: KernelOptions) -> Result<KernelRecorder, KernelError> {
        let mut tids = Vec::new();
        let dir = format!("/proc/{pid}/task");
        let rd = std::fs::read_dir(&dir).map_err(|source| KernelError::Threads { pid, source })?;
        for ent in rd.flatten() {
            if let Ok(t) = ent.file_name().to_string_lossy().parse::<i32>() {
                tids.push(t);
            }
        }
        tids.sort_unstable();
        Self::open_threads(pid, &tids, options)
    }

    /// Opens the events for these threads of `pid` (a thread gone since is
    /// left out).
    pub fn open_threads(
        pid: i32,
        tids: &[i32],
        options: KernelOptions,
    ) -> Result<KernelRecorder, KernelError> {
        let layout = raw_syscalls_layout()?;
        let pages = options.ring_pages.max(1).next_power_of_two();
        let mut r = KernelRecorder {
            layout,
            rings: Vec::new(),
            fds: Vec::new(),
            leaders: Vec::new(),
            records: Vec::new(),
            stats: KernelStats::default(),
            scratch: Vec::new(),
            options,
        };
        let mut followed = std::collections::BTreeSet::new();
        for cpu in online_cpus() {
            let mut leader: Option<usize> = None;
            for &tid in tids {
                let pair = perf::open_tracepoint(layout.enter_type, tid, cpu, true, "sys_enter")
                    .and_then(|e| {
                        perf::open_tracepoint(layout.exit_type, tid, cpu, false, "sys_exit")
                            .map(|x| (e, x))
                    });
                let (enter, exit) = match pair {
                    Ok(p) => p,
                    // The thread exited since it was listed.
                    Err(KernelError::Open { source, .. })
                        if source.raw_os_error() == Some(libc::ESRCH) =>
                    {
                        continue
                    }
                    Err(e) => return Err(e),
                };
                followed.insert(tid);
                match leader {
                    None => {
                        r.rings.push(Ring::map(&enter, pages, cpu)?);
                        perf::set_output(&exit, &enter)?;
                        leader = Some(r.fds.len());
                        r.leaders.push(r.fds.len());
                    }
                    Some(l) => {
                        perf::set_output(&enter, &r.fds[l])?;
                        perf::set_output(&exit, &r.fds[l])?;
                    }
                }
                r.fds.push(enter);
                r.fds.push(exit);
            }
        }
        if followed.is_empty() {
            return Err(KernelError::NoThread { pid });
        }
        r.stats.threads = followed.len() as u64;
        r.stats.fds = r.fds.len() as u64;
        Ok(r)
    }

    /// Starts the events (they count from now on, in every thread and in
    /// what those threads create from now on).
    pub fn enable(&self) -> Result<(), KernelError> {
        self.fds.iter().try_for_each(perf::enable)
    }

    /// Reads every ring; returns the records read.
    pub fn drain(&mut self) -> usize {
        let before = self.records.len();
        for ring in &mut self.rings {
            self.scratch.clear();
            ring.read_into(&mut self.scratch);
            let records = &mut self.records;
            let stats = &mut self.stats;
            let mut keep = |rec: KernelRecord| match rec {
                KernelRecord::Lost { count } => stats.lost += count,
                r => records.push(r),
            };
            if parse_records(&self.scratch, &self.layout, &mut keep).is_err() {
                self.stats.corrupt += 1;
            }
        }
        let read = self.records.len() - before;
        self.stats.records += read as u64;
        read
    }

    /// Waits until a ring has records or `timeout` passes.
    fn wait(&self, timeout: Duration) {
        let mut polls: Vec<libc::pollfd> = self
            .leaders
            .iter()
            .map(|&i| libc::pollfd {
                fd: self.fds[i].as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `polls` is a valid array of pollfd for the call.
        unsafe {
            libc::poll(
                polls.as_mut_ptr(),
                polls.len() as libc::nfds_t,
                timeout.as_millis().min(i32::MAX as u128) as i32,
            )
        };
    }

    /// Stops the events, reads what is left, closes them and pairs the
    /// records into spans.
    pub fn finish(mut self) -> KernelCapture {
        for fd in &self.fds {
            // A failed disable leaves the event counting until the close
            // just below: nothing to report.
            let _ = perf::disable(fd);
        }
        self.drain();
        let mut records = std::mem::take(&mut self.records);
        let mut stats = self.stats;
        stats.corrupt += self.rings.iter().map(|r| r.overruns).sum::<u64>();
        drop(self);
        let (spans, counts) = pair(&mut records);
        stats.unpaired = counts.unpaired;
        stats.unfinished = counts.unfinished;
        KernelCapture { spans, stats }
    }

    /// Moves the recorder to a thread of its own that drains the rings
    /// until [`Draining::finish`].
    pub fn drain_in_background(self) -> Result<Draining, KernelError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("hotprobe-kernel".into())
            .spawn(move || {
                let mut r = self;
                while !flag.load(Ordering::Acquire) {
                    if r.drain() == 0 {
                        r.wait(r.options.drain_every);
                    }
                }
                r.finish()
            })
            .map_err(KernelError::Spawn)?;
        Ok(Draining {
            stop,
            handle: Some(handle),
        })
    }
}

/// A [`KernelRecorder`] draining on a thread of its own.
pub struct Draining {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<KernelCapture>>,
}

impl Draining {
    /// Stops the drain, closes the events and returns what was recorded.
    pub fn finish(mut self) -> Result<KernelCapture, KernelError> {
        self.stop.store(true, Ordering::Release);
        let h = self.handle.take().ok_or(KernelError::DrainPanicked)?;
        h.join().map_err(|_| KernelError::DrainPanicked)
    }
}

impl Drop for Draining {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
