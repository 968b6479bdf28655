//! Failures at the C boundary: a code and a message per failing call, the
//! calling thread's last error ([`hotprobe_last_error`]), and [`guard`],
//! which turns a panic into `HOTPROBE_ERR_PANIC` so that none crosses the
//! boundary.

use crate::{
    HOTPROBE_ERR_INVALID, HOTPROBE_ERR_NOT_FOUND, HOTPROBE_ERR_OTHER, HOTPROBE_ERR_PANIC,
    HOTPROBE_ERR_REFUSED, HOTPROBE_ERR_SYMBOL, HOTPROBE_ERR_TARGET,
};
use hotprobe::EngineError;
use std::cell::RefCell;
use std::ffi::{c_char, c_int, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A failure: its code and message.
pub(crate) struct Fail {
    /// A negative `HOTPROBE_ERR_*` code.
    pub(crate) code: c_int,
    /// What failed, for [`hotprobe_last_error`].
    pub(crate) msg: String,
}

pub(crate) fn invalid(msg: impl Into<String>) -> Fail {
    Fail {
        code: HOTPROBE_ERR_INVALID,
        msg: msg.into(),
    }
}

impl From<EngineError> for Fail {
    fn from(e: EngineError) -> Self {
        let code = match &e {
            EngineError::Target(_) | EngineError::Process(_) | EngineError::Lost { .. } => {
                HOTPROBE_ERR_TARGET
            }
            EngineError::Symbol(_) => HOTPROBE_ERR_SYMBOL,
            EngineError::Refused { .. } | EngineError::RefusedSpec { .. } => HOTPROBE_ERR_REFUSED,
            EngineError::NoSuchProbe(_) | EngineError::NoSuchTarget(_) => HOTPROBE_ERR_NOT_FOUND,
            _ => HOTPROBE_ERR_OTHER,
        };
        Fail {
            code,
            msg: e.to_string(),
        }
    }
}

impl From<hotprobe::TargetError> for Fail {
    fn from(e: hotprobe::TargetError) -> Self {
        Fail {
            code: HOTPROBE_ERR_TARGET,
            msg: e.to_string(),
        }
    }
}

thread_local! {
    /// The calling thread's last error message.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// Runs `f` with panics caught: its value, or a negative code with the
/// message kept for [`hotprobe_last_error`].
pub(crate) fn guard(f: impl FnOnce() -> Result<c_int, Fail>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => {
            set_last_error(&e.msg);
            e.code
        }
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("hotprobe panicked: {what}"));
            HOTPROBE_ERR_PANIC
        }
    }
}

/// The last error of the calling thread, as a NUL-terminated message owned
/// by the library (valid until the thread's next failing call); an empty
/// string when there was none.
#[no_mangle]
pub extern "C" fn hotprobe_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}
