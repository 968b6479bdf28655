//! [`QemuCommand`]: the user's QEMU command line with hotprobe's additions.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::{PluginError, PluginHost};

/// A QEMU command line to start with hotprobe's plugin.
///
/// hotprobe appends `-plugin LIBRARY,shm=/proc/OUR_PID/fd/N`, a GDB stub on
/// a unix socket of its own (`-gdb unix:DIR/gdb.sock,server=on,wait=off`,
/// for probes that need the stub) and `-S` (the VM waits until hotprobe
/// lets it run: every translation happens after the sites are frozen).
#[derive(Debug)]
pub struct QemuCommand {
    program: OsString,
    args: Vec<OsString>,
    stdin: Option<Stdio>,
    stdout: Option<Stdio>,
    stderr: Option<Stdio>,
}

/// A QEMU started by [`QemuCommand::spawn`].
#[derive(Debug)]
pub struct QemuProcess {
    /// The process.
    pub child: Child,
    /// Its GDB stub's unix socket.
    pub gdb_socket: PathBuf,
    dir: PathBuf,
    /// Kill QEMU when this value drops (tests); off by default: a guest
    /// outlives hotprobe.
    pub kill_on_drop: bool,
}

fn has(args: &[OsString], f: impl Fn(&str) -> bool) -> bool {
    args.iter().any(|a| a.to_str().is_some_and(&f))
}

impl QemuCommand {
    /// `argv[0]` is QEMU (`qemu-system-x86_64`), the rest its arguments.
    /// Refused: another GDB stub (`-gdb`, `-s`: hotprobe adds its own) and
    /// KVM (the plugin needs TCG).
    pub fn new(argv: &[OsString]) -> Result<QemuCommand, PluginError> {
        let Some((program, args)) = argv.split_first() else {
            return Err(PluginError::Qemu(
                "no QEMU command line (after --: qemu-system-x86_64 ARGS...)".into(),
            ));
        };
        if has(args, |a| a == "-gdb" || a == "-s") {
            return Err(PluginError::Qemu(
                "the QEMU command line has its own GDB stub (-gdb/-s): hotprobe adds one".into(),
            ));
        }
        let kvm = has(args, |a| a == "-enable-kvm" || a.contains("accel=kvm"))
            || args
                .windows(2)
                .any(|w| w[0] == "-accel" && w[1].to_str().is_some_and(|v| v.starts_with("kvm")));
        if kvm {
            return Err(PluginError::Qemu(
                "KVM runs guest code natively: hotprobe's plugin needs TCG (-accel tcg)".into(),
            ));
        }
        Ok(QemuCommand {
            program: program.clone(),
            args: args.to_vec(),
            stdin: None,
            stdout: None,
            stderr: None,
        })
    }

    /// QEMU's standard input (inherited by default).
    pub fn stdin(mut self, s: Stdio) -> Self {
        self.stdin = Some(s);
        self
    }

    /// QEMU's standard output (inherited by default).
    pub fn stdout(mut self, s: Stdio) -> Self {
        self.stdout = Some(s);
        self
    }

    /// QEMU's standard error (inherited by default).
    pub fn stderr(mut self, s: Stdio) -> Self {
        self.stderr = Some(s);
        self
    }

    /// The arguments hotprobe adds, for a GDB socket at `gdb_socket`.
    pub fn added_args(plugin: &PluginHost, library: &Path, gdb_socket: &Path) -> Vec<OsString> {
        let mut v = plugin.qemu_args(library);
        let mut g = OsString::from("unix:");
        g.push(gdb_socket);
        g.push(",server=on,wait=off");
        v.push("-gdb".into());
        v.push(g);
        v.push("-S".into());
        v
    }

    /// Starts QEMU with the plugin (the embedded library, see
    /// [`crate::plugin_path`]) and waits until the plugin is installed and
    /// the stub's socket exists. The VM is paused (`-S`) until a debugger
    /// continues it.
    pub fn spawn(self, plugin: &PluginHost) -> Result<QemuProcess, PluginError> {
        let library = crate::plugin_path()?;
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "hotprobe-qemu-{}-{}",
            std::process::id(),
            N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| PluginError::Qemu(format!("cannot create {}: {e}", dir.display())))?;
        let gdb_socket = dir.join("gdb.sock");
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args)
            .args(Self::added_args(plugin, &library, &gdb_socket));
        if let Some(s) = self.stdin {
            cmd.stdin(s);
        }
        if let Some(s) = self.stdout {
            cmd.stdout(s);
        }
        if let Some(s) = self.stderr {
            cmd.stderr(s);
        }
        let child = cmd.spawn().map_err(|e| {
            let _ = std::fs::remove_dir_all(&dir);
            PluginError::Qemu(format!(
                "cannot start {}: {e}",
                Path::new(&self.program).display()
            ))
        })?;
        let mut q = QemuProcess {
            child,
            gdb_socket,
            dir,
            kill_on_drop: false,
        };
        let r = plugin
            .wait_installed(Duration::from_secs(30), || {
                matches!(q.child.try_wait(), Ok(None))
            })
            .and_then(|()| q.wait_socket(Duration::from_secs(30)));
        if let Err(e) = r {
            let _ = q.child.kill();
            let _ = q.child.wait();
            return Err(e);
        }
        Ok(q)
    }
}

impl QemuProcess {
    /// QEMU's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_socket(&mut self, timeout: Duration) -> Result<(), PluginError> {
        let t0 = Instant::now();
        while !self.gdb_socket.exists() {
            if let Ok(Some(st)) = self.child.try_wait() {
                return Err(PluginError::Qemu(format!("QEMU exited at start: {st}")));
            }
            if t0.elapsed() > timeout {
                return Err(PluginError::Qemu(format!(
                    "QEMU made no GDB socket at {} within {} s",
                    self.gdb_socket.display(),
                    timeout.as_secs()
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    }

    /// Whether QEMU has exited (reaps it).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Waits up to `timeout` for QEMU to exit.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.try_wait() {
                return Some(st);
            }
            if t0.elapsed() >= timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kills QEMU and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for QemuProcess {
    fn drop(&mut self) {
        if self.kill_on_drop {
            self.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cmd(args: &[&str]) -> Result<QemuCommand, PluginError> {
        let v: Vec<OsString> = args.iter().map(|a| a.into()).collect();
        QemuCommand::new(&v)
    }

    #[test]
    fn command_lines() {
        assert!(cmd(&[]).is_err());
        assert!(cmd(&["qemu-system-x86_64", "-accel", "tcg"]).is_ok());
        for bad in [
            &["qemu-system-x86_64", "-s"][..],
            &["qemu-system-x86_64", "-gdb", "tcp::1234"],
            &["qemu-system-x86_64", "-enable-kvm"],
            &["qemu-system-x86_64", "-accel", "kvm"],
            &["qemu-system-x86_64", "-machine", "q35,accel=kvm"],
        ] {
            assert!(cmd(bad).is_err(), "{bad:?}");
        }
        let h = PluginHost::create(crate::PluginConfig {
            max_vcpus: 1,
            ring_capacity: 4,
            ..crate::PluginConfig::default()
        })
        .unwrap();
        let a = QemuCommand::added_args(&h, Path::new("/p.so"), Path::new("/d/gdb.sock"));
        let a: Vec<String> = a.iter().map(|x| x.to_string_lossy().into_owned()).collect();
        assert_eq!(a[2], "-gdb");
        assert_eq!(a[3], "unix:/d/gdb.sock,server=on,wait=off");
        assert_eq!(a[4], "-S");
    }
}
