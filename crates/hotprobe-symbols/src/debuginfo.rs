//! Where distributions put the debug information a stripped file lacks:
//! a separate debug file found by build id (`/usr/lib/debug/.build-id`),
//! in a debuginfod client's cache (`$DEBUGINFOD_CACHE_PATH`), or by the
//! file's `.gnu_debuglink` (name and CRC-32). Each candidate is checked to
//! belong to the file (same build id, or the link's CRC) before it is used.
//! Nothing is fetched from the network.
//!
//! [`set_debug_files_hidden`] (the CLI's `--no-debug-files`, or
//! `HOTPROBE_NO_DEBUG_FILES=1`) turns the lookup off, so that the paths
//! taken without debug information can be exercised on a machine that has
//! it installed.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

/// Set when separate debug files are not to be looked for.
static HIDDEN: AtomicBool = AtomicBool::new(false);

/// Hide (`true`) or show again separate debug files, for the whole process.
pub fn set_debug_files_hidden(hidden: bool) {
    HIDDEN.store(hidden, Relaxed);
}

/// Whether separate debug files are hidden ([`set_debug_files_hidden`], or
/// `HOTPROBE_NO_DEBUG_FILES` set to anything but `0` or empty).
pub fn debug_files_hidden() -> bool {
    HIDDEN.load(Relaxed)
        || std::env::var_os("HOTPROBE_NO_DEBUG_FILES").is_some_and(|v| !v.is_empty() && v != "0")
}

/// Where a separate debug file was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DebugFileSource {
    /// `/usr/lib/debug/.build-id/NN/REST.debug`.
    BuildId,
    /// A debuginfod client's cache: `CACHE/BUILDID/debuginfo`.
    DebuginfodCache,
    /// The file's `.gnu_debuglink`, its CRC checked.
    DebugLink,
}

/// The separate debug file of the ELF file `path` (its bytes `bytes`), if
/// one is installed and belongs to it, and how it was found. `None` when
/// there is none, or when debug files are hidden.
pub fn find_debug_file(path: &Path, bytes: &[u8]) -> Option<(PathBuf, DebugFileSource)> {
    if debug_files_hidden() {
        return None;
    }
    let file = object::File::parse(bytes).ok()?;
    use object::Object;
    let build_id = file.build_id().ok().flatten().filter(|b| b.len() >= 2);
    if let Some(id) = build_id {
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        let by_id = Path::new(crate::DEBUG_ROOT)
            .join(".build-id")
            .join(&hex[..2])
            .join(format!("{}.debug", &hex[2..]));
        if has_build_id(&by_id, id) {
            return Some((by_id, DebugFileSource::BuildId));
        }
        for cache in debuginfod_caches() {
            let cached = cache.join(&hex).join("debuginfo");
            if has_build_id(&cached, id) {
                return Some((cached, DebugFileSource::DebuginfodCache));
            }
        }
    }
    let (name, crc) = file.gnu_debuglink().ok().flatten()?;
    let name = std::str::from_utf8(name).ok()?;
    if name.is_empty() || name.contains('/') {
        return None;
    }
    let dir = path.parent().unwrap_or(Path::new("/"));
    let under_root = Path::new(crate::DEBUG_ROOT).join(dir.strip_prefix("/").unwrap_or(dir));
    [
        dir.join(name),
        dir.join(".debug").join(name),
        under_root.join(name),
    ]
    .into_iter()
    .filter(|c| c.as_path() != path)
    .find(|c| std::fs::read(c).is_ok_and(|b| crc32(&b) == crc))
    .map(|c| (c, DebugFileSource::DebugLink))
}

/// The debuginfod client cache directories to look in:
/// `$DEBUGINFOD_CACHE_PATH`, else `$XDG_CACHE_HOME/debuginfod_client`,
/// else `~/.cache/debuginfod_client`.
fn debuginfod_caches() -> Vec<PathBuf> {
    if let Some(p) = std::env::var_os("DEBUGINFOD_CACHE_PATH").filter(|p| !p.is_empty()) {
        return vec![PathBuf::from(p)];
    }
    let xdg = std::env::var_os("XDG_CACHE_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
    xdg.map(|c| vec![c.join("debuginfod_client")])
        .unwrap_or_default()
}

/// Whether `path` is an ELF file whose build id is `id`.
fn has_build_id(path: &Path, id: &[u8]) -> bool {
    use object::Object;
    let Ok(bytes) = std::fs::read(path) else {
        return false;
    };
    object::File::parse(&*bytes)
        .ok()
        .and_then(|f| f.build_id().ok().flatten().map(|b| b == id))
        .unwrap_or(false)
}

/// The CRC-32 `.gnu_debuglink` uses (IEEE 802.3, as zlib's `crc32`).
fn crc32(data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(data);
    h.finalize()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crc_is_zlibs() {
        assert_eq!(crc32(b""), 0);
        assert_eq!(crc32(b"123456789"), 0xcbf4_3926);
    }

    #[test]
    fn garbage_finds_nothing() {
        assert_eq!(find_debug_file(Path::new("/nonexistent"), b"not elf"), None);
    }
}
