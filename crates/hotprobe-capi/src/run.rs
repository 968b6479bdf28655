//! The event loop ([`hotprobe_run`]), detaching, and what a session
//! reports: a probe's counters, how a target ended, its process id.

use crate::args::{handle_arg, put, session_arg};
use crate::error::{guard, Fail};
#[cfg(doc)]
use crate::hotprobe_ctx_stop;
use crate::{
    hotprobe_probe, hotprobe_session, hotprobe_stats, hotprobe_target, HOTPROBE_END_EXITED,
    HOTPROBE_END_INTERRUPTED, HOTPROBE_END_STOPPED, HOTPROBE_ERR_NOT_FOUND, HOTPROBE_OK,
};
use hotprobe::{ProbeId, RunEnd, TargetId};
use std::cell::Cell;
use std::ffi::c_int;

/// Clears `running` when a run ends, whether it returns or unwinds.
struct Running<'a>(&'a Cell<bool>);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

/// Lets the targets run and handles their events until a handler calls
/// [`hotprobe_ctx_stop`] (`HOTPROBE_END_STOPPED`) or every target is gone
/// (`HOTPROBE_END_EXITED`); returns that positive value, or a negative
/// error code. May be called again after a stop.
///
/// # Safety
/// `s` is a live session, not used by a handler of this run.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_run(s: *mut hotprobe_session) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = unsafe { handle_arg(s) }?;
        // SAFETY: not running: this is the only `&mut Session` until the
        // run ends (`running` refuses the others meanwhile).
        let session = unsafe { &mut *h.session.get() };
        h.running.set(true);
        let _running = Running(&h.running);
        if !h.started.get() {
            session.start()?;
            h.started.set(true);
        }
        // Recorded events: the typed captures' kept, the rest counted.
        let mut counts = h.counts.borrow_mut();
        let end = h.typed.borrow_mut().with_sink(Some(&mut *counts), |sink| {
            session.run_with(&std::sync::atomic::AtomicBool::new(false), Some(sink))
        })?;
        Ok(match end {
            RunEnd::Stopped => HOTPROBE_END_STOPPED,
            RunEnd::AllExited => HOTPROBE_END_EXITED,
            RunEnd::Interrupted => HOTPROBE_END_INTERRUPTED,
        })
    })
}

/// Detaches from every target: probes removed, original code restored,
/// the programs run on.
///
/// # Safety
/// `s` is a live session.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_detach(s: *mut hotprobe_session) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let s = unsafe { session_arg(s) }?;
        s.detach()?;
        Ok(HOTPROBE_OK)
    })
}

/// A probe's counters, whatever its mechanism.
///
/// # Safety
/// `s` is a live session; `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_stats_of(
    s: *mut hotprobe_session,
    probe: hotprobe_probe,
    out: *mut hotprobe_stats,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let s = unsafe { session_arg(s) }?;
        let st = s.stats(ProbeId(probe)).ok_or(Fail {
            code: HOTPROBE_ERR_NOT_FOUND,
            msg: format!("no probe with id {probe}"),
        })?;
        let c = hotprobe_stats {
            hits: st.hits,
            nmissed: st.nmissed,
            returns: st.returns,
            abandoned: st.abandoned,
        };
        // SAFETY: per this function's contract.
        unsafe { put(out, c) };
        Ok(HOTPROBE_OK)
    })
}

/// How a target that is gone ended: 0 while it is alive (or was detached),
/// 1 with its exit code in `code_out`, 2 with the terminating signal in
/// `code_out`.
///
/// # Safety
/// `s` is a live session; `code_out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_exit_status(
    s: *mut hotprobe_session,
    target: hotprobe_target,
    code_out: *mut c_int,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let s = unsafe { session_arg(s) }?;
        let (kind, code) = match s.exit_status(TargetId(target as usize)) {
            Some(hotprobe::ExitStatus::Code(c)) => (1, c),
            Some(hotprobe::ExitStatus::Signal(sig)) => (2, sig),
            _ => (0, 0),
        };
        // SAFETY: per this function's contract.
        unsafe { put(code_out, code) };
        Ok(kind)
    })
}

/// The process id of a process target (0 for a guest).
///
/// # Safety
/// `s` is a live session.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_pid(s: *mut hotprobe_session, target: hotprobe_target) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let s = unsafe { session_arg(s) }?;
        Ok(s.pid(TargetId(target as usize)).unwrap_or(0))
    })
}
