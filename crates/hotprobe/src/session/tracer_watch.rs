//! A tracer that comes to a process running untraced with in-process traps
//! in (issue 22): a debugger attached to it (gdb, strace, a tracer of the
//! program's own) takes each `SIGTRAP` of the agent's `int3`s first. A
//! tracer that stops there, or swallows the signal (gdb's default for
//! `SIGTRAP`), changes what the program computes: the agent never runs
//! the probed instruction's work. It must pass the signal on (gdb:
//! `handle SIGTRAP nostop noprint pass`), which lets the agent's handler run as
//! without it.
//!
//! While a process target runs released with sites of the in-process
//! trap, the run loop looks at its threads' `TracerPid` (at most every
//! [`TRACER_CHECK_EVERY`], at the loop's wake-ups: within a second when
//! nothing else wakes it) and says once per tracer that came, naming it
//! (pid and command name), and what it must do. The notice is urgent: it
//! goes to the hook of [`Session::set_urgent_notices`] at once when the
//! caller set one (the CLI prints it then), else with the other notices.

use super::*;

/// How often the threads' `TracerPid` are read, at most.
pub(super) const TRACER_CHECK_EVERY: Duration = Duration::from_millis(100);

/// A hook the notices that cannot wait go to.
pub(super) type UrgentHook = Box<dyn FnMut(&str)>;

/// What the watch keeps between two looks.
#[derive(Default)]
pub(super) struct TracerWatch {
    /// When the tracers were last looked at.
    last: Option<Instant>,
    /// The tracer each process had at the last look (0: none).
    seen: HashMap<i32, i32>,
    /// Where urgent notices go ([`Session::set_urgent_notices`]).
    pub(super) hook: Option<UrgentHook>,
}

impl Session {
    /// Hands the notices that cannot wait for the run's end to `hook` as
    /// they arise, instead of keeping them for [`Session::take_notices`]:
    /// a tracer that attached to a process running with in-process traps
    /// (see `tracer_watch.rs`), which must pass their `SIGTRAP`s on; a
    /// process that stays traced for a passing reason, seconds on (see
    /// `untraced.rs`).
    pub fn set_urgent_notices(&mut self, hook: impl FnMut(&str) + 'static) {
        self.tracer_watch.hook = Some(Box::new(hook));
    }

    /// Notice `n` of slot `i`, to the hook of
    /// [`Session::set_urgent_notices`] at once, else kept with the
    /// slot's notices.
    pub(super) fn urgent_notice(&mut self, i: usize, n: String) {
        match &mut self.tracer_watch.hook {
            Some(hook) => hook(&n),
            None => self.slots[i].notice(n),
        }
    }

    /// Looks for a new tracer of every live process target that runs
    /// untraced with in-process traps in (see the module docs).
    pub(super) fn watch_tracers(&mut self) {
        if self
            .tracer_watch
            .last
            .is_some_and(|t| t.elapsed() < TRACER_CHECK_EVERY)
        {
            return;
        }
        self.tracer_watch.last = Some(Instant::now());
        let mut notices = Vec::new();
        for i in 0..self.slots.len() {
            let Some(pid) = self.slots[i].pid else {
                continue;
            };
            if self.slots[i].engine.gone().is_some()
                || !self.is_untraced(TargetId(i))
                || !has_inproc_sites(&mut self.slots[i])
            {
                continue;
            }
            let tracer = foreign_tracer(pid);
            let before = self.tracer_watch.seen.insert(pid, tracer).unwrap_or(0);
            if tracer != 0 && tracer != before {
                notices.push((i, tracer_notice(pid, tracer)));
            }
        }
        for (i, n) in notices {
            self.urgent_notice(i, n);
        }
    }
}

/// Whether the slot's code ledger holds an in-process trap's `int3`.
fn has_inproc_sites(slot: &mut Slot) -> bool {
    slot.sync_ledger();
    slot.ledger
        .sites()
        .iter()
        .any(|s| s.owner == CodeOwner::InProcess)
}

/// The process (tgid) tracing some thread of `pid`, 0 for none.
fn foreign_tracer(pid: i32) -> i32 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
                .collect::<Vec<_>>()
        })
        .unwrap_or_else(|_| vec![pid]);
    tasks
        .into_iter()
        .find_map(|tid| {
            let st = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).ok()?;
            let t = status_field(&st, "TracerPid:")?;
            (t != 0).then_some(t)
        })
        // TracerPid names the tracing thread: its process.
        .map(|t| {
            std::fs::read_to_string(format!("/proc/{t}/status"))
                .ok()
                .and_then(|s| status_field(&s, "Tgid:"))
                .filter(|&g| g > 0)
                .unwrap_or(t)
        })
        .unwrap_or(0)
}

/// The number after `key` in a `/proc/…/status` text.
fn status_field(status: &str, key: &str) -> Option<i32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().parse().ok())
}

/// The notice for tracer `tracer` of process `pid`.
fn tracer_notice(pid: i32, tracer: i32) -> String {
    let comm = std::fs::read_to_string(format!("/proc/{tracer}/comm"))
        .map(|c| c.trim_end().to_string())
        .unwrap_or_else(|_| "?".into());
    format!(
        "pid {pid} is now traced by pid {tracer} ({comm}) while hotprobe's in-process traps \
         are in it: their SIGTRAPs reach that tracer first, and it must pass them on to the \
         program unstopped (gdb: `handle SIGTRAP nostop noprint pass`), or the program computes wrong \
         results or dies"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_fields_are_read_by_their_key() {
        let st = "Name:\tx\nTgid:\t42\nTracerPid:\t7\n";
        assert_eq!(status_field(st, "TracerPid:"), Some(7));
        assert_eq!(status_field(st, "Tgid:"), Some(42));
        assert_eq!(status_field(st, "Pid:"), None);
    }

    #[test]
    fn the_notice_names_the_tracer_and_what_it_must_do() {
        let me = std::process::id() as i32;
        let comm = std::fs::read_to_string("/proc/self/comm").unwrap();
        let n = tracer_notice(1, me);
        assert!(
            n.starts_with(&format!(
                "pid 1 is now traced by pid {me} ({}) ",
                comm.trim_end()
            )),
            "{n}"
        );
        assert!(
            n.contains("(gdb: `handle SIGTRAP nostop noprint pass`)"),
            "{n}"
        );
    }
}
