//! Typed values of parameters DWARF gives as constants or computes
//! (issue 22): `trace -a` of tests/programs/consts.rs (rustc -O1, -O2)
//! and consts.c (gcc -O1, -O2) prints what each call logged. Each test
//! first checks, with llvm-dwarfdump, that the build really has the DWARF
//! forms it is about (DW_AT_const_value, DW_OP_stack_value, DW_CC_nocall),
//! so that it cannot silently stop covering them.

mod common;

use common::{hotprobe, text};
use std::path::{Path, PathBuf};
use std::process::Command;

fn tmp() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("const-values");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(name)
}

fn rust_program(opt: &str) -> PathBuf {
    let out = tmp().join(format!("consts-rs-O{opt}"));
    let level = format!("opt-level={opt}");
    hotprobe_testkit::compile(
        "rustc",
        &source("consts.rs"),
        &out,
        &["-C", &level, "-g"],
        &[],
    )
}

fn c_program(opt: &str) -> PathBuf {
    let out = tmp().join(format!("consts-c-O{opt}"));
    common::gcc(&source("consts.c"), &out, &[&format!("-O{opt}")])
}

/// The DIEs (`DW_TAG_subprogram` blocks of `llvm-dwarfdump --debug-info`)
/// of `prog` whose text contains `needle`, joined.
fn dies_with(prog: &Path, needle: &str) -> String {
    let o = Command::new("llvm-dwarfdump")
        .arg("--debug-info")
        .arg(prog)
        .output()
        .expect("llvm-dwarfdump runs (the test checks the DWARF with it)");
    assert!(o.status.success(), "{}", text(&o.stderr));
    text(&o.stdout)
        .split("DW_TAG_subprogram")
        .filter(|d| d.contains(needle))
        .collect::<Vec<_>>()
        .join("\n----\n")
}

/// The program's log: `name(args)` (and ` = r` when it logs it), in order.
fn logged(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("CALL "))
        .map(str::to_string)
        .collect()
}

/// The calls `trace` printed, `name(args) = ret` (`with_ret`) or
/// `name(args)`, names without Rust's path and hash or gcc's clone suffix.
fn shown(stdout: &str, with_ret: bool) -> Vec<String> {
    let mut calls = Vec::new();
    let mut open: Vec<String> = Vec::new();
    for l in stdout.lines() {
        let Some((_, body)) = l.split_once("] | ") else {
            continue;
        };
        let body = body.trim_start();
        if let Some(call) = body.strip_suffix(" {") {
            let (name, args) = call.split_once('(').unwrap();
            // consts::add::h0123… → add; add.constprop.0 → add.
            let name = name.split("::h").next().unwrap();
            let name = name.rsplit("::").next().unwrap();
            let name = name.split('.').next().unwrap();
            open.push(format!("{name}({args}"));
        } else if body.starts_with('}') {
            let call = open.pop().expect("an exit after its entry");
            let ret = body.split_once("*/ = ").map(|x| x.1).unwrap_or("");
            calls.push(if with_ret {
                format!("{call} = {ret}")
            } else {
                call
            });
        }
    }
    calls
}

fn trace_a(prog: &Path, specs: &[&str]) -> (String, String) {
    let mut args = vec!["trace", "-a"];
    args.extend(specs);
    args.extend(["--", prog.to_str().unwrap()]);
    let out = hotprobe(&args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    (stdout, stderr)
}

fn rust(opt: &str) {
    let prog = rust_program(opt);
    // The forms this is about, in this very build.
    let add = dies_with(&prog, "_ZN6consts3add");
    assert!(
        add.contains("DW_CC_nocall")
            && add.contains("DW_AT_const_value\t(21)")
            && add.contains("DW_OP_lit1, DW_OP_stack_value"),
        "-O{opt}: add's DWARF:\n{add}"
    );
    let mul = dies_with(&prog, "_ZN6consts3mul");
    assert!(
        mul.contains("DW_AT_const_value\t(3)") && mul.contains("DW_OP_reg5 RDI"),
        "-O{opt}: mul's DWARF:\n{mul}"
    );
    let pick = dies_with(&prog, "_ZN6consts4pick");
    assert!(
        pick.contains("DW_AT_const_value\t(21)")
            && pick.contains("DW_OP_breg5 RDI+0")
            && pick.contains("DW_OP_stack_value"),
        "-O{opt}: pick's DWARF:\n{pick}"
    );
    let (stdout, stderr) = trace_a(&prog, &["consts::add", "consts::mul", "consts::pick"]);
    let theirs = logged(&stderr);
    assert_eq!(
        theirs,
        [
            "add(21, true)",
            "add(21, true)",
            "mul(7, 3)",
            "mul(10, 3)",
            "pick(21, true)",
            "pick(21, false)",
        ],
        "{stderr}"
    );
    assert_eq!(shown(&stdout, false), theirs, "-O{opt}:\n{stdout}");
    // DW_CC_nocall: LLVM may drop the return value too (add's callers
    // know it is 22, and add returns nothing in rax): never a number.
    let rets: Vec<String> = shown(&stdout, true)
        .iter()
        .map(|c| c.split_once(" = ").unwrap().1.to_string())
        .collect();
    assert_eq!(rets, vec!["<optimised out>"; 6], "-O{opt}:\n{stdout}");
}

#[test]
fn rust_o1_constant_and_computed_parameters() {
    rust("1");
}

#[test]
fn rust_o2_constant_and_computed_parameters() {
    rust("2");
}

fn c(opt: &str) {
    let prog = c_program(opt);
    let consts = dies_with(&prog, "DW_AT_const_value");
    if opt == "2" {
        // add.constprop.0 and scale.constprop.0: data forms for the int
        // and the _Bool, a block for the double 2.5.
        for form in [
            "DW_AT_const_value\t(0x15)",
            "DW_AT_const_value\t(0x01)",
            "DW_AT_const_value\t(<0x08> 00 00 00 00 00 00 04 40 )",
        ] {
            assert!(consts.contains(form), "-O2: no {form} in\n{consts}");
        }
    } else {
        // gcc -O1 makes no clones: no parameter is a constant (the
        // values are in the registers the ABI says).
        let const_params = consts
            .split("\n\n")
            .filter(|die| {
                die.contains("DW_TAG_formal_parameter") && die.contains("DW_AT_const_value")
            })
            .count();
        assert_eq!(const_params, 0, "-O1: {consts}");
    }
    let (stdout, stderr) = trace_a(&prog, &["add*", "scale*", "off"]);
    let theirs = logged(&stderr);
    assert_eq!(
        theirs,
        [
            "add(21, true) = 22",
            "add(21, true) = 22",
            "scale(2.5, 4) = 10",
            "scale(2.5, 6) = 15",
            "off(11, 12) = -1",
        ],
        "{stderr}"
    );
    assert_eq!(shown(&stdout, true), theirs, "-O{opt}:\n{stdout}");
    if opt == "2" {
        assert!(
            stdout.contains("add.constprop.0(21, true) {")
                && stdout.contains("scale.constprop.0(2.5, 4) {"),
            "{stdout}"
        );
    }
}

#[test]
fn c_o1_parameters() {
    c("1");
}

#[test]
fn c_o2_clones_constant_parameters() {
    c("2");
}
