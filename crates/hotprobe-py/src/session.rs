//! The `Session` class: targets, probes with Python handlers, counts and
//! recordings, the event loop.

use crate::probe::{first_placed, placed, Count, PyProbe};
use crate::recording::Recording;
use crate::sigint::{SigintGuard, INTERRUPTED};
use crate::sink::{Events, OnThisThread, Sink};
use crate::{cond_count, context::Context, err, typed};
use hotprobe::{
    Action, HitContext, MechanismChoice, Probe as RsProbe, RetProbe, RunEnd, SessionConfig,
    SpawnOptions, TargetId,
};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::cell::{Cell, RefCell};
use std::ffi::OsString;
use std::path::Path;
use std::rc::Rc;

/// What the session and its handlers share.
#[derive(Default)]
struct Shared {
    /// `Session.stop()` was called: the loop stops after the current hit.
    stop: Cell<bool>,
    /// The first exception a handler raised in this run.
    error: RefCell<Option<PyErr>>,
}

/// A probing session: targets, probes, the event loop.
///
/// ```python
/// s = hotprobe.Session()
/// t = s.spawn(["./prog", "10"])
/// p = s.probe(t, "compute", pre=lambda ctx: print(ctx.rdi))
/// s.run()
/// print(p.stats.hits)
/// ```
#[pyclass(unsendable, module = "hotprobe")]
pub(crate) struct Session {
    inner: RefCell<hotprobe::Session>,
    shared: Rc<Shared>,
    /// Recorded events (`Session.record`), read by the recordings.
    pub(crate) events: Rc<RefCell<Events>>,
    /// Conditional counts (`Session.count(..., cond=...)`).
    pub(crate) counts: Rc<RefCell<hotprobe::CountSink>>,
    /// Typed captures (`Session.record(..., typed=True)`) and their values.
    pub(crate) typed: RefCell<hotprobe::typed_capture::TypedCapture>,
    started: Cell<bool>,
}

impl Session {
    /// The library's session, refused while a run holds it (a handler
    /// calling back into the session).
    pub(crate) fn session(&self) -> PyResult<std::cell::RefMut<'_, hotprobe::Session>> {
        self.inner
            .try_borrow_mut()
            .map_err(|_| PyRuntimeError::new_err("the session is running (called from a handler?)"))
    }

    fn handler(&self, py: Python<'_>, f: Py<PyAny>) -> PyResult<impl FnMut(&mut HitContext<'_>)> {
        if !f.bind(py).is_callable() {
            return Err(PyValueError::new_err("a handler must be callable"));
        }
        Ok(py_handler(f, self.shared.clone()))
    }
}

/// A Rust handler calling the Python callable `f` with a [`Context`],
/// the GIL taken for the call.
fn py_handler(f: Py<PyAny>, shared: Rc<Shared>) -> impl FnMut(&mut HitContext<'_>) {
    move |ctx| {
        if shared.error.borrow().is_some() {
            // A handler raised: the run is stopping, no more Python.
            ctx.stop();
            return;
        }
        let raised = Python::with_gil(|py| {
            let p: *mut HitContext<'static> = (ctx as *mut HitContext<'_>).cast();
            let c = match Py::new(py, Context { ptr: Cell::new(p) }) {
                Ok(c) => c,
                Err(e) => return Some(e),
            };
            let r = f.call1(py, (c.clone_ref(py),));
            // The context outlives the call only as a dead object.
            c.borrow(py).ptr.set(std::ptr::null_mut());
            r.err()
        });
        if let Some(e) = raised {
            *shared.error.borrow_mut() = Some(e);
            ctx.stop();
        }
        if shared.stop.get() {
            ctx.stop();
        }
    }
}

pub(crate) fn target_id(t: usize) -> TargetId {
    TargetId(t)
}

/// A file descriptor from an int or an object with `fileno()`.
fn fd_of(o: &Bound<'_, PyAny>) -> PyResult<i32> {
    if let Ok(fd) = o.extract::<i32>() {
        return Ok(fd);
    }
    o.call_method0("fileno")?.extract::<i32>()
}

fn file_of(o: Option<&Bound<'_, PyAny>>) -> PyResult<Option<std::fs::File>> {
    let Some(o) = o else { return Ok(None) };
    let fd = fd_of(o)?;
    // SAFETY: `fd` is open (the caller's file object or descriptor), borrowed
    // only to duplicate it.
    let b = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let owned = b
        .try_clone_to_owned()
        .map_err(|e| PyValueError::new_err(format!("descriptor {fd}: {e}")))?;
    Ok(Some(std::fs::File::from(owned)))
}

#[pymethods]
impl Session {
    /// A session. `mechanism`: how count and record probes are placed
    /// ("auto": patch, then jump, then trap; "patch", "jump", "trap");
    /// `maxactive`: live calls a trap `%return` count follows at once;
    /// `record_args`: argument registers recorded per entry.
    #[new]
    #[pyo3(signature = (mechanism = "auto", maxactive = 64, follow_forks = false, force = false, record_args = None))]
    fn new(
        mechanism: &str,
        maxactive: usize,
        follow_forks: bool,
        force: bool,
        record_args: Option<u32>,
    ) -> PyResult<Self> {
        let mut c = SessionConfig {
            mechanism: match mechanism {
                "auto" => MechanismChoice::Auto,
                "patch" => MechanismChoice::Patch,
                "jump" => MechanismChoice::Jump,
                "trap" => MechanismChoice::Trap,
                m => {
                    return Err(PyValueError::new_err(format!(
                        "mechanism {m:?}: expected auto, patch, jump or trap"
                    )))
                }
            },
            maxactive,
            follow_forks,
            force,
            ..SessionConfig::default()
        };
        if maxactive == 0 {
            return Err(PyValueError::new_err("maxactive must be at least 1"));
        }
        if let Some(n) = record_args {
            c.fast_path.record_args = n as _;
        }
        Ok(Session {
            inner: RefCell::new(hotprobe::Session::with_config(c)),
            shared: Rc::new(Shared::default()),
            events: Rc::new(RefCell::new(Events::default())),
            counts: Rc::new(RefCell::new(hotprobe::CountSink::new(false))),
            typed: RefCell::default(),
            started: Cell::new(false),
        })
    }

    /// Start `argv[0]` with the arguments `argv[1:]`, stopped until `run()`.
    /// `stdin`/`stdout`/`stderr`: file objects or descriptors (default:
    /// this process's). Returns the target id.
    #[pyo3(signature = (argv, stdin = None, stdout = None, stderr = None))]
    fn spawn(
        &self,
        argv: Vec<String>,
        stdin: Option<&Bound<'_, PyAny>>,
        stdout: Option<&Bound<'_, PyAny>>,
        stderr: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<usize> {
        let Some((prog, args)) = argv.split_first() else {
            return Err(PyValueError::new_err("argv is empty"));
        };
        let args: Vec<OsString> = args.iter().map(OsString::from).collect();
        let opts = SpawnOptions {
            stdin: file_of(stdin)?,
            stdout: file_of(stdout)?,
            stderr: file_of(stderr)?,
            ..SpawnOptions::default()
        };
        let t = self
            .session()?
            .spawn_with(Path::new(prog), &args, &opts)
            .map_err(err)?;
        Ok(t.0)
    }

    /// Attach to process `pid` (every thread), stopped until `run()`.
    /// Returns the target id.
    fn attach(&self, pid: i32) -> PyResult<usize> {
        Ok(self.session()?.attach(pid).map_err(err)?.0)
    }

    /// The process id of a target.
    fn pid(&self, target: usize) -> PyResult<Option<i32>> {
        Ok(self.session()?.pid(target_id(target)))
    }

    /// A probe on the instruction `spec` names (`[module:]function[+off]`,
    /// `[module:]0xADDR`, `file.c:LINE`): `pre(ctx)` runs before it,
    /// `post(ctx)` after it.
    #[pyo3(signature = (target, spec, pre = None, post = None))]
    fn probe(
        slf: &Bound<'_, Self>,
        target: usize,
        spec: &str,
        pre: Option<Py<PyAny>>,
        post: Option<Py<PyAny>>,
    ) -> PyResult<PyProbe> {
        let py = slf.py();
        let me = slf.borrow();
        let mut p = RsProbe::new();
        if let Some(f) = pre {
            p = p.pre(me.handler(py, f)?);
        }
        if let Some(f) = post {
            p = p.post(me.handler(py, f)?);
        }
        let added = me
            .session()?
            .add(target_id(target), spec, Action::Handler(p))
            .map_err(err)?;
        first_placed(slf, &added, spec)
    }

    /// A return probe on the function `spec` names: `entry(ctx)` when a
    /// call enters, `ret(ctx)` when it returns (`ctx.rax` is the return
    /// value and may be set). At most `maxactive` calls are followed at
    /// once (more are counted in `nmissed`).
    #[pyo3(signature = (target, spec, ret = None, entry = None, maxactive = 16))]
    fn retprobe(
        slf: &Bound<'_, Self>,
        target: usize,
        spec: &str,
        ret: Option<Py<PyAny>>,
        entry: Option<Py<PyAny>>,
        maxactive: usize,
    ) -> PyResult<PyProbe> {
        let py = slf.py();
        let me = slf.borrow();
        if maxactive == 0 {
            return Err(PyValueError::new_err("maxactive must be at least 1"));
        }
        let mut rp = RetProbe::new(maxactive);
        if let Some(f) = entry {
            rp = rp.entry(me.handler(py, f)?);
        }
        if let Some(f) = ret {
            rp = rp.ret(me.handler(py, f)?);
        }
        let added = me
            .session()?
            .add(target_id(target), spec, Action::Return(rp))
            .map_err(err)?;
        first_placed(slf, &added, spec)
    }

    /// Count the hits of every address `spec` names (a pattern names
    /// every matching function; `%return` counts returns), each on the
    /// cheapest mechanism that fits. Returns a `Count`. With `cond`
    /// (`"arg0 > 256"`, or with the names of the function's parameters
    /// from its DWARF: `"size > 256 && key < 0"`), count the calls whose
    /// arguments satisfy it instead: returns a `ConditionalCount`. A bad
    /// condition (or a parameter the function does not have) raises
    /// ValueError, and leaves nothing placed.
    #[pyo3(signature = (target, spec, cond = None))]
    fn count(
        slf: &Bound<'_, Self>,
        target: usize,
        spec: &str,
        cond: Option<&str>,
    ) -> PyResult<PyObject> {
        if let Some(cond) = cond {
            return cond_count::count_if(slf, target, spec, cond);
        }
        let me = slf.borrow();
        let added = me
            .session()?
            .add(target_id(target), spec, Action::Count)
            .map_err(err)?;
        let count = Count {
            session: slf.clone().unbind(),
            probes: placed(slf, &added),
            skipped: added
                .skipped
                .iter()
                .map(|s| (s.label.clone(), s.reason.clone()))
                .collect(),
        };
        Ok(Py::new(slf.py(), count)?.into_any())
    }

    /// Record an entry event (with the first argument registers) and an
    /// exit event (with the return value) of every function `spec` names.
    /// Returns a `Recording` whose `events` fill while the session runs.
    /// With `typed=True`, the parameters and return values typed from
    /// DWARF: returns a `TypedRecording` whose `calls` fill.
    #[pyo3(signature = (target, spec, typed = false))]
    fn record(slf: &Bound<'_, Self>, target: usize, spec: &str, typed: bool) -> PyResult<PyObject> {
        if typed {
            return typed::record_typed(slf, target, spec);
        }
        let me = slf.borrow();
        let added = me
            .session()?
            .add(target_id(target), spec, Action::Record)
            .map_err(err)?;
        let labels = added
            .placements
            .iter()
            .map(|p| {
                (
                    p.id.0,
                    p.function.clone().unwrap_or_else(|| p.label.clone()),
                )
            })
            .collect();
        let rec = Recording {
            session: slf.clone().unbind(),
            probes: placed(slf, &added),
            labels,
        };
        Ok(Py::new(slf.py(), rec)?.into_any())
    }

    /// Let the targets run and handle their events until a handler calls
    /// `ctx.stop()` or `Session.stop()` ("stopped"), or every target is
    /// gone ("exited"). A handler's exception stops the run and is raised
    /// here; Ctrl-C (SIGINT, in the main thread) raises KeyboardInterrupt.
    /// The GIL is released while the targets run.
    fn run(&self, py: Python<'_>) -> PyResult<&'static str> {
        let mut s = self.session()?;
        if !self.started.get() {
            s.start().map_err(err)?;
            self.started.set(true);
        }
        self.shared.stop.set(false);
        let sink = Sink(self.events.clone(), self.counts.clone());
        // Signal handlers belong to the main thread in Python: elsewhere
        // the run is not interruptible by Ctrl-C.
        let main_thread = py
            .import("threading")
            .and_then(|t| {
                Ok(t.call_method0("current_thread")?
                    .is(&t.call_method0("main_thread")?))
            })
            .unwrap_or(false);
        let guard = if main_thread {
            SigintGuard::install()
        } else {
            None
        };
        // Typed captures' events are kept as values, the rest as above.
        let job = OnThisThread((&mut *s, sink, &mut *self.typed.borrow_mut()));
        let r = py.allow_threads(move || {
            let (s, mut sink, typed) = job.into_inner();
            OnThisThread(typed.with_sink(Some(&mut sink), |k| s.run_with(&INTERRUPTED, Some(k))))
        });
        drop(guard);
        let r = r.into_inner();
        if let Some(e) = self.shared.error.borrow_mut().take() {
            return Err(e);
        }
        Ok(match r.map_err(err)? {
            RunEnd::Stopped => "stopped",
            RunEnd::AllExited => "exited",
            RunEnd::Interrupted => {
                return Err(pyo3::exceptions::PyKeyboardInterrupt::new_err(
                    "hotprobe run interrupted (the probes stay: run() again, or detach())",
                ))
            }
        })
    }

    /// Stop the run after the current hit (call it from a handler).
    fn stop(&self) {
        self.shared.stop.set(true);
    }

    /// Detach from every target: probes removed, original code restored,
    /// the programs run on.
    fn detach(&self) -> PyResult<()> {
        self.session()?.detach().map_err(err)
    }

    /// How a target ended: ("exited", code), ("signaled", signal),
    /// ("detached", 0) after `detach()` (it runs on), ("disconnected", 0)
    /// for a lost guest, or None while it is alive.
    fn exit_status(&self, target: usize) -> PyResult<Option<(&'static str, i32)>> {
        Ok(match self.session()?.exit_status(target_id(target)) {
            Some(hotprobe::ExitStatus::Code(c)) => Some(("exited", c)),
            Some(hotprobe::ExitStatus::Signal(c)) => Some(("signaled", c)),
            Some(hotprobe::ExitStatus::Disconnected(why)) if why == "detached" => {
                Some(("detached", 0))
            }
            Some(hotprobe::ExitStatus::Disconnected(_)) => Some(("disconnected", 0)),
            None => None,
        })
    }
}
