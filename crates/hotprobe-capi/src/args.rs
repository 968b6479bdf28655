//! The arguments of the C entry points: C strings, the session handle
//! (refused while it runs), out-pointers, the handler context.

use crate::error::{invalid, Fail};
#[cfg(doc)]
use crate::hotprobe_open;
use crate::{hotprobe_ctx, hotprobe_session};
use hotprobe::{HitContext, Session};
use std::ffi::{c_char, CStr};

/// A C string argument as UTF-8.
///
/// # Safety
/// `p` is null or points to a NUL-terminated string.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Result<&'a str, Fail> {
    if p.is_null() {
        return Err(invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-null and NUL-terminated per the caller's contract.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| invalid(format!("{what} is not UTF-8")))
}

/// The handle behind a pointer.
///
/// # Safety
/// `s` is null or a live handle from [`hotprobe_open`], used by one thread.
pub(crate) unsafe fn handle_arg<'a>(
    s: *mut hotprobe_session,
) -> Result<&'a hotprobe_session, Fail> {
    // SAFETY: per the caller's contract (null is checked); only shared
    // references to the handle are made (its state is in cells).
    let h = unsafe { s.as_ref() }.ok_or_else(|| invalid("session is NULL"))?;
    if h.running.get() {
        return Err(invalid(
            "the session is running: only hotprobe_ctx_* calls are allowed in a handler",
        ));
    }
    Ok(h)
}

/// The session behind a handle, refused while it runs.
///
/// # Safety
/// As [`handle_arg`].
pub(crate) unsafe fn session_arg<'a>(s: *mut hotprobe_session) -> Result<&'a mut Session, Fail> {
    // SAFETY: per the caller's contract.
    let h = unsafe { handle_arg(s) }?;
    // SAFETY: not running, so no other `&mut Session` is live (a run holds
    // the only long-lived one; every other entry point takes it for its
    // own call, on the handle's one thread).
    Ok(unsafe { &mut *h.session.get() })
}

/// Writes `v` through `out` when it is not null.
///
/// # Safety
/// `out` is null or valid for a write of `T`.
pub(crate) unsafe fn put<T>(out: *mut T, v: T) {
    if !out.is_null() {
        // SAFETY: non-null and valid per the caller's contract.
        unsafe { out.write(v) };
    }
}

/// The handler context behind a handle.
///
/// # Safety
/// `ctx` is null or the context a handler was called with, during that
/// call.
pub(crate) unsafe fn ctx_arg<'a>(
    ctx: *mut hotprobe_ctx,
) -> Result<&'a mut HitContext<'static>, Fail> {
    if ctx.is_null() {
        return Err(invalid("handler context is NULL"));
    }
    // SAFETY: the pointer is the `&mut HitContext` the trampoline passed to
    // the handler, alive for the duration of the call; the 'static lifetime
    // is never let out of the handler's call.
    Ok(unsafe { &mut *(ctx as *mut HitContext<'static>) })
}
