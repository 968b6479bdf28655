//! `hotprobe watch`: data breakpoints ([`hotprobe::Session::watch`]) on
//! variables or addresses of a process, a line per access, counts per
//! thread at the end.
//!
//! With `--exec`, a line before each execution of the instruction (time,
//! thread, instruction, `executed`).
//!
//! Each line: seconds since the start, the thread, the accessing
//! instruction (`function+0xoff [module]`; when it cannot be told, `after`
//! and the instruction following the access, where the CPU traps), and
//! `old -> new` (decimal). `(read)` marks an access that wrote nothing
//! (`--read`); `(memory)` a value read from memory at the trap rather
//! than taken from the storing instruction (another thread may have
//! written since).

use crate::out::{errln, outln};
use crate::session::Traced;
use crate::signals::{self, StopReason};
use anyhow::{Context, Result};
use hotprobe::{
    Action, ExitStatus, Probe, ProbeId, RunEnd, SessionConfig, ValueSource, WatchKind, WatchSpec,
};
use std::ffi::OsString;
use std::time::{Duration, Instant};

/// How long a spawned command gets to exit by itself after Ctrl-C before
/// hotprobe detaches from it (as `count` and `trace`).
const INTERRUPT_GRACE: Duration = Duration::from_secs(2);

/// What `watch` needs from the command line.
pub struct WatchOptions<'a> {
    /// `ADDR|SYMBOL[:LEN]` each.
    pub watches: &'a [String],
    /// `--read`: reads too.
    pub read: bool,
    /// `--exec`: executions of an instruction instead.
    pub exec: bool,
    /// Attach to this process.
    pub pid: Option<i32>,
    /// Or start this command.
    pub cmd: &'a [OsString],
    /// Stop after this long.
    pub duration: Option<Duration>,
}

/// Run `watch`; returns hotprobe's exit code (the command's).
pub fn run(o: &WatchOptions<'_>) -> Result<u8> {
    let kind = if o.exec {
        WatchKind::Execute
    } else if o.read {
        WatchKind::ReadWrite
    } else {
        WatchKind::Write
    };
    let specs = o
        .watches
        .iter()
        .map(|w| WatchSpec::parse(w, kind).map_err(crate::UsageError))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut t = Traced::open(SessionConfig::default(), o.pid, o.cmd)?;
    let start = Instant::now();
    let mut ids: Vec<(ProbeId, String)> = Vec::new();
    for spec in specs {
        let label = spec.to_string();
        let many = o.watches.len() > 1;
        let tag = label.clone();
        let probe = Probe::new().pre(move |ctx| {
            let Some(w) = ctx.watch().cloned() else {
                return;
            };
            let at = match w.insn {
                Some(a) => ctx.symbolize(a).unwrap_or_else(|| format!("{a:#x}")),
                None => format!(
                    "after {}",
                    ctx.symbolize(w.pc_after)
                        .unwrap_or_else(|| format!("{:#x}", w.pc_after))
                ),
            };
            let mut notes = String::new();
            if w.write == Some(false) {
                notes.push_str(" (read)");
            }
            if w.source == ValueSource::Memory {
                notes.push_str(" (memory)");
            }
            let which = if many {
                format!("{tag}  ")
            } else {
                String::new()
            };
            if w.kind == WatchKind::Execute {
                outln!(
                    "{:12.6}  {:>7}  {which}{at}  executed",
                    start.elapsed().as_secs_f64(),
                    w.thread
                );
                return;
            }
            outln!(
                "{:12.6}  {:>7}  {which}{at}  {} -> {}{notes}",
                start.elapsed().as_secs_f64(),
                w.thread,
                w.old,
                w.new
            );
        });
        match t.session.watch(t.target, spec, Action::Handler(probe)) {
            Ok(id) => ids.push((id, label)),
            Err(e) => {
                t.abandon();
                return Err(e).context("cannot watch");
            }
        }
    }
    t.session.start()?;
    let verb = if t.spawned { "started" } else { "attached to" };
    errln!(
        "hotprobe: {verb} pid {}: watching {} ({})",
        t.pid,
        ids.iter()
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        if o.exec {
            "executions"
        } else if o.read {
            "reads and writes"
        } else {
            "writes"
        }
    );
    if let Some(d) = o.duration {
        signals::stop_after(d);
    }
    let ran = run_loop(&mut t);
    for (id, label) in &ids {
        let Some(st) = t.session.watch_stats(*id) else {
            continue;
        };
        outln!("");
        outln!("{label}: {} accesses", st.hits);
        outln!("{:>7}  {:>8}", "TID", "ACCESSES");
        for (tid, n) in &st.by_thread {
            outln!("{:>7}  {:>8}", tid, n);
        }
    }
    ran?;
    Ok(t.exit_code())
}

/// The event loop until the target exits, Ctrl-C or `--duration`; then
/// the end of the run (detach, which clears every thread's debug
/// registers).
fn run_loop(t: &mut Traced) -> Result<()> {
    let end = match t.session.run_until(&signals::STOP) {
        Ok(end) => end,
        Err(e) => {
            let _ = t.session.finish(Duration::ZERO, None);
            t.print_notices();
            return Err(e).context("the event loop failed; detached");
        }
    };
    if end != RunEnd::AllExited {
        let reason = signals::stop_reason();
        let grace = match reason {
            Some(StopReason::Signal(libc::SIGINT)) if t.spawned => INTERRUPT_GRACE,
            _ => Duration::ZERO,
        };
        let finished = t.session.finish(grace, None);
        if let Some(ExitStatus::Disconnected(_)) | None = t.status() {
            errln!(
                "hotprobe: detached from pid {}, which runs on without watchpoints",
                t.pid
            );
        }
        t.print_notices();
        finished.with_context(|| format!("cannot detach from pid {}", t.pid))?;
    }
    t.print_notices();
    Ok(())
}
