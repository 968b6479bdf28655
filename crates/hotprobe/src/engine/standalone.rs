//! The engine together with a target: [`StandaloneEngine`] owns both (an
//! engine driven on its own, as its unit tests drive it), [`EngineView`]
//! borrows both from a session (`Session::engine`). The [`Engine`] itself
//! holds no target: each call that reads or writes the target borrows it.

#[cfg(test)]
use super::Holds;
use super::{Engine, Outcome};
use crate::handler::{ProbeId, RetProbe};
use crate::held::HeldTarget;
#[cfg(test)]
use crate::nonlocal::UnwindHook;
use crate::session::ids::ProbeIds;
use crate::EngineError;
use hotprobe_process::ProcessTarget;
use hotprobe_target::{RuntimeAddr, Target, TargetEvent};
use std::ops::{Deref, DerefMut};

/// The engine's methods that read or write the target, on a type holding
/// an engine (`engine`) and its target (`target`), owned or borrowed: each
/// lends the target to the engine's method of the same name.
macro_rules! lends_target {
    ($holder:ty) => {
        impl $holder {
            /// Adds a probe at `addr` (see [`Engine::add_probe`]).
            pub fn add_probe(
                &mut self,
                addr: RuntimeAddr,
                probe: crate::Probe,
            ) -> Result<ProbeId, EngineError> {
                self.engine.add_probe(&mut self.target, addr, probe)
            }

            /// Adds a return probe at `addr` (see [`Engine::add_retprobe`]).
            pub fn add_retprobe(
                &mut self,
                addr: RuntimeAddr,
                rp: RetProbe,
            ) -> Result<ProbeId, EngineError> {
                self.engine.add_retprobe(&mut self.target, addr, rp)
            }

            /// Removes probe `id` (see [`Engine::remove_probe`]).
            pub fn remove_probe(&mut self, id: ProbeId) -> Result<(), EngineError> {
                self.engine.remove_probe(&mut self.target, id)
            }

            /// Waits for one event (at most `timeout`) and handles it (see
            /// [`Engine::poll`]).
            pub fn poll(
                &mut self,
                timeout: Option<std::time::Duration>,
            ) -> Result<Outcome, EngineError> {
                self.engine.poll(&mut self.target, timeout)
            }

            /// Handles one event from the target (see [`Engine::handle`]).
            pub fn handle(&mut self, ev: TargetEvent) -> Result<(), EngineError> {
                self.engine.handle(&mut self.target, ev)
            }

            /// Detaches from the target (see [`Engine::detach`]).
            pub fn detach(&mut self) -> Result<(), EngineError> {
                self.engine.detach(&mut self.target)
            }

            /// Detach, first step (see [`Engine::prepare_detach`]).
            pub fn prepare_detach(&mut self) -> Result<bool, EngineError> {
                self.engine.prepare_detach(&mut self.target)
            }

            /// Detach, last step (see [`Engine::finish_detach`]).
            pub fn finish_detach(&mut self) -> Result<(), EngineError> {
                self.engine.finish_detach(&mut self.target)
            }
        }
    };
}

/// A trap engine that owns its target and numbers its probes itself: the
/// engine driven on its own, without a session. What reads or writes
/// nothing of the target ([`Engine::stats`], [`Engine::gone`], ...) is
/// the [`Engine`]'s, reached through `Deref`.
pub struct StandaloneEngine {
    engine: Engine,
    target: HeldTarget,
}

impl StandaloneEngine {
    /// An engine driving `target` on its own; probe ids start at `id_base`.
    pub fn new(target: Box<dyn Target>, id_base: u32) -> Self {
        StandaloneEngine::holding(HeldTarget::Other(target), id_base)
    }

    /// An engine driving `target` (a process, or any other: see
    /// [`HeldTarget`]) on its own; probe ids start at `id_base`.
    pub fn holding(mut target: HeldTarget, id_base: u32) -> Self {
        let engine = Engine::with_ids(&mut target, Some(ProbeIds::new(id_base)));
        StandaloneEngine { engine, target }
    }

    /// The target.
    pub fn target(&mut self) -> &mut dyn Target {
        self.target.as_target()
    }

    /// The process target, when the engine drives a process.
    pub fn process(&mut self) -> Option<&mut ProcessTarget> {
        self.target.process()
    }

    /// Handles one event, holding back what `holds` says (see
    /// [`Engine::handle_holding`]).
    #[cfg(test)]
    pub(crate) fn handle_holding(
        &mut self,
        ev: TargetEvent,
        holds: Holds,
    ) -> Result<(), EngineError> {
        self.engine.handle_holding(&mut self.target, ev, holds)
    }

    /// Sets the unwinder's hooks (see [`Engine::set_unwind_hooks`]).
    #[cfg(test)]
    pub(crate) fn set_unwind_hooks(
        &mut self,
        hooks: &[(RuntimeAddr, UnwindHook)],
    ) -> Result<(), EngineError> {
        self.engine.set_unwind_hooks(&mut self.target, hooks)
    }
}

lends_target!(StandaloneEngine);

impl Deref for StandaloneEngine {
    type Target = Engine;

    fn deref(&self) -> &Engine {
        &self.engine
    }
}

impl DerefMut for StandaloneEngine {
    fn deref_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }
}

/// A session's engine with its target, both borrowed from the session
/// (`Session::engine`): lower-level control of one target. What reads or
/// writes nothing of the target is the [`Engine`]'s, through `Deref`.
pub struct EngineView<'a> {
    /// The engine.
    pub engine: &'a mut Engine,
    /// The target it drives.
    pub target: &'a mut HeldTarget,
}

impl<'a> EngineView<'a> {
    /// The target, for as long as the session is borrowed.
    pub fn target(self) -> &'a mut dyn Target {
        self.target.as_target()
    }

    /// The process target, when the target is a process.
    pub fn process(self) -> Option<&'a mut ProcessTarget> {
        self.target.process()
    }
}

lends_target!(EngineView<'_>);

impl Deref for EngineView<'_> {
    type Target = Engine;

    fn deref(&self) -> &Engine {
        self.engine
    }
}

impl DerefMut for EngineView<'_> {
    fn deref_mut(&mut self) -> &mut Engine {
        self.engine
    }
}
