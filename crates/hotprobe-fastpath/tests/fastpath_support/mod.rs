//! What the fast path's tests share (fastpath, threads, injected): the
//! agent built beside them, the programs of tests/programs compiled here,
//! a process spawned with the agent preloaded and run to its end, a
//! program's own output, the text of a process, the `sleeper` program.

#![allow(dead_code)]

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use hotprobe_fastpath::*;
use hotprobe_process::{ProcessTarget, SpawnOptions};
use hotprobe_target::{Target, TargetEvent};

/// The folder of the compiled programs and their output.
pub fn tmp() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
}

pub fn agent() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let p = exe.parent().unwrap().join("libhotprobe_agent.so");
    assert!(p.exists(), "{} not built", p.display());
    p
}

pub fn compile(src: &str, out: &str, flags: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(src);
    let cc = if src.extension().unwrap() == "cc" {
        "g++"
    } else {
        "gcc"
    };
    hotprobe_testkit::compile(cc, &src, &tmp().join(out), flags, &["-lpthread"])
}

/// Spawns `exe` with the agent, returns the target and fast path.
pub fn spawn(exe: &Path, args: &[&str], out: &Path) -> (ProcessTarget, FastPath) {
    spawn_config(exe, args, out, FastPathConfig::default())
}

/// [`spawn`] with the shared memory sized by `config`.
pub fn spawn_config(
    exe: &Path,
    args: &[&str],
    out: &Path,
    config: FastPathConfig,
) -> (ProcessTarget, FastPath) {
    spawn_agent(exe, args, out, config, &agent())
}

/// [`spawn_config`] with the agent library at `agent`.
pub fn spawn_agent(
    exe: &Path,
    args: &[&str],
    out: &Path,
    config: FastPathConfig,
    agent: &Path,
) -> (ProcessTarget, FastPath) {
    // -pg builds write gmon.out at exit: keep it out of the source tree.
    let gmon = tmp().join("gmon").into_os_string();
    let mut opts = SpawnOptions {
        stdout: Some(File::create(out).unwrap()),
        env: vec![("GMON_OUT_PREFIX".into(), gmon)],
        ..Default::default()
    };
    let pending = FastPath::for_spawn(&mut opts, agent, config).unwrap();
    let args: Vec<OsString> = args.iter().map(OsString::from).collect();
    let mut t = ProcessTarget::spawn_with(exe, &args, &opts).unwrap();
    let fp = pending.attach(&mut t).unwrap();
    (t, fp)
}

pub fn run_to_exit(t: &mut ProcessTarget) {
    t.resume_all().unwrap();
    loop {
        match t.wait(None).unwrap() {
            TargetEvent::Exited(st) => {
                assert_eq!(
                    st.to_string(),
                    hotprobe_target::ExitStatus::Code(0).to_string()
                );
                return;
            }
            TargetEvent::ModulesChanged { thread } => t
                .resume(thread, hotprobe_target::ResumeMode::Continue)
                .unwrap(),
            TargetEvent::Breakpoint { thread, .. } | TargetEvent::Stepped { thread, .. } => t
                .resume(thread, hotprobe_target::ResumeMode::Continue)
                .unwrap(),
            _ => {}
        }
    }
}

pub fn native_output(exe: &Path, args: &[&str]) -> String {
    let o = Command::new(exe)
        .args(args)
        .env("GMON_OUT_PREFIX", tmp().join("gmon"))
        .output()
        .unwrap();
    assert!(o.status.success());
    String::from_utf8(o.stdout).unwrap()
}

pub fn text_of(pid: i32) -> Vec<(u64, Vec<u8>)> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let mem = File::open(format!("/proc/{pid}/mem")).unwrap();
    let mut v = vec![];
    for l in maps.lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f[1] != "r-xp" || f.len() < 6 || f[5].contains("hotprobe_agent") || f[5].starts_with('[')
        {
            continue;
        }
        let (a, b) = f[0].split_once('-').unwrap();
        let (a, b) = (
            u64::from_str_radix(a, 16).unwrap(),
            u64::from_str_radix(b, 16).unwrap(),
        );
        let mut buf = vec![0; (b - a) as usize];
        use std::os::unix::fs::FileExt;
        mem.read_exact_at(&mut buf, a).unwrap();
        v.push((a, buf));
    }
    v
}

/// Starts tests/programs/sleeper.c (built as `tag`) for `calls` calls,
/// waiting at its "ready" line for a line on stdin; returns the child and
/// its stdout, past "ready".
pub fn start_sleeper(
    tag: &str,
    calls: u64,
) -> (std::process::Child, BufReader<std::process::ChildStdout>) {
    let exe = compile("sleeper.c", tag, &["-O2"]);
    let mut child = Command::new(&exe)
        .arg(calls.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    (child, stdout)
}
