//! Guests that hotprobe starts itself, with its QEMU plugin: [`launch`].

use std::ffi::OsString;
use std::process::Stdio;

use hotprobe_qemu::{PluginConfig, PluginError, PluginHost, QemuCommand, QemuProcess};
use hotprobe_symbols::KernelSymbols;
use hotprobe_target::TargetError;

use crate::resolver::{open_guest, KernelResolver};
use crate::target::{GuestConfig, GuestTarget, StubAddr};

/// What [`launch`] needs besides the QEMU command line.
#[derive(Debug, Default)]
pub struct LaunchOptions {
    /// The plugin's shared-memory sizes and timeouts.
    pub plugin: PluginConfig,
    /// QEMU's standard streams (inherited when `None`).
    pub stdin: Option<Stdio>,
    /// See `stdin`.
    pub stdout: Option<Stdio>,
    /// See `stdin`.
    pub stderr: Option<Stdio>,
    /// QEMU's shared RAM file (`memory-backend-file`), if the command line
    /// has one: handlers read guest memory without the stub.
    pub ram_file: Option<std::path::PathBuf>,
    /// Where the guest kernel keeps its current task
    /// ([`crate::task_layout_from_kernel_image`]): the plugin's task fetches
    /// and the task of exit events.
    pub task_layout: Option<hotprobe_qemu::TaskLayout>,
}

/// A guest started by [`launch`]: give `target`, `resolver` and `plugin`
/// to `hotprobe::Session::add_plugin_guest`; keep `qemu`.
pub struct LaunchedGuest {
    /// The guest through its GDB stub (the VM is paused until the session
    /// starts).
    pub target: GuestTarget,
    /// Probe specs over the kernel's symbols.
    pub resolver: KernelResolver,
    /// The plugin's shared memory.
    pub plugin: PluginHost,
    /// The QEMU process.
    pub qemu: QemuProcess,
}

/// Errors of [`launch`].
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The plugin or QEMU.
    #[error(transparent)]
    Plugin(#[from] PluginError),
    /// The GDB stub.
    #[error("QEMU's GDB stub: {0}")]
    Stub(#[from] TargetError),
}

/// Starts `argv` (`qemu-system-x86_64 ARGS...`) with hotprobe's plugin and a
/// GDB stub of hotprobe's (`hotprobe_qemu::QemuCommand`), paused before its
/// first instruction, and connects to the stub. `symbols` are the guest
/// kernel's (kallsyms, System.map or vmlinux).
pub fn launch(
    argv: &[OsString],
    symbols: KernelSymbols,
    opts: LaunchOptions,
) -> Result<LaunchedGuest, LaunchError> {
    let mut plugin = PluginHost::create(opts.plugin)?;
    if let Some(l) = opts.task_layout {
        plugin.set_task_layout(l)?;
    }
    let mut cmd = QemuCommand::new(argv)?;
    if let Some(s) = opts.stdin {
        cmd = cmd.stdin(s);
    }
    if let Some(s) = opts.stdout {
        cmd = cmd.stdout(s);
    }
    if let Some(s) = opts.stderr {
        cmd = cmd.stderr(s);
    }
    let mut qemu = cmd.spawn(&plugin)?;
    let mut cfg = GuestConfig::new(StubAddr::Unix(qemu.gdb_socket.clone()));
    cfg.ram_file = opts.ram_file;
    match open_guest(cfg, symbols) {
        Ok((target, resolver)) => Ok(LaunchedGuest {
            target,
            resolver,
            plugin,
            qemu,
        }),
        Err(e) => {
            qemu.kill();
            Err(e.into())
        }
    }
}
