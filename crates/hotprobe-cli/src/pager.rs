//! The pager of long outputs (`list`, `replay`, `report`), as git does it:
//! when stdout is a terminal, `$PAGER` (default `less -FRX`; empty or
//! `cat`: none) is started with `sh -c`, and stdout (and stderr, when it
//! is the same terminal) become the pipe into it. hotprobe's own printing
//! is unchanged; quitting the pager early is a closed pipe (a quiet stop,
//! see `out`). [`Pager::finish`] closes the pipe and waits for the pager,
//! so that the shell gets the terminal back after it; a signal that kills
//! hotprobe meanwhile waits for it as well.

use std::io::{IsTerminal, Write};
use std::os::fd::IntoRawFd;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicI32, Ordering};

/// The running pager's pid (for the signal handler), or 0.
static PAGER_PID: AtomicI32 = AtomicI32::new(0);

/// A running pager fed by our stdout.
pub struct Pager {
    child: Child,
    /// Our stderr before it went to the pager, restored at the end.
    saved_err: Option<libc::c_int>,
}

/// The pager command: `$PAGER`, or `less -FRX` when unset; None when it
/// is empty or `cat`.
fn command() -> Option<String> {
    match std::env::var("PAGER") {
        Ok(p) if p.trim().is_empty() || p.trim() == "cat" => None,
        Ok(p) => Some(p),
        Err(_) => Some("less -FRX".to_string()),
    }
}

/// Starts the pager when stdout is a terminal and `$PAGER` names one;
/// None otherwise (or when it cannot be started: the output then goes to
/// the terminal directly).
pub fn start() -> Option<Pager> {
    if !std::io::stdout().is_terminal() {
        return None;
    }
    let cmd = command()?;
    let mut c = Command::new("sh");
    c.arg("-c").arg(&cmd).stdin(Stdio::piped());
    // `PAGER=less` quits at once on short outputs and keeps colours, as
    // with git; a LESS of the user's own wins.
    if std::env::var_os("LESS").is_none() {
        c.env("LESS", "FRX");
    }
    if std::env::var_os("LV").is_none() {
        c.env("LV", "-c");
    }
    let mut child = c.spawn().ok()?;
    let pipe = child.stdin.take()?.into_raw_fd();
    let mut saved_err = None;
    // SAFETY: plain descriptor operations on descriptors we own; nothing
    // else writes to stdout or stderr yet (single-threaded here).
    unsafe {
        libc::dup2(pipe, 1);
        if std::io::stderr().is_terminal() {
            let fd = libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 3);
            if fd >= 0 {
                saved_err = Some(fd);
                libc::dup2(pipe, 2);
            }
        }
        libc::close(pipe);
    }
    PAGER_PID.store(child.id() as i32, Ordering::SeqCst);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: the handler only calls async-signal-safe functions.
        unsafe {
            libc::signal(
                sig,
                on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
    Some(Pager { child, saved_err })
}

extern "C" fn on_signal(sig: libc::c_int) {
    // Only async-signal-safe calls: the pager keeps the terminal until it
    // exits, then the signal takes its default course.
    // SAFETY: close is async-signal-safe.
    unsafe {
        libc::close(1);
        libc::close(2);
    }
    let pid = PAGER_PID.load(Ordering::SeqCst);
    if pid > 0 {
        // A blocking waitpid: async-signal-safe (no allocation, no lock).
        let _ = hotprobe::os::sys::waitpid(pid, 0);
    }
    // SAFETY: signal and raise are async-signal-safe.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

impl Pager {
    /// Ends the output and waits for the pager to exit; stderr is the
    /// terminal again.
    pub fn finish(self) {}
}

impl Drop for Pager {
    fn drop(&mut self) {
        let _ = std::io::stdout().lock().flush();
        // SAFETY: plain syscalls on our own descriptors: stdout becomes
        // /dev/null (the pager sees the end of its input), stderr what it
        // was.
        unsafe {
            let null = libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            if null >= 0 {
                libc::dup2(null, 1);
                libc::close(null);
            } else {
                libc::close(1);
            }
            if let Some(fd) = self.saved_err.take() {
                libc::dup2(fd, 2);
                libc::close(fd);
            }
        }
        let _ = self.child.wait();
        PAGER_PID.store(0, Ordering::SeqCst);
    }
}
