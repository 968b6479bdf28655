//! Source lines from DWARF: the line table to addresses, an address to its file and line.

use super::*;

impl ElfModule {
    /// The link addresses where code for `file:line` starts, from the DWARF
    /// line table: of the `is_stmt` rows for that line in files whose path
    /// ends with `file` (component-wise), the lowest address in each function
    /// (or line-table sequence, outside known functions). Sorted, deduplicated.
    pub fn line_addresses(&self, file: &str, line: u32) -> Result<Vec<LinkAddr>, SymbolError> {
        let dwarf = self.dwarf().ok_or_else(|| SymbolError::NoDebugInfo {
            path: self.path.clone(),
        })?;
        let exec = self.exec_ranges();
        let mut hits: BTreeMap<(u8, u64, u64), u64> = BTreeMap::new();
        let mut file_seen = false;
        let mut lines_seen: BTreeSet<u64> = BTreeSet::new();
        let mut units = dwarf.units();
        let mut unit_no: u64 = 0;
        while let Ok(Some(header)) = units.next() {
            unit_no += 1;
            let Ok(unit) = dwarf.unit(header) else {
                continue;
            };
            let Some(program) = unit.line_program.clone() else {
                continue;
            };
            let mut matches: HashMap<u64, bool> = HashMap::new();
            let mut seq: u64 = 0;
            let mut rows = program.rows();
            while let Ok(Some((lh, row))) = rows.next_row() {
                if row.end_sequence() {
                    seq += 1;
                    continue;
                }
                if !row.is_stmt() {
                    continue;
                }
                let fidx = row.file_index();
                let is_match = *matches.entry(fidx).or_insert_with(|| {
                    lh.file(fidx)
                        .and_then(|f| file_path(dwarf, &unit, lh, f))
                        .is_some_and(|p| path_suffix_matches(&p, file))
                });
                if !is_match {
                    continue;
                }
                file_seen = true;
                let Some(l) = row.line() else { continue };
                let addr = LinkAddr(row.address());
                if !exec.is_empty() && !exec.iter().any(|r| r.contains(&addr)) {
                    continue;
                }
                lines_seen.insert(l.get());
                if l.get() != u64::from(line) {
                    continue;
                }
                let key = match self.symbolize(addr) {
                    Some((s, _)) => (0, s.addr.0, 0),
                    None => (1, unit_no, seq),
                };
                let e = hits.entry(key).or_insert(addr.0);
                *e = (*e).min(addr.0);
            }
        }
        let mut out: Vec<LinkAddr> = hits.into_values().map(LinkAddr).collect();
        out.sort();
        out.dedup();
        if out.is_empty() {
            let hint = if !file_seen {
                format!("no compilation unit has a source file ending in {file:?}")
            } else {
                let after = lines_seen.range(u64::from(line)..).take(3);
                let before = lines_seen.range(..u64::from(line)).rev().take(3);
                let mut near: Vec<u64> = before.chain(after).copied().collect();
                near.sort();
                if near.is_empty() {
                    String::new()
                } else {
                    let near: Vec<String> = near.iter().map(u64::to_string).collect();
                    format!("lines nearby with code: {}", near.join(", "))
                }
            };
            return Err(SymbolError::LineNotFound {
                file: file.to_string(),
                line,
                where_: self.path.display().to_string(),
                hint,
            });
        }
        Ok(out)
    }

    /// The source file and line of `addr`, from DWARF.
    pub fn source_location(&self, addr: LinkAddr) -> Option<(String, u32)> {
        // addr2line looks up `addr..addr + 1` and overflows on the last
        // address (found by fuzzing); no code lives there anyway.
        addr.0.checked_add(1)?;
        let dwarf = self.dwarf()?;
        let mut guard = self.a2l.lock().ok()?;
        if guard.is_none() {
            *guard = Some(addr2line::Context::from_arc_dwarf(dwarf.clone()).ok()?);
        }
        let ctx = guard.as_ref()?;
        let loc = ctx.find_location(addr.0).ok()??;
        Some((loc.file?.to_string(), loc.line?))
    }

    pub(super) fn dwarf(&self) -> Option<&Arc<gimli::Dwarf<Reader>>> {
        self.dwarf
            .get_or_init(|| {
                let (_, bytes) = self.dwarf_bytes.as_ref()?;
                load_dwarf(bytes).map(Arc::new)
            })
            .as_ref()
    }
}

fn load_dwarf(bytes: &Arc<[u8]>) -> Option<gimli::Dwarf<Reader>> {
    let file = object::File::parse(&**bytes).ok()?;
    let endian = if file.is_little_endian() {
        gimli::RunTimeEndian::Little
    } else {
        gimli::RunTimeEndian::Big
    };
    let load = |id: gimli::SectionId| -> Result<Reader, gimli::Error> {
        let data: Arc<[u8]> = match file.section_by_name(id.name()) {
            Some(sec) => match sec.uncompressed_data() {
                Ok(d) => Arc::from(&*d),
                Err(_) => Arc::from(&[][..]),
            },
            None => Arc::from(&[][..]),
        };
        Ok(gimli::EndianArcSlice::new(data, endian))
    };
    gimli::Dwarf::load(load).ok()
}

fn attr_str(
    dwarf: &gimli::Dwarf<Reader>,
    unit: &gimli::Unit<Reader>,
    v: gimli::AttributeValue<Reader>,
) -> Option<String> {
    use gimli::Reader as _;
    let r = dwarf.attr_string(unit, v).ok()?;
    let s = r.to_string_lossy().ok()?.into_owned();
    Some(s)
}

/// The full path of a line-table file entry (as far as DWARF says).
fn file_path(
    dwarf: &gimli::Dwarf<Reader>,
    unit: &gimli::Unit<Reader>,
    header: &gimli::LineProgramHeader<Reader>,
    file: &gimli::FileEntry<Reader>,
) -> Option<String> {
    let name = attr_str(dwarf, unit, file.path_name())?;
    if name.starts_with('/') {
        return Some(name);
    }
    let mut path = file
        .directory(header)
        .and_then(|d| attr_str(dwarf, unit, d))
        .unwrap_or_default();
    if !path.starts_with('/') {
        if let Some(comp) = unit.comp_dir.as_ref() {
            use gimli::Reader as _;
            if let Ok(c) = comp.to_string_lossy() {
                path = if path.is_empty() {
                    c.into_owned()
                } else {
                    format!("{c}/{path}")
                };
            }
        }
    }
    Some(if path.is_empty() {
        name
    } else {
        format!("{path}/{name}")
    })
}

/// Whether `full` ends with the path components of `want` ("prog.c"
/// matches "/tmp/x/prog.c", "x/prog.c" too, "rog.c" does not). An absolute
/// `want` must match all of `full`.
pub(crate) fn path_suffix_matches(full: &str, want: &str) -> bool {
    let comps = |s: &str| -> Vec<String> {
        s.split('/')
            .filter(|c| !c.is_empty() && *c != ".")
            .map(str::to_string)
            .collect()
    };
    let f = comps(full);
    let w = comps(want);
    if w.is_empty() || w.len() > f.len() {
        return false;
    }
    if want.starts_with('/') && w.len() != f.len() {
        return false;
    }
    f.get(f.len() - w.len()..) == Some(&w[..])
}
