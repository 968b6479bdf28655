//! Test harness: builds the busybox initramfs, boots the cached Debian kernel
//! under `qemu-system-x86_64 -accel tcg` with a unix-socket gdb stub, guest
//! RAM in a shared file and the serial console on QEMU's stdio, and reads
//! the guest's kallsyms from the console.

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// Builds (or reuses) the initramfs under `.cache/guest/`.
pub fn initramfs() -> PathBuf {
    // Through the workspace root, so other crates' tests can use this harness.
    let src = workspace_root().join("crates/hotprobe-guest/tests/guest");
    let out = workspace_root().join(".cache/guest");
    let cpio = out.join("initramfs.cpio");
    // One build, however many guests boot at once (two threads building
    // into the same folder made one fail).
    static BUILDING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _building = BUILDING.lock().unwrap_or_else(|e| e.into_inner());
    let newest_src = ["workload.c", "init.sh", "build-initramfs.sh"]
        .iter()
        .filter_map(|f| mtime(&src.join(f)))
        .max();
    let fresh = match (mtime(&cpio), newest_src) {
        (Some(c), Some(s)) => c >= s,
        _ => false,
    };
    if !fresh {
        let st = Command::new("bash")
            .arg(src.join("build-initramfs.sh"))
            .arg(&out)
            .status()
            .expect("run build-initramfs.sh");
        assert!(st.success(), "build-initramfs.sh failed");
    }
    cpio
}

/// Why guest tests cannot run here, if they cannot (qemu or kernel missing)
/// and `HOTPROBE_SKIP_GUEST=1` allows skipping them; without that variable a
/// missing prerequisite fails the test, so the suite never passes by skipping.
pub fn missing_prerequisite() -> Option<String> {
    let why = find_missing_prerequisite()?;
    if std::env::var_os("HOTPROBE_SKIP_GUEST").is_some_and(|v| v == "1") {
        return Some(why);
    }
    panic!("guest test prerequisites: {why} (set HOTPROBE_SKIP_GUEST=1 to skip)");
}

fn find_missing_prerequisite() -> Option<String> {
    let kernel = workspace_root().join(".cache/kernel/vmlinuz");
    if !kernel.exists() {
        return Some(format!(
            "{} is missing (run scripts/setup.sh)",
            kernel.display()
        ));
    }
    let qemu = Command::new("qemu-system-x86_64")
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    if !matches!(qemu, Ok(s) if s.success()) {
        return Some("qemu-system-x86_64 is not installed (run scripts/setup.sh)".into());
    }
    None
}

/// A guest's serial console on QEMU's stdio: a reader thread collects the
/// output; lines are typed into QEMU's stdin.
pub struct Console {
    stdin: Option<ChildStdin>,
    console: Arc<(Mutex<Vec<u8>>, Condvar)>,
    cursor: usize,
}

impl Console {
    /// Reads `stdout` on a thread (appends `@QEMU-EXITED` at its end).
    pub fn new(stdin: Option<ChildStdin>, mut stdout: impl Read + Send + 'static) -> Console {
        let console = Arc::new((Mutex::new(Vec::new()), Condvar::new()));
        let c2 = console.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            loop {
                let n = match stdout.read(&mut buf) {
                    Ok(0) | Err(_) => 0,
                    Ok(n) => n,
                };
                let (m, cv) = &*c2;
                let mut v = m.lock().unwrap();
                if n == 0 {
                    v.extend_from_slice(b"\n@QEMU-EXITED\n");
                    cv.notify_all();
                    return;
                }
                v.extend_from_slice(&buf[..n]);
                cv.notify_all();
            }
        });
        Console {
            stdin,
            console,
            cursor: 0,
        }
    }

    /// Waits until `marker` appears on the console after the last match;
    /// returns the console text up to and including it.
    pub fn wait_for(&mut self, marker: &str, timeout: Duration) -> Vec<u8> {
        self.try_wait_for(marker, timeout).unwrap_or_else(|| {
            let tail = self.tail(2000);
            panic!("{marker:?} did not appear on the guest console within {timeout:?}; last output:\n{tail}")
        })
    }

    /// The last `n` bytes of the console.
    pub fn tail(&self, n: usize) -> String {
        let (m, _) = &*self.console;
        let v = m.lock().unwrap();
        String::from_utf8_lossy(&v[v.len().saturating_sub(n)..]).into_owned()
    }

    /// Like [`Console::wait_for`], `None` on timeout.
    pub fn try_wait_for(&mut self, marker: &str, timeout: Duration) -> Option<Vec<u8>> {
        let deadline = Instant::now() + timeout;
        let (m, cv) = &*self.console;
        let mut v = m.lock().unwrap();
        loop {
            let hay = &v[self.cursor.min(v.len())..];
            if let Some(i) = hay
                .windows(marker.len())
                .position(|w| w == marker.as_bytes())
            {
                let end = self.cursor + i + marker.len();
                let out = v[self.cursor..end].to_vec();
                self.cursor = end;
                return Some(out);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            v = cv.wait_timeout(v, deadline - now).unwrap().0;
        }
    }

    /// Whether `marker` has appeared since the last match (non-blocking).
    pub fn seen(&mut self, marker: &str) -> bool {
        self.try_wait_for(marker, Duration::ZERO).is_some()
    }

    /// Types a line on the guest's serial console.
    pub fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().expect("the console's input is ours");
        stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
        stdin.flush().unwrap();
    }
}

/// The QEMU command line of the test guest (no GDB stub): TCG, 256 MiB,
/// the serial console on stdio, a monitor on `DIR/monitor.sock`, the cached
/// kernel and the initramfs, `nokaslr` plus `append`.
pub fn qemu_args(dir: &Path, append: &str) -> Vec<std::ffi::OsString> {
    let kernel = workspace_root().join(".cache/kernel/vmlinuz");
    let mut v: Vec<std::ffi::OsString> = [
        "qemu-system-x86_64",
        "-accel",
        "tcg",
        "-m",
        "256M",
        "-display",
        "none",
        "-serial",
        "stdio",
        "-no-reboot",
    ]
    .iter()
    .map(|s| s.into())
    .collect();
    v.push("-monitor".into());
    v.push(
        format!(
            "unix:{},server=on,wait=off",
            dir.join("monitor.sock").display()
        )
        .into(),
    );
    v.push("-kernel".into());
    v.push(kernel.into());
    v.push("-initrd".into());
    v.push(initramfs().into());
    v.push("-append".into());
    v.push(
        format!("console=ttyS0 nokaslr quiet no_timer_check {append}")
            .trim()
            .to_string()
            .into(),
    );
    v
}

/// The guest kernel's text symbols (its /proc/kallsyms as the test
/// initramfs prints it), cached under `.cache/guest/` per kernel image
/// (with `nokaslr` they do not change from boot to boot); boots a guest
/// once to make it.
pub fn kallsyms_cached() -> PathBuf {
    let kernel = workspace_root().join(".cache/kernel/vmlinuz");
    let meta = std::fs::metadata(&kernel).expect("the guest kernel");
    let stamp = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_secs());
    let path = workspace_root().join(format!(".cache/guest/kallsyms-{}-{stamp}.txt", meta.len()));
    // One boot makes the cache, however many tests ask at once.
    static MAKING: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _making = MAKING.lock().unwrap_or_else(|e| e.into_inner());
    if !path.exists() {
        let g = Guest::boot("kallsyms");
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        std::fs::copy(g.kallsyms_file(), &tmp).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

/// Runs a human-monitor command on the monitor socket `sock` (e.g. `info
/// jit`) and returns its output.
pub fn monitor_command(sock: &Path, cmd: &str) -> String {
    use std::os::unix::net::UnixStream;
    let mut s = UnixStream::connect(sock).expect("connect to the QEMU monitor");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    let mut read_prompt = |s: &mut UnixStream, out: &mut Vec<u8>| loop {
        let n = s.read(&mut buf).expect("monitor read");
        assert!(n > 0, "monitor closed");
        out.extend_from_slice(&buf[..n]);
        if out.ends_with(b"(qemu) ") {
            return;
        }
    };
    read_prompt(&mut s, &mut out);
    out.clear();
    s.write_all(format!("{cmd}\n").as_bytes()).unwrap();
    read_prompt(&mut s, &mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// QEMU's count of translation-cache flushes (`info jit` on the monitor
/// socket `sock`).
pub fn tb_flushes_at(sock: &Path) -> u64 {
    let out = monitor_command(sock, "info jit");
    out.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("TB flush count")
                .map(|v| v.trim().parse::<u64>().unwrap_or(0))
        })
        .unwrap_or_else(|| panic!("no 'TB flush count' in info jit: {out}"))
}

/// A booted guest; killed on drop.
pub struct Guest {
    child: Child,
    console: Console,
    /// The directory holding the stub socket and the RAM file.
    pub dir: PathBuf,
    /// The gdb stub's unix socket.
    pub gdb_socket: PathBuf,
    /// The guest RAM file (memory-backend-file, share=on).
    pub ram_file: PathBuf,
    /// Symbols from the guest's /proc/kallsyms.
    pub symbols: HashMap<String, u64>,
    /// How long the boot took until the workload printed READY.
    pub boot_time: Duration,
}

impl Guest {
    /// Boots the guest and waits until the workload is READY.
    pub fn boot(tag: &str) -> Guest {
        let initrd = initramfs();
        // Unique per boot: tests of one binary boot guests concurrently,
        // with the same tag too.
        static BOOTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = BOOTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("hotprobe-guest-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let gdb_socket = dir.join("gdb.sock");
        let ram_file = dir.join("ram");
        let kernel = workspace_root().join(".cache/kernel/vmlinuz");
        let t0 = Instant::now();
        let mut child = Command::new("qemu-system-x86_64")
            .args([
                "-accel", "tcg", "-m", "256M", "-display", "none", "-serial", "stdio",
            ])
            .arg("-monitor")
            .arg(format!(
                "unix:{},server=on,wait=off",
                dir.join("monitor.sock").display()
            ))
            .arg("-object")
            .arg(format!(
                "memory-backend-file,id=mem,size=256M,mem-path={},share=on",
                ram_file.display()
            ))
            .args(["-machine", "memory-backend=mem"])
            .arg("-kernel")
            .arg(&kernel)
            .arg("-initrd")
            .arg(&initrd)
            .args([
                "-append",
                "console=ttyS0 nokaslr quiet no_timer_check",
                "-no-reboot",
            ])
            .arg("-chardev")
            .arg(format!(
                "socket,id=g0,path={},server=on,wait=off",
                gdb_socket.display()
            ))
            .args(["-gdb", "chardev:g0"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start qemu-system-x86_64");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut g = Guest {
            child,
            console: Console::new(Some(stdin), stdout),
            dir,
            gdb_socket,
            ram_file,
            symbols: HashMap::new(),
            boot_time: Duration::ZERO,
        };
        let syms = g.wait_for("@READY", Duration::from_secs(180));
        g.boot_time = t0.elapsed();
        let text = String::from_utf8_lossy(&syms).replace('\r', "");
        let begin = text.find("@KALLSYMS-BEGIN").expect("kallsyms begin marker");
        let end = text.find("@KALLSYMS-END").expect("kallsyms end marker");
        for line in text[begin..end].lines().skip(1) {
            let mut it = line.split_whitespace();
            if let (Some(a), Some(_t), Some(name)) = (it.next(), it.next(), it.next()) {
                if let Ok(a) = u64::from_str_radix(a, 16) {
                    g.symbols.entry(name.to_string()).or_insert(a);
                }
            }
        }
        std::fs::write(g.dir.join("kallsyms"), &text[begin..end]).unwrap();
        g
    }

    /// The address of a kernel symbol.
    pub fn sym(&self, name: &str) -> u64 {
        *self
            .symbols
            .get(name)
            .unwrap_or_else(|| panic!("no symbol {name} in the guest's kallsyms"))
    }

    /// Waits until `marker` appears on the console after the last match;
    /// returns the console text up to and including it.
    pub fn wait_for(&mut self, marker: &str, timeout: Duration) -> Vec<u8> {
        self.console.wait_for(marker, timeout)
    }

    /// Like [`Guest::wait_for`], `None` on timeout.
    pub fn try_wait_for(&mut self, marker: &str, timeout: Duration) -> Option<Vec<u8>> {
        self.console.try_wait_for(marker, timeout)
    }

    /// Whether `marker` has appeared since the last match (non-blocking).
    pub fn seen(&mut self, marker: &str) -> bool {
        self.console.seen(marker)
    }

    /// Types a line on the guest's serial console.
    pub fn send_line(&mut self, line: &str) {
        self.console.send_line(line)
    }

    /// Runs a human-monitor command (e.g. `info jit`) and returns its output.
    pub fn monitor(&self, cmd: &str) -> String {
        monitor_command(&self.dir.join("monitor.sock"), cmd)
    }

    /// QEMU's count of translation-cache flushes (`info jit`).
    pub fn tb_flushes(&self) -> u64 {
        tb_flushes_at(&self.dir.join("monitor.sock"))
    }

    /// Kills QEMU (the guest dies at once; its stub socket closes).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// The guest's kallsyms text as printed on its console (written at boot).
    pub fn kallsyms_file(&self) -> PathBuf {
        self.dir.join("kallsyms")
    }

    /// Waits for QEMU to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
