//! Trap return probes against non-local exits (DESIGN.md, "Non-local
//! exits"): a return probe swaps the return address at `[rsp]` for the
//! trampoline, so whatever reads return addresses besides `ret` must be
//! taken care of.
//!
//! - **Unwinders** (C++ exceptions, Rust panics, `pthread_exit`): internal
//!   breakpoints at the unwinder's entry points put the real return
//!   addresses back before it walks the stack, and one where the
//!   personality routine picks a landing pad (`_Unwind_SetIP`) swaps the
//!   trampoline in again for the frames that survive ([`UnwindHook`]).
//! - **Functions that return twice** (`setjmp`, `vfork`, …): the second
//!   return comes through a saved copy of the trampoline with no call to
//!   match; refused ([`return_probe_refusal`]).
//! - **Go**: the runtime walks goroutine stacks by return address (GC,
//!   preemption, tracebacks) and dies on the trampoline; refused.
//!
//! `longjmp`/`siglongjmp` need nothing here: the engine drops the frames
//! they leave by stack pointer.

use crate::engine::Engine;
use crate::held::HeldTarget;
use crate::session::inbox::Inbox;
use crate::EngineError;
use hotprobe_symbols::{LoadedModule, ProcessSymbols};
use hotprobe_target::{RuntimeAddr, Target};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

/// What an internal breakpoint in the unwinder does (see the engine's
/// `on_unwind_hook`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum UnwindHook {
    /// The unwinder is entered: the thread's swapped return addresses
    /// above its stack pointer are put back.
    Enter,
    /// `_Unwind_SetIP(context, landing_pad)`: the frame the context
    /// describes gets control. libgcc keeps in the context the CFA of the
    /// callee it unwound last, i.e. that frame's stack pointer, at
    /// `context + cfa_offset`: followed frames whose return-address slot
    /// is below it are unwound, those above get the trampoline again.
    Landing {
        /// Offset of the CFA in `struct _Unwind_Context`, read from the
        /// same library's `_Unwind_GetCFA`.
        cfa_offset: u32,
    },
}

/// The unwinder's entry points (libgcc's `unwind-dw2.c`, also exported by
/// LLVM's libunwind): each walks the stack of the thread calling it.
pub const UNWIND_ENTRIES: &[&str] = &[
    "_Unwind_RaiseException",
    "_Unwind_Resume",
    "_Unwind_Resume_or_Rethrow",
    "_Unwind_ForcedUnwind",
];

/// Functions that return twice, by name: gcc's `returns_twice` list
/// (`special_function_p`: `setjmp`, `sigsetjmp`, `savectx`, `vfork`,
/// `getcontext`, with or without a leading `_` or `__`).
pub const RETURNS_TWICE: &[&str] = &["setjmp", "sigsetjmp", "savectx", "vfork", "getcontext"];

/// Whether the function named `name` (raw, maybe versioned: `vfork@@GLIBC_2.2.5`)
/// returns twice, as gcc knows it.
pub fn returns_twice(name: &str) -> bool {
    let name = name.split('@').next().unwrap_or(name);
    let base = name
        .strip_prefix("__")
        .or_else(|| name.strip_prefix('_'))
        .unwrap_or(name);
    RETURNS_TWICE.contains(&base)
}

/// Why a trap return probe must not be placed on the function entered at
/// `addr`, if it must not: it returns twice, or it is a Go function.
pub(crate) fn return_probe_refusal(symbols: &ProcessSymbols, addr: RuntimeAddr) -> Option<String> {
    let m = symbols.module_at(addr)?;
    let link = m.link(addr);
    let funcs = m.module.functions();
    let lo = funcs.partition_point(|s| s.addr < link);
    let aliases = funcs[lo..].iter().take_while(|s| s.addr == link);
    if let Some(s) = aliases.clone().find(|s| returns_twice(&s.raw_name)) {
        let name = s.raw_name.split('@').next().unwrap_or(&s.raw_name);
        return Some(format!(
            "{name} returns twice (again through longjmp or in a vfork child, with no call \
             left to match): a return probe would crash the program; probe the entry instead"
        ));
    }
    if is_go_module(m) {
        // Go symbols are qualified by their package (`main.f`,
        // `runtime.mallocgc`); C functions of a cgo binary are not, and
        // run on the system stack, which Go does not walk.
        let name = m.module.symbolize(link).map(|(s, _)| s.raw_name.as_str());
        if name.is_none_or(|n| n.contains('.')) {
            return Some(
                "Go's runtime walks stacks by return address: a return probe would crash it; \
                 probe the entry instead"
                    .into(),
            );
        }
    }
    None
}

/// The refusal of [`return_probe_refusal`] for process `pid`, as an error.
pub(crate) fn check_return_probe(pid: i32, addr: RuntimeAddr) -> Result<(), EngineError> {
    let symbols = ProcessSymbols::for_pid(pid as u32)?;
    match return_probe_refusal(&symbols, addr) {
        Some(reason) => Err(EngineError::Refused {
            addr: addr.0,
            reason,
        }),
        None => Ok(()),
    }
}

/// Whether `m` was built by Go: the runtime's `runtime.main` or
/// `runtime.goexit`, else (stripped) a `.go.buildinfo` section.
pub fn is_go_module(m: &LoadedModule) -> bool {
    if m.module.find("runtime.main").is_some() || m.module.find("runtime.goexit").is_some() {
        return true;
    }
    static SEEN: OnceLock<Mutex<HashMap<PathBuf, bool>>> = OnceLock::new();
    let seen = SEEN.get_or_init(Default::default);
    if let Some(go) = seen.lock().ok().and_then(|s| s.get(&m.path).copied()) {
        return go;
    }
    let go = has_section(m.module.path(), ".go.buildinfo");
    if let Ok(mut s) = seen.lock() {
        s.insert(m.path.clone(), go);
    }
    go
}

/// Whether the ELF file at `path` has a section `name` (read lazily: the
/// section headers only).
fn has_section(path: &std::path::Path, name: &str) -> bool {
    use object::Object;
    let Ok(f) = std::fs::File::open(path) else {
        return false;
    };
    let cache = object::ReadCache::new(f);
    object::File::parse(&cache).is_ok_and(|o| o.section_by_name(name).is_some())
}

/// The internal breakpoints the unwinders loaded in the process need:
/// [`UnwindHook::Enter`] at each of [`UNWIND_ENTRIES`] a module defines,
/// and [`UnwindHook::Landing`] at its `_Unwind_SetIP` when its
/// `_Unwind_GetCFA` is the plain load it is in libgcc (else the frames
/// above a landing pad are not followed any more: they are abandoned when
/// the engine finds them dead).
pub(crate) fn unwind_hooks(
    symbols: &ProcessSymbols,
    target: &mut dyn Target,
) -> Vec<(RuntimeAddr, UnwindHook)> {
    let mut v = Vec::new();
    for m in symbols.modules() {
        let entries: Vec<RuntimeAddr> = UNWIND_ENTRIES
            .iter()
            .filter_map(|n| m.module.find(n))
            .map(|s| m.runtime(s.addr))
            .collect();
        if entries.is_empty() {
            continue;
        }
        v.extend(entries.into_iter().map(|a| (a, UnwindHook::Enter)));
        let set_ip = m.module.find("_Unwind_SetIP");
        let get_cfa = m.module.find("_Unwind_GetCFA");
        if let (Some(set_ip), Some(get_cfa)) = (set_ip, get_cfa) {
            if let Some(cfa_offset) = cfa_offset(target, m.runtime(get_cfa.addr)) {
                v.push((m.runtime(set_ip.addr), UnwindHook::Landing { cfa_offset }));
            }
        }
    }
    v.sort_by_key(|(a, _)| a.0);
    v.dedup_by_key(|(a, _)| a.0);
    v
}

/// The offset `_Unwind_GetCFA` at `addr` loads the CFA from:
/// `[endbr64] mov rax, [rdi + disp]; ret`.
fn cfa_offset(target: &mut dyn Target, addr: RuntimeAddr) -> Option<u32> {
    use hotprobe_x86::iced_x86::{Mnemonic, OpKind, Register};
    let mut code = [0u8; 16];
    target.read_memory(addr, &mut code).ok()?;
    let mut at = 0usize;
    let mut insn = hotprobe_x86::decode(&code, addr.0).ok()?;
    if insn.mnemonic() == Mnemonic::Endbr64 {
        at += insn.len();
        insn = hotprobe_x86::decode(&code[at..], addr.0 + at as u64).ok()?;
    }
    let load = insn.mnemonic() == Mnemonic::Mov
        && insn.op0_register() == Register::RAX
        && insn.op1_kind() == OpKind::Memory
        && insn.memory_base() == Register::RDI
        && insn.memory_index() == Register::None;
    if !load {
        return None;
    }
    let disp = insn.memory_displacement64();
    at += insn.len();
    let ret = hotprobe_x86::decode(&code[at..], addr.0 + at as u64).ok()?;
    (ret.mnemonic() == Mnemonic::Ret && disp < 4096).then_some(disp as u32)
}

/// Places (or updates) the unwinder hooks of a process whose engine has
/// return probes on the trampoline: after a return probe is added and
/// whenever its modules change. Every thread is stopped while breakpoints
/// are written. What fails is said in a notice, in the session's `inbox`.
pub(crate) fn sync_unwind_hooks(
    engine: &mut Engine,
    target: &mut HeldTarget,
    pid: i32,
    inbox: &mut Inbox,
) {
    if !engine.has_trampoline() || engine.gone().is_some() {
        return;
    }
    let symbols = match ProcessSymbols::for_pid(pid as u32) {
        Ok(s) => s,
        Err(e) => {
            inbox.notice(
                engine,
                format!("pid {pid}: cannot look for its unwinder: {e}"),
            );
            return;
        }
    };
    let hooks = unwind_hooks(&symbols, target.as_target());
    if !engine.unwind_hooks_differ(&hooks) {
        return;
    }
    let started = engine.started;
    let r = if started {
        target.stop_all().map_err(EngineError::from)
    } else {
        Ok(())
    };
    let r = r.and_then(|()| engine.set_unwind_hooks(target, &hooks));
    let r = match (started, r) {
        (true, r) => r.and(target.resume_all().map_err(EngineError::from)),
        (false, r) => r,
    };
    if let Err(e) = r {
        inbox.notice(
            engine,
            format!("pid {pid}: cannot place the unwinder hooks: {e}"),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_twice_names() {
        for n in [
            "setjmp",
            "_setjmp",
            "__sigsetjmp",
            "sigsetjmp",
            "savectx",
            "vfork",
            "__vfork",
            "getcontext",
            "vfork@@GLIBC_2.2.5",
        ] {
            assert!(returns_twice(n), "{n}");
        }
        for n in [
            "longjmp",
            "siglongjmp",
            "setcontext",
            "fork",
            "jmp",
            "___setjmp",
        ] {
            assert!(!returns_twice(n), "{n}");
        }
    }
}
