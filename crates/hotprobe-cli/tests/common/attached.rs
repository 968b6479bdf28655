//! `hotprobe count -p PID PROBE…` (or another command's `-p`) running
//! beside a test: started, its first line taken, then interrupted as
//! Ctrl-C does.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use super::{line_reader, reader, text, HOTPROBE};

/// A `count -p` session past its first line.
pub struct CountAttached {
    hp: Child,
    err: Receiver<String>,
    out: std::thread::JoinHandle<Vec<u8>>,
    /// Its first line on stderr ("hotprobe: attached to pid …"; `record`'s
    /// "recording … into DIR" before it is skipped).
    pub first: String,
    /// `HOTPROBE_DEBUG_RELEASE`'s lines that came before `first`.
    release_lines: Vec<String>,
}

impl CountAttached {
    /// Starts `hotprobe count -p PID PROBES` and takes its first line
    /// within `limit` (hotprobe is killed and the test fails otherwise).
    pub fn start(pid: u32, probes: &[&str], limit: Duration) -> CountAttached {
        Self::start_as(&["count"], pid, probes, limit)
    }

    /// Starts `hotprobe COMMAND… -p PID PROBES` (`command`: `["count"]`,
    /// `["record", "-o", DIR]`…) and takes its first line within `limit`.
    pub fn start_as(command: &[&str], pid: u32, probes: &[&str], limit: Duration) -> CountAttached {
        Self::start_with(command, pid, probes, limit, false)
    }

    /// As [`CountAttached::start`], hotprobe saying each answer of its
    /// release tries as it happens (`HOTPROBE_DEBUG_RELEASE`): a test that
    /// waits for a release then says why it did not come. Those lines are
    /// kept out of `first`.
    pub fn start_explaining_release(pid: u32, probes: &[&str], limit: Duration) -> CountAttached {
        Self::start_with(&["count"], pid, probes, limit, true)
    }

    fn start_with(
        command: &[&str],
        pid: u32,
        probes: &[&str],
        limit: Duration,
        explain_release: bool,
    ) -> CountAttached {
        let mut cmd = Command::new(HOTPROBE);
        if explain_release {
            cmd.env("HOTPROBE_DEBUG_RELEASE", "1");
        }
        let mut hp = cmd
            .args(command)
            .args(["-p", &pid.to_string()])
            .args(probes)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = line_reader(hp.stderr.take().unwrap());
        let out = reader(hp.stdout.take().unwrap());
        let mut line = || {
            err.recv_timeout(limit).unwrap_or_else(|_| {
                let _ = hp.kill();
                panic!("{command:?} -p {pid}: no first line within {limit:?}");
            })
        };
        let mut first = line();
        let mut release_lines = Vec::new();
        // `record` says where it records before it attaches.
        while first.starts_with("hotprobe: recording ")
            || first.starts_with("hotprobe: release of slot ")
        {
            if first.starts_with("hotprobe: release of slot ") {
                release_lines.push(std::mem::take(&mut first));
            }
            first = line();
        }
        CountAttached {
            hp,
            err,
            out,
            first,
            release_lines,
        }
    }

    /// Its pid.
    pub fn id(&self) -> u32 {
        self.hp.id()
    }

    /// SIGKILL, and its end waited for.
    pub fn kill(mut self) {
        self.hp.kill().unwrap();
        self.hp.wait().unwrap();
    }

    /// The lines it wrote on stderr since the first, so far.
    pub fn said_so_far(&self) -> Vec<String> {
        let mut said = self.release_lines.clone();
        said.extend(self.err.try_iter());
        said
    }

    /// Waits until process `pid` runs untraced (`released`) or traced,
    /// within `limit`; the test fails otherwise, with what hotprobe said
    /// meanwhile (a notice such as "still traced" says why).
    pub fn until_released(&self, pid: u32, released: bool, limit: Duration) {
        let deadline = Instant::now() + limit;
        while released != super::untraced(pid) {
            if Instant::now() >= deadline {
                panic!(
                    "pid {pid}: released {released}? hotprobe said: {:?}; {}; {}",
                    self.said_so_far(),
                    hotprobe_testkit::threads_at(pid, "the program"),
                    hotprobe_testkit::threads_at(self.hp.id(), "hotprobe"),
                );
            }
            std::thread::yield_now();
        }
    }

    /// SIGINT (Ctrl-C), then its end: exit status, stdout, and stderr from
    /// its first line on.
    pub fn interrupt(self) -> (ExitStatus, String, String) {
        // SAFETY: a signal to the hotprobe this helper started.
        assert_eq!(unsafe { libc::kill(self.hp.id() as i32, libc::SIGINT) }, 0);
        self.end()
    }

    /// Its end, however it comes (the process's exit): exit status,
    /// stdout, and stderr from its first line on.
    pub fn end(mut self) -> (ExitStatus, String, String) {
        let status = self.hp.wait().unwrap();
        let stdout = text(&self.out.join().unwrap());
        let rest: Vec<String> = self.err.iter().collect();
        (
            status,
            stdout,
            format!("{}\n{}", self.first, rest.join("\n")),
        )
    }
}

/// The lines of `pid`'s maps that name hotprobe (its agent, its memfds):
/// none once a session detached and unloaded the agent.
pub fn hotprobe_mappings(pid: u32) -> Vec<String> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines()
        .filter(|l| l.contains("hotprobe"))
        .map(str::to_string)
        .collect()
}
