//! hotprobe's QEMU TCG plugin of a guest the session started with it
//! (`crate::plugin::GuestPlugin`): `Count` and `Record` probes whose sites
//! were candidates before the VM ran are counted and recorded in QEMU's
//! translated code, gated by a flag; no stop of the VM.

use super::*;
use crate::plugin::GuestPlugin;
use crate::session::Mechanism;

/// The plugin of one guest.
pub(crate) struct PluginMech {
    pub(crate) plugin: Box<GuestPlugin>,
}

impl PluginMech {
    /// The mechanism over the plugin's shared memory.
    pub(crate) fn new(host: hotprobe_qemu::PluginHost) -> PluginMech {
        PluginMech {
            plugin: Box::new(GuestPlugin::new(host)),
        }
    }

    /// Whether the return thunk must still be looked up for it.
    pub(crate) fn wants_thunk(&self) -> bool {
        !self.plugin.thunk_set
    }
}

impl ProbeMechanism for PluginMech {
    fn kind(&self) -> MechKind {
        MechKind::Plugin
    }

    /// Any site while the guest has not run; afterwards the sites are
    /// final (the stub takes the rest).
    fn plan(
        &mut self,
        _cx: &mut Cx<'_>,
        _ask: &SiteAsk<'_>,
        _before: Option<String>,
    ) -> Result<Verdict, EngineError> {
        Ok(if self.plugin.host.is_frozen() {
            Verdict::Pass(
                "added once the guest ran: not a candidate of the QEMU plugin, \
                 so the GDB stub takes it"
                    .into(),
            )
        } else {
            Verdict::Take(Plan::Plugin(
                "instrumented by QEMU at translation, gated by a flag".into(),
            ))
        })
    }

    fn place(
        &mut self,
        cx: &mut Cx<'_>,
        ask: SiteAsk<'_>,
        plan: Plan,
    ) -> Result<Result<Placement, String>, EngineError> {
        let Plan::Plugin(reason) = plan else {
            return Ok(Err("not a plugin site".into()));
        };
        let (r, is_return, record, label) = (ask.r, ask.is_return, ask.record, ask.label);
        let opts = ask.plugin.unwrap_or_default();
        let id = cx.ids.take();
        let p = &mut self.plugin;
        if !p.thunk_set {
            p.thunk_set = true;
            if let Some(a) = ask.return_thunk {
                let _ = p.host.set_return_thunk(a);
            }
        }
        let range = r.function_range.as_ref().map(|x| (x.start.0, x.end.0));
        let refused = |reason: String| EngineError::RefusedSpec {
            spec: label.clone(),
            reason,
        };
        if (is_return || record) && (r.offset != 0 || range.is_none()) {
            return Err(refused(
                "a return on the QEMU plugin needs a function entry with a known size".into(),
            ));
        }
        p.add(
            id,
            r.addr.0,
            range,
            is_return,
            record,
            ask.nargs,
            ask.maxactive,
            &opts,
        )
        .map_err(refused)?;
        let execution = match (record, opts.delivery) {
            (false, _) => "plugin (count)",
            (true, hotprobe_qemu::Delivery::Sync) => "plugin (record, synchronous)",
            (true, _) => "plugin (record)",
        };
        Ok(Ok(Placement {
            id,
            label,
            addr: r.addr,
            function: r.function.clone(),
            module: r.module.clone(),
            is_return,
            mechanism: Mechanism::Plugin,
            reason,
            execution: execution.into(),
            entry_only: None,
        }))
    }

    /// A flag the plugin applies to its scoreboard: nothing is
    /// retranslated, no stop of the VM.
    fn set_enabled(&mut self, _cx: &mut Cx<'_>, id: ProbeId, on: bool) -> Result<(), EngineError> {
        self.plugin
            .set_enabled(id, on)
            .map_err(|reason| EngineError::RefusedSpec {
                spec: format!("probe {}", id.0),
                reason,
            })
    }

    fn remove(&mut self, _cx: &mut Cx<'_>, id: ProbeId) -> Result<(), EngineError> {
        Err(EngineError::RefusedSpec {
            spec: format!("probe {}", id.0),
            reason: "QEMU plugin probes stay candidates: disable it instead".into(),
        })
    }

    fn stats(&self, _engine: &Engine, id: ProbeId, me: i32, by: &mut ByProcess) -> bool {
        match self.plugin.stats(id) {
            Some(s) => {
                by.add_stats(me, &s);
                true
            }
            None => false,
        }
    }

    /// The plugin's rings and synchronous queue, straight to `sink` (its
    /// events are the guest's alone: nothing to merge them with).
    fn drain(
        &mut self,
        sink: &mut dyn EventSink,
        _queued: &mut Vec<(RecordedEvent, Option<Vec<u8>>)>,
    ) -> Result<(u64, u64), SinkError> {
        let before = self.plugin.drops;
        let n = self.plugin.drain(sink)?;
        Ok((n, self.plugin.drops - before))
    }

    /// A guest has no exec, fork, module mapped or unmapped the plugin
    /// follows (none is told for a guest), and its exit leaves nothing
    /// to undo: the plugin writes no code byte.
    fn on_change(&mut self, _cx: &mut Cx<'_>, _change: &TargetChange) {}

    /// It writes no code byte: no site of its is ever in the ledger.
    fn forget_sites(&mut self, _cx: &mut Cx<'_>, _gone: &[GoneSite]) -> Vec<ProbeId> {
        Vec::new()
    }

    /// The guest runs on without the callbacks' work (the plugin writes
    /// no code byte: nothing of it is in the ledger's walk).
    fn prepare_detach(&mut self, _cx: &mut Cx<'_>) -> Result<DetachReady, EngineError> {
        let _ = self.plugin.host.disable_all();
        Ok(DetachReady::Nothing)
    }

    /// The guest runs on without the callbacks' work.
    fn detach(&mut self, _cx: &mut Cx<'_>, gone: bool) -> Result<(), EngineError> {
        if !gone {
            let _ = self.plugin.host.disable_all();
        }
        Ok(())
    }
}
