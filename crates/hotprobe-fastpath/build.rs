//! Builds the agent library (`hotprobe-agent`, a cdylib, release profile)
//! with a nested `cargo build` and leaves it at `$OUT_DIR/libhotprobe_agent.so`,
//! where `src/lib.rs` embeds it (`include_bytes!`): a `hotprobe` binary
//! carries its agent and writes it to a memfd at run time.
//!
//! The nested build:
//! - uses its own target directory under `OUT_DIR` (the outer build holds
//!   the lock of the outer one: sharing it would deadlock), kept between
//!   runs, so a rerun (agent or ABI sources changed) is incremental;
//! - passes `--locked` and `--offline`: by the time a build script runs the
//!   outer cargo has resolved (and, with `--locked`, checked) `Cargo.lock`,
//!   and the agent's only registry dependency, `libc`, is one of this
//!   crate's own, so it is already downloaded;
//! - builds for the outer build's `TARGET`, with the outer flags left out:
//!   `RUSTFLAGS`/`CARGO_ENCODED_RUSTFLAGS` (coverage, sanitizers and the like
//!   do not belong in a library preloaded into other programs, and the
//!   agent's hot path relies on the release codegen), and the wrappers
//!   `cargo clippy` installs (`RUSTC_WORKSPACE_WRAPPER`, `CLIPPY_ARGS`: the
//!   agent is linted as a workspace member of its own);
//! - shares the outer build's jobserver (`CARGO_MAKEFLAGS` is inherited);
//! - strips debug information (≈ 0.9 MB instead of ≈ 5 MB; the symbol
//!   table stays, for the blacklist and for debuggers).
//!
//! `HOTPROBE_EMBED_AGENT=/path/to/libhotprobe_agent.so` embeds a prebuilt
//! library instead (packaging, or a build without cargo at hand).

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let crates = manifest.parent().expect("crates/").to_path_buf();
    let root = crates.parent().expect("workspace root").to_path_buf();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let dest = out.join("libhotprobe_agent.so");

    println!("cargo:rerun-if-env-changed=HOTPROBE_EMBED_AGENT");
    if let Some(prebuilt) = std::env::var_os("HOTPROBE_EMBED_AGENT") {
        let prebuilt = PathBuf::from(prebuilt);
        println!("cargo:rerun-if-changed={}", prebuilt.display());
        copy(&prebuilt, &dest);
        return;
    }
    for p in [
        crates.join("hotprobe-agent/src"),
        crates.join("hotprobe-agent/Cargo.toml"),
        crates.join("hotprobe-abi/src"),
        crates.join("hotprobe-abi/Cargo.toml"),
        // Profiles and the locked libc version.
        root.join("Cargo.toml"),
        root.join("Cargo.lock"),
    ] {
        println!("cargo:rerun-if-changed={}", p.display());
    }

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = std::env::var("TARGET").expect("TARGET");
    let target_dir = out.join("agent-target");
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "--release", "--locked", "--offline", "--lib"])
        .args(["-p", "hotprobe-agent", "--target", &target])
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
    // Cargo-internal variables meant for this build script's own cargo.
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
        .unwrap_or_else(|e| panic!("cannot run the nested cargo build of hotprobe-agent: {e}"));
    if !st.success() {
        panic!(
            "the nested `cargo build --release -p hotprobe-agent` (target dir {}) failed: {st}; \
             set HOTPROBE_EMBED_AGENT to a prebuilt libhotprobe_agent.so to skip it",
            target_dir.display()
        );
    }
    copy(
        &target_dir
            .join(&target)
            .join("release/libhotprobe_agent.so"),
        &dest,
    );
}

/// Copies `from` to `to` unless `to` already holds the same bytes (keeps
/// its mtime, so the embedding crate is not rebuilt for nothing).
fn copy(from: &Path, to: &Path) {
    let bytes = std::fs::read(from).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    if std::fs::read(to).ok().as_deref() == Some(&bytes[..]) {
        return;
    }
    std::fs::write(to, &bytes).unwrap_or_else(|e| panic!("{}: {e}", to.display()));
}
