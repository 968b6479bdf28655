//! Guest kernel symbols from the kernel image QEMU boots (`-kernel
//! bzImage`), recovered by `hotprobe-kimage` before the first guest
//! instruction, without the guest's help.
//!
//! Recovery decompresses the whole payload (0.9–2.5 s for Debian's 8 MB xz
//! image, depending on load), so the result is cached as
//! kallsyms text under `$XDG_CACHE_HOME/hotprobe/` (or
//! `~/.cache/hotprobe/`), keyed by the image's size and a 64-bit hash of
//! its bytes: a later start reads a few MB of text instead.

use std::path::{Path, PathBuf};

use hotprobe_qemu::TaskLayout;
use hotprobe_symbols::{KernelSymbols, SymbolError};

/// Bumped when the cached text's meaning changes.
const CACHE_FORMAT: u32 = 1;

/// What went wrong recovering symbols from a kernel image.
#[derive(Debug, thiserror::Error)]
pub enum ImageSymbolsError {
    /// The image could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The image.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The image holds no recoverable symbol table.
    #[error("no kernel symbols recovered from the kernel image {}: {source}", path.display())]
    Image {
        /// The image.
        path: PathBuf,
        /// What was not found.
        source: hotprobe_kimage::Error,
    },
    /// The recovered symbols have no usable text symbol.
    #[error("kernel image {}: {source}", path.display())]
    Symbols {
        /// The image.
        path: PathBuf,
        /// What the kallsyms parser said.
        source: SymbolError,
    },
}

impl From<ImageSymbolsError> for SymbolError {
    fn from(e: ImageSymbolsError) -> Self {
        match e {
            ImageSymbolsError::Io { path, source } => SymbolError::Io { path, source },
            ImageSymbolsError::Symbols { source, .. } => source,
            e @ ImageSymbolsError::Image { .. } => SymbolError::Kallsyms {
                reason: e.to_string(),
            },
        }
    }
}

/// Whether `bytes` are an x86 kernel image (boot header magic `HdrS`).
pub fn is_kernel_image(bytes: &[u8]) -> bool {
    hotprobe_kimage::is_bzimage(bytes)
}

/// The kernel's symbols from its bzImage (what `qemu-system-x86_64 -kernel`
/// boots), as `/proc/kallsyms` of that kernel booted with `nokaslr` would
/// give them; cached in [`default_cache_dir`].
pub fn symbols_from_kernel_image(path: &Path) -> Result<KernelSymbols, ImageSymbolsError> {
    symbols_from_kernel_image_in(path, default_cache_dir().as_deref())
}

/// [`symbols_from_kernel_image`] with the cache in `cache_dir` (`None`: no
/// cache).
pub fn symbols_from_kernel_image_in(
    path: &Path,
    cache_dir: Option<&Path>,
) -> Result<KernelSymbols, ImageSymbolsError> {
    let bytes = std::fs::read(path).map_err(|source| ImageSymbolsError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    symbols_from_image_bytes(path, &bytes, cache_dir)
}

pub(crate) fn symbols_from_image_bytes(
    path: &Path,
    bytes: &[u8],
    cache_dir: Option<&Path>,
) -> Result<KernelSymbols, ImageSymbolsError> {
    let text = kallsyms_text(bytes, cache_dir).map_err(|source| ImageSymbolsError::Image {
        path: path.to_path_buf(),
        source,
    })?;
    KernelSymbols::parse(&text).map_err(|source| ImageSymbolsError::Symbols {
        path: path.to_path_buf(),
        source,
    })
}

/// Where the kernel in the image at `path` keeps its current task (from its
/// BTF, `hotprobe_kimage::task_offsets`), for the plugin's task fetches and
/// filters; cached beside the symbols (the image is decompressed once).
pub fn task_layout_from_kernel_image(path: &Path) -> Result<TaskLayout, ImageSymbolsError> {
    let bytes = std::fs::read(path).map_err(|source| ImageSymbolsError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let cache = default_cache_dir().map(|d| d.join(format!("task-{}", cache_name(&bytes))));
    if let Some(text) = cache.as_ref().and_then(|f| std::fs::read_to_string(f).ok()) {
        let v: Vec<u64> = text
            .split_whitespace()
            .filter_map(|w| w.parse().ok())
            .collect();
        if let [current, pid, tgid, comm] = v[..] {
            return Ok(layout(current, pid, tgid, comm));
        }
    }
    let o = hotprobe_kimage::task_offsets(&bytes).map_err(|source| ImageSymbolsError::Image {
        path: path.to_path_buf(),
        source,
    })?;
    if let Some(f) = &cache {
        if let Some(dir) = f.parent() {
            let tmp = dir.join(format!(".tmp-task-{}", std::process::id()));
            let text = format!("{} {} {} {}\n", o.current, o.pid, o.tgid, o.comm);
            let ok = std::fs::create_dir_all(dir).is_ok()
                && std::fs::write(&tmp, text).is_ok()
                && std::fs::rename(&tmp, f).is_ok();
            if !ok {
                let _ = std::fs::remove_file(&tmp);
            }
        }
    }
    Ok(layout(o.current, o.pid, o.tgid, o.comm))
}

fn layout(current: u64, pid: u64, tgid: u64, comm: u64) -> TaskLayout {
    TaskLayout {
        current,
        pid: pid as u32,
        tgid: tgid as u32,
        comm: comm as u32,
        _pad: 0,
    }
}

/// `$XDG_CACHE_HOME/hotprobe`, else `$HOME/.cache/hotprobe`.
pub fn default_cache_dir() -> Option<PathBuf> {
    let xdg = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute());
    let base = xdg.or_else(|| {
        std::env::var_os("HOME")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .map(|h| h.join(".cache"))
    })?;
    Some(base.join("hotprobe"))
}

/// The cache file name of an image: its size and FNV-1a-64 hash.
fn cache_name(bytes: &[u8]) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("kallsyms-v{CACHE_FORMAT}-{:x}-{h:016x}.txt", bytes.len())
}

fn kallsyms_text(bytes: &[u8], cache_dir: Option<&Path>) -> Result<String, hotprobe_kimage::Error> {
    let file = cache_dir.map(|d| d.join(cache_name(bytes)));
    if let Some(text) = file.as_ref().and_then(|f| std::fs::read_to_string(f).ok()) {
        return Ok(text);
    }
    let text = hotprobe_kimage::kernel_symbols(bytes)?.to_kallsyms_text();
    if let (Some(dir), Some(file)) = (cache_dir, &file) {
        // Best effort, written whole then renamed into place.
        let tmp = dir.join(format!(".tmp-{}-{}", std::process::id(), cache_name(bytes)));
        let ok = std::fs::create_dir_all(dir).is_ok()
            && std::fs::write(&tmp, &text).is_ok()
            && std::fs::rename(&tmp, file).is_ok();
        if !ok {
            let _ = std::fs::remove_file(&tmp);
        }
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_names_differ_by_content() {
        assert_ne!(cache_name(b"abc"), cache_name(b"abd"));
        assert_ne!(cache_name(b"abc"), cache_name(b"abc\0"));
        assert!(cache_name(b"").starts_with("kallsyms-v1-0-"));
    }

    #[test]
    fn errors_say_what_is_missing() {
        let dir = std::env::temp_dir().join(format!("hotprobe-image-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("bzImage");
        let mut img = vec![0u8; 0x400];
        img[0x202..0x206].copy_from_slice(b"HdrS");
        img[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
        std::fs::write(&f, &img).unwrap();
        assert!(is_kernel_image(&img));
        let e = symbols_from_kernel_image_in(&f, Some(&dir)).unwrap_err();
        assert!(matches!(e, ImageSymbolsError::Image { .. }), "{e}");
        let msg = SymbolError::from(e).to_string();
        assert!(msg.contains("no kernel symbols recovered"), "{msg}");
        let e = symbols_from_kernel_image_in(&dir.join("missing"), None).unwrap_err();
        assert!(matches!(e, ImageSymbolsError::Io { .. }), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
