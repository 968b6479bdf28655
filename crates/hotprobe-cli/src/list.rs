//! `hotprobe list`: functions (or the blacklist) of a binary or a process,
//! with the mechanism a probe on each function's entry would get.

use crate::out::{self, outln};
use anyhow::{bail, Context, Result};
use hotprobe::symbols::pattern;
use hotprobe::symbols::{ElfModule, FunctionKind, ProcessSymbols, Symbol};
use hotprobe::x86::Execution;
use hotprobe::Session;
use object::{Object, ObjectSegment};
use std::path::{Path, PathBuf};

/// What `list` needs from the command line.
pub struct ListOptions<'a> {
    /// A binary file...
    pub binary: Option<&'a Path>,
    /// ...or a running process.
    pub pid: Option<i32>,
    /// Glob over function names (`*`, `?`).
    pub pattern: Option<&'a str>,
    /// List the blacklist instead.
    pub blacklist: bool,
    /// Only the count of functions per mechanism and per trap reason.
    pub summary: bool,
    /// The USDT markers instead of the functions.
    pub usdt: bool,
}

/// One row of the function list.
struct Row {
    addr: u64,
    size: u64,
    mechanism: String,
    /// Why that mechanism (for a binary: the fast path's explanation).
    why: String,
    module: String,
    name: String,
}

/// The loadable bytes of an ELF file, by link-time address.
struct FileCode {
    bytes: Vec<u8>,
    /// (vaddr, file offset, file size) of each PT_LOAD.
    segments: Vec<(u64, u64, u64)>,
}

impl FileCode {
    fn open(path: &Path) -> Result<FileCode> {
        let bytes =
            std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        let segments = {
            let file = object::File::parse(&*bytes)
                .with_context(|| format!("{} is not an ELF file", path.display()))?;
            file.segments()
                .map(|s| {
                    let (off, size) = s.file_range();
                    (s.address(), off, size)
                })
                .collect()
        };
        Ok(FileCode { bytes, segments })
    }

    /// Up to 16 bytes at link address `addr` (fewer at a segment's end).
    fn code_at(&self, addr: u64) -> Option<&[u8]> {
        let (va, off, size) = self
            .segments
            .iter()
            .find(|(va, _, size)| addr >= *va && addr < va + size)?;
        let start = (off + (addr - va)) as usize;
        let end = (off + size).min(start as u64 + 16) as usize;
        self.bytes.get(start..end)
    }
}

/// "trap (boosted|emulated|stepped)" or "refused" for the instruction at
/// a function's entry.
fn mechanism(code: Option<&FileCode>, sym: &Symbol) -> String {
    let Some(bytes) = code.and_then(|c| c.code_at(sym.addr.0)) else {
        return "?".into();
    };
    match hotprobe::x86::plan_probe(bytes, sym.addr.0, sym.addr.0) {
        Ok(plan) => match plan.execution {
            Execution::Boost => "trap (boosted)",
            Execution::Emulate(_) => "trap (emulated)",
            Execution::Step(_) => "trap (stepped)",
        }
        .into(),
        Err(_) => "refused".into(),
    }
}

/// The mechanism `hotprobe count` would give a probe on `sym`'s entry
/// (patch, then jump, else trap) and why. A symbol that is not a function
/// entry (a `.cold` partition, a label) gets a trap, and says why.
fn fast_mechanism(
    fast: Option<&hotprobe::fastpath::ModuleInfo>,
    code: Option<&FileCode>,
    sym: &Symbol,
) -> (String, String) {
    use hotprobe::fastpath::{Mechanism, MechanismChoice};
    if let Some(why) = not_entry(&sym.kind) {
        return (mechanism(code, sym), why);
    }
    let plan = fast.and_then(|m| {
        let f = m.functions().iter().find(|f| f.addr == sym.addr.0)?;
        m.plan(f, MechanismChoice::Auto).ok()
    });
    match plan {
        Some(p) if p.mechanism != Mechanism::Trap => (p.label(), p.reason),
        Some(p) => (mechanism(code, sym), p.reason),
        None => (mechanism(code, sym), String::new()),
    }
}

/// `not a function entry: …` for a symbol of `kind` that is not one.
fn not_entry(kind: &FunctionKind) -> Option<String> {
    kind.summary().map(|why| match kind {
        FunctionKind::ColdPart { parent } => {
            format!("not a function entry: a cold partition of {parent} (its [rsp] is not a return address)")
        }
        _ => format!("not a function entry: {why}"),
    })
}

fn wanted(pattern: Option<&str>, s: &Symbol) -> bool {
    match pattern {
        None => true,
        Some(p) => pattern::matches(p, &s.name) || pattern::matches(p, &s.raw_name),
    }
}

/// Run `list`.
pub fn run(o: &ListOptions<'_>) -> Result<()> {
    if o.usdt {
        return usdt_markers(o);
    }
    match (o.binary, o.pid) {
        (Some(bin), None) if o.blacklist => blacklist_of_file(bin),
        (None, Some(pid)) if o.blacklist => blacklist_of_process(pid),
        (Some(bin), None) => {
            let m = ElfModule::open(bin)?;
            let code = FileCode::open(bin).ok();
            let fast = hotprobe::fastpath::ModuleInfo::open(bin).ok();
            let name = m.file_name();
            let rows: Vec<Row> = m
                .functions()
                .iter()
                .filter(|s| wanted(o.pattern, s))
                .map(|s| {
                    let s = &Symbol {
                        kind: m.function_kind(s),
                        ..s.clone()
                    };
                    let (mechanism, why) = fast_mechanism(fast.as_ref(), code.as_ref(), s);
                    Row {
                        addr: s.addr.0,
                        size: s.size,
                        mechanism,
                        why,
                        module: name.clone(),
                        name: s.name.clone(),
                    }
                })
                .collect();
            if o.summary {
                return print_summary(&rows, o.pattern, &bin.display().to_string());
            }
            print_rows(&rows, o.pattern, &bin.display().to_string())
        }
        (None, Some(pid)) => {
            let syms = ProcessSymbols::for_pid(pid as u32).map_err(|e| match e {
                hotprobe::symbols::SymbolError::Proc { source, .. }
                    if source.kind() == std::io::ErrorKind::NotFound =>
                {
                    anyhow::anyhow!("no such process: {pid}")
                }
                e => e.into(),
            })?;
            let mut rows = Vec::new();
            for lm in syms.modules() {
                let mut code: Option<Option<FileCode>> = None;
                for s in lm
                    .module
                    .functions()
                    .iter()
                    .filter(|s| wanted(o.pattern, s))
                {
                    let c = code.get_or_insert_with(|| FileCode::open(lm.module.path()).ok());
                    rows.push(Row {
                        addr: lm.runtime(s.addr).0,
                        size: s.size,
                        mechanism: mechanism(c.as_ref(), s),
                        why: not_entry(&lm.module.function_kind(s)).unwrap_or_default(),
                        module: lm.name.clone(),
                        name: s.name.clone(),
                    });
                }
            }
            print_rows(&rows, o.pattern, &format!("pid {pid}"))
        }
        _ => bail!("give either a BINARY or -p PID"),
    }
}

fn print_rows(rows: &[Row], pattern: Option<&str>, what: &str) -> Result<()> {
    if rows.is_empty() {
        match pattern {
            Some(p) => bail!("no function matches `{p}` in {what}"),
            None => bail!("{what} has no function symbols"),
        }
    }
    let mw = rows
        .iter()
        .map(|r| r.module.chars().count())
        .max()
        .unwrap_or(0)
        .max("MODULE".len());
    let pw = rows
        .iter()
        .map(|r| r.mechanism.chars().count())
        .max()
        .unwrap_or(0)
        .max(15);
    // WHY only for a binary (the fast path's plan); FUNCTION stays last.
    let yw = rows
        .iter()
        .map(|r| r.why.chars().count())
        .max()
        .unwrap_or(0);
    if yw == 0 {
        outln!(
            "{:<18}  {:>8}  {:<pw$}  {:<mw$}  FUNCTION",
            "ADDRESS",
            "SIZE",
            "PROBE",
            "MODULE"
        );
    } else {
        outln!(
            "{:<18}  {:>8}  {:<pw$}  {:<mw$}  {:<yw$}  FUNCTION",
            "ADDRESS",
            "SIZE",
            "PROBE",
            "MODULE",
            "WHY"
        );
    }
    for r in rows {
        let name = out::paint(out::NAME, &r.name);
        let more = if yw == 0 {
            outln!(
                "{:#018x}  {:>8}  {:<pw$}  {:<mw$}  {name}",
                r.addr,
                r.size,
                r.mechanism,
                r.module
            )
        } else {
            outln!(
                "{:#018x}  {:>8}  {:<pw$}  {:<mw$}  {:<yw$}  {name}",
                r.addr,
                r.size,
                r.mechanism,
                r.module,
                r.why
            )
        };
        if !more {
            break;
        }
    }
    Ok(())
}

/// The summary's class of a row's mechanism: `patch`, `jump`, `jump (punned)`,
/// `in-process trap` (an instruction the agent's SIGTRAP handler boosts or
/// emulates), `trap` (single-stepped under ptrace) or `refused`.
fn class(mechanism: &str) -> &'static str {
    match mechanism {
        m if m.starts_with("patch") => "patch",
        "jump" => "jump",
        "jump (punned)" => "jump (punned)",
        "trap (boosted)" | "trap (emulated)" => "in-process trap",
        m if m.starts_with("trap") => "trap",
        _ => "refused",
    }
}

/// A trap's reason with what differs from function to function left out:
/// an instruction quoted as `` `call 0x1234` `` becomes `` `call …` ``, an
/// address (`at 0x16d7c6`) `at …`, a cold partition's parent `of …`.
fn reason_kind(why: &str) -> String {
    let mut out = String::new();
    let mut quoted = why.split('`');
    if let Some(first) = quoted.next() {
        out.push_str(first);
    }
    for (i, part) in quoted.enumerate() {
        out.push('`');
        if i % 2 == 0 {
            let mnemonic = part.split_whitespace().next().unwrap_or("");
            out.push_str(mnemonic);
            if part.trim() != mnemonic {
                out.push_str(" …");
            }
        } else {
            out.push_str(part);
        }
    }
    let words: Vec<&str> = out.split(' ').collect();
    let mut v: Vec<String> = Vec::with_capacity(words.len());
    for (i, w) in words.iter().enumerate() {
        let addr = w.starts_with("0x") && i > 0 && words[i - 1] == "at";
        let parent = i > 1 && words[i - 1] == "of" && words[i - 2] == "partition";
        v.push(if addr || parent {
            "…".into()
        } else {
            w.to_string()
        });
    }
    v.join(" ")
}

/// `list BINARY --summary`: functions per mechanism, then the traps
/// (in-process and ptrace) per reason, most frequent first.
fn print_summary(rows: &[Row], pattern: Option<&str>, what: &str) -> Result<()> {
    if rows.is_empty() {
        match pattern {
            Some(p) => bail!("no function matches `{p}` in {what}"),
            None => bail!("{what} has no function symbols"),
        }
    }
    let classes = [
        "patch",
        "jump",
        "jump (punned)",
        "in-process trap",
        "trap",
        "refused",
    ];
    let mut per: std::collections::BTreeMap<&str, usize> = Default::default();
    let mut reasons: std::collections::BTreeMap<String, usize> = Default::default();
    for r in rows {
        let c = class(&r.mechanism);
        *per.entry(c).or_default() += 1;
        if !matches!(c, "patch" | "jump" | "jump (punned)") {
            *reasons.entry(reason_kind(&r.why)).or_default() += 1;
        }
    }
    outln!("{:<16}  {:>9}", "MECHANISM", "FUNCTIONS");
    for c in classes {
        outln!("{c:<16}  {:>9}", per.get(c).copied().unwrap_or(0));
    }
    let on_traps =
        per.get("in-process trap").copied().unwrap_or(0) + per.get("trap").copied().unwrap_or(0);
    outln!("{:<16}  {:>9}", "total", rows.len());
    outln!("{:<16}  {:>9}", "on traps", on_traps);
    if !reasons.is_empty() {
        outln!();
        outln!("{:>9}  WHY (traps)", "FUNCTIONS");
        let mut v: Vec<(String, usize)> = reasons.into_iter().collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        for (why, n) in v {
            outln!("{n:>9}  {why}");
        }
    }
    Ok(())
}

fn print_blacklist(entries: &[(u64, u64, String)]) {
    outln!("{:<18}  {:<18}  WHAT", "START", "END");
    for (s, e, what) in entries {
        if !outln!("{s:#018x}  {e:#018x}  {what}") {
            break;
        }
    }
}

fn blacklist_of_file(bin: &Path) -> Result<()> {
    let m = ElfModule::open(bin)?;
    let name = m.file_name();
    // The resolver's own entries for a module, at link-time addresses.
    let mut v: Vec<(u64, u64, String)> =
        hotprobe::module_blacklist(&m, &name, |a| hotprobe::RuntimeAddr(a.0))
            .into_iter()
            .map(|b| (b.start.0, b.end.0, b.what))
            .collect();
    v.sort();
    print_blacklist(&v);
    Ok(())
}

fn blacklist_of_process(pid: i32) -> Result<()> {
    let mut s = Session::new();
    let t = s.attach(pid)?;
    let list = s.blacklist(t);
    // Detach whatever happened: the process must run on.
    s.detach()
        .with_context(|| format!("cannot detach from pid {pid}"))?;
    let v: Vec<(u64, u64, String)> = list?
        .into_iter()
        .map(|b| (b.start.0, b.end.0, b.what))
        .collect();
    print_blacklist(&v);
    Ok(())
}

/// For `list BINARY`: a path that does not exist is an error of its own.
pub fn check_binary(p: &Path) -> Result<PathBuf> {
    if !p.exists() {
        bail!("{}: no such file", p.display());
    }
    Ok(p.to_path_buf())
}

/// `list --usdt`: the markers of a file, or of every module a process
/// maps, one row each: the spec that probes it, address (link-time for a
/// file, run-time for a process), semaphore, arguments, module.
fn usdt_markers(o: &ListOptions<'_>) -> Result<()> {
    use hotprobe::symbols::{read_maps, NamePattern};
    let pattern = o
        .pattern
        .map(NamePattern::new)
        .transpose()
        .map_err(|e| crate::UsageError(e.to_string()))?;
    // (file, bias) of each module.
    let modules: Vec<(PathBuf, u64)> = match (o.binary, o.pid) {
        (Some(bin), _) => vec![(bin.to_path_buf(), 0)],
        (None, Some(pid)) => {
            let maps = read_maps(pid as u32)
                .with_context(|| format!("cannot read the maps of pid {pid}"))?;
            let mut seen = std::collections::BTreeMap::new();
            for m in maps {
                let Some(path) = m.path.clone() else { continue };
                if !path.is_absolute() || seen.contains_key(&path) {
                    continue;
                }
                let Ok(elf) = ElfModule::open(&path) else {
                    continue;
                };
                let bias = elf.load_bias(&m).map_or(0, |b| b.0);
                seen.insert(path, bias);
            }
            seen.into_iter().collect()
        }
        (None, None) => return Ok(()),
    };
    let mut rows = Vec::new();
    for (path, bias) in &modules {
        let Ok(m) = ElfModule::open(path) else {
            continue;
        };
        let name = m.file_name();
        for u in m.usdt_markers() {
            let full = format!("{}:{}", u.provider, u.name);
            if pattern.as_ref().is_some_and(|p| !p.matches(&full)) {
                continue;
            }
            rows.push((
                format!("usdt:{full}"),
                format!("{:#x}", u.addr.wrapping_add(*bias)),
                u.semaphore.map_or_else(
                    || "-".to_string(),
                    |s| format!("{:#x}", s.wrapping_add(*bias)),
                ),
                u.args_text.clone(),
                name.clone(),
            ));
        }
    }
    if rows.is_empty() {
        out::errln!(
            "hotprobe: no USDT marker{}",
            match o.pattern {
                Some(p) => format!(" matches {p}"),
                None => " (no .note.stapsdt)".into(),
            }
        );
        return Ok(());
    }
    let w = |i: usize, min: usize| {
        rows.iter()
            .map(|r| [&r.0, &r.1, &r.2, &r.3][i].len())
            .max()
            .unwrap_or(0)
            .max(min)
    };
    let (w0, w1, w2, w3) = (w(0, 6), w(1, 7), w(2, 9), w(3, 9));
    outln!(
        "{:w0$}  {:>w1$}  {:>w2$}  {:w3$}  MODULE",
        "MARKER",
        "ADDRESS",
        "SEMAPHORE",
        "ARGUMENTS"
    );
    for r in &rows {
        if !outln!(
            "{:w0$}  {:>w1$}  {:>w2$}  {:w3$}  {}",
            r.0,
            r.1,
            r.2,
            r.3,
            r.4
        ) {
            break;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_grouped_without_their_addresses() {
        assert_eq!(
            reason_kind("`call 0x2d8a0` at +0x4 within the first 5 bytes is a call"),
            "`call …` at +0x4 within the first 5 bytes is a call"
        );
        assert_eq!(
            reason_kind("a branch at 0x16d7c6 elsewhere in the module lands at +0x3"),
            "a branch at … elsewhere in the module lands at +0x3"
        );
        assert_eq!(
            reason_kind("`ret` at +0x2 returns"),
            "`ret` at +0x2 returns"
        );
        assert_eq!(
            reason_kind("not a function entry: a cold partition of putchar (its [rsp] is not)"),
            "not a function entry: a cold partition of … (its [rsp] is not)"
        );
        assert_eq!(class("trap (stepped)"), "trap");
        assert_eq!(class("trap (emulated)"), "in-process trap");
        assert_eq!(class("patch (mcount NOP)"), "patch");
    }
}
