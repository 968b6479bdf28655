//! Issue 21: a probe placed while its library was loaded is made pending
//! when the program unloads the library (dlclose), and armed again when
//! it loads it again (dlopen), as gdb re-arms a breakpoint. `hotprobe
//! count -p` attaches to a program (tests/programs/reloads.c) that has
//! `libreload.so` loaded and waits; the program then calls `f` 5 times,
//! unloads the library (and
//! checks its mappings are gone), loads it again, calls `f` 7 times and
//! exits with status 7. The table has one row for `f` with every call,
//! on the mechanism asked; a notice names `f`; a condition naming `f`'s
//! parameter holds for the calls after the reload too; `trace -a` shows
//! the string argument of every call, before and after (typed values come
//! back with the probe); the program's output and exit status are its
//! own.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};

mod common;
use common::{text, CountTable};

/// tests/programs/reloads.c and its library (f, g, named).
fn build() -> (PathBuf, PathBuf) {
    hotprobe_testkit::reloading_program(
        &PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("reloaded_library"),
    )
}

/// The program's output after `loaded` without hotprobe.
fn untraced(prog: &PathBuf, lib: &PathBuf) -> String {
    let mut c = Command::new(prog)
        .arg(lib)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let o = c.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(7), "{o:?}");
    let out = text(&o.stdout);
    assert!(
        out.contains(" mappings 0\n"),
        "the library is unmapped:\n{out}"
    );
    out.strip_prefix("loaded\n").unwrap().to_string()
}

/// `hotprobe count -p PID ARGS` (or another command: `cmd`) on the program, started and past its
/// `loaded` line (the library is loaded when the probes go in): what the
/// program printed after, hotprobe's stdout and stderr.
fn count_attached(args: &[&str]) -> (String, String, String) {
    attached("count", args)
}

fn attached(cmd: &str, args: &[&str]) -> (String, String, String) {
    let (prog, lib) = build();
    let native = untraced(&prog, &lib);
    let mut p = Command::new(&prog)
        .arg(&lib)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(p.stdout.take().unwrap());
    let mut loaded = String::new();
    out.read_line(&mut loaded).unwrap();
    assert_eq!(loaded, "loaded\n");
    let pid = p.id().to_string();
    let mut stdin = p.stdin.take().unwrap();
    let mut a = vec![cmd, "-p", &pid];
    a.extend_from_slice(args);
    let (printed, status, stdout, stderr) = common::while_attached(&a, || {
        stdin.write_all(b"go\n").unwrap();
        let mut rest = String::new();
        out.read_to_string(&mut rest).unwrap();
        rest
    });
    let ctx = format!("{args:?}\n{printed}\n{stdout}\n{stderr}");
    assert_eq!(p.wait().unwrap().code(), Some(7), "{ctx}");
    // hotprobe exits with the status of the process it followed.
    assert_eq!(status.code(), Some(7), "{ctx}");
    assert_eq!(printed, native, "{ctx}");
    (printed, stdout, stderr)
}

/// The notice of the unload names `f`, pending again; nothing failed to
/// arm.
fn names_f(stderr: &str) {
    let notices: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("went with a module the program unloaded"))
        .collect();
    assert_eq!(notices.len(), 1, "{stderr}");
    assert!(notices[0].contains(": f: pending, armed again"), "{stderr}");
    assert!(!stderr.contains("cannot arm"), "{stderr}");
}

#[test]
fn a_probe_in_a_reloaded_library_counts_every_call_on_each_mechanism() {
    for mechanism in ["trap", "jump", "patch"] {
        let (_, stdout, stderr) = count_attached(&["--mechanism", mechanism, "f"]);
        let t = CountTable::parse(&stdout, &stderr);
        assert_eq!(t.hits("f"), 12, "{mechanism}: {}", t.all);
        assert!(
            t.execution("f").starts_with(mechanism),
            "{mechanism}: {}",
            t.all
        );
        names_f(&stderr);
    }
}

#[test]
fn a_condition_on_a_probe_in_a_reloaded_library_holds_after_the_reload() {
    // x >= 2: 3 of the 5 calls before the unload, 5 of the 7 after.
    let (_, stdout, stderr) = count_attached(&["f if x >= 2"]);
    let t = CountTable::parse(&stdout, &stderr);
    assert_eq!(t.rows.len(), 1, "{}", t.all);
    assert_eq!(t.hits("f"), 8, "{}", t.all);
    assert!(!stderr.contains("not counted"), "{stderr}");
    names_f(&stderr);
}

#[test]
fn typed_values_of_a_probe_in_a_reloaded_library_come_back_with_it() {
    let want: Vec<String> = (0..5)
        .map(|i| format!("named(\"before-{i}\", {i}) {{"))
        .chain((0..7).map(|i| format!("named(\"after-{i}\", {i}) {{")))
        .collect();
    for mechanism in [&[][..], &["--mechanism", "trap"][..]] {
        let mut a = vec!["-a"];
        a.extend_from_slice(mechanism);
        a.push("named");
        let (_, stdout, stderr) = attached("trace", &a);
        let calls: Vec<&str> = stdout
            .lines()
            .filter_map(|l| l.split_once("] | ").map(|(_, b)| b.trim()))
            .filter(|b| b.starts_with("named("))
            .collect();
        assert_eq!(calls, want, "{mechanism:?}\n{stdout}\n{stderr}");
        let notices: Vec<&str> = stderr
            .lines()
            .filter(|l| l.contains("went with a module the program unloaded"))
            .collect();
        assert_eq!(notices.len(), 1, "{stderr}");
        assert!(notices[0].contains(": named: pending"), "{stderr}");
    }
}
