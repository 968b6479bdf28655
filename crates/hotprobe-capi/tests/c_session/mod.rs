//! The C API tests' own helpers (not the Python tests': they link no C
//! library): the library's last error, and a session opened and a program
//! spawned into it.
#![allow(dead_code)]

use hotprobe_c::*;
use std::ffi::{CStr, CString};
use std::os::fd::AsRawFd;
use std::ptr::null;

/// The library's last error message.
pub fn last_error() -> String {
    // SAFETY: a NUL-terminated string owned by the library.
    unsafe { CStr::from_ptr(hotprobe_last_error()) }
        .to_string_lossy()
        .into_owned()
}

/// Opens a session with `mechanism` and spawns `prog` with its output to
/// `out`: (session, target).
pub fn open_and_spawn(
    mechanism: u32,
    prog: &std::path::Path,
    out: &std::fs::File,
) -> (*mut hotprobe_session, hotprobe_target) {
    let mut cfg = hotprobe_config {
        mechanism: 0,
        maxactive: 0,
        follow_forks: false,
        force: false,
    };
    // SAFETY: `cfg` is writable.
    unsafe { hotprobe_config_default(&mut cfg) };
    cfg.mechanism = mechanism;
    // SAFETY: a valid config.
    let s = unsafe { hotprobe_open(&cfg) };
    assert!(!s.is_null(), "{}", last_error());
    let t = spawn_into(s, prog, &[], out);
    (s, t)
}

/// Spawns `prog` with `args` into session `s`, its output to `out`: the
/// target.
pub fn spawn_into(
    s: *mut hotprobe_session,
    prog: &std::path::Path,
    args: &[&str],
    out: &std::fs::File,
) -> hotprobe_target {
    let path = CString::new(prog.to_str().unwrap()).unwrap();
    let args: Vec<CString> = args.iter().map(|a| CString::new(*a).unwrap()).collect();
    let mut argv: Vec<*const std::ffi::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(null());
    let mut t = 0;
    // SAFETY: live session, C strings, NULL-terminated argv, writable out.
    let rc = unsafe {
        hotprobe_spawn_io(
            s,
            path.as_ptr(),
            argv.as_ptr(),
            -1,
            out.as_raw_fd(),
            -1,
            &mut t,
        )
    };
    assert_eq!(rc, HOTPROBE_OK, "{}", last_error());
    t
}
