//! Separate debug files where distributions put them: by `.gnu_debuglink`
//! (its CRC checked), in a debuginfod client's cache (by build id), and
//! hidden on request. One test: it sets the process's environment.

mod common;

use common::*;
use hotprobe_symbols::{find_debug_file, DebugFileSource, ElfModule};
use std::path::Path;
use std::process::Command;

const PROG_C: &str = r#"#include <stdio.h>
__attribute__((noinline)) int work(int x) { return x * 3 + 1; }
int main(int argc, char **argv) { (void)argv; printf("%d\n", work(argc)); return 0; }
"#;

fn run(cmd: &str, args: &[&str]) {
    let st = Command::new(cmd).args(args).status().unwrap();
    assert!(st.success(), "{cmd} {args:?}");
}

fn build_id_hex(path: &Path) -> String {
    use object::Object;
    let bytes = std::fs::read(path).unwrap();
    let f = object::File::parse(&*bytes).unwrap();
    f.build_id()
        .unwrap()
        .unwrap()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[test]
fn debug_files_are_found_by_link_and_cache_checked_and_can_be_hidden() {
    let dir = TempDir::new("debugfiles");
    let full = compile(dir.path(), "gcc", "prog.c", PROG_C, "prog", &["-g", "-O1"]);
    let p = |n: &str| dir.path().join(n);
    let (dbg, linked) = (p("prog.debug"), p("linked"));
    run(
        "objcopy",
        &[
            "--only-keep-debug",
            full.to_str().unwrap(),
            dbg.to_str().unwrap(),
        ],
    );
    run(
        "objcopy",
        &[
            "--strip-debug",
            full.to_str().unwrap(),
            linked.to_str().unwrap(),
        ],
    );
    // --add-gnu-debuglink names the file relative to the cwd's basename.
    let st = Command::new("objcopy")
        .current_dir(dir.path())
        .args(["--add-gnu-debuglink=prog.debug", "linked"])
        .status()
        .unwrap();
    assert!(st.success());

    // By the link, next to the file; the module's DWARF comes from it.
    let found = find_debug_file(&linked, &std::fs::read(&linked).unwrap());
    assert_eq!(found, Some((dbg.clone(), DebugFileSource::DebugLink)));
    let m = ElfModule::open(&linked).unwrap();
    assert_eq!(m.debug_file(), Some(dbg.as_path()));
    assert!(m.has_dwarf());

    // A debug file whose CRC is not the link's is not taken.
    let other = compile(dir.path(), "gcc", "prog.c", PROG_C, "other", &["-g", "-O2"]);
    run(
        "objcopy",
        &[
            "--only-keep-debug",
            other.to_str().unwrap(),
            dbg.to_str().unwrap(),
        ],
    );
    assert_eq!(
        find_debug_file(&linked, &std::fs::read(&linked).unwrap()),
        None
    );
    assert!(!ElfModule::open(&linked).unwrap().has_dwarf());

    // In a debuginfod cache, by build id (no link needed).
    let stripped = p("stripped");
    run(
        "objcopy",
        &[
            "--strip-debug",
            full.to_str().unwrap(),
            stripped.to_str().unwrap(),
        ],
    );
    let cache = p("cache");
    let entry = cache.join(build_id_hex(&full));
    std::fs::create_dir_all(&entry).unwrap();
    run(
        "objcopy",
        &[
            "--only-keep-debug",
            full.to_str().unwrap(),
            entry.join("debuginfo").to_str().unwrap(),
        ],
    );
    std::env::set_var("DEBUGINFOD_CACHE_PATH", &cache);
    let found = find_debug_file(&stripped, &std::fs::read(&stripped).unwrap());
    assert_eq!(
        found,
        Some((entry.join("debuginfo"), DebugFileSource::DebuginfodCache))
    );
    assert!(ElfModule::open(&stripped).unwrap().has_dwarf());

    // Hidden: none is looked for.
    std::env::set_var("HOTPROBE_NO_DEBUG_FILES", "1");
    assert_eq!(
        find_debug_file(&stripped, &std::fs::read(&stripped).unwrap()),
        None
    );
    assert!(!ElfModule::open(&stripped).unwrap().has_dwarf());
    std::env::remove_var("HOTPROBE_NO_DEBUG_FILES");
    assert!(ElfModule::open(&stripped).unwrap().has_dwarf());
}
