//! Processes that start later (`--exe PATH`, `--comm NAME`): the session
//! takes every process that executes the program (or whose command name
//! is NAME), and those already running it, as targets of their own, and
//! places its `Count`/`Record` specs in each (see `exec.rs`: each is an
//! [`ExecImage`]). A new process is held before its first instruction: a
//! fanotify permission event holds its `execve` in the kernel while it is
//! seized, so that its exec ends in a ptrace stop
//! ([`hotprobe_os::exec_gate`]). For a command name the gate holds every
//! exec and takes those whose program's file name is NAME (cut to the
//! kernel's 15 characters); the command name is checked again at the exec
//! stop. Needs root. hotprobe's own processes are never taken.

use super::*;
use hotprobe_os::exec_gate::{ExecGate, HeldExec};

/// Which processes [`Session::take_new_processes`] takes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcessMatch {
    /// Those running this program (a path; compared after resolving
    /// symbolic links).
    Exe(PathBuf),
    /// Those whose command name (the kernel's `comm`, 15 characters at
    /// most) is this one, exactly.
    Comm(String),
}

/// The gate and what it takes.
pub(super) struct NewProcesses {
    gate: ExecGate,
    what: ProcessMatch,
    /// Seized and let go on: their exec stops are still to come (the
    /// gate keeps serving meanwhile: the exec opens the program's loader,
    /// another held open on a mount).
    awaiting: Vec<i32>,
}

/// The kernel's command name for a program file name: its first 15 bytes.
fn comm_for(file_name: &str) -> &str {
    let mut end = file_name.len().min(15);
    while !file_name.is_char_boundary(end) {
        end -= 1;
    }
    &file_name[..end]
}

impl ProcessMatch {
    /// Whether a running process `pid` matches.
    fn matches_running(&self, pid: i32) -> bool {
        match self {
            ProcessMatch::Exe(p) => {
                std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| &e == p)
            }
            ProcessMatch::Comm(c) => exec::comm_of(pid) == *c,
        }
    }

    /// Whether an exec of `program` may make a match (checked again at
    /// the exec stop).
    fn may_match(&self, program: &Path) -> bool {
        match self {
            ProcessMatch::Exe(p) => program == p,
            ProcessMatch::Comm(c) => program
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| comm_for(n) == c),
        }
    }
}

/// Whether `pid` is hotprobe's own process or one of its children.
fn ours(pid: i32) -> bool {
    let me = std::process::id() as i32;
    if pid == me {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            let after = &s[s.rfind(')')? + 2..];
            after.split(' ').nth(1)?.parse::<i32>().ok()
        })
        .is_some_and(|ppid| ppid == me)
}

impl Session {
    /// From now on, takes every process that starts running what `what`
    /// names (held at its exec, before its first instruction) as a target
    /// of its own, with the `Count`/`Record` specs given by
    /// [`Session::add_for_new_processes`]; and attaches at once to the
    /// processes already running it (stopped until [`Session::start`]).
    /// Returns their pids. [`Session::run_until`] then runs until
    /// interrupted, not when every target is gone. Needs root (fanotify).
    pub fn take_new_processes(&mut self, what: ProcessMatch) -> Result<Vec<i32>, EngineError> {
        let gate = match &what {
            ProcessMatch::Exe(p) => ExecGate::for_program(p),
            ProcessMatch::Comm(_) => ExecGate::for_all_mounts(),
        }
        .map_err(|e| EngineError::Io {
            what: "hold new processes at their exec (fanotify, which needs root)".into(),
            source: e.source,
        })?;
        let mut running = Vec::new();
        let mut pids: Vec<i32> = std::fs::read_dir("/proc")
            .map_err(|e| EngineError::Io {
                what: "list the processes in /proc".into(),
                source: e,
            })?
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        pids.sort_unstable();
        for pid in pids {
            if ours(pid) || !what.matches_running(pid) {
                continue;
            }
            match self.attach(pid) {
                Ok(t) => {
                    let i = t.0;
                    self.slots[i].hold_at_exec = true;
                    self.place_in_new_image(i);
                    running.push(pid);
                }
                Err(e) => {
                    if let Some(s) = self.slots.first_mut() {
                        s.notice(format!("cannot attach to pid {pid}: {e}"));
                    }
                }
            }
        }
        self.new_processes = Some(NewProcesses {
            gate,
            what,
            awaiting: Vec::new(),
        });
        Ok(running)
    }

    /// A `Count` (`record` false) or `Record` spec for the processes
    /// [`Session::take_new_processes`] takes: resolved in each. Only its
    /// syntax is checked now.
    pub fn add_for_new_processes(&mut self, spec: &str, record: bool) -> Result<(), EngineError> {
        let _: ProbeSpec = spec.parse()?;
        if !self.exec_specs.iter().any(|s| s.spec == spec) {
            self.exec_specs.push(exec::ExecSpec {
                spec: spec.to_string(),
                record,
                capture: self.exec_capture.clone(),
            });
        }
        if record {
            self.recording_new = true;
        }
        Ok(())
    }

    /// Whether the session waits for new processes.
    pub fn takes_new_processes(&self) -> bool {
        self.new_processes.is_some()
    }

    /// Answers the execs the gate holds (waiting up to `timeout` for one):
    /// each that may match is seized first and taken at its exec stop.
    pub(super) fn serve_gate(&mut self, timeout: Duration) {
        let Some(np) = &self.new_processes else {
            return;
        };
        let held = match np.gate.poll(timeout) {
            Ok(h) => h,
            Err(e) => {
                self.gate_notice(format!("the exec gate failed: {e}"));
                return;
            }
        };
        for h in held {
            self.serve_held(h);
        }
        self.take_awaiting();
    }

    fn gate_notice(&mut self, n: String) {
        self.gate_notices.push(n);
    }

    fn serve_held(&mut self, h: HeldExec) {
        let Some(np) = &self.new_processes else {
            return;
        };
        let pid = h.pid;
        let take = np.what.may_match(&h.program) && !ours(pid);
        let seized = take && hotprobe_process::ProcessTarget::seize_before_exec(pid).is_ok();
        if let Err(e) = np.gate.allow(h) {
            self.gate_notice(format!("pid {pid}: cannot let its exec go on: {e}"));
        }
        if seized {
            if let Some(np) = &mut self.new_processes {
                np.awaiting.push(pid);
            }
        }
    }

    /// Takes the seized processes whose exec stop came.
    fn take_awaiting(&mut self) {
        let awaiting = match &mut self.new_processes {
            Some(np) => std::mem::take(&mut np.awaiting),
            None => return,
        };
        for pid in awaiting {
            match hotprobe_process::ProcessTarget::take_at_exec(pid, &self.strays, Duration::ZERO) {
                Ok(Some(t)) => self.take_at_exec(pid, t),
                Ok(None) => {
                    if let Some(np) = &mut self.new_processes {
                        np.awaiting.push(pid);
                    }
                }
                Err(e) => self.gate_notice(format!("pid {pid}: not taken at its exec: {e}")),
            }
        }
    }

    fn take_at_exec(&mut self, pid: i32, target: hotprobe_process::ProcessTarget) {
        let wanted = match &self.new_processes {
            Some(NewProcesses {
                what: ProcessMatch::Comm(c),
                ..
            }) => Some(c.clone()),
            _ => None,
        };
        let mut target = target;
        if wanted.is_some_and(|c| exec::comm_of(pid) != c) {
            // Its file name matched, its command name does not (a link's
            // name was run): let go untouched.
            let _ = target.detach();
            return;
        }
        let t = self.push_slot(
            target.into(),
            None,
            Some(pid),
            false,
            AgentState::Off("a process taken at its exec: probes use traps".into()),
        );
        let i = t.0;
        self.slots[i].recording = self.recording_new;
        self.slots[i].hold_at_exec = true;
        self.slots[i].engine.started = true;
        self.follow_exec(i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_name_is_the_program_file_name_cut_to_15_bytes() {
        assert_eq!(comm_for("leafn"), "leafn");
        assert_eq!(comm_for("a-very-long-program-name"), "a-very-long-pro");
        // Not cut inside a character.
        assert_eq!(comm_for("ééééééééé"), "ééééééé");
        let m = ProcessMatch::Comm("a-very-long-pro".into());
        assert!(m.may_match(Path::new("/usr/bin/a-very-long-program-name")));
        assert!(!m.may_match(Path::new("/usr/bin/a-very-long-pr")));
        let m = ProcessMatch::Exe(PathBuf::from("/tmp/x/leafn"));
        assert!(m.may_match(Path::new("/tmp/x/leafn")));
        assert!(!m.may_match(Path::new("/tmp/y/leafn")));
    }
}
