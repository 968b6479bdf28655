//! The probe list: what ColdPatch found, in a small line-oriented text
//! format (documented in the crate README).

use std::fmt;

/// What a listed site was before ColdPatch turned it into a placeholder.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SiteKind {
    /// `call __cyg_profile_func_enter` (now a NOP): function entry.
    Entry,
    /// `call __cyg_profile_func_exit` (now a NOP): function exit.
    Exit,
    /// `jmp __cyg_profile_func_exit` (a tail call, now `ret` + NOP): the
    /// hot patcher writes `jmp stub`, the stub calls the exit trampoline and
    /// returns (see `hotprobe_abi::patch::tail_exit_stub`).
    ExitTail,
    /// `call mcount` / `call __fentry__` (now a NOP): function entry (`-pg`).
    Mcount,
}

impl SiteKind {
    /// The keyword used in the text format.
    pub fn as_str(self) -> &'static str {
        match self {
            SiteKind::Entry => "entry",
            SiteKind::Exit => "exit",
            SiteKind::ExitTail => "exit-tail",
            SiteKind::Mcount => "mcount",
        }
    }

    fn parse(s: &str) -> Option<SiteKind> {
        Some(match s {
            "entry" => SiteKind::Entry,
            "exit" => SiteKind::Exit,
            "exit-tail" => SiteKind::ExitTail,
            "mcount" => SiteKind::Mcount,
            _ => return None,
        })
    }
}

/// One placeholder site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeSite {
    /// Offset of the site in the ELF file.
    pub offset: u64,
    /// Link-time virtual address of the site (add the load bias at run time).
    pub vaddr: u64,
    /// Bytes of the placeholder (5, or 6 for a former `call [rip+GOT]`).
    pub len: u8,
    /// What the site was.
    pub kind: SiteKind,
    /// Containing function (symbol name as in the symbol table), if known.
    pub function: Option<String>,
    /// `file:line` from DWARF, if present.
    pub location: Option<String>,
}

/// The sites of one coldpatched binary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProbeList {
    /// The binary's GNU build id, to check that a list belongs to a binary.
    pub build_id: Option<Vec<u8>>,
    /// The sites, by increasing offset.
    pub sites: Vec<ProbeSite>,
}

/// A malformed probe list.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("probe list line {line}: {msg}")]
pub struct ParseError {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub msg: String,
}

/// First line of every probe list.
pub const MAGIC_LINE: &str = "hotprobe-probes 1";

fn field(s: &Option<String>) -> String {
    match s {
        // Tabs and line breaks would break the format; names never hold them.
        Some(v) if !v.is_empty() && v != "-" => v.replace(['\t', '\n', '\r'], "?"),
        _ => "-".to_string(),
    }
}

fn hex(s: &str) -> Option<u64> {
    u64::from_str_radix(s.strip_prefix("0x")?, 16).ok()
}

impl ProbeList {
    /// Serialises the list (see the README for the format).
    pub fn to_text(&self) -> String {
        let mut out = String::new();
        out.push_str(MAGIC_LINE);
        out.push('\n');
        match &self.build_id {
            Some(b) if !b.is_empty() => {
                out.push_str("build-id ");
                for x in b {
                    out.push_str(&format!("{x:02x}"));
                }
                out.push('\n');
            }
            _ => out.push_str("build-id -\n"),
        }
        for s in &self.sites {
            out.push_str(&format!(
                "site\t{:#x}\t{:#x}\t{}\t{}\t{}\t{}\n",
                s.offset,
                s.vaddr,
                s.len,
                s.kind.as_str(),
                field(&s.function),
                field(&s.location)
            ));
        }
        out
    }

    /// Parses a list written by [`ProbeList::to_text`]. Never panics: any
    /// malformed input is a [`ParseError`].
    pub fn parse(text: &str) -> Result<ProbeList, ParseError> {
        let err = |line: usize, msg: &str| ParseError {
            line,
            msg: msg.to_string(),
        };
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l))
            .filter(|(_, l)| !l.starts_with('#'));
        match lines.next() {
            Some((_, l)) if l == MAGIC_LINE => {}
            Some((n, _)) => return Err(err(n, "expected `hotprobe-probes 1`")),
            None => return Err(err(1, "empty probe list")),
        }
        let build_id = match lines.next() {
            Some((_, "build-id -")) => None,
            Some((n, l)) => {
                let h = l
                    .strip_prefix("build-id ")
                    .ok_or_else(|| err(n, "expected `build-id HEX|-`"))?;
                if h.is_empty() || h.len() % 2 != 0 || !h.is_ascii() {
                    return Err(err(n, "bad build id"));
                }
                let bytes: Option<Vec<u8>> = (0..h.len())
                    .step_by(2)
                    .map(|i| u8::from_str_radix(&h[i..i + 2], 16).ok())
                    .collect();
                Some(bytes.ok_or_else(|| err(n, "bad build id"))?)
            }
            None => return Err(err(2, "missing build-id line")),
        };
        let mut sites = vec![];
        for (n, l) in lines {
            if l.is_empty() {
                continue;
            }
            let f: Vec<&str> = l.split('\t').collect();
            if f.len() != 7 || f[0] != "site" {
                return Err(err(
                    n,
                    "expected `site OFFSET VADDR LEN KIND FUNCTION LOCATION` (tab-separated)",
                ));
            }
            let opt = |s: &str| (s != "-").then(|| s.to_string());
            sites.push(ProbeSite {
                offset: hex(f[1]).ok_or_else(|| err(n, "bad offset"))?,
                vaddr: hex(f[2]).ok_or_else(|| err(n, "bad vaddr"))?,
                len: f[3]
                    .parse()
                    .ok()
                    .filter(|l| (5..=6).contains(l))
                    .ok_or_else(|| err(n, "bad length"))?,
                kind: SiteKind::parse(f[4]).ok_or_else(|| err(n, "bad kind"))?,
                function: opt(f[5]),
                location: opt(f[6]),
            });
        }
        Ok(ProbeList { build_id, sites })
    }
}

impl fmt::Display for ProbeList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_text())
    }
}
