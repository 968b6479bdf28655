//! The sink of a run ([`Sink`]) and what it keeps, and the wrapper that
//! carries the run into `Python::allow_threads`.

use hotprobe::{EventSink, ProbeId, RecordedEvent, SinkError};
use std::cell::RefCell;
use std::rc::Rc;

/// Recorded events, as the run's sink hands them on.
#[derive(Default)]
pub(crate) struct Events {
    pub(crate) events: Vec<RecordedEvent>,
    /// Events lost (full rings), per thread.
    pub(crate) lost: u64,
}

/// The sink of a run: events of conditional counts to the session's
/// [`hotprobe::CountSink`], the others kept for the recordings.
pub(crate) struct Sink(
    pub(crate) Rc<RefCell<Events>>,
    pub(crate) Rc<RefCell<hotprobe::CountSink>>,
);

impl EventSink for Sink {
    fn event(&mut self, ev: &RecordedEvent) -> Result<(), SinkError> {
        let mut counts = self.1.borrow_mut();
        if counts.follows(ProbeId(ev.probe_id)) {
            return counts.event(ev);
        }
        self.0.borrow_mut().events.push(*ev);
        Ok(())
    }

    fn lost(&mut self, tid: u32, ts: u64, count: u64) -> Result<(), SinkError> {
        self.0.borrow_mut().lost += count;
        self.1.borrow_mut().lost(tid, ts, count)
    }

    /// A conditional count on a library loaded later: its condition
    /// compiles now.
    fn pending_armed(&mut self, armed: &hotprobe::ArmedPending) -> Result<(), SinkError> {
        self.1.borrow_mut().pending_armed(armed)
    }
}

/// Moves a value into `Python::allow_threads`, whose closure must be
/// `Send` although it runs on the calling thread.
pub(crate) struct OnThisThread<T>(pub(crate) T);

// SAFETY: `allow_threads` runs its closure on the calling thread, before it
// returns: the value never reaches another thread.
unsafe impl<T> Send for OnThisThread<T> {}

impl<T> OnThisThread<T> {
    pub(crate) fn into_inner(self) -> T {
        self.0
    }
}
