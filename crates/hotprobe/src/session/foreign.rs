//! Kernel uprobes found on the sites hotprobe rewrote, named when a
//! program with hotprobe's code in it crashes (see "Code shared with other
//! tools" in docs/DESIGN.md), and the sites another writer changed.

use super::*;

/// Turns the fast path's sites another writer changed (see
/// [`hotprobe_fastpath::ForeignWrite`]) into notices naming them.
pub(super) fn note_foreign_writes(engine: &mut Engine, agent: &mut Agent, inbox: &mut Inbox) {
    let Some(fp) = agent.fast_path_mut() else {
        return;
    };
    let found = fp.take_foreign_writes();
    if found.is_empty() {
        return;
    }
    let symbolizer = engine.symbolizer();
    let mut notes = Vec::new();
    let hex = |b: &[u8]| {
        b.iter()
            .map(|x| format!("{x:02x}"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    for f in found {
        let name = symbolizer
            .as_ref()
            .and_then(|s| s.symbolize(RuntimeAddr(f.addr)))
            .map_or(String::new(), |n| format!("{n} "));
        let (left, found) = (hex(&f.expected), hex(&f.found));
        let site = format!("the probe site {name}at {:#x}", f.addr);
        use hotprobe_fastpath::ForeignOutcome as O;
        notes.push(match f.outcome {
            O::Int3Kept => format!(
                "{site} was changed by another writer while hotprobe's code was in it \
                 (hotprobe left {left}, found {found}): a kernel uprobe (bpftrace, perf probe) \
                 or a breakpoint on the same instruction (a hit on both crashes a jump or call \
                 site, and an int3 site's hits go to it); its int3 was kept, over the original \
                 instructions"
            ),
            O::Restored => format!(
                "{site} was changed by another writer while hotprobe's code was in it \
                 (hotprobe left {left}, found {found}): a kernel uprobe placed and removed \
                 since (a hit on both crashes a jump or call site, and an int3 site's hits go \
                 to it); the original bytes were put back"
            ),
            O::LeftAsFound => format!(
                "{site} holds code hotprobe did not write (hotprobe left {left}, found \
                 {found}): another tool's (a kernel uprobe's, a debugger's); it was left as \
                 found"
            ),
            O::LeftDisabled => format!(
                "{site} stays disabled: its original bytes were changed since the disable \
                 (expected {left}, found {found}), by a kernel uprobe or a breakpoint; \
                 enabling it would break that probe"
            ),
        });
    }
    for n in notes {
        inbox.notice(engine, n);
    }
}

/// When a process hotprobe rewrote code in died of a crash signal: the
/// kernel uprobes registered on instructions it rewrote (`written`: each
/// site's address and length), as a notice (a uprobe placed over
/// hotprobe's code crashes the program; see docs/DESIGN.md, "Code shared
/// with other tools"). `None` if there is none, or none visible (another
/// user's uprobes, without root).
pub(super) fn uprobes_on_rewritten_sites(
    slot: &Slot,
    written: &[(u64, usize)],
    status: &ExitStatus,
) -> Option<String> {
    use std::collections::HashMap;
    use std::path::PathBuf;
    let resolver = slot.resolver.as_ref()?;
    let mut canonical: HashMap<PathBuf, PathBuf> = HashMap::new();
    // File → (offset, length, address) of each site in it.
    let mut sites: HashMap<PathBuf, Vec<(u64, u64, u64)>> = HashMap::new();
    for &(addr, len) in written {
        let Some((path, off)) = resolver.file_offset_at(RuntimeAddr(addr)) else {
            continue;
        };
        let path = canonical
            .entry(path)
            .or_insert_with_key(|p| std::fs::canonicalize(p).unwrap_or_else(|_| p.clone()))
            .clone();
        sites.entry(path).or_default().push((off, len as u64, addr));
    }
    let symbolizer = resolver.symbolizer();
    let mut hit: Vec<String> = Vec::new();
    for u in hotprobe_process::kernel_uprobes() {
        let path = std::fs::canonicalize(&u.path).unwrap_or(u.path);
        let Some(&(_, _, addr)) = sites.get(&path).and_then(|v| {
            v.iter()
                .find(|(off, len, _)| (*off..off + len).contains(&u.offset))
        }) else {
            continue;
        };
        let name = symbolizer
            .symbolize(RuntimeAddr(addr))
            .unwrap_or_else(|| format!("{}+{:#x}", path.display(), u.offset));
        let by = match u.owner {
            Some(o) => format!("held by {} (pid {})", o.comm, o.pid),
            None => "defined in tracefs uprobe_events".into(),
        };
        hit.push(format!("{name} at {addr:#x}, {by}"));
    }
    if hit.is_empty() {
        return None;
    }
    hit.sort();
    hit.dedup();
    let more = hit.len().saturating_sub(5);
    hit.truncate(5);
    let more = match more {
        0 => String::new(),
        n => format!(" and {n} more"),
    };
    let who = slot.pid.map_or("the target".into(), |p| format!("pid {p}"));
    Some(format!(
        "{who} was {status} with hotprobe's code in it, and kernel uprobes sit on instructions \
         hotprobe rewrote: {}{more}; a uprobe placed over hotprobe's code makes the program crash \
         (docs/DESIGN.md, \"Code shared with other tools\"): probe those functions with one tool \
         at a time",
        hit.join("; ")
    ))
}
