//! The programs of the non-local-exit tests (crates/hotprobe/tests/programs:
//! C, C++, Rust, Go), compiled at test time into the target directory;
//! shared by hotprobe's reliability_trap and the CLI's nonlocal_cli tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// crates/hotprobe/tests/programs (both crates live in crates/).
pub fn programs_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../hotprobe/tests/programs")
}

/// A directory for compiled programs.
pub fn out_dir(what: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(what);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Runs `cmd` (a compiler writing where it is told) into `out`: see
/// [`hotprobe_testkit::build`].
pub fn build(src: &Path, out: &Path, cmd: impl FnOnce(&Path) -> Command) -> PathBuf {
    hotprobe_testkit::build(src, out, cmd)
}

/// programs/nonlocal.c built with gcc `opt` (`-O0`, `-O2`).
pub fn nonlocal_c(opt: &str) -> PathBuf {
    let src = programs_dir().join("nonlocal.c");
    let out = out_dir("nonlocal").join(format!("nonlocal{opt}"));
    build(&src, &out, |part| {
        let mut c = Command::new("gcc");
        c.args([opt, "-g", "-o"])
            .arg(part)
            .arg(&src)
            .arg("-lpthread");
        c
    })
}

/// programs/throw.cc built with `g++ -O2`.
pub fn throw_cc() -> PathBuf {
    let src = programs_dir().join("throw.cc");
    build(&src, &out_dir("nonlocal").join("throw"), |part| {
        let mut c = Command::new("g++");
        c.args(["-O2", "-g", "-o"]).arg(part).arg(&src);
        c
    })
}

/// programs/panic.rs built with `rustc -O`.
pub fn panic_rs() -> PathBuf {
    let src = programs_dir().join("panic.rs");
    build(&src, &out_dir("nonlocal").join("panic"), |part| {
        let mut c = Command::new("rustc");
        c.args(["--edition", "2021", "-O", "-o"])
            .arg(part)
            .arg(&src);
        c
    })
}

/// programs/gofunc built by `go build -ldflags LDFLAGS` as `name`, with
/// HOME, GOCACHE and GOPATH under the target directory (see
/// [`hotprobe_testkit::go_build`]).
pub fn go_program(name: &str, ldflags: &str) -> PathBuf {
    let base = out_dir("go");
    hotprobe_testkit::go_build(
        &programs_dir().join("gofunc"),
        &base.join(name),
        &base,
        ldflags,
        false,
    )
}

/// What `bin args` prints on its own (it must succeed).
pub fn native_output(bin: &Path, args: &[&str]) -> String {
    let o = Command::new(bin).args(args).output().unwrap();
    assert!(o.status.success(), "{} {args:?}: {o:?}", bin.display());
    String::from_utf8(o.stdout).unwrap()
}

/// The number after `key=` in `out`.
pub fn field(out: &str, key: &str) -> u64 {
    let at = out
        .find(&format!("{key}="))
        .unwrap_or_else(|| panic!("no {key}= in {out}"));
    out[at + key.len() + 1..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// The reason a return probe on a Go function is refused.
pub const GO_REASON: &str = "Go's runtime walks stacks by return address: a return probe would crash it; probe the entry instead";
