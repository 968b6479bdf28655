//! Typed capture from C: `hotprobe_record_typed(s, t, "work", ids, cap,
//! &n)` records each call of `work` with its parameters and return value
//! typed from the program's DWARF (`"work(i, s)"`: those parameters; the
//! command line's `trace -a` and `trace 'work(i, s)'`); after
//! [`crate::hotprobe_run`], `hotprobe_typed_take(s, handler, user_data,
//! &n)` hands each recorded entry and return to `handler` as text, as the
//! command line's `trace` shows them (`42`, `2.5`, `"hello"` for every
//! parameter in order; `s="hello"`, `i=42` for the expressions given).
//!
//! The library's [`hotprobe::typed_capture::TypedCapture`] plans and
//! collects; values in registers come from the recorded events on any
//! mechanism, anything else (strings, fields) through a trap.

use crate::args::{handle_arg, put, session_arg, str_arg};
use crate::error::{guard, Fail};
use crate::{hotprobe_probe, hotprobe_session, hotprobe_target, HOTPROBE_ERR_INVALID, HOTPROBE_OK};
use hotprobe::typed_capture::TypedCaptureError;
use hotprobe::TargetId;
use std::ffi::{c_char, c_int, c_void, CString};

impl From<TypedCaptureError> for Fail {
    fn from(e: TypedCaptureError) -> Self {
        match e {
            TypedCaptureError::Engine(e) => e.into(),
            e => Fail {
                code: HOTPROBE_ERR_INVALID,
                msg: e.to_string(),
            },
        }
    }
}

/// One recorded call boundary of a typed capture (valid during the
/// handler's call only).
#[repr(C)]
#[derive(Debug)]
pub struct hotprobe_typed_event {
    /// The probe ([`hotprobe_record_typed`]'s id).
    pub probe: hotprobe_probe,
    /// The thread.
    pub tid: u32,
    /// `false`: the entry (the parameters); `true`: the return.
    pub is_return: bool,
    /// How many values `values` holds (0 for a return the program
    /// unwound past, and for a function without DWARF).
    pub nvalues: usize,
    /// The values as NUL-terminated text: every parameter's in order (or
    /// `EXPR=value` for each expression the spec gave) at an entry, the
    /// return value at a return.
    pub values: *const *const c_char,
}

/// Called by [`hotprobe_typed_take`] with each recorded event and the
/// caller's `user_data`. It must not unwind.
pub type hotprobe_typed_handler =
    Option<unsafe extern "C" fn(ev: *const hotprobe_typed_event, user_data: *mut c_void)>;

/// Records each call of every function `spec` names with typed values:
/// `"work"` (every parameter and the return value) or `"work(i, s)"` (the
/// parameters named; `p->len` and `name:string` as on the command line).
/// Writes up to `cap` probe ids to `ids` and how many were placed to
/// `n_out`. Read the values with [`hotprobe_typed_take`] after (or
/// between) runs.
///
/// Refused with `HOTPROBE_ERR_INVALID` before anything is placed: an
/// argument expression that does not parse, a parameter name the function
/// does not have, names for a function without DWARF, a `%return` spec.
///
/// # Safety
/// `s` is a live session; `spec` a C string; `ids` null or valid for
/// `cap` writes; `n_out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_record_typed(
    s: *mut hotprobe_session,
    target: hotprobe_target,
    spec: *const c_char,
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
        let added = h
            .typed
            .borrow_mut()
            .place(session, TargetId(target as usize), spec)?;
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

/// Calls `handler` with each event the typed captures recorded since the
/// last call, in the order they were drained (per thread, the program's
/// order), and forgets them; writes how many to `n_out`.
///
/// # Safety
/// `s` is a live session; `handler` a function as
/// [`hotprobe_typed_handler`] says (or NULL: the events are dropped);
/// `n_out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_typed_take(
    s: *mut hotprobe_session,
    handler: hotprobe_typed_handler,
    user_data: *mut c_void,
    n_out: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let h = unsafe { handle_arg(s) }?;
        let events = h.typed.borrow_mut().take_events();
        for ev in &events {
            let Some(f) = handler else { break };
            // A value with a NUL in it (a string's bytes) shows it as a
            // space: C strings end there.
            let texts: Vec<CString> = ev
                .values
                .iter()
                .map(|v| CString::new(v.replace('\0', " ")).unwrap_or_default())
                .collect();
            let ptrs: Vec<*const c_char> = texts.iter().map(|c| c.as_ptr()).collect();
            let c = hotprobe_typed_event {
                probe: ev.probe.0,
                tid: ev.tid,
                is_return: ev.exit,
                nvalues: ptrs.len(),
                values: ptrs.as_ptr(),
            };
            // SAFETY: the caller's handler, given an event whose pointers
            // live until it returns, and the caller's own `user_data`.
            unsafe { f(&c, user_data) };
        }
        // SAFETY: per this function's contract.
        unsafe { put(n_out, events.len()) };
        Ok(HOTPROBE_OK)
    })
}
