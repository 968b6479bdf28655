//! hotprobe's side of its QEMU TCG plugin.
//!
//! - [`plugin_path`]: the plugin library, embedded in this crate at build
//!   time (`build.rs`) and written once per process to a sealed memfd that
//!   QEMU opens as `/proc/OUR_PID/fd/N` (`HOTPROBE_QEMU_PLUGIN=PATH`
//!   overrides it).
//! - [`PluginHost`]: the shared memory (`hotprobe_abi::plugin`) — probes and
//!   their candidate sites, written before the VM runs and then frozen;
//!   enable flags flipped at run time and acknowledged by the plugin without
//!   any retranslation; counters; per-vCPU rings drained here; and a service
//!   thread that keeps the heartbeat and answers synchronous events.
//! - [`QemuCommand`]: the user's QEMU command line plus the plugin, a GDB
//!   stub on a unix socket (for probes that need the stub: handlers that
//!   write), and `-S` (the VM waits for hotprobe, so every translation
//!   happens after the sites are frozen).

mod host;
mod launch;

pub use host::{
    Delivery, PluginConfig, PluginCounts, PluginHost, PluginProbe, PluginStats, SyncHandler,
    SyncStats,
};
pub use hotprobe_abi::plugin::{Fetch, PluginEvent, Reg, StringFetch, TaskField, TaskLayout};
pub use launch::{QemuCommand, QemuProcess};

use std::path::PathBuf;

/// Errors of the plugin's host side.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    /// The shared memory could not be made.
    #[error("plugin shared memory: {0}")]
    Shm(String),
    /// The layout refused the parameters.
    #[error("plugin shared memory: {0}")]
    Abi(hotprobe_abi::AbiError),
    /// A probe or site does not fit, or comes after the freeze.
    #[error("{0}")]
    Refused(String),
    /// The plugin library could not be provided.
    #[error("the QEMU plugin library: {0}")]
    Library(String),
    /// QEMU could not be started, or died.
    #[error("{0}")]
    Qemu(String),
    /// The plugin did not answer in time.
    #[error("the QEMU plugin did not {what} within {secs} s")]
    Timeout {
        /// What it did not do.
        what: &'static str,
        /// The wait.
        secs: u64,
    },
}

/// The plugin library, built with this crate.
pub static EMBEDDED_PLUGIN: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/libhotprobe_qemu_plugin.so"));

/// The memfd name of the embedded plugin.
pub const PLUGIN_MEMFD_NAME: &str = "libhotprobe_qemu_plugin.so";

/// The plugin library's path for QEMU's `-plugin`: `HOTPROBE_QEMU_PLUGIN`
/// if set (it must exist), else the embedded library written once into a
/// sealed, close-on-exec memfd that stays open while this process lives
/// (`/proc/OUR_PID/fd/N`; QEMU opens it while we live).
pub fn plugin_path() -> Result<PathBuf, PluginError> {
    if let Some(p) = std::env::var_os("HOTPROBE_QEMU_PLUGIN") {
        let p = PathBuf::from(p);
        return match std::fs::metadata(&p) {
            Ok(m) if m.is_file() => {
                std::fs::canonicalize(&p).map_err(|e| PluginError::Library(e.to_string()))
            }
            Ok(_) => Err(PluginError::Library(format!(
                "HOTPROBE_QEMU_PLUGIN={}: not a file",
                p.display()
            ))),
            Err(e) => Err(PluginError::Library(format!(
                "HOTPROBE_QEMU_PLUGIN={}: {e}",
                p.display()
            ))),
        };
    }
    static FD: std::sync::OnceLock<Result<std::os::fd::OwnedFd, String>> =
        std::sync::OnceLock::new();
    match FD.get_or_init(|| sealed_memfd(PLUGIN_MEMFD_NAME, EMBEDDED_PLUGIN)) {
        Ok(fd) => {
            use std::os::fd::AsRawFd;
            Ok(PathBuf::from(format!(
                "/proc/{}/fd/{}",
                std::process::id(),
                fd.as_raw_fd()
            )))
        }
        Err(e) => Err(PluginError::Library(e.clone())),
    }
}

/// A sealed, close-on-exec memfd holding `bytes`.
fn sealed_memfd(name: &str, bytes: &[u8]) -> Result<std::os::fd::OwnedFd, String> {
    use std::io::Write;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let err = |what: &str| format!("{what}: {}", std::io::Error::last_os_error());
    let cname = std::ffi::CString::new(name).map_err(|_| "NUL in name".to_string())?;
    // MFD_EXEC (Linux 6.3): executable even where memfds are not by default.
    const MFD_EXEC: libc::c_uint = 0x10;
    let flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
    // SAFETY: a NUL-terminated name; no memory is passed.
    let mut fd = unsafe { libc::memfd_create(cname.as_ptr(), flags | MFD_EXEC) };
    if fd < 0 {
        // SAFETY: as above.
        fd = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
    }
    if fd < 0 {
        return Err(err("memfd_create"));
    }
    // SAFETY: a fresh descriptor nothing else owns.
    let mut file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    file.write_all(bytes).map_err(|e| format!("write: {e}"))?;
    let seals = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
    // SAFETY: fcntl on our descriptor.
    if unsafe { libc::fcntl(file.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
        return Err(err("F_ADD_SEALS"));
    }
    Ok(OwnedFd::from(file))
}
