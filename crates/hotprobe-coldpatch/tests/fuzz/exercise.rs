//! What the fuzz passes do with one input, shared by the bounded passes of
//! `tests/fuzz.rs` and the cargo-fuzz targets of `fuzz/` (included there by
//! path). Depends on hotprobe-coldpatch and std only.

use hotprobe_coldpatch::{coldpatch as patch, ProbeList};

/// ColdPatch on arbitrary bytes: the output keeps the input's size, the
/// listed sites lie inside it and the list it writes parses. True if sites
/// were found.
pub fn coldpatch(data: &[u8]) -> bool {
    let Ok((out, list)) = patch(data) else {
        return false;
    };
    assert_eq!(out.len(), data.len(), "ColdPatch changed the size");
    for s in &list.sites {
        assert!(s.offset + u64::from(s.len) <= out.len() as u64);
    }
    ProbeList::parse(&list.to_text()).expect("a written list parses");
    !list.sites.is_empty()
}

/// Probe-list text: what parses is written back to a list that parses to
/// as many sites and the same build id. True if it parsed.
pub fn probelist(data: &[u8]) -> bool {
    let Ok(list) = ProbeList::parse(&String::from_utf8_lossy(data)) else {
        return false;
    };
    let again = ProbeList::parse(&list.to_text()).expect("a written list parses");
    assert_eq!(again.sites.len(), list.sites.len());
    assert_eq!(again.build_id, list.build_id);
    true
}
