//! The host kernel's events of a traced process as a session observer
//! (`record --kernel`, issue 25): syscalls and off-CPU intervals of its
//! threads and of the threads and processes they create (perf events,
//! `hotprobe_kernel`), drained on a thread of their own while the target
//! runs and written into the trace at its end.

use hotprobe_kernel::{
    Draining, KernelError, KernelOptions, KernelRecorder, KernelStats, SpanKind,
};
use hotprobe_trace::{KernelEvent, KernelKind, TraceError, TraceWriter};
use std::collections::BTreeMap;

/// Fails (saying which permission is missing and how to get it) unless
/// the syscall tracepoints can be opened: checked before the target runs.
pub fn check_kernel_access() -> Result<(), KernelError> {
    hotprobe_kernel::check_access()
}

/// The host kernel's events of the session's process; register it with
/// `Session::observe`, then [`KernelSource::finish`] into the trace.
#[derive(Default)]
pub struct KernelSource {
    options: KernelOptions,
    draining: Option<Draining>,
    /// The process started first, and whether its children's events are
    /// kept (`-f`): without, only its own threads' are written.
    root: Option<u32>,
    follow_children: bool,
}

/// What [`KernelSource::finish`] wrote.
#[derive(Clone, Debug)]
pub struct KernelRecorded {
    /// The recorder's counts.
    pub stats: KernelStats,
    /// Syscall spans written.
    pub syscalls: u64,
    /// Off-CPU intervals written.
    pub off_cpu: u64,
}

/// Why the kernel's events could not be written into a trace.
#[derive(Debug, thiserror::Error)]
pub enum KernelSourceError {
    /// The recorder failed.
    #[error(transparent)]
    Kernel(#[from] KernelError),
    /// Writing into the trace failed.
    #[error("cannot write the kernel's events into the trace: {0}")]
    Trace(#[from] TraceError),
}

impl KernelSource {
    /// A source with the default options (one 4 MiB ring a CPU) that
    /// keeps the events of the process's own threads only.
    pub fn new() -> KernelSource {
        KernelSource::default()
    }

    /// As [`KernelSource::new`], keeping the events of the processes it
    /// creates too when `follow_children` (the session follows them).
    pub fn following(follow_children: bool) -> KernelSource {
        KernelSource {
            follow_children,
            ..KernelSource::default()
        }
    }

    /// Opens the events on every thread of `pid` (stopped: no thread is
    /// created meanwhile), enables them and drains them; a second process
    /// is already covered by inheritance.
    pub fn start(&mut self, pid: i32) -> Result<(), KernelError> {
        if self.draining.is_some() {
            return Ok(());
        }
        let rec = KernelRecorder::open(pid, self.options)?;
        rec.enable()?;
        self.draining = Some(rec.drain_in_background()?);
        self.root = Some(pid as u32);
        Ok(())
    }

    /// Stops the events, closes them and writes each thread's syscalls and
    /// off-CPU intervals into the trace, with the counts; `None` when it
    /// never started.
    pub fn finish(
        &mut self,
        writer: &mut TraceWriter,
    ) -> Result<Option<KernelRecorded>, KernelSourceError> {
        let Some(draining) = self.draining.take() else {
            return Ok(None);
        };
        let cap = draining.finish()?;
        // The perf events are inherited by every child; a child the session
        // does not follow is not ours to write.
        let keep = |pid: u32| self.follow_children || Some(pid) == self.root;
        let spans: Vec<_> = cap.spans.iter().filter(|s| keep(s.pid)).collect();
        let mut by_tid: BTreeMap<u32, (u32, Vec<KernelEvent>)> = BTreeMap::new();
        for s in &spans {
            let kind = match s.kind {
                SpanKind::Syscall { nr, ret } => KernelKind::Syscall { nr, ret },
                SpanKind::OffCpu { preempted } => KernelKind::OffCpu { preempted },
            };
            by_tid
                .entry(s.tid)
                .or_insert((s.pid, Vec::new()))
                .1
                .push(KernelEvent {
                    start: s.start_ns,
                    end: s.end_ns,
                    kind,
                });
        }
        for (tid, (pid, events)) in &by_tid {
            writer.write_kernel_thread(*tid, *pid, events)?;
        }
        let st = cap.stats;
        writer.note_kernel(st.records, st.lost, st.unpaired + st.unfinished, st.corrupt);
        let syscalls = spans
            .iter()
            .filter(|s| matches!(s.kind, SpanKind::Syscall { .. }))
            .count() as u64;
        Ok(Some(KernelRecorded {
            stats: st,
            syscalls,
            off_cpu: spans.len() as u64 - syscalls,
        }))
    }
}
