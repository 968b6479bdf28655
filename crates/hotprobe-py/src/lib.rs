//! The native part of the Python package `hotprobe` (`hotprobe._native`):
//! a [`hotprobe::Session`] with Python callables as handlers.
//!
//! Handlers go through the session's handler actions (`Action::Handler`,
//! `Action::Return`), so a faster handler path in the session serves them
//! too. [`Session::run`] releases the GIL while the targets run and takes
//! it for each hit whose handler is Python. A handler that raises stops
//! the run, and `run()` raises that exception.

mod cond_count;
mod limits;
mod sink;
mod typed;
use hotprobe::{
    Action, EngineError, HitContext, HitKind, MechanismChoice, Probe as RsProbe, ProbeId,
    Registers, RetProbe, RunEnd, SessionConfig, SpawnOptions, TargetId, KIND_ENTRY, KIND_EXIT,
    KIND_HIT,
};
use pyo3::create_exception;
use pyo3::exceptions::{PyAttributeError, PyException, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use sink::{Events, OnThisThread, Sink};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::ffi::OsString;
use std::path::Path;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Raised by SIGINT while `Session.run()` waits for the targets.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::Relaxed);
}

/// Python's SIGINT handler only flags the signal for the interpreter,
/// which does not run while the targets do: for the length of a run, a
/// handler of our own raises [`INTERRUPTED`] and, installed without
/// `SA_RESTART`, interrupts the loop's blocking wait. Python's comes back
/// on drop.
struct SigintGuard {
    old: libc::sigaction,
}

impl SigintGuard {
    fn install() -> Option<SigintGuard> {
        INTERRUPTED.store(false, Ordering::Relaxed);
        // SAFETY: zeroed sigaction structs are valid starting values; the
        // handler only stores to an atomic (async-signal-safe).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_sigint as extern "C" fn(libc::c_int) as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            let mut old: libc::sigaction = std::mem::zeroed();
            (libc::sigaction(libc::SIGINT, &sa, &mut old) == 0).then_some(SigintGuard { old })
        }
    }
}

impl Drop for SigintGuard {
    fn drop(&mut self) {
        // SAFETY: puts back the action read at install.
        unsafe { libc::sigaction(libc::SIGINT, &self.old, std::ptr::null_mut()) };
    }
}

create_exception!(
    _native,
    HotprobeError,
    PyException,
    "A hotprobe operation failed (a missing symbol, a refused address, a dead target, ...)."
);

fn err(e: EngineError) -> PyErr {
    HotprobeError::new_err(e.to_string())
}

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
struct Session {
    inner: RefCell<hotprobe::Session>,
    shared: Rc<Shared>,
    events: Rc<RefCell<Events>>,
    /// Conditional counts (`Session.count(..., cond=...)`).
    counts: Rc<RefCell<hotprobe::CountSink>>,
    /// Typed captures (`Session.record(..., typed=True)`) and their values.
    typed: RefCell<hotprobe::typed_capture::TypedCapture>,
    started: Cell<bool>,
}

impl Session {
    fn session(&self) -> PyResult<std::cell::RefMut<'_, hotprobe::Session>> {
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

fn target_id(t: usize) -> TargetId {
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
        let pl = added
            .placements
            .first()
            .ok_or_else(|| HotprobeError::new_err(format!("{spec}: not placed")))?;
        Ok(PyProbe {
            session: slf.clone().unbind(),
            id: pl.id.0,
            label: pl.label.clone(),
            mechanism: pl.mechanism.to_string(),
        })
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
        let pl = added
            .placements
            .first()
            .ok_or_else(|| HotprobeError::new_err(format!("{spec}: not placed")))?;
        Ok(PyProbe {
            session: slf.clone().unbind(),
            id: pl.id.0,
            label: pl.label.clone(),
            mechanism: pl.mechanism.to_string(),
        })
    }

    /// Count the hits of every address `spec` names (a pattern names
    /// every matching function; `%return` counts returns), each on the
    /// cheapest mechanism that fits. Returns a `Count`. With `cond`
    /// (`"arg0 > 256"`), count the calls whose arguments satisfy it
    /// instead: returns a `ConditionalCount`.
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

fn placed(slf: &Bound<'_, Session>, added: &hotprobe::Added) -> Vec<PyProbe> {
    added
        .placements
        .iter()
        .map(|p| PyProbe {
            session: slf.clone().unbind(),
            id: p.id.0,
            label: p.label.clone(),
            mechanism: p.mechanism.to_string(),
        })
        .collect()
}

/// A probe's counters.
#[pyclass(frozen, get_all, module = "hotprobe")]
#[derive(Clone, Copy)]
struct Stats {
    /// Hits with the probe enabled.
    hits: u64,
    /// Hits not handled, calls beyond `maxactive`.
    nmissed: u64,
    /// Return handler runs (return probes), returns counted.
    returns: u64,
    /// Followed calls left without a return.
    abandoned: u64,
}

#[pymethods]
impl Stats {
    fn __repr__(&self) -> String {
        format!(
            "Stats(hits={}, nmissed={}, returns={}, abandoned={})",
            self.hits, self.nmissed, self.returns, self.abandoned
        )
    }
}

fn stats_of(session: &Py<Session>, py: Python<'_>, id: u32) -> PyResult<Stats> {
    let s = session.borrow(py);
    let st = s
        .session()?
        .stats(ProbeId(id))
        .ok_or_else(|| HotprobeError::new_err(format!("no probe with id {id}")))?;
    Ok(Stats {
        hits: st.hits,
        nmissed: st.nmissed,
        returns: st.returns,
        abandoned: st.abandoned,
    })
}

/// A placed probe: its id, label and mechanism, counters, enable/disable.
#[pyclass(unsendable, name = "Probe", module = "hotprobe")]
struct PyProbe {
    session: Py<Session>,
    /// The session's probe id.
    #[pyo3(get)]
    id: u32,
    /// What it probes (the spec, or the function for a pattern).
    #[pyo3(get)]
    label: String,
    /// How hits execute (patch, jump, trap, stub, ...).
    #[pyo3(get)]
    mechanism: String,
}

#[pymethods]
impl PyProbe {
    /// The probe's counters now.
    #[getter]
    fn stats(&self, py: Python<'_>) -> PyResult<Stats> {
        stats_of(&self.session, py, self.id)
    }

    /// Hits so far.
    #[getter]
    fn hits(&self, py: Python<'_>) -> PyResult<u64> {
        Ok(self.stats(py)?.hits)
    }

    /// Enable the probe.
    fn enable(&self, py: Python<'_>) -> PyResult<()> {
        let s = self.session.borrow(py);
        let r = s.session()?.set_enabled(ProbeId(self.id), true);
        r.map_err(err)
    }

    /// Disable the probe: its handlers do not run, its hits are not counted.
    fn disable(&self, py: Python<'_>) -> PyResult<()> {
        let s = self.session.borrow(py);
        let r = s.session()?.set_enabled(ProbeId(self.id), false);
        r.map_err(err)
    }

    /// Remove the probe (its original code is restored).
    fn remove(&self, py: Python<'_>) -> PyResult<()> {
        let s = self.session.borrow(py);
        let r = s.session()?.remove_probe(ProbeId(self.id));
        r.map_err(err)
    }

    fn __repr__(&self) -> String {
        format!(
            "Probe(id={}, label={:?}, mechanism={:?})",
            self.id, self.label, self.mechanism
        )
    }
}

/// The probes a `Session.count` placed, and their counts.
#[pyclass(unsendable, module = "hotprobe")]
struct Count {
    session: Py<Session>,
    probes: Vec<PyProbe>,
    /// Matches that could not be probed: (label, reason).
    #[pyo3(get)]
    skipped: Vec<(String, String)>,
}

#[pymethods]
impl Count {
    /// Hits of every probe, summed.
    #[getter]
    fn hits(&self, py: Python<'_>) -> PyResult<u64> {
        let mut n = 0;
        for p in &self.probes {
            n += stats_of(&self.session, py, p.id)?.hits;
        }
        Ok(n)
    }

    /// Counters per probe: {label: Stats}.
    fn by_label<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for p in &self.probes {
            d.set_item(&p.label, stats_of(&self.session, py, p.id)?)?;
        }
        Ok(d)
    }

    /// The probes placed.
    #[getter]
    fn probes(&self, py: Python<'_>) -> Vec<PyProbe> {
        self.probes
            .iter()
            .map(|p| PyProbe {
                session: p.session.clone_ref(py),
                id: p.id,
                label: p.label.clone(),
                mechanism: p.mechanism.clone(),
            })
            .collect()
    }
}

/// One recorded event.
#[pyclass(frozen, get_all, module = "hotprobe")]
#[derive(Clone)]
struct Event {
    /// "entry", "exit" or "hit".
    kind: &'static str,
    /// The function (or probe label).
    function: String,
    /// The probe id.
    probe: u32,
    /// The thread.
    tid: u32,
    /// The mechanism's timestamp (TSC ticks on the fast path).
    ts: u64,
    /// Argument registers (entry, hit).
    args: Vec<u64>,
    /// The return value (exit).
    ret: Option<u64>,
}

#[pymethods]
impl Event {
    fn __repr__(&self) -> String {
        format!(
            "Event(kind={:?}, function={:?}, tid={}, args={:?}, ret={:?})",
            self.kind, self.function, self.tid, self.args, self.ret
        )
    }
}

/// What a `Session.record` placed, and the events recorded so far.
#[pyclass(unsendable, module = "hotprobe")]
struct Recording {
    session: Py<Session>,
    probes: Vec<PyProbe>,
    labels: HashMap<u32, String>,
}

#[pymethods]
impl Recording {
    /// The events of these probes recorded so far, in the order drained
    /// (per thread in time order).
    #[getter]
    fn events(&self, py: Python<'_>) -> Vec<Event> {
        let s = self.session.borrow(py);
        let ev = s.events.borrow();
        ev.events
            .iter()
            .filter_map(|e| {
                let function = self.labels.get(&e.probe_id)?.clone();
                let n = (e.nargs as usize).min(e.args.len());
                let (kind, args, ret) = match e.kind {
                    KIND_ENTRY => ("entry", e.args[..n].to_vec(), None),
                    KIND_HIT => ("hit", e.args[..n].to_vec(), None),
                    KIND_EXIT => ("exit", Vec::new(), (n > 0).then(|| e.args[0])),
                    _ => return None,
                };
                Some(Event {
                    kind,
                    function,
                    probe: e.probe_id,
                    tid: e.tid,
                    ts: e.tsc,
                    args,
                    ret,
                })
            })
            .collect()
    }

    /// Events lost in full rings (all recordings of the session).
    #[getter]
    fn lost(&self, py: Python<'_>) -> u64 {
        self.session.borrow(py).events.borrow().lost
    }

    /// The probes placed.
    #[getter]
    fn probes(&self, py: Python<'_>) -> Vec<PyProbe> {
        self.probes
            .iter()
            .map(|p| PyProbe {
                session: p.session.clone_ref(py),
                id: p.id,
                label: p.label.clone(),
                mechanism: p.mechanism.clone(),
            })
            .collect()
    }
}

/// The context of a hit, valid during the handler call only: the thread's
/// registers as attributes (`ctx.rdi`, `ctx.rax = 5`), memory (`read`,
/// `write`), the probe, `stop()`.
#[pyclass(unsendable, module = "hotprobe")]
struct Context {
    ptr: Cell<*mut HitContext<'static>>,
}

/// The register `name` of `r`, writable.
fn reg<'a>(r: &'a mut Registers, name: &str) -> Option<&'a mut u64> {
    Some(match name {
        "rax" => &mut r.rax,
        "rbx" => &mut r.rbx,
        "rcx" => &mut r.rcx,
        "rdx" => &mut r.rdx,
        "rsi" => &mut r.rsi,
        "rdi" => &mut r.rdi,
        "rbp" => &mut r.rbp,
        "rsp" => &mut r.rsp,
        "r8" => &mut r.r8,
        "r9" => &mut r.r9,
        "r10" => &mut r.r10,
        "r11" => &mut r.r11,
        "r12" => &mut r.r12,
        "r13" => &mut r.r13,
        "r14" => &mut r.r14,
        "r15" => &mut r.r15,
        "rip" => &mut r.rip,
        "rflags" | "eflags" => &mut r.rflags,
        "fs_base" => &mut r.fs_base,
        "gs_base" => &mut r.gs_base,
        _ => return None,
    })
}

const REGS: [&str; 18] = [
    "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11", "r12", "r13",
    "r14", "r15", "rip", "rflags",
];

impl Context {
    /// Runs `f` on the hit's context, or fails once the handler returned.
    fn with<R>(&self, f: impl FnOnce(&mut HitContext<'static>) -> PyResult<R>) -> PyResult<R> {
        let p = self.ptr.get();
        if p.is_null() {
            return Err(PyRuntimeError::new_err(
                "the handler context is valid only during its handler's call",
            ));
        }
        // SAFETY: non-null only during the handler call, where it is the
        // engine's `&mut HitContext` (set by `py_handler`, cleared when the
        // call returns); the borrow does not leave `f`, and `f` cannot reach
        // this context again (no Python code runs inside it), so it is the
        // only one; the context is unsendable (used on this thread only).
        f(unsafe { &mut *p })
    }
}

fn target_err(e: hotprobe::TargetError) -> PyErr {
    HotprobeError::new_err(e.to_string())
}

#[pymethods]
impl Context {
    fn __getattr__(&self, name: &str) -> PyResult<u64> {
        self.with(|c| {
            let mut r = *c.regs();
            reg(&mut r, name).copied().ok_or_else(|| {
                PyAttributeError::new_err(format!("no register or attribute {name:?}"))
            })
        })
    }

    fn __setattr__(&self, name: &str, value: u64) -> PyResult<()> {
        self.with(|c| {
            let r = reg(c.regs_mut(), name).ok_or_else(|| {
                PyAttributeError::new_err(format!("{name:?} is not a writable register"))
            })?;
            *r = value;
            Ok(())
        })
    }

    /// Every general register: {name: value}.
    fn regs<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let mut r = self.with(|c| Ok(*c.regs()))?;
        let d = PyDict::new(py);
        for n in REGS {
            if let Some(v) = reg(&mut r, n) {
                d.set_item(n, *v)?;
            }
        }
        Ok(d)
    }

    /// The `n`th integer argument at function entry (rdi, rsi, rdx, rcx,
    /// r8, r9); in a return handler, those the call was made with.
    fn arg(&self, n: usize) -> PyResult<u64> {
        self.with(|c| {
            c.arg(n).ok_or_else(|| {
                PyValueError::new_err(format!("argument {n}: only 6 are in registers"))
            })
        })
    }

    /// The return value (rax), in a return handler.
    #[getter]
    fn return_value(&self) -> PyResult<u64> {
        self.with(|c| Ok(c.return_value()))
    }

    /// Read `n` bytes (at most 1 MiB) of target memory at `addr`.
    fn read<'py>(&self, py: Python<'py>, addr: u64, n: usize) -> PyResult<Bound<'py, PyBytes>> {
        let mut buf = vec![0u8; limits::read_len(n)?];
        self.with(|c| c.read_memory(addr, &mut buf).map_err(target_err))?;
        Ok(PyBytes::new(py, &buf))
    }

    /// Write `data` to target memory at `addr`.
    fn write(&self, addr: u64, data: &[u8]) -> PyResult<()> {
        self.with(|c| c.write_memory(addr, data).map_err(target_err))
    }

    /// Read a little-endian u64 at `addr`.
    fn read_u64(&self, addr: u64) -> PyResult<u64> {
        self.with(|c| c.read_u64(addr).map_err(target_err))
    }

    /// Read a NUL-terminated string of at most `max` (≤ 1 MiB) bytes at `addr`.
    #[pyo3(signature = (addr, max = 4096))]
    fn read_cstr(&self, addr: u64, max: usize) -> PyResult<String> {
        let max = limits::read_len(max)?;
        self.with(|c| c.read_cstr(addr, max).map_err(target_err))
    }

    /// `function+0xoff [module]` for an address, if known.
    fn symbolize(&self, addr: u64) -> PyResult<Option<String>> {
        self.with(|c| Ok(c.symbolize(addr)))
    }

    /// Stop the session's run after this hit.
    fn stop(&self) -> PyResult<()> {
        self.with(|c| {
            c.stop();
            Ok(())
        })
    }

    /// The probe id whose handler runs.
    #[getter]
    fn probe(&self) -> PyResult<u32> {
        self.with(|c| Ok(c.probe().0))
    }

    /// "pre", "post", "entry", "ret" or "watch".
    #[getter]
    fn kind(&self) -> PyResult<&'static str> {
        self.with(|c| {
            Ok(match c.kind() {
                HitKind::Pre => "pre",
                HitKind::Post => "post",
                HitKind::Entry => "entry",
                HitKind::Return => "ret",
                HitKind::Watch => "watch",
            })
        })
    }

    /// The probed address.
    #[getter]
    fn addr(&self) -> PyResult<u64> {
        self.with(|c| Ok(c.addr().0))
    }

    /// The thread that hit the probe.
    #[getter]
    fn thread(&self) -> PyResult<u64> {
        self.with(|c| Ok(c.thread().0))
    }
}

/// The rows of a trace directory written by `hotprobe record`: one tuple
/// per record, `(tid, kind, function, ts_ns, dur_ns, args, ret, lost)`,
/// kind one of "call" (an entry and its exit), "entry", "exit", "hit",
/// "lost"; threads one after the other, each in time order.
#[pyfunction]
#[allow(clippy::type_complexity)]
fn read_trace(
    dir: &str,
) -> PyResult<
    Vec<(
        u32,
        &'static str,
        Option<String>,
        u64,
        Option<u64>,
        Vec<u64>,
        Option<u64>,
        u64,
    )>,
> {
    use hotprobe_trace::Record;
    let terr = |e: hotprobe_trace::TraceError| HotprobeError::new_err(format!("{dir}: {e}"));
    let r = hotprobe_trace::TraceReader::open(dir).map_err(terr)?;
    let tb = r.time_base();
    let name = |p: u32| Some(r.symbols().name(p).into_owned());
    let mut rows = Vec::new();
    for th in r.threads().map_err(terr)? {
        let tid = th.tid();
        for rec in th {
            let rec = rec.map_err(terr)?;
            rows.push(match rec {
                Record::Call {
                    ts,
                    dur,
                    probe,
                    args,
                    ret,
                } => (
                    tid,
                    "call",
                    name(probe),
                    tb.to_ns(ts),
                    Some(tb.to_ns(ts + dur).saturating_sub(tb.to_ns(ts))),
                    args.as_slice().to_vec(),
                    ret,
                    0,
                ),
                Record::Entry { ts, probe, args } => (
                    tid,
                    "entry",
                    name(probe),
                    tb.to_ns(ts),
                    None,
                    args.as_slice().to_vec(),
                    None,
                    0,
                ),
                Record::Exit { ts, probe, ret, .. } => (
                    tid,
                    "exit",
                    name(probe),
                    tb.to_ns(ts),
                    None,
                    Vec::new(),
                    ret,
                    0,
                ),
                Record::Hit { ts, probe, args } => (
                    tid,
                    "hit",
                    name(probe),
                    tb.to_ns(ts),
                    None,
                    args.as_slice().to_vec(),
                    None,
                    0,
                ),
                Record::Lost { ts, count } => (
                    tid,
                    "lost",
                    None,
                    tb.to_ns(ts),
                    None,
                    Vec::new(),
                    None,
                    count,
                ),
            });
        }
    }
    Ok(rows)
}

/// The native module of the `hotprobe` package.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Session>()?;
    m.add_class::<PyProbe>()?;
    m.add_class::<Count>()?;
    m.add_class::<cond_count::ConditionalCount>()?;
    m.add_class::<Recording>()?;
    m.add_class::<typed::TypedRecording>()?;
    m.add_class::<Event>()?;
    m.add_class::<Stats>()?;
    m.add_class::<Context>()?;
    m.add("HotprobeError", m.py().get_type::<HotprobeError>())?;
    m.add_function(wrap_pyfunction!(read_trace, m)?)?;
    Ok(())
}
