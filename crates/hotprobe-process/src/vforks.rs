//! vfork children and the agent's counts (issue 22). A vfork child runs in
//! its parent's memory on the forking thread's thread pointer, so where the
//! agent is loaded its hits count into the parent thread's slot unless the
//! agent knows a child runs. Its interposers (`vfork`, `clone`,
//! `syscall()`, `posix_spawn`) see the calls a preloaded agent binds; the
//! tracer sees every vfork (`PTRACE_EVENT_VFORK`, then
//! `PTRACE_EVENT_VFORK_DONE` in the parent when the child executed or
//! exited). So at the child's first stop, before it runs, the target calls
//! the agent's `hotprobe_agent_vfork_child` in the child (a remote call:
//! it arms the parent thread's entry as the interposers do, so the
//! child's first hit claims a slot of its own), and at the parent's
//! `VFORK_DONE` stop, before the parent runs on, `hotprobe_agent_vfork_done`
//! in the parent (its state back). This covers the children no
//! interposer sees: `system`, `popen`, a `syscall` instruction of the
//! program's own, an injected agent. The parent's registers, the vector
//! ones included, are as they were, but for the vfork's result, which the
//! kernel writes after the stop (set again: the child's pid).

use std::time::Duration;

use crate::ProcessTarget;

/// The agent's two functions, if the process has the agent mapped.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AgentVforkFns {
    child: u64,
    done: u64,
}

/// How long a remote call into the agent may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

impl ProcessTarget {
    /// The agent's vfork functions (looked up once the agent is mapped;
    /// forgotten at exec).
    fn agent_vfork_fns(&mut self) -> Option<AgentVforkFns> {
        if let Some(f) = self.agent_vfork {
            return Some(f);
        }
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.live_task())).ok()?;
        if !maps.contains("hotprobe_agent") {
            return None;
        }
        let syms = hotprobe_symbols::ProcessSymbols::for_pid(self.pid as u32).ok()?;
        let found = syms
            .modules()
            .iter()
            .filter(|m| m.name.contains("hotprobe_agent"))
            .find_map(|m| {
                let f = |n: &str| m.module.find(n).map(|s| m.runtime(s.addr).0);
                Some(AgentVforkFns {
                    child: f("hotprobe_agent_vfork_child")?,
                    done: f("hotprobe_agent_vfork_done")?,
                })
            })?;
        self.agent_vfork = Some(found);
        Some(found)
    }

    /// Thread `parent` made vfork child `child`, stopped at its first stop
    /// (in the target's threads): the agent is told, in the child.
    pub(crate) fn vfork_started(&mut self, parent: i32, child: i32) {
        let Some(f) = self.agent_vfork_fns() else {
            return;
        };
        let r = crate::remote_call::remote_call_on(
            self,
            child,
            f.child,
            &[self.pid as u64, parent as u64],
            CALL_TIMEOUT,
        );
        if matches!(r, Ok(1 | 2)) {
            self.vfork_armed.push((parent, child));
        }
    }

    /// Thread `parent`, stopped at its `VFORK_DONE`, whose child `child`
    /// executed or exited: the agent gives the parent its state back, in
    /// the parent, and the vfork's result (the child's pid) is kept.
    pub(crate) fn vfork_finished(&mut self, parent: i32, child: i32) {
        let Some(i) = self.vfork_armed.iter().position(|a| *a == (parent, child)) else {
            return;
        };
        self.vfork_armed.swap_remove(i);
        let Some(f) = self.agent_vfork else {
            return;
        };
        let Ok(before) = self.sys.getregs(parent) else {
            return;
        };
        let _ = crate::remote_call::remote_call_on(self, parent, f.done, &[], CALL_TIMEOUT);
        // Stopped inside the system call, before its result was written:
        // the kernel would have returned the child's pid.
        let mut regs = before;
        regs.rax = child as u64;
        regs.orig_rax = u64::MAX;
        let _ = self.sys.setregs(parent, &regs);
        if let Some(t) = self.threads.get_mut(&parent) {
            t.regs = None;
        }
    }
}
