//! Builds hotprobe's QEMU plugin (`hotprobe-qemu-plugin`, a cdylib, release
//! profile) with a nested `cargo build` and leaves it at
//! `$OUT_DIR/libhotprobe_qemu_plugin.so`, where `src/lib.rs` embeds it: a
//! `hotprobe` binary carries its plugin and writes it to a memfd that QEMU
//! loads as `/proc/HOTPROBE_PID/fd/N`.
//!
//! As for the fast path's agent (`hotprobe-fastpath/build.rs`): its own
//! target directory under `OUT_DIR` (the outer build holds the outer one's
//! lock), `--locked --offline` (its only registry dependency, libc, is one
//! of this crate's), the outer build's `TARGET` without the outer flags and
//! clippy's wrappers, the outer jobserver, debug information stripped.
//!
//! `HOTPROBE_EMBED_QEMU_PLUGIN=/path/to/libhotprobe_qemu_plugin.so` embeds
//! a prebuilt library instead.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    let manifest =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let crates = manifest.parent().expect("crates/").to_path_buf();
    let root = crates.parent().expect("workspace root").to_path_buf();
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let dest = out.join("libhotprobe_qemu_plugin.so");

    println!("cargo:rerun-if-env-changed=HOTPROBE_EMBED_QEMU_PLUGIN");
    if let Some(prebuilt) = std::env::var_os("HOTPROBE_EMBED_QEMU_PLUGIN") {
        let prebuilt = PathBuf::from(prebuilt);
        println!("cargo:rerun-if-changed={}", prebuilt.display());
        copy(&prebuilt, &dest);
        return;
    }
    for p in [
        crates.join("hotprobe-qemu-plugin/src"),
        crates.join("hotprobe-qemu-plugin/Cargo.toml"),
        crates.join("hotprobe-abi/src"),
        crates.join("hotprobe-abi/Cargo.toml"),
        root.join("Cargo.toml"),
        root.join("Cargo.lock"),
    ] {
        println!("cargo:rerun-if-changed={}", p.display());
    }

    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let target = std::env::var("TARGET").expect("TARGET");
    let target_dir = out.join("plugin-target");
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&root)
        .args(["build", "--release", "--locked", "--offline", "--lib"])
        .args(["-p", "hotprobe-qemu-plugin", "--target", &target])
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
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("__CARGO") {
            cmd.env_remove(k);
        }
    }
    cmd.stdout(std::io::stderr());
    let st = cmd.status().unwrap_or_else(|e| {
        panic!("cannot run the nested cargo build of hotprobe-qemu-plugin: {e}")
    });
    if !st.success() {
        panic!(
            "the nested `cargo build --release -p hotprobe-qemu-plugin` (target dir {}) failed: \
             {st}; set HOTPROBE_EMBED_QEMU_PLUGIN to a prebuilt libhotprobe_qemu_plugin.so to skip it",
            target_dir.display()
        );
    }
    copy(
        &target_dir
            .join(&target)
            .join("release/libhotprobe_qemu_plugin.so"),
        &dest,
    );
}

/// Copies `from` to `to` unless `to` already holds the same bytes.
fn copy(from: &Path, to: &Path) {
    let bytes = std::fs::read(from).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    if std::fs::read(to).ok().as_deref() == Some(&bytes[..]) {
        return;
    }
    std::fs::write(to, &bytes).unwrap_or_else(|e| panic!("{}: {e}", to.display()));
}
