//! Issue 23: Debian's libc6-dbg gives libc's types. Its detached debug
//! file (found by build id) names `fopen64`'s entry `_IO_new_fopen`, with
//! the parameters `filename` and `mode`: looked up by address.

use hotprobe_dwarf::DebugTypes;
use object::{Object as _, ObjectSymbol as _};
use std::path::PathBuf;

const LIBC: &str = "/lib/x86_64-linux-gnu/libc.so.6";

/// libc6-dbg's file for the installed libc.so.6 (by its build id).
fn libc_debug_file(libc: &object::File<'_>) -> PathBuf {
    let id = libc.build_id().unwrap().expect("libc.so.6 has a build id");
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let p = PathBuf::from(format!(
        "/usr/lib/debug/.build-id/{}/{}.debug",
        &hex[..2],
        &hex[2..]
    ));
    assert!(
        p.exists(),
        "{}: libc6-dbg is not installed (setup.sh installs it)",
        p.display()
    );
    p
}

/// The address of libc's dynamic symbol `name`.
fn address_of(libc: &object::File<'_>, name: &str) -> u64 {
    libc.dynamic_symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("libc.so.6 exports no {name}"))
        .address()
}

#[test]
fn fopen64_and_fclose_by_address_from_libc6_dbg() {
    let bytes = std::fs::read(LIBC).unwrap();
    let libc = object::File::parse(&*bytes).unwrap();
    let types = DebugTypes::load(&libc_debug_file(&libc)).unwrap();
    let fopen = address_of(&libc, "fopen64");
    let sig = types
        .signature(fopen)
        .unwrap()
        .unwrap_or_else(|| panic!("no DWARF function at fopen64's {fopen:#x}"));
    // The DWARF name is glibc's, not the symbol's: found by address.
    assert_eq!(sig.name, "_IO_new_fopen");
    let params: Vec<(String, String)> = sig
        .params
        .iter()
        .map(|p| (p.name.clone(), p.ty.describe()))
        .collect();
    assert_eq!(
        params,
        [
            ("filename".to_string(), "char *".to_string()),
            ("mode".to_string(), "char *".to_string())
        ]
    );
    let fclose = address_of(&libc, "fclose");
    let sig = types.signature(fclose).unwrap().unwrap();
    assert_eq!(sig.name, "_IO_new_fclose");
    assert_eq!(sig.params.len(), 1);
    assert_eq!(sig.params[0].name, "fp");
}
