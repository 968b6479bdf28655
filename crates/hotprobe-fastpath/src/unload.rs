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
    /// of hotprobe's stayed mapped, or the agent was preloaded). Known
    /// once the target is detached: the unload runs last (see
    /// [`FastPath::unload_agent`]).
    pub fn take_left_behind(&mut self) -> Vec<String> {
        self.left_behind
            .lock()
            .map(|mut l| std::mem::take(&mut *l))
            .unwrap_or_default()
    }

    /// Has the injected agent unloaded and our pages unmapped (see the
    /// module docs) at the target's detach, after the engine's last
    /// breakpoint is out: a breakpoint may lie in the agent or in a
    /// library it brought (the engine hooks libgcc's unwinder for return
    /// probes), which the `dlclose` unmaps.
    pub(crate) fn unload_agent(&mut self, t: &mut ProcessTarget) {
        let Some(unload) = self.unload.take() else {
            return;
        };
        let pools: Vec<(u64, u64)> = std::mem::take(&mut self.pools)
            .into_iter()
            .map(|p| (p.start, p.end))
            .collect();
        self.page_cache = None;
        let near = self
            .shm()
            .header()
            .near_page
            .load(std::sync::atomic::Ordering::Relaxed);
        let left = self.left_behind.clone();
        t.on_detach(move |t| {
            let notes = unload_now(t, unload, &pools, near);
            if let Ok(mut l) = left.lock() {
                l.extend(notes);
            }
        });
    }
}

/// The unload itself (see the module docs), with every thread stopped;
/// what stays, and why.
fn unload_now(
    t: &mut ProcessTarget,
    unload: Unload,
    pools: &[(u64, u64)],
    near: u64,
) -> Vec<String> {
    let mut left = Vec::new();
    let pid = t.pid();
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let mut code: Vec<(u64, u64)> = hotprobe_process::parse_maps_lines(&maps)
        .into_iter()
        .filter(|m| m.exec && m.name.contains("libhotprobe_agent"))
        .map(|m| (m.start, m.end))
        .collect();
    code.extend(pools.iter().copied());
    if near != 0 {
        code.push((near, near + 4096));
    }
    if let Some((tid, rip)) = leave_code(t, &code) {
        left.push(format!(
            "the agent and its pages stay mapped in pid {pid}: thread {tid} stays at {rip:#x} \
             in hotprobe's code"
        ));
        return left;
    }
    match remote_call(t, unload.release, &[], CALL_TIMEOUT) {
        Ok(r) if r as i32 == -RELEASE_BUSY => {
            left.push(format!(
                "the agent and its pages stay mapped in pid {pid}: a thread is inside the \
                 agent or a stub (a signal handler or a call on top of it)"
            ));
            return left;
        }
        Ok(r) if r as i32 > 0 => left.push(format!(
            "{} shared-memory mappings stay in pid {pid} (past the agent's table)",
            r as i32
        )),
        Ok(_) => {}
        Err(e) => {
            left.push(format!(
                "the agent stays in pid {pid}: its release failed: {e}"
            ));
            return left;
        }
    }
    if let Some((dlclose, handle)) = unload.dlclose {
        match remote_call(t, dlclose, &[handle], CALL_TIMEOUT) {
            Ok(r) if r as i32 == 0 => {}
            Ok(r) => left.push(format!(
                "the agent stays loaded, dormant, in pid {pid}: dlclose returned {}",
                r as i32
            )),
            Err(e) => left.push(format!(
                "the agent stays loaded, dormant, in pid {pid}: {e}"
            )),
        }
    }
    for &(start, end) in pools {
        let r = remote_syscall(t, libc::SYS_munmap as u64, &[start, end - start]);
        if !matches!(r, Ok(0)) {
            left.push(format!(
                "the stub pages {start:#x}..{end:#x} stay mapped in pid {pid}"
            ));
        }
    }
    left
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
