//! The probe table (`symbols.tsv`): probe id → function name, module,
//! address, kind, and what the writer keeps of its arguments.

use std::io::Write;
use std::path::Path;

use crate::error::{Result, TraceError};

/// What a probe observes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProbeKind {
    /// Function entry and exit.
    Function,
    /// Function entry only.
    Entry,
    /// A mid-function site.
    Hit,
    /// A phase marker (any of its events starts a phase).
    Marker,
}

impl ProbeKind {
    /// The name in `symbols.tsv`.
    pub fn as_str(self) -> &'static str {
        match self {
            ProbeKind::Function => "function",
            ProbeKind::Entry => "entry",
            ProbeKind::Hit => "hit",
            ProbeKind::Marker => "marker",
        }
    }

    fn parse(s: &str) -> Option<ProbeKind> {
        Some(match s {
            "function" => ProbeKind::Function,
            "entry" => ProbeKind::Entry,
            "hit" => ProbeKind::Hit,
            "marker" => ProbeKind::Marker,
            _ => return None,
        })
    }
}

/// One probe of the trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    /// Probe id (events carry it).
    pub id: u32,
    /// Function name (demangled), or the probe's display name.
    pub name: String,
    /// Module (executable or library path); may be empty.
    pub module: String,
    /// Run-time address of the probe site.
    pub addr: u64,
    /// Kind.
    pub kind: ProbeKind,
    /// Argument values the writer keeps for entries and hits (0–6).
    pub nargs: u8,
    /// Whether the writer keeps the return value of exits.
    pub retval: bool,
}

impl Symbol {
    /// A function probe keeping no arguments and no return value.
    pub fn function(id: u32, name: impl Into<String>) -> Symbol {
        Symbol {
            id,
            name: name.into(),
            module: String::new(),
            addr: 0,
            kind: ProbeKind::Function,
            nargs: 0,
            retval: false,
        }
    }
}

/// All probes of a trace, indexed by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SymbolTable {
    by_id: Vec<Option<Symbol>>,
    len: usize,
}

/// Name shown for a probe id missing from the table.
pub fn unknown_name(id: u32) -> String {
    format!("probe#{id}")
}

const HEADER: &str = "#id\tname\tmodule\taddr\tkind\tnargs\tretval";
const MAX_ID: u32 = 1 << 24;

impl SymbolTable {
    /// A table of these symbols (a later duplicate id replaces an earlier one).
    pub fn new(symbols: impl IntoIterator<Item = Symbol>) -> Result<SymbolTable> {
        let mut t = SymbolTable::default();
        for s in symbols {
            t.insert(s)?;
        }
        Ok(t)
    }

    /// Adds or replaces a symbol.
    pub fn insert(&mut self, s: Symbol) -> Result<()> {
        if s.id >= MAX_ID {
            return Err(TraceError::Invalid(format!(
                "probe id {} too large (limit {MAX_ID})",
                s.id
            )));
        }
        let i = s.id as usize;
        if self.by_id.len() <= i {
            self.by_id.resize(i + 1, None);
        }
        if self.by_id[i].is_none() {
            self.len += 1;
        }
        self.by_id[i] = Some(s);
        Ok(())
    }

    /// The symbol of a probe id.
    pub fn get(&self, id: u32) -> Option<&Symbol> {
        self.by_id.get(id as usize).and_then(|s| s.as_ref())
    }

    /// The name of a probe id (`probe#ID` when unknown).
    pub fn name(&self, id: u32) -> std::borrow::Cow<'_, str> {
        match self.get(id) {
            Some(s) => std::borrow::Cow::Borrowed(&s.name),
            None => std::borrow::Cow::Owned(unknown_name(id)),
        }
    }

    /// Number of symbols.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// One past the largest id.
    pub fn id_bound(&self) -> u32 {
        self.by_id.len() as u32
    }

    /// The symbols in id order.
    pub fn iter(&self) -> impl Iterator<Item = &Symbol> {
        self.by_id.iter().flatten()
    }

    /// Writes the TSV text.
    pub fn write_tsv(&self, w: &mut impl Write) -> std::io::Result<()> {
        writeln!(w, "{HEADER}")?;
        for s in self.iter() {
            writeln!(
                w,
                "{}\t{}\t{}\t{:#x}\t{}\t{}\t{}",
                s.id,
                escape(&s.name),
                escape(&s.module),
                s.addr,
                s.kind.as_str(),
                s.nargs,
                u8::from(s.retval)
            )?;
        }
        Ok(())
    }

    /// Parses the TSV text (`path` only names the file in errors).
    pub fn parse_tsv(text: &str, path: &Path) -> Result<SymbolTable> {
        let err = |line: usize, what: String| TraceError::Symbols {
            path: path.to_path_buf(),
            line,
            what,
        };
        if !text.is_empty() && !text.ends_with('\n') {
            let line = text.lines().count();
            return Err(err(
                line,
                "last line not terminated (file truncated?)".into(),
            ));
        }
        let mut t = SymbolTable::default();
        for (i, line) in text.lines().enumerate() {
            let n = i + 1;
            if i == 0 {
                if line != HEADER {
                    return Err(err(n, format!("expected header {HEADER:?}")));
                }
                continue;
            }
            let f: Vec<&str> = line.split('\t').collect();
            if f.len() != 7 {
                return Err(err(n, format!("{} fields, expected 7", f.len())));
            }
            let id: u32 = f[0]
                .parse()
                .map_err(|_| err(n, format!("bad probe id {:?}", f[0])))?;
            let addr = f[3]
                .strip_prefix("0x")
                .and_then(|h| u64::from_str_radix(h, 16).ok())
                .ok_or_else(|| err(n, format!("bad address {:?}", f[3])))?;
            let kind =
                ProbeKind::parse(f[4]).ok_or_else(|| err(n, format!("bad kind {:?}", f[4])))?;
            let nargs: u8 = f[5]
                .parse()
                .ok()
                .filter(|&v: &u8| v as usize <= crate::MAX_ARGS)
                .ok_or_else(|| err(n, format!("bad nargs {:?}", f[5])))?;
            let retval = match f[6] {
                "0" => false,
                "1" => true,
                o => return Err(err(n, format!("bad retval flag {o:?}"))),
            };
            if t.get(id).is_some() {
                return Err(err(n, format!("duplicate probe id {id}")));
            }
            t.insert(Symbol {
                id,
                name: unescape(f[1]).map_err(|e| err(n, e))?,
                module: unescape(f[2]).map_err(|e| err(n, e))?,
                addr,
                kind,
                nargs,
                retval,
            })
            .map_err(|e| err(n, e.to_string()))?;
        }
        Ok(t)
    }
}

fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '\t' => o.push_str("\\t"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            c => o.push(c),
        }
    }
    o
}

fn unescape(s: &str) -> std::result::Result<String, String> {
    let mut o = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c != '\\' {
            o.push(c);
            continue;
        }
        match it.next() {
            Some('\\') => o.push('\\'),
            Some('t') => o.push('\t'),
            Some('n') => o.push('\n'),
            Some('r') => o.push('\r'),
            other => return Err(format!("bad escape \\{}", other.unwrap_or(' '))),
        }
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tsv_roundtrip() {
        let mut s = Symbol::function(3, "a\tb\\c");
        s.module = "/bin/x y".into();
        s.addr = 0x401000;
        s.nargs = 2;
        s.retval = true;
        let t = SymbolTable::new([s, Symbol::function(0, "main")]).unwrap();
        let mut out = Vec::new();
        t.write_tsv(&mut out).unwrap();
        let back =
            SymbolTable::parse_tsv(std::str::from_utf8(&out).unwrap(), Path::new("s")).unwrap();
        assert_eq!(back, t);
        assert!(SymbolTable::parse_tsv(
            std::str::from_utf8(&out[..out.len() - 1]).unwrap(),
            Path::new("s")
        )
        .is_err());
    }
}
