//! Loading the agent: preloaded at spawn, or injected into a running
//! process (remote `dlopen`), and attached to our shared memory.

use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use hotprobe_process::{ProcessTarget, SpawnOptions};
use hotprobe_target::{RuntimeAddr, Target};

use crate::pass::{close_in_target, target_memfd};
use crate::shm::OwnedShm;
use crate::{FastPath, FastPathConfig, FastPathError, PendingFastPath};

impl FastPath {
    /// Prepares the shared memory and the environment (`LD_PRELOAD` of
    /// `agent`, `HOTPROBE_SHM_PATH` naming our memfd) of a process to be spawned with `opts`,
    /// and sets `opts.stop_at_entry`: the agent attaches from its constructor.
    pub fn for_spawn(
        opts: &mut SpawnOptions,
        agent: &Path,
        config: FastPathConfig,
    ) -> Result<PendingFastPath, FastPathError> {
        let shm = Arc::new(OwnedShm::create(config)?);
        let mut preload = OsString::from(agent);
        if let Some(old) = std::env::var_os("LD_PRELOAD") {
            preload.push(":");
            preload.push(old);
        }
        opts.env.push(("LD_PRELOAD".into(), preload));
        // The agent is mapped and relocated at the spawn stop (before any
        // constructor runs, its own included): `PendingFastPath::attach`
        // attaches it there by a remote call, so that probes go in before
        // any constructor of the program or its libraries runs.
        Ok(PendingFastPath {
            shm,
            stubs: config.stubs,
        })
    }

    /// Loads the agent into the running, attached, stopped process `t`
    /// (remote `dlopen`, then `hotprobe_agent_attach_fd` — found with a
    /// remote `dlsym` on the handle, so whatever the library's name in the
    /// target's maps, e.g. a memfd's — on a descriptor the target opens on
    /// our memfd through `/proc/OUR_PID/fd`). An agent the target already
    /// has (a previous tracer's) is attached again instead, when it speaks
    /// this layout version and no other session still probes the process
    /// ([`crate::check_not_probed`]: refused then).
    pub fn inject(
        t: &mut ProcessTarget,
        agent: &Path,
        config: FastPathConfig,
    ) -> Result<FastPath, FastPathError> {
        t.stop_all()?;
        let syms = hotprobe_symbols::ProcessSymbols::for_pid(t.pid() as u32)?;
        let libc_mod = syms
            .modules()
            .iter()
            .find(|m| m.name.starts_with("libc.so") || m.name.starts_with("libc-"))
            .ok_or_else(|| FastPathError::AgentNotAttached {
                pid: t.pid(),
                why: "no libc mapped in the target".into(),
            })?;
        let libc_fn = |names: &[&str]| {
            names
                .iter()
                .find_map(|n| libc_mod.module.find(n))
                .map(|s| libc_mod.runtime(s.addr).0)
        };
        let dlopen = libc_fn(&["dlopen", "__libc_dlopen_mode"]).ok_or_else(|| {
            FastPathError::AgentNotAttached {
                pid: t.pid(),
                why: "no dlopen in the target's libc".into(),
            }
        })?;
        let dlsym = libc_fn(&["dlsym", "__libc_dlsym"]);
        // An agent already loaded (a previous tracer's, preloaded or
        // injected, from another path or memfd than ours) is attached
        // again rather than joined by a second copy, if it speaks our
        // layout: its stubs and thread registrations stay consistent.
        let existing = syms
            .modules()
            .iter()
            .filter(|m| m.name.starts_with("libhotprobe_agent"))
            .find_map(|m| {
                let f = |n: &str| m.module.find(n).map(|s| m.runtime(s.addr).0);
                Some((
                    f("hotprobe_agent_attach_fd")?,
                    f("hotprobe_agent_version")?,
                    f("hotprobe_agent_release"),
                    f("hotprobe_agent_hangup_fd"),
                    f(MAP_RINGS),
                ))
            });
        let dlclose = libc_fn(&["dlclose", "__libc_dlclose"]);
        drop(syms);
        let pid = t.pid();
        let fail = |why: String| FastPathError::AgentNotAttached { pid, why };
        let timeout = Duration::from_secs(10);
        let mut attach_fn = None;
        // How to take the agent out again at detach (see `unload`).
        let mut release_fn = None;
        let mut hangup_fn = None;
        let mut map_rings_fn = None;
        let mut handle_of_ours = None;
        if let Some((attach, version, release, hangup, map_rings)) = existing {
            // Never taken over from a session that still probes the
            // process (see `owner`): its sites would be lost to the agent.
            crate::owner::check_not_probed_now(pid)?;
            let v = hotprobe_process::remote_call::remote_call(t, version, &[], timeout)?;
            if v as u32 == hotprobe_abi::VERSION {
                attach_fn = Some(attach);
                release_fn = release;
                hangup_fn = hangup;
                map_rings_fn = map_rings;
            }
        }
        // Scratch page for the strings.
        let page = remote_page(t)?;
        // The shared memory in a memfd the target created, when it can
        // be had (see `pass`); else in ours, opened through /proc.
        let (shm, shm_fd, shm_why) = match target_memfd(t, page + 2048, "hotprobe", false) {
            Ok(p) => match OwnedShm::create_in(config, p.memfd) {
                Ok(shm) => (shm, Some(p.target_fd), None),
                Err(e) => {
                    close_in_target(t, p.target_fd);
                    return Err(e);
                }
            },
            Err(why) => (OwnedShm::create(config)?, None, Some(why)),
        };
        let shm = Arc::new(shm);
        // The agent, likewise, in a memfd the target opens as its own.
        let mut dl_path = agent.display().to_string();
        let mut agent_fd = None;
        let mut agent_why = None;
        if attach_fn.is_none() {
            match pass_agent(t, page + 2048, agent) {
                Ok(fd) => {
                    dl_path = format!("/proc/self/fd/{fd}");
                    agent_fd = Some(fd);
                }
                Err(why) => agent_why = Some(why),
            }
        }
        let agent_c = format!("{dl_path}\0");
        if agent_c.len() > 2048 {
            return Err(fail(format!("agent path too long: {}", agent.display())));
        }
        const ATTACH_NAME: &[u8] = b"hotprobe_agent_attach_fd\0";
        const RELEASE_NAME: &[u8] = b"hotprobe_agent_release\0";
        const HANGUP_NAME: &[u8] = b"hotprobe_agent_hangup_fd\0";
        const MAP_RINGS_NAME: &[u8] = b"hotprobe_agent_map_rings\0";
        t.write_memory(RuntimeAddr(page), agent_c.as_bytes())?;
        t.write_memory(RuntimeAddr(page + 3072), ATTACH_NAME)?;
        t.write_memory(RuntimeAddr(page + 3584), RELEASE_NAME)?;
        t.write_memory(RuntimeAddr(page + 3840), HANGUP_NAME)?;
        t.write_memory(RuntimeAddr(page + 3968), MAP_RINGS_NAME)?;
        if attach_fn.is_none() {
            let handle = hotprobe_process::remote_call::remote_call(
                t,
                dlopen,
                &[page, (libc::RTLD_NOW | libc::RTLD_GLOBAL) as u64],
                timeout,
            );
            if let Some(fd) = agent_fd {
                // The loader keeps its mapping; the descriptor goes.
                close_in_target(t, fd);
            }
            let handle = handle?;
            if handle == 0 {
                let why = agent_why
                    .map(|w| format!(" (it could not be passed as a descriptor: {w})"))
                    .unwrap_or_default();
                return Err(fail(format!("dlopen({dl_path}) returned NULL{why}")));
            }
            // The symbol of the copy just loaded, whatever its file is
            // called in the target's maps (a memfd's name).
            if let Some(dlsym) = dlsym {
                // Each name's address (0: not found) by a remote `dlsym`.
                let mut find = |name_at: u64| {
                    hotprobe_process::remote_call::remote_call(
                        t,
                        dlsym,
                        &[handle, page + name_at],
                        timeout,
                    )
                    .map(|a| (a != 0).then_some(a))
                };
                attach_fn = find(3072)?;
                release_fn = find(3584)?;
                hangup_fn = find(3840)?;
                map_rings_fn = find(3968)?;
            }
            handle_of_ours = Some(handle);
            if attach_fn.is_none() {
                let syms = hotprobe_symbols::ProcessSymbols::for_pid(t.pid() as u32)?;
                attach_fn = syms
                    .modules()
                    .iter()
                    .find(|m| m.name.starts_with("libhotprobe_agent"))
                    .and_then(|m| {
                        m.module
                            .find("hotprobe_agent_attach_fd")
                            .map(|s| m.runtime(s.addr).0)
                    });
            }
        }
        let attach_fn = attach_fn
            .ok_or_else(|| fail("agent mapped but hotprobe_agent_attach_fd not found".into()))?;
        let _ = hotprobe_process::remote_call::remote_syscall(
            t,
            libc::SYS_munmap as u64,
            &[page, 4096],
        );
        remote_attach(t, &shm, attach_fn, shm_fd).map_err(|e| match (e, shm_why) {
            (FastPathError::AgentNotAttached { pid, why }, Some(w)) => {
                FastPathError::AgentNotAttached {
                    pid,
                    why: format!(
                        "{why} (the shared memory could not be passed as a descriptor: {w})"
                    ),
                }
            }
            (e, _) => e,
        })?;
        // A process that cannot open our hang-up pipe (the reason the
        // memory went as a descriptor) gets one of its own; best effort:
        // without it the agent hears of our death by the heartbeat.
        if let (Some(_), Some(hangup)) = (shm_fd, hangup_fn) {
            let _ = crate::pass::pass_hangup(t, hangup);
        }
        let mut fp = FastPath::new(shm, t, config.stubs)?;
        fp.map_rings = map_rings_fn;
        fp.unload = release_fn.map(|release| crate::unload::Unload {
            release,
            dlclose: dlclose.zip(handle_of_ours),
        });
        Ok(fp)
    }
}

impl PendingFastPath {
    /// Attaches the preloaded agent to our shared memory by a remote call
    /// of `hotprobe_agent_attach_fd`, wherever the process stopped after
    /// its spawn (before any constructor: the agent is mapped and
    /// relocated there; or at its entry point).
    pub fn attach(self, t: &mut ProcessTarget) -> Result<FastPath, FastPathError> {
        let pid = t.pid();
        let syms = hotprobe_symbols::ProcessSymbols::for_pid(pid as u32)?;
        let agent_fn = |name: &str| {
            syms.modules()
                .iter()
                .filter(|m| m.name.starts_with("libhotprobe_agent"))
                .find_map(|m| m.module.find(name).map(|s| m.runtime(s.addr).0))
        };
        let attach_fn = agent_fn("hotprobe_agent_attach_fd").ok_or_else(|| {
            FastPathError::AgentNotAttached {
                pid,
                why: "the agent is not mapped (LD_PRELOAD ignored? a setuid or static binary?)"
                    .into(),
            }
        })?;
        let map_rings_fn = agent_fn(MAP_RINGS);
        drop(syms);
        remote_attach(t, &self.shm, attach_fn, None)?;
        let mut fp = FastPath::new(self.shm, t, self.stubs)?;
        fp.map_rings = map_rings_fn;
        Ok(fp)
    }
}

/// The agent's export that maps the ring pool in its process
/// (`hotprobe_agent_map_rings`; an older agent may lack it).
const MAP_RINGS: &str = "hotprobe_agent_map_rings";

/// A fresh read-write page in the stopped target (a remote `mmap`), for
/// the strings of remote calls; the caller unmaps it.
pub(crate) fn remote_page(t: &mut ProcessTarget) -> Result<u64, FastPathError> {
    let page = hotprobe_process::remote_call::remote_syscall(
        t,
        libc::SYS_mmap as u64,
        &[
            0,
            4096,
            (libc::PROT_READ | libc::PROT_WRITE) as u64,
            (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64,
            u64::MAX,
            0,
        ],
    )?;
    if (page as i64) < 0 {
        return Err(FastPathError::AgentNotAttached {
            pid: t.pid(),
            why: format!("remote mmap failed: errno {}", -(page as i64)),
        });
    }
    Ok(page)
}

/// Makes the stopped target call the agent's `attach_fn`
/// (`hotprobe_agent_attach_fd`) on the shared memory: on `target_fd`, its
/// own descriptor of it (closed afterwards), or on one it opens on our
/// memfd through `/proc/OUR_PID/fd`.
pub(crate) fn remote_attach(
    t: &mut ProcessTarget,
    shm: &OwnedShm,
    attach_fn: u64,
    target_fd: Option<u64>,
) -> Result<(), FastPathError> {
    use hotprobe_process::remote_call::{remote_call, remote_syscall};
    let pid = t.pid();
    let fail = |why: String| FastPathError::AgentNotAttached { pid, why };
    if let Some(fd) = target_fd {
        let r = remote_call(t, attach_fn, &[fd], Duration::from_secs(10));
        close_in_target(t, fd);
        return match r? as i32 {
            0 => Ok(()),
            r => Err(fail(format!("hotprobe_agent_attach_fd returned {r}"))),
        };
    }
    let page = remote_page(t)?;
    let fd_path = format!("/proc/{}/fd/{}\0", std::process::id(), shm.fd());
    t.write_memory(RuntimeAddr(page), fd_path.as_bytes())?;
    let fd = remote_syscall(
        t,
        libc::SYS_open as u64,
        &[page, (libc::O_RDWR | libc::O_CLOEXEC) as u64],
    );
    let _ = remote_syscall(t, libc::SYS_munmap as u64, &[page, 4096]);
    let fd = fd?;
    if (fd as i64) < 0 {
        return Err(fail(format!(
            "remote open of our memfd: errno {}",
            -(fd as i64)
        )));
    }
    let r = remote_call(t, attach_fn, &[fd], Duration::from_secs(10));
    let _ = remote_syscall(t, libc::SYS_close as u64, &[fd]);
    let r = r?;
    if r as i32 != 0 {
        return Err(fail(format!(
            "hotprobe_agent_attach_fd returned {}",
            r as i32
        )));
    }
    Ok(())
}

/// Writes the agent library at `agent` into a memfd the stopped target
/// creates (see `pass`): its descriptor there, for a `dlopen` of
/// `/proc/self/fd/N`. `scratch`: a page of the target's for the name.
fn pass_agent(t: &mut ProcessTarget, scratch: u64, agent: &Path) -> Result<u64, String> {
    let bytes = std::fs::read(agent).map_err(|e| format!("{}: {e}", agent.display()))?;
    let p = target_memfd(t, scratch, crate::AGENT_MEMFD_NAME, true)?;
    match p.memfd.write_all(&bytes) {
        Ok(()) => Ok(p.target_fd),
        Err(e) => {
            close_in_target(t, p.target_fd);
            Err(e.to_string())
        }
    }
}
