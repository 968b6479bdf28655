//! Code whose `[rsp]` at entry is no return address a return hook may
//! swap: the entry points (`[rsp]` is `argc`), the lazy binder (`[rsp]` is
//! a relocation index) and the functions that never return (DWARF's
//! `DW_AT_noreturn`, and a documented list for code without DWARF). A `%return`
//! there is refused; `record` and `trace` take their entries only.

use crate::process::LoadedModule;
use hotprobe_target::LinkAddr;

/// Functions that do not return (they exit, jump or unwind away), by
/// name: the documented list of issue 21. Versioned and `_chk` aliases
/// are named too.
pub const NO_RETURN: &[&str] = &[
    "exit",
    "_exit",
    "_Exit",
    "abort",
    "__libc_start_main",
    "__libc_start_call_main",
    "pthread_exit",
    "longjmp",
    "_longjmp",
    "siglongjmp",
    "__longjmp_chk",
    "__cxa_throw",
    "__cxa_rethrow",
    "_Unwind_Resume",
    "__stack_chk_fail",
    "__assert_fail",
    "__fortify_fail",
];

/// Why a call of `function` (at `link` in `module`) never returns to the
/// address at `[rsp]` on entry; `None` when it may.
pub fn no_return_reason(
    module: Option<&LoadedModule>,
    function: Option<&str>,
    link: LinkAddr,
) -> Option<String> {
    if let Some(m) = module {
        if m.module.entry() == link && link.0 != 0 {
            return Some(format!(
                "{} does not return: it is the entry point of {} ([rsp] holds argc, not a \
                 return address)",
                function.unwrap_or("the address"),
                m.name
            ));
        }
    }
    if let Some(m) = module {
        if link.0 != 0 && m.module.dwarf_no_return(link) {
            return Some(format!(
                "{} does not return (DWARF: DW_AT_noreturn)",
                function.unwrap_or("the function")
            ));
        }
    }
    let name = function?;
    // `exit@@GLIBC_2.2.5`: the name before the version.
    let base = name.split('@').next().unwrap_or(name);
    if base.starts_with("_dl_runtime_resolve") {
        return Some(format!(
            "{name} does not return as a call does: it is the dynamic loader's lazy binder \
             ([rsp] holds a relocation index)"
        ));
    }
    NO_RETURN
        .contains(&base)
        .then(|| format!("{name} does not return"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_functions_and_the_binder_do_not_return() {
        for f in ["exit", "abort", "__libc_start_main", "longjmp@GLIBC_2.2.5"] {
            let why = no_return_reason(None, Some(f), LinkAddr(0x10)).unwrap();
            assert_eq!(why, format!("{f} does not return"));
        }
        let why = no_return_reason(None, Some("_dl_runtime_resolve_xsavec"), LinkAddr(1)).unwrap();
        assert!(why.contains("relocation index"), "{why}");
        assert_eq!(no_return_reason(None, Some("main"), LinkAddr(0x10)), None);
        assert_eq!(
            no_return_reason(None, Some("exit_group_helper"), LinkAddr(0x10)),
            None
        );
        assert_eq!(no_return_reason(None, None, LinkAddr(0x10)), None);
    }
}
