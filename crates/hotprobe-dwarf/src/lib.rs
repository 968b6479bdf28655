//! Typed arguments and return values for hotprobe.
//!
//! - [`DebugTypes`]: one ELF file's DWARF, read with gimli: for a function
//!   (by its entry address) its [`Signature`] — parameters with their C
//!   [`Type`]s and where DWARF says each lives at the entry, and the return
//!   type.
//! - [`plan`]: what to read at a hit ([`Fetch`]: an argument register of
//!   the System V AMD64 ABI, an xmm register, a stack slot, a field through
//!   a pointer, a string) and how to show it ([`Shape`]), for every
//!   parameter (`-a`) or for perf-probe-like argument expressions
//!   (`name`, `p->len`, `name:string`).
//! - [`capture`]: runs a plan against a stopped thread ([`Machine`]) into
//!   bytes — copied at the hit, so a string is read while its pointer is
//!   alive; [`format_values`] turns those bytes back into text with the
//!   shapes alone (a trace keeps the shapes, [`Shape::encode_list`], and
//!   the bytes, so that `replay` prints what `trace` would have).
//!
//! Everything that reads untrusted input (ELF/DWARF bytes, shape text,
//! captured bytes) returns errors and never panics (fuzzed:
//! `tests/fuzz.rs`, `fuzz/`).

mod expr;
#[cfg(feature = "dwarf")]
mod plan;
#[cfg(feature = "dwarf")]
mod prototypes;
#[cfg(feature = "dwarf")]
mod types;
mod value;

pub use expr::DwarfExpr;
#[cfg(feature = "dwarf")]
pub use plan::{plan_args, plan_auto, plan_return, ArgExpr, Planned};
#[cfg(feature = "dwarf")]
pub use prototypes::libc_prototype;
#[cfg(feature = "dwarf")]
pub use types::{DebugTypes, EntryLoc, Field, Param, Signature, Type};
pub use value::{
    capture, decode_values, format_values, Fetch, Machine, Shape, ShapeItem, Source, Value,
    ValueError, MAX_STRING,
};

#[cfg(feature = "dwarf")]
/// Why DWARF could not be read or an argument expression not planned.
#[derive(Debug, thiserror::Error)]
pub enum DwarfError {
    /// The file is not an ELF object `object` can read.
    #[error("not an ELF file: {0}")]
    Elf(String),
    /// The file has no DWARF `.debug_info`.
    #[error("no DWARF debug information")]
    NoDebugInfo,
    /// gimli refused the DWARF.
    #[error("bad DWARF: {0}")]
    Dwarf(#[from] gimli::Error),
    /// Reading the file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// What failed.
        source: std::io::Error,
    },
    /// An argument expression names no parameter of the function.
    #[error("{function} has no parameter {name}; its parameters: {}", list(.params))]
    NoParameter {
        /// The function.
        function: String,
        /// The name asked for.
        name: String,
        /// The parameters it has.
        params: Vec<String>,
    },
    /// An argument expression does not fit the parameter's type.
    #[error("{expr}: {why}")]
    BadExpr {
        /// The expression.
        expr: String,
        /// Why.
        why: String,
    },
}

#[cfg(feature = "dwarf")]
fn list(v: &[String]) -> String {
    if v.is_empty() {
        "none".into()
    } else {
        v.join(", ")
    }
}
