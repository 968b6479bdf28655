//! Events out of the fast path's shared-memory rings (and the trap
//! mechanism's recorded hits) into an [`EventSink`], with every lost event
//! accounted for.
//!
//! The drain follows the rules measured for `record` (docs/DESIGN.md,
//! "Traces"): each ring is drained again while a pass brings more than
//! `low` events; a ring found over a quarter full is copied out before it
//! is handed on (so the target gets its slots back at once); the loop naps
//! only when every ring is nearly empty.

use crate::handler::ProbeId;
use hotprobe_fastpath::{FastPath, RecordedEvent};
use std::sync::atomic::Ordering::Relaxed;

/// Where recorded events go: a trace writer, a live printer, a test.
pub trait EventSink {
    /// One event. Its `probe_id` is the raw value of the session's
    /// [`ProbeId`] of the probe that recorded it; `tid` the thread.
    fn event(&mut self, ev: &RecordedEvent) -> Result<(), SinkError>;

    /// One event with bytes its mechanism read at the hit (a guest string
    /// the QEMU plugin read, say). The default hands on the event alone.
    fn event_data(&mut self, ev: &RecordedEvent, data: &[u8]) -> Result<(), SinkError> {
        let _ = data;
        self.event(ev)
    }

    /// `count` events of thread `tid` were lost (a full ring) after time
    /// stamp `ts`.
    fn lost(&mut self, tid: u32, ts: u64, count: u64) -> Result<(), SinkError>;

    /// A drain pass found every ring empty (the target is not producing
    /// events): a chance to write out what is buffered. Default: nothing.
    fn idle(&mut self) {}

    /// A followed process executed a program and these probes were placed
    /// in it (see [`crate::SessionConfig::follow_exec`]): told before any
    /// of their events. Default: nothing.
    fn exec_image(&mut self, image: &crate::ExecImage) -> Result<(), SinkError> {
        let _ = image;
        Ok(())
    }

    /// A pending probe was armed in a module the program loaded (see
    /// [`crate::ArmedPending`]): told before any of its events there.
    /// Default: nothing.
    fn pending_armed(&mut self, armed: &crate::ArmedPending) -> Result<(), SinkError> {
        let _ = armed;
        Ok(())
    }
}

/// An [`EventSink`] failed (e.g. the trace file could not be written).
#[derive(Debug, thiserror::Error)]
#[error("the event sink failed: {0}")]
pub struct SinkError(#[from] pub Box<dyn std::error::Error + Send + Sync>);

impl EventSink for hotprobe_trace::TraceWriter {
    fn event(&mut self, ev: &RecordedEvent) -> Result<(), SinkError> {
        match hotprobe_trace::TraceEvent::from_abi(ev) {
            Some(te) => self.write_event(&te).map_err(|e| SinkError(Box::new(e))),
            None => Ok(()),
        }
    }
    fn event_data(&mut self, ev: &RecordedEvent, data: &[u8]) -> Result<(), SinkError> {
        match hotprobe_trace::TraceEvent::from_abi(ev) {
            Some(te) => self
                .write_event_values(&te, data)
                .map_err(|e| SinkError(Box::new(e))),
            None => Ok(()),
        }
    }
    fn lost(&mut self, tid: u32, ts: u64, count: u64) -> Result<(), SinkError> {
        self.note_lost(tid, ts, count)
            .map_err(|e| SinkError(Box::new(e)))
    }
    fn idle(&mut self) {
        hotprobe_trace::TraceWriter::idle(self);
    }
}

/// Counts of what was drained, for a summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DrainStats {
    /// Events handed to the sink.
    pub events: u64,
    /// Events lost in full rings (each reported to the sink as lost).
    pub ring_drops: u64,
    /// Events lost because a thread found no free ring slot (or had none
    /// yet: a signal handler interrupting its registration).
    pub no_slot: u64,
    /// Events refused because their thread was already inside the agent
    /// (a signal handler interrupting a probed function on the same
    /// thread), or because a return could not be hooked (each reported to
    /// the sink as lost).
    pub refused: u64,
    /// Events of a kind this version does not know, or of an unknown
    /// probe id, skipped.
    pub unknown: u64,
}

/// What one pass found.
pub(crate) struct Pass {
    /// Events drained from all rings.
    pub events: u64,
    /// The fullest ring, as found by the pass (events it held).
    pub max_fill: u64,
    /// Since the previous pass began (`None`: the first pass).
    pub since: Option<std::time::Duration>,
}

impl Pass {
    /// The nap before the next pass, for a pass that found the fullest
    /// ring under the drain's threshold (`max_fill` events written in
    /// `since`): half the time that ring would take to reach a quarter of
    /// `cap` at the rate seen, within 100–500 µs. A fixed 100 µs woke the
    /// tracer ten times a millisecond on the CPUs the program needed (an
    /// 8-thread start under `record` on 2 cores); 500 µs at most keeps a
    /// thread that starts writing at full speed (~60 events/µs) under
    /// half a ring of 2^16.
    pub fn nap(&self, cap: u64) -> std::time::Duration {
        let Some(since) = self.since else {
            return NAP_MIN;
        };
        let quarter = u128::from(cap / 4);
        let fill = u128::from(self.max_fill.max(1));
        let nanos = since.as_nanos().saturating_mul(quarter) / fill / 2;
        std::time::Duration::from_nanos(nanos.min(u128::from(u64::MAX)) as u64)
            .clamp(NAP_MIN, NAP_MAX)
    }
}

/// The drain state of one fast path.
#[derive(Default)]
pub(crate) struct RingDrain {
    /// Per ring slot: drops and refused events already reported, time of
    /// its last event.
    seen_drops: Vec<u64>,
    seen_refused: Vec<u64>,
    last_ts: Vec<u64>,
    /// Events copied out of a ring found over a quarter full.
    backlog: Vec<RecordedEvent>,
    /// The bytes of the continuation events read so far, for the event
    /// they precede (typed values copied in the target).
    data: Vec<u8>,
    pub stats: DrainStats,
    /// When the last pass began (the rings' fill since then sets the nap
    /// before the next: [`RingDrain::nap_after`]).
    last_pass: Option<std::time::Instant>,
}

/// The shortest and longest nap [`Pass::nap`] gives while the rings fill
/// slowly.
const NAP_MIN: std::time::Duration = std::time::Duration::from_micros(100);
const NAP_MAX: std::time::Duration = std::time::Duration::from_micros(500);

impl RingDrain {
    /// Drains every ring into `sink`, each until it holds less than `low`
    /// events (at most a ring's capacity per ring and pass, so that one
    /// busy thread cannot starve the others). `ids` maps fast-path probe
    /// ids to session probe ids.
    pub fn pass(
        &mut self,
        fp: &FastPath,
        ids: &[Option<ProbeId>],
        low: u64,
        sink: &mut dyn EventSink,
    ) -> Result<Pass, SinkError> {
        let shm = fp.shm();
        let slots = shm.threads_in_use() as usize;
        let cap = u64::from(shm.layout().params.ring_capacity);
        let began = std::time::Instant::now();
        let since = self
            .last_pass
            .replace(began)
            .map(|last| began.saturating_duration_since(last));
        if self.last_ts.len() < slots {
            self.last_ts.resize(slots, 0);
            self.seen_drops.resize(slots, 0);
            self.seen_refused.resize(slots, 0);
        }
        let mut pass = Pass {
            events: 0,
            max_fill: 0,
            since,
        };
        let mut err = None;
        for slot in 0..slots {
            let mut from_ring = 0u64;
            let mut continuations = 0u64;
            let mut first = true;
            self.data.clear();
            while let Some(mut c) = shm.consumer(slot as u32) {
                let last = &mut self.last_ts[slot];
                let unknown = &mut self.stats.unknown;
                let data = &mut self.data;
                let conts = &mut continuations;
                let mut write = |ev: &RecordedEvent| {
                    if ev.kind == hotprobe_abi::KIND_DATA {
                        // Bytes of the next event (published with it).
                        let n = (ev.tsc as usize).min(hotprobe_abi::capture::DATA_BYTES_PER_EVENT);
                        let bytes = ev.args.iter().flat_map(|w| w.to_le_bytes());
                        data.extend(bytes.take(n));
                        *conts += 1;
                        return;
                    }
                    let Some(Some(id)) = ids.get(ev.probe_id as usize) else {
                        data.clear();
                        *unknown += 1;
                        return;
                    };
                    let mut e = *ev;
                    e.probe_id = id.0;
                    *last = e.tsc;
                    if err.is_none() {
                        let r = match data.is_empty() {
                            true => sink.event(&e),
                            false => sink.event_data(&e, data),
                        };
                        if let Err(x) = r {
                            err = Some(x);
                        }
                    }
                    data.clear();
                };
                // A ring frees its slots only at the end of a drain: one
                // found over a quarter full (the drain was held up) is
                // copied out first, which frees it in a few ms, then
                // handed on; otherwise straight from the ring.
                let fill = shm.ring_ctl(slot as u32).map_or(0, |ctl| {
                    ctl.head.load(Relaxed).wrapping_sub(ctl.tail.load(Relaxed))
                });
                let r = if fill >= cap / 4 {
                    let backlog = &mut self.backlog;
                    backlog.clear();
                    let r = c.drain(|ev| backlog.push(*ev));
                    backlog.iter().for_each(&mut write);
                    r
                } else {
                    c.drain(write)
                };
                // A corrupt ring (not our agent's doing) was
                // resynchronised by the consumer; go on.
                let got = r.map_or(0, |s| s.read);
                if first {
                    pass.max_fill = pass.max_fill.max(got);
                    first = false;
                }
                from_ring += got;
                if got < low || from_ring >= cap {
                    break;
                }
            }
            // Continuations are parts of events, not events.
            pass.events += from_ring.saturating_sub(continuations);
        }
        if let Some(e) = err {
            return Err(e);
        }
        self.stats.events += pass.events;
        self.note_drops(fp, sink)?;
        if pass.events == 0 {
            sink.idle();
        }
        Ok(pass)
    }

    /// Reports to the sink the drops and refused events of every ring
    /// since the last pass.
    fn note_drops(&mut self, fp: &FastPath, sink: &mut dyn EventSink) -> Result<(), SinkError> {
        let shm = fp.shm();
        for slot in 0..self.seen_drops.len() {
            let Some(ctl) = shm.ring_ctl(slot as u32) else {
                continue;
            };
            let tid = ctl.owner_tid.load(Relaxed);
            let dropped = ctl.dropped.load(Relaxed);
            let refused = ctl.refused.load(Relaxed);
            let seen = &mut self.seen_drops[slot];
            let seen_refused = &mut self.seen_refused[slot];
            let new = dropped.saturating_sub(*seen) + refused.saturating_sub(*seen_refused);
            if new > 0 {
                sink.lost(tid, self.last_ts[slot], new)?;
                self.stats.ring_drops += dropped.saturating_sub(*seen);
                self.stats.refused += refused.saturating_sub(*seen_refused);
                *seen = dropped.max(*seen);
                *seen_refused = refused.max(*seen_refused);
            }
        }
        // Events of threads that found no free ring slot: lost records of
        // tid 0 (no thread of the program), after the latest time seen.
        let no_slot = shm.header().drops_no_thread.load(Relaxed);
        if no_slot > self.stats.no_slot {
            let ts = self.last_ts.iter().copied().max().unwrap_or(0);
            sink.lost(0, ts, no_slot - self.stats.no_slot)?;
        }
        self.stats.no_slot = no_slot.max(self.stats.no_slot);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn pass(max_fill: u64, since_us: Option<u64>) -> Pass {
        Pass {
            events: max_fill,
            max_fill,
            since: since_us.map(Duration::from_micros),
        }
    }

    #[test]
    fn the_nap_follows_the_fill_rate_within_its_bounds() {
        let cap = 1 << 16;
        // First pass: nothing to go by.
        assert_eq!(pass(100, None).nap(cap), NAP_MIN);
        // 2,000 events in 100 µs: a quarter ring (16,384) in 819 µs;
        // half of it, 409.6 µs.
        assert_eq!(
            pass(2000, Some(100)).nap(cap),
            Duration::from_nanos(409_600)
        );
        // Slow: the longest nap; fast: the shortest.
        assert_eq!(pass(10, Some(1000)).nap(cap), NAP_MAX);
        assert_eq!(pass(1000, Some(10)).nap(cap), NAP_MIN);
        // A small ring nearly full after 100 µs: as often as before.
        assert_eq!(pass(60, Some(100)).nap(64), NAP_MIN);
    }
}
