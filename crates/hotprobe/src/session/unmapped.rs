//! Sites whose module went (issue 21): at each change of a process's
//! loaded modules, one walk of its code ledger against its mappings finds
//! and takes out the sites no mapping holds any more (a library the
//! program unloaded while probes placed in it were armed). Each mechanism
//! is told exactly which of its sites went
//! ([`mech::ProbeMechanism::forget_sites`]: nothing is written, the
//! memory is gone) and answers with the probes served there.
//!
//! Those probes are made pending, as a probe on a library not loaded yet
//! is (`pending.rs`): a pending probe armed in the module is disarmed; a
//! probe placed while the module was loaded is made pending again under
//! its id, with the mechanism asked for it and its typed values
//! (`Slot::pend_again`), so that it is armed again when the program loads
//! the module again (as gdb re-arms a breakpoint), its counts going on.
//! A notice names them (the first few, then how many more), never the
//! session's own sites (guards, rendezvous, publishers), and names apart
//! those that count nothing from now on (an address, a USDT marker).

use super::ledger::GoneSite;
use super::*;
use std::collections::HashSet;

/// Probes named in a notice before "and N more".
const NAMED: usize = 4;

impl Slot {
    /// See the module docs.
    pub(super) fn forget_unmapped_sites(&mut self) {
        let Some(pid) = self.pid else { return };
        self.sync_ledger();
        if self.ledger.sites().is_empty() {
            return;
        }
        let Ok(maps) = std::fs::read_to_string(hotprobe_symbols::proc_dir(pid as u32).join("maps"))
        else {
            return;
        };
        let mut mapped: Vec<(u64, u64)> = maps
            .lines()
            .filter_map(|l| {
                let (s, e) = l.split_whitespace().next()?.split_once('-')?;
                Some((
                    u64::from_str_radix(s, 16).ok()?,
                    u64::from_str_radix(e, 16).ok()?,
                ))
            })
            .collect();
        mapped.sort_unstable();
        let gaps = self.ledger.take_unmapped(&mapped);
        if gaps.is_empty() {
            return;
        }
        for gap in gaps {
            let probes = self.tell_mechanisms(&gap.sites);
            // A marker's semaphore went with its module: nothing to take
            // back at detach.
            self.semaphores
                .retain(|at| !(gap.start..gap.end).contains(&at.0));
            let (mut again, mut lost) = (Vec::new(), Vec::new());
            for id in probes {
                if let Some(p) = self.pending.iter_mut().find(|p| p.id == id) {
                    p.armed = None;
                    again.push(p.label.clone());
                    continue;
                }
                match self.pend_again(id) {
                    Ok(label) => again.push(label),
                    Err(label) => lost.push(label.unwrap_or_else(|| format!("probe {}", id.0))),
                }
            }
            let sites = gap.probe_sites();
            if again.is_empty() && lost.is_empty() {
                // Guards alone, or the session's own sites.
                continue;
            }
            let (start, end) = (gap.start, gap.end);
            let mut text = format!(
                "pid {pid}: {sites} probe site(s) at {start:#x}..{end:#x} went with a module \
                 the program unloaded"
            );
            if !again.is_empty() {
                text.push_str(&format!(
                    ": {}: pending, armed again if the program loads it again",
                    named(&again)
                ));
            }
            if !lost.is_empty() {
                text.push_str(&format!(
                    "; {}: not armed again, counting nothing from now on",
                    named(&lost)
                ));
            }
            self.notice(text);
        }
        self.sync_ledger();
        // The guards of the `int3`s that went, forgotten with them (their
        // memory is gone too).
        let (mut cx, mechs) = self.parts();
        mechs.trap.publish(&mut cx);
    }

    /// Whether a probe at `addr` lies in a module the program loaded at
    /// run time ([`Unloads`]), by the modules in `syms` (else the ones
    /// read last); `None` when that cannot be told.
    pub(super) fn unloadable_at(
        &mut self,
        addr: RuntimeAddr,
        syms: Option<&hotprobe_symbols::ProcessSymbols>,
    ) -> Option<bool> {
        let last = self.symbols.as_ref().map(|(_, s)| s.clone());
        let syms = syms.or(last.as_deref())?;
        let m = syms.modules().iter().find(|m| m.contains(addr))?;
        let program = Slot::process(&mut self.target).map(|p| p.program().to_path_buf())?;
        Some(self.unloads.unloadable(syms, m, &program))
    }

    /// Whether a probe placed in a module the program may unload is in:
    /// the process stays traced, so that the loader's rendezvous is seen
    /// when the module goes (see [`Unloads`]).
    pub(super) fn watches_unloads(&self) -> bool {
        self.placed_specs.values().any(|p| p.unloadable)
    }

    /// Tells each mechanism which of its sites went (`gone`, from the
    /// ledger's walk): the probes they served, each once, in the order
    /// the mechanisms answered.
    fn tell_mechanisms(&mut self, gone: &[GoneSite]) -> Vec<ProbeId> {
        let mut probes: Vec<ProbeId> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let (mut cx, mechs) = self.parts();
        for m in mechs.all() {
            let kind = m.kind();
            let mine: Vec<GoneSite> = gone
                .iter()
                .filter(|s| kind.serves(s.owner))
                .cloned()
                .collect();
            if mine.is_empty() {
                continue;
            }
            for id in m.forget_sites(&mut cx, &mine) {
                if seen.insert(id) {
                    probes.push(id);
                }
            }
        }
        probes
    }
}

/// Which modules of a process its program may unload: those its loader
/// did not map at the start (the program's `DT_NEEDED` libraries,
/// transitively), so loaded by `dlopen`. A probe placed in one keeps the
/// process traced (`Slot::watches_unloads`): untraced, the loader's
/// rendezvous is not seen, and the probe could not be made pending when
/// the module goes.
#[derive(Default)]
pub(super) struct Unloads {
    /// The `DT_SONAME`s (or file names) the program needs, transitively,
    /// once read.
    startup: Option<HashSet<String>>,
    /// Each module file's `DT_SONAME` and `DT_NEEDED`, as read.
    dynamic: HashMap<PathBuf, (Option<String>, Vec<String>)>,
    /// The answer for each module file asked about.
    by_path: HashMap<PathBuf, bool>,
}

impl Unloads {
    /// Whether module `m` of `syms` (whose program is `program`) was
    /// loaded by the program at run time, so that it may unload it.
    pub(super) fn unloadable(
        &mut self,
        syms: &hotprobe_symbols::ProcessSymbols,
        m: &hotprobe_symbols::LoadedModule,
        program: &Path,
    ) -> bool {
        if let Some(&known) = self.by_path.get(m.module.path()) {
            return known;
        }
        let path = m.module.path().to_path_buf();
        // The executable as the process maps it: `program` names a file
        // that may have been replaced since the start (a rebuilt or
        // upgraded program runs on from the deleted file, which its
        // module reads through /proc/PID/exe). Before, such a program
        // counted as a library loaded at run time, and its probes kept
        // the process traced for good to watch an unload.
        let main = syms.main_module();
        let is_program = |p: &Path| {
            main.is_some_and(|mm| std::ptr::eq(mm, m) || mm.ranges == m.ranges)
                || same_file(p, program)
        };
        let answer = if is_program(&path) {
            false
        } else {
            if self.startup.is_none() {
                let exe = main.map_or(program, |mm| mm.module.path());
                self.startup = Some(self.startup_names(syms, exe));
            }
            let (soname, _) = self.dynamic_of(&path);
            let name = soname.unwrap_or_else(|| m.name.clone());
            !self.startup.as_ref().is_some_and(|s| s.contains(&name))
        };
        self.by_path.insert(path, answer);
        answer
    }

    /// The names the program's loader maps at the start: the program's
    /// `DT_NEEDED`, then those of every mapped module named there, until
    /// no name is added.
    fn startup_names(
        &mut self,
        syms: &hotprobe_symbols::ProcessSymbols,
        program: &Path,
    ) -> HashSet<String> {
        let mut names: HashSet<String> = self.dynamic_of(program).1.into_iter().collect();
        loop {
            let mut added = false;
            for m in syms.modules() {
                let (soname, needed) = self.dynamic_of(m.module.path());
                let name = soname.unwrap_or_else(|| m.name.clone());
                if names.contains(&name) {
                    for n in needed {
                        added |= names.insert(n);
                    }
                }
            }
            if !added {
                return names;
            }
        }
    }

    /// `path`'s `DT_SONAME` and `DT_NEEDED` (none when it cannot be read).
    fn dynamic_of(&mut self, path: &Path) -> (Option<String>, Vec<String>) {
        self.dynamic
            .entry(path.to_path_buf())
            .or_insert_with(|| {
                std::fs::read(path)
                    .ok()
                    .and_then(|data| dynamic_names(&data))
                    .unwrap_or_default()
            })
            .clone()
    }
}

/// Whether `a` and `b` name the same file.
fn same_file(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => (x.dev(), x.ino()) == (y.dev(), y.ino()),
        _ => a == b,
    }
}

/// An ELF file's `DT_SONAME` and `DT_NEEDED` names; `None` when `data`
/// is no 64-bit ELF file with a dynamic section.
fn dynamic_names(data: &[u8]) -> Option<(Option<String>, Vec<String>)> {
    use object::read::elf::{Dyn as _, FileHeader as _};
    let h = object::elf::FileHeader64::<object::Endianness>::parse(data).ok()?;
    let endian = h.endian().ok()?;
    let sections = h.sections(endian, data).ok()?;
    let (dyns, link) = sections.dynamic(endian, data).ok()??;
    let strings = sections.strings(endian, data, link).ok()?;
    let (mut soname, mut needed) = (None, Vec::new());
    for d in dyns {
        let tag = d.d_tag(endian);
        let is = |t: u32| tag == u64::from(t);
        if !is(object::elf::DT_SONAME) && !is(object::elf::DT_NEEDED) {
            continue;
        }
        let Ok(name) = d.string(endian, strings) else {
            continue;
        };
        let name = String::from_utf8_lossy(name).into_owned();
        match is(object::elf::DT_SONAME) {
            true => soname = Some(name),
            false => needed.push(name),
        }
    }
    Some((soname, needed))
}

/// `names` for a notice: the first [`NAMED`], then how many more.
fn named(names: &[String]) -> String {
    let mut text = names
        .iter()
        .take(NAMED)
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > NAMED {
        text.push_str(&format!(" and {} more", names.len() - NAMED));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::named;

    #[test]
    fn a_notice_names_the_first_few_probes_then_how_many_more() {
        let names: Vec<String> = (0..7).map(|i| format!("f{i}")).collect();
        assert_eq!(named(&names[..1]), "f0");
        assert_eq!(named(&names[..4]), "f0, f1, f2, f3");
        assert_eq!(named(&names), "f0, f1, f2, f3 and 3 more");
    }
}
