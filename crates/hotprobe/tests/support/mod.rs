//! Test support: compile the C tracees in tests/programs with gcc at test
//! time, spawn them under a Session with captured output.
#![allow(dead_code)]

use hotprobe::{Session, SpawnOptions, TargetId};
use std::path::{Path, PathBuf};

/// The repository root.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

/// Compile tests/programs/NAME.c with `flags` (cached by flags), return the binary.
pub fn program(name: &str, flags: &[&str]) -> PathBuf {
    let src = repo_root().join("tests/programs").join(format!("{name}.c"));
    let tag: String = flags
        .join("")
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("programs");
    std::fs::create_dir_all(&dir).unwrap();
    let out = dir.join(format!("{name}-{tag}"));
    let flags: Vec<&str> = flags.iter().copied().chain(["-g"]).collect();
    hotprobe_testkit::compile("gcc", &src, &out, &flags, &["-lpthread"])
}

/// A spawned tracee whose stdout goes to a file.
pub struct Captured {
    pub session: Session,
    pub target: TargetId,
    pub out: PathBuf,
}

impl Captured {
    /// Everything the tracee printed so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }
}

/// Spawn `bin args` under a new session, stdout captured.
pub fn spawn(bin: &Path, args: &[&str]) -> Captured {
    spawn_with_stdin(bin, args, None)
}

/// [`spawn`] with the tracee's stdin read from `stdin` (a pipe's read end,
/// say) when given.
pub fn spawn_with_stdin(bin: &Path, args: &[&str], stdin: Option<std::fs::File>) -> Captured {
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "out-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let f = std::fs::File::create(&out).unwrap();
    let mut session = Session::new();
    let args: Vec<std::ffi::OsString> = args.iter().map(|a| a.into()).collect();
    let target = session
        .spawn_with(
            bin,
            &args,
            &SpawnOptions {
                stdin,
                stdout: Some(f),
                ..Default::default()
            },
        )
        .expect("spawn");
    Captured {
        session,
        target,
        out,
    }
}

static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Lines of `out` that start with `prefix`.
pub fn lines_with<'a>(out: &'a str, prefix: &str) -> Vec<&'a str> {
    out.lines().filter(|l| l.starts_with(prefix)).collect()
}
