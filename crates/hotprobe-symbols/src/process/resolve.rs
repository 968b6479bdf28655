//! Probe specs to probes in a process: functions, lines, patterns and their boundaries.

use super::*;

impl ProcessSymbols {
    pub(super) fn probe_at(lm: &LoadedModule, link: LinkAddr, is_return: bool) -> ResolvedProbe {
        let sym = lm.module.symbolize(link);
        let fde = lm.module.fde_containing(link);
        let addr = lm.runtime(link);
        let (boundary, not_entry) = match (sym, fde) {
            (Some((s, off)), _) => (
                Some(symbol_boundary(lm, s)),
                if off != 0 {
                    Some(format!(
                        "{:#x} is {off} bytes into {}, not its entry",
                        addr.0, s.name
                    ))
                } else {
                    lm.module.function_kind(s).reason(&s.name)
                },
            ),
            (None, Some(f)) => (
                Some(Boundary {
                    start: lm.runtime(f.start),
                    end: Some(lm.runtime(f.end)),
                    source: BoundarySource::Fde,
                }),
                fde_not_entry(lm, &f, link),
            ),
            (None, None) => (
                None,
                Some(format!(
                    "{:#x} has no symbol and no .eh_frame entry in {}: not known to be \
                     a function entry",
                    addr.0, lm.name
                )),
            ),
        };
        ResolvedProbe {
            addr,
            link_addr: link,
            module: lm.name.clone(),
            function: sym.map(|(s, _)| s.name.clone()),
            offset: sym.map_or(0, |(_, off)| off),
            function_range: sym.and_then(|(s, _)| function_range(lm, s)),
            is_return,
            in_plt: lm.module.in_plt(link),
            kind: sym.map(|(s, _)| lm.module.function_kind(s)),
            not_entry,
            boundary,
            no_return: crate::no_return_reason(
                Some(lm),
                sym.filter(|(_, off)| *off == 0)
                    .map(|(s, _)| s.name.as_str()),
                link,
            ),
            semaphore: None,
            usdt_args: Vec::new(),
            usdt: false,
        }
    }

    /// Every marker `provider:name` of the named module, or of the first
    /// module (main executable first) that has one: a probe on the
    /// marker's instruction, with its semaphore.
    fn resolve_usdt(
        &self,
        spec: &ProbeSpec,
        module: Option<&str>,
        provider: &str,
        name: &str,
    ) -> Result<Vec<ResolvedProbe>, SymbolError> {
        let in_module = module.map(|m| self.find_module(m)).transpose()?;
        let candidates: Vec<&LoadedModule> = match in_module {
            Some(lm) => vec![lm],
            None => self.search_order().collect(),
        };
        for lm in candidates {
            let found: Vec<ResolvedProbe> = lm
                .module
                .usdt_markers()
                .iter()
                .filter(|m| m.provider == provider && m.name == name)
                .map(|m| {
                    let mut p = Self::probe_at(lm, LinkAddr(m.addr), false);
                    p.semaphore = m.semaphore.map(|s| lm.runtime(LinkAddr(s)));
                    p.usdt_args = m.args.clone();
                    p.usdt = true;
                    p
                })
                .collect();
            if !found.is_empty() {
                return Ok(found);
            }
        }
        let where_ = match module {
            Some(m) => m.to_string(),
            None => "any loaded module".into(),
        };
        Err(SymbolError::Unprobeable {
            spec: spec.to_string(),
            reason: format!(
                "no USDT marker {provider}:{name} in {where_} (`hotprobe list --usdt` lists them)"
            ),
        })
    }

    /// Turn a probe spec into run-time addresses.
    ///
    /// A function without module is searched in the main executable, then in
    /// the other modules in map order (first match wins). A function name
    /// that is a pattern ([`crate::pattern`]: `comp*`, `libc:getpp*`) and
    /// names no function as such gives every function matching it in the
    /// module, or in the main executable without one: one probe per
    /// address, none left out (the caller checks each); matching nothing is
    /// [`SymbolError::NoMatch`]. A line is searched
    /// in every module with DWARF; it may give several addresses (inlined or
    /// duplicated code). `%return` needs a function entry: a line's return
    /// probe is put on its containing function.
    pub fn resolve(&self, spec: &ProbeSpec) -> Result<Vec<ResolvedProbe>, SymbolError> {
        match spec {
            ProbeSpec::Function {
                module,
                name,
                offset,
                is_return,
            } => {
                if *is_return && *offset != 0 {
                    return Err(SymbolError::Unprobeable {
                        spec: spec.to_string(),
                        reason: "%return probes go on a function's entry; drop the offset".into(),
                    });
                }
                if let Some(m) = module.as_deref() {
                    if is_pattern(m) && !self.names_module(m) {
                        return self.resolve_in_modules(m, name, *offset, *is_return);
                    }
                }
                let in_module = module.as_deref().map(|m| self.find_module(m)).transpose()?;
                // A name is looked up as such first, even when it is a
                // pattern (`operator[]`, `f[abi:cxx11]`).
                let exact = match in_module {
                    Some(lm) => lm.module.find(name).map(|s| (lm, s)),
                    None => self
                        .search_order()
                        .find_map(|lm| lm.module.find(name).map(|s| (lm, s))),
                };
                // `ns::f` for several C++ overloads: each of them.
                if let Some((lm, _)) = exact {
                    let all = lm.module.overloads(name);
                    if !all.is_empty() {
                        return all
                            .into_iter()
                            .map(|s| Self::function_probe(lm, s, *offset, *is_return))
                            .collect();
                    }
                }
                let (lm, sym) = match (exact, in_module) {
                    (Some(found), _) => found,
                    (None, lm) if is_pattern(name) => {
                        return self.resolve_pattern(lm, name, *offset, *is_return);
                    }
                    (None, Some(lm)) => {
                        return Err(SymbolError::SymbolNotFound {
                            symbol: name.clone(),
                            module: lm.name.clone(),
                            similar: lm.module.similar(name),
                        });
                    }
                    (None, None) => return Err(self.not_found(name)),
                };
                Ok(vec![Self::function_probe(lm, sym, *offset, *is_return)?])
            }
            ProbeSpec::Address {
                module,
                addr,
                is_return,
            } => {
                let (lm, link) = match module {
                    Some(m) => {
                        let lm = self.find_module(m)?;
                        (lm, LinkAddr(*addr))
                    }
                    None => {
                        let rt = RuntimeAddr(*addr);
                        let lm =
                            self.module_at(rt)
                                .ok_or_else(|| SymbolError::AddressNotMapped {
                                    addr: *addr,
                                    why: "is not inside any ELF module mapped in the process"
                                        .into(),
                                })?;
                        (lm, lm.link(rt))
                    }
                };
                if !lm.module.is_executable(link) {
                    return Err(SymbolError::AddressNotMapped {
                        addr: *addr,
                        why: format!(
                            "is not in an executable segment of {} (link address {link})",
                            lm.name
                        ),
                    });
                }
                let p = Self::probe_at(lm, link, *is_return);
                if *is_return && p.offset != 0 {
                    return Err(SymbolError::Unprobeable {
                        spec: spec.to_string(),
                        reason: format!(
                            "%return probes go on a function's entry, and this address is {}+{:#x}",
                            p.function.as_deref().unwrap_or("?"),
                            p.offset
                        ),
                    });
                }
                Ok(vec![p])
            }
            ProbeSpec::Usdt {
                module,
                provider,
                name,
            } => self.resolve_usdt(spec, module.as_deref(), provider, name),
            ProbeSpec::Line {
                file,
                line,
                is_return,
            } => {
                let mut out = Vec::new();
                let mut first_err = None;
                for lm in self.search_order() {
                    match lm.module.line_addresses(file, *line) {
                        Ok(addrs) => {
                            for a in addrs {
                                let mut p = Self::probe_at(lm, a, *is_return);
                                if *is_return {
                                    if let Some((s, _)) = lm.module.symbolize(a) {
                                        p = Self::probe_at(lm, s.addr, true);
                                    }
                                }
                                if !out.contains(&p) {
                                    out.push(p);
                                }
                            }
                        }
                        Err(e @ SymbolError::LineNotFound { .. }) => {
                            // Keep the most helpful error: one that saw the file.
                            let saw_file = matches!(&e, SymbolError::LineNotFound { hint, .. }
                                if hint.starts_with("lines nearby"));
                            if first_err.is_none() || saw_file {
                                first_err = Some(e);
                            }
                        }
                        Err(_) => {}
                    }
                }
                if out.is_empty() {
                    return Err(match first_err {
                        Some(e) => e,
                        None => SymbolError::LineNotFound {
                            file: file.clone(),
                            line: *line,
                            where_: "any loaded module".into(),
                            hint: "no loaded module has DWARF line information: build with -g"
                                .into(),
                        },
                    });
                }
                Ok(out)
            }
        }
    }

    /// The probe at `offset` into function `sym` of `lm`.
    pub(super) fn function_probe(
        lm: &LoadedModule,
        sym: &Symbol,
        offset: u64,
        is_return: bool,
    ) -> Result<ResolvedProbe, SymbolError> {
        if sym.size > 0 && offset >= sym.size {
            return Err(SymbolError::OffsetPastEnd {
                function: sym.name.clone(),
                offset,
                size: sym.size,
            });
        }
        let link = LinkAddr(sym.addr.0.wrapping_add(offset));
        let mut p = Self::probe_at(lm, link, is_return);
        // Aliases at the same address: name the probe as asked.
        p.function = Some(sym.name.clone());
        if offset == 0 && p.no_return.is_none() {
            p.no_return = crate::no_return_reason(Some(lm), Some(&sym.name), link);
        }
        p.offset = offset;
        p.function_range = function_range(lm, sym);
        let kind = lm.module.function_kind(sym);
        p.not_entry = if offset != 0 {
            Some(format!(
                "{:#x} is {offset} bytes into {}, not its entry",
                p.addr.0, sym.name
            ))
        } else {
            kind.reason(&sym.name)
        };
        p.kind = Some(kind);
        // A label is a place inside a function: decoding starts at the
        // function (or FDE) around it, as `probe_at` found.
        if sym.kind != FunctionKind::Label {
            p.boundary = Some(symbol_boundary(lm, sym));
        }
        Ok(p)
    }

    /// Whether some module is named `m` exactly (file name or path), so a
    /// module name with glob characters is taken as a name first.
    pub(super) fn names_module(&self, m: &str) -> bool {
        self.modules
            .iter()
            .any(|lm| lm.name == m || lm.path.as_os_str() == m)
    }

    /// Whether `lm` is hotprobe's own agent (a memfd or
    /// `libhotprobe_agent*` mapping): never probed through a module glob.
    pub(super) fn is_agent(lm: &LoadedModule) -> bool {
        lm.name.starts_with("libhotprobe_agent") || lm.path.to_string_lossy().contains("memfd:")
    }

    /// `name` (a function name or pattern) in every loaded module whose file
    /// name matches the pattern `module_pat` (`*`, `lib*`), main executable
    /// first, the agent left out: the matches of every module, concatenated.
    /// A module without a match adds nothing; none at all is
    /// [`SymbolError::NoMatch`].
    pub(super) fn resolve_in_modules(
        &self,
        module_pat: &str,
        name: &str,
        offset: u64,
        is_return: bool,
    ) -> Result<Vec<ResolvedProbe>, SymbolError> {
        let mpat = NamePattern::new(module_pat)?;
        let mut out = Vec::new();
        let mut any_module = false;
        for lm in self.search_order() {
            if Self::is_agent(lm) || !mpat.matches(&lm.name) {
                continue;
            }
            any_module = true;
            if let Some(sym) = lm.module.find(name) {
                out.push(Self::function_probe(lm, sym, offset, is_return)?);
                continue;
            }
            if !is_pattern(name) {
                continue;
            }
            match self.resolve_pattern(Some(lm), name, offset, is_return) {
                Ok(v) => out.extend(v),
                Err(SymbolError::NoMatch { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        if out.is_empty() {
            return Err(SymbolError::NoMatch {
                pattern: format!("{module_pat}:{name}"),
                module: if any_module {
                    format!("the modules matching {module_pat:?}")
                } else {
                    format!(
                        "any module (none matches {module_pat:?}; loaded: {})",
                        self.names().join(", ")
                    )
                },
            });
        }
        Ok(out)
    }

    /// Every function of `lm` (default: the main executable) whose demangled
    /// or raw name matches `pattern`, one per address (the preferred alias
    /// among those matching), each named by its match. None is left out:
    /// the caller checks each. An offset applies to every match and must be
    /// inside each.
    pub(super) fn resolve_pattern(
        &self,
        lm: Option<&LoadedModule>,
        pattern: &str,
        offset: u64,
        is_return: bool,
    ) -> Result<Vec<ResolvedProbe>, SymbolError> {
        let pat = NamePattern::new(pattern)?;
        let lm = lm
            .or_else(|| self.main_module())
            .ok_or_else(|| SymbolError::NoMatch {
                pattern: pattern.to_string(),
                module: "the main executable (it is not mapped)".into(),
            })?;
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for sym in lm.module.functions() {
            if (pat.matches(&sym.name) || pat.matches(&sym.raw_name)) && seen.insert(sym.addr) {
                out.push(Self::function_probe(lm, sym, offset, is_return)?);
            }
        }
        if out.is_empty() {
            return Err(SymbolError::NoMatch {
                pattern: pattern.to_string(),
                module: lm.name.clone(),
            });
        }
        Ok(out)
    }

    pub(super) fn not_found(&self, name: &str) -> SymbolError {
        let mut similar = Vec::new();
        for lm in self.search_order() {
            for s in lm.module.similar(name) {
                if similar.len() < 5 && !similar.contains(&s) {
                    similar.push(s);
                }
            }
        }
        let module = match self.main_module() {
            Some(m) => format!(
                "{} or any of its {} loaded modules",
                m.name,
                self.modules.len()
            ),
            None => format!("any of the {} loaded modules", self.modules.len()),
        };
        SymbolError::SymbolNotFound {
            symbol: name.to_string(),
            module,
            similar,
        }
    }
}

/// The start of symbol `s` as an instruction boundary.
fn symbol_boundary(lm: &LoadedModule, s: &Symbol) -> Boundary {
    Boundary {
        start: lm.runtime(s.addr),
        end: function_range(lm, s).map(|r| r.end),
        source: BoundarySource::Function(s.name.clone()),
    }
}

/// Why `link`, in FDE `f` and under no symbol, is not a function entry.
fn fde_not_entry(lm: &LoadedModule, f: &Fde, link: LinkAddr) -> Option<String> {
    let addr = lm.runtime(link).0;
    if let Some(parent) = lm.module.dwarf_piece_of(link) {
        return Some(format!(
            "{addr:#x} has no symbol, and DWARF has it start a piece of {parent} other than its \
             entry (a cold partition): not a function entry, its [rsp] is not a return address"
        ));
    }
    if link != f.start {
        return Some(format!(
            "{addr:#x} is {} bytes into the code of the .eh_frame FDE at {:#x} (no symbol), \
             not an entry",
            link.0 - f.start.0,
            lm.runtime(f.start).0
        ));
    }
    if f.return_address_on_top() {
        // An entry, or a cold part jumped to with nothing pushed: either
        // way `[rsp]` is the return address here.
        return None;
    }
    let cfa = match f.cfa_rsp_offset {
        Some(o) => format!("CFA = rsp{o:+}"),
        None => "the CFA is not rsp-based".to_string(),
    };
    Some(format!(
        "{addr:#x} starts an .eh_frame FDE but has no symbol, and [rsp] is not the return \
         address there ({cfa}): code jumped to (e.g. a function's cold partition), not a \
         function entry"
    ))
}

fn function_range(lm: &LoadedModule, s: &Symbol) -> Option<Range<RuntimeAddr>> {
    (s.size > 0).then(|| lm.runtime(s.addr)..lm.runtime(LinkAddr(s.addr.0.wrapping_add(s.size))))
}
