//! Typed arguments and return values from DWARF (`trace -a`, `record -a`
//! and `replay`, `func(a, b)` and `'func p->len name:string'` specs) on
//! tests/programs/typed.c built with -O0 and -O2: each call hotprobe shows
//! equals the line the program logged for it ("CALL name(args) = ret"),
//! except parameters gcc's clones dropped, shown `<optimised out>` (never
//! another value).

mod common;

use common::{gcc_with, hotprobe, text};
use std::path::{Path, PathBuf};

const FUNCS: &[&str] = &[
    "greet", "scale", "total", "pick", "mix", "half", "mul", "quiet",
];

fn tmp() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("typed-args");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn program(opt: &str, debug: bool) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/typed.c");
    let tag = if debug { "g" } else { "nog" };
    let out = tmp().join(format!("typed{opt}-{tag}"));
    // gcc() adds -g before the source: -g0 after it takes DWARF out.
    let after: &[&str] = if debug { &[] } else { &["-g0"] };
    gcc_with(&src, &out, &[opt], after)
}

/// The program's own log: `name(args) = ret` per call, in order.
fn logged(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("CALL "))
        .map(str::to_string)
        .collect()
}

/// gcc's clone suffixes off: `mul.constprop.0` → `mul`.
fn base(name: &str) -> &str {
    name.split('.').next().unwrap()
}

/// The calls of `trace` or `replay` output as `name(args) = ret`, in the
/// order they returned, for the functions of [`FUNCS`].
fn shown(out: &str) -> Vec<String> {
    shown_of(out, FUNCS)
}

/// [`shown`] for the functions `funcs`.
fn shown_of(out: &str, funcs: &[&str]) -> Vec<String> {
    let mut calls = Vec::new();
    // Open calls per thread (`[ TID] | `): threads interleave.
    let mut opens: std::collections::HashMap<String, Vec<String>> = Default::default();
    for l in out.lines() {
        let Some((head, body)) = l.split_once("] | ") else {
            continue;
        };
        let tid = head.rsplit_once('[').map_or("", |(_, t)| t.trim());
        let open = opens.entry(tid.to_string()).or_default();
        let body = body.trim_start();
        let (call, ret) = if let Some(e) = body.strip_suffix(" {") {
            open.push(e.to_string());
            continue;
        } else if let Some(rest) = body.strip_prefix('}') {
            // trace: `} /* f */ = R`; replay: `} = R; /* f */`.
            let ret = match rest.split_once("*/ = ") {
                Some((_, r)) => Some(r.to_string()),
                None => rest
                    .strip_prefix(" = ")
                    .map(|r| r.split_once("; /*").unwrap().0.to_string()),
            };
            (open.pop().expect("an exit without its entry"), ret)
        } else if let Some(leaf) = body.strip_suffix(';') {
            match leaf.split_once(") = ") {
                Some((c, r)) => (format!("{c})"), Some(r.to_string())),
                None => (leaf.to_string(), None),
            }
        } else {
            continue;
        };
        let (name, args) = call.split_once('(').unwrap();
        if !funcs.contains(&base(name)) {
            continue;
        }
        let ret = ret.map_or(String::new(), |r| format!(" = {r}"));
        calls.push(format!("{}({args}{ret}", base(name)));
    }
    calls
}

/// `ours` shows `theirs`: equal, or (`optimised`) with `<optimised out>`
/// where the program had a value.
fn same(ours: &str, theirs: &str, optimised: bool) -> bool {
    if ours == theirs {
        return true;
    }
    let split = |s: &str| -> Option<(String, Vec<String>, String)> {
        let (name, rest) = s.split_once('(')?;
        let (args, ret) = rest.rsplit_once(')')?;
        Some((
            name.into(),
            args.split(", ").map(str::to_string).collect(),
            ret.into(),
        ))
    };
    match (optimised, split(ours), split(theirs)) {
        (true, Some((n1, a1, r1)), Some((n2, a2, r2))) => {
            n1 == n2
                && r1 == r2
                && a1.len() == a2.len()
                && a1
                    .iter()
                    .zip(&a2)
                    .all(|(x, y)| x == y || x == "<optimised out>")
        }
        _ => false,
    }
}

fn compare(ours: &[String], theirs: &[String], optimised: bool, what: &str) {
    assert_eq!(
        ours.len(),
        theirs.len(),
        "{what}: {} calls shown, the program made {}:\n{ours:#?}\n{theirs:#?}",
        ours.len(),
        theirs.len()
    );
    for (o, t) in ours.iter().zip(theirs) {
        assert!(
            same(o, t, optimised),
            "{what}: hotprobe shows {o:?}, the program logged {t:?}"
        );
    }
    let dropped = ours
        .iter()
        .filter(|o| o.contains("<optimised out>"))
        .count();
    if optimised {
        // gcc -O2 makes quiet() a clone without `unused`: shown as such.
        assert!(
            ours.iter().any(|o| o == "quiet(10, <optimised out>) = 5"),
            "{what}: {ours:#?}"
        );
    } else {
        assert_eq!(dropped, 0, "{what}: nothing is optimised out at -O0");
    }
}

fn trace_a(opt: &str) {
    let prog = program(opt, true);
    let specs: Vec<String> = FUNCS.iter().map(|f| format!("{f}*")).collect();
    let mut args = vec!["trace", "-a", "--summary"];
    args.extend(specs.iter().map(String::as_str));
    args.extend(["--", prog.to_str().unwrap()]);
    let out = hotprobe(&args);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let theirs = logged(&stderr);
    assert_eq!(theirs.len(), 14, "{stderr}");
    compare(
        &shown(&stdout),
        &theirs,
        opt == "-O2",
        &format!("trace -a {opt}"),
    );
    // Strings (an argument, a return value) are copied in the target, on
    // patch or jump (issue 23); values in integer registers come with the
    // recorded registers, and
    // floats and doubles with the xmm registers the fast path's record
    // stubs and trampolines store (its xmm layout), on whatever mechanism
    // fits: patch or jump for these.
    let row = |f: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(&format!("{f} ")) || l.starts_with(&format!("{f}.")))
            .unwrap_or_else(|| panic!("no row for {f}: {stdout}"))
            .to_string()
    };
    for f in ["greet", "pick"] {
        let r = row(f);
        assert!(
            (r.contains(" patch") || r.contains(" jump"))
                && r.contains("typed values copied in the target")
                && !r.contains("trap"),
            "{r}"
        );
    }
    for f in ["scale", "mix"] {
        let r = row(f);
        assert!(
            (r.contains(" patch") || r.contains(" jump"))
                && r.contains("float/double values from xmm registers")
                && !r.contains("trap"),
            "{r}"
        );
    }
    for f in ["total", "mul"] {
        let r = row(f);
        assert!(!r.contains("typed values read at the hit"), "{r}");
    }
}

#[test]
fn trace_a_o0_prints_what_the_program_printed() {
    trace_a("-O0");
}

#[test]
fn trace_a_o2_prints_what_the_program_printed() {
    trace_a("-O2");
}

fn record_a(opt: &str) {
    let prog = program(opt, true);
    let dir = tmp().join(format!("trace{opt}"));
    let _ = std::fs::remove_dir_all(&dir);
    let out = hotprobe(&[
        "record",
        "-a",
        "-o",
        dir.to_str().unwrap(),
        "--",
        prog.to_str().unwrap(),
    ]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let theirs = logged(&stderr);
    assert_eq!(theirs.len(), 14, "{stderr}");
    // The trace carries the types and the captured values (strings
    // included): replay prints them after the program is gone.
    for f in ["types.tsv", "info.json"] {
        assert!(dir.join(f).exists(), "{f} in {}", dir.display());
    }
    let info = std::fs::read_to_string(dir.join("info.json")).unwrap();
    // Typed values came with format version 2; the trace is written at
    // the current version.
    assert!(
        info.contains(&format!("\"version\": {}", hotprobe_trace::FORMAT_VERSION)),
        "{info}"
    );
    let replay = hotprobe(&["replay", "--no-pager", dir.to_str().unwrap()]);
    let stdout = text(&replay.stdout);
    assert!(replay.status.success(), "{stdout}{}", text(&replay.stderr));
    compare(
        &shown(&stdout),
        &theirs,
        opt == "-O2",
        &format!("record -a {opt} + replay"),
    );
    // Chrome JSON carries the typed values as text.
    let json = dir.join("t.json");
    let out = hotprobe(&[
        "export",
        dir.to_str().unwrap(),
        "--format",
        "chrome",
        "-o",
        json.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let json = std::fs::read_to_string(json).unwrap();
    assert!(
        json.contains(r#"["\"world\"","0"]"#) && json.contains(r#""retval":"4.75""#),
        "{json}"
    );
    // main is recorded too, typed: main(1, 0x…) = 0.
    assert!(
        stdout.contains("main(1, 0x") && stdout.contains("} = 0; /* main */"),
        "{stdout}"
    );
}

#[test]
fn record_a_o0_and_replay_print_what_the_program_printed() {
    record_a("-O0");
}

#[test]
fn record_a_o2_and_replay_print_what_the_program_printed() {
    record_a("-O2");
}

#[test]
fn named_arguments_fields_and_strings() {
    for opt in ["-O0", "-O2"] {
        let prog = program(opt, true);
        let out = hotprobe(&[
            "trace",
            "total(b->len, b->name, b->id, extra)",
            "greet who:string",
            "scale(f, x)",
            "--",
            prog.to_str().unwrap(),
        ]);
        let stdout = text(&out.stdout);
        assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
        let entries: Vec<&str> = stdout
            .lines()
            .filter_map(|l| l.split_once("] | ").map(|x| x.1))
            .filter(|b| b.ends_with('{'))
            .collect();
        assert_eq!(
            entries,
            [
                "greet(who=\"world\") {",
                "greet(who=\"hotprobe\") {",
                "scale(f=0.25, x=1.5) {",
                "scale(f=1, x=-2.5) {",
                "total(b->len=41, b->name=\"bee\", b->id=7, extra=2) {",
                "total(b->len=41, b->name=\"bee\", b->id=7, extra=18446744073709551573) {",
            ],
            "{opt}: {stdout}"
        );
    }
}

#[test]
fn a_missing_parameter_is_an_error_listing_the_parameters() {
    let prog = program("-O0", true);
    let out = hotprobe(&["trace", "greet(whom)", "--", prog.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("greet has no parameter whom; its parameters: who (char *), n (int32)"),
        "{stderr}"
    );
    assert!(
        !stderr.contains("CALL "),
        "the program must not have run: {stderr}"
    );
    let out = hotprobe(&["trace", "total(b->size)", "--", prog.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("struct buf has no member size; its members: name, len, id"),
        "{stderr}"
    );
}

#[test]
fn without_dwarf_args_stay_raw_registers() {
    let prog = program("-O0", false);
    // --args N: registers as before (the string's address, not its text).
    let out = hotprobe(&[
        "trace",
        "--args",
        "2",
        "greet",
        "--",
        prog.to_str().unwrap(),
    ]);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let first = stdout.lines().find(|l| l.contains("greet(")).unwrap();
    assert!(
        first.contains("| greet(0x") && first.ends_with(", 0) {"),
        "{stdout}"
    );
    // Names need DWARF: a clear error.
    let out = hotprobe(&["trace", "greet(who)", "--", prog.to_str().unwrap()]);
    let stderr = text(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("greet: no DWARF for it"), "{stderr}");
    // -a: no type information, so the raw registers (issue 23), said once:
    // all six argument registers (how many it takes is unknown) and the
    // return value, on a linked program as on a library loaded later
    // (pending_typed.rs).
    let out = hotprobe(&["trace", "-a", "greet", "--", prog.to_str().unwrap()]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stderr.matches("no DWARF for greet").count(), 1, "{stderr}");
    assert!(
        stderr.contains(
            "hotprobe: no DWARF for greet (build with -g): shown with its raw argument \
             registers and return value"
        ),
        "{stderr}"
    );
    assert_raw_greets(&raw_calls(&stdout, "greet"), &stdout);
    // record -a keeps the same registers, replay prints them.
    let dir = tmp().join("raw-greet.trace");
    let _ = std::fs::remove_dir_all(&dir);
    let out = hotprobe(&[
        "record",
        "-a",
        "-o",
        dir.to_str().unwrap(),
        "greet",
        "--",
        prog.to_str().unwrap(),
    ]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "hotprobe: no DWARF for greet (build with -g): recorded with its raw argument \
             registers and return value"
        ),
        "{stderr}"
    );
    let out = hotprobe(&["replay", dir.to_str().unwrap()]);
    let replayed = text(&out.stdout);
    assert!(out.status.success(), "{replayed}");
    assert_raw_greets(&raw_calls(&replayed, "greet"), &replayed);
}

/// A register value as `trace` (decimal when small) or `replay` (hex
/// above 2^31) prints it.
fn register(v: &str) -> u64 {
    match v.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(h, 16).unwrap(),
        None => v.parse::<i64>().unwrap() as u64,
    }
}

/// The raw calls of `name` in a `trace` (`name(ARGS) {` … `} /* name */
/// = RET`) or `replay` (`name(ARGS) = RET;`) tree: (registers, return).
fn raw_calls(out: &str, name: &str) -> Vec<(Vec<u64>, u64)> {
    let mut calls = Vec::new();
    let mut open = None;
    for l in out.lines() {
        let Some((_, body)) = l.split_once("] | ") else {
            continue;
        };
        if let Some(rest) = body.trim().strip_prefix(&format!("{name}(")) {
            let (args, after) = rest.split_once(')').unwrap();
            let regs: Vec<u64> = args.split(", ").map(register).collect();
            match after.trim().strip_prefix("= ") {
                Some(r) => calls.push((regs, register(r.trim_end_matches(';')))),
                None => open = Some(regs),
            }
        } else if let Some(r) = body.trim().strip_prefix(&format!("}} /* {name} */ = ")) {
            calls.push((open.take().unwrap(), register(r)));
        }
    }
    calls
}

/// typed.c's two greet calls, untyped: `greet("world", 0)` and
/// `greet("hotprobe", -3)`, each returning 5 (as the program logs). The
/// strings' addresses in rdi (in the program's image), n in esi (-3 with
/// the register's upper half zero, as gcc -O0 loads an int).
fn assert_raw_greets(calls: &[(Vec<u64>, u64)], out: &str) {
    assert_eq!(calls.len(), 2, "{out}");
    for (regs, ret) in calls {
        assert_eq!(regs.len(), 6, "{out}");
        assert!(regs[0] > 0x1000, "a string's address: {out}");
        assert_eq!(*ret, 5, "{out}");
    }
    assert_eq!(calls[0].0[1], 0, "{out}");
    assert_eq!(calls[1].0[1], u64::from(-3i32 as u32), "{out}");
    // "world" and "hotprobe" are 6 bytes apart in .rodata.
    assert_eq!(calls[1].0[0] - calls[0].0[0], 6, "{out}");
}

#[test]
fn count_conditions_name_parameters() {
    for opt in ["-O0", "-O2"] {
        let prog = program(opt, true);
        let out = hotprobe(&[
            "count",
            // int -3 < 0 (its register's upper half is not its sign), an
            // unsigned long above 2^63 > 100, an enum (BLUE = 6), a clone's
            // register at -O2.
            "greet if n < 0",
            "total if extra > 100",
            "pick if c == 6 && v > 0",
            "mul* if a == 5",
            "--",
            prog.to_str().unwrap(),
        ]);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{stdout}{stderr}");
        let t = common::CountTable::parse(&stdout, &stderr);
        for f in ["greet", "total", "pick"] {
            assert_eq!(t.hits(f), 1, "{opt} {f}: {stdout}");
        }
        let mul = if opt == "-O2" {
            "mul.constprop.0"
        } else {
            "mul"
        };
        assert_eq!(t.hits(mul), 1, "{opt}: {stdout}");
    }
    let prog = program("-O0", true);
    for (spec, says) in [
        (
            "greet if nn < 0",
            "greet has no parameter nn; its parameters: who, n",
        ),
        ("scale if x > 1", "`x`: not in an integer register (double)"),
    ] {
        let out = hotprobe(&["count", spec, "--", prog.to_str().unwrap()]);
        let stderr = text(&out.stderr);
        assert!(!out.status.success() && stderr.contains(says), "{stderr}");
    }
}

/// Floats and doubles on 4 threads (tests/programs/typed_threads.c), with
/// `record -a` and with `trace -a`: every function is on the fast path
/// (no trap at all), and every call shows the values the program logged.
fn floats_on_four_threads(opt: &str) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/typed_threads.c");
    let prog = gcc_with(
        &src,
        &tmp().join(format!("typed_threads{opt}")),
        &[opt],
        &[],
    );
    let sorted = |mut v: Vec<String>| {
        v.sort();
        v
    };
    let dir = tmp().join(format!("threads{opt}"));
    let _ = std::fs::remove_dir_all(&dir);
    let out = hotprobe(&[
        "record",
        "-a",
        "-o",
        dir.to_str().unwrap(),
        "--",
        prog.to_str().unwrap(),
    ]);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let theirs = sorted(logged(&stderr));
    assert_eq!(theirs.len(), 800, "{stderr}");
    // No function went to the trap: the summary counts none.
    let probes = stderr
        .lines()
        .find(|l| l.trim_start().starts_with("probes:"))
        .unwrap_or_else(|| panic!("no probes line: {stderr}"));
    assert!(!probes.contains("trap"), "{probes}");
    assert!(!stderr.contains("recorded through a trap"), "{stderr}");
    let replay = hotprobe(&["replay", "--no-pager", dir.to_str().unwrap()]);
    let stdout = text(&replay.stdout);
    assert!(replay.status.success(), "{}", text(&replay.stderr));
    let ours = sorted(shown_of(&stdout, &["lerp", "area"]));
    assert_eq!(ours, theirs, "record -a {opt} + replay");

    let out = hotprobe(&[
        "trace",
        "-a",
        "--summary",
        "lerp",
        "area",
        "--",
        prog.to_str().unwrap(),
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let theirs = sorted(logged(&stderr));
    assert_eq!(theirs.len(), 800, "{stderr}");
    let ours = sorted(shown_of(&stdout, &["lerp", "area"]));
    assert_eq!(ours, theirs, "trace -a {opt}");
    for f in ["lerp", "area"] {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("{f} ")))
            .unwrap_or_else(|| panic!("no row for {f}: {stdout}"));
        assert!(
            (row.contains(" patch") || row.contains(" jump"))
                && row.contains("float/double values from xmm registers")
                && !row.contains("trap"),
            "{row}"
        );
    }
}

#[test]
fn floats_on_four_threads_o0() {
    floats_on_four_threads("-O0");
}

#[test]
fn floats_on_four_threads_o2() {
    floats_on_four_threads("-O2");
}

/// A coldpatched `-finstrument-functions` build: its placeholders run
/// after the prologue and its exit placeholders before the return value
/// is in xmm0, so the float functions are typed at a jump on their entry
/// (xmm registers on the fast path), with that reason in the summary, and
/// values as logged (before: through the trap).
#[test]
fn floats_at_coldpatched_functions_are_read_at_a_jump_on_their_entry() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/typed_threads.c");
    let inst = gcc_with(
        &src,
        &tmp().join("typed_threads-inst"),
        &["-O0", "-finstrument-functions"],
        &[],
    );
    let cold = tmp().join("typed_threads-cold");
    let out = hotprobe(&[
        "coldpatch",
        inst.to_str().unwrap(),
        "-o",
        cold.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = hotprobe(&[
        "trace",
        "-a",
        "--summary",
        "lerp",
        "area",
        "--",
        cold.to_str().unwrap(),
    ]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let mut theirs = logged(&stderr);
    theirs.sort();
    assert_eq!(theirs.len(), 800, "{stderr}");
    let mut ours = shown_of(&stdout, &["lerp", "area"]);
    ours.sort();
    assert_eq!(ours, theirs);
    for f in ["lerp", "area"] {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(&format!("{f} ")))
            .unwrap_or_else(|| panic!("no row for {f}: {stdout}"));
        assert!(
            row.contains(" jump ")
                && row.contains("not the function's at a coldpatched -finstrument-functions")
                && row.contains("float/double values from xmm registers"),
            "{row}"
        );
    }
}

/// libc_typed.c, built without -g.
fn libc_program() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/libc_typed.c");
    let out = tmp().join("libc_typed");
    hotprobe_testkit::compile("gcc", &src, &out, &["-O1"], &[])
}

/// libc6-dbg's file for the libc.so.6 the programs load (by its build id).
fn libc_debug_file() -> String {
    use object::Object as _;
    let bytes = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
    let libc = object::File::parse(&*bytes).unwrap();
    let id = libc.build_id().unwrap().expect("libc.so.6 has a build id");
    let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
    let path = format!("/usr/lib/debug/.build-id/{}/{}.debug", &hex[..2], &hex[2..]);
    assert!(
        Path::new(&path).exists(),
        "{path}: libc6-dbg is not installed (setup.sh installs it)"
    );
    path
}

/// The call lines of a `trace` tree (`name(args) {`, `} /* name */ = r`),
/// without the duration and thread columns, the pointer `ptr` (a returned
/// FILE *) written `PTR`.
fn tree_lines(out: &str) -> Vec<String> {
    let lines: Vec<&str> = out
        .lines()
        .filter_map(|l| Some(l.split_once("] | ")?.1))
        .collect();
    let ptr = lines
        .iter()
        .find_map(|l| l.strip_prefix("} /* fopen64 */ = "))
        .map(str::to_string);
    lines
        .iter()
        .map(|l| match &ptr {
            Some(p) => l.replace(p.as_str(), "PTR"),
            None => l.to_string(),
        })
        .collect()
}

/// Issue 23: typed values of libc from where Debian puts its debug
/// information (libc6-dbg, found by build id: `fopen64`'s DWARF entry is
/// `_IO_new_fopen`, and `fclose`'s `_IO_new_fclose` is in two pieces,
/// found by address), and from the prototype table when debug files are
/// hidden. `-a` prints the same values from either; which one typed them
/// is told on stderr, and what only DWARF has (the parameter names
/// `filename` and `fp`, a field of the FILE through `fp`) works with the
/// debug file only.
#[test]
fn libc_values_from_its_debug_package_and_from_the_prototype_table() {
    let bin = libc_program();
    let b = bin.to_str().unwrap();
    let debug_file = libc_debug_file();
    let run = |specs: &[&str], hidden: bool| {
        let mut c = std::process::Command::new(common::HOTPROBE);
        c.arg("trace").args(specs).args(["--", b]);
        if hidden {
            c.env("HOTPROBE_NO_DEBUG_FILES", "1");
        }
        let out = c.output().unwrap();
        (out.status.success(), text(&out.stdout), text(&out.stderr))
    };
    let every = [
        "-a",
        "libc:fopen64",
        "libc:fclose",
        "libc:write(fd, nbytes)",
    ];
    // The program's own line on stderr (written through libc's write).
    let program_line = |stderr: &str| {
        let l = stderr
            .lines()
            .find(|l| l.starts_with("fopen64(\"/etc/hostname\", \"rb\") fileno "))
            .unwrap_or_else(|| panic!("the program's line: {stderr}"));
        l.len() + 1
    };
    for hidden in [false, true] {
        let (ok, stdout, stderr) = run(&every, hidden);
        assert!(ok, "hidden {hidden}: {stderr}");
        assert!(stdout.contains("typed\n"), "{stdout}");
        let n = program_line(&stderr);
        let want = [
            "fopen64(\"/etc/hostname\", \"rb\") {".to_string(),
            "} /* fopen64 */ = PTR".into(),
            "fclose(PTR) {".into(),
            "} /* fclose */ = 0".into(),
            "write(fd=1, nbytes=6) {".into(),
            "} /* write */ = 6".into(),
            format!("write(fd=2, nbytes={n}) {{"),
            format!("}} /* write */ = {n}"),
        ];
        assert_eq!(
            tree_lines(&stdout),
            want,
            "hidden {hidden}: {stdout}\n{stderr}"
        );
        let from = if hidden {
            "hotprobe's table of libc prototypes (no DWARF for libc.so.6: its debug package \
             gives parameter names, fields and every function)"
                .to_string()
        } else {
            debug_file.clone()
        };
        let said = format!("hotprobe: types of fopen64, fclose, write from {from}\n");
        assert!(stderr.contains(&said), "hidden {hidden}: {stderr}");
        assert_eq!(stderr.matches("hotprobe: types of").count(), 1, "{stderr}");
    }
    // What only DWARF knows: glibc's parameter names and a field through
    // a pointer, equal to what the program printed.
    let named = ["libc:fopen64(filename, mode)", "libc:fclose(fp->_fileno)"];
    let (ok, stdout, stderr) = run(&named, false);
    assert!(ok, "{stderr}");
    let fd = stderr
        .split_once(" fileno ")
        .and_then(|(_, r)| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("the program's line: {stderr}"));
    let lines = tree_lines(&stdout);
    assert_eq!(
        lines[..4],
        [
            "fopen64(filename=\"/etc/hostname\", mode=\"rb\") {".to_string(),
            "} /* fopen64 */ = PTR".to_string(),
            format!("fclose(fp->_fileno={fd}) {{"),
            "} /* fclose */ = 0".to_string(),
        ],
        "{stdout}"
    );
    assert!(
        stderr.contains(&format!(
            "hotprobe: types of fopen64, fclose from {debug_file}\n"
        )),
        "{stderr}"
    );
    // Hidden: the table's names only, said before the program runs.
    let (ok, stdout, stderr) = run(&named, true);
    assert!(!ok, "{stdout}");
    assert!(
        stderr.contains(
            "fopen64 has no parameter filename; its parameters: path (char *), mode (char *)"
        ),
        "{stderr}"
    );
    assert!(!stderr.contains("fileno"), "the program ran: {stderr}");
}
