//! Writes `hotprobe.pc`, a pkg-config file for the build tree, next to the
//! libraries (`target/<profile>/`): `libdir` is that directory (with an
//! rpath, so programs linked against the build tree run without
//! `LD_LIBRARY_PATH`), `includedir` this crate's checked-in `include/`.
//! Use it with `PKG_CONFIG_PATH=target/<profile> pkg-config --cflags --libs
//! hotprobe`.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    // OUT_DIR is target/<profile>/build/<crate>-<hash>/out: the libraries
    // go to target/<profile>. Cargo has no variable for it.
    let Some(libdir) = out.ancestors().nth(3) else {
        println!(
            "cargo:warning=unexpected OUT_DIR {}: no hotprobe.pc",
            out.display()
        );
        return;
    };
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let include = manifest.join("include");
    let version = std::env::var("CARGO_PKG_VERSION").unwrap_or_default();
    let pc = format!(
        "# hotprobe's C API in the build tree (written by crates/hotprobe-capi/build.rs)\n\
         libdir={}\n\
         includedir={}\n\n\
         Name: hotprobe\n\
         Description: Probes on any instruction of a running Linux process or VM guest kernel, handlers in C\n\
         Version: {version}\n\
         Cflags: -I${{includedir}}\n\
         Libs: -L${{libdir}} -Wl,-rpath,${{libdir}} -lhotprobe_c\n\
         Libs.private: -lpthread -ldl -lm\n",
        libdir.display(),
        include.display(),
    );
    let path = libdir.join("hotprobe.pc");
    // Rewritten only when different, so that its mtime means something.
    if std::fs::read_to_string(&path).ok().as_deref() != Some(pc.as_str()) {
        if let Err(e) = std::fs::write(&path, pc) {
            println!("cargo:warning=cannot write {}: {e}", path.display());
        }
    }
}
