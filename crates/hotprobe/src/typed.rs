//! Typed arguments and return values (the CLI's `-a/--auto-args`,
//! `func(a, b)`, `'func name:string p->len'`; the C and Python APIs' typed
//! capture): the DWARF of each probed function's
//! module ([`hotprobe_dwarf`]) says what to read at the entry and the
//! return; values in integer and xmm registers are recorded by whatever
//! mechanism takes the function (the fast path's xmm layout for floats and
//! doubles, [`crate::Session::set_xmm_layout`]) and typed as drained
//! ([`RegisterTyped`]); strings, fields through pointers and stack
//! arguments are copied in the target by the agent on patch and jump
//! sites ([`crate::Session::set_fast_capture`], [`crate::typed_program`]);
//! anything else runs on the trap path ([`crate::Session::set_capture`]).
//! Both hand the bytes to the sink with the event; [`TypedShapes`] turns
//! them back into text.

use crate::{Capture, CaptureChooser, FastCaptureChooser, HitContext, XmmChooser};
use hotprobe_dwarf::{
    capture, format_values, plan_args, plan_auto, ArgExpr, DebugTypes, DwarfError, Fetch, Machine,
    Planned, ShapeItem, Source,
};
use hotprobe_symbols::ResolvedProbe;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Why typed values could not be planned.
#[derive(Debug, thiserror::Error)]
pub enum TypedError {
    /// An argument expression is malformed, names no parameter of the
    /// function, or does not fit its type.
    #[error(transparent)]
    Dwarf(#[from] DwarfError),
    /// Argument names were given for a function without DWARF.
    #[error("{function}: no DWARF for it in {module} (build with -g): argument names need it")]
    NoDwarf {
        /// The function.
        function: String,
        /// Its module.
        module: String,
    },
    /// One function given two different argument lists (two specs, or a
    /// spec and `-a`): the values of one call are typed by one list.
    #[error(
        "{function}: given two argument lists ({first} and {second}): name each function once, \
         with every expression it should show"
    )]
    TwoArgumentLists {
        /// The function.
        function: String,
        /// The list it was placed with first.
        first: String,
        /// The list asked next.
        second: String,
    },
    /// Several functions could not be planned (one line each).
    #[error("{}", join_lines(.0))]
    Several(Vec<TypedError>),
}

fn join_lines(errors: &[TypedError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

/// A probe spec with argument expressions: `greet(name, n)` or
/// `greet name n:string p->len` → (`greet`, expressions). A spec without
/// any gives an empty list.
pub fn split_spec(spec: &str) -> Result<(String, Vec<ArgExpr>), TypedError> {
    let spec = spec.trim();
    let (func, list): (&str, Vec<&str>) = match (spec.find('('), spec.strip_suffix(')')) {
        (Some(open), Some(inner))
            if !spec.contains(char::is_whitespace)
                || open < spec.find(char::is_whitespace).unwrap_or(usize::MAX) =>
        {
            (
                &spec[..open],
                inner[open + 1..]
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .collect(),
            )
        }
        _ => match spec.split_once(char::is_whitespace) {
            Some((f, rest)) => (f, rest.split_whitespace().collect()),
            None => (spec, Vec::new()),
        },
    };
    let exprs = list
        .into_iter()
        .map(|e| e.parse::<ArgExpr>())
        .collect::<Result<Vec<_>, _>>()?;
    Ok((func.to_string(), exprs))
}

/// What is read at the entry and at the return.
type EntryExit = (Vec<Fetch>, Vec<Fetch>);

/// Shapes of the entry and exit values of each typed probe, by run-time
/// address (filled as functions are placed).
pub type ShapeMap = HashMap<u64, (Vec<ShapeItem>, Vec<ShapeItem>)>;

#[path = "typed_register.rs"]
mod register;
pub use register::RegisterTyped;

/// The DWARF of the modules probed so far, and what was planned.
#[derive(Default)]
pub struct Typing {
    /// The process (its maps name each module's file).
    pid: i32,
    modules: RefCell<HashMap<String, Option<Rc<DebugTypes>>>>,
    /// What each placed typed function shows.
    shapes: RefCell<ShapeMap>,
    /// Each module's separate debug file its types came from (none: its
    /// own file's DWARF).
    debug_files: RefCell<HashMap<String, std::path::PathBuf>>,
    /// Typed functions whose types came from elsewhere than their own
    /// file, by address, in the order they were planned.
    sources: RefCell<Vec<(u64, String, TypeSource)>>,
    /// A spec's argument expressions that could not be planned.
    errors: RefCell<Vec<TypedError>>,
    /// Functions without DWARF (shown with their raw registers under `-a`).
    untyped: RefCell<Vec<String>>,
    /// Typed functions whose values are all in integer registers (read
    /// from the recorded registers, on any mechanism), by address.
    register_plans: RefCell<HashMap<u64, EntryExit>>,
    /// Typed functions whose values are all in integer and xmm registers,
    /// offered to the fast path's xmm layout (the number of integer
    /// registers recorded before the xmm ones), by address.
    xmm_plans: RefCell<HashMap<u64, (EntryExit, u8)>>,
    /// Typed functions whose values are copied in the target on the fast
    /// path (strings, fields, stack arguments: [`Typing::fast_chooser_for`]),
    /// by address: an event without the copied bytes (an exit without an
    /// exit program) is typed from its registers.
    fast_plans: RefCell<HashMap<u64, EntryExit>>,
    /// Parameters and their registers per function (`count` conditions).
    param_regs: RefCell<HashMap<u64, Option<ParamRegs>>>,
    /// The argument list each address was planned with (`None`: every
    /// parameter): shapes and plans are kept per address, so a second,
    /// different list for one function is refused.
    lists: RefCell<HashMap<u64, Option<Vec<ArgExpr>>>>,
}

/// Where a function's types came from, when not from the DWARF of its
/// own file (said to the user: [`Typing::type_sources`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TypeSource {
    /// A separate debug file: by `.gnu_debuglink`, build id, or from a
    /// debuginfod cache (a distribution's debug package).
    DebugFile(std::path::PathBuf),
    /// hotprobe's table of libc prototypes: no DWARF for the module.
    LibcPrototypes {
        /// The module (libc.so.6).
        module: String,
    },
}

impl std::fmt::Display for TypeSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TypeSource::DebugFile(p) => write!(f, "{}", p.display()),
            TypeSource::LibcPrototypes { module } => write!(
                f,
                "hotprobe's table of libc prototypes (no DWARF for {module}: its debug \
                 package gives parameter names, fields and every function)"
            ),
        }
    }
}

/// An argument list as the user wrote it, for messages.
fn list_text(exprs: Option<&[ArgExpr]>) -> String {
    match exprs {
        None => "every parameter (-a)".into(),
        Some(e) => format!(
            "({})",
            e.iter()
                .map(|x| x.text.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A function's parameters and the argument register of each (or why it
/// has none; text, as [`crate::cond::NameMap`] takes it).
pub type ParamRegs = Vec<(String, Result<crate::cond::Operand, String>)>;

impl Typing {
    /// For the functions of process `pid`.
    pub fn new(pid: i32) -> Typing {
        Typing {
            pid,
            ..Typing::default()
        }
    }

    /// The DWARF of the module `r` is in (its file, as the process maps
    /// show it; separate debug files are not looked for).
    fn debug_types(&self, r: &ResolvedProbe) -> Option<Rc<DebugTypes>> {
        if let Some(d) = self.modules.borrow().get(&r.module) {
            return d.clone();
        }
        let path = hotprobe_symbols::read_maps(self.pid as u32)
            .ok()?
            .into_iter()
            .find(|m| m.start <= r.addr && r.addr < m.end)?
            .path?;
        self.load_types(r, &path)
    }

    /// The types of `r`'s module from its file `path`, kept for the next
    /// probe in it.
    fn load_types(&self, r: &ResolvedProbe, path: &std::path::Path) -> Option<Rc<DebugTypes>> {
        // The file's own DWARF, else its separate debug file where the
        // distribution puts it (debuglink, build id, debuginfod cache).
        let d = DebugTypes::load(path)
            .ok()
            .or_else(|| {
                let bytes = std::fs::read(path).ok()?;
                let (dbg, _) = hotprobe_symbols::find_debug_file(path, &bytes)?;
                let d = DebugTypes::load(&dbg).ok()?;
                self.debug_files.borrow_mut().insert(r.module.clone(), dbg);
                Some(d)
            })
            .map(Rc::new);
        self.modules
            .borrow_mut()
            .insert(r.module.clone(), d.clone());
        d
    }

    fn plan(&self, r: &ResolvedProbe, exprs: Option<&[ArgExpr]>) -> Option<Planned> {
        if !r.usdt_args.is_empty() {
            // A USDT marker: its note says where each argument is.
            return Some(plan_usdt(&r.usdt_args));
        }
        let func = r.function.clone().unwrap_or_else(|| r.addr.to_string());
        let first = self
            .lists
            .borrow_mut()
            .entry(r.addr.0)
            .or_insert_with(|| exprs.map(<[ArgExpr]>::to_vec))
            .clone();
        if first.as_deref() != exprs {
            self.errors.borrow_mut().push(TypedError::TwoArgumentLists {
                function: func,
                first: list_text(first.as_deref()),
                second: list_text(exprs),
            });
            return None;
        }
        let from_dwarf = self
            .debug_types(r)
            .and_then(|d| d.signature(r.link_addr.0).ok().flatten());
        let source = match &from_dwarf {
            Some(_) => self
                .debug_files
                .borrow()
                .get(&r.module)
                .cloned()
                .map(TypeSource::DebugFile),
            None => Some(TypeSource::LibcPrototypes {
                module: r.module.clone(),
            }),
        };
        let sig = from_dwarf.or_else(|| libc_prototype_of(r));
        if let (Some(_), Some(source)) = (&sig, source) {
            let mut sources = self.sources.borrow_mut();
            if !sources.iter().any(|(a, _, _)| *a == r.addr.0) {
                sources.push((r.addr.0, func.clone(), source));
            }
        }
        let Some(sig) = sig else {
            match exprs {
                Some(_) => self.errors.borrow_mut().push(TypedError::NoDwarf {
                    function: func,
                    module: r.module.clone(),
                }),
                None => self.untyped.borrow_mut().push(func),
            }
            return None;
        };
        match exprs {
            None => Some(plan_auto(&sig, &func)),
            Some(e) => match plan_args(&sig, &func, e) {
                Ok(p) => Some(p),
                Err(e) => {
                    self.errors.borrow_mut().push(e.into());
                    None
                }
            },
        }
    }

    /// The session's chooser for functions added next: every parameter
    /// (`exprs` None, `-a`) or the expressions given.
    pub fn chooser(self: &Rc<Self>, exprs: Option<Vec<ArgExpr>>) -> CaptureChooser {
        let me = self.clone();
        Rc::new(move |r: &ResolvedProbe| -> Option<Capture> {
            let planned = me.plan(r, exprs.as_deref())?;
            me.shapes.borrow_mut().insert(
                r.addr.0,
                (planned.entry_shapes.clone(), planned.exit_shapes.clone()),
            );
            let (entry, exit) = (planned.entry, planned.exit);
            if !planned_needs_more(&entry, &exit) {
                // Integer registers only: any mechanism records them (the
                // fast path too); [`RegisterTyped`] types them as drained.
                me.register_plans
                    .borrow_mut()
                    .insert(r.addr.0, (entry, exit));
                return None;
            }
            Some(Rc::new(
                move |ctx: &mut HitContext<'_>, is_exit: bool, out: &mut Vec<u8>| {
                    let plan = if is_exit { &exit } else { &entry };
                    let mut m = Hit { ctx, xmm: None };
                    capture(plan, &mut m, out);
                },
            ))
        })
    }

    /// The chooser for a spec's functions: its argument expressions, else
    /// every parameter with `auto` (`-a`), else none (registers only).
    pub fn chooser_for(self: &Rc<Self>, exprs: Vec<ArgExpr>, auto: bool) -> Option<CaptureChooser> {
        match (exprs.is_empty(), auto) {
            (false, _) => Some(self.chooser(Some(exprs))),
            (true, true) => Some(self.chooser(None)),
            (true, false) => None,
        }
    }

    /// The session's xmm chooser for a spec's functions (as
    /// [`Typing::chooser_for`]): a function whose values are all in
    /// integer and xmm registers, at least one float or double among them,
    /// is recorded on the fast path with the xmm layout (see
    /// [`crate::XmmChooser`]) instead of through the trap.
    pub fn xmm_chooser_for(self: &Rc<Self>, exprs: Vec<ArgExpr>, auto: bool) -> Option<XmmChooser> {
        let exprs = match (exprs.is_empty(), auto) {
            (false, _) => Some(exprs),
            (true, true) => None,
            (true, false) => return None,
        };
        let me = self.clone();
        Some(Rc::new(move |r: &ResolvedProbe| -> Option<u8> {
            // Planned quietly: errors are reported by the capture chooser,
            // which sees every function this one declines.
            let errors = me.errors.borrow().len();
            let untyped = me.untyped.borrow().len();
            let planned = me.plan(r, exprs.as_deref());
            me.errors.borrow_mut().truncate(errors);
            me.untyped.borrow_mut().truncate(untyped);
            let planned = planned?;
            let k = xmm_layout(&planned.entry, &planned.exit)?;
            me.shapes.borrow_mut().insert(
                r.addr.0,
                (planned.entry_shapes.clone(), planned.exit_shapes.clone()),
            );
            me.xmm_plans
                .borrow_mut()
                .insert(r.addr.0, ((planned.entry, planned.exit), k));
            Some(k)
        }))
    }

    /// The session's chooser of typed values copied in the target (as
    /// [`Typing::chooser_for`]): a function whose entry values need memory
    /// (a string, a field through a pointer, a stack argument) and fit a
    /// capture program ([`crate::typed_program::compile_both`]: a returned
    /// string gets an exit program), is recorded on the fast path with the
    /// programs instead of through the trap (see
    /// [`crate::FastCaptureChooser`]).
    pub fn fast_chooser_for(
        self: &Rc<Self>,
        exprs: Vec<ArgExpr>,
        auto: bool,
    ) -> Option<FastCaptureChooser> {
        let exprs = match (exprs.is_empty(), auto) {
            (false, _) => Some(exprs),
            (true, true) => None,
            (true, false) => return None,
        };
        // A thread under a seccomp filter may be killed for the agent's
        // `process_vm_readv`: such a process keeps the trap's reads.
        if seccomp_in_use(self.pid) {
            return None;
        }
        let me = self.clone();
        Some(Rc::new(move |r: &ResolvedProbe| {
            // Function entries only: a USDT marker or an instruction
            // inside a function is a mid-function hit (its registers and
            // stack are not an entry's).
            if r.offset != 0 || !r.usdt_args.is_empty() {
                return None;
            }
            // Planned quietly, as the xmm chooser does.
            let errors = me.errors.borrow().len();
            let untyped = me.untyped.borrow().len();
            let planned = me.plan(r, exprs.as_deref());
            me.errors.borrow_mut().truncate(errors);
            me.untyped.borrow_mut().truncate(untyped);
            let planned = planned?;
            if !planned_needs_more(&planned.entry, &planned.exit) {
                return None;
            }
            let program = crate::typed_program::compile_both(&planned.entry, &planned.exit)?;
            me.shapes.borrow_mut().insert(
                r.addr.0,
                (planned.entry_shapes.clone(), planned.exit_shapes.clone()),
            );
            me.fast_plans
                .borrow_mut()
                .insert(r.addr.0, (planned.entry, planned.exit));
            Some(program)
        }))
    }

    /// A chooser that types nothing but notes, per function, which
    /// argument register holds each parameter at the entry (for names in
    /// `count` conditions, [`Typing::param_registers`]).
    pub fn name_chooser(self: &Rc<Self>) -> CaptureChooser {
        let me = self.clone();
        Rc::new(move |r: &ResolvedProbe| -> Option<Capture> {
            me.note_params(r, me.debug_types(r));
            None
        })
    }

    /// What [`Typing::name_chooser`] notes, for a probe placed at `r` in
    /// the module whose file is `path` (a library loaded after the probe
    /// was added: the file is read even when the module is unmapped by
    /// the time this is asked).
    pub fn note_params_in(&self, r: &ResolvedProbe, path: &std::path::Path) {
        let cached = self.modules.borrow().get(&r.module).cloned();
        let d = cached.unwrap_or_else(|| self.load_types(r, path));
        self.note_params(r, d);
    }

    /// Notes the parameters of the function at `r` and their argument
    /// registers from its module's types `d` (`None`: no DWARF).
    fn note_params(&self, r: &ResolvedProbe, d: Option<Rc<DebugTypes>>) {
        let func = r.function.clone().unwrap_or_default();
        let sig = d.and_then(|d| d.signature(r.link_addr.0).ok().flatten());
        let regs = sig.map(|sig| {
            let p = plan_auto(&sig, &func);
            sig.params
                .iter()
                .zip(p.entry.iter().zip(&p.entry_shapes))
                .map(|(param, (f, shape))| {
                    use hotprobe_dwarf::Shape as S;
                    let operand = |reg: u8, size: u8, signed: bool| {
                        Ok(crate::cond::Operand::Param { reg, size, signed })
                    };
                    let reg = match (f, &shape.shape) {
                        (_, S::Missing(why)) => Err(why.clone()),
                        (Fetch::Reg(Source::IntArg(k)), s) => match s {
                            S::Signed(n) => operand(*k, *n, true),
                            S::Unsigned(n) => operand(*k, *n, false),
                            S::Bool | S::Char => operand(*k, 1, matches!(s, S::Char)),
                            S::Enum(_) => operand(*k, 4, true),
                            S::Ptr | S::Str => operand(*k, 8, false),
                            _ => Err(format!(
                                "not in an integer register ({})",
                                param.ty.describe()
                            )),
                        },
                        _ => Err(format!(
                            "not in an integer register ({})",
                            param.ty.describe()
                        )),
                    };
                    (param.name.clone(), reg)
                })
                .collect()
        });
        self.param_regs.borrow_mut().insert(r.addr.0, regs);
    }

    /// The parameters of the function placed at `addr` and the argument
    /// register of each (see [`Typing::name_chooser`]); `None` without DWARF.
    pub fn param_registers(&self, addr: u64) -> Option<ParamRegs> {
        self.param_regs.borrow().get(&addr).cloned().flatten()
    }

    /// The functions every parameter was asked of that have no DWARF
    /// (shown with their raw registers), in the order they were placed.
    pub fn untyped(&self) -> Vec<String> {
        self.untyped.borrow().clone()
    }

    /// The typed functions whose types came from elsewhere than their
    /// own file's DWARF (a separate debug file, the libc prototype
    /// table), with where, in the order they were planned.
    pub fn type_sources(&self) -> Vec<(String, TypeSource)> {
        self.sources
            .borrow()
            .iter()
            .map(|(_, f, s)| (f.clone(), s.clone()))
            .collect()
    }

    /// Whether the function placed at `addr` has typed values.
    pub fn is_typed(&self, addr: u64) -> bool {
        self.shapes.borrow().contains_key(&addr)
    }

    /// Fails with what could not be planned (a parameter name the
    /// function does not have, a function without DWARF) since the last
    /// check.
    pub fn check(&self) -> Result<(), TypedError> {
        let mut errors = std::mem::take(&mut *self.errors.borrow_mut());
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(TypedError::Several(errors)),
        }
    }
}

/// Whether a thread of process `pid` runs under seccomp (strict or a
/// filter: `Seccomp:` in its status is not 0), or its threads cannot be
/// read (assumed so).
fn seccomp_in_use(pid: i32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().any(|t| {
        // A thread gone meanwhile has no filter to fear.
        std::fs::read_to_string(t.path().join("status")).is_ok_and(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Seccomp:"))
                .is_some_and(|v| v.trim() != "0")
        })
    })
}

/// The xmm layout a plan fits (the number of integer registers recorded
/// before the xmm ones), when every value is an integer or xmm register
/// (or needs no register), at least one is an xmm register, and they fit
/// the six value words of an entry (an exit holds rax, rdx, xmm0).
fn xmm_layout(entry: &[Fetch], exit: &[Fetch]) -> Option<u8> {
    let (mut ints, mut xmms) = (0u8, 0u8);
    for f in entry {
        match f {
            Fetch::Missing | Fetch::Const(_) => {}
            Fetch::Reg(Source::IntArg(i)) => ints = ints.max(i + 1),
            Fetch::Reg(Source::Xmm(i)) => xmms = xmms.max(i + 1),
            _ => return None,
        }
    }
    let mut exit_xmm = false;
    for f in exit {
        match f {
            Fetch::Missing | Fetch::Const(_) | Fetch::Reg(Source::Rax) => {}
            Fetch::Reg(Source::Xmm(0)) => exit_xmm = true,
            _ => return None,
        }
    }
    (ints <= 6 && ints + xmms <= 6 && (xmms > 0 || exit_xmm)).then_some(ints)
}

fn planned_needs_more(entry: &[Fetch], exit: &[Fetch]) -> bool {
    Planned {
        entry: entry.to_vec(),
        exit: exit.to_vec(),
        ..Planned::default()
    }
    .needs_more_than_registers()
}

/// A stopped thread as [`Machine`] sees it.
struct Hit<'a, 'b> {
    ctx: &'a mut HitContext<'b>,
    xmm: Option<Option<[u64; 16]>>,
}

impl Machine for Hit<'_, '_> {
    fn reg(&mut self, s: Source) -> Option<u64> {
        let r = *self.ctx.regs();
        Some(match s {
            Source::IntArg(i) => self.ctx.arg(i as usize)?,
            Source::Rax => r.rax,
            Source::Xmm(i) => {
                let x = *self
                    .xmm
                    .get_or_insert_with(|| self.ctx.xmm_registers().ok());
                x?.get(i as usize).copied()?
            }
            Source::Stack(off) => {
                let rsp = r.rsp;
                self.ctx.read_u64(rsp.wrapping_add(u64::from(off))).ok()?
            }
            Source::Dwarf(n) => match n {
                0 => r.rax,
                1 => r.rdx,
                2 => r.rcx,
                3 => r.rbx,
                4 => r.rsi,
                5 => r.rdi,
                6 => r.rbp,
                7 => r.rsp,
                8 => r.r8,
                9 => r.r9,
                10 => r.r10,
                11 => r.r11,
                12 => r.r12,
                13 => r.r13,
                14 => r.r14,
                15 => r.r15,
                _ => return None,
            },
        })
    }

    fn read(&mut self, addr: u64, buf: &mut [u8]) -> bool {
        self.ctx.read_memory(addr, buf).is_ok()
    }
}

/// The shapes of each typed probe, by probe id, for printing.
#[derive(Default, Clone)]
pub struct TypedShapes {
    by_probe: HashMap<u32, (Vec<ShapeItem>, Vec<ShapeItem>)>,
}

impl TypedShapes {
    /// From what `typing` planned and where it was placed.
    pub fn new(typing: &Typing, placed: &[crate::Placement]) -> TypedShapes {
        let shapes = typing.shapes.borrow();
        TypedShapes {
            by_probe: placed
                .iter()
                .filter_map(|p| Some((p.id.0, shapes.get(&p.addr.0)?.clone())))
                .collect(),
        }
    }

    /// The same, for a trace's `types.tsv`.
    pub fn value_types(&self) -> hotprobe_trace::ValueTypes {
        let mut t = hotprobe_trace::ValueTypes::default();
        for (id, (e, x)) in &self.by_probe {
            t.insert(*id, e.clone(), x.clone());
        }
        t
    }

    /// The values of a typed event: `Some(texts)`, or `None` for a probe
    /// that is not typed.
    pub fn format(&self, id: u32, exit: bool, data: &[u8]) -> Option<Vec<String>> {
        let (entry, exit_shapes) = self.by_probe.get(&id)?;
        let shapes = if exit { exit_shapes } else { entry };
        Some(match format_values(shapes, data) {
            Ok(v) => v,
            Err(e) => vec![format!("<{e}>")],
        })
    }
}

/// The capture of a USDT marker's arguments at its hit (`None` for a
/// probe that is no marker): each operand as [`plan_usdt`] reads it, in
/// `hotprobe_dwarf::capture`'s format (`count` conditions on them,
/// [`crate::cond::usdt_cond`]).
pub fn usdt_capture(r: &ResolvedProbe) -> Option<Capture> {
    if r.usdt_args.is_empty() {
        return None;
    }
    let plan = plan_usdt(&r.usdt_args).entry;
    Some(Rc::new(
        move |ctx: &mut HitContext<'_>, _exit: bool, out: &mut Vec<u8>| {
            capture(&plan, &mut Hit { ctx, xmm: None }, out);
        },
    ))
}

/// The prototype table's signature of a libc function without DWARF
/// (`hotprobe_dwarf::libc_prototype`), at `r`'s address.
/// A USDT marker's arguments as its note gives them (`arg1`, `arg2`, …):
/// a register, memory at a register plus an offset, or a constant, each
/// of its size and signedness. An operand no fetch expresses (an index
/// register, `%rip`-relative, no base) shows as `<…>` with the reason.
fn plan_usdt(args: &[hotprobe_symbols::UsdtArg]) -> Planned {
    use hotprobe_dwarf::Shape;
    use hotprobe_symbols::UsdtOperand;
    let mut p = Planned::default();
    for (i, a) in args.iter().enumerate() {
        let size = a.size.clamp(1, 8);
        let shape = if a.signed {
            Shape::Signed(size)
        } else {
            Shape::Unsigned(size)
        };
        let (fetch, shape) = match &a.operand {
            UsdtOperand::Register(n) => (Fetch::Reg(Source::Dwarf(*n)), shape),
            UsdtOperand::Constant(c) => (Fetch::Const(*c as u64), shape),
            UsdtOperand::Memory {
                base: Some(b),
                index: None,
                offset,
                rip_relative: false,
            } => (
                Fetch::Load {
                    addr: Box::new(Fetch::Reg(Source::Dwarf(*b))),
                    offset: *offset as u64,
                    size,
                },
                shape,
            ),
            UsdtOperand::Memory { .. } => (
                Fetch::Const(0),
                Shape::Missing("operand not read: indexed or %rip-relative".into()),
            ),
        };
        p.entry.push(fetch);
        p.entry_shapes.push(hotprobe_dwarf::ShapeItem {
            label: format!("arg{}", i + 1),
            shape,
        });
    }
    p
}

fn libc_prototype_of(r: &ResolvedProbe) -> Option<hotprobe_dwarf::Signature> {
    if !(r.module.starts_with("libc.so") || r.module.starts_with("libc-")) || r.offset != 0 {
        return None;
    }
    let mut sig = hotprobe_dwarf::libc_prototype(r.function.as_deref()?)?;
    sig.low_pc = r.link_addr.0;
    Some(sig)
}

#[cfg(test)]
#[path = "typed_tests.rs"]
mod tests;
