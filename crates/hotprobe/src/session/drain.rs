//! Recorded events out of every mechanism into the caller's sink: each
//! mechanism's own (the plugin's rings, the trap's queued events) and the
//! agent's rings, merged by time stamp where both hold a thread's events.

use super::*;

impl Session {
    /// Drains every recording target into `sink`. With `low` 0, the usual
    /// thresholds apply and the nap before the next drain is returned;
    /// otherwise every ring is emptied.
    pub(super) fn drain<'s>(
        &mut self,
        sink: Option<&mut (dyn EventSink + 's)>,
        low: u64,
    ) -> Result<Duration, EngineError> {
        let Some(sink) = sink else {
            // Nobody to hand trap record events to: drop them rather than
            // let the queues grow (the counts stay in stats()).
            for s in &self.slots {
                s.mechs.trap.discard_events();
            }
            return Ok(Duration::ZERO);
        };
        // The probes of programs executed since the last pass, before
        // any of their events.
        while self.exec_announced < self.exec_images.len() {
            sink.exec_image(&self.exec_images[self.exec_announced])
                .map_err(EngineError::Sink)?;
            self.exec_announced += 1;
        }
        // Pending probes armed since the last pass, before their events.
        while self.armed_announced < self.armed_pending.len() {
            sink.pending_armed(&self.armed_pending[self.armed_announced])
                .map_err(EngineError::Sink)?;
            self.armed_announced += 1;
        }
        let mut nap = Duration::from_millis(1);
        let follow = self.config.follow_forks;
        for s in &mut self.slots {
            if !s.recording {
                continue;
            }
            // Without follow_forks a vfork child's events are not the
            // process's: not recorded, counted (see `vfork_unrecorded`).
            let skip = if follow {
                Vec::new()
            } else {
                vfork_children(s)
            };
            // A child claims its slot while the rings are drained: a tid
            // met for the first time is looked up again (see `skips`).
            let owners = match (follow, s.agent.fast_path(), s.pid) {
                (false, Some(fp), Some(me)) => Some((fp.shm(), me as u32)),
                _ => None,
            };
            let mut unfollowed = Unfollowed {
                skip,
                own: Vec::new(),
                owners,
                skipped: &mut self.vfork_unrecorded,
                inner: &mut *sink,
            };
            let sink: &mut dyn EventSink = &mut unfollowed;
            let mut queued = Vec::new();
            for m in s.mechs.all() {
                let (n, drops) = m.drain(sink, &mut queued).map_err(EngineError::Sink)?;
                s.drain.stats.events += n;
                s.drain.stats.ring_drops += drops;
            }
            for (ev, _) in &mut queued {
                if let Some(r) = s.origin.get(&ProbeId(ev.probe_id)) {
                    ev.probe_id = r.0;
                }
            }
            s.drain.stats.events += queued.len() as u64;
            let Some(fp) = s.agent.fast_path() else {
                for (ev, data) in &queued {
                    emit(sink, ev, data.as_deref()).map_err(EngineError::Sink)?;
                }
                continue;
            };
            // Ring starts in memory ahead of the threads still to come.
            fp.keep_rings_ready();
            if !queued.is_empty() {
                // Queued events were taken at ptrace stops, after every
                // event their thread had written into its ring: one pass
                // over the rings, merged with them by time stamp, keeps
                // each thread's events in order.
                let mut merged = Merge {
                    events: queued,
                    sink: &mut *sink,
                };
                s.drain
                    .pass(fp, &s.agent.ids, 1, &mut merged)
                    .map_err(EngineError::Sink)?;
                merged.events.sort_by_key(|(e, _)| e.tsc);
                for (ev, data) in &merged.events {
                    emit(sink, ev, data.as_deref()).map_err(EngineError::Sink)?;
                }
                continue;
            }
            // A ring is drained again while a drain of it returned at least
            // `low` events; the loop naps only when no ring held that many
            // (a drain right behind the producer pulls the cache lines it
            // is writing away from it). 1/64 of a ring.
            let ring_low = (u64::from(fp.ring_capacity()) / 64).max(64);
            let pass = s
                .drain
                .pass(
                    fp,
                    &s.agent.ids,
                    if low == 0 { ring_low } else { low },
                    sink,
                )
                .map_err(EngineError::Sink)?;
            let this = if pass.events == 0 {
                Duration::from_millis(1)
            } else if pass.max_fill < ring_low {
                pass.nap(u64::from(fp.ring_capacity()))
            } else {
                Duration::ZERO
            };
            nap = nap.min(this);
        }
        Ok(nap)
    }
}

/// The vfork children of slot `s`'s process that hit a probe: the trap's,
/// and the owners of the agent's thread slots of another pid (a vfork
/// child's slot: without `follow_forks` no other process claims one).
fn vfork_children(s: &Slot) -> Vec<u32> {
    let mut v: Vec<u32> = s
        .engine
        .vfork_children_hit()
        .into_iter()
        .map(|p| p as u32)
        .collect();
    if let (Some(fp), Some(me)) = (s.agent.fast_path(), s.pid) {
        let shm = fp.shm();
        v.extend(
            (0..shm.threads_in_use())
                .filter_map(|slot| shm.thread_owner(slot))
                .filter(|(pid, _)| *pid != me as u32)
                .map(|(_, tid)| tid),
        );
    }
    v
}

impl Session {
    /// Events of vfork children not recorded, per child pid (without
    /// `follow_forks`: such a child runs in its parent's memory, probes
    /// included, but its events are not the parent's).
    pub fn vfork_unrecorded(&self) -> Vec<(u32, u64)> {
        self.vfork_unrecorded
            .iter()
            .map(|(p, n)| (*p, *n))
            .collect()
    }
}

/// Hands on every event but those of vfork children (the threads in
/// `skip`, or found to be one), which it counts per thread in `skipped`.
struct Unfollowed<'a, 's> {
    skip: Vec<u32>,
    /// Threads found to be the process's own in this pass.
    own: Vec<u32>,
    /// The agent's thread slots and the process's pid, to look a thread
    /// not met before up again: a vfork child can claim its slot after
    /// `skip` was listed and before its ring is drained.
    owners: Option<(&'a hotprobe_abi::Shm, u32)>,
    skipped: &'a mut std::collections::BTreeMap<u32, u64>,
    inner: &'a mut (dyn EventSink + 's),
}

impl Unfollowed<'_, '_> {
    fn skips(&mut self, tid: u32, n: u64) -> bool {
        let skip = self.skip.contains(&tid) || (!self.own.contains(&tid) && self.foreign(tid));
        if skip {
            *self.skipped.entry(tid).or_default() += n;
        }
        skip
    }

    /// Whether `tid` owns a thread slot of another pid than the process's
    /// (a vfork child's), remembered either way for the rest of the pass.
    fn foreign(&mut self, tid: u32) -> bool {
        let Some((shm, me)) = self.owners else {
            return false;
        };
        let foreign = (0..shm.threads_in_use())
            .filter_map(|slot| shm.thread_owner(slot))
            .any(|(pid, t)| t == tid && pid != me);
        match foreign {
            true => self.skip.push(tid),
            false => self.own.push(tid),
        }
        foreign
    }
}

impl EventSink for Unfollowed<'_, '_> {
    fn event(&mut self, ev: &RecordedEvent) -> Result<(), crate::SinkError> {
        if self.skips(ev.tid, 1) {
            return Ok(());
        }
        self.inner.event(ev)
    }
    fn event_data(&mut self, ev: &RecordedEvent, data: &[u8]) -> Result<(), crate::SinkError> {
        if self.skips(ev.tid, 1) {
            return Ok(());
        }
        self.inner.event_data(ev, data)
    }
    fn lost(&mut self, tid: u32, ts: u64, count: u64) -> Result<(), crate::SinkError> {
        if self.skips(tid, 0) {
            return Ok(());
        }
        self.inner.lost(tid, ts, count)
    }
    fn idle(&mut self) {
        self.inner.idle()
    }
}

/// Collects a ring pass's events (to merge them with queued events);
/// losses go straight on.
struct Merge<'a, 's> {
    events: Vec<(RecordedEvent, Option<Vec<u8>>)>,
    sink: &'a mut (dyn EventSink + 's),
}

impl EventSink for Merge<'_, '_> {
    fn event(&mut self, ev: &RecordedEvent) -> Result<(), crate::SinkError> {
        self.events.push((*ev, None));
        Ok(())
    }
    fn event_data(&mut self, ev: &RecordedEvent, data: &[u8]) -> Result<(), crate::SinkError> {
        self.events.push((*ev, Some(data.to_vec())));
        Ok(())
    }
    fn lost(&mut self, tid: u32, ts: u64, count: u64) -> Result<(), crate::SinkError> {
        self.sink.lost(tid, ts, count)
    }
}

/// Hands `ev` to `sink`, with its captured bytes when it has some.
fn emit(
    sink: &mut (dyn EventSink + '_),
    ev: &RecordedEvent,
    data: Option<&[u8]>,
) -> Result<(), crate::SinkError> {
    match data {
        Some(bytes) => sink.event_data(ev, bytes),
        None => sink.event(ev),
    }
}
