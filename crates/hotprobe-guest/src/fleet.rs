//! [`GuestFleet`]: the guests hotprobe starts with its QEMU plugin, one
//! [`launch`] each. Until the caller [releases](GuestFleet::release) them
//! (the probes are placed and the guests may outlive hotprobe), every QEMU
//! is killed when the fleet drops: a failure halfway through starting or
//! arming several guests leaves none behind.

use crate::launch::{launch, LaunchError, LaunchOptions};
use crate::{GuestTarget, KernelResolver};
use hotprobe_qemu::{PluginHost, QemuProcess};
use hotprobe_symbols::KernelSymbols;
use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::ExitStatus;

/// A guest the fleet started, for `hotprobe::Session::add_plugin_guest`:
/// its QEMU stays in the fleet.
pub struct FleetGuest {
    /// Its index in the fleet (launch order, from 0).
    pub index: usize,
    /// QEMU's pid.
    pub pid: u32,
    /// The guest through its GDB stub (paused until the session starts).
    pub target: GuestTarget,
    /// Probe specs over the kernel's symbols.
    pub resolver: KernelResolver,
    /// The plugin's shared memory.
    pub plugin: PluginHost,
}

/// The QEMUs of the guests hotprobe started, killed (and reaped) on drop
/// unless released.
#[derive(Default)]
pub struct GuestFleet {
    qemus: Vec<QemuProcess>,
}

impl GuestFleet {
    /// An empty fleet.
    pub fn new() -> GuestFleet {
        GuestFleet::default()
    }

    /// Starts QEMU (`argv`: `qemu-system-x86_64 ARGS...`) with hotprobe's
    /// plugin and stub ([`launch`]); the fleet keeps the QEMU and kills it
    /// on drop.
    pub fn launch(
        &mut self,
        argv: &[OsString],
        symbols: KernelSymbols,
        opts: LaunchOptions,
    ) -> Result<FleetGuest, LaunchError> {
        let mut g = launch(argv, symbols, opts)?;
        g.qemu.kill_on_drop = true;
        let index = self.qemus.len();
        let pid = g.qemu.pid();
        self.qemus.push(g.qemu);
        Ok(FleetGuest {
            index,
            pid,
            target: g.target,
            resolver: g.resolver,
            plugin: g.plugin,
        })
    }

    /// How many guests the fleet started.
    pub fn len(&self) -> usize {
        self.qemus.len()
    }

    /// Whether it started none.
    pub fn is_empty(&self) -> bool {
        self.qemus.is_empty()
    }

    /// QEMU's pid of guest `index`.
    pub fn pid(&self, index: usize) -> Option<u32> {
        self.qemus.get(index).map(QemuProcess::pid)
    }

    /// Kills every QEMU now (and reaps it).
    pub fn kill_all(&mut self) {
        for q in &mut self.qemus {
            q.kill();
        }
    }

    /// Lets the guests outlive the fleet (and hotprobe): nothing is killed
    /// on drop any more. Their QEMUs, in launch order, to wait for.
    pub fn release(mut self) -> Vec<QemuProcess> {
        let mut qemus = std::mem::take(&mut self.qemus);
        for q in &mut qemus {
            q.kill_on_drop = false;
        }
        qemus
    }
}

impl Drop for GuestFleet {
    fn drop(&mut self) {
        // Each QEMU kills itself on drop (`kill_on_drop`), reaped.
        self.kill_all();
    }
}

/// The `-kernel IMAGE` of a QEMU command line (the guest's symbols when
/// none are given).
pub fn kernel_image(qemu: &[OsString]) -> Option<PathBuf> {
    qemu.windows(2)
        .find(|w| w[0] == "-kernel")
        .map(|w| PathBuf::from(&w[1]))
}

/// QEMU's exit status as a shell shows it (128 + signal when killed).
pub fn shell_exit_code(st: ExitStatus) -> u8 {
    st.code()
        .map_or_else(|| 128 + st.signal().unwrap_or(0) as u8, |c| c as u8)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(a: &[&str]) -> Vec<OsString> {
        a.iter().map(OsString::from).collect()
    }

    #[test]
    fn the_kernel_image_of_a_command_line() {
        assert_eq!(
            kernel_image(&argv(&["qemu", "-m", "256", "-kernel", "/b/bzImage", "-S"])),
            Some(PathBuf::from("/b/bzImage"))
        );
        assert_eq!(kernel_image(&argv(&["qemu", "-kernel"])), None);
        assert_eq!(kernel_image(&argv(&["qemu"])), None);
    }

    #[test]
    fn exit_codes_as_a_shell_shows_them() {
        assert_eq!(shell_exit_code(ExitStatus::from_raw(3 << 8)), 3);
        // A wait status of 9: killed by SIGKILL.
        assert_eq!(shell_exit_code(ExitStatus::from_raw(9)), 137);
    }
}
