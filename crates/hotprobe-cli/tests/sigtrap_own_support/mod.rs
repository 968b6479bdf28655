//! `programs/sigtrap_own.c` driven line by line (see there), for the
//! tests of a program with a `SIGTRAP` handler of its own under an
//! attached hotprobe (issue 22).

#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

use hotprobe_testkit::line_reader;

/// The longest any answer of the program may take; longer is a hang.
pub const LIMIT: Duration = Duration::from_secs(30);

/// The program, compiled once per test binary (`static`: linked statically).
pub fn build(statik: bool) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/sigtrap_own.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sigtrap-own");
    std::fs::create_dir_all(&dir).unwrap();
    let (out, flags): (&str, &[&str]) = if statik {
        ("sigtrap_own_static", &["-O1", "-static"])
    } else {
        ("sigtrap_own", &["-O1"])
    };
    hotprobe_testkit::compile("gcc", &src, &dir.join(out), flags, &[])
}

/// The running program (killed on drop).
pub struct Own {
    pub child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    /// Its pid, from its `ready` line.
    pub pid: u32,
}

impl Own {
    /// Starts `bin ARGS` and reads its `ready PID` line.
    pub fn start(bin: &Path, args: &[&str]) -> Own {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let lines = line_reader(child.stdout.take().unwrap());
        let stdin = child.stdin.take();
        let ready = lines.recv_timeout(LIMIT).expect("the program's ready line");
        let pid = ready
            .strip_prefix("ready ")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{ready:?}"));
        assert_eq!(pid, child.id());
        Own {
            child,
            stdin,
            lines,
            pid,
        }
    }

    /// Sends `cmd` and returns the program's answer line.
    pub fn ask(&mut self, cmd: &str) -> String {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{cmd}").unwrap();
        stdin.flush().unwrap();
        self.lines
            .recv_timeout(LIMIT)
            .unwrap_or_else(|e| panic!("no answer to {cmd:?} ({e}): {:?}", self.child.try_wait()))
    }

    /// Sends `quit`: its last line and exit status.
    pub fn quit(mut self) -> (String, Option<i32>) {
        let last = self.ask("quit");
        drop(self.stdin.take());
        let status = self.child.wait().unwrap();
        (last, status.code())
    }

    /// `SigBlk`, `SigIgn` and `SigCgt` of its main thread
    /// (`/proc/PID/status`).
    pub fn proc_masks(&self) -> String {
        let s = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap();
        s.lines()
            .filter(|l| {
                ["SigBlk:", "SigIgn:", "SigCgt:"]
                    .iter()
                    .any(|k| l.starts_with(k))
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// Whether the agent is mapped in it.
    pub fn has_agent(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/maps", self.pid))
            .unwrap()
            .contains("hotprobe_agent")
    }
}

impl Drop for Own {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The executable mappings of `pid` from the file named `file_name`
/// (libc: `libc.so.6`): its path.
pub fn mapped_file(pid: u32, file_name: &str) -> Option<PathBuf> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines().find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        let p = Path::new(w.get(5)?);
        (w[1].contains('x') && p.file_name()?.to_str()? == file_name).then(|| p.to_path_buf())
    })
}

use hotprobe_testkit::code_mappings;

/// The signal-state sites of the code of `file` mapped in `pid`: the
/// `syscall` instructions after `mov eax, 13|14` (`rt_sigaction`,
/// `rt_sigprocmask`) and at most two simple instructions
/// (`hotprobe_abi::sigsite`), by the file's bytes: their run-time
/// addresses.
pub fn signal_state_sites(pid: u32, file: &Path) -> Vec<u64> {
    use hotprobe_abi::sigsite::{sig_site_shape, SIG_SITE_MAX};
    let bytes = std::fs::read(file).unwrap();
    let mut sites = Vec::new();
    for (s, off, len) in code_mappings(pid, file, bytes.len()) {
        let code = &bytes[off..off + len];
        for i in 0..code.len() {
            let w = &code[i..code.len().min(i + SIG_SITE_MAX)];
            if let Some((at, _)) = sig_site_shape(w) {
                if w[at..at + 2] == [0x0f, 0x05] {
                    sites.push(s + (i + at) as u64);
                }
            }
        }
    }
    sites
}
