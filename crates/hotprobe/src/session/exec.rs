//! Following exec (`-f`, [`SessionConfig::follow_exec`]): when a process
//! the session holds (the one it started or attached to, or a followed
//! fork child) executes another program, the `Count` and `Record` specs
//! the session was given are resolved again in the new image and placed
//! there, on the trap mechanism (the agent the fast path used is not in the
//! new image). A spec naming a module applies to every process: one that
//! does not resolve in an image is said in a notice and tried again at the
//! next exec. Each new image is an [`ExecImage`]: its pid, command name and
//! program, and the probes placed in it (their counts per process, like any
//! probe's, from [`Session::stats_by_process`]).

use super::resolve::not_loaded;
use super::*;

/// A program a followed process executed, and the probes placed in it.
#[derive(Clone, Debug)]
pub struct ExecImage {
    /// Its place in [`Session::exec_images`] (the `image` its
    /// [`ExecPlacing`] had).
    pub index: usize,
    /// The process.
    pub pid: i32,
    /// Its command name after the exec (the kernel's 15-character `comm`).
    pub comm: String,
    /// The program it executed (`/proc/PID/exe`).
    pub path: PathBuf,
    /// The probes the session's specs placed in it.
    pub placements: Vec<Placement>,
    /// The specs that named nothing in it.
    pub missing: Vec<String>,
}

/// The image a followed exec's probes are being placed in, as an
/// [`ExecCapture`] is told of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExecPlacing {
    /// The process (stopped at its exec: its maps are the new image's).
    pub pid: i32,
    /// The [`ExecImage::index`] the image will have.
    pub image: usize,
}

/// Gives, for each image a followed process executes, the
/// [`CaptureChooser`] of one spec's probes placed there (what
/// [`Session::set_capture`] was for the spec in the first image, made
/// again for this process: a chooser that reads a process's DWARF or
/// notes per address needs the new one's).
pub type ExecCapture = Rc<dyn Fn(&ExecPlacing) -> Option<CaptureChooser>>;

/// A `Count` or `Record` spec given to the session, placed again in each
/// image a followed process executes.
#[derive(Clone)]
pub(super) struct ExecSpec {
    pub(super) spec: String,
    pub(super) record: bool,
    /// The capture chooser of its probes in each new image.
    pub(super) capture: Option<ExecCapture>,
}

/// The [`Placement::execution`] of a spec that names nothing in the
/// first image, placed in each program a followed process executes: a
/// placeholder, never hit itself.
pub const AT_EXEC: &str = "at exec";

/// The kernel's command name of `pid` (empty when it cannot be read).
pub(super) fn comm_of(pid: i32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim_end_matches('\n').to_string())
        .unwrap_or_default()
}

/// Whether the program process `pid` runs imports `ptrace` (a tracer:
/// strace, gdb, hotprobe), from its dynamic symbols.
fn calls_ptrace(pid: i32) -> bool {
    use object::{Object, ObjectSymbol};
    // Read as needed (the headers and the dynamic symbols), not whole: a
    // debug build of a tracer is hundreds of megabytes.
    let Ok(exe) = std::fs::File::open(format!("/proc/{pid}/exe")) else {
        return false;
    };
    let cache = object::read::ReadCache::new(exe);
    let Ok(file) = object::File::parse(&cache) else {
        return false;
    };
    file.dynamic_symbols()
        .any(|s| s.is_undefined() && s.name() == Ok("ptrace"))
}

/// Whether `e` says `spec` names nothing in this image (a function it
/// does not have, or for a `usdt:` spec a marker no loaded module has):
/// with exec followed, such a spec waits for the next image.
fn names_nothing_here(spec: &str, e: &EngineError) -> bool {
    use hotprobe_symbols::SymbolError as S;
    match e {
        EngineError::Symbol(S::SymbolNotFound { .. }) => true,
        // The resolver's only refusal of a marker spec whose module is
        // known: no such marker in it.
        EngineError::Symbol(S::Unprobeable { .. }) => {
            spec.starts_with(hotprobe_symbols::USDT_PREFIX)
        }
        _ => false,
    }
}

impl Session {
    /// The programs followed processes executed, with the probes placed
    /// in each (see [`SessionConfig::follow_exec`]), in the order of the
    /// execs.
    pub fn exec_images(&self) -> &[ExecImage] {
        &self.exec_images
    }

    /// The command name of the image probe `id` was placed in: the name
    /// after the exec for a probe placed in an [`ExecImage`], else the one
    /// the process had when the session took it.
    pub fn comm_of(&self, id: ProbeId) -> Option<String> {
        for img in &self.exec_images {
            if img.placements.iter().any(|p| p.id == id) {
                return Some(img.comm.clone());
            }
        }
        self.slots
            .get((id.0 >> TARGET_SHIFT) as usize)
            .map(|s| s.first_comm.clone())
    }

    /// The capture of the specs added next, in each image a followed
    /// process executes (see [`ExecCapture`]): kept with each spec as
    /// [`Session::set_capture`]'s chooser is for its first placement.
    /// Without one, the probes placed at an exec capture nothing beyond
    /// their registers.
    pub fn set_exec_capture(&mut self, capture: Option<ExecCapture>) {
        self.exec_capture = capture;
    }

    /// Remembers a `Count`/`Record` spec for the images to come; with
    /// exec followed, a spec that names nothing in this image (a function
    /// of a program the process will execute) is a placement waiting for
    /// the exec rather than an error.
    pub(super) fn remember_for_exec(
        &mut self,
        t: TargetId,
        spec: &str,
        record: bool,
        added: Result<Added, EngineError>,
    ) -> Result<Added, EngineError> {
        if !self.config.follow_exec || self.placing_exec || self.slot(t)?.pid.is_none() {
            return added;
        }
        if !self.exec_specs.iter().any(|s| s.spec == spec) {
            self.exec_specs.push(ExecSpec {
                spec: spec.to_string(),
                record,
                capture: self.exec_capture.clone(),
            });
        }
        match added {
            Err(e) if names_nothing_here(spec, &e) => {
                let is_return = spec.ends_with("%return");
                let (p, rp) = self.trap_form(t, is_return, record, None, true)?;
                let slot = self.slot(t)?;
                let (mut cx, mechs) = slot.parts();
                let id = mechs.trap.add_unarmed(&mut cx, p, rp);
                let comm = slot.first_comm.clone();
                Ok(Added {
                    placements: vec![Placement {
                        id,
                        label: spec.to_string(),
                        addr: RuntimeAddr(0),
                        function: None,
                        module: String::new(),
                        is_return,
                        mechanism: Mechanism::Pending,
                        reason: format!(
                            "not in {comm} ({e}): placed in each program a followed process \
                             executes"
                        ),
                        execution: AT_EXEC.into(),
                        entry_only: None,
                    }],
                    ..Added::default()
                })
            }
            added => added,
        }
    }

    /// Slot `i` executed another program (its old probes are dropped,
    /// their counts kept) and is held at the exec: with exec followed,
    /// every remembered spec is placed in the new image, on the trap
    /// mechanism, before it runs on. What cannot be placed is said in a
    /// notice.
    pub(super) fn follow_exec(&mut self, i: usize) {
        // The old image's stacks stay named with its modules.
        self.retire_stacks(i);
        if !self.slots[i].hold_at_exec {
            return;
        }
        if let Some(pid) = self.slots[i].pid {
            if calls_ptrace(pid) {
                // A tracer (strace, gdb, hotprobe) cannot trace its
                // children while we trace it (they would be ours): it is
                // let go, untraced, so that it works as without us.
                let path = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
                let slot = &mut self.slots[i];
                let r = slot.target.as_target().detach();
                slot.notice(match r {
                    Ok(()) => format!(
                        "pid {pid} executed {}, which calls ptrace: let go without probes so \
                         that its own tracing works",
                        path.display()
                    ),
                    Err(e) => format!("pid {pid}: cannot let it go after its exec: {e}"),
                });
                return;
            }
        }
        // Not started while the probes go in: nothing resumes it midway.
        let started = std::mem::replace(&mut self.slots[i].engine.started, false);
        self.place_in_new_image(i);
        self.slots[i].engine.started = started;
        let t = self.slots[i].target.as_target();
        // The thread stopped at its exec event (a followed process), or
        // parked (a vfork child taken at its exec).
        for th in t.threads() {
            let _ = t.resume(th, hotprobe_target::ResumeMode::Continue);
        }
        if let Err(e) = t.resume_all() {
            let who = t.describe();
            self.slots[i].notice(format!("{who}: cannot resume it after its exec: {e}"));
        }
    }

    pub(super) fn place_in_new_image(&mut self, i: usize) {
        if self.exec_specs.is_empty() {
            return;
        }
        let Some(pid) = self.slots[i].pid else { return };
        let comm = comm_of(pid);
        let path = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap_or_default();
        {
            let slot = &mut self.slots[i];
            slot.execd = true;
            // The old image's pending probes and followable sites mean
            // nothing in the new one.
            slot.pending.clear();
            slot.mechs.trap.followable.clear();
            slot.symbols = None;
            if matches!(slot.agent.state, AgentState::Injectable) {
                slot.agent.state =
                    AgentState::Off("an image after an exec: probes use traps".into());
            }
            match crate::ProcessResolver::new(pid) {
                Ok(r) => {
                    slot.engine.set_symbolizer(r.symbolizer());
                    slot.resolver = Some(Box::new(r));
                }
                Err(e) => {
                    slot.resolver = None;
                    slot.notice(format!(
                        "pid {pid} executed {}: cannot read its symbols ({e}); not probed",
                        path.display()
                    ));
                    return;
                }
            }
        }
        let t = TargetId(i);
        self.placing_exec = true;
        let mut placements = Vec::new();
        let mut missing = Vec::new();
        let placing = ExecPlacing {
            pid,
            image: self.exec_images.len(),
        };
        for s in self.exec_specs.clone() {
            let action = if s.record {
                Action::Record
            } else {
                Action::Count
            };
            let chooser = s.capture.as_ref().and_then(|f| f(&placing));
            let first = std::mem::replace(&mut self.capture, chooser);
            let added = self.add_using(t, &s.spec, action, MechanismChoice::Trap);
            self.capture = first;
            match added {
                Ok(a) => placements.extend(a.placements.into_iter().map(|mut p| {
                    if p.mechanism == Mechanism::Trap {
                        p.reason = "a program taken at its exec: traps (no agent in it)".into();
                    }
                    p
                })),
                Err(e) if names_nothing_here(&s.spec, &e) || not_loaded(&e) => {
                    missing.push(s.spec.clone())
                }
                Err(e) => self.slots[i].notice(format!(
                    "pid {pid} executed {}: cannot probe {}: {e}",
                    path.display(),
                    s.spec
                )),
            }
        }
        self.placing_exec = false;
        let msg = format!(
            "pid {pid} executed {} ({comm}): {} probes placed{}",
            path.display(),
            placements.len(),
            if missing.is_empty() {
                String::new()
            } else {
                format!(", not in it: {}", missing.join(", "))
            }
        );
        self.slots[i].notice(msg);
        self.exec_images.push(ExecImage {
            index: placing.image,
            pid,
            comm,
            path,
            placements,
            missing,
        });
    }

    /// The vfork children of slot `i` that executed a program (held at
    /// their exec): each a target of its own, the specs placed in its
    /// program, then resumed. One that cannot be taken runs on without
    /// probes, with a notice.
    pub(super) fn follow_execd_vfork_children(&mut self, i: usize) {
        let Some(pt) = Slot::process(&mut self.slots[i].target) else {
            return;
        };
        let children = pt.take_execd_vfork_children();
        for child in children {
            let Some(pt) = Slot::process(&mut self.slots[i].target) else {
                return;
            };
            let adopted = pt.adopt_execd_vfork_child(child);
            let mut target = match adopted {
                Ok(t) => t,
                Err(e) => {
                    pt.release_execd_vfork_child(child);
                    self.slots[i].notice(format!(
                        "cannot follow vfork child {child} into its exec: {e}; it runs on                          without probes"
                    ));
                    continue;
                }
            };
            target.share_strays(&self.strays);
            // Its symbols are read when specs are placed in it (not for a
            // program let go at once).
            let t = self.push_slot(
                target.into(),
                None,
                Some(child),
                true,
                AgentState::Off("a program a followed process executed: probes use traps".into()),
            );
            let parent = self.slots[i].pid.unwrap_or(0);
            self.slots[t.0].root = Some(self.slots[i].root.unwrap_or(i));
            self.slots[t.0].notice(format!(
                "pid {parent} vforked {child}: followed into its exec"
            ));
            self.slots[t.0].engine.started = true;
            self.follow_exec(t.0);
        }
    }
}
