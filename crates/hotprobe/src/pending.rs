//! Patterns on a library the program has not loaded yet
//! (`libz.so.1:deflate*` before its `dlopen`): the functions of the
//! library's file that the pattern matches, each added as a pending probe
//! the session arms when the program loads the library.

use crate::{Action, Added, EngineError, Session, Skipped, TargetId};
use hotprobe_symbols::{
    find_library, is_pattern, ElfModule, NamePattern, PatternError, ProbeSpec, SymbolError,
};
use std::collections::HashSet;
use std::path::{Path, PathBuf};

/// Why a pattern on a library not loaded yet could not be made pending.
#[derive(Debug, thiserror::Error)]
pub enum PendingError {
    /// The spec is no `MODULE:GLOB` (with a pattern in GLOB), or the
    /// library is nowhere the loader looks: the caller reports the
    /// resolver's own error.
    #[error("no library to take the pattern's functions from")]
    NoLibrary,
    /// The library's file could not be read.
    #[error("cannot read {}: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: SymbolError,
    },
    /// The pattern is malformed.
    #[error(transparent)]
    Pattern(#[from] PatternError),
    /// No function of the library's file matches the pattern.
    #[error("no function matches `{glob}` in {} (not loaded yet)", .path.display())]
    NoMatch {
        /// The pattern.
        glob: String,
        /// The library's file.
        path: PathBuf,
    },
}

/// `(module, glob)` of a `MODULE:GLOB` spec whose GLOB is a pattern.
pub fn module_pattern(spec: &str) -> Option<(String, String)> {
    match spec.parse::<ProbeSpec>() {
        Ok(ProbeSpec::Function {
            module: Some(m),
            name,
            offset: 0,
            is_return: false,
        }) if is_pattern(&name) => Some((m, name)),
        _ => None,
    }
}

/// `MODULE:GLOB` where MODULE (`module`, as the resolver named it) is not
/// loaded (yet): the functions of MODULE's file (found where the loader
/// looks, `program_dir` being the directory of the program, for its
/// RUNPATH-less neighbours) that GLOB matches and `keep` keeps, each added
/// to `target` with the action `action` makes as `MODULE:NAME`, a pending probe armed when
/// the program loads the library (dlopen). One probe per address (aliases
/// share one); labels and `.cold` parts are not functions. A function the
/// session refuses is in [`Added::skipped`] with the reason; one `keep`
/// declines is counted in [`Added::left_out`].
pub fn add_pending_pattern(
    session: &mut Session,
    target: TargetId,
    spec: &str,
    module: &str,
    program_dir: Option<&Path>,
    action: &dyn Fn() -> Action,
    keep: &dyn Fn(&str) -> bool,
) -> Result<Added, PendingError> {
    let (_, glob) = module_pattern(spec).ok_or(PendingError::NoLibrary)?;
    let path = find_library(module, program_dir).ok_or(PendingError::NoLibrary)?;
    let elf = ElfModule::open(&path).map_err(|source| PendingError::Read {
        path: path.clone(),
        source,
    })?;
    let pat = NamePattern::new(&glob)?;
    let mut seen = HashSet::new();
    let mut added = Added::default();
    let mut matched = 0;
    for sym in elf.functions() {
        if !(pat.matches(&sym.name) || pat.matches(&sym.raw_name))
            || sym.kind.summary().is_some()
            || !seen.insert(sym.addr)
        {
            continue;
        }
        matched += 1;
        if !keep(&sym.name) {
            added.left_out += 1;
            continue;
        }
        let one = format!("{module}:{}", sym.raw_name);
        match session.add(target, &one, action()) {
            Ok(a) => added.placements.extend(a.placements),
            Err(e) => added.skipped.push(Skipped {
                label: sym.name.clone(),
                reason: reason_of(e),
            }),
        }
    }
    if matched == 0 {
        return Err(PendingError::NoMatch { glob, path });
    }
    Ok(added)
}

/// The reason inside a refusal, without the spec the caller already names.
fn reason_of(e: EngineError) -> String {
    match e {
        EngineError::RefusedSpec { reason, .. } => reason,
        e => e.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_patterns() {
        assert_eq!(
            module_pattern("libz.so.1:deflate*"),
            Some(("libz.so.1".into(), "deflate*".into()))
        );
        assert_eq!(module_pattern("libz.so.1:deflate"), None);
        assert_eq!(module_pattern("deflate*"), None);
        assert_eq!(module_pattern("libz.so.1:deflate*%return"), None);
    }

    #[test]
    fn a_library_nowhere_is_no_library() {
        let mut s = Session::new();
        let e = add_pending_pattern(
            &mut s,
            TargetId(0),
            "libhotprobe-nowhere.so.7:f*",
            "libhotprobe-nowhere.so.7",
            None,
            &|| Action::Record,
            &|_| true,
        )
        .unwrap_err();
        assert!(matches!(e, PendingError::NoLibrary), "{e}");
    }
}
