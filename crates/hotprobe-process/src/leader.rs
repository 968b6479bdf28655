//! A leader that called `pthread_exit` (or `SYS_exit`) while other
//! threads run on: a zombie until the last of them ends (see the field
//! `zombie_leader` of [`ProcessTarget`]).

use crate::*;

impl ProcessTarget {
    /// Whether the leader exited while other threads run on (see the
    /// field `zombie_leader`): the process lives, its leader is a zombie.
    pub fn leader_is_zombie(&self) -> bool {
        self.zombie_leader
    }

    /// A task whose `/proc/TID/` shows the process's memory, maps and
    /// executable: the leader, unless it is a zombie (then the first live
    /// thread followed).
    pub fn live_task(&self) -> i32 {
        if self.zombie_leader {
            if let Some(tid) = self.threads.keys().next() {
                return *tid;
            }
        }
        self.pid
    }

    /// Whether a seize of task `tid` refused with `EPERM` was that of a
    /// zombie leader (the kernel seizes no task that exited): then it is
    /// marked so, and the caller goes on with the other threads.
    pub(crate) fn seize_refused_by_zombie_leader(&mut self, tid: i32) -> bool {
        if tid == self.pid && self.sys.task_state(self.pid, tid) == Some('Z') {
            self.zombie_leader = true;
            return true;
        }
        false
    }

    /// The leader turned out to be a zombie while other threads run on
    /// (its task's state, read when no stop of it came): it is followed
    /// no more, and its exit is reported to the engine as a thread's.
    /// The process's end is still its wait status, once the last thread
    /// went.
    pub(crate) fn leader_became_zombie(&mut self) {
        self.zombie_leader = true;
        if self.threads.remove(&self.pid).is_some() {
            self.pending
                .push_back(TargetEvent::ThreadExited(ThreadId(self.pid as u64)));
        }
    }
}
