//! Probes: handler probes and return probes whose handlers are C
//! functions, plain counts, and enabling, disabling and removing them.

use crate::args::{put, session_arg, str_arg};
use crate::error::{guard, invalid, Fail};
use crate::{
    hotprobe_ctx, hotprobe_handler, hotprobe_probe, hotprobe_session, hotprobe_target,
    HOTPROBE_ERR_REFUSED, HOTPROBE_OK,
};
use hotprobe::{Action, HitContext, Probe, ProbeId, RetProbe, TargetId};
use std::ffi::{c_char, c_int, c_void};

/// The caller's `user_data`, carried into a handler closure.
#[derive(Clone, Copy)]
struct UserData(*mut c_void);

/// A Rust handler calling the C function `f` with `user`.
fn c_handler(
    f: unsafe extern "C" fn(*mut hotprobe_ctx, *mut c_void),
    user: UserData,
) -> impl FnMut(&mut HitContext<'_>) + 'static {
    move |ctx| {
        let p = ctx as *mut HitContext<'_> as *mut hotprobe_ctx;
        // SAFETY: `f` is the caller's handler, given a context valid for
        // this call and the caller's own `user_data`.
        unsafe { f(p, user.0) }
    }
}

/// The single placement of a handler probe.
fn only_id(added: hotprobe::Added) -> Result<ProbeId, Fail> {
    added.placements.first().map(|p| p.id).ok_or_else(|| Fail {
        code: HOTPROBE_ERR_REFUSED,
        msg: "the spec was not placed".into(),
    })
}

/// Registers a probe on the instruction `spec` names
/// (`[module:]function[+off]`, `[module:]0xADDR`, `file.c:LINE`): `pre`
/// runs before the instruction, `post` after it (either may be NULL), each
/// called with `user_data`. A `pre` handler that moves `rip` redirects the
/// thread (the instruction and `post` are skipped).
///
/// # Safety
/// `s` is a live session; `spec` a C string; the handlers valid functions
/// for as long as the probe lives; `id_out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_register_probe(
    s: *mut hotprobe_session,
    target: hotprobe_target,
    spec: *const c_char,
    pre: hotprobe_handler,
    post: hotprobe_handler,
    user_data: *mut c_void,
    id_out: *mut hotprobe_probe,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let s = unsafe { session_arg(s) }?;
        // SAFETY: per this function's contract.
        let spec = unsafe { str_arg(spec, "spec") }?;
        let user = UserData(user_data);
        let mut p = Probe::new();
        if let Some(f) = pre {
            p = p.pre(c_handler(f, user));
        }
        if let Some(f) = post {
            p = p.post(c_handler(f, user));
        }
        let added = s.add(TargetId(target as usize), spec, Action::Handler(p))?;
        let id = only_id(added)?;
        // SAFETY: per this function's contract.
        unsafe { put(id_out, id.0) };
        Ok(HOTPROBE_OK)
    })
}

/// Registers a return probe on the function `spec` names (its entry):
/// `entry` runs when a call enters, `ret` when it returns (`rax` holds the
/// return value and may be changed); either may be NULL. At most
/// `maxactive` calls are followed at once; calls beyond are counted in
/// `nmissed`.
///
/// # Safety
/// As [`hotprobe_register_probe`].
#[no_mangle]
pub unsafe extern "C" fn hotprobe_register_retprobe(
    s: *mut hotprobe_session,
    target: hotprobe_target,
    spec: *const c_char,
    entry: hotprobe_handler,
    ret: hotprobe_handler,
    user_data: *mut c_void,
    maxactive: u32,
    id_out: *mut hotprobe_probe,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let s = unsafe { session_arg(s) }?;
        // SAFETY: per this function's contract.
        let spec = unsafe { str_arg(spec, "spec") }?;
        if maxactive == 0 {
            return Err(invalid("maxactive must be at least 1"));
        }
        let user = UserData(user_data);
        let mut rp = RetProbe::new(maxactive as usize);
        if let Some(f) = entry {
            rp = rp.entry(c_handler(f, user));
        }
        if let Some(f) = ret {
            rp = rp.ret(c_handler(f, user));
        }
        let added = s.add(TargetId(target as usize), spec, Action::Return(rp))?;
        let id = only_id(added)?;
        // SAFETY: per this function's contract.
        unsafe { put(id_out, id.0) };
        Ok(HOTPROBE_OK)
    })
}

/// Counts hits of every address `spec` names (a pattern names every
/// matching function; `%return` counts returns) on the cheapest mechanism
/// that fits. Writes up to `cap` probe ids to `ids` and how many were
/// placed to `n_out` (matches that could not be probed are left out).
///
/// # Safety
/// `s` is a live session; `spec` a C string; `ids` null or valid for `cap`
/// writes; `n_out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_count(
    s: *mut hotprobe_session,
    target: hotprobe_target,
    spec: *const c_char,
    ids: *mut hotprobe_probe,
    cap: usize,
    n_out: *mut usize,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let s = unsafe { session_arg(s) }?;
        // SAFETY: per this function's contract.
        let spec = unsafe { str_arg(spec, "spec") }?;
        let added = s.add(TargetId(target as usize), spec, Action::Count)?;
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

/// Enables (`enabled` true) or disables a probe: a disabled probe's
/// handlers do not run and its hits are not counted.
///
/// # Safety
/// `s` is a live session.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_set_enabled(
    s: *mut hotprobe_session,
    probe: hotprobe_probe,
    enabled: bool,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let s = unsafe { session_arg(s) }?;
        s.set_enabled(ProbeId(probe), enabled)?;
        Ok(HOTPROBE_OK)
    })
}

/// Enables a probe ([`hotprobe_set_enabled`] with true).
///
/// # Safety
/// `s` is a live session.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_enable(s: *mut hotprobe_session, probe: hotprobe_probe) -> c_int {
    // SAFETY: same contract.
    unsafe { hotprobe_set_enabled(s, probe, true) }
}

/// Disables a probe ([`hotprobe_set_enabled`] with false).
///
/// # Safety
/// `s` is a live session.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_disable(
    s: *mut hotprobe_session,
    probe: hotprobe_probe,
) -> c_int {
    // SAFETY: same contract.
    unsafe { hotprobe_set_enabled(s, probe, false) }
}

/// Removes a probe (its original code is restored).
///
/// # Safety
/// `s` is a live session.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_unregister(
    s: *mut hotprobe_session,
    probe: hotprobe_probe,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let s = unsafe { session_arg(s) }?;
        s.remove_probe(ProbeId(probe))?;
        Ok(HOTPROBE_OK)
    })
}
