//! Resolving probe specs in a target, and the checks every address
//! passes before any mechanism is asked to take it.

use super::*;

impl Session {
    /// Resolve a probe spec (`[module:]function[+off]`, `[module:]0xADDR`,
    /// `file.c:LINE`, optionally `%return`) to checked, probeable addresses.
    pub fn resolve(&mut self, t: TargetId, spec: &str) -> Result<Vec<ResolvedProbe>, EngineError> {
        let found = self.resolve_unchecked(t, spec)?;
        for r in &found {
            self.check(t, spec, r)?;
        }
        Ok(found)
    }

    pub(super) fn resolve_unchecked(
        &mut self,
        t: TargetId,
        spec: &str,
    ) -> Result<Vec<ResolvedProbe>, EngineError> {
        let parsed: ProbeSpec = spec.parse()?;
        let slot = self.slot(t)?;
        let resolver = slot
            .resolver
            .as_mut()
            .ok_or_else(|| EngineError::RefusedSpec {
                spec: spec.into(),
                reason: "this target has no symbols".into(),
            })?;
        let found = resolver.resolve(&parsed, slot.target.as_target())?;
        slot.engine.set_symbolizer(resolver.symbolizer());
        Ok(found)
    }

    /// The blacklist, instruction-boundary and scratch-memory checks.
    pub(super) fn check(
        &mut self,
        t: TargetId,
        spec: &str,
        r: &ResolvedProbe,
    ) -> Result<(), EngineError> {
        let options = crate::CheckOptions {
            force: self.config.force,
        };
        let slot = self.slot(t)?;
        let from = r.boundary.as_ref().map_or(r.addr.0, |b| b.start.0);
        slot.sync_ledger();
        let originals = slot
            .ledger
            .originals_in(from, r.addr.0 + hotprobe_x86::MAX_INSN_LEN as u64);
        if let Some(resolver) = slot.resolver.as_ref() {
            resolver
                .check_over(r, slot.target.as_target(), options, &originals)
                .map_err(|reason| EngineError::RefusedSpec {
                    spec: spec.into(),
                    reason,
                })?;
        }
        let in_fast_pages = slot
            .agent
            .fast_path()
            .is_some_and(|fp| fp.pages().iter().any(|(a, b)| (*a..*b).contains(&r.addr.0)));
        if slot.engine.in_scratch(r.addr) || in_fast_pages {
            return Err(EngineError::RefusedSpec {
                spec: spec.into(),
                reason: "the address is in hotprobe's scratch memory".into(),
            });
        }
        Ok(())
    }

    pub(super) fn resolve_one(
        &mut self,
        t: TargetId,
        spec: &str,
    ) -> Result<ResolvedProbe, EngineError> {
        let mut v = self.resolve(t, spec)?;
        if v.len() > 1 {
            let list: Vec<String> = v.iter().map(|r| r.to_string()).collect();
            return Err(EngineError::RefusedSpec {
                spec: spec.into(),
                reason: format!(
                    "it matches {} addresses ({}): name one",
                    v.len(),
                    list.join(", ")
                ),
            });
        }
        Ok(v.remove(0))
    }

    /// Process `pid`'s modules (target `t`), read again only when its
    /// `/proc/PID/maps` changed since the last read.
    pub(super) fn process_symbols(
        &mut self,
        t: TargetId,
        pid: i32,
    ) -> Result<std::sync::Arc<hotprobe_symbols::ProcessSymbols>, EngineError> {
        let maps = std::fs::read_to_string(hotprobe_symbols::proc_dir(pid as u32).join("maps"))
            .unwrap_or_default();
        let slot = self.slot(t)?;
        if let Some((seen, syms)) = &slot.symbols {
            if !maps.is_empty() && *seen == maps {
                return Ok(syms.clone());
            }
        }
        let syms = std::sync::Arc::new(hotprobe_symbols::ProcessSymbols::for_pid(pid as u32)?);
        slot.symbols = Some((maps, syms.clone()));
        Ok(syms)
    }
}

pub(super) fn from_fast(m: hotprobe_fastpath::Mechanism) -> Mechanism {
    match m {
        hotprobe_fastpath::Mechanism::Patch(k) => Mechanism::Patch(k),
        hotprobe_fastpath::Mechanism::Jump => Mechanism::Jump,
        hotprobe_fastpath::Mechanism::Trap => Mechanism::Trap,
    }
}

/// The resolver's "no module of that name is loaded".
pub(super) fn not_loaded(e: &EngineError) -> bool {
    matches!(
        e,
        EngineError::Symbol(hotprobe_symbols::SymbolError::ModuleNotFound { .. })
    )
}

/// Whether a function name in a spec is a pattern.
pub(super) fn is_pattern(name: &str) -> bool {
    name.contains(['*', '?', '['])
}

pub(super) fn not_whole_function(spec: &str, r: &ResolvedProbe) -> EngineError {
    EngineError::RefusedSpec {
        spec: spec.into(),
        reason: format!(
            "recording follows whole functions, and {:#x} is {} bytes into {} \
             (inside a function only an in-process trap records, as hit events: \
             not with a forced mechanism, a pattern or %return; count probes any \
             instruction)",
            r.addr.0,
            r.offset,
            r.function.as_deref().unwrap_or("a function")
        ),
    }
}

pub(super) fn not_an_entry(spec: &str, r: &ResolvedProbe) -> EngineError {
    let reason = match &r.not_entry {
        Some(why) if r.offset == 0 => why.clone(),
        _ => format!(
            "a return probe goes on a function's first instruction, and {:#x} is {} \
             bytes into {}",
            r.addr.0,
            r.offset,
            r.function.as_deref().unwrap_or("its function")
        ),
    };
    EngineError::RefusedSpec {
        spec: spec.into(),
        reason,
    }
}

/// `compute+0x4`.
pub(super) fn short(r: &ResolvedProbe) -> String {
    match &r.function {
        Some(f) if r.offset == 0 => f.clone(),
        Some(f) => format!("{f}+{:#x}", r.offset),
        None => format!("{:#x}", r.addr.0),
    }
}
