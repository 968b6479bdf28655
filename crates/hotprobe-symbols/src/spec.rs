//! Probe specifications: `[module:]function[+offset]`, `[module:]0xADDR`,
//! `file.c:LINE`, each optionally followed by `%return`.

use std::fmt;
use std::str::FromStr;

use crate::error::{cut, SymbolError};

/// Longest accepted spec, in bytes.
pub const MAX_SPEC_LEN: usize = 4096;

/// The suffix that makes a probe a return probe.
pub const RETURN_SUFFIX: &str = "%return";

/// Where to put a probe, as the user wrote it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ProbeSpec {
    /// A function (plus an offset into it), optionally in a given module.
    Function {
        /// Module (file name, prefix of it, or path); `None` searches the
        /// main executable first, then every other module.
        module: Option<String>,
        /// Function name (raw, demangled or short form).
        name: String,
        /// Byte offset from the function's start.
        offset: u64,
        /// Probe the function's return instead.
        is_return: bool,
    },
    /// An address: link-time in `module`'s file, or an absolute run-time
    /// address when `module` is `None`.
    Address {
        /// Module whose link-time address space `addr` is in.
        module: Option<String>,
        /// The address.
        addr: u64,
        /// Probe the return of the function starting there.
        is_return: bool,
    },
    /// A USDT (SystemTap SDT) marker: `usdt:[MODULE:]PROVIDER:NAME`, in
    /// the main executable first, then every other module, unless a module
    /// is named. Every marker of that name is probed.
    Usdt {
        /// The module, when named.
        module: Option<String>,
        /// The provider (`python`).
        provider: String,
        /// The marker's name (`gc__start`).
        name: String,
    },
    /// A source line (from DWARF), in any module.
    Line {
        /// Source file name or path suffix (`prog.c`, `src/prog.c`).
        file: String,
        /// 1-based line number.
        line: u32,
        /// Probe the return of the function containing the line.
        is_return: bool,
    },
}

impl ProbeSpec {
    /// Whether this is a return probe (`%return`).
    pub fn is_return(&self) -> bool {
        match self {
            ProbeSpec::Function { is_return, .. }
            | ProbeSpec::Address { is_return, .. }
            | ProbeSpec::Line { is_return, .. } => *is_return,
            ProbeSpec::Usdt { .. } => false,
        }
    }

    /// The module the spec names, if any.
    pub fn module(&self) -> Option<&str> {
        match self {
            ProbeSpec::Function { module, .. }
            | ProbeSpec::Address { module, .. }
            | ProbeSpec::Usdt { module, .. } => module.as_deref(),
            ProbeSpec::Line { .. } => None,
        }
    }
}

fn bad(spec: &str, reason: impl Into<String>) -> SymbolError {
    SymbolError::BadSpec {
        spec: cut(spec, 200),
        reason: reason.into(),
    }
}

/// Parse `0x1a` (hex) or `26` (decimal).
fn parse_number(s: &str) -> Option<u64> {
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        if hex.is_empty() || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        u64::from_str_radix(hex, 16).ok()
    } else {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        s.parse().ok()
    }
}

fn is_hex_literal(s: &str) -> bool {
    s.starts_with("0x") || s.starts_with("0X")
}

/// The byte index of the first `:` that is not part of a `::`.
fn module_separator(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b':' {
            if b.get(i + 1) == Some(&b':') {
                i += 2;
                continue;
            }
            return Some(i);
        }
        i += 1;
    }
    None
}

fn check_module(spec: &str, m: &str) -> Result<(), SymbolError> {
    if m.is_empty() {
        return Err(bad(spec, "empty module name before ':'"));
    }
    if m.contains("::") {
        return Err(bad(spec, "module names cannot contain '::'"));
    }
    if m.chars()
        .any(|c| c.is_whitespace() || c.is_control() || c == '%')
    {
        return Err(bad(spec, "module name contains whitespace or '%'"));
    }
    Ok(())
}

fn parse_function(
    spec: &str,
    module: Option<String>,
    body: &str,
    is_return: bool,
) -> Result<ProbeSpec, SymbolError> {
    // An offset follows the last '+' unless that '+' ends the name
    // (C++ `operator+`, `operator++`).
    let is_operator = body.contains("operator");
    let (name, offset) = match body.rfind('+') {
        // `ns::operator+=` is a name, not an offset.
        Some(i) if is_operator && parse_number(&body[i + 1..]).is_none() => (body, 0),
        Some(i) if i + 1 < body.len() => {
            let (name, off) = (&body[..i], &body[i + 1..]);
            let offset = parse_number(off).ok_or_else(|| {
                bad(
                    spec,
                    format!("bad offset {off:?}: use hex (0x1a) or decimal (26)"),
                )
            })?;
            (name, offset)
        }
        _ => (body, 0),
    };
    if name.is_empty() {
        return Err(bad(spec, "missing function name"));
    }
    if name
        .rfind('+')
        .is_some_and(|i| parse_number(&name[i + 1..]).is_some())
    {
        return Err(bad(spec, "only one +offset is allowed"));
    }
    if name.contains('+') && !name.contains("operator") {
        return Err(bad(
            spec,
            "'+' must be followed by an offset (hex 0x1a or decimal 26)",
        ));
    }
    if name.chars().any(char::is_control) || name.contains('%') {
        return Err(bad(
            spec,
            "function name contains control characters or '%'",
        ));
    }
    if name.starts_with(char::is_whitespace) || name.ends_with(char::is_whitespace) {
        return Err(bad(spec, "function name starts or ends with whitespace"));
    }
    if name.starts_with(|c: char| c.is_ascii_digit()) {
        return Err(bad(
            spec,
            "a function name cannot start with a digit (addresses need a 0x prefix)",
        ));
    }
    Ok(ProbeSpec::Function {
        module,
        name: name.to_string(),
        offset,
        is_return,
    })
}

impl FromStr for ProbeSpec {
    type Err = SymbolError;

    fn from_str(spec: &str) -> Result<Self, SymbolError> {
        if spec.len() > MAX_SPEC_LEN {
            return Err(bad(spec, format!("longer than {MAX_SPEC_LEN} bytes")));
        }
        let s = spec.trim();
        if s.is_empty() {
            return Err(bad(spec, "empty"));
        }
        let (s, is_return) = match s.strip_suffix(RETURN_SUFFIX) {
            Some(rest) => (rest, true),
            None => (s, false),
        };
        if s.is_empty() {
            return Err(bad(spec, "nothing before %return"));
        }
        if s.contains('%') {
            return Err(bad(spec, "the only suffix allowed is %return"));
        }
        if let Some(rest) = s.strip_prefix(USDT_PREFIX) {
            return parse_usdt(spec, rest, is_return);
        }
        let Some(colon) = module_separator(s) else {
            if is_hex_literal(s) {
                let addr = parse_number(s).ok_or_else(|| bad(spec, "bad hex address"))?;
                return Ok(ProbeSpec::Address {
                    module: None,
                    addr,
                    is_return,
                });
            }
            return parse_function(spec, None, s, is_return);
        };
        let (left, right) = (&s[..colon], &s[colon + 1..]);
        if left.is_empty() {
            return Err(bad(spec, "nothing before ':'"));
        }
        if right.is_empty() {
            return Err(bad(spec, "nothing after ':'"));
        }
        if let Some(digits) = right.strip_prefix(['-', '+']) {
            if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad(
                    spec,
                    format!("bad line number {right}: line numbers start at 1"),
                ));
            }
        }
        if right.bytes().all(|b| b.is_ascii_digit()) {
            if !left.contains('.') {
                return Err(bad(
                    spec,
                    "a line probe needs a source file name with an extension (prog.c:12)",
                ));
            }
            if left.chars().any(char::is_control) || left.contains("::") {
                return Err(bad(spec, "bad source file name"));
            }
            let line: u32 = right
                .parse()
                .map_err(|_| bad(spec, "line number too large"))?;
            if line == 0 {
                return Err(bad(spec, "line numbers start at 1"));
            }
            return Ok(ProbeSpec::Line {
                file: left.to_string(),
                line,
                is_return,
            });
        }
        check_module(spec, left)?;
        if is_hex_literal(right) {
            let addr = parse_number(right).ok_or_else(|| bad(spec, "bad hex address"))?;
            return Ok(ProbeSpec::Address {
                module: Some(left.to_string()),
                addr,
                is_return,
            });
        }
        if module_separator(right).is_some() {
            return Err(bad(spec, "more than one module separator ':'"));
        }
        parse_function(spec, Some(left.to_string()), right, is_return)
    }
}

/// What a USDT spec starts with.
pub const USDT_PREFIX: &str = "usdt:";

/// `[MODULE:]PROVIDER:NAME` after `usdt:`.
fn parse_usdt(spec: &str, rest: &str, is_return: bool) -> Result<ProbeSpec, SymbolError> {
    if is_return {
        return Err(bad(
            spec,
            "a USDT marker is one instruction, not a function: it has no %return",
        ));
    }
    let parts: Vec<&str> = rest.split(':').collect();
    let ident = |p: &str| {
        !p.is_empty()
            && p.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
    };
    let (module, provider, name) = match parts.as_slice() {
        [p, n] => (None, *p, *n),
        [m, p, n] => {
            check_module(spec, m)?;
            (Some((*m).to_string()), *p, *n)
        }
        _ => {
            return Err(bad(
                spec,
                "a USDT probe is usdt:PROVIDER:NAME or usdt:MODULE:PROVIDER:NAME",
            ))
        }
    };
    if !ident(provider) || !ident(name) {
        return Err(bad(spec, "a USDT provider and name are identifiers"));
    }
    Ok(ProbeSpec::Usdt {
        module,
        provider: provider.to_string(),
        name: name.to_string(),
    })
}

impl fmt::Display for ProbeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProbeSpec::Function {
                module,
                name,
                offset,
                ..
            } => {
                if let Some(m) = module {
                    write!(f, "{m}:")?;
                }
                write!(f, "{name}")?;
                if *offset != 0 {
                    write!(f, "+{offset:#x}")?;
                }
            }
            ProbeSpec::Address { module, addr, .. } => {
                if let Some(m) = module {
                    write!(f, "{m}:")?;
                }
                write!(f, "{addr:#x}")?;
            }
            ProbeSpec::Line { file, line, .. } => write!(f, "{file}:{line}")?,
            ProbeSpec::Usdt {
                module,
                provider,
                name,
            } => {
                write!(f, "{USDT_PREFIX}")?;
                if let Some(m) = module {
                    write!(f, "{m}:")?;
                }
                write!(f, "{provider}:{name}")?;
            }
        }
        if self.is_return() {
            f.write_str(RETURN_SUFFIX)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn func(module: Option<&str>, name: &str, offset: u64, is_return: bool) -> ProbeSpec {
        ProbeSpec::Function {
            module: module.map(str::to_string),
            name: name.to_string(),
            offset,
            is_return,
        }
    }

    #[test]
    fn good_specs() {
        let table: Vec<(&str, ProbeSpec)> = vec![
            ("main", func(None, "main", 0, false)),
            ("main+0x1a", func(None, "main", 0x1a, false)),
            ("main+26", func(None, "main", 26, false)),
            ("main%return", func(None, "main", 0, true)),
            ("libc:malloc", func(Some("libc"), "malloc", 0, false)),
            (
                "libc.so.6:malloc+4%return",
                func(Some("libc.so.6"), "malloc", 4, true),
            ),
            ("ns::f", func(None, "ns::f", 0, false)),
            ("ns::inner::f+0x10", func(None, "ns::inner::f", 0x10, false)),
            ("prog:ns::f", func(Some("prog"), "ns::f", 0, false)),
            ("ns::f(int)", func(None, "ns::f(int)", 0, false)),
            (
                "libstdc++.so.6:std::terminate",
                func(Some("libstdc++.so.6"), "std::terminate", 0, false),
            ),
            ("ns::operator+", func(None, "ns::operator+", 0, false)),
            ("ns::operator++0x4", func(None, "ns::operator+", 4, false)),
            ("ns::operator+=", func(None, "ns::operator+=", 0, false)),
            ("ns::operator++", func(None, "ns::operator++", 0, false)),
            (
                "malloc@@GLIBC_2.2.5",
                func(None, "malloc@@GLIBC_2.2.5", 0, false),
            ),
            (
                "0x401000",
                ProbeSpec::Address {
                    module: None,
                    addr: 0x401000,
                    is_return: false,
                },
            ),
            (
                "prog:0x1139%return",
                ProbeSpec::Address {
                    module: Some("prog".into()),
                    addr: 0x1139,
                    is_return: true,
                },
            ),
            (
                "/usr/lib/x86_64-linux-gnu/libc.so.6:0x100",
                ProbeSpec::Address {
                    module: Some("/usr/lib/x86_64-linux-gnu/libc.so.6".into()),
                    addr: 0x100,
                    is_return: false,
                },
            ),
            (
                "prog.c:12",
                ProbeSpec::Line {
                    file: "prog.c".into(),
                    line: 12,
                    is_return: false,
                },
            ),
            (
                "src/a.rs:7%return",
                ProbeSpec::Line {
                    file: "src/a.rs".into(),
                    line: 7,
                    is_return: true,
                },
            ),
            ("  main  ", func(None, "main", 0, false)),
        ];
        for (text, want) in table {
            let got: ProbeSpec = text.parse().unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(got, want, "{text}");
            let again: ProbeSpec = got.to_string().parse().unwrap();
            assert_eq!(again, got, "round trip of {text} via {got}");
        }
    }

    #[test]
    fn bad_specs() {
        let long = "a".repeat(MAX_SPEC_LEN + 1);
        for text in [
            "",
            "   ",
            "%return",
            "f+zz",
            "f+",
            "+4",
            "a:",
            ":b",
            "a:b:c",
            "x:12",
            "prog.c:0",
            "prog.c:-1",
            "prog.c:+3",
            "lib.so:-0",
            "prog.c:99999999999",
            "0x",
            "0xzz",
            "0x10000000000000000",
            "m:0xg",
            "f%ret",
            "f%return%return",
            "12abc",
            "f+0x",
            "x+1+2",
            "operator+1+0",
            "f+-1",
            "mod ule:f",
            "a::b:c",
            long.as_str(),
        ] {
            let e = text.parse::<ProbeSpec>();
            assert!(e.is_err(), "{text:?} parsed as {:?}", e.ok());
            let msg = e.unwrap_err().to_string();
            assert!(msg.contains("bad probe spec"), "{msg}");
        }
    }
}
