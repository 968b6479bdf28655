//! Kernel uprobes found on the sites hotprobe rewrote, named when a
//! program with hotprobe's code in it crashes (see "Code shared with other
//! tools" in docs/DESIGN.md).

use super::*;

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
