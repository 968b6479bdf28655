//! Bounded fuzz passes (hotprobe-fuzzcheck): the probe-list parser and
//! ColdPatch itself never panic on arbitrary input. The longer runs are the
//! cargo-fuzz targets `probelist` and `coldpatch` in `fuzz/`
//! (docs/FUZZING.md).

use std::path::{Path, PathBuf};
use std::process::Command;

use hotprobe_coldpatch::coldpatch;
use hotprobe_fuzzcheck::Fuzz;

#[path = "fuzz/exercise.rs"]
mod exercise;

fn tmp(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("coldpatch-fuzz");
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn prog(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(name)
        .to_string_lossy()
        .into_owned()
}

fn gcc(args: &[&str]) {
    hotprobe_testkit::run_ok(Command::new("gcc").args(args));
}

/// `-finstrument-functions` and `-pg` builds of tests/programs/prog.c:
/// direct, PLT, GOT and mcount hook calls, with and without DWARF (built
/// once for both tests).
fn instrumented_binaries() -> Vec<Vec<u8>> {
    static BUILT: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    BUILT.get_or_init(build).clone()
}

fn build() -> Vec<Vec<u8>> {
    let s = |p: PathBuf| p.to_string_lossy().into_owned();
    let hooks_o = s(tmp("hooks.o"));
    gcc(&["-O2", "-c", &prog("hooks.c"), "-o", &hooks_o]);
    let hooks_so = s(tmp("libfuzzhooks.so"));
    gcc(&["-O2", "-shared", "-fPIC", &prog("hooks.c"), "-o", &hooks_so]);
    let dir = s(tmp(""));
    let src = prog("prog.c");
    let builds: [(&str, Vec<&str>); 4] = [
        (
            "direct",
            vec!["-O2", "-g", "-finstrument-functions", &src, &hooks_o],
        ),
        (
            "plt",
            vec![
                "-O2",
                "-finstrument-functions",
                &src,
                "-L",
                &dir,
                "-lfuzzhooks",
            ],
        ),
        (
            "got",
            vec![
                "-O1",
                "-fno-plt",
                "-finstrument-functions",
                &src,
                "-L",
                &dir,
                "-lfuzzhooks",
            ],
        ),
        ("mcount", vec!["-O0", "-no-pie", "-pg", &src]),
    ];
    builds
        .into_iter()
        .map(|(tag, mut args)| {
            let out = s(tmp(tag));
            args.extend(["-o", &out]);
            gcc(&args);
            std::fs::read(&out).unwrap()
        })
        .collect()
}

#[test]
fn fuzz_coldpatch() {
    Fuzz::new("coldpatch")
        .seeds(instrumented_binaries())
        .tokens([
            &b"__cyg_profile_func_enter"[..],
            b"mcount",
            b"\xe8",
            b"\xe9",
            b"\xff\x15",
        ])
        .iterations(5_000)
        .run(exercise::coldpatch);
}

#[test]
fn fuzz_probelist() {
    let lists: Vec<Vec<u8>> = instrumented_binaries()
        .iter()
        .filter_map(|b| coldpatch(b).ok())
        .map(|(_, l)| l.to_text().into_bytes())
        .collect();
    assert!(!lists.is_empty());
    Fuzz::new("probelist")
        .seeds(lists)
        .seed("hotprobe-probes 1\nbuild-id -\n# comment\n\nsite\t0x1\t0x2\t6\texit-tail\t-\t-\n")
        .tokens([
            "hotprobe-probes 1\n",
            "build-id ",
            "site\t",
            "\t",
            "0x",
            "entry",
            "exit",
            "exit-tail",
            "mcount",
            "-",
            "#",
        ])
        .iterations(20_000)
        .run(exercise::probelist);
}
