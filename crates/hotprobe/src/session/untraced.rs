//! Running untraced, and what the in-process trap needs of a target.
//!
//! Once the targets run ([`Session::start`], and after probes added while
//! running) a process whose ptrace mechanisms have nothing placed — no
//! trap probe, no pending probe, no followed forks — runs untraced
//! ([`hotprobe_process::ProcessTarget::release`]), whether its probes are
//! on the agent's fast paths (patch, jump) alone, on in-process traps or
//! agent handlers: the in-process traps' `SIGTRAP`s, the program's own
//! signals and its thread starts (no clone stop) then cost no ptrace stop
//! ([`Session::ptrace_stops`] stays constant). Its end (status, a
//! `SIGKILL`) and an exec are still seen (see `hotprobe-process`'s
//! `release.rs`); the process is taken back (seized again) when the
//! session needs it stopped: to add a probe, to detach.
//!
//! What the tracer does at a thread's clone stop, and so what keeps a
//! process traced: `--stacks` publishes the new thread's stack region to
//! the agent's walk then, and per-process rows (`-f`, new processes) name
//! the thread's process from it. The agent registers new threads itself
//! (their counters, rings and shadow stacks are its own).
//!
//! Not seen untraced: a vfork child made by a call the preloaded agent's
//! interposers do not see (glibc's `system`/`popen`, whose `clone` is
//! internal, a raw `syscall`), between its vfork and its exec, counts its
//! hits (libc's exec path, if probed) in the forking thread's slot, where
//! a traced run tells the agent of it at the vfork stop. Such a child runs
//! only glibc's spawn code before it executes its program.

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
        // Thread starts the tracer must see (see the module docs): the
        // stack regions of `--stacks`, the per-process rows.
        let follow = self.config.follow_forks
            || self.config.fast_path.stacks
            || self.new_processes.is_some();
        let slot = &mut self.slots[i];
        if follow
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
