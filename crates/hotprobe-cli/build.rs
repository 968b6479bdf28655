//! Renders the man pages (clap_mangen) and shell completions
//! (clap_complete: bash, zsh, fish) of `hotprobe` from its command line
//! definition, `src/cli.rs`, shared with the binary.
//!
//! Written into `$OUT_DIR/man/man1/*.1` and `$OUT_DIR/completions/`, then
//! copied next to the binary: `target/<profile>/man/man1/hotprobe*.1` and
//! `target/<profile>/completions/{hotprobe.bash,_hotprobe,hotprobe.fish}`.

#[allow(dead_code)]
#[path = "src/cli.rs"]
mod cli;

use clap::CommandFactory;
use clap_complete::Shell;
use std::path::{Path, PathBuf};

fn main() -> std::io::Result<()> {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/cli.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let man = out.join("man/man1");
    let completions = out.join("completions");
    for d in [&man, &completions] {
        if d.exists() {
            std::fs::remove_dir_all(d)?;
        }
        std::fs::create_dir_all(d)?;
    }
    clap_mangen::generate_to(cli::Cli::command(), &man)?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut cli::Cli::command(), "hotprobe", &completions)?;
    }
    // OUT_DIR is <target>/<profile>/build/hotprobe-cli-<hash>/out: the
    // profile's directory, where the binary is, is three levels up.
    // A copy there is a convenience: failing to make it fails nothing.
    let build = out.parent().and_then(Path::parent);
    if let Some(profile) = build
        .filter(|b| b.file_name() == Some("build".as_ref()))
        .and_then(Path::parent)
    {
        for (from, to) in [(&man, "man/man1"), (&completions, "completions")] {
            if let Err(e) = copy_dir(from, &profile.join(to)) {
                println!("cargo:warning=cannot copy {}: {e}", from.display());
            }
        }
    }
    Ok(())
}

/// Copies the files of `from` into `to` (created).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for ent in std::fs::read_dir(from)? {
        let ent = ent?;
        std::fs::copy(ent.path(), to.join(ent.file_name()))?;
    }
    Ok(())
}
