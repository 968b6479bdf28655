//! The target a session (or a standalone engine) holds, by its kind: a process, whose own
//! abilities (remote calls, release, the fast path's writes) the session
//! reaches through a typed accessor, or any other [`Target`] (a guest, a
//! test's mock). No downcast.

use hotprobe_process::ProcessTarget;
use hotprobe_target::Target;

/// A target, held by a session's slot or by a [`crate::StandaloneEngine`],
/// and lent to the [`crate::Engine`] for each call that reads or writes it.
pub enum HeldTarget {
    /// A Linux process.
    Process(Box<ProcessTarget>),
    /// Any other target (a guest kernel, a mock).
    Other(Box<dyn Target>),
}

impl HeldTarget {
    /// The target, whatever its kind.
    pub fn as_target(&mut self) -> &mut (dyn Target + 'static) {
        match self {
            HeldTarget::Process(p) => p.as_mut(),
            HeldTarget::Other(t) => t.as_mut(),
        }
    }

    /// The process, if the target is one.
    pub fn process(&mut self) -> Option<&mut ProcessTarget> {
        match self {
            HeldTarget::Process(p) => Some(p.as_mut()),
            HeldTarget::Other(_) => None,
        }
    }

    /// The process, if the target is one (shared).
    pub fn process_ref(&self) -> Option<&ProcessTarget> {
        match self {
            HeldTarget::Process(p) => Some(p.as_ref()),
            HeldTarget::Other(_) => None,
        }
    }
}

impl From<ProcessTarget> for HeldTarget {
    fn from(p: ProcessTarget) -> Self {
        HeldTarget::Process(Box::new(p))
    }
}

impl From<Box<dyn Target>> for HeldTarget {
    fn from(t: Box<dyn Target>) -> Self {
        HeldTarget::Other(t)
    }
}

impl std::ops::Deref for HeldTarget {
    type Target = dyn Target;

    fn deref(&self) -> &Self::Target {
        match self {
            HeldTarget::Process(p) => p.as_ref(),
            HeldTarget::Other(t) => t.as_ref(),
        }
    }
}

impl std::ops::DerefMut for HeldTarget {
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.as_target()
    }
}
