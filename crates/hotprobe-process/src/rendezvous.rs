//! The dynamic loader's rendezvous with debuggers, as gdb uses it for
//! pending breakpoints: ld.so calls the empty function `_dl_debug_state`
//! (`r_brk`) each time it changes `r_state` in `_r_debug`, `RT_ADD` or
//! `RT_DELETE` before it maps or unmaps objects, `RT_CONSISTENT` once it is
//! done (after relocation, before the new objects' constructors run).
//!
//! The target keeps an internal breakpoint there, in its own breakpoint
//! table (so reads mask it, forked children get the original byte back and
//! detach removes it), invisible to the engine: a hit that ends a change
//! (`RT_ADD`/`RT_DELETE` → `RT_CONSISTENT`) is reported as
//! [`TargetEvent::ModulesChanged`]; any other hit is stepped over at once.
//!
//! Stepping over is done by emulating the function's only instruction, a
//! bare `ret` (after an optional `endbr64`): pop the return address into
//! `rip`. One read and one register write, and the `int3` never leaves the
//! code: a real single-step would need the breakpoint lifted (other
//! threads could miss a notification meanwhile) plus a step stop and a
//! wait. A loader whose `_dl_debug_state` is anything else is not used.

use hotprobe_target::{Registers, RuntimeAddr, Target, TargetError, TargetEvent, ThreadId};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use crate::{sys, ProcessTarget};

/// `r_state` values (`enum r_state` in `<link.h>`).
const RT_CONSISTENT: i32 = 0;

/// At most this many namespaces are followed (glibc's `DL_NNS`).
const MAX_NAMESPACES: usize = 16;

/// Offsets in `struct r_debug` (x86-64): `int r_version; struct link_map
/// *r_map; ElfW(Addr) r_brk; enum r_state; ElfW(Addr) r_ldbase;` and, in
/// `struct r_debug_extended` (glibc 2.35, `r_version` 2), `r_next`.
const R_VERSION: usize = 0;
const R_MAP: usize = 8;
const R_STATE: usize = 24;
const R_NEXT: usize = 40;

/// The rendezvous of the current program image.
#[derive(Debug)]
pub(crate) struct Rendezvous {
    /// `_dl_debug_state`: where the internal breakpoint is.
    pub(crate) brk: u64,
    /// `_r_debug`: the base namespace's `r_debug` (the first of the chain).
    r_debug: u64,
    /// `r_state` of each namespace's `r_debug` (by address) at the last hit.
    states: Vec<(u64, i32)>,
    /// The base namespace has completed a load (its initial one after exec,
    /// or it was already loaded at attach).
    pub(crate) base_loaded: bool,
    /// The engine inserted a breakpoint at `brk` as well: its hits are
    /// reported to it as [`TargetEvent::Breakpoint`].
    pub(crate) engine_owned: bool,
}

/// One namespace's `r_debug` as read from the target.
struct Namespace {
    addr: u64,
    state: i32,
    map: u64,
}

/// Whether `code` (the first bytes of `_dl_debug_state`) is a bare return:
/// `ret`, `repz ret`, `bnd ret`, or `endbr64; ret`.
fn is_bare_return(code: &[u8; 5]) -> bool {
    code[0] == 0xc3
        || (code[0] == 0xf3 || code[0] == 0xf2) && code[1] == 0xc3
        || code == &[0xf3, 0x0f, 0x1e, 0xfa, 0xc3]
}

/// An auxiliary vector entry of process `pid`.
pub(crate) fn read_auxv(pid: i32, key: u64) -> Option<u64> {
    let data = std::fs::read(format!("/proc/{pid}/auxv")).ok()?;
    for pair in data.chunks_exact(16) {
        let k = u64::from_le_bytes(pair[0..8].try_into().ok()?);
        let v = u64::from_le_bytes(pair[8..16].try_into().ok()?);
        if k == key {
            return Some(v);
        }
    }
    None
}

/// `_dl_debug_state` and `_r_debug` of the program interpreter (`AT_BASE`)
/// mapped in `pid`, from the file's symbols; `None` for a program without
/// an interpreter (static) or a loader without them.
fn locate(pid: i32) -> Option<(u64, u64)> {
    let base = read_auxv(pid, libc::AT_BASE)?;
    if base == 0 {
        return None;
    }
    let maps = hotprobe_symbols::read_maps(pid as u32).ok()?;
    let first = maps.iter().find(|m| m.contains(RuntimeAddr(base)))?;
    if first.deleted {
        return None;
    }
    let path: PathBuf = first.path.clone()?;
    // The file must be the one mapped (not another one at that path, as in
    // a container or after an upgrade): a wrong address would corrupt code.
    if std::fs::metadata(&path).ok()?.ino() != first.inode {
        return None;
    }
    let ld = hotprobe_symbols::ModuleCache::global().get(&path).ok()??;
    let bias = ld.load_bias_for(maps.iter().filter(|m| m.path.as_ref() == Some(&path)))?;
    let brk = ld.find("_dl_debug_state")?.addr + bias;
    let r_debug = hotprobe_symbols::data_symbol(&path, "_r_debug").ok()??.addr + bias;
    Some((brk.0, r_debug.0))
}

impl ProcessTarget {
    /// Find the loader's rendezvous in the current image and put the
    /// internal breakpoint there. Without one (static program, unknown
    /// loader) the target works as before, only without
    /// [`TargetEvent::ModulesChanged`].
    pub(crate) fn arm_rendezvous(&mut self) {
        if self
            .rendezvous
            .as_ref()
            .is_some_and(|r| self.breakpoints.contains_key(&r.brk))
        {
            // Armed in this image already (an exec event handled while
            // attaching): forgetting it would orphan its int3, which the
            // loader's next call then hits for ever as an unknown breakpoint.
            return;
        }
        self.rendezvous = None;
        let Some((brk, r_debug)) = locate(self.live_task()) else {
            return;
        };
        let mut code = [0u8; 5];
        if self.read_memory(RuntimeAddr(brk), &mut code).is_err()
            || !is_bare_return(&code)
            || self.breakpoints.contains_key(&brk)
            || self.insert_int3(RuntimeAddr(brk)).is_err()
        {
            return;
        }
        let now = self.read_namespaces(r_debug);
        let base_loaded = now
            .first()
            .is_some_and(|b| b.state == RT_CONSISTENT && b.map != 0);
        self.rendezvous = Some(Rendezvous {
            brk,
            r_debug,
            states: now.iter().map(|n| (n.addr, n.state)).collect(),
            base_loaded,
            engine_owned: false,
        });
    }

    /// Whether the dynamic loader is in the middle of a change of the base
    /// namespace, read now: before its first load completed (attached
    /// during the program's start, libc maybe mapped but not relocated) or
    /// inside a `dlopen`/`dlclose`. A remote call into libc (`dlopen` of the
    /// agent) is unsafe then. `false` without a rendezvous (static program,
    /// unknown loader): nothing tells.
    pub fn loader_busy(&mut self) -> bool {
        self.leader_in_loader() || self.base_namespace_changing()
    }

    /// Whether the base namespace's `r_state` says a change is under way
    /// (or it has no objects yet); `false` without a rendezvous.
    pub(crate) fn base_namespace_changing(&mut self) -> bool {
        let Some(r_debug) = self.rendezvous.as_ref().map(|r| r.r_debug) else {
            return false;
        };
        match self.read_namespaces(r_debug).first() {
            Some(base) => base.state != RT_CONSISTENT || base.map == 0,
            None => true,
        }
    }

    /// Whether the stopped leader's `rip` is in the program interpreter's
    /// code (`AT_BASE`'s file): still starting the program (constructors,
    /// the jump to the entry), or in the lazy binder or a `dlopen`. A
    /// remote `dlopen` from there faulted once with `r_state` consistent
    /// (attach_to_own_child, attached right after spawn).
    pub(crate) fn leader_in_loader(&self) -> bool {
        let Some(base) = read_auxv(self.pid, libc::AT_BASE).filter(|b| *b != 0) else {
            return false;
        };
        let Ok(rip) = self.fetch_regs(self.pid).map(|r| r.rip) else {
            return false;
        };
        let Ok(maps) = hotprobe_symbols::read_maps(self.pid as u32) else {
            return false;
        };
        let Some(ld) = maps
            .iter()
            .find(|m| m.contains(RuntimeAddr(base)))
            .and_then(|m| m.path.clone())
        else {
            return false;
        };
        maps.iter()
            .any(|m| m.path.as_ref() == Some(&ld) && m.contains(RuntimeAddr(rip)))
    }

    /// Every namespace's `r_debug`, the base one first.
    fn read_namespaces(&mut self, r_debug: u64) -> Vec<Namespace> {
        let mut out: Vec<Namespace> = Vec::new();
        let mut addr = r_debug;
        while addr != 0 && out.len() < MAX_NAMESPACES && !out.iter().any(|n| n.addr == addr) {
            let mut b = [0u8; R_NEXT];
            // A plain r_debug (r_version 1) ends where r_next would start.
            if self.read_memory(RuntimeAddr(addr), &mut b).is_err() {
                break;
            }
            let i32_at = |o: usize| i32::from_le_bytes(b[o..o + 4].try_into().expect("4 bytes"));
            let version = i32_at(R_VERSION);
            out.push(Namespace {
                addr,
                state: i32_at(R_STATE),
                map: u64::from_le_bytes(b[R_MAP..R_MAP + 8].try_into().expect("8 bytes")),
            });
            if version < 2 {
                break;
            }
            match self.read_u64(RuntimeAddr(addr + R_NEXT as u64)) {
                Ok(next) => addr = next,
                Err(_) => break,
            }
        }
        out
    }

    /// Book-keeping for one hit of the rendezvous breakpoint: whether it
    /// ends a change (some namespace went from `RT_ADD` or `RT_DELETE` to
    /// `RT_CONSISTENT`).
    pub(crate) fn rendezvous_hit(&mut self) -> bool {
        let Some(r_debug) = self.rendezvous.as_ref().map(|r| r.r_debug) else {
            return false;
        };
        let now = self.read_namespaces(r_debug);
        let Some(rv) = self.rendezvous.as_mut() else {
            return false;
        };
        let was = |addr: u64| {
            rv.states
                .iter()
                .find(|(a, _)| *a == addr)
                .map_or(RT_CONSISTENT, |(_, s)| *s)
        };
        let ended = |n: &Namespace| n.state == RT_CONSISTENT && was(n.addr) != RT_CONSISTENT;
        let changed = now.iter().any(ended);
        if now
            .first()
            .is_some_and(|b| b.addr == r_debug && b.map != 0 && ended(b))
        {
            rv.base_loaded = true;
        }
        rv.states = now.iter().map(|n| (n.addr, n.state)).collect();
        if changed && self.sig_sites_armed() {
            // New modules' signal-state system calls (see `sigtrap.rs`).
            self.arm_sig_sites();
        }
        changed
    }

    /// Whether a SIGTRAP with `rip` is a hit of the rendezvous breakpoint.
    pub(crate) fn is_rendezvous_trap(&self, rip: u64) -> bool {
        let bp = rip.wrapping_sub(1);
        self.rendezvous.as_ref().is_some_and(|r| r.brk == bp) && self.breakpoints.contains_key(&bp)
    }

    /// Run the bare return at the rendezvous for stopped thread `tid`
    /// (`regs.rip` at `_dl_debug_state`): pop the return address.
    pub(crate) fn emulate_return(
        &mut self,
        tid: i32,
        regs: &mut Registers,
    ) -> Result<(), TargetError> {
        let ret = self.read_u64(RuntimeAddr(regs.rsp))?;
        regs.rip = ret;
        regs.rsp = regs.rsp.wrapping_add(8);
        self.sys
            .setregs(tid, &sys::regs_to_user(regs))
            .map_err(|e| self.sys_err(e))
    }

    /// A thread stopped on a SIGTRAP at the rendezvous breakpoint (`regs`
    /// as the kernel left them, one past the `int3`): report the hit, or
    /// step over it and let the thread go.
    pub(crate) fn on_rendezvous(
        &mut self,
        pid: i32,
        regs: Registers,
    ) -> Result<Option<TargetEvent>, TargetError> {
        let report = self.rendezvous_hit();
        let engine = self.rendezvous.as_ref().is_some_and(|r| r.engine_owned);
        let thread = ThreadId(pid as u64);
        let mut r = regs;
        r.rip = regs.rip.wrapping_sub(1);
        if report || engine {
            // Rewound now rather than on resume: remote calls made before
            // the resume save and restore the kernel's registers.
            self.sys
                .setregs(pid, &sys::regs_to_user(&r))
                .map_err(|e| self.sys_err(e))?;
            let t = self.threads.get_mut(&pid).expect("known thread");
            t.regs = Some(r);
            if report {
                t.at_rendezvous = true;
                return Ok(Some(TargetEvent::ModulesChanged { thread }));
            }
            return Ok(Some(TargetEvent::Breakpoint {
                thread,
                addr: RuntimeAddr(r.rip),
                regs: r,
            }));
        }
        self.emulate_return(pid, &mut r)?;
        self.restore_sigtrap_state(pid);
        let t = self.threads.get_mut(&pid).expect("known thread");
        t.state = crate::RunState::Running;
        self.sys.cont(pid, 0).map_err(|e| self.sys_err(e))?;
        Ok(None)
    }

    /// On resuming a thread that reported [`TargetEvent::ModulesChanged`]
    /// and still sits at the rendezvous: step it over the `ret`. Returns
    /// the event to report instead of running it (the engine's own
    /// breakpoint there, or the step asked for).
    pub(crate) fn leave_rendezvous(
        &mut self,
        thread: ThreadId,
        step: bool,
    ) -> Result<Option<TargetEvent>, TargetError> {
        let Some((brk, engine)) = self.rendezvous.as_ref().map(|r| (r.brk, r.engine_owned)) else {
            return Ok(None);
        };
        let mut r = self.registers(thread)?;
        if r.rip != brk {
            // The caller moved the thread.
            return Ok(None);
        }
        if engine {
            return Ok(Some(TargetEvent::Breakpoint {
                thread,
                addr: RuntimeAddr(brk),
                regs: r,
            }));
        }
        self.emulate_return(thread.0 as i32, &mut r)?;
        self.stopped_thread(thread)?.regs = Some(r);
        Ok(step.then_some(TargetEvent::Stepped { thread, regs: r }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_returns() {
        assert!(is_bare_return(&[0xc3, 0x66, 0x66, 0x2e, 0x0f]));
        assert!(is_bare_return(&[0xf3, 0x0f, 0x1e, 0xfa, 0xc3]));
        assert!(is_bare_return(&[0xf3, 0xc3, 0, 0, 0]));
        assert!(!is_bare_return(&[0xf3, 0x0f, 0x1e, 0xfa, 0x55]));
        assert!(!is_bare_return(&[0x55, 0x48, 0x89, 0xe5, 0xc3]));
    }
}
