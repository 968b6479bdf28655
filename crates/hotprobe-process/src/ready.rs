//! Fair service of a traced process's threads.
//!
//! `waitpid(-1)` hands out the status of the first task in the kernel's
//! list that has one: the leader (a child) first, then the tracees, the
//! newest first. A loop that handled one status per wait served the
//! newest threads again and again while an older thread's stop waited
//! (under thread churn, 47 ms for the worst one in a prototype's runs).
//! So each wait that finds a status also takes every other status ready
//! then ([`Os::waitpid_ready`](crate::os::Os::waitpid_ready), `WNOHANG`),
//! and the batch is queued, the task served least recently first, ahead
//! of any new wait: every thread stopped at one moment is served before
//! any thread's next stop is looked at.
//!
//! The queue is the target's table of stray statuses ([`Strays`]), which
//! every wait of a target looks in before it waits (a wait for one thread,
//! the clone event's wait for the new thread's first stop, the statuses
//! of another target of the session), so that no queued status is waited
//! for in vain.

use crate::*;
use std::collections::HashMap;

/// The most statuses one drain takes (each task has one at a time; this
/// only bounds a drain that would never end).
const MAX_DRAIN: usize = 4096;

/// When each task was last served (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Served {
    /// Task → the tick of its last served status.
    last: HashMap<i32, u64>,
    /// Bumped by each served status.
    tick: u64,
}

impl Served {
    /// Notes that a status of `pid` is being handled now; forgets tasks
    /// not in `live` once the table is much larger (threads come and go).
    pub(crate) fn note(&mut self, pid: i32, live: impl Fn(i32) -> bool, threads: usize) {
        self.tick += 1;
        self.last.insert(pid, self.tick);
        if self.last.len() > 2 * threads + 64 {
            self.last.retain(|p, _| live(*p));
        }
    }

    /// Orders `batch` by when each task was last served, never served
    /// first; the kernel's order among equals (stable).
    pub(crate) fn order(&self, batch: &mut [(i32, i32)]) {
        batch.sort_by_key(|(p, _)| self.last.get(p).copied().unwrap_or(0));
    }
}

impl ProcessTarget {
    /// Queues `first`, a status a wait just returned, with every other
    /// status ready now, least recently served task first (see the module
    /// docs).
    pub(crate) fn queue_ready(&mut self, first: (i32, i32)) {
        let mut batch = vec![first];
        while batch.len() < MAX_DRAIN {
            match self.sys.waitpid_ready(libc::__WNOTHREAD) {
                Ok(Some(r)) => batch.push(r),
                // Nothing more ready, or no task left: the next wait says.
                Ok(None) | Err(_) => break,
            }
        }
        self.served.order(&mut batch);
        // The leader's end comes after its threads' (the kernel reports it
        // once they are gone): a thread's exit handled after the process's
        // would be lost with it, and the calls open in that thread with it.
        let leader = self.pid;
        batch.sort_by_key(|&(p, st)| p == leader && (libc::WIFEXITED(st) || libc::WIFSIGNALED(st)));
        self.strays.queue(batch);
    }

    /// Notes that a status of `pid` is handled now (see [`Served`]).
    pub(crate) fn note_served(&mut self, pid: i32) {
        let threads = &self.threads;
        self.served
            .note(pid, |p| threads.contains_key(&p), threads.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn least_recently_served_first_never_served_before_all() {
        let mut s = Served::default();
        s.note(10, |_| true, 3);
        s.note(11, |_| true, 3);
        s.note(10, |_| true, 3);
        // 12 never served, 11 longer ago than 10; 13 and 12 keep the
        // kernel's order.
        let mut batch = [(10, 1), (13, 2), (11, 3), (12, 4)];
        s.order(&mut batch);
        assert_eq!(batch, [(13, 2), (12, 4), (11, 3), (10, 1)]);
    }

    #[test]
    fn tasks_gone_are_forgotten_once_the_table_grows() {
        let mut s = Served::default();
        // One thread followed: up to 66 entries are kept as they are.
        for p in 0..66 {
            s.note(p, |p| p == 66, 1);
        }
        assert_eq!(s.last.len(), 66);
        // The 67th: only the live task stays.
        s.note(66, |p| p == 66, 1);
        assert_eq!(s.last.len(), 1);
        let mut batch = [(66, 0), (5, 0)];
        s.order(&mut batch);
        assert_eq!(batch, [(5, 0), (66, 0)]);
    }
}
