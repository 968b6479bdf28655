//! From a [`Signature`] to what is read at the entry and the return.
//!
//! At a function's first instruction the parameters are where the System
//! V AMD64 ABI puts them: INTEGER-class values (integers, `bool`, `char`,
//! enums, pointers) in rdi, rsi, rdx, rcx, r8, r9 in order, then on the
//! stack; `float`/`double` in xmm0–xmm7 in their own order, then on the
//! stack; a struct returned in memory takes rdi first. That holds at `-O0`
//! and `-O2` alike — DWARF's locations may say "optimised out" for a
//! parameter whose register the body reuses, but the entry comes before any
//! reuse. gcc's clones (`f.isra.0`, `f.constprop.0`, `f.part.0`) do not keep
//! the declared signature: for them only DWARF's own location at the entry
//! is trusted, and a parameter without one prints `<optimised out>`. The
//! same holds for a function DWARF marks `DW_CC_nocall` (rustc/LLVM
//! dropped arguments) or with a constant parameter (`DW_AT_const_value`,
//! a constant `DW_OP_stack_value`): constants print as such, values DWARF
//! computes from registers (`DW_OP_breg4 +0; …; DW_OP_stack_value`, an
//! entry value) are computed at the hit ([`Fetch::Expr`]).
//! A struct passed by value is not read, nor anything after it (its
//! classification is not worked out here): `<struct by value>` and
//! `<unknown location>`, never a wrong value.

use crate::types::{EntryLoc, Signature, Type};
use crate::value::{Fetch, Shape, ShapeItem, Source};
use crate::DwarfError;

/// What to read and how to show it, at the entry and at the return.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Planned {
    /// Read at the entry.
    pub entry: Vec<Fetch>,
    /// Shown for the entry (one per fetch).
    pub entry_shapes: Vec<ShapeItem>,
    /// Read at the return.
    pub exit: Vec<Fetch>,
    /// Shown for the return.
    pub exit_shapes: Vec<ShapeItem>,
}

impl Planned {
    /// Whether this needs anything beyond the six integer argument
    /// registers and rax (floats, memory, the stack).
    pub fn needs_more_than_registers(&self) -> bool {
        fn plain(f: &Fetch) -> bool {
            matches!(
                f,
                Fetch::Missing | Fetch::Const(_) | Fetch::Reg(Source::IntArg(_) | Source::Rax)
            )
        }
        !self.entry.iter().chain(&self.exit).all(plain)
    }
}

/// A perf-probe-like argument expression: `name`, `name:string`,
/// `p->len`, `p->inner.x`, `p->next->len`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArgExpr {
    /// The text as given (the label printed).
    pub text: String,
    /// The parameter.
    pub param: String,
    /// Member accesses: (`true` for `->`, member name).
    pub path: Vec<(bool, String)>,
    /// `:string`: read a `char *` (or any pointer) as a string.
    pub as_string: bool,
}

impl std::str::FromStr for ArgExpr {
    type Err = DwarfError;

    fn from_str(s: &str) -> Result<ArgExpr, DwarfError> {
        let bad = |why: &str| DwarfError::BadExpr {
            expr: s.to_string(),
            why: why.to_string(),
        };
        let (body, as_string) = match s.split_once(':') {
            Some((b, "string")) => (b, true),
            Some(_) => return Err(bad("the only type cast is :string")),
            None => (s, false),
        };
        let ident = |t: &str| {
            !t.is_empty()
                && !t.starts_with(|c: char| c.is_ascii_digit())
                && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        };
        let mut path = Vec::new();
        let mut rest = body;
        let end = rest.find(['-', '.']).unwrap_or(rest.len());
        let param = &rest[..end];
        if !ident(param) {
            return Err(bad("expected a parameter name"));
        }
        rest = &rest[end..];
        while !rest.is_empty() {
            let (arrow, r) = if let Some(r) = rest.strip_prefix("->") {
                (true, r)
            } else if let Some(r) = rest.strip_prefix('.') {
                (false, r)
            } else {
                return Err(bad("expected -> or . between member names"));
            };
            let end = r.find(['-', '.']).unwrap_or(r.len());
            if !ident(&r[..end]) {
                return Err(bad("expected a member name"));
            }
            path.push((arrow, r[..end].to_string()));
            rest = &r[end..];
        }
        Ok(ArgExpr {
            text: s.to_string(),
            param: param.to_string(),
            path,
            as_string,
        })
    }
}

/// Whether only DWARF's own locations at the entry are to be trusted: a
/// gcc clone (its ELF name carries a `.`), a function DWARF says is not
/// called the usual way (`DW_CC_nocall`), or one with a constant
/// parameter (`DW_AT_const_value`, a constant `DW_OP_stack_value`): the
/// caller passes nothing for that one, so the ABI's positions of the
/// others are off.
fn dwarf_only(sig: &Signature, clone: bool) -> bool {
    clone
        || sig.abi_changed
        || sig
            .params
            .iter()
            .any(|p| matches!(p.entry, EntryLoc::Const(_)))
}

/// Where each parameter is at the entry: its fetch, or why it has none.
fn entry_sources(sig: &Signature, clone: bool) -> Vec<Result<Fetch, String>> {
    if dwarf_only(sig, clone) {
        return sig
            .params
            .iter()
            .map(|p| match &p.entry {
                // An argument register under its ABI name (the fast path
                // records those), any other general register as such.
                EntryLoc::Reg(n @ 0..=15) => Ok(Fetch::Reg(match n {
                    5 => Source::IntArg(0),
                    4 => Source::IntArg(1),
                    1 => Source::IntArg(2),
                    2 => Source::IntArg(3),
                    8 => Source::IntArg(4),
                    9 => Source::IntArg(5),
                    n => Source::Dwarf(*n),
                })),
                EntryLoc::Reg(n @ 17..=32) => Ok(Fetch::Reg(Source::Xmm((n - 17) as u8))),
                EntryLoc::Const(c) => Ok(Fetch::Const(*c as u64)),
                EntryLoc::Expr(e) => Ok(Fetch::Expr(Box::new(crate::DwarfExpr {
                    size: size_of(&p.ty).unwrap_or(8),
                    ..e.clone()
                }))),
                // Anything else (a value only the caller knows,
                // DW_OP_GNU_parameter_ref, a frame slot the prologue has
                // not filled yet, or none): not known at the entry.
                EntryLoc::Reg(_) | EntryLoc::Unknown | EntryLoc::Frame | EntryLoc::OptimisedOut => {
                    Err("optimised out".into())
                }
            })
            .collect();
    }
    let mut int = match &sig.ret {
        Type::Struct { size, .. } if *size > 16 => 1,
        _ => 0,
    };
    let mut xmm = 0u8;
    let mut stack = 8u32;
    let mut lost = false;
    let mut out = Vec::new();
    for p in &sig.params {
        if lost {
            out.push(Err("unknown location".into()));
            continue;
        }
        let mut on_stack = || {
            let s = Source::Stack(stack);
            stack += 8;
            s
        };
        out.push(match &p.ty {
            t if t.is_integer_class() => Ok(Fetch::Reg(if int < 6 {
                int += 1;
                Source::IntArg(int - 1)
            } else {
                on_stack()
            })),
            Type::Float { .. } => Ok(Fetch::Reg(if xmm < 8 {
                xmm += 1;
                Source::Xmm(xmm - 1)
            } else {
                on_stack()
            })),
            Type::Struct { .. } => {
                lost = true;
                Err("struct by value".into())
            }
            t => {
                lost = true;
                Err(format!("{} not supported", t.describe()).replace(['*', '(', ')'], " "))
            }
        });
    }
    out
}

/// The fetch and shape of a value of type `ty` held by `f` (a register's
/// value, or a loaded word).
fn value_of(ty: &Type, f: Fetch, as_string: bool) -> (Fetch, Shape) {
    match ty {
        Type::Pointer(_) if as_string || ty.is_string() => (Fetch::Str(Box::new(f)), Shape::Str),
        Type::Pointer(_) => (f, Shape::Ptr),
        Type::Int { size, signed: true } => (f, Shape::Signed(*size)),
        Type::Int {
            size,
            signed: false,
        } => (f, Shape::Unsigned(*size)),
        Type::Bool => (f, Shape::Bool),
        Type::Char { .. } => (f, Shape::Char),
        Type::Float { size: 4 } => (f, Shape::F32),
        Type::Float { .. } => (f, Shape::F64),
        Type::Enum { values, .. } => (f, Shape::Enum(values.clone())),
        Type::Void => (Fetch::Missing, Shape::Missing("void".into())),
        Type::Struct { .. } => (Fetch::Missing, Shape::Missing("struct by value".into())),
        t => (
            Fetch::Missing,
            Shape::Missing(format!("{} not supported", t.describe()).replace(['*', '(', ')'], " ")),
        ),
    }
}

fn size_of(ty: &Type) -> Option<u8> {
    Some(match ty {
        Type::Int { size, .. } | Type::Float { size } | Type::Enum { size, .. } => *size,
        Type::Bool | Type::Char { .. } => 1,
        Type::Pointer(_) => 8,
        _ => return None,
    })
}

/// The return value (rax, or xmm0 for floats), read at the return. A
/// function DWARF marks `DW_CC_nocall` may return nothing at all (LLVM
/// drops a return value its callers do not use or know as a constant):
/// `<optimised out>`, never whatever rax holds.
pub fn plan_return(sig: &Signature) -> (Vec<Fetch>, Vec<ShapeItem>) {
    let src = match &sig.ret {
        Type::Void => return (Vec::new(), Vec::new()),
        _ if sig.abi_changed => {
            return (
                vec![Fetch::Missing],
                vec![ShapeItem {
                    label: String::new(),
                    shape: Shape::Missing("optimised out".into()),
                }],
            )
        }
        Type::Float { .. } => Source::Xmm(0),
        _ => Source::Rax,
    };
    let (f, shape) = value_of(&sig.ret, Fetch::Reg(src), false);
    (
        vec![f],
        vec![ShapeItem {
            label: String::new(),
            shape,
        }],
    )
}

/// Every parameter and the return value (`-a`). `symbol` is the ELF name
/// of the probed function (a gcc clone's carries a `.`).
pub fn plan_auto(sig: &Signature, symbol: &str) -> Planned {
    let clone = symbol.contains('.');
    let mut p = Planned::default();
    for (param, src) in sig.params.iter().zip(entry_sources(sig, clone)) {
        let (f, shape) = match src {
            Ok(f) => value_of(&param.ty, f, false),
            Err(why) => (Fetch::Missing, Shape::Missing(why)),
        };
        p.entry.push(f);
        p.entry_shapes.push(ShapeItem {
            label: String::new(),
            shape,
        });
    }
    (p.exit, p.exit_shapes) = plan_return(sig);
    p
}

/// The argument expressions `exprs` (labelled) and the return value.
/// A name the function has no parameter of is an error listing them.
pub fn plan_args(sig: &Signature, symbol: &str, exprs: &[ArgExpr]) -> Result<Planned, DwarfError> {
    let clone = symbol.contains('.');
    let sources = entry_sources(sig, clone);
    let mut p = Planned::default();
    for e in exprs {
        let Some(i) = sig.params.iter().position(|x| x.name == e.param) else {
            return Err(DwarfError::NoParameter {
                function: sig.name.clone(),
                name: e.param.clone(),
                params: sig
                    .params
                    .iter()
                    .map(|x| format!("{} ({})", x.name, x.ty.describe()))
                    .collect(),
            });
        };
        let bad = |why: String| DwarfError::BadExpr {
            expr: e.text.clone(),
            why,
        };
        let (f, shape) = match &sources[i] {
            Err(why) => (Fetch::Missing, Shape::Missing(why.clone())),
            Ok(f) => {
                // The value so far: in a register/word (None) or in memory
                // at (address fetch, offset) (Some).
                let mut ty = sig.params[i].ty.clone();
                let mut val = f.clone();
                let mut mem: Option<(Fetch, u64)> = None;
                for (arrow, member) in &e.path {
                    let st = match (arrow, &ty, &mem) {
                        (true, Type::Pointer(to), _) => {
                            let base = match mem.take() {
                                None => val.clone(),
                                Some((a, off)) => Fetch::Load {
                                    addr: Box::new(a),
                                    offset: off,
                                    size: 8,
                                },
                            };
                            mem = Some((base, 0));
                            (**to).clone()
                        }
                        (false, Type::Struct { .. }, Some(_)) => ty.clone(),
                        _ => {
                            return Err(bad(format!(
                                "{}{member} on a {}",
                                if *arrow { "->" } else { "." },
                                ty.describe()
                            )))
                        }
                    };
                    let Type::Struct { fields, name, .. } = &st else {
                        return Err(bad(format!("{} is not a struct", st.describe())));
                    };
                    let Some(field) = fields.iter().find(|x| &x.name == member) else {
                        return Err(bad(format!(
                            "struct {name} has no member {member}; its members: {}",
                            fields
                                .iter()
                                .map(|x| x.name.as_str())
                                .collect::<Vec<_>>()
                                .join(", ")
                        )));
                    };
                    if let Some((_, off)) = &mut mem {
                        *off += field.offset;
                    }
                    ty = field.ty.clone();
                }
                if let Some((addr, offset)) = mem {
                    let Some(size) = size_of(&ty) else {
                        return Err(bad(format!("cannot print a {}", ty.describe())));
                    };
                    val = Fetch::Load {
                        addr: Box::new(addr),
                        offset,
                        size,
                    };
                }
                if e.as_string && !matches!(ty, Type::Pointer(_)) {
                    return Err(bad(format!(":string on a {}", ty.describe())));
                }
                value_of(&ty, val, e.as_string)
            }
        };
        p.entry.push(f);
        p.entry_shapes.push(ShapeItem {
            label: e.text.trim_end_matches(":string").to_string(),
            shape,
        });
    }
    (p.exit, p.exit_shapes) = plan_return(sig);
    Ok(p)
}
