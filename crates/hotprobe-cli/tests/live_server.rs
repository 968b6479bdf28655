//! Live servers left as found (issue 23, item 6): attaching to a running
//! server and detaching leaves nothing of hotprobe's mapped in it (agent,
//! shared memory, shadow stacks, stub and trampoline pages), its memory
//! where a server never attached to has it, and the server answering.
//! Processes that dropped their privileges (another uid, not dumpable:
//! they cannot open the tracer's `/proc/PID/fd`) get the agent all the
//! same, as descriptors of their own: probes on jump and patch, exact
//! counts.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use common::record::{info, trace_dir};
use common::{gcc, line_reader, text, CountTable, HOTPROBE};
use hotprobe::fastpath::{ledger_state, UndoState};
use hotprobe_testkit::TempDir;

/// Debian's python (not a shim on PATH).
const PYTHON: &str = "/usr/bin/python3";
/// How long an event (a port answering, a line of hotprobe's) may take.
const LIMIT: Duration = Duration::from_secs(60);

/// `python3 -m http.server` on a free port, serving `dir`; killed on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    /// Starts it and waits for its "Serving HTTP on … port N" line.
    fn start(dir: &std::path::Path) -> Server {
        let mut child = Command::new(PYTHON)
            .args(["-u", "-m", "http.server", "0", "--bind", "127.0.0.1"])
            .arg("--directory")
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("python3 runs");
        let lines = line_reader(child.stdout.take().unwrap());
        let line = lines
            .recv_timeout(LIMIT)
            .expect("http.server says its port");
        let port = line
            .split_whitespace()
            .skip_while(|w| *w != "port")
            .nth(1)
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        Server { child, port }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    /// GET /`name`: the body, after asserting a 200 answer.
    fn get(&self, name: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("the server answers");
        s.set_read_timeout(Some(LIMIT)).unwrap();
        write!(s, "GET /{name} HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
        answer
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_string())
            .unwrap_or_default()
    }

    /// `n` requests, each answered with the file's content.
    fn requests(&self, n: usize) {
        for _ in 0..n {
            assert_eq!(self.get("page.txt"), PAGE);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const PAGE: &str = "hotprobe live server page\n";

/// `hotprobe ARGS` attached to a running process: once it says it is
/// attached, `during` runs; then hotprobe is interrupted (Ctrl-C: it
/// detaches and prints what it has) and its end waited for. Its stdout
/// and stderr.
fn attached(args: &[&str], during: impl FnOnce()) -> (String, String) {
    let mut hp = Command::new(HOTPROBE)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = common::reader(hp.stdout.take().unwrap());
    let err: Receiver<String> = line_reader(hp.stderr.take().unwrap());
    // Its lines up to "attached" (record names its trace first).
    let mut rest = Vec::new();
    loop {
        let l = err.recv_timeout(LIMIT).expect("hotprobe says it attached");
        let done = l.starts_with("hotprobe: attached to pid");
        rest.push(l);
        if done {
            break;
        }
    }
    during();
    // SAFETY: a signal to the child this test started.
    unsafe { libc::kill(hp.id() as i32, libc::SIGINT) };
    while let Ok(l) = err.recv_timeout(LIMIT) {
        rest.push(l);
    }
    let status = hp.wait().unwrap();
    let out = text(&out.join().unwrap());
    let err = rest.join("\n");
    assert!(status.success(), "{args:?}: {status}\n{out}\n{err}");
    (out, err)
}

/// The executable mappings of `pid` (range and name).
fn exec_mappings(pid: u32) -> Vec<String> {
    maps(pid)
        .lines()
        .filter(|l| l.split_whitespace().nth(1).is_some_and(|p| p.contains('x')))
        .map(|l| l.to_string())
        .collect()
}

fn maps(pid: u32) -> String {
    std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap()
}

/// `VmRSS` of `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

/// Nothing of hotprobe's is mapped in `pid`: no mapping named after it
/// (its shared memories, the agent's memfd) and the same executable
/// mappings as before it attached (no agent, near page, stub or
/// trampoline page).
fn assert_left_as_found(pid: u32, exec_before: &[String], what: &str) {
    let m = maps(pid);
    assert!(!m.contains("hotprobe"), "{what}: left in {pid}:\n{m}");
    assert_eq!(
        exec_mappings(pid),
        exec_before,
        "{what}: executable mappings of {pid}"
    );
}

/// 10 cycles of `count -p` and `record -p` on a live `http.server`, with
/// requests during each and the same requests made to a second server
/// never attached to: after every detach nothing of hotprobe's stays
/// mapped, the counts and recorded calls equal the requests, and at the
/// end the server's RSS is within 2 MiB of the other's and it answers.
#[test]
fn http_server_left_as_found_after_ten_cycles() {
    let dir = TempDir::new("live-server");
    std::fs::write(dir.path().join("page.txt"), PAGE).unwrap();
    let probed = Server::start(dir.path());
    let control = Server::start(dir.path());
    // Both have served once (their first request maps what any request
    // needs) before the measure starts.
    probed.requests(1);
    control.requests(1);
    let pid = probed.pid();
    let pid_s = pid.to_string();
    let exec_before = exec_mappings(pid);
    const PER_CYCLE: usize = 4;
    for cycle in 0..10 {
        // accept4: one call per request. poll: the server waits in it
        // between requests, so a hooked return is live at detach and must
        // be put back. PyObject_GetAttr: a hot function.
        let (out, err) = attached(
            &[
                "count",
                "-p",
                &pid_s,
                "libc.so.6:accept4",
                "libc.so.6:poll%return",
                "python3.11:PyObject_GetAttr",
            ],
            || probed.requests(PER_CYCLE),
        );
        control.requests(PER_CYCLE);
        let table = CountTable::parse(&out, &err);
        assert_eq!(
            table.hits("libc.so.6:accept4"),
            PER_CYCLE as u64,
            "cycle {cycle}:\n{out}\n{err}"
        );
        assert_eq!(table.execution("libc.so.6:accept4"), "jump", "{out}");
        assert_left_as_found(pid, &exec_before, &format!("count, cycle {cycle}\n{err}"));

        let trace = trace_dir(&format!("live-server-{cycle}"));
        let (_, err) = attached(
            &[
                "record",
                "-o",
                trace.to_str().unwrap(),
                "-p",
                &pid_s,
                "libc.so.6:accept4",
                "libc.so.6:poll",
            ],
            || probed.requests(PER_CYCLE),
        );
        control.requests(PER_CYCLE);
        assert_left_as_found(pid, &exec_before, &format!("record, cycle {cycle}\n{err}"));
        let calls = info(&trace, LIMIT);
        assert_eq!(calls.lost, 0, "cycle {cycle}: {calls:?}\n{err}");
        // Every request's accept4, and poll's calls: one per request
        // (the server waits in it for each), but the first, entered
        // before the attach. The call in progress at detach, its return
        // hooked by the agent, has its real return address put back: the
        // server answers below.
        assert!(
            calls.calls >= 2 * PER_CYCLE as u64 - 1,
            "cycle {cycle}: {calls:?}\n{err}"
        );
        let _ = std::fs::remove_dir_all(&trace);
    }
    assert_eq!(probed.get("page.txt"), PAGE);
    assert_eq!(control.get("page.txt"), PAGE);
    let (a, c) = (rss_kib(pid), rss_kib(control.pid()));
    assert!(
        a.abs_diff(c) <= 2048,
        "RSS {a} KiB after 10 cycles, {c} KiB never attached\n{}",
        maps(pid)
    );
}

/// The program tests/programs/dropped_privileges.c, built with -O1.
fn dropped_privileges_program() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("live-server");
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/dropped_privileges.c");
    gcc(&src, &dir.join("dropped_privileges"), &["-O1"])
}

/// A program that called setuid(65534) and PR_SET_DUMPABLE 0: attached
/// to, its two work functions go on a jump and a patch (the agent loaded:
/// no trap), their counts equal the calls it made while attached, nothing
/// of hotprobe's stays mapped after detach, and it works on.
#[test]
fn process_that_dropped_privileges_gets_the_agent() {
    let mut child = Command::new(dropped_privileges_program())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    let lines = line_reader(child.stdout.take().unwrap());
    let ready = lines
        .recv_timeout(LIMIT)
        .expect("the program says it is ready");
    assert_eq!(ready, "ready uid 65534 dumpable 0");
    let pid = child.id();
    let exec_before = exec_mappings(pid);
    let mut ask = |n: u64| {
        writeln!(input, "{n}").unwrap();
        let done = lines.recv_timeout(LIMIT).expect("the program answers");
        assert_eq!(done, format!("done {n}"));
    };
    let (out, err) = attached(
        &["count", "-p", &pid.to_string(), "work_jump", "work_patch"],
        || {
            ask(1000);
            ask(234);
        },
    );
    let table = CountTable::parse(&out, &err);
    assert_eq!(table.execution("work_jump"), "jump", "{out}\n{err}");
    // The first word of EXECUTION ("patch (patchable entry)").
    assert_eq!(table.execution("work_patch"), "patch", "{out}\n{err}");
    assert_eq!(table.hits("work_jump"), 1234, "{out}\n{err}");
    assert_eq!(table.hits("work_patch"), 1234, "{out}\n{err}");
    assert!(!err.contains("could not be loaded"), "{err}");
    assert_left_as_found(pid, &exec_before, &err);
    ask(5);
    // Attached again, then hotprobe killed with SIGKILL: the agent hears
    // it at once through the hang-up pipe it was handed as a descriptor
    // of its own (it cannot open hotprobe's), and puts the code back with
    // no hit of a probe (a stale heartbeat is seen only on a hit).
    let mut hp = Command::new(HOTPROBE)
        .args(["count", "-p", &pid.to_string(), "work_jump", "work_patch"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let said = line_reader(hp.stderr.take().unwrap());
    let first = said.recv_timeout(LIMIT).expect("hotprobe says it attached");
    assert!(first.starts_with("hotprobe: attached to pid"), "{first}");
    let published = ledger_state(pid).unwrap().map_or(0, |s| s.published);
    assert_eq!(published, 2, "{first}");
    hp.kill().unwrap();
    hp.wait().unwrap();
    let deadline = Instant::now() + LIMIT;
    loop {
        let state = ledger_state(pid).unwrap();
        if state.is_some_and(|s| s.undo == UndoState::Done && s.published == 0) {
            assert_eq!(state.map(|s| s.undone), Some(2), "{state:?}");
            break;
        }
        assert!(Instant::now() < deadline, "no undo: {state:?}");
        std::thread::yield_now();
    }
    ask(7);
    let _ = child.kill();
    let _ = child.wait();
}

/// nginx with `master_process on; user nobody`, on a free port of
/// 127.0.0.1 with its files in a temporary folder; killed on drop.
struct Nginx {
    master: Child,
    worker: u32,
    port: u16,
    _dir: TempDir,
}

impl Nginx {
    fn start() -> Nginx {
        let dir = TempDir::new("live-nginx");
        // World-readable: the worker runs as nobody.
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let d = dir.path().display();
        let conf = format!(
            "master_process on;\nworker_processes 1;\nuser nobody nogroup;\ndaemon off;\n\
             pid {d}/nginx.pid;\nerror_log stderr notice;\n\
             events {{ worker_connections 64; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n\
             proxy_temp_path {d}/proxy;\n  fastcgi_temp_path {d}/fastcgi;\n\
             uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n\
             server {{ listen 127.0.0.1:{port}; location / {{ return 200 \"ok\\n\"; }} }}\n}}\n"
        );
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let mut master = Command::new("/usr/sbin/nginx")
            .arg("-c")
            .arg(&conf_path)
            .arg("-p")
            .arg(dir.path())
            .args(["-e", "stderr"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("nginx runs (setup.sh installs nginx-light)");
        let lines = line_reader(master.stderr.take().unwrap());
        // "... [notice] M#M: start worker process W": the worker exists;
        // the master listens already (it binds before forking).
        let worker = loop {
            let l = lines.recv_timeout(LIMIT).expect("nginx starts its worker");
            if let Some(w) = l.split("start worker process ").nth(1) {
                break w.trim().parse().unwrap();
            }
            assert!(!l.contains("[emerg]"), "{l}");
        };
        Nginx {
            master,
            worker,
            port,
            _dir: dir,
        }
    }

    /// One GET / answered "ok".
    fn request(&self) {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("nginx answers");
        s.set_read_timeout(Some(LIMIT)).unwrap();
        write!(s, "GET / HTTP/1.0\r\nHost: localhost\r\n\r\n").unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        assert!(answer.ends_with("\r\n\r\nok\n"), "{answer}");
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM to the master stops the worker too; then make sure.
        // SAFETY: signals to processes this test started.
        unsafe {
            libc::kill(self.master.id() as i32, libc::SIGTERM);
        }
        let _ = self.master.wait();
        // SAFETY: as above (the worker is gone already, or goes now).
        unsafe { libc::kill(self.worker as i32, libc::SIGKILL) };
    }
}

/// Whether `pid` runs as uid 65534 (nobody): it cannot open the files
/// of a tracer running as root under /proc.
fn runs_as_nobody(pid: u32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .any(|l| l.starts_with("Uid:") && l.split_whitespace().nth(1) == Some("65534"))
}

/// An nginx worker running as nobody: `count` on its request handling
/// goes on jumps, counts equal the requests made, nothing stays mapped,
/// and nginx answers after.
#[test]
fn nginx_worker_running_as_nobody_gets_the_agent() {
    let nginx = Nginx::start();
    nginx.request();
    let w = nginx.worker;
    assert!(runs_as_nobody(w), "worker {w}");
    let exec_before = exec_mappings(w);
    const REQUESTS: u64 = 25;
    let (out, err) = attached(
        &[
            "count",
            "-p",
            &w.to_string(),
            "ngx_http_create_request",
            "ngx_http_process_request",
        ],
        || (0..REQUESTS).for_each(|_| nginx.request()),
    );
    let table = CountTable::parse(&out, &err);
    for f in ["ngx_http_create_request", "ngx_http_process_request"] {
        assert_eq!(table.execution(f), "jump", "{out}\n{err}");
        assert_eq!(table.hits(f), REQUESTS, "{f}: {out}\n{err}");
    }
    assert_left_as_found(w, &exec_before, &err);
    nginx.request();
}
