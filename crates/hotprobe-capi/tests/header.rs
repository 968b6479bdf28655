//! include/hotprobe.h is what cbindgen makes of src/lib.rs today.
//!
//! The header is checked in (C users and the pkg-config file point at a
//! stable path in the source tree, and building the library never needs
//! cbindgen); this test regenerates it and fails when it differs. With
//! `HOTPROBE_BLESS=1` it rewrites the file instead.

use std::path::Path;

#[test]
fn header_matches_the_source() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let generated = String::from_utf8(generated).expect("UTF-8 header");
    let path = dir.join("include/hotprobe.h");
    if std::env::var("HOTPROBE_BLESS").as_deref() == Ok("1") {
        std::fs::write(&path, &generated).expect("write include/hotprobe.h");
        return;
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/hotprobe.h is stale: regenerate it with \
         HOTPROBE_BLESS=1 cargo test -p hotprobe-capi --test header"
    );
}
