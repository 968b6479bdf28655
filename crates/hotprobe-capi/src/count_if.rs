//! Conditional counts from C: `hotprobe_count_if(s, t, "take", "arg0 > 256",
//! ids, cap, &n)`, then after [`crate::hotprobe_run`]
//! `hotprobe_count_if_hits(s, id, &hits)`.
//!
//! The probes record entry events (fast path, else traps); the session's
//! [`hotprobe::CountSink`] (the one the command line's `count 'SPEC if
//! COND'` uses) evaluates each entry's condition while the run drains the
//! events, and counts those where it holds. The condition grammar is the
//! library's ([`hotprobe::cond`]): `arg0`…`arg5` (rdi, rsi, rdx, rcx, r8,
//! r9, compared as signed 64-bit integers), the names of the function's
//! parameters from its DWARF (`"size > 256"`: compared with their own
//! size and signedness), numbers, `== != < <= > >=`, `&&`, `||`, `!`,
//! parentheses.

use crate::args::{handle_arg, put, session_arg, str_arg};
use crate::error::{guard, Fail};
use crate::{
    hotprobe_probe, hotprobe_session, hotprobe_target, HOTPROBE_ERR_INVALID,
    HOTPROBE_ERR_NOT_FOUND, HOTPROBE_ERR_REFUSED, HOTPROBE_OK,
};
use hotprobe::{CountError, ProbeId, TargetId};
use std::ffi::{c_char, c_int};

impl From<CountError> for Fail {
    fn from(e: CountError) -> Self {
        match e {
            CountError::Engine(e) => e.into(),
            e => Fail {
                code: HOTPROBE_ERR_INVALID,
                msg: e.to_string(),
            },
        }
    }
}

/// Counts the calls of every function `spec` names (a pattern names every
/// matching function) whose arguments satisfy `cond` (e.g. `"arg0 > 256"`,
/// or with the names of the function's parameters, from its DWARF:
/// `"size > 256 && key < 0"`; NULL counts every call). Writes up to `cap`
/// probe ids to `ids` and how many were placed to `n_out`; read each count
/// with [`hotprobe_count_if_hits`] after (or between) runs.
///
/// Refused with `HOTPROBE_ERR_INVALID`, and nothing left placed: a
/// condition that does not parse (the message gives the column), a
/// `%return` spec, a session that follows forks; for a condition naming
/// parameters, a function without DWARF or without such a parameter (the
/// message lists its parameters), or a target that is no process. On a
/// library the program has not loaded yet, a condition naming parameters
/// compiles when the library is loaded (see [`hotprobe_count_if_hits`]).
///
/// # Safety
/// `s` is a live session; `spec` a C string; `cond` null or a C string;
/// `ids` null or valid for `cap` writes; `n_out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_count_if(
    s: *mut hotprobe_session,
    target: hotprobe_target,
    spec: *const c_char,
    cond: *const c_char,
    ids: *mut hotprobe_probe,
    cap: usize,
    n_out: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = unsafe { handle_arg(s) }?;
        // SAFETY: per this function's contract.
        let session = unsafe { session_arg(s) }?;
        // SAFETY: per this function's contract.
        let spec = unsafe { str_arg(spec, "spec") }?;
        let cond = if cond.is_null() {
            None
        } else {
            // SAFETY: per this function's contract (not null).
            Some(unsafe { str_arg(cond, "cond") }?)
        };
        let added = h
            .counts
            .borrow_mut()
            .place(session, TargetId(target as usize), spec, cond)?;
        if !ids.is_null() {
            for (i, p) in added.placements.iter().take(cap).enumerate() {
                // SAFETY: `i < cap`, `ids` valid for `cap` writes.
                unsafe { ids.add(i).write(p.id.0) };
            }
        }
        // SAFETY: per this function's contract.
        unsafe { put(n_out, added.placements.len()) };
        Ok(HOTPROBE_OK)
    })
}

/// The calls a [`hotprobe_count_if`] probe counted so far (those whose
/// condition held), in `hits_out`. `HOTPROBE_ERR_NOT_FOUND` for a probe
/// that is not a conditional count. `HOTPROBE_ERR_REFUSED` for one on a
/// library loaded after it was placed whose condition names a parameter
/// the library's DWARF does not give (the error says why; its hits are
/// not counted).
///
/// # Safety
/// `s` is a live session; `hits_out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_count_if_hits(
    s: *mut hotprobe_session,
    probe: hotprobe_probe,
    hits_out: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = unsafe { handle_arg(s) }?;
        let counts = h.counts.borrow();
        if let Some(why) = counts.not_compiled(ProbeId(probe)) {
            return Err(Fail {
                code: HOTPROBE_ERR_REFUSED,
                msg: why.to_string(),
            });
        }
        let hits = counts.hits(ProbeId(probe)).ok_or(Fail {
            code: HOTPROBE_ERR_NOT_FOUND,
            msg: format!("no conditional count with id {probe}"),
        })?;
        // SAFETY: per this function's contract.
        unsafe { put(hits_out, hits) };
        Ok(HOTPROBE_OK)
    })
}

/// Recorded events lost so far (full rings): the conditional counts are
/// low by up to this many, in `lost_out`.
///
/// # Safety
/// `s` is a live session; `lost_out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_count_if_lost(
    s: *mut hotprobe_session,
    lost_out: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = unsafe { handle_arg(s) }?;
        let lost = h.counts.borrow().lost_events();
        // SAFETY: per this function's contract.
        unsafe { put(lost_out, lost) };
        Ok(HOTPROBE_OK)
    })
}
