//! What the fuzz pass does with one input (tests/fuzz.rs). Depends on
//! hotprobe and std only.

use hotprobe::{WatchKind, WatchSpec};

/// `WatchSpec::parse` on arbitrary text: what parses prints (`Display`)
/// as text that parses to the same spec. True if it parsed.
pub fn watch_spec(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let kind = if data.first().is_some_and(|b| b & 1 == 1) {
        WatchKind::ReadWrite
    } else {
        WatchKind::Write
    };
    let Ok(spec) = WatchSpec::parse(&text, kind) else {
        return false;
    };
    if let Some(l) = spec.len {
        assert!(matches!(l, 1 | 2 | 4 | 8), "{spec:?}");
    }
    let again = WatchSpec::parse(&spec.to_string(), kind)
        .unwrap_or_else(|e| panic!("{spec:?} printed as {spec} does not parse: {e}"));
    assert_eq!(again, spec, "{text:?}");
    true
}
