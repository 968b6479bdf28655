//! What the engine reports to whoever holds it: notices for the user and
//! the forked children it held, typed. The session drains them after each
//! call into the engine ([`Engine::take_reports`]) and keeps them: the
//! engine holds neither notices nor children of its own.

use super::{Engine, Restores};
use hotprobe_target::{ExitStatus, RuntimeAddr, ThreadId};

/// One report of the engine.
#[derive(Debug)]
pub(crate) enum Report {
    /// Something the user is told.
    Notice(Notice),
    /// A forked child held stopped for the session to follow
    /// ([`Holds::forks`]), with the writes that put back the return
    /// addresses swapped in the forking thread's stack.
    Forked {
        /// The child's pid.
        child: u64,
        /// Its stack fixes (address, original bytes).
        fixes: Restores,
    },
}

/// A notice of the engine. Every number in one counts the user's probes,
/// never the session's own ([`super::ProbeEntry::internal`]).
#[derive(Debug)]
pub(crate) enum Notice {
    /// A forked child was released without probes.
    ForkReleased {
        /// The target, as it describes itself.
        target: String,
        /// The child's pid.
        child: u64,
    },
    /// An exec dropped the user's trap probes (their counts kept).
    ExecDropped {
        /// The target.
        target: String,
        /// How many of the user's probes.
        probes: usize,
    },
    /// The target ended.
    Ended {
        /// The target.
        target: String,
        /// How.
        status: ExitStatus,
        /// The user's probes armed in it, said only when it did not exit
        /// normally (0: none is named).
        probes: usize,
    },
    /// A thread detach could not move out of scratch memory.
    LeftInScratch {
        /// The thread.
        thread: ThreadId,
        /// Where it was left.
        rip: u64,
    },
    /// An unwinder hook could not be placed.
    NoUnwindHook {
        /// The target.
        target: String,
        /// The hook's address.
        addr: RuntimeAddr,
        /// Why.
        error: String,
    },
}

impl std::fmt::Display for Notice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Notice::ForkReleased { target, child } => {
                write!(f, "{target}: forked child {child} (released without probes)")
            }
            Notice::ExecDropped { target, probes } => write!(
                f,
                "{target}: exec: {probes} trap probes dropped (their counts before the exec are kept)"
            ),
            Notice::Ended {
                target,
                status,
                probes: 0,
            } => write!(f, "{target} {status}"),
            Notice::Ended {
                target,
                status,
                probes,
            } => write!(f, "{target} {status}: its {probes} probes are dropped"),
            Notice::LeftInScratch { thread, rip } => {
                write!(f, "thread {thread} left at {rip:#x} in scratch memory")
            }
            Notice::NoUnwindHook {
                target,
                addr,
                error,
            } => write!(
                f,
                "{target}: no unwinder hook at {addr}: {error} (an exception through a \
                 return-probed frame may crash the program)"
            ),
        }
    }
}

/// What the engine holds back at a target's events instead of letting
/// the target run on, as its holder asks for each event
/// ([`Engine::handle_holding`]). An engine on its own holds nothing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Holds {
    /// Forked children are held stopped and reported ([`Report::Forked`])
    /// instead of released without probes.
    pub forks: bool,
    /// At an exec the threads stay stopped: the holder resumes them once
    /// it placed its probes in the new image.
    pub exec: bool,
}

impl Engine {
    /// Takes what the engine reported since the last call, oldest first.
    pub(crate) fn take_reports(&mut self) -> Vec<Report> {
        std::mem::take(&mut self.reports)
    }

    /// Reports `notice`.
    pub(super) fn notice(&mut self, notice: Notice) {
        self.reports.push(Report::Notice(notice));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The texts are the ones users read (and the CLI's tests match).
    #[test]
    fn notice_texts() {
        let t = || "pid 7".to_string();
        let cases = [
            (
                Notice::ForkReleased {
                    target: t(),
                    child: 8,
                },
                "pid 7: forked child 8 (released without probes)",
            ),
            (
                Notice::ExecDropped {
                    target: t(),
                    probes: 2,
                },
                "pid 7: exec: 2 trap probes dropped (their counts before the exec are kept)",
            ),
            (
                Notice::Ended {
                    target: t(),
                    status: ExitStatus::Code(0),
                    probes: 0,
                },
                "pid 7 exited with code 0",
            ),
            (
                Notice::Ended {
                    target: t(),
                    status: ExitStatus::Signal(9),
                    probes: 1,
                },
                "pid 7 killed by signal 9: its 1 probes are dropped",
            ),
            (
                Notice::LeftInScratch {
                    thread: ThreadId(5),
                    rip: 0x1000,
                },
                "thread 5 left at 0x1000 in scratch memory",
            ),
        ];
        for (n, text) in cases {
            assert_eq!(n.to_string(), text);
        }
    }
}
