//! The session's side of the in-process trap mechanism
//! ([`Mechanism::InProcessTrap`]) and of running untraced.
//!
//! A `Count` probe whose site neither a patch nor a jump can take (a
//! function shorter than 5 bytes, a jump target, an instruction inside a
//! function) goes to an in-process trap when the target has the agent:
//! an `int3` the agent's `SIGTRAP` handler takes inside the target
//! (`hotprobe_fastpath::FastPath::add_inproc`). It stays on the ptrace
//! trap, with both reasons, where the instruction cannot run in-process
//! (see `hotprobe-fastpath`'s `inproc` module), where the engine has a
//! breakpoint at the same address, or with `--mechanism trap`.
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
    /// Places a `Count` probe at `r` as an in-process trap; `Err(why)`
    /// when the site cannot take one (the caller falls back to the trap).
    pub(super) fn place_inproc(
        &mut self,
        t: TargetId,
        r: &ResolvedProbe,
        fallback: &str,
        label: String,
    ) -> Result<Result<Placement, String>, EngineError> {
        let config = self.config.fast_path;
        let slot = self.slot(t)?;
        if !slot.is_process() || slot.plugin.is_some() {
            return Ok(Err("not a process".into()));
        }
        if slot.engine.execution_of(r.addr).is_some() {
            return Ok(Err("a trap probe is already at this address".into()));
        }
        if let Err(why) = slot.ensure_fast(&config) {
            return Ok(Err(why));
        }
        let started = slot.engine.started;
        let id = slot.engine.new_id();
        let Slot { engine, fast, .. } = slot;
        let Fast::On(fp) = fast else {
            return Ok(Err("the agent is not loaded".into()));
        };
        let Some(pt) = Slot::process(engine) else {
            return Ok(Err("not a process".into()));
        };
        let placed = fp.add_inproc(pt, r.addr.0);
        if started {
            pt.resume_all()?;
        }
        let info = match placed {
            Ok(info) => info,
            Err(hotprobe_fastpath::FastPathError::Impossible { why, .. }) => return Ok(Err(why)),
            Err(e) => return Ok(Err(e.to_string())),
        };
        slot.fast_probes
            .entry(id)
            .or_insert_with(|| FastProbe {
                counters: Vec::new(),
            })
            .counters
            .push((info.probe_id, None));
        let c = info.probe_id as usize;
        if slot.fast_ids.len() <= c {
            slot.fast_ids.resize(c + 1, None);
        }
        slot.fast_ids[c] = Some(id);
        slot.inproc += 1;
        Ok(Ok(Placement {
            id,
            label,
            addr: r.addr,
            function: r.function.clone(),
            module: r.module.clone(),
            is_return: r.is_return,
            mechanism: Mechanism::InProcessTrap,
            reason: format!(
                "{fallback}: int3 taken by the agent's SIGTRAP handler ({})",
                info.instruction
            ),
            execution: format!("{} ({})", Mechanism::InProcessTrap, info.execution),
        }))
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
        if slot.inproc == 0
            || follow
            || !slot.engine.started
            || slot.engine.gone().is_some()
            || !slot.pending.is_empty()
            || slot.root.is_some()
            || !slot.followable.is_empty()
            || slot.plugin.is_some()
        {
            return;
        }
        if let Some(pt) = Slot::process(&mut slot.engine) {
            if let Err(e) = pt.release() {
                slot.engine.notices.push(format!(
                    "cannot run untraced: {e}; the process stays traced"
                ));
            }
        }
    }
}
