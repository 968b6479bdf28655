//! Running untraced, and what the in-process trap needs of a target.
//!
//! Once the targets run ([`Session::start`], and after probes added while
//! running) a process whose ptrace mechanisms have nothing placed — no
//! trap probe, no pending probe, no followed forks — runs untraced
//! ([`hotprobe_process::ProcessTarget::release`]): the in-process traps'
//! `SIGTRAP`s then cost no ptrace stop at all
//! ([`Session::ptrace_stops`] stays constant); the process is taken back
//! (seized again) when the session needs it stopped: to add a probe, to
//! detach.

use super::*;

impl Session {
    /// Why target `t` may get no in-process trap, whose `int3` needs
    /// `SIGTRAP` unblocked in every thread and out of every handler's mask
    /// (issue 22): the preloaded agent keeps it so through the libc calls
    /// it interposes (`hotprobe-agent`'s `sigmask`). An agent injected into
    /// a running process cannot (the program's calls are bound to libc's
    /// already), nor can any agent in a Go program (its runtime sets masks
    /// with raw system calls). `None`: it may.
    pub(super) fn inproc_refusal(&mut self, t: TargetId) -> Result<Option<String>, EngineError> {
        let slot = self.slot(t)?;
        let Some(pid) = slot.pid.filter(|_| slot.is_process()) else {
            return Ok(Some("not a process".into()));
        };
        if !slot.spawned {
            return Ok(Some(
                "the agent was injected into a running process, whose signal-mask calls are \
                 bound to libc's: it cannot keep SIGTRAP unblocked in every thread"
                    .into(),
            ));
        }
        let symbols = self.process_symbols(t, pid)?;
        if symbols.modules().iter().any(crate::nonlocal::is_go_module) {
            return Ok(Some(
                "a Go runtime sets signal masks with raw system calls: SIGTRAP may be blocked"
                    .into(),
            ));
        }
        Ok(None)
    }

    /// ptrace stops of target `t`'s process so far (`None` for a guest).
    /// With only fast-path and in-process mechanisms placed it stays
    /// constant while the process runs (it runs untraced).
    pub fn ptrace_stops(&mut self, t: TargetId) -> Option<u64> {
        let slot = self.slots.get_mut(t.0)?;
        Slot::process(&mut slot.engine).map(|p| p.ptrace_stops())
    }

    /// Whether target `t` runs untraced now (see the module docs).
    pub fn is_untraced(&mut self, t: TargetId) -> bool {
        self.slots
            .get_mut(t.0)
            .and_then(|s| Slot::process(&mut s.engine))
            .is_some_and(|p| p.is_released())
    }

    /// Lets the started process of slot `i` run untraced when nothing of
    /// its needs ptrace (see the module docs); otherwise leaves it.
    pub(super) fn maybe_release(&mut self, i: usize) {
        let follow = self.config.follow_forks;
        let slot = &mut self.slots[i];
        let no_inproc = slot.mechs.inproc.as_ref().is_none_or(|m| m.is_empty());
        if (no_inproc && slot.agent.handlers.is_empty())
            || follow
            || !slot.engine.started
            || slot.engine.gone().is_some()
            || !slot.pending.is_empty()
            || slot.root.is_some()
            || !slot.mechs.trap.followable.is_empty()
            || slot.mechs.plugin.is_some()
        {
            return;
        }
        if let Some(pt) = Slot::process(&mut slot.engine) {
            if let Err(e) = pt.release() {
                slot.notice(format!(
                    "cannot run untraced: {e}; the process stays traced"
                ));
            }
        }
    }
}
