//! A session's life: its settings, open and close, and its targets
//! (spawn, attach, connect to a guest's GDB stub).

use crate::args::{handle_arg, put, session_arg, str_arg};
use crate::error::{guard, invalid, Fail};
use crate::{
    hotprobe_config, hotprobe_session, hotprobe_target, HOTPROBE_ERR_INVALID, HOTPROBE_ERR_SYMBOL,
    HOTPROBE_MECH_AUTO, HOTPROBE_MECH_JUMP, HOTPROBE_MECH_PATCH, HOTPROBE_MECH_TRAP, HOTPROBE_OK,
};
#[cfg(doc)]
use crate::{hotprobe_last_error, hotprobe_run};
use hotprobe::{MechanismChoice, Session, SessionConfig};
use std::cell::{Cell, RefCell, UnsafeCell};
use std::ffi::{c_char, c_int, CStr, OsString};
use std::os::unix::ffi::OsStringExt;
use std::path::Path;

/// Fills `out` with the default settings.
///
/// # Safety
/// `out` is null or valid for a write of `hotprobe_config`.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_config_default(out: *mut hotprobe_config) {
    let d = SessionConfig::default();
    let c = hotprobe_config {
        mechanism: HOTPROBE_MECH_AUTO,
        maxactive: d.maxactive.try_into().unwrap_or(u32::MAX),
        follow_forks: d.follow_forks,
        force: d.force,
    };
    // SAFETY: per this function's contract.
    unsafe { put(out, c) };
}

/// Opens a session with `config` (NULL: the defaults). Returns NULL on
/// error (see [`hotprobe_last_error`]). Close it with [`hotprobe_close`].
///
/// # Safety
/// `config` is null or points to a `hotprobe_config`.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_open(config: *const hotprobe_config) -> *mut hotprobe_session {
    let mut out: *mut hotprobe_session = std::ptr::null_mut();
    let rc = guard(|| {
        let mut c = SessionConfig::default();
        // SAFETY: per this function's contract.
        if let Some(cfg) = unsafe { config.as_ref() } {
            c.mechanism = match cfg.mechanism {
                HOTPROBE_MECH_AUTO => MechanismChoice::Auto,
                HOTPROBE_MECH_PATCH => MechanismChoice::Patch,
                HOTPROBE_MECH_JUMP => MechanismChoice::Jump,
                HOTPROBE_MECH_TRAP => MechanismChoice::Trap,
                m => return Err(invalid(format!("unknown mechanism {m}"))),
            };
            if cfg.maxactive == 0 {
                return Err(invalid("maxactive must be at least 1"));
            }
            c.maxactive = cfg.maxactive as usize;
            c.follow_forks = cfg.follow_forks;
            c.force = cfg.force;
        }
        out = Box::into_raw(Box::new(hotprobe_session {
            session: UnsafeCell::new(Session::with_config(c)),
            started: Cell::new(false),
            running: Cell::new(false),
            counts: RefCell::new(hotprobe::CountSink::new(false)),
            typed: RefCell::default(),
        }));
        Ok(HOTPROBE_OK)
    });
    if rc == HOTPROBE_OK {
        out
    } else {
        std::ptr::null_mut()
    }
}

/// Closes a session: targets still alive are detached (probes removed,
/// original code restored, the programs run on). NULL is ignored, and so
/// is a call from a handler (the session is running).
///
/// # Safety
/// `s` is null or a handle from [`hotprobe_open`] not closed yet; it is
/// invalid afterwards.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_close(s: *mut hotprobe_session) {
    if s.is_null() {
        return;
    }
    let _ = guard(|| {
        // SAFETY: per this function's contract; refused from a handler
        // (the message is left for `hotprobe_last_error`).
        unsafe { handle_arg(s) }?;
        // SAFETY: a handle from `hotprobe_open`, owned by the caller, given
        // back once, not running.
        let b = unsafe { Box::from_raw(s) };
        let _ = b.session.into_inner().detach();
        Ok(HOTPROBE_OK)
    });
}

/// Starts `path` with the arguments `argv` (NULL-terminated, without the
/// program name; NULL for none), stopped before its own code runs until
/// [`hotprobe_run`]. Its standard streams are the caller's.
///
/// # Safety
/// `s` is a live session; `path` a C string; `argv` null or a
/// NULL-terminated array of C strings; `target_out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_spawn(
    s: *mut hotprobe_session,
    path: *const c_char,
    argv: *const *const c_char,
    target_out: *mut hotprobe_target,
) -> c_int {
    // SAFETY: the same contract.
    unsafe { hotprobe_spawn_io(s, path, argv, -1, -1, -1, target_out) }
}

/// As [`hotprobe_spawn`], with the program's standard input, output and
/// error on these file descriptors (duplicated; -1: the caller's own).
///
/// # Safety
/// As [`hotprobe_spawn`]; the descriptors are open or -1.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_spawn_io(
    s: *mut hotprobe_session,
    path: *const c_char,
    argv: *const *const c_char,
    stdin_fd: c_int,
    stdout_fd: c_int,
    stderr_fd: c_int,
    target_out: *mut hotprobe_target,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let s = unsafe { session_arg(s) }?;
        if path.is_null() {
            return Err(invalid("path is NULL"));
        }
        // SAFETY: non-null, NUL-terminated per the contract.
        let p = unsafe { CStr::from_ptr(path) };
        let program = OsString::from_vec(p.to_bytes().to_vec());
        let mut args = Vec::new();
        if !argv.is_null() {
            for i in 0.. {
                // SAFETY: a NULL-terminated array per the contract: every
                // index up to the NULL is in bounds.
                let a = unsafe { *argv.add(i) };
                if a.is_null() {
                    break;
                }
                // SAFETY: a C string per the contract.
                let a = unsafe { CStr::from_ptr(a) };
                args.push(OsString::from_vec(a.to_bytes().to_vec()));
            }
        }
        let dup = |fd: c_int, what: &str| -> Result<Option<std::fs::File>, Fail> {
            if fd < 0 {
                return Ok(None);
            }
            // SAFETY: `fd` is an open descriptor of the caller's (per the
            // contract), borrowed only to duplicate it.
            let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
            let owned = b.try_clone_to_owned().map_err(|e| Fail {
                code: HOTPROBE_ERR_INVALID,
                msg: format!("{what} descriptor {fd}: {e}"),
            })?;
            Ok(Some(std::fs::File::from(owned)))
        };
        let opts = hotprobe::SpawnOptions {
            stdin: dup(stdin_fd, "stdin")?,
            stdout: dup(stdout_fd, "stdout")?,
            stderr: dup(stderr_fd, "stderr")?,
            ..Default::default()
        };
        let t = s.spawn_with(Path::new(&program), &args, &opts)?;
        // SAFETY: per this function's contract.
        unsafe { put(target_out, t.0 as hotprobe_target) };
        Ok(HOTPROBE_OK)
    })
}

/// Attaches to process `pid` (every thread), stopped until
/// [`hotprobe_run`].
///
/// # Safety
/// `s` is a live session; `target_out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_attach(
    s: *mut hotprobe_session,
    pid: c_int,
    target_out: *mut hotprobe_target,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let s = unsafe { session_arg(s) }?;
        if pid <= 0 {
            return Err(invalid(format!("bad pid {pid}")));
        }
        let t = s.attach(pid)?;
        // SAFETY: per this function's contract.
        unsafe { put(target_out, t.0 as hotprobe_target) };
        Ok(HOTPROBE_OK)
    })
}

/// Connects to a VM guest's GDB stub (`HOST:PORT` or `unix:PATH`) whose
/// kernel symbols are in `symbols` (`/proc/kallsyms` or `System.map` text,
/// a vmlinux, or the bzImage). The VM stays stopped until
/// [`hotprobe_run`]. Probes on it are GDB-stub breakpoints.
///
/// # Safety
/// `s` is a live session; `stub` and `symbols` C strings; `target_out`
/// null or writable.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_connect_guest(
    s: *mut hotprobe_session,
    stub: *const c_char,
    symbols: *const c_char,
    target_out: *mut hotprobe_target,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let s = unsafe { session_arg(s) }?;
        // SAFETY: per this function's contract.
        let stub = unsafe { str_arg(stub, "stub") }?;
        // SAFETY: per this function's contract.
        let symbols = unsafe { str_arg(symbols, "symbols") }?;
        let addr = match stub.strip_prefix("unix:") {
            Some(p) if !p.is_empty() => hotprobe_guest::StubAddr::Unix(p.into()),
            None if stub
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()) =>
            {
                hotprobe_guest::StubAddr::Tcp(stub.into())
            }
            _ => {
                return Err(invalid(format!(
                    "stub {stub}: expected HOST:PORT or unix:PATH"
                )))
            }
        };
        let (syms, text) = hotprobe_guest::load_symbols(Path::new(symbols)).map_err(|e| Fail {
            code: HOTPROBE_ERR_SYMBOL,
            msg: e.to_string(),
        })?;
        let mut config = hotprobe_guest::GuestConfig::new(addr);
        config.kernel_text = text;
        let (target, resolver) = hotprobe_guest::open_guest(config, syms)?;
        let t = s.add_target(Box::new(target), Some(Box::new(resolver)));
        s.engine(t)?.set_step_unsupported_in_place(true);
        // SAFETY: per this function's contract.
        unsafe { put(target_out, t.0 as hotprobe_target) };
        Ok(HOTPROBE_OK)
    })
}
