//! Sources of events that follow a target from outside it, registered
//! with the session in one line (`Session::observe`): the session tells
//! them when a process is about to run. The host kernel's events
//! (`KernelSource`, issue 25) are the first: observe-only, they change
//! nothing in the target and have no handler.

use crate::kernel_source::KernelSource;
use crate::EngineError;

/// Something that follows the session's processes from outside them.
pub trait TargetObserver {
    /// Process `pid` is about to run for the first time under the session
    /// (spawned and stopped before its first instruction, or attached and
    /// stopped): every thread it has now is known, and threads and
    /// processes it creates later are its children.
    fn process_starting(&mut self, pid: i32) -> Result<(), EngineError>;
}

impl TargetObserver for KernelSource {
    /// Opens the syscall and context-switch events on every thread of
    /// `pid` (the first process only: its children inherit them).
    fn process_starting(&mut self, pid: i32) -> Result<(), EngineError> {
        self.start(pid).map_err(EngineError::from)
    }
}
