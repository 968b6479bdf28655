//! Leaving a process we attached to as found (issue 23): at detach, once
//! every written byte is back, the agent we injected takes back what it
//! set up (`hotprobe_agent_release`: hooked return addresses, its
//! `SIGTRAP` handler, hang-up pipe and thread-exit key, its shared
//! memories, shadow stacks and near page), the library is `dlclose`d, and
//! our stub and trampoline pages are unmapped, all by remote calls with
//! every thread stopped. Nothing goes while a thread can still run in it
//! or return into it: a thread whose PC stays in hotprobe's code, or one
//! inside the agent or a stub (a signal handler or a libc call of the
//! agent's on top of it), keeps everything mapped, and the reason is
//! reported ([`FastPath::take_left_behind`]). An agent preloaded at spawn
//! is not unloaded (the program started with it).

use std::time::Duration;

use hotprobe_process::remote_call::{remote_call, remote_syscall};
use hotprobe_process::ProcessTarget;
use hotprobe_target::Target;

use crate::FastPath;

/// What unloading an injected agent needs: addresses in the target.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Unload {
    /// `hotprobe_agent_release`.
    pub(crate) release: u64,
    /// libc's `dlclose` and the handle of our `dlopen` (none when the agent
    /// was there before us: it is released, and stays loaded, dormant).
    pub(crate) dlclose: Option<(u64, u64)>,
}

/// How long a remote call of the unload may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How many times the threads run on briefly to leave hotprobe's code.
const LEAVE_TRIES: usize = 50;

impl FastPath {
    /// What was left in the target at detach, and why (empty when nothing
    /// of hotprobe's stayed mapped, or the agent was preloaded).
    pub fn take_left_behind(&mut self) -> Vec<String> {
        std::mem::take(&mut self.left_behind)
    }

    /// Unloads the injected agent and unmaps our pages (see the module
    /// docs); the threads are stopped and left stopped. Never fails: what
    /// cannot go stays, with the reason in [`FastPath::take_left_behind`].
    pub(crate) fn unload_agent(&mut self, t: &mut ProcessTarget) {
        let Some(unload) = self.unload.take() else {
            return;
        };
        let pid = t.pid();
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
        let mut code: Vec<(u64, u64)> = hotprobe_process::parse_maps_lines(&maps)
            .into_iter()
            .filter(|m| m.exec && m.name.contains("libhotprobe_agent"))
            .map(|m| (m.start, m.end))
            .collect();
        code.extend(self.pools.iter().map(|p| (p.start, p.end)));
        let near = self
            .shm()
            .header()
            .near_page
            .load(std::sync::atomic::Ordering::Relaxed);
        if near != 0 {
            code.push((near, near + 4096));
        }
        if let Some((tid, rip)) = leave_code(t, &code) {
            self.left_behind.push(format!(
                "the agent and its pages stay mapped in pid {pid}: thread {tid} stays at {rip:#x} \
                 in hotprobe's code"
            ));
            return;
        }
        match remote_call(t, unload.release, &[], CALL_TIMEOUT) {
            Ok(r) if r as i32 == -RELEASE_BUSY => {
                self.left_behind.push(format!(
                    "the agent and its pages stay mapped in pid {pid}: a thread is inside the \
                     agent or a stub (a signal handler or a call on top of it)"
                ));
                return;
            }
            Ok(r) if r as i32 > 0 => self.left_behind.push(format!(
                "{} shared-memory mappings stay in pid {pid} (past the agent's table)",
                r as i32
            )),
            Ok(_) => {}
            Err(e) => {
                self.left_behind.push(format!(
                    "the agent stays in pid {pid}: its release failed: {e}"
                ));
                return;
            }
        }
        if let Some((dlclose, handle)) = unload.dlclose {
            match remote_call(t, dlclose, &[handle], CALL_TIMEOUT) {
                Ok(0) => {}
                Ok(r) => self.left_behind.push(format!(
                    "the agent stays loaded, dormant, in pid {pid}: dlclose returned {}",
                    r as i32
                )),
                Err(e) => self.left_behind.push(format!(
                    "the agent stays loaded, dormant, in pid {pid}: {e}"
                )),
            }
        }
        for p in std::mem::take(&mut self.pools) {
            let r = remote_syscall(t, libc::SYS_munmap as u64, &[p.start, p.end - p.start]);
            if !matches!(r, Ok(0)) {
                self.left_behind.push(format!(
                    "the stub pages {:#x}..{:#x} stay mapped in pid {pid}",
                    p.start, p.end
                ));
            }
        }
        self.page_cache = None;
    }
}

/// `hotprobe_agent_release`'s "busy" code (the agent's `RELEASE_BUSY`).
const RELEASE_BUSY: i32 = 1;

/// Runs the threads on briefly until none has its PC in `code` (address
/// ranges); the thread and PC still there after [`LEAVE_TRIES`], if any.
fn leave_code(t: &mut ProcessTarget, code: &[(u64, u64)]) -> Option<(u64, u64)> {
    let mut last = None;
    for _ in 0..LEAVE_TRIES {
        last = None;
        for th in t.threads() {
            let Ok(regs) = t.registers(th) else {
                continue;
            };
            if code.iter().any(|&(s, e)| regs.rip >= s && regs.rip < e) {
                last = Some((th.0, regs.rip));
                break;
            }
        }
        if last.is_none() {
            return None;
        }
        if t.resume_all().is_err() {
            return last;
        }
        std::thread::yield_now();
        if t.stop_all().is_err() {
            return last;
        }
    }
    last
}
