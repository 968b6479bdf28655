//! The events of the trap mechanism's `Record` probes: stamped at the
//! ptrace stop, with the bytes a typed capture read there.

use super::Capture;
use crate::RecordedEvent;
use std::cell::RefCell;

/// Runs `capture` at a trap record probe's hit; the `reserved2` value
/// that ties the event to its bytes in `store`.
pub(super) fn captured(
    ctx: &mut crate::HitContext<'_>,
    capture: &Capture,
    exit: bool,
    store: &RefCell<Vec<Vec<u8>>>,
) -> u32 {
    let mut bytes = Vec::new();
    capture(ctx, exit, &mut bytes);
    let mut store = store.borrow_mut();
    store.push(bytes);
    store.len() as u32
}

/// An event for a trap record probe, stamped now.
pub(super) fn trap_event(ctx: &crate::HitContext<'_>, kind: u8) -> RecordedEvent {
    // SAFETY: rdtsc has no preconditions on x86-64.
    let tsc = unsafe { core::arch::x86_64::_rdtsc() };
    RecordedEvent {
        tsc,
        probe_id: ctx.probe().0,
        tid: ctx.thread().0 as u32,
        kind,
        nargs: 0,
        reserved: 0,
        reserved2: 0,
        args: [0; 6],
    }
}
