//! The ptrace layer of the process target: every ptrace, wait and
//! tgkill/kill call (and the opening of `/proc/PID/mem`) goes through
//! [`Sys`], a facade over an [`Os`]: [`RealOs`] makes the system calls
//! (`sys.rs`), a scripted fake (`ptrace/fake.rs`, for tests: this crate's
//! feature `fake`) answers them from
//! a script, so that the wait state machine runs without a kernel (as aya
//! routes its system calls through one function its tests override).
//!
//! [`Sys`] can log each call and its result, one line per call in the
//! format the fake replays (`cont 1234 0 = ok`, `waitpid -1 0x20000000 =
//! 1234 0x57f`): set `HOTPROBE_OS_LOG=FILE` (appended to), or call
//! [`Sys::set_log`]. Off by default.

use crate::sys::{self, SysError};
use std::fmt::{self, Write as _};
use std::fs::File;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// `siginfo_t` fields the target reads: the signal and its `si_code`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SigInfo {
    /// `si_signo`.
    pub signo: i32,
    /// `si_code` (`TRAP_HWBKPT` for a hardware watchpoint's trap).
    pub code: i32,
}

/// What a timed wait found: see [`Os::waitpid_timeout`].
pub type Waited = Result<Option<(i32, i32)>, SysError>;

/// The ptrace, wait and signal calls of the process target, each as in
/// `sys.rs` (same arguments, same results).
pub trait Os: fmt::Debug + Send + Sync {
    /// `PTRACE_SEIZE` with options.
    fn seize(&self, pid: i32, options: i32) -> Result<(), SysError>;
    /// `PTRACE_INTERRUPT`.
    fn interrupt(&self, pid: i32) -> Result<(), SysError>;
    /// `PTRACE_CONT` delivering `sig` (0 for none).
    fn cont(&self, pid: i32, sig: i32) -> Result<(), SysError>;
    /// `PTRACE_SINGLESTEP` delivering `sig` (0 for none).
    fn step(&self, pid: i32, sig: i32) -> Result<(), SysError>;
    /// `PTRACE_LISTEN`.
    fn listen(&self, pid: i32) -> Result<(), SysError>;
    /// `PTRACE_DETACH` delivering `sig` (0 for none).
    fn detach(&self, pid: i32, sig: i32) -> Result<(), SysError>;
    /// `PTRACE_GETEVENTMSG`.
    fn geteventmsg(&self, pid: i32) -> Result<u64, SysError>;
    /// `PTRACE_GETSIGINFO`.
    fn getsiginfo(&self, pid: i32) -> Result<SigInfo, SysError>;
    /// `PTRACE_GETREGS`.
    fn getregs(&self, pid: i32) -> Result<libc::user_regs_struct, SysError>;
    /// `PTRACE_SETREGS`.
    fn setregs(&self, pid: i32, regs: &libc::user_regs_struct) -> Result<(), SysError>;
    /// `PTRACE_GETFPREGS`: the low 64 bits of xmm0–xmm15.
    fn getxmm(&self, pid: i32) -> Result<[u64; 16], SysError>;
    /// `PTRACE_PEEKUSER` of debug register `n`.
    fn get_debugreg(&self, pid: i32, n: usize) -> Result<u64, SysError>;
    /// `PTRACE_POKEUSER` of debug register `n`.
    fn set_debugreg(&self, pid: i32, n: usize, value: u64) -> Result<(), SysError>;
    /// `waitpid(pid, __WALL | flags)`: `Ok(None)` when `WNOHANG` found nothing.
    fn waitpid(&self, pid: i32, flags: i32) -> Waited;
    /// `waitpid(pid, __WALL | flags)` blocking for about `d` at most:
    /// `Some(Ok(None))` when it ran out; `None` when it cannot block with
    /// a deadline (the caller polls with `WNOHANG` instead).
    fn waitpid_timeout(&self, pid: i32, flags: i32, d: Duration) -> Option<Waited>;
    /// `tgkill(tgid, tid, sig)`.
    fn tgkill(&self, tgid: i32, tid: i32, sig: i32) -> Result<(), SysError>;
    /// `kill(pid, sig)`.
    fn kill(&self, pid: i32, sig: i32) -> Result<(), SysError>;
    /// Open `/proc/PID/mem` for reading and writing.
    fn open_mem(&self, pid: i32) -> Result<File, SysError>;
    /// The state letter of task `tid` of process `pid` (`/proc/PID/task/
    /// TID/stat`: `R`, `S`, `t`, `Z`...); `None` when it is gone. A
    /// leader that called `pthread_exit` while other threads run on is
    /// `Z`: ptrace never reports it stopped.
    fn task_state(&self, pid: i32, tid: i32) -> Option<char>;
    /// `waitpid(-1, __WALL | WNOHANG | flags)` of a tracer draining every
    /// status that is ready before it handles any (so that the kernel's
    /// order, newest tracee first, cannot starve older threads): `Ok(None)`
    /// when nothing more is ready. The default makes the real call.
    fn waitpid_ready(&self, flags: i32) -> Waited {
        sys::waitpid(-1, flags | libc::WNOHANG)
    }
    /// `PTRACE_SYSCALL` delivering `sig` (0 for none). The default makes
    /// the real call (a scripted fake need not answer it).
    fn syscall_resume(&self, pid: i32, sig: i32) -> Result<(), SysError> {
        sys::syscall_resume(pid, sig)
    }
    /// `PTRACE_GETSIGMASK`. The default makes the real call.
    fn getsigmask(&self, pid: i32) -> Result<u64, SysError> {
        sys::getsigmask(pid)
    }
    /// `PTRACE_SETSIGMASK`. The default makes the real call.
    fn setsigmask(&self, pid: i32, mask: u64) -> Result<(), SysError> {
        sys::setsigmask(pid, mask)
    }
    /// `PTRACE_GETFPREGS`, the whole state. The default makes the real call.
    fn getfpregs(&self, pid: i32) -> Result<libc::user_fpregs_struct, SysError> {
        sys::getfpregs(pid)
    }
    /// `PTRACE_SETFPREGS`. The default makes the real call.
    fn setfpregs(&self, pid: i32, fp: &libc::user_fpregs_struct) -> Result<(), SysError> {
        sys::setfpregs(pid, fp)
    }
    /// `PTRACE_GETREGSET` of `NT_X86_XSTATE`. The default makes the real call.
    fn getxstate(&self, pid: i32) -> Result<Vec<u8>, SysError> {
        sys::getxstate(pid)
    }
    /// `PTRACE_SETREGSET` of `NT_X86_XSTATE`. The default makes the real call.
    fn setxstate(&self, pid: i32, state: &[u8]) -> Result<(), SysError> {
        sys::setxstate(pid, state)
    }
}

/// The real system calls (`sys.rs`); timed waits through the waiter thread
/// (`waiter.rs`).
#[derive(Debug, Default)]
pub struct RealOs;

impl Os for RealOs {
    fn seize(&self, pid: i32, options: i32) -> Result<(), SysError> {
        sys::seize(pid, options)
    }
    fn interrupt(&self, pid: i32) -> Result<(), SysError> {
        sys::interrupt(pid)
    }
    fn cont(&self, pid: i32, sig: i32) -> Result<(), SysError> {
        sys::cont(pid, sig)
    }
    fn step(&self, pid: i32, sig: i32) -> Result<(), SysError> {
        sys::step(pid, sig)
    }
    fn listen(&self, pid: i32) -> Result<(), SysError> {
        sys::listen(pid)
    }
    fn detach(&self, pid: i32, sig: i32) -> Result<(), SysError> {
        sys::detach(pid, sig)
    }
    fn geteventmsg(&self, pid: i32) -> Result<u64, SysError> {
        sys::geteventmsg(pid)
    }
    fn getsiginfo(&self, pid: i32) -> Result<SigInfo, SysError> {
        sys::getsiginfo(pid).map(|i| SigInfo {
            signo: i.si_signo,
            code: i.si_code,
        })
    }
    fn getregs(&self, pid: i32) -> Result<libc::user_regs_struct, SysError> {
        sys::getregs(pid)
    }
    fn setregs(&self, pid: i32, regs: &libc::user_regs_struct) -> Result<(), SysError> {
        sys::setregs(pid, regs)
    }
    fn getxmm(&self, pid: i32) -> Result<[u64; 16], SysError> {
        sys::getxmm(pid)
    }
    fn get_debugreg(&self, pid: i32, n: usize) -> Result<u64, SysError> {
        sys::get_debugreg(pid, n)
    }
    fn set_debugreg(&self, pid: i32, n: usize, value: u64) -> Result<(), SysError> {
        sys::set_debugreg(pid, n, value)
    }
    fn waitpid(&self, pid: i32, flags: i32) -> Waited {
        sys::waitpid(pid, flags)
    }
    fn waitpid_timeout(&self, pid: i32, flags: i32, d: Duration) -> Option<Waited> {
        crate::waiter::waitpid_for(pid, flags, d)
    }
    fn tgkill(&self, tgid: i32, tid: i32, sig: i32) -> Result<(), SysError> {
        sys::tgkill(tgid, tid, sig)
    }
    fn kill(&self, pid: i32, sig: i32) -> Result<(), SysError> {
        sys::kill(pid, sig)
    }
    fn open_mem(&self, pid: i32) -> Result<File, SysError> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .map_err(|e| SysError {
                call: "open(/proc/PID/mem)",
                pid,
                source: e,
            })
    }
    fn task_state(&self, pid: i32, tid: i32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/stat")).ok()?;
        // The field after the command name, which may hold parentheses.
        let (_, rest) = stat.rsplit_once(')')?;
        rest.trim_start().chars().next()
    }
}

/// Where [`Sys`] writes its call log.
type LogSink = Arc<Mutex<Box<dyn Write + Send>>>;

/// The facade the target calls: an [`Os`] and an optional call log.
/// Cloning shares both (a forked child's target logs to the same place).
#[derive(Clone)]
pub struct Sys {
    os: Arc<dyn Os>,
    log: Option<LogSink>,
}

impl fmt::Debug for Sys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sys")
            .field("os", &self.os)
            .field("logging", &self.log.is_some())
            .finish()
    }
}

/// The environment variable naming a file the call log is appended to.
pub const LOG_ENV: &str = "HOTPROBE_OS_LOG";

impl Sys {
    /// The real system calls, logging to `$HOTPROBE_OS_LOG` if it is set
    /// (and the file can be opened).
    pub fn real() -> Self {
        let log = std::env::var_os(LOG_ENV).and_then(|p| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .ok()
                .map(|f| Arc::new(Mutex::new(Box::new(f) as Box<dyn Write + Send>)))
        });
        Sys {
            os: Arc::new(RealOs),
            log,
        }
    }

    /// Calls answered by `os` (a fake, in tests), not logged.
    pub fn with_os(os: Arc<dyn Os>) -> Self {
        Sys { os, log: None }
    }

    /// Log every call and its result to `out` from now on (`None`: stop).
    pub fn set_log(&mut self, out: Option<Box<dyn Write + Send>>) {
        self.log = out.map(|w| Arc::new(Mutex::new(w)));
    }

    /// Writes one log line, if logging.
    fn note(&self, call: impl FnOnce() -> String, result: impl FnOnce() -> String) {
        if let Some(log) = &self.log {
            if let Ok(mut w) = log.lock() {
                let _ = writeln!(w, "{} = {}", call(), result());
                let _ = w.flush();
            }
        }
    }

    /// Writes a comment line (`# ...`) into the log, if logging.
    pub fn comment(&self, text: &str) {
        if let Some(log) = &self.log {
            if let Ok(mut w) = log.lock() {
                let _ = writeln!(w, "# {text}");
                let _ = w.flush();
            }
        }
    }

    fn unit(&self, call: impl FnOnce() -> String, r: Result<(), SysError>) -> Result<(), SysError> {
        self.note(call, || render_unit(&r));
        r
    }

    /// See [`Os::seize`].
    pub fn seize(&self, pid: i32, options: i32) -> Result<(), SysError> {
        self.unit(
            || format!("seize {pid} {options:#x}"),
            self.os.seize(pid, options),
        )
    }
    /// See [`Os::interrupt`].
    pub fn interrupt(&self, pid: i32) -> Result<(), SysError> {
        self.unit(|| format!("interrupt {pid}"), self.os.interrupt(pid))
    }
    /// See [`Os::cont`].
    pub fn cont(&self, pid: i32, sig: i32) -> Result<(), SysError> {
        self.unit(|| format!("cont {pid} {sig}"), self.os.cont(pid, sig))
    }
    /// See [`Os::step`].
    pub fn step(&self, pid: i32, sig: i32) -> Result<(), SysError> {
        self.unit(|| format!("step {pid} {sig}"), self.os.step(pid, sig))
    }
    /// See [`Os::syscall_resume`] (not logged, as the signal-mask calls:
    /// used only by remote system calls, which the fake does not script).
    pub fn syscall_resume(&self, pid: i32, sig: i32) -> Result<(), SysError> {
        self.os.syscall_resume(pid, sig)
    }
    /// See [`Os::getsigmask`] (not logged).
    pub fn getsigmask(&self, pid: i32) -> Result<u64, SysError> {
        self.os.getsigmask(pid)
    }
    /// See [`Os::getfpregs`] (not logged: for remote calls only).
    pub fn getfpregs(&self, pid: i32) -> Result<libc::user_fpregs_struct, SysError> {
        self.os.getfpregs(pid)
    }
    /// See [`Os::setfpregs`] (not logged).
    pub fn setfpregs(&self, pid: i32, fp: &libc::user_fpregs_struct) -> Result<(), SysError> {
        self.os.setfpregs(pid, fp)
    }
    /// See [`Os::getxstate`] (not logged: for remote calls only).
    pub fn getxstate(&self, pid: i32) -> Result<Vec<u8>, SysError> {
        self.os.getxstate(pid)
    }
    /// See [`Os::setxstate`] (not logged).
    pub fn setxstate(&self, pid: i32, state: &[u8]) -> Result<(), SysError> {
        self.os.setxstate(pid, state)
    }
    /// See [`Os::setsigmask`] (not logged).
    pub fn setsigmask(&self, pid: i32, mask: u64) -> Result<(), SysError> {
        self.os.setsigmask(pid, mask)
    }
    /// See [`Os::listen`].
    pub fn listen(&self, pid: i32) -> Result<(), SysError> {
        self.unit(|| format!("listen {pid}"), self.os.listen(pid))
    }
    /// See [`Os::detach`].
    pub fn detach(&self, pid: i32, sig: i32) -> Result<(), SysError> {
        self.unit(|| format!("detach {pid} {sig}"), self.os.detach(pid, sig))
    }
    /// See [`Os::geteventmsg`].
    pub fn geteventmsg(&self, pid: i32) -> Result<u64, SysError> {
        let r = self.os.geteventmsg(pid);
        self.note(
            || format!("geteventmsg {pid}"),
            || render_with(&r, |v| v.to_string()),
        );
        r
    }
    /// See [`Os::getsiginfo`].
    pub fn getsiginfo(&self, pid: i32) -> Result<SigInfo, SysError> {
        let r = self.os.getsiginfo(pid);
        self.note(
            || format!("getsiginfo {pid}"),
            || render_with(&r, |i| format!("{} {}", i.signo, i.code)),
        );
        r
    }
    /// See [`Os::getregs`].
    pub fn getregs(&self, pid: i32) -> Result<libc::user_regs_struct, SysError> {
        let r = self.os.getregs(pid);
        self.note(
            || format!("getregs {pid}"),
            || render_with(&r, |g| words(&regs_words(g))),
        );
        r
    }
    /// See [`Os::setregs`].
    pub fn setregs(&self, pid: i32, regs: &libc::user_regs_struct) -> Result<(), SysError> {
        self.unit(
            || format!("setregs {pid} {}", words(&regs_words(regs))),
            self.os.setregs(pid, regs),
        )
    }
    /// See [`Os::getxmm`].
    pub fn getxmm(&self, pid: i32) -> Result<[u64; 16], SysError> {
        let r = self.os.getxmm(pid);
        self.note(|| format!("getxmm {pid}"), || render_with(&r, |x| words(x)));
        r
    }
    /// See [`Os::get_debugreg`].
    pub fn get_debugreg(&self, pid: i32, n: usize) -> Result<u64, SysError> {
        let r = self.os.get_debugreg(pid, n);
        self.note(
            || format!("get_debugreg {pid} {n}"),
            || render_with(&r, |v| format!("{v:#x}")),
        );
        r
    }
    /// See [`Os::set_debugreg`].
    pub fn set_debugreg(&self, pid: i32, n: usize, value: u64) -> Result<(), SysError> {
        self.unit(
            || format!("set_debugreg {pid} {n} {value:#x}"),
            self.os.set_debugreg(pid, n, value),
        )
    }
    /// See [`Os::waitpid`].
    pub fn waitpid(&self, pid: i32, flags: i32) -> Waited {
        let r = self.os.waitpid(pid, flags);
        self.note(|| format!("waitpid {pid} {flags:#x}"), || render_waited(&r));
        r
    }
    /// [`Sys::waitpid`] for a wait that must see its status: retried when a
    /// signal interrupts it (EINTR: `--duration`'s or Ctrl-C's handler).
    /// The interruption is not lost: the thread's next main wait returns
    /// at once ([`crate::sys::take_deferred_interrupt`]), as it would have
    /// had the signal come then. Only the main wait, which takes EINTR as
    /// "time is up", calls [`Sys::waitpid`] blocking.
    pub fn waitpid_restart(&self, pid: i32, flags: i32) -> Waited {
        loop {
            match self.waitpid(pid, flags) {
                Err(e) if e.errno() == libc::EINTR => crate::sys::defer_interrupt(),
                r => return r,
            }
        }
    }
    /// See [`Os::waitpid_ready`] (logged as `ready FLAGS`).
    pub fn waitpid_ready(&self, flags: i32) -> Waited {
        let r = self.os.waitpid_ready(flags);
        self.note(|| format!("ready {flags:#x}"), || render_waited(&r));
        r
    }
    /// See [`Os::waitpid_timeout`] (the duration is not logged).
    pub fn waitpid_timeout(&self, pid: i32, flags: i32, d: Duration) -> Option<Waited> {
        let r = self.os.waitpid_timeout(pid, flags, d);
        self.note(
            || format!("waitpid_timeout {pid} {flags:#x}"),
            || match &r {
                None => "unavailable".into(),
                Some(w) => render_waited(w),
            },
        );
        r
    }
    /// See [`Os::tgkill`].
    pub fn tgkill(&self, tgid: i32, tid: i32, sig: i32) -> Result<(), SysError> {
        self.unit(
            || format!("tgkill {tgid} {tid} {sig}"),
            self.os.tgkill(tgid, tid, sig),
        )
    }
    /// See [`Os::kill`].
    pub fn kill(&self, pid: i32, sig: i32) -> Result<(), SysError> {
        self.unit(|| format!("kill {pid} {sig}"), self.os.kill(pid, sig))
    }
    /// See [`Os::task_state`].
    pub fn task_state(&self, pid: i32, tid: i32) -> Option<char> {
        let r = self.os.task_state(pid, tid);
        self.note(
            || format!("task_state {pid} {tid}"),
            || r.map_or_else(|| "gone".into(), String::from),
        );
        r
    }
    /// See [`Os::open_mem`].
    pub fn open_mem(&self, pid: i32) -> Result<File, SysError> {
        let r = self.os.open_mem(pid);
        self.note(
            || format!("open_mem {pid}"),
            || render_with(&r, |_| "ok".into()),
        );
        r
    }
}

fn render_unit(r: &Result<(), SysError>) -> String {
    render_with(r, |_| "ok".into())
}

fn render_with<T>(r: &Result<T, SysError>, ok: impl FnOnce(&T) -> String) -> String {
    match r {
        Ok(v) => ok(v),
        Err(e) => format!("err {}", e.errno()),
    }
}

fn render_waited(r: &Waited) -> String {
    render_with(r, |w| match w {
        None => "none".into(),
        Some((p, st)) => format!("{p} {st:#x}"),
    })
}

/// Hex words joined by commas.
fn words(v: &[u64]) -> String {
    let mut s = String::new();
    for (i, w) in v.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ = write!(s, "{w:x}");
    }
    s
}

/// The 27 words of `user_regs_struct`, in the kernel's order.
pub(crate) fn regs_words(r: &libc::user_regs_struct) -> [u64; 27] {
    [
        r.r15, r.r14, r.r13, r.r12, r.rbp, r.rbx, r.r11, r.r10, r.r9, r.r8, r.rax, r.rcx, r.rdx,
        r.rsi, r.rdi, r.orig_rax, r.rip, r.cs, r.eflags, r.rsp, r.ss, r.fs_base, r.gs_base, r.ds,
        r.es, r.fs, r.gs,
    ]
}

/// The inverse of [`regs_words`].
#[cfg(any(test, feature = "fake"))]
pub(crate) fn regs_from_words(w: &[u64; 27]) -> libc::user_regs_struct {
    libc::user_regs_struct {
        r15: w[0],
        r14: w[1],
        r13: w[2],
        r12: w[3],
        rbp: w[4],
        rbx: w[5],
        r11: w[6],
        r10: w[7],
        r9: w[8],
        r8: w[9],
        rax: w[10],
        rcx: w[11],
        rdx: w[12],
        rsi: w[13],
        rdi: w[14],
        orig_rax: w[15],
        rip: w[16],
        cs: w[17],
        eflags: w[18],
        rsp: w[19],
        ss: w[20],
        fs_base: w[21],
        gs_base: w[22],
        ds: w[23],
        es: w[24],
        fs: w[25],
        gs: w[26],
    }
}

#[cfg(any(test, feature = "fake"))]
pub mod fake;
