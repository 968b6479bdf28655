//! Everything hotprobe prints goes through here: [`outln!`] (stdout) and
//! [`errln!`] (stderr) never panic. A reader that goes away (`hotprobe
//! list BIN | head`) is a quiet stop, not an error: later lines are
//! dropped, and hotprobe goes on with what it was doing (a session still
//! detaches from its target cleanly). SIGPIPE keeps Rust's default
//! (ignored), for that reason.

use std::fmt;
use std::io::{ErrorKind, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Set once a write to stdout met a closed pipe.
static CLOSED: AtomicBool = AtomicBool::new(false);
/// The first write error on stdout other than a closed pipe.
static FAILED: Mutex<Option<std::io::Error>> = Mutex::new(None);

/// One line on stdout; false when nothing more should be printed (the
/// reader went away, or writing failed: see [`write_error`]).
pub fn line(args: fmt::Arguments<'_>) -> bool {
    if CLOSED.load(Ordering::Relaxed) {
        return false;
    }
    let mut out = std::io::stdout().lock();
    let r = out
        .write_fmt(args)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    match r {
        Ok(()) => true,
        Err(e) => {
            CLOSED.store(true, Ordering::Relaxed);
            if e.kind() != ErrorKind::BrokenPipe {
                let mut f = FAILED.lock().unwrap_or_else(|p| p.into_inner());
                f.get_or_insert(e);
            }
            false
        }
    }
}

/// One line on stderr, whatever becomes of it.
pub fn err_line(args: fmt::Arguments<'_>) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_fmt(args).and_then(|()| err.write_all(b"\n"));
}

/// `println!` that does not panic: see [`line`]; evaluates to its bool.
macro_rules! outln {
    () => {
        $crate::out::line(format_args!(""))
    };
    ($($t:tt)*) => {
        $crate::out::line(format_args!($($t)*))
    };
}

/// `eprintln!` that does not panic on a closed stderr.
macro_rules! errln {
    ($($t:tt)*) => {
        $crate::out::err_line(format_args!($($t)*))
    };
}

pub(crate) use {errln, outln};

/// The write error (not a closed pipe) that stopped the output, if any.
pub fn write_error() -> Option<std::io::Error> {
    FAILED.lock().unwrap_or_else(|p| p.into_inner()).take()
}

/// True when the error (or one of its causes) is a write into a closed
/// pipe and stdout is indeed a closed pipe: the output is no longer
/// wanted, which is not a failure.
pub fn is_closed_stdout(e: &anyhow::Error) -> bool {
    let epipe = e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == ErrorKind::BrokenPipe)
    });
    epipe && stdout_closed()
}

/// Whether stdout is a pipe whose reader is gone (or a write saw it so).
pub fn stdout_closed() -> bool {
    if CLOSED.load(Ordering::Relaxed) {
        return true;
    }
    let mut p = libc::pollfd {
        fd: 1,
        events: libc::POLLOUT,
        revents: 0,
    };
    // SAFETY: one valid pollfd, no wait.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    n == 1 && p.revents & libc::POLLERR != 0
}
