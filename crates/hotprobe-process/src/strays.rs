//! Wait statuses `waitpid(-1)` returned to one target for a task it does
//! not follow: another target's task (several processes in one session,
//! followed fork children), or a new thread of its own whose clone event
//! has not come yet. They are kept in a [`Strays`] that the targets of one
//! session share (the session owns it and hands it to each target it
//! makes; an adopted fork child shares its parent's), and each target
//! takes its own from there. Nothing is process-wide: each table goes with
//! its session.
//!
//! Pruned: a target whose process ended (or that is dropped) forgets its
//! tasks' entries; a stop status of a task gone from `/proc` is dropped
//! when the next status is stashed (nobody can resume a task that is gone).
//!
//! Two sessions driven from one thread (a host that starts both, then runs
//! one) reap each other's statuses too: a target that finds nothing of its
//! own in its table also looks in the other tables made on its thread. A
//! thread-local list holds them weakly (it owns no entry; a table goes
//! with its session).

use std::cell::RefCell;
use std::sync::{Arc, Mutex, Weak};

type Table = Mutex<Vec<(i32, i32)>>;

thread_local! {
    /// The tables made on this thread, weakly held (see the module docs).
    static TABLES: RefCell<Vec<Weak<Table>>> = const { RefCell::new(Vec::new()) };
}

/// A table of wait statuses, shared by the process targets of one session
/// (see the module docs). Cloning shares the table.
#[derive(Clone, Debug)]
pub struct Strays(Arc<Table>);

impl Default for Strays {
    fn default() -> Self {
        let s = Strays(Arc::new(Mutex::new(Vec::new())));
        let _ = TABLES.try_with(|t| {
            let mut t = t.borrow_mut();
            t.retain(|w| w.strong_count() > 0);
            t.push(Arc::downgrade(&s.0));
        });
        s
    }
}

impl Strays {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether both handles share one table.
    pub fn same(&self, other: &Strays) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// How many statuses are kept.
    pub fn len(&self) -> usize {
        self.0.lock().map(|v| v.len()).unwrap_or(0)
    }

    /// Whether no status is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The (pid, status) pairs kept, oldest first.
    pub fn entries(&self) -> Vec<(i32, i32)> {
        self.0.lock().map(|v| v.clone()).unwrap_or_default()
    }

    /// Keeps `status` of task `pid` for the target that follows it,
    /// dropping the stop statuses of tasks that are gone.
    pub(crate) fn stash(&self, pid: i32, status: i32) {
        self.stash_pruning(pid, status, task_exists);
    }

    fn stash_pruning(&self, pid: i32, status: i32, exists: impl Fn(i32) -> bool) {
        if let Ok(mut v) = self.0.lock() {
            v.retain(|&(p, st)| !libc::WIFSTOPPED(st) || exists(p));
            v.push((pid, status));
        }
    }

    /// Appends `batch`, statuses just reaped (a drain of every ready
    /// status, `ready.rs`), in its order: they are taken before any later
    /// one. No pruning: their tasks were there a moment ago.
    pub(crate) fn queue(&self, batch: Vec<(i32, i32)>) {
        if let Ok(mut v) = self.0.lock() {
            v.extend(batch);
        }
    }

    /// Takes the oldest status of task `pid`.
    pub(crate) fn take(&self, pid: i32) -> Option<i32> {
        self.take_of(|p| p == pid).map(|(_, st)| st)
    }

    /// Takes the oldest status of a task `mine` accepts: from this table,
    /// else from another table made on this thread.
    pub(crate) fn take_of(&self, mut mine: impl FnMut(i32) -> bool) -> Option<(i32, i32)> {
        if let Some(found) = take_from(&self.0, &mut mine) {
            return Some(found);
        }
        let others: Vec<Arc<Table>> = TABLES
            .try_with(|t| {
                t.borrow()
                    .iter()
                    .filter_map(Weak::upgrade)
                    .filter(|o| !Arc::ptr_eq(o, &self.0))
                    .collect()
            })
            .unwrap_or_default();
        others.iter().find_map(|o| take_from(o, &mut mine))
    }

    /// Whether [`Strays::take_of`] would find a status now (none taken).
    pub(crate) fn has_of(&self, mut mine: impl FnMut(i32) -> bool) -> bool {
        let mut found = |t: &Table| t.lock().is_ok_and(|v| v.iter().any(|(p, _)| mine(*p)));
        if found(&self.0) {
            return true;
        }
        TABLES
            .try_with(|t| {
                t.borrow()
                    .iter()
                    .filter_map(Weak::upgrade)
                    .any(|o| found(&o))
            })
            .unwrap_or(false)
    }

    /// Drops every status of a task `gone` accepts (a target's tasks once
    /// its process ended or it is dropped).
    pub(crate) fn forget(&self, mut gone: impl FnMut(i32) -> bool) {
        if let Ok(mut v) = self.0.lock() {
            v.retain(|(p, _)| !gone(*p));
        }
    }

    /// Moves every status of `other` into this table.
    pub(crate) fn absorb(&self, other: &Strays) {
        if self.same(other) {
            return;
        }
        let moved = other
            .0
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default();
        if let Ok(mut v) = self.0.lock() {
            v.extend(moved);
        }
    }
}

/// Takes the oldest status in `table` of a task `mine` accepts.
fn take_from(table: &Table, mine: &mut impl FnMut(i32) -> bool) -> Option<(i32, i32)> {
    let mut v = table.lock().ok()?;
    let i = v.iter().position(|(p, _)| mine(*p))?;
    Some(v.remove(i))
}

/// Whether task `pid` exists (`/proc/PID`, which lists every thread too).
fn task_exists(pid: i32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[cfg(test)]
mod tests {
    use super::*;

    const STOPPED: i32 = 0x137f; // SIGSTOP delivery stop.
    const EXITED: i32 = 0; // exit code 0.

    #[test]
    fn take_returns_the_oldest_of_the_task_and_removes_it() {
        let s = Strays::new();
        s.stash_pruning(10, STOPPED, |_| true);
        s.stash_pruning(11, EXITED, |_| true);
        s.stash_pruning(10, EXITED, |_| true);
        assert_eq!(s.take(10), Some(STOPPED));
        assert_eq!(s.entries(), vec![(11, EXITED), (10, EXITED)]);
        assert_eq!(s.take_of(|p| p == 11 || p == 10), Some((11, EXITED)));
        assert_eq!(s.take(12), None);
    }

    #[test]
    fn stop_statuses_of_gone_tasks_are_pruned_exits_are_kept() {
        let s = Strays::new();
        s.stash_pruning(10, STOPPED, |_| true);
        s.stash_pruning(11, EXITED, |_| true);
        // Task 10 and 11 gone: 10's stop is dropped, 11's exit kept (its
        // target takes it to learn how it ended).
        s.stash_pruning(12, STOPPED, |p| p == 12);
        assert_eq!(s.entries(), vec![(11, EXITED), (12, STOPPED)]);
    }

    #[test]
    fn another_table_of_this_thread_is_looked_in_not_one_of_another_thread() {
        let mine = Strays::new();
        let other_session = Strays::new();
        other_session.stash_pruning(21, EXITED, |_| true);
        assert_eq!(mine.take(21), Some(EXITED));
        assert!(other_session.is_empty());
        let elsewhere = std::thread::spawn(|| {
            let s = Strays::new();
            s.stash_pruning(22, EXITED, |_| true);
            s
        })
        .join()
        .expect("thread");
        assert_eq!(mine.take(22), None);
        assert_eq!(elsewhere.take(22), Some(EXITED));
        // A table dropped is no longer looked in (nothing keeps it alive).
        let gone = Strays::new();
        gone.stash_pruning(23, EXITED, |_| true);
        drop(gone);
        assert_eq!(mine.take(23), None);
    }

    #[test]
    fn forget_and_absorb() {
        let a = Strays::new();
        let b = Strays::new();
        a.stash_pruning(1, EXITED, |_| true);
        b.stash_pruning(2, EXITED, |_| true);
        a.absorb(&b);
        assert!(b.is_empty());
        assert_eq!(a.entries(), vec![(1, EXITED), (2, EXITED)]);
        a.forget(|p| p == 1);
        assert_eq!(a.entries(), vec![(2, EXITED)]);
        let shared = a.clone();
        assert!(shared.same(&a));
        a.absorb(&shared);
        assert_eq!(a.len(), 1);
    }
}
