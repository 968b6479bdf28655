//! The other threads a blocked remote call lets run (issue 22).
//!
//! A remote call into libc (the agent's `dlopen` and `dlsym` at attach,
//! its `dlclose` at detach) runs with every other thread stopped. One of
//! them may hold a lock the call needs: the loader's (a thread inside a
//! `dlopen` of its own, or creating a thread, when it was stopped), the
//! thread stack cache's, a malloc arena's. So a call that has not returned
//! after [`crate::remote_call::LET_OTHERS_RUN_AFTER`] lends the others:
//! they run until the call returns, then are stopped again as `stop_all`
//! stops them (their events queued).
//!
//! A thread inside a `dlopen` of its own reaches the loader's rendezvous
//! (`_dl_debug_state`, where the target keeps an `int3`, `rendezvous.rs`)
//! holding the loader's lock. Stopped there, it would hold the call up as
//! before: a plugin-loading program (threads that `dlopen` and `dlclose`
//! all the time) hung `count -p` for good in its third `dlsym`. So, while
//! threads are lent:
//! - the rendezvous `int3` is lifted (unless the engine has its own
//!   breakpoint there), so that no lent thread stops on it;
//! - a thread that had stopped there before, its `ModulesChanged` event
//!   waiting for the engine, is lent too: the event is taken out of the
//!   queue, the thread runs the bare `ret` and goes on. One whose event
//!   was handed out already is the engine's to resume, and is not lent;
//!   but at detach, where nothing handles events any more, `detach`
//!   parks it before its hooks run (the agent's `dlclose` waited for its
//!   lock until the timeout).
//!
//! When the threads are taken back the `int3` goes in again, and a
//! `ModulesChanged` event is queued, on a thread stopped for it, when one
//! was taken out or the executable mappings changed meanwhile (a library
//! loaded while lent is then armed late: its constructors may have run
//! unprobed). A lent thread that stops for anything else (a signal, a
//! probe's breakpoint) stays stopped until the take-back, which queues
//! its event: should it hold the lock, the call waits out its timeout.

use std::time::{Duration, Instant};

use hotprobe_target::{RuntimeAddr, Target, TargetError, TargetEvent, ThreadId};

use crate::{ProcessTarget, RunState};

/// How long [`ProcessTarget::settle_loader`] lets the threads run at a
/// time, at most.
const SETTLE_SLICE: Duration = Duration::from_millis(5);

/// Threads lent by [`ProcessTarget::lend_others`].
#[derive(Debug, Default)]
pub(crate) struct Lent {
    /// The threads resumed.
    tids: Vec<i32>,
    /// The rendezvous `int3` lifted meanwhile.
    lifted: Option<u64>,
    /// A thread's `ModulesChanged` event was taken out of the queue.
    event_taken: bool,
    /// The executable file mappings (start, path) when lent.
    modules_before: Vec<(u64, String)>,
}

impl Lent {
    /// Whether nothing was lent or changed (no [`ProcessTarget::take_back`]
    /// needed).
    pub(crate) fn is_empty(&self) -> bool {
        self.tids.is_empty() && self.lifted.is_none() && !self.event_taken
    }
}

impl ProcessTarget {
    /// Lets every stopped thread other than `call_tid` run (see the module
    /// docs): the parked ones, and the ones stopped at the rendezvous with
    /// their `ModulesChanged` event queued.
    pub(crate) fn lend_others(&mut self, call_tid: i32) -> Lent {
        let liftable = self
            .rendezvous
            .as_ref()
            .filter(|r| !r.engine_owned || !self.breakpoints.contains_key(&r.brk))
            .map(|r| r.brk);
        // A thread stopped at the rendezvous is lent when no `int3` stays
        // there (lifted below, or taken out with the others at detach):
        // it runs its `ret`.
        let free_after = self.rendezvous.is_none() || liftable.is_some();
        let tids: Vec<i32> = self
            .threads
            .iter()
            .filter(|(&tid, th)| {
                let at_rendezvous_event =
                    th.state == RunState::Event && th.at_rendezvous && free_after;
                tid != call_tid && (th.state == RunState::Parked || at_rendezvous_event)
            })
            .map(|(&tid, _)| tid)
            .collect();
        let mut lent = Lent::default();
        if tids.is_empty() {
            // Nothing to lend: nothing changes (the `int3` stays).
            return lent;
        }
        lent.modules_before = self.exec_mappings();
        if let Some(brk) = liftable.filter(|b| self.breakpoints.contains_key(b)) {
            if self.remove_int3(RuntimeAddr(brk)).is_ok() {
                lent.lifted = Some(brk);
            }
        }
        for tid in tids {
            let at_rendezvous = self.threads.get(&tid).is_some_and(|t| t.at_rendezvous);
            if at_rendezvous {
                let before = self.pending.len();
                self.pending.retain(
                    |e| !matches!(e, TargetEvent::ModulesChanged { thread } if thread.0 == tid as u64),
                );
                if self.pending.len() == before {
                    // Its event was handed to the engine already: the
                    // engine resumes it.
                    continue;
                }
                lent.event_taken = true;
                // Resumed from the rendezvous: `resume` runs its `ret`.
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.state = RunState::Parked;
                }
            }
            // A thread that cannot be resumed (it ended) is left to
            // `stop_all`.
            if self
                .resume(ThreadId(tid as u64), hotprobe_target::ResumeMode::Continue)
                .is_ok()
            {
                lent.tids.push(tid);
            }
        }
        lent
    }

    /// The threads other than `call_tid` that did not run while a remote
    /// call waited, in words, for the error of a call that timed out (one
    /// of them may hold the lock it waited for): each stopped thread not
    /// in `lent`, with why it is stopped and where; and how many were lent.
    pub(crate) fn held_up_by(&self, call_tid: i32, lent: &Lent) -> String {
        let held: Vec<String> = self
            .threads
            .iter()
            .filter(|(tid, t)| {
                **tid != call_tid && t.state != RunState::Running && !lent.tids.contains(tid)
            })
            .map(|(tid, t)| {
                let why = match t.held_for() {
                    Some(_) if t.at_rendezvous && t.state == RunState::Event => {
                        "stopped at the loader's rendezvous with an event not yet handled"
                    }
                    Some(why) => why,
                    None => "parked",
                };
                let at = self
                    .fetch_regs(*tid)
                    .map_or_else(|_| "?".to_string(), |r| format!("{:#x}", r.rip));
                format!("{tid} ({why}) at {at}")
            })
            .collect();
        format!(
            "{} other threads let run; not run: {}",
            lent.tids.len(),
            if held.is_empty() {
                "none".to_string()
            } else {
                held.join(", ")
            }
        )
    }

    /// Stops the threads of `lent` again, as `stop_all` does, puts the
    /// rendezvous `int3` back and queues a `ModulesChanged` event if one was
    /// taken out or the libraries changed (see the module docs).
    pub(crate) fn take_back(&mut self, lent: Lent) -> Result<(), TargetError> {
        let stopped = self.stop_all();
        if let Some(brk) = lent.lifted {
            if !self.breakpoints.contains_key(&brk) {
                self.insert_int3(RuntimeAddr(brk))?;
            }
            // The states read now: a change begun while lent is reported
            // when it ends, at the next hit.
            self.rendezvous_hit();
        }
        if lent.event_taken || self.exec_mappings() != lent.modules_before {
            let already = self
                .pending
                .iter()
                .any(|e| matches!(e, TargetEvent::ModulesChanged { .. }));
            let parked = self
                .threads
                .iter()
                .find(|(_, t)| t.state == RunState::Parked)
                .map(|(tid, _)| *tid);
            if let (false, Some(tid)) = (already, parked) {
                if let Some(t) = self.threads.get_mut(&tid) {
                    t.state = RunState::Event;
                }
                self.pending.push_back(TargetEvent::ModulesChanged {
                    thread: ThreadId(tid as u64),
                });
            }
        }
        stopped
    }

    /// Lets the threads run, a few milliseconds at a time, until the
    /// dynamic loader is not in the middle of a change with every thread
    /// stopped (another thread's `dlopen` or `dlclose`, in a program that
    /// loads plugins all the time), for at most `within`; whether it got
    /// there. A process that may still be starting (its leader in the
    /// loader's code, or one thread alone: the loader relocating it, an
    /// IFUNC resolver or a constructor of its libraries running) is left
    /// as it is: its libc may not be initialised yet, and a remote `dlopen`
    /// must not run there.
    pub fn settle_loader(&mut self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            if !self.loader_busy() {
                return true;
            }
            if self.threads.len() < 2 || self.leader_in_loader() || Instant::now() >= deadline {
                return false;
            }
            let lent = self.lend_others(0);
            if lent.is_empty() {
                // No thread that could end the change runs.
                return false;
            }
            let slice = Instant::now() + SETTLE_SLICE;
            while Instant::now() < slice && self.base_namespace_changing() {
                std::thread::yield_now();
            }
            if self.take_back(lent).is_err() {
                return false;
            }
        }
    }

    /// The executable file mappings of the process (start, path), to
    /// tell whether a library came or went; hotprobe's own (the agent a
    /// lent call loads, our pages) left out.
    fn exec_mappings(&self) -> Vec<(u64, String)> {
        let text =
            std::fs::read_to_string(format!("/proc/{}/maps", self.live_task())).unwrap_or_default();
        crate::parse_maps_lines(&text)
            .into_iter()
            .filter(|l| l.exec && l.name.starts_with('/') && !l.name.contains("hotprobe"))
            .map(|l| (l.start, l.name))
            .collect()
    }
}
