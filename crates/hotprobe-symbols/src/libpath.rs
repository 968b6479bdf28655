//! Where a library not loaded yet would come from: the places the dynamic
//! loader searches, so that a probe on a module a program may load later
//! can be told from a misspelt module name.

use std::path::{Path, PathBuf};

/// The directories the loader searches by default on Debian x86-64 (after
/// `LD_LIBRARY_PATH`), the ld.so.conf ones included.
const SYSTEM_DIRS: &[&str] = &[
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib64",
    "/usr/lib64",
    "/lib",
    "/usr/lib",
    "/usr/local/lib",
    "/usr/local/lib/x86_64-linux-gnu",
];

/// A library file that a module name in a probe spec names, as the
/// resolver matches names (`libz` matches `libz.so.1`): a path that exists,
/// or a file of that name (or that name followed by `.` or `-`) in
/// `LD_LIBRARY_PATH`, in `program_dir` (programs often `dlopen` a library
/// beside them), or in the system's library directories.
pub fn find_library(module: &str, program_dir: Option<&Path>) -> Option<PathBuf> {
    if module.is_empty() {
        return None;
    }
    if module.contains('/') {
        let p = Path::new(module);
        return p.is_file().then(|| p.to_path_buf());
    }
    let env = std::env::var_os("LD_LIBRARY_PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&env)
        .chain(program_dir.map(Path::to_path_buf))
        .chain(SYSTEM_DIRS.iter().map(PathBuf::from));
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            let matches = name == module
                || name
                    .strip_prefix(module)
                    .is_some_and(|rest| rest.starts_with(['.', '-']));
            if matches && e.path().is_file() {
                return Some(e.path());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libc_is_found_and_a_misspelt_name_is_not() {
        assert!(find_library("libc.so.6", None).is_some());
        assert!(find_library("libc", None).is_some());
        assert!(find_library("nosuchlib", None).is_none());
        assert!(find_library("/nonexistent/libx.so", None).is_none());
        assert!(find_library("", None).is_none());
    }

    #[test]
    fn a_library_beside_the_program_is_found() {
        let dir = std::env::temp_dir().join(format!("hp-libpath-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("libbeside.so"), b"").unwrap();
        assert_eq!(
            find_library("libbeside.so", Some(&dir)),
            Some(dir.join("libbeside.so"))
        );
        assert!(find_library("libbeside.so", None).is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
