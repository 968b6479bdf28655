//! Builds a cdylib of the workspace for a crate that embeds it
//! (`include_bytes!`), from that crate's build script: the fast path's
//! agent (`hotprobe-agent`) and the QEMU plugin (`hotprobe-qemu-plugin`).
//!
//! The nested build:
//! - uses its own target directory under `OUT_DIR` (the outer build holds
//!   the lock of the outer one: sharing it would deadlock), kept between
//!   runs, so a rerun is incremental;
//! - passes `--locked` and `--offline`: by the time a build script runs the
//!   outer cargo has resolved (and, with `--locked`, checked) `Cargo.lock`,
//!   and the libraries' registry dependencies are the outer build's too;
//! - builds for the outer build's `TARGET`, with the outer flags left out:
//!   `RUSTFLAGS`/`CARGO_ENCODED_RUSTFLAGS` (coverage, sanitizers and the like
//!   do not belong in a library loaded into other programs, and the
//!   agent's hot path relies on the release codegen), and the wrappers
//!   `cargo clippy` installs (`RUSTC_WORKSPACE_WRAPPER`, `CLIPPY_ARGS`: the
//!   library is linted as a workspace member of its own);
//! - shares the outer build's jobserver (`CARGO_MAKEFLAGS` is inherited);
//! - strips debug information (≈ a fifth of the size; the symbol table
//!   stays, for the blacklist and for debuggers).

use std::path::{Path, PathBuf};
use std::process::Command;

/// What to build.
pub struct Embedded<'a> {
    /// The workspace package (`hotprobe-agent`).
    pub package: &'a str,
    /// The library file it builds (`libhotprobe_agent.so`).
    pub file: &'a str,
    /// A variable naming a prebuilt file to embed instead
    /// (`HOTPROBE_EMBED_AGENT`).
    pub prebuilt_env: &'a str,
    /// Directories of the workspace's `crates/` whose changes rebuild it
    /// (`hotprobe-agent`, `hotprobe-abi`).
    pub sources: &'a [&'a str],
}

/// Builds `e` (or copies its prebuilt file) to `$OUT_DIR/<file>` and
/// returns that path. Panics with the reason when the build fails: this
/// runs in a build script.
pub fn build(e: &Embedded<'_>) -> PathBuf {
    let manifest =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let crates = manifest.parent().expect("crates/").to_path_buf();
    let root = crates.parent().expect("workspace root").to_path_buf();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let dest = out.join(e.file);

    println!("cargo:rerun-if-env-changed={}", e.prebuilt_env);
    if let Some(prebuilt) = std::env::var_os(e.prebuilt_env) {
        let prebuilt = PathBuf::from(prebuilt);
        println!("cargo:rerun-if-changed={}", prebuilt.display());
        copy(&prebuilt, &dest);
        return dest;
    }
    for s in e.sources {
        for p in [
            crates.join(s).join("src"),
            crates.join(s).join("Cargo.toml"),
        ] {
            println!("cargo:rerun-if-changed={}", p.display());
        }
    }
    // Profiles and the locked dependency versions.
    for p in [root.join("Cargo.toml"), root.join("Cargo.lock")] {
        println!("cargo:rerun-if-changed={}", p.display());
    }

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = std::env::var("TARGET").expect("TARGET");
    let target_dir = out.join(format!("{}-target", e.package));
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "--release", "--locked", "--offline", "--lib"])
        .args(["-p", e.package, "--target", &target])
        // No debug information: a fifth of the size (symbols stay).
        .args(["--config", "profile.release.strip=\"debuginfo\""])
        .arg("--manifest-path")
        .arg(root.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir);
    for var in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "RUSTDOCFLAGS",
        "CARGO_ENCODED_RUSTDOCFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "CARGO_BUILD_RUSTC_WORKSPACE_WRAPPER",
        "CLIPPY_ARGS",
        "CARGO_PRIMARY_PACKAGE",
    ] {
        cmd.env_remove(var);
    }
    // Cargo-internal variables meant for the build script's own cargo.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("__CARGO") {
            cmd.env_remove(k);
        }
    }
    // Stdout is read by the outer cargo for `cargo:` lines: the nested
    // build's goes to stderr.
    cmd.stdout(std::io::stderr());
    let st = cmd
        .status()
        .unwrap_or_else(|err| panic!("cannot run the nested cargo build of {}: {err}", e.package));
    if !st.success() {
        panic!(
            "the nested `cargo build --release -p {}` (target dir {}) failed: {st}; set {} to a \
             prebuilt {} to skip it",
            e.package,
            target_dir.display(),
            e.prebuilt_env,
            e.file
        );
    }
    copy(
        &target_dir.join(&target).join("release").join(e.file),
        &dest,
    );
    dest
}

/// Copies `from` to `to` unless `to` already holds the same bytes (keeps
/// its mtime, so the embedding crate is not rebuilt for nothing). The new
/// file is written beside and renamed over `to`, never written in place:
/// a `to` hard-linked into another build tree (`cp -al` of a target
/// directory) keeps that tree's bytes.
fn copy(from: &Path, to: &Path) {
    let bytes = std::fs::read(from).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    if std::fs::read(to).ok().as_deref() == Some(&bytes[..]) {
        return;
    }
    let tmp = to.with_extension("embed-tmp");
    std::fs::write(&tmp, &bytes).unwrap_or_else(|e| panic!("{}: {e}", tmp.display()));
    std::fs::rename(&tmp, to).unwrap_or_else(|e| panic!("{}: {e}", to.display()));
}
