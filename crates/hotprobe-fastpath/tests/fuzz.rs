//! Bounded fuzz pass (hotprobe-fuzzcheck): choosing a mechanism from an
//! ELF file and its probe list (`ModuleInfo::from_bytes`, then `plan` for
//! every function under every choice) never panics. The longer run is the
//! cargo-fuzz target `module_info` in `fuzz/` (docs/FUZZING.md), which
//! takes the same inputs (see `tests/fuzz/exercise.rs`).

#[path = "fuzz/exercise.rs"]
mod exercise;

use std::path::{Path, PathBuf};

use hotprobe_fuzzcheck::Fuzz;

fn compile(out: &str, flags: &[&str]) -> Vec<u8> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fastpath-fuzz");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/loop.c");
    let out = hotprobe_testkit::compile("gcc", &src, &dir.join(out), flags, &["-lpthread"]);
    std::fs::read(out).unwrap()
}

#[test]
fn fuzz_module_info() {
    let plain = |elf: Vec<u8>| {
        let mut s = vec![exercise::NO_LIST];
        s.extend(elf);
        s
    };
    let inst = compile("loop-inst", &["-O2", "-finstrument-functions"]);
    let (cold, list) = hotprobe_coldpatch::coldpatch(&inst).unwrap();
    let hostile = |which: u8| {
        let mut s = vec![which];
        s.extend(&cold);
        s
    };
    let seeds = vec![
        plain(compile("loop-plain", &["-O2"])),
        plain(compile(
            "loop-pfe",
            &["-O2", "-fpatchable-function-entry=5"],
        )),
        plain(compile(
            "loop-mcount",
            &[
                "-O2",
                "-fno-pie",
                "-no-pie",
                "-pg",
                "-mfentry",
                "-mnop-mcount",
                "-mrecord-mcount",
            ],
        )),
        exercise::with_list(&list.to_text(), &cold),
        hostile(2),
        hostile(3),
        hostile(4),
    ];
    Fuzz::new("module_info")
        .seeds(seeds)
        .tokens([
            &b"__patchable_function_entries"[..],
            b"__mcount_loc",
            b"\x0f\x1f\x44\x00\x00",
            b"\xf3\x0f\x1e\xfa",
            b"\x90\x90\x90\x90\x90",
            b"\tentry\t",
            b"\texit-tail\t",
        ])
        .iterations(5_000)
        .run(exercise::module_info);
}
