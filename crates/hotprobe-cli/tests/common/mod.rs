//! Helpers shared by the CLI's integration tests.
#![allow(dead_code)] // each test binary uses its own subset

/// `hotprobe record` runs and `info` of their traces.
pub mod record;

/// calls.c's log and recorded runs, for analyse_cli.rs and export_cli.rs.
pub mod calls_log;

/// two_sessions.c, for attach_refusals.rs, foreign_tracer.rs and
/// left_as_found.rs.
pub mod two_sessions;

/// bpftrace's uprobe counts of a workload, never beside a hotprobe run.
pub mod bpftrace;

/// `count -p` (or `record -p`) beside a test, interrupted as Ctrl-C does.
pub mod attached;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

#[allow(unused_imports)] // each test binary uses its own subset
pub use hotprobe_testkit::{kill_group, line_reader, output_within, reader, ready_pid, text};

/// Every task of `pid` has no tracer.
pub fn untraced(pid: u32) -> bool {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks.filter_map(Result::ok).all(|t| {
        let status = std::fs::read_to_string(t.path().join("status")).unwrap_or_default();
        status
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["TracerPid:", "0"])
    })
}

/// The `hotprobe` binary under test.
pub const HOTPROBE: &str = env!("CARGO_BIN_EXE_hotprobe");

/// Runs `hotprobe ARGS` with stdin closed, to completion.
pub fn hotprobe(args: &[&str]) -> Output {
    Command::new(HOTPROBE)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("hotprobe runs")
}

/// Compiles C `src` into `out` with gcc, `flags`, `-g` and `-lpthread`
/// (through [`hotprobe_testkit::compile`]: reused while fresh, written
/// aside and renamed).
pub fn gcc(src: &Path, out: &Path, flags: &[&str]) -> PathBuf {
    gcc_with(src, out, flags, &[])
}

/// [`gcc`] with `libs` after the source (`-L DIR -lfoo`, `-Wl,...`), where
/// the linker wants them.
pub fn gcc_with(src: &Path, out: &Path, flags: &[&str], libs: &[&str]) -> PathBuf {
    let flags: Vec<&str> = flags.iter().copied().chain(["-g"]).collect();
    let libs: Vec<&str> = libs.iter().copied().chain(["-lpthread"]).collect();
    hotprobe_testkit::compile("gcc", src, out, &flags, &libs)
}

/// `hotprobe ARGS`, through [`output_within`].
pub fn hotprobe_within(args: &[&str], limit: std::time::Duration) -> Output {
    let mut c = Command::new(HOTPROBE);
    c.args(args);
    output_within(c, limit)
}

/// The table `hotprobe count` prints after the program's output: its
/// header line (`PROBE  [PID]  ADDRESS  HITS  NMISSED  EXECUTION  WHY`)
/// and the rows under it, split on whitespace (every column before
/// EXECUTION is one word; EXECUTION and WHY may be several).
pub struct CountTable {
    /// The header's column names.
    pub head: Vec<String>,
    /// The rows' words.
    pub rows: Vec<Vec<String>>,
    /// The whole stdout, for messages.
    pub all: String,
}

/// Where the count table starts in `stdout`: the line starting with
/// `PROBE` and holding `HITS`.
fn table_start(stdout: &str) -> Option<usize> {
    let mut at = 0;
    for l in stdout.split_inclusive('\n') {
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.first() == Some(&"PROBE") && w.contains(&"HITS") {
            return Some(at);
        }
        at += l.len();
    }
    None
}

/// The program's output in `hotprobe count`'s stdout: everything before
/// the table (all of it when there is no table).
pub fn program_output(stdout: &str) -> &str {
    &stdout[..table_start(stdout).unwrap_or(stdout.len())]
}

impl CountTable {
    /// Parses the table in `stdout`; panics (showing `stderr`) when there
    /// is none.
    pub fn parse(stdout: &str, stderr: &str) -> CountTable {
        let at = table_start(stdout).unwrap_or_else(|| {
            panic!("no count table (PROBE ... HITS) in stdout:\n{stdout}\nstderr:\n{stderr}")
        });
        let mut lines = stdout[at..].lines();
        let head = lines
            .next()
            .unwrap()
            .split_whitespace()
            .map(String::from)
            .collect();
        let rows = lines
            .take_while(|l| !l.trim().is_empty())
            .map(|l| l.split_whitespace().map(String::from).collect())
            .collect();
        CountTable {
            head,
            rows,
            all: format!("{stdout}\nstderr:\n{stderr}"),
        }
    }

    /// The index of column `name`.
    pub fn col(&self, name: &str) -> usize {
        self.head
            .iter()
            .position(|h| h == name)
            .unwrap_or_else(|| panic!("no column {name} in the table:\n{}", self.all))
    }

    /// The rows of `probe`.
    pub fn rows_of(&self, probe: &str) -> Vec<&Vec<String>> {
        self.rows
            .iter()
            .filter(|r| r.first().map(String::as_str) == Some(probe))
            .collect()
    }

    /// The one row of `probe` (the table without a PID column).
    pub fn row(&self, probe: &str) -> &Vec<String> {
        let rows = self.rows_of(probe);
        assert_eq!(rows.len(), 1, "one row of {probe}:\n{}", self.all);
        rows[0]
    }

    fn num(&self, r: &[String], col: &str) -> u64 {
        let c = self.col(col);
        r.get(c)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no number in column {col} of {r:?}:\n{}", self.all))
    }

    /// HITS of the one row of `probe`.
    pub fn hits(&self, probe: &str) -> u64 {
        self.num(self.row(probe), "HITS")
    }

    /// HITS of the row of `probe` and process `pid` (the table of `-f`).
    pub fn hits_of(&self, probe: &str, pid: i32) -> u64 {
        let c = self.col("PID");
        let rows: Vec<_> = self
            .rows_of(probe)
            .into_iter()
            .filter(|r| r.get(c).map(String::as_str) == Some(&*pid.to_string()))
            .collect();
        assert_eq!(
            rows.len(),
            1,
            "one row of {probe} for pid {pid}:\n{}",
            self.all
        );
        self.num(rows[0], "HITS")
    }

    /// EXECUTION of the one row of `probe` (its first word: patch, jump,
    /// trap).
    pub fn execution(&self, probe: &str) -> String {
        let c = self.col("EXECUTION");
        self.row(probe)
            .get(c)
            .cloned()
            .unwrap_or_else(|| panic!("no EXECUTION for {probe}:\n{}", self.all))
    }
}

/// The calls in a call tree as `trace` and `replay` print them (`[  TID]
/// | <2 spaces per depth>name(...) {`, or `name(...);` for a leaf in
/// replay; closing lines skipped): (tid, depth, name) in order.
pub fn call_tree(out: &str) -> Vec<(u32, usize, String)> {
    let mut t = Vec::new();
    for l in out.lines() {
        let Some((head, body)) = l.split_once("] | ") else {
            continue;
        };
        let tid: u32 = head
            .rsplit('[')
            .next()
            .unwrap()
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("no tid in {l:?}"));
        let name = body.trim_start();
        if name.starts_with('}') {
            continue;
        }
        let depth = (body.len() - name.len()) / 2;
        let name = name.split('(').next().unwrap().to_string();
        t.push((tid, depth, name));
    }
    t
}

/// `mix` (5 bytes: `lea; add; shl; xor; ret` at -O1, so that `mix+3`
/// lies inside the jump a probe at `mix` takes), called `n` times (argv[1],
/// 20 by default); prints argc, then the iterations and the sum. `serve`:
/// prints `ready`, then calls it every millisecond until killed. `lines`:
/// prints `ready`, then for each number n on stdin the sum of `mix(i, n)`
/// for i < n.
pub const MIX: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
__attribute__((noinline)) int mix(int a, int b) {
    int r = a * 3 + b;
    __asm__ volatile("" ::: "memory");
    return r ^ (a << 2);
}
int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (argc > 1 && !strcmp(argv[1], "lines")) {
        /* For each number n read: the sum of mix(i, n) for i < n. */
        char buf[64];
        printf("ready\n");
        while (fgets(buf, sizeof buf, stdin)) {
            int n = atoi(buf);
            long s = 0;
            for (int i = 0; i < n; i++) s += mix(i, n);
            printf("%ld\n", s);
        }
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "serve")) {
        /* Runs until killed: a call of mix every millisecond. */
        printf("ready\n");
        for (long i = 0;; i++) { mix((int)i, 1); usleep(1000); }
    }
    int n = argc > 1 ? atoi(argv[1]) : 20;
    long s = 0;
    printf("argc=%d\n", argc);
    for (int i = 0; i < n; i++) s += mix(i, n);
    printf("iterations=%d sum=%ld\n", n, s);
    return 0;
}
"#;

/// [`MIX`], built with gcc -O1 (once per test binary's tmp dir).
pub fn mix_program() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ledger");
    std::fs::create_dir_all(&dir).unwrap();
    let src = hotprobe_testkit::write_source(&dir, "mix.c", MIX);
    gcc(&src, &dir.join("mix"), &["-O1"])
}

/// `len` bytes of process `pid`'s memory at `addr` (/proc/PID/mem).
pub fn memory_at(pid: u32, addr: u64, len: usize) -> Vec<u8> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = std::fs::File::open(format!("/proc/{pid}/mem")).unwrap();
    f.seek(SeekFrom::Start(addr)).unwrap();
    let mut b = vec![0u8; len];
    f.read_exact(&mut b).unwrap();
    b
}

/// The offset in its file of run-time address `addr` of process `pid`
/// (the file mapping /proc/PID/maps shows around it).
pub fn file_offset_of(pid: u32, addr: u64) -> u64 {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines()
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            let (s, e) = w.first()?.split_once('-')?;
            let (s, e) = (
                u64::from_str_radix(s, 16).ok()?,
                u64::from_str_radix(e, 16).ok()?,
            );
            let offset = u64::from_str_radix(w.get(2)?, 16).ok()?;
            (s..e).contains(&addr).then_some(addr - s + offset)
        })
        .unwrap_or_else(|| panic!("{addr:#x} is not mapped in {pid}:\n{maps}"))
}

/// `hotprobe ARGS` on an attached process: started, and once it says it
/// is attached (its probes are in), `during` runs; then hotprobe's end is
/// waited for (ARGS give it `--duration`). What `during` returned, with
/// hotprobe's exit status, stdout and stderr.
pub fn while_attached<T>(
    args: &[&str],
    during: impl FnOnce() -> T,
) -> (T, std::process::ExitStatus, String, String) {
    use std::io::{BufRead, BufReader, Read};
    let mut hp = Command::new(HOTPROBE)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(hp.stderr.take().unwrap());
    let mut started = String::new();
    err.read_line(&mut started).unwrap();
    assert!(
        started.starts_with("hotprobe: attached to pid"),
        "{args:?}: {started}"
    );
    let value = during();
    let out = hp.wait_with_output().unwrap();
    let mut rest = String::new();
    err.read_to_string(&mut rest).unwrap();
    (
        value,
        out.status,
        text(&out.stdout),
        format!("{started}{rest}"),
    )
}

/// [`mix_program`] `serve`, started and past its `ready` line: a process
/// that calls `mix` every millisecond until killed (killed on drop).
pub struct MixServer {
    /// The process.
    pub child: std::process::Child,
    /// Its output after `ready` (kept open: the program writes nothing more).
    _out: std::process::ChildStdout,
}

impl MixServer {
    /// Starts it and waits for its `ready` line.
    pub fn start() -> MixServer {
        use std::io::Read;
        let mut child = Command::new(mix_program())
            .arg("serve")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = child.stdout.take().unwrap();
        let mut ready = [0u8; 6];
        out.read_exact(&mut ready).unwrap();
        assert_eq!(&ready, b"ready\n");
        MixServer { child, _out: out }
    }

    /// Its pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for MixServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// tests/programs/dlopen_cond.c (it dlopens a library by path and calls
/// its `scale`), and dlopen_cond_lib.c built with `flags` as
/// `lib`LIB`.so` next to it, both in `dir`.
pub fn dlopen_cond(dir: &Path, lib: &str, flags: &[&str]) -> (PathBuf, PathBuf) {
    let source =
        |name: &str| Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/programs/{name}.c"));
    let prog = hotprobe_testkit::compile(
        "gcc",
        &source("dlopen_cond"),
        &dir.join("dlopen_cond"),
        &["-O1", "-g"],
        &["-ldl"],
    );
    let mut f = vec!["-O1", "-shared", "-fPIC"];
    f.extend_from_slice(flags);
    let so = hotprobe_testkit::compile(
        "gcc",
        &source("dlopen_cond_lib"),
        &dir.join(format!("lib{lib}.so")),
        &f,
        &[],
    );
    (prog, so)
}

/// `hotprobe ARGS` within `limit`: asserts a usage error (exit 2); its
/// stderr.
pub fn usage_refused(args: &[&str], limit: std::time::Duration) -> String {
    let o = hotprobe_within(args, limit);
    let err = text(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{args:?}: {}\n{err}",
        text(&o.stdout)
    );
    err
}

/// The `N` after `prefix` in the program's output.
pub fn printed(out: &str, prefix: &str) -> u64 {
    out.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {prefix:?} in {out}"))
}

/// The number after `drops:` in record's summary.
pub fn drops(err: &str) -> u64 {
    err.lines()
        .find_map(|l| l.trim().strip_prefix("drops:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no drops line in {err}"))
}
