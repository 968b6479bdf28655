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
    static FD: std::sync::OnceLock<Result<hotprobe_os::Memfd, String>> = std::sync::OnceLock::new();
    match FD.get_or_init(|| {
        hotprobe_os::Memfd::sealed_executable(PLUGIN_MEMFD_NAME, EMBEDDED_PLUGIN)
            .map_err(|e| e.to_string())
    }) {
        Ok(memfd) => Ok(memfd.proc_path()),
        Err(e) => Err(PluginError::Library(e.clone())),
    }
}
