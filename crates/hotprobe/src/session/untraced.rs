//! Running untraced, and what the in-process trap needs of a target.
//!
//! When the targets start ([`Session::start`]: before a process first
//! runs, so that no clone stop of its first threads is queued; and after
//! probes added while running) a process whose ptrace mechanisms have
//! nothing placed — no
//! trap probe, no pending probe, no followed forks, no probe in a library
//! the program loaded at run time (its unload is seen at the loader's
//! rendezvous: `unmapped.rs`) — runs untraced
//! ([`hotprobe_process::ProcessTarget::release`]), whether its probes are
//! on the agent's fast paths (patch, jump) alone, on in-process traps or
//! agent handlers: the in-process traps' `SIGTRAP`s, the program's own
//! signals and its thread starts (no clone stop) then cost no ptrace stop
//! ([`Session::ptrace_stops`] stays constant). Its end (status, a
//! `SIGKILL`) and an exec are still seen (see `hotprobe-process`'s
//! `release.rs`); the process is taken back (seized again) when the
//! session needs it stopped: to add a probe, to detach.
//!
//! What the tracer does at a thread's clone stop, and so what keeps a
//! process traced: `--stacks` publishes the new thread's stack region to
//! the agent's walk then, and per-process rows (`-f`, new processes) name
//! the thread's process from it. The agent registers new threads itself
//! (their counters, rings and shadow stacks are its own).
//!
//! A vfork child runs on its parent's thread pointer: the agent counts its
//! hits apart only when told of it, by its interposers (`vfork`, `clone`,
//! `syscall()`, `posix_spawn` of a preloaded agent) or by the tracer at
//! the vfork stop. So a process that may make a vfork child no interposer
//! sees stays traced ([`unseen_vfork_reason`]): one whose modules call
//! glibc's `system`, `popen` or `wordexp` (their `clone` is internal to
//! libc), or hold a `syscall` instruction of their own (libc, the loader
//! and the agent aside); with an injected agent (attached), which has no
//! interposers, also one that calls `vfork`, `syscall` or `posix_spawn`.
//! So does one that may fork without running the agent's `pthread_atfork`
//! handler (`_Fork`, `clone`): a traced run takes the fast path's code out
//! of such a child at its fork stop; untraced, its hits would count in
//! the parent's memory. Not covered: a module the program loads while
//! untraced (no loader breakpoint then), and a fork made through libc's
//! `syscall()` (`SYS_fork`, or `SYS_clone` without `CLONE_VM`) by a
//! spawned program: its interposer passes it on unseen, and libstdc++
//! alone calls `syscall()` (for futexes), so refusing every caller would
//! keep nearly every program traced.

use super::*;

impl Session {
    /// Why target `t` may get no in-process trap, whose `int3` needs
    /// `SIGTRAP` unblocked in every thread and out of every handler's mask
    /// (issue 22): the preloaded agent keeps it so through the libc calls
    /// it interposes (`hotprobe-agent`'s `sigmask`). An agent injected into
    /// a running process cannot (the program's calls are bound to libc's
    /// already), nor can any agent in a Go program (its runtime sets masks
    /// with raw system calls). `None`: it may.
    pub(super) fn inproc_refusal(&mut self, t: TargetId) -> Result<Option<String>, EngineError> {
        let slot = self.slot(t)?;
        let Some(pid) = slot.pid.filter(|_| slot.is_process()) else {
            return Ok(Some("not a process".into()));
        };
        if !slot.spawned {
            return Ok(Some(
                "the agent was injected into a running process, whose signal-mask calls are \
                 bound to libc's: it cannot keep SIGTRAP unblocked in every thread"
                    .into(),
            ));
        }
        let symbols = self.process_symbols(t, pid)?;
        if symbols.modules().iter().any(crate::nonlocal::is_go_module) {
            return Ok(Some(
                "a Go runtime sets signal masks with raw system calls: SIGTRAP may be blocked"
                    .into(),
            ));
        }
        Ok(None)
    }

    /// ptrace stops of target `t`'s process so far (`None` for a guest).
    /// With only fast-path and in-process mechanisms placed it stays
    /// constant while the process runs (it runs untraced).
    pub fn ptrace_stops(&mut self, t: TargetId) -> Option<u64> {
        let slot = self.slots.get_mut(t.0)?;
        Slot::process(&mut slot.target).map(|p| p.ptrace_stops())
    }

    /// Whether target `t`'s process ended while it ran untraced (see the
    /// module docs): a run that ended with no ptrace stop at its end.
    pub fn ended_untraced(&mut self, t: TargetId) -> bool {
        self.slots
            .get_mut(t.0)
            .and_then(|s| Slot::process(&mut s.target))
            .is_some_and(|p| p.ended_while_untraced())
    }

    /// Whether target `t` runs untraced now (see the module docs).
    pub fn is_untraced(&mut self, t: TargetId) -> bool {
        self.slots
            .get_mut(t.0)
            .and_then(|s| Slot::process(&mut s.target))
            .is_some_and(|p| p.is_released())
    }

    /// Lets the started process of slot `i` run untraced when nothing of
    /// its needs ptrace (see the module docs); otherwise leaves it.
    pub(super) fn maybe_release(&mut self, i: usize) {
        // Thread starts the tracer must see (see the module docs): the
        // stack regions of `--stacks`, the per-process rows.
        let follow = self.config.follow_forks
            || self.config.fast_path.stacks
            || self.new_processes.is_some();
        let slot = &mut self.slots[i];
        let last_delay = slot.release_retry.take().map(|(_, d)| d);
        let early = if follow {
            Some("thread starts are followed")
        } else if !slot.engine.started {
            Some("not started")
        } else if slot.engine.gone().is_some() {
            Some("gone")
        } else if slot.root.is_some() || slot.mechs.plugin.is_some() || slot.pid.is_none() {
            Some("not a process")
        } else {
            None
        };
        if let Some(why) = early {
            self.log_release(i, |_| why.into());
            return;
        }
        let slot = &mut self.slots[i];
        let (Some(pid), spawned) = (slot.pid, slot.spawned) else {
            return;
        };
        let released = Slot::process(&mut slot.target).is_some_and(|p| p.is_released());
        if released {
            self.log_release(i, |_| "released".into());
            return;
        }
        // What may change while the program runs (a module loaded or
        // read, a probe armed) is looked at again in a moment: a process
        // that made no later event stayed traced for good, the session
        // waiting on it in silence.
        let waits = !slot.pending.is_empty()
            || slot.watches_unloads()
            || !slot.mechs.trap.followable.is_empty();
        let unseen = if waits {
            None
        } else {
            unseen_vfork_reason(pid, spawned)
        };
        if waits || unseen.as_ref().is_some_and(|(_, may_change)| *may_change) {
            slot.release_retry = Some(next_release_retry(last_delay));
            self.log_release(i, |slot| match &unseen {
                Some((why, _)) => format!("retry: {why}"),
                None => format!(
                    "retry: pending {}, unload watch {}, trap follow {}",
                    slot.pending.len(),
                    slot.watches_unloads(),
                    slot.mechs.trap.followable.len()
                ),
            });
            return;
        }
        if let Some((why, _)) = unseen {
            self.log_release(i, |_| format!("kept: {why}"));
            return;
        }
        if let Some(pt) = Slot::process(&mut slot.target) {
            let tried = pt.release();
            self.log_release(i, |slot| match &tried {
                Ok(true) => "released".into(),
                Ok(false) => format!(
                    "refused: {:?}",
                    Slot::process(&mut slot.target).and_then(|p| p.ptrace_need())
                ),
                Err(e) => format!("failed: {e}"),
            });
            let slot = &mut self.slots[i];
            let Some(pt) = Slot::process(&mut slot.target) else {
                return;
            };
            match tried {
                Ok(true) => slot.release_refused = None,
                // A thread stopped with an event, a queued one (a thread
                // start, a library loaded): tried again in a moment, the
                // run loop's wait bounded by it. Tried only here, a
                // process that then made no ptrace event stayed traced
                // for good (attach_refusals' first `count -p`, now and
                // then under load).
                Ok(false) => {
                    // Probes that need ptrace keep it traced by design, as
                    // does a kernel that cannot tell an attached process's
                    // exit untraced (no reason named: before Linux 6.13).
                    let why = pt.ptrace_need().filter(|_| !pt.probes_need_ptrace());
                    let now = std::time::Instant::now();
                    slot.release_retry = Some(next_release_retry(last_delay));
                    // Said once, when it lasts: the process is slower
                    // traced, and the user may wonder why.
                    let (since, told) = *slot.release_refused.get_or_insert((now, false));
                    if let Some(why) =
                        why.filter(|_| !told && now.duration_since(since) >= RELEASE_STUCK)
                    {
                        slot.release_refused = Some((since, true));
                        // Said as it happens where the caller asked for
                        // that (the CLI): at the end it is no use.
                        self.urgent_notice(
                            i,
                            format!(
                                "pid {pid}: still traced after {} s ({why}); trying again",
                                RELEASE_STUCK.as_secs()
                            ),
                        );
                    }
                }
                Err(e) => slot.notice(format!(
                    "cannot run untraced: {e}; the process stays traced"
                )),
            }
        }
    }

    /// With `HOTPROBE_DEBUG_RELEASE` set (a diagnostic, for tests that
    /// wait for a release): each new answer of [`Session::maybe_release`]
    /// for slot `i` (`why` of the slot, worked out only then), said as it
    /// happens ([`Session::urgent_notice`]).
    fn log_release(&mut self, i: usize, why: impl FnOnce(&mut Slot) -> String) {
        static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if !*ON.get_or_init(|| std::env::var_os("HOTPROBE_DEBUG_RELEASE").is_some()) {
            return;
        }
        let slot = &mut self.slots[i];
        let why = why(slot);
        if slot.release_logged.as_deref() == Some(why.as_str()) {
            return;
        }
        let n = format!("release of slot {i}: {why}");
        slot.release_logged = Some(why);
        self.urgent_notice(i, n);
    }

    /// Tries again, for every live slot whose time came, to let the
    /// process run untraced; the time until the next try, if any.
    pub(super) fn retry_releases(&mut self) -> Option<Duration> {
        let now = std::time::Instant::now();
        for i in 0..self.slots.len() {
            // Taken back for a moment by something that does not let it go
            // again itself (a reverted site armed again: the process then
            // stayed traced for good, in silence): tried now.
            let taken_back = Slot::process(&mut self.slots[i].target)
                .is_some_and(|p| p.take_taken_back() && !p.is_released());
            if taken_back {
                self.slots[i].release_logged = None;
                self.log_release(i, |_| "taken back".into());
            }
            if taken_back || self.slots[i].release_retry.is_some_and(|(at, _)| at <= now) {
                self.maybe_release(i);
            }
        }
        self.slots
            .iter()
            .filter(|s| s.engine.gone().is_none())
            .filter_map(|s| s.release_retry.map(|(at, _)| at))
            .min()
            .map(|at| at.saturating_duration_since(now))
    }
}

/// When to try a release again, and the delay, after one whose delay was
/// `last` (none: the first refusal).
fn next_release_retry(last: Option<Duration>) -> (std::time::Instant, Duration) {
    let delay = last.map_or(RELEASE_RETRY, |d| (d * 2).min(RELEASE_RETRY_MAX));
    (std::time::Instant::now() + delay, delay)
}

/// How long after a refused release the next try comes, doubled after
/// each refusal up to the second (a process that keeps needing ptrace,
/// such as one with ptrace-trap probes, costs a cheap check a second).
const RELEASE_RETRY: Duration = Duration::from_millis(10);
const RELEASE_RETRY_MAX: Duration = Duration::from_secs(1);
/// Refusals to let a process run untraced for this long are told once.
const RELEASE_STUCK: Duration = Duration::from_secs(2);

/// The calls that make a child no interposer sees: glibc's spawns
/// through its internal `clone` (a vfork child), and forks that run no
/// `pthread_atfork` handler (`_Fork`, a `clone` without `CLONE_VM`: the
/// child's hits would count in the parent's shared memory, where a traced
/// run takes the fast path's code out of the child at its fork stop).
const LIBC_INTERNAL_VFORKS: &[&str] = &[
    "system", "popen", "wordexp", "_Fork", "clone", "clone3", "__clone", "__clone2",
];

/// The calls a preloaded agent interposes to see a vfork child (an
/// injected agent has no interposers).
const INTERPOSED_VFORKS: &[&str] = &["vfork", "__vfork", "syscall", "posix_spawn", "posix_spawnp"];

/// What one module file may do that makes a vfork child unseen.
#[derive(Clone, Debug, Default)]
struct ModuleVforks {
    /// The calls of [`LIBC_INTERNAL_VFORKS`] and [`INTERPOSED_VFORKS`] it
    /// imports.
    imports: Vec<String>,
    /// Whether its code holds a `syscall`, `sysenter` or `int 0x80`.
    raw_syscall: bool,
}

/// A module file: path, device, inode, modification time.
type FileKey = (PathBuf, u64, u64, i64);

/// Scans of module files, by file (a file's content does not change
/// under the same inode and time).
static SCANS: std::sync::Mutex<Option<HashMap<FileKey, ModuleVforks>>> =
    std::sync::Mutex::new(None);

/// What module file `path` may do (`None`: it cannot be read or parsed).
fn scan_module(path: &std::path::Path) -> Option<ModuleVforks> {
    use hotprobe_x86::iced_x86::{Decoder, DecoderOptions, Mnemonic};
    use object::{Object, ObjectSection, ObjectSymbol, SectionKind};
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    let key = (path.to_path_buf(), meta.dev(), meta.ino(), meta.mtime());
    if let Some(v) = SCANS
        .lock()
        .ok()?
        .as_ref()
        .and_then(|m| m.get(&key).cloned())
    {
        return Some(v);
    }
    let data = std::fs::read(path).ok()?;
    let file = object::File::parse(&*data).ok()?;
    let imports = file
        .dynamic_symbols()
        .filter(|s| s.is_undefined())
        .filter_map(|s| s.name().ok())
        .filter(|n| LIBC_INTERNAL_VFORKS.contains(n) || INTERPOSED_VFORKS.contains(n))
        .map(str::to_string)
        .collect();
    let raw_syscall = file
        .sections()
        .filter(|s| s.kind() == SectionKind::Text)
        .filter_map(|s| Some((s.address(), s.data().ok()?)))
        // No `0f 05`, `0f 34` or `cd 80` byte pair: no such instruction.
        .filter(|(_, code)| {
            code.windows(2)
                .any(|w| matches!(w, [0x0f, 0x05] | [0x0f, 0x34] | [0xcd, 0x80]))
        })
        .any(|(addr, code)| {
            let mut d = Decoder::with_ip(64, code, addr, DecoderOptions::NONE);
            d.iter().any(|i| match i.mnemonic() {
                Mnemonic::Syscall | Mnemonic::Sysenter => true,
                Mnemonic::Int => i.immediate8() == 0x80,
                _ => false,
            })
        });
    let v = ModuleVforks {
        imports,
        raw_syscall,
    };
    if let Ok(mut m) = SCANS.lock() {
        m.get_or_insert_with(HashMap::new).insert(key, v.clone());
    }
    Some(v)
}

/// Why process `pid` may make a vfork child that neither the agent's
/// interposers nor (untraced) the tracer would see (see the module docs),
/// or `None`; with whether the answer may change without a module loaded
/// (a module that could not be read). `spawned`: the agent was preloaded
/// (its interposers bind the program's calls); else it was injected and
/// has none.
pub(super) fn unseen_vfork_reason(pid: i32, spawned: bool) -> Option<(String, bool)> {
    let Ok(syms) = hotprobe_symbols::ProcessSymbols::for_pid(pid as u32) else {
        return Some(("its modules cannot be read".into(), true));
    };
    for m in syms.modules() {
        let name = m.name.as_str();
        if name.starts_with("libhotprobe_agent") {
            continue;
        }
        let libc = name.starts_with("libc.so") || name.starts_with("libc-");
        let loader = name.starts_with("ld-linux") || name.starts_with("ld64");
        let Some(v) = scan_module(m.module.path()) else {
            return Some((format!("{name} cannot be read"), true));
        };
        if !libc && !loader && v.raw_syscall {
            return Some((format!("{name} makes system calls of its own"), false));
        }
        let unseen = v.imports.iter().find(|n| {
            LIBC_INTERNAL_VFORKS.contains(&n.as_str())
                || (!spawned && INTERPOSED_VFORKS.contains(&n.as_str()))
        });
        if let Some(n) = unseen {
            return Some((format!("{name} calls {n}"), false));
        }
    }
    None
}
