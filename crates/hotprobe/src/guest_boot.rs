//! Boot phases of a guest kernel (`hotprobe guest record --boot`): the
//! kernel's boot milestones and its initcall levels, probed on the QEMU
//! plugin and recorded as phase markers of the trace.

use crate::{
    Action, EngineError, EventSink, Placement, PluginOptions, RecordedEvent, Session, SinkError,
    Skipped, TargetId, KIND_ENTRY, KIND_HIT,
};
use hotprobe_qemu::{Delivery, Fetch, Reg, StringFetch};
use hotprobe_trace::{ProbeKind, Symbol};
use std::collections::HashSet;

/// Kernel functions recorded as phase markers, in boot order: the kernel's
/// start, the end of the initcalls (init memory freed), and the first user
/// process.
pub const BOOT_MILESTONES: [&str; 3] = ["start_kernel", "free_initmem", "run_init_process"];

/// The kernel function each initcall level starts with (its argument: the
/// level's name): `do_initcall_level` is inlined, this one is `noinline`.
pub const INITCALL_LEVEL_FN: &str = "trace_initcall_level";

/// The initcall levels' names as the kernel passes them
/// (`initcall_level_names`, and `early` from `do_pre_smp_initcalls`).
pub const INITCALL_LEVELS: [&str; 9] = [
    "early", "pure", "core", "postcore", "arch", "subsys", "fs", "device", "late",
];

/// Why no boot phase can be recorded.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// The kernel has none of the milestones (nor the initcall levels'
    /// function), or none can be probed.
    #[error("none of the kernel's boot milestones can be probed")]
    NoMilestone {
        /// Each marker, with why it could not be probed.
        skipped: Vec<Skipped>,
    },
}

/// The marker probes of a boot recording.
#[derive(Debug, Default)]
pub struct BootMarkers {
    /// Milestone probes: their entries become marker hits.
    milestones: HashSet<u32>,
    /// The probe on [`INITCALL_LEVEL_FN`].
    level_probe: Option<u32>,
    /// The id of the first level marker (`initcall:early`); the others
    /// follow in [`INITCALL_LEVELS`] order.
    level_base: u32,
    /// Markers the kernel lacks (or that could not be probed), with why.
    pub skipped: Vec<Skipped>,
}

impl BootMarkers {
    /// Places the milestones and the initcall levels' function on the
    /// plugin of guest `t`, appended to `placed` (the user's probes: the
    /// level markers' ids follow every id there). A marker that cannot be
    /// probed is in [`BootMarkers::skipped`]; none at all is an error.
    pub fn place(
        session: &mut Session,
        t: TargetId,
        delivery: Delivery,
        placed: &mut Vec<Placement>,
    ) -> Result<BootMarkers, BootError> {
        let mut m = BootMarkers::default();
        let level_opts = PluginOptions {
            delivery,
            values: Some(vec![Fetch::Reg(Reg::Rdi)]),
            string: Some(StringFetch {
                index: 0,
                max_len: 16,
            }),
            ..PluginOptions::default()
        };
        let plain = PluginOptions {
            delivery,
            values: Some(Vec::new()),
            ..PluginOptions::default()
        };
        let mut skipped = Vec::new();
        let mut add = |name: &str, opts: &PluginOptions| -> Option<Placement> {
            match session.add_plugin(t, name, Action::Record, opts) {
                Ok(a) => a.placements.into_iter().next(),
                Err(e) => {
                    skipped.push(Skipped {
                        label: name.to_string(),
                        reason: reason(e),
                    });
                    None
                }
            }
        };
        for name in BOOT_MILESTONES {
            if let Some(p) = add(name, &plain) {
                m.milestones.insert(p.id.0);
                placed.push(p);
            }
        }
        if let Some(p) = add(INITCALL_LEVEL_FN, &level_opts) {
            m.level_probe = Some(p.id.0);
            placed.push(p);
        }
        m.level_base = placed.iter().map(|p| p.id.0 + 1).max().unwrap_or(0);
        if m.milestones.is_empty() && m.level_probe.is_none() {
            return Err(BootError::NoMilestone { skipped });
        }
        m.skipped = skipped;
        Ok(m)
    }

    /// An [`EventSink`] in front of `inner` that turns the markers' events
    /// into marker hits (a level's hit under its own marker symbol,
    /// `initcall:LEVEL`), the rest unchanged.
    pub fn sink<'a>(&'a self, inner: &'a mut dyn EventSink) -> BootSink<'a> {
        BootSink { inner, m: self }
    }

    /// The trace's symbols of `placed` (`nargs` argument registers recorded
    /// for the user's functions; the markers as markers, the initcall
    /// levels' function as one marker per level).
    pub fn symbols(&self, placed: &[Placement], nargs: u8) -> Vec<Symbol> {
        let mut symbols: Vec<Symbol> = placed
            .iter()
            .filter(|p| Some(p.id.0) != self.level_probe)
            .map(|p| {
                let marker = self.milestones.contains(&p.id.0);
                Symbol {
                    id: p.id.0,
                    name: p.function.clone().unwrap_or_else(|| p.label.clone()),
                    module: p.module.clone(),
                    addr: p.addr.0,
                    kind: if marker {
                        ProbeKind::Marker
                    } else {
                        ProbeKind::Function
                    },
                    nargs: if marker { 0 } else { nargs },
                    retval: !marker,
                }
            })
            .collect();
        if let Some(lp) = self.level_probe {
            let addr = placed.iter().find(|p| p.id.0 == lp).map_or(0, |p| p.addr.0);
            for (i, l) in INITCALL_LEVELS.iter().enumerate() {
                symbols.push(Symbol {
                    id: self.level_base + i as u32,
                    name: format!("initcall:{l}"),
                    module: "kernel".into(),
                    addr,
                    kind: ProbeKind::Marker,
                    nargs: 0,
                    retval: false,
                });
            }
        }
        symbols
    }
}

/// The error's text (the marker's name is said by the caller).
fn reason(e: EngineError) -> String {
    e.to_string()
}

/// See [`BootMarkers::sink`].
pub struct BootSink<'a> {
    inner: &'a mut dyn EventSink,
    m: &'a BootMarkers,
}

impl EventSink for BootSink<'_> {
    fn event(&mut self, ev: &RecordedEvent) -> Result<(), SinkError> {
        self.event_data(ev, &[])
    }

    fn event_data(&mut self, ev: &RecordedEvent, data: &[u8]) -> Result<(), SinkError> {
        let hit = |probe_id| RecordedEvent {
            probe_id,
            kind: KIND_HIT,
            nargs: 0,
            ..*ev
        };
        if self.m.milestones.contains(&ev.probe_id) {
            if ev.kind == KIND_ENTRY {
                self.inner.event(&hit(ev.probe_id))?;
            }
            return Ok(());
        }
        if Some(ev.probe_id) == self.m.level_probe {
            if ev.kind == KIND_ENTRY {
                if let Some(i) = INITCALL_LEVELS.iter().position(|l| l.as_bytes() == data) {
                    self.inner.event(&hit(self.m.level_base + i as u32))?;
                }
            }
            return Ok(());
        }
        self.inner.event(ev)
    }

    fn lost(&mut self, tid: u32, ts: u64, count: u64) -> Result<(), SinkError> {
        self.inner.lost(tid, ts, count)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Events as the sink passes them on.
    #[derive(Default)]
    struct Seen(Vec<(u32, u8)>);

    impl EventSink for Seen {
        fn event(&mut self, ev: &RecordedEvent) -> Result<(), SinkError> {
            self.0.push((ev.probe_id, ev.kind));
            Ok(())
        }
        fn lost(&mut self, _: u32, _: u64, _: u64) -> Result<(), SinkError> {
            Ok(())
        }
    }

    fn ev(probe_id: u32, kind: u8) -> RecordedEvent {
        RecordedEvent {
            probe_id,
            kind,
            ..RecordedEvent::default()
        }
    }

    #[test]
    fn markers_become_hits_and_levels_their_own_markers() {
        // Probes 1 (a milestone), 2 (the level function), 3 (the user's).
        let m = BootMarkers {
            milestones: [1].into(),
            level_probe: Some(2),
            level_base: 4,
            skipped: Vec::new(),
        };
        let mut seen = Seen::default();
        let mut s = m.sink(&mut seen);
        s.event_data(&ev(1, KIND_ENTRY), &[]).unwrap();
        s.event_data(&ev(1, crate::KIND_EXIT), &[]).unwrap();
        s.event_data(&ev(2, KIND_ENTRY), b"core").unwrap();
        s.event_data(&ev(2, KIND_ENTRY), b"nonsense").unwrap();
        s.event_data(&ev(3, KIND_ENTRY), &[]).unwrap();
        // `core` is level 2: marker 4 + 2.
        assert_eq!(
            seen.0,
            [(1, KIND_HIT), (6, KIND_HIT), (3, KIND_ENTRY)],
            "milestone entry → hit, its exit dropped, a level → its marker, the rest as is"
        );
    }
}
