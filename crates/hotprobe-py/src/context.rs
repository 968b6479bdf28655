//! The context a Python handler is called with (`Context`): registers as
//! attributes, arguments, target memory, `stop()`.

use crate::{limits, HotprobeError};
use hotprobe::{HitContext, HitKind, Registers};
use pyo3::exceptions::{PyAttributeError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::cell::Cell;

/// The context of a hit, valid during the handler call only: the thread's
/// registers as attributes (`ctx.rdi`, `ctx.rax = 5`), memory (`read`,
/// `write`), the probe, `stop()`.
#[pyclass(unsendable, module = "hotprobe")]
pub(crate) struct Context {
    /// The hit's context while the handler runs, null afterwards.
    pub(crate) ptr: Cell<*mut HitContext<'static>>,
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
