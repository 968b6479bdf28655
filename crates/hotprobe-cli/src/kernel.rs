//! `record --kernel`: the host kernel's events of the traced process
//! (hotprobe-kernel: syscalls and off-CPU intervals of its threads and of
//! the threads and processes they create), drained on a thread of their
//! own while the target runs and written into the trace at its end.

use anyhow::{Context, Result};
use hotprobe::kernel::{Draining, KernelOptions, KernelRecorder, KernelStats, SpanKind};
use hotprobe::trace::{KernelEvent, KernelKind, TraceWriter};
use std::collections::BTreeMap;

/// Fails (saying which permission is missing and how to get it) unless
/// the syscall tracepoints can be opened: checked before the target runs.
pub fn check() -> Result<()> {
    Ok(hotprobe::kernel::check_access()?)
}

/// Opens the events on every thread of `pid` (stopped under ptrace: no
/// thread is created meanwhile), enables them and drains them.
pub fn start(pid: i32) -> Result<Draining> {
    let rec = KernelRecorder::open(pid, KernelOptions::default())?;
    rec.enable()?;
    Ok(rec.drain_in_background()?)
}

/// Stops the events, closes them and writes each thread's syscalls and
/// off-CPU intervals into the trace, with the counts.
pub fn finish(draining: Draining, writer: &mut TraceWriter) -> Result<Recorded> {
    let cap = draining.finish()?;
    let mut by_tid: BTreeMap<u32, (u32, Vec<KernelEvent>)> = BTreeMap::new();
    for s in &cap.spans {
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
        writer
            .write_kernel_thread(*tid, *pid, events)
            .context("cannot write the kernel's events into the trace")?;
    }
    let st = cap.stats;
    writer.note_kernel(st.records, st.lost, st.unpaired + st.unfinished, st.corrupt);
    let syscalls = cap
        .spans
        .iter()
        .filter(|s| matches!(s.kind, SpanKind::Syscall { .. }))
        .count() as u64;
    Ok(Recorded {
        stats: st,
        syscalls,
        off_cpu: cap.spans.len() as u64 - syscalls,
    })
}

/// What [`finish`] wrote.
pub struct Recorded {
    /// The recorder's counts.
    pub stats: KernelStats,
    /// Syscall spans written.
    pub syscalls: u64,
    /// Off-CPU intervals written.
    pub off_cpu: u64,
}

/// The summary's line.
pub fn summary(r: &Recorded) -> String {
    let (st, syscalls, off_cpu) = (&r.stats, r.syscalls, r.off_cpu);
    format!(
        "  kernel:   {syscalls} syscalls and {off_cpu} off-CPU intervals (threads followed from \
         the start {}, {} perf events); {} records taken, {} lost by the kernel (full ring), \
         {} unpaired{}",
        st.threads,
        st.fds,
        st.records,
        st.lost,
        st.unpaired + st.unfinished,
        if st.corrupt > 0 {
            format!(", {} ring reads not parsed whole", st.corrupt)
        } else {
            String::new()
        }
    )
}
