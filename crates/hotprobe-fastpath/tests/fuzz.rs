//! Bounded fuzz pass (hotprobe-fuzzcheck): choosing a mechanism from an
//! ELF file and its probe list (`ModuleInfo::from_bytes`, then `plan` for
//! every function under every choice) never panics. Same input encoding as
//! the cargo-fuzz target `module_info` in `fuzz/` (docs/FUZZING.md): the
//! first byte picks a probe list, the rest is the ELF file.

use std::path::{Path, PathBuf};
use std::process::Command;

use hotprobe_fastpath::{MechanismChoice, ModuleInfo};
use hotprobe_fuzzcheck::Fuzz;

fn compile(out: &str, flags: &[&str]) -> Vec<u8> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fastpath-fuzz");
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/loop.c");
    let out = dir.join(out);
    let st = Command::new("gcc")
        .args(flags)
        .arg(&src)
        .arg("-o")
        .arg(&out)
        .arg("-lpthread")
        .status()
        .unwrap();
    assert!(st.success(), "gcc {flags:?} failed");
    std::fs::read(out).unwrap()
}

/// Probe lists the first input byte picks from (`None`: no list). A list
/// does not have to fit the ELF file it comes with: the hostile ones name
/// real functions at impossible addresses.
fn probe_lists(real: String) -> Vec<Option<String>> {
    let hostile = |vaddr: &str| {
        format!(
            "hotprobe-probes 1\nbuild-id -\n\
             site\t0x0\t{vaddr}\t5\tentry\tmain\t-\n\
             site\t0xffffffffffffffff\t{vaddr}\t6\texit\tmain\t-\n\
             site\t0x10\t{vaddr}\t5\tmcount\ttiny\t-\n\
             site\t0x20\t{vaddr}\t5\texit-tail\t-\t-\n\
             site\t0x30\t{vaddr}\t5\tentry\tnot_in_symtab\t-\n"
        )
    };
    vec![
        None,
        Some(real),
        Some(hostile("0x0")),
        Some(hostile("0xffffffffffffffff")),
        Some(hostile("0xfffffffffffffffc")),
    ]
}

fn exercise(lists: &[Option<String>], data: &[u8]) -> bool {
    let Some((&which, elf)) = data.split_first() else {
        return false;
    };
    let list = lists[usize::from(which) % lists.len()].as_deref();
    let Ok(m) = ModuleInfo::from_bytes(Path::new("fuzz.elf"), elf.to_vec(), list) else {
        return false;
    };
    let _ = (m.path(), m.has_probe_list());
    let fs = m.functions();
    for f in fs.iter().take(16).chain(fs.iter().rev().take(16)) {
        for choice in [
            MechanismChoice::Auto,
            MechanismChoice::Patch,
            MechanismChoice::Jump,
            MechanismChoice::Trap,
        ] {
            let _ = m.plan(f, choice);
        }
        let _ = m.code(f.addr, f.size);
        let _ = m.function(&f.name);
    }
    for (addr, len) in [(u64::MAX, 5), (0, u64::MAX), (u64::MAX - 3, 5)] {
        let _ = m.code(addr, len);
    }
    true
}

#[test]
fn fuzz_module_info() {
    let inst = compile("loop-inst", &["-O2", "-finstrument-functions"]);
    let (cold, list) = hotprobe_coldpatch::coldpatch(&inst).unwrap();
    let lists = probe_lists(list.to_text());
    let elves = [
        (0u8, compile("loop-plain", &["-O2"])),
        (
            0,
            compile("loop-pfe", &["-O2", "-fpatchable-function-entry=5"]),
        ),
        (
            0,
            compile(
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
            ),
        ),
        (1, cold.clone()),
        (2, cold.clone()),
        (3, cold),
    ];
    let seeds = elves.into_iter().map(|(which, elf)| {
        let mut s = vec![which];
        s.extend(elf);
        s
    });
    Fuzz::new("module_info")
        .seeds(seeds)
        .tokens([
            &b"__patchable_function_entries"[..],
            b"__mcount_loc",
            b"\x0f\x1f\x44\x00\x00",
            b"\xf3\x0f\x1e\xfa",
            b"\x90\x90\x90\x90\x90",
        ])
        .iterations(5_000)
        .run(|data| exercise(&lists, data));
}
