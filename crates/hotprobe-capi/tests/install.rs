//! Issue 24: `scripts/install.sh PREFIX` (DESTDIR honoured) installs the
//! binary, its man pages, shell completions and the C API so that `man
//! hotprobe`, the shells and `pkg-config hotprobe` find them. Installed
//! from the debug build the workspace's test run made (`--no-build`): run
//! through `cargo test --workspace` (scripts/test.sh), which builds the
//! CLI and this library before any test runs.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn run(c: &mut Command) -> String {
    let o = c.output().unwrap_or_else(|e| panic!("{c:?}: {e}"));
    assert!(
        o.status.success(),
        "{c:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn install_sh_puts_binary_man_pages_completions_and_c_api_under_a_prefix() {
    let tmp = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("install");
    let _ = std::fs::remove_dir_all(&tmp);
    let prefix = tmp.join("prefix");
    // DESTDIR: the files land under it, the paths inside name PREFIX.
    let staged = tmp.join("stage");
    run(Command::new(repo().join("scripts/install.sh"))
        .args(["--no-build", "--profile", "debug", "/opt/hotprobe-test"])
        .env("DESTDIR", &staged));
    let pc = std::fs::read_to_string(staged.join("opt/hotprobe-test/lib/pkgconfig/hotprobe.pc"))
        .unwrap();
    assert!(pc.starts_with("prefix=/opt/hotprobe-test\n"), "{pc}");
    // A real prefix: everything is found from there.
    run(Command::new(repo().join("scripts/install.sh"))
        .args(["--no-build", "--profile", "debug"])
        .arg(&prefix));
    let version = run(Command::new(prefix.join("bin/hotprobe")).arg("--version"));
    assert!(version.starts_with("hotprobe "), "{version}");
    let page = run(Command::new("man")
        .args(["-P", "cat", "hotprobe-count"])
        .env("MANPATH", prefix.join("share/man"))
        .env("MANWIDTH", "80"));
    assert!(page.contains("hotprobe-count"), "{page}");
    for f in [
        "share/bash-completion/completions/hotprobe",
        "share/zsh/site-functions/_hotprobe",
        "share/fish/vendor_completions.d/hotprobe.fish",
        "include/hotprobe.h",
        "lib/libhotprobe_c.so",
    ] {
        assert!(prefix.join(f).is_file(), "{f} not installed");
    }
    let flags = run(Command::new("pkg-config")
        .args(["--cflags", "--libs", "hotprobe"])
        .env("PKG_CONFIG_PATH", prefix.join("lib/pkgconfig")));
    let want = format!("-I{0}/include -L{0}/lib", prefix.display());
    assert!(flags.starts_with(&want), "{flags}");
    // A C program of the examples builds against the installed API and
    // finds the library at run time (rpath).
    let exe = tmp.join("count_and_patch");
    let mut cc = Command::new("gcc");
    cc.arg(repo().join("examples/c/count_and_patch.c"))
        .arg("-o")
        .arg(&exe);
    cc.args(flags.split_whitespace());
    run(&mut cc);
    // (cargo runs tests with target/debug in LD_LIBRARY_PATH: not here.)
    let ldd = run(Command::new("ldd").arg(&exe).env_remove("LD_LIBRARY_PATH"));
    let lib = prefix.join("lib/libhotprobe_c.so");
    assert!(ldd.contains(&lib.display().to_string()), "{ldd}");
    // Two installed copies of the static library are large: leave no disk
    // taken once the test has passed (a failure keeps them to look at).
    std::fs::remove_dir_all(&tmp).unwrap();
}
