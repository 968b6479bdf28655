//! Everything hotprobe prints goes through here: [`outln!`] (stdout) and
//! [`errln!`] (stderr) never panic. A reader that goes away (`hotprobe
//! list BIN | head`, quitting the pager) is a quiet stop, not an error:
//! later lines are dropped, and hotprobe goes on with what it was doing
//! (a session still detaches from its target cleanly). SIGPIPE keeps
//! Rust's default (ignored), for that reason.
//!
//! Colours: [`paint`] wraps text in an SGR sequence when colours are on
//! for stdout ([`init_colors`]); [`error_prefix`] is the same for stderr.

use crate::cli::ColorWhen;
use std::fmt;
use std::io::{ErrorKind, IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

/// Set once a write to stdout met a closed pipe.
static CLOSED: AtomicBool = AtomicBool::new(false);
/// The first write error on stdout other than a closed pipe.
static FAILED: Mutex<Option<std::io::Error>> = Mutex::new(None);
static COLOR_OUT: AtomicBool = AtomicBool::new(false);
static COLOR_ERR: AtomicBool = AtomicBool::new(false);

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

/// One line on stderr, whatever becomes of it: formatted first and
/// written at once (stderr is unbuffered: `write_fmt` would write each
/// piece apart, and a traced program writing to the same stderr could
/// land in the middle of the line).
pub fn err_line(args: fmt::Arguments<'_>) {
    let mut line = args.to_string();
    line.push('\n');
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
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

/// Decides once whether stdout and stderr get colours: `always`, `never`,
/// or with `auto` when the stream is a terminal, `NO_COLOR` is unset (or
/// empty) and `TERM` is not `dumb`. Call before stdout goes to a pager.
pub fn init_colors(when: ColorWhen) {
    let auto = || {
        std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
            && std::env::var_os("TERM").is_none_or(|t| t != "dumb")
    };
    let (out, err) = match when {
        ColorWhen::Always => (true, true),
        ColorWhen::Never => (false, false),
        ColorWhen::Auto => (
            auto() && std::io::stdout().is_terminal(),
            auto() && std::io::stderr().is_terminal(),
        ),
    };
    COLOR_OUT.store(out, Ordering::Relaxed);
    COLOR_ERR.store(err, Ordering::Relaxed);
}

/// Whether stdout has colours ([`init_colors`]).
pub fn colors_on() -> bool {
    COLOR_OUT.load(Ordering::Relaxed)
}

/// Bold: function names.
pub const NAME: &str = "1";
/// Yellow: durations of 1 ms and more.
pub const SLOW: &str = "33";
/// Red: durations of 1 s and more.
pub const SLOWER: &str = "31";

/// `text` in SGR `style` when stdout has colours, else as is.
pub fn paint(style: &str, text: &str) -> String {
    if COLOR_OUT.load(Ordering::Relaxed) {
        format!("\x1b[{style}m{text}\x1b[0m")
    } else {
        text.to_string()
    }
}

/// `hotprobe: error:`, in bold red when stderr has colours.
pub fn error_prefix() -> String {
    if COLOR_ERR.load(Ordering::Relaxed) {
        "\x1b[1;31mhotprobe: error:\x1b[0m".to_string()
    } else {
        "hotprobe: error:".to_string()
    }
}
