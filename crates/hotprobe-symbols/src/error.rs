//! The one error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong while reading symbols, maps or probe specs.
#[derive(Debug, thiserror::Error)]
pub enum SymbolError {
    /// A file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A file is not an ELF file this crate understands.
    #[error("{} is not a usable ELF file: {reason}", path.display())]
    NotElf {
        /// The file.
        path: PathBuf,
        /// What the parser said.
        reason: String,
    },
    /// A file's DWARF debug information is broken or unsupported.
    #[error("cannot read DWARF of {}: {reason}", path.display())]
    Dwarf {
        /// The file.
        path: PathBuf,
        /// What gimli said.
        reason: String,
    },
    /// A file has no DWARF line table.
    #[error(
        "{} has no DWARF line information: rebuild it with -g or install its debug symbols \
         (e.g. the -dbg / -dbgsym package)",
        path.display()
    )]
    NoDebugInfo {
        /// The file.
        path: PathBuf,
    },
    /// No line-table row for `file:line`.
    #[error("no code for {file}:{line} in {where_}{}", hint_suffix(hint))]
    LineNotFound {
        /// The source file as asked.
        file: String,
        /// The line as asked.
        line: u32,
        /// Where it was searched (a module path or "any loaded module").
        where_: String,
        /// What may help (lines near it that do have code, or known files).
        hint: String,
    },
    /// A symbol is not defined in a module.
    #[error("function `{symbol}` not found in {module}{}", similar_suffix(similar))]
    SymbolNotFound {
        /// The name asked for.
        symbol: String,
        /// Where it was searched.
        module: String,
        /// Up to five similar names that do exist.
        similar: Vec<String>,
    },
    /// A probe offset lies past the end of its function.
    #[error("offset {offset:#x} is past the end of {function} (size {size:#x})")]
    OffsetPastEnd {
        /// The function.
        function: String,
        /// The offset asked for.
        offset: u64,
        /// The function's size.
        size: u64,
    },
    /// A probe spec cannot be turned into an address for some other reason.
    #[error("cannot probe {spec}: {reason}")]
    Unprobeable {
        /// The spec (as displayed).
        spec: String,
        /// Why.
        reason: String,
    },
    /// A module name matches no loaded module.
    #[error("no module `{name}` is loaded; loaded modules: {}", loaded.join(", "))]
    ModuleNotFound {
        /// The name asked for.
        name: String,
        /// The loaded modules' file names.
        loaded: Vec<String>,
    },
    /// A module name matches several loaded modules.
    #[error("module name `{name}` is ambiguous: it matches {}; give more of the name", candidates.join(", "))]
    AmbiguousModule {
        /// The name asked for.
        name: String,
        /// The modules it matches.
        candidates: Vec<String>,
    },
    /// A run-time address lies in no module's executable code.
    #[error("address {addr:#x} {why}")]
    AddressNotMapped {
        /// The address.
        addr: u64,
        /// Why it cannot be used.
        why: String,
    },
    /// A line of /proc/PID/maps text does not parse.
    #[error("bad maps line {line_no}: {reason}: {line:?}")]
    BadMaps {
        /// 1-based line number.
        line_no: usize,
        /// The offending line (cut to 200 characters).
        line: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A probe spec does not parse.
    #[error(
        "bad probe spec {spec:?}: {reason} (expected [module:]function[+offset], \
         [module:]0xADDR or file.c:LINE, optionally followed by %return)"
    )]
    BadSpec {
        /// The spec (cut to 200 characters).
        spec: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A function-name pattern does not compile.
    #[error(transparent)]
    BadPattern(#[from] crate::pattern::PatternError),
    /// A function-name pattern matches no function.
    #[error("no function matches `{pattern}` in {module}")]
    NoMatch {
        /// The pattern as given.
        pattern: String,
        /// Where it was searched.
        module: String,
    },
    /// kallsyms / System.map text is unusable.
    #[error("bad kernel symbol table: {reason}")]
    Kallsyms {
        /// What is wrong.
        reason: String,
    },
    /// Something about a process could not be read from /proc.
    #[error("cannot read {} of process {pid}: {source}{}", path.display(), proc_hint(source))]
    Proc {
        /// The process.
        pid: u32,
        /// The /proc file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

fn similar_suffix(similar: &[String]) -> String {
    if similar.is_empty() {
        String::new()
    } else {
        format!("; similar names: {}", similar.join(", "))
    }
}

fn hint_suffix(hint: &str) -> String {
    if hint.is_empty() {
        String::new()
    } else {
        format!(" ({hint})")
    }
}

fn proc_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::NotFound => " (is the process still running?)",
        std::io::ErrorKind::PermissionDenied => {
            " (run as the process's user or as root, or grant CAP_SYS_PTRACE)"
        }
        _ => "",
    }
}

/// Cut a string for inclusion in an error message.
pub(crate) fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(max).collect();
        out.push('…');
        out
    }
}
