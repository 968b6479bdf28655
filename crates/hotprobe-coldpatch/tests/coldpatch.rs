//! ColdPatch real binaries compiled at test time; run original and patched
//! and compare their output; strip the patched one and find the sites again.

use std::path::{Path, PathBuf};
use std::process::Command;

use hotprobe_coldpatch::*;

fn tmp(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("coldpatch");
    std::fs::create_dir_all(&d).unwrap();
    d.join(name)
}

fn prog(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(name)
}

fn gcc(args: &[&str]) {
    hotprobe_testkit::run_ok(Command::new("gcc").args(args));
}

fn run(exe: &Path, lib_dir: &Path) -> String {
    let out = Command::new(exe)
        .arg("x")
        .env("LD_LIBRARY_PATH", lib_dir)
        .current_dir(lib_dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "{} failed: {:?}", exe.display(), out);
    String::from_utf8(out.stdout).unwrap()
}

fn hook_calls(exe: &Path) -> usize {
    // Only .text: the PLT stubs themselves jump through the GOT.
    let out = Command::new("objdump")
        .args(["-d", "-j", ".text"])
        .arg(exe)
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter(|l| l.contains('\t') && (l.contains("call") || l.contains("jmp")))
        .filter(|l| l.contains("__cyg_profile") || l.contains("mcount"))
        .count()
}

/// Builds `tag` with `flags`, coldpatches it, checks everything; returns the list.
fn check(tag: &str, flags: &[&str], hooks: Hooks) -> ProbeList {
    let src = prog("prog.c");
    let orig = tmp(&format!("{tag}.orig"));
    let mut args: Vec<String> = flags.iter().map(|s| s.to_string()).collect();
    args.push(src.to_str().unwrap().into());
    match hooks {
        Hooks::Linked => {
            let o = tmp(&format!("{tag}-hooks.o"));
            gcc(&[
                "-O2",
                "-c",
                prog("hooks.c").to_str().unwrap(),
                "-o",
                o.to_str().unwrap(),
            ]);
            args.push(o.to_str().unwrap().into());
        }
        Hooks::Shared => {
            let so = tmp(&format!("lib{tag}hooks.so"));
            gcc(&[
                "-O2",
                "-shared",
                "-fPIC",
                prog("hooks.c").to_str().unwrap(),
                "-o",
                so.to_str().unwrap(),
            ]);
            args.extend([
                "-L".into(),
                tmp("").to_str().unwrap().into(),
                format!("-l{tag}hooks"),
            ]);
        }
        Hooks::Libc => {}
    }
    args.extend(["-o".into(), orig.to_str().unwrap().into()]);
    let a: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    gcc(&a);

    let input = std::fs::read(&orig).unwrap();
    let before = hook_calls(&orig);
    assert!(before > 0, "{tag}: the compiler emitted no hook call?");
    let (patched, list) = coldpatch(&input).unwrap();
    assert_eq!(patched.len(), input.len());
    let out = tmp(&format!("{tag}.patched"));
    std::fs::write(&out, &patched).unwrap();
    std::fs::set_permissions(&out, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(out.with_extension("probes"), list.to_text()).unwrap();

    // Same behaviour, no hook call left, only the listed bytes changed.
    assert_eq!(
        run(&orig, &tmp("")),
        run(&out, &tmp("")),
        "{tag}: output differs"
    );
    assert_eq!(hook_calls(&out), 0, "{tag}: hook calls remain");
    let mut changed = vec![false; input.len()];
    for s in &list.sites {
        for i in 0..s.len as usize {
            changed[s.offset as usize + i] = true;
        }
    }
    for (i, (a, b)) in input.iter().zip(&patched).enumerate() {
        assert!(
            a == b || changed[i],
            "{tag}: byte {i:#x} changed but is not a listed site"
        );
    }
    assert!(
        list.sites.len() >= before,
        "{tag}: {} sites for {before} hook calls",
        list.sites.len()
    );
    assert_eq!(
        ProbeList::parse(&list.to_text()).unwrap(),
        list,
        "round trip"
    );

    // Stripped: still located through the list.
    let stripped = tmp(&format!("{tag}.stripped"));
    let st = Command::new("strip")
        .arg(&out)
        .arg("-o")
        .arg(&stripped)
        .status()
        .unwrap();
    assert!(st.success());
    let sbytes = std::fs::read(&stripped).unwrap();
    for s in &list.sites {
        let b = &sbytes[s.offset as usize..s.offset as usize + s.len as usize];
        assert!(
            b == placeholder::NOP5
                || b == placeholder::NOP6
                || b == placeholder::RET_NOP4
                || b == placeholder::RET_NOP5,
            "{tag}: stripped binary has {b:02x?} at {:#x}",
            s.offset
        );
    }
    assert_eq!(run(&stripped, &tmp("")), run(&orig, &tmp("")));
    if let Some(id) = &list.build_id {
        let sobj = object::File::parse(&*sbytes).unwrap();
        use object::Object;
        assert_eq!(
            sobj.build_id().unwrap(),
            Some(&id[..]),
            "build id survives strip"
        );
    }
    list
}

#[derive(Clone, Copy)]
enum Hooks {
    Linked,
    Shared,
    Libc,
}

fn has(list: &ProbeList, func: &str, kind: SiteKind) -> bool {
    list.sites
        .iter()
        .any(|s| s.function.as_deref() == Some(func) && s.kind == kind)
}

#[test]
fn finstrument_functions_direct_hooks_o2_with_dwarf() {
    let l = check(
        "direct-o2",
        &["-O2", "-g", "-finstrument-functions"],
        Hooks::Linked,
    );
    for f in ["fib", "ackermann", "mean", "main"] {
        assert!(has(&l, f, SiteKind::Entry), "{f} entry: {}", l.to_text());
    }
    assert!(l.sites.iter().any(|s| s.kind == SiteKind::Exit));
    assert!(
        l.sites
            .iter()
            .all(|s| s.location.as_deref().is_some_and(|x| x.contains("prog.c:"))),
        "{}",
        l.to_text()
    );
}

#[test]
fn finstrument_functions_through_plt_and_tail_calls() {
    let l = check("plt-o2", &["-O2", "-finstrument-functions"], Hooks::Shared);
    // gcc -O2 turns report()'s exit hook into a tail jump.
    assert!(
        l.sites.iter().any(|s| s.kind == SiteKind::ExitTail),
        "{}",
        l.to_text()
    );
}

#[test]
fn finstrument_functions_no_plt_got_calls() {
    let l = check(
        "noplt-o2",
        &["-O2", "-fno-plt", "-finstrument-functions"],
        Hooks::Shared,
    );
    assert!(l.sites.iter().any(|s| s.len == 6), "{}", l.to_text());
}

#[test]
fn finstrument_functions_o0_non_pie() {
    let l = check(
        "o0-nopie",
        &["-O0", "-no-pie", "-finstrument-functions"],
        Hooks::Linked,
    );
    assert!(has(&l, "cmp", SiteKind::Entry) && has(&l, "cmp", SiteKind::Exit));
}

#[test]
fn pg_mcount() {
    let l = check("pg", &["-O2", "-pg"], Hooks::Libc);
    assert!(has(&l, "fib", SiteKind::Mcount), "{}", l.to_text());
}

#[test]
fn refuses_binaries_without_hooks_and_garbage() {
    let exe = tmp("plain");
    gcc(&[
        "-O2",
        prog("prog.c").to_str().unwrap(),
        "-o",
        exe.to_str().unwrap(),
    ]);
    assert!(matches!(
        coldpatch(&std::fs::read(&exe).unwrap()),
        Err(ColdpatchError::NothingToPatch)
    ));
    assert!(matches!(
        coldpatch(b"not an elf"),
        Err(ColdpatchError::Elf(_))
    ));
}

#[test]
fn parse_never_panics_on_bad_input() {
    let good = "hotprobe-probes 1\nbuild-id 0a0b\nsite\t0x10\t0x1010\t5\tentry\tf\ta.c:3\n";
    let l = ProbeList::parse(good).unwrap();
    assert_eq!(l.build_id, Some(vec![10, 11]));
    assert_eq!(l.sites[0].kind, SiteKind::Entry);
    for bad in [
        "",
        "hotprobe-probes 2\n",
        "hotprobe-probes 1\n",
        "hotprobe-probes 1\nbuild-id 0\n",
        "hotprobe-probes 1\nbuild-id zz\n",
        "hotprobe-probes 1\nbuild-id é1\n",
        "hotprobe-probes 1\nbuild-id -\nsite\t0x10\n",
        "hotprobe-probes 1\nbuild-id -\nsite\t10\t0x1\t5\tentry\t-\t-\n",
        "hotprobe-probes 1\nbuild-id -\nsite\t0x10\t0x1\t9\tentry\t-\t-\n",
        "hotprobe-probes 1\nbuild-id -\nsite\t0x10\t0x1\t5\tfoo\t-\t-\n",
        "hotprobe-probes 1\nbuild-id -\nsite\t0xffffffffffffffffff\t0x1\t5\tentry\t-\t-\n",
    ] {
        assert!(ProbeList::parse(bad).is_err(), "{bad:?}");
    }
    // Every prefix and byte-flip of a good list parses or errors, never panics.
    for i in 0..good.len() {
        let _ = ProbeList::parse(&good[..i]);
        let mut b = good.as_bytes().to_vec();
        b[i] ^= 0x55;
        let _ = ProbeList::parse(&String::from_utf8_lossy(&b));
    }
}
