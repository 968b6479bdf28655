//! Typed values copied in the target on the command line (issue 23 item
//! 5): `record -a` of functions taking or returning a string and taking
//! stack-passed 7th and 8th arguments, and `trace 'getx(p->x)'`, on tests/programs/typed_fast.c
//! at -O0 and -O2: the functions stay on patch or jump (the summary names
//! no trap), `replay` and `trace` show exactly the calls the program
//! logged ("CALL name(args) = ret"), a string pointer into unmapped memory
//! shows `<unreadable 0x1>`, and the program's output and exit status are
//! the ones it has untraced.

mod common;

use common::{gcc, hotprobe, text};
use std::path::{Path, PathBuf};

fn tmp() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("typed-fast-cli");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn program(opt: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/typed_fast.c");
    gcc(&src, &tmp().join(format!("typed_fast{opt}")), &[opt])
}

/// The program's calls of `funcs` as it logged them, as hotprobe shows
/// them (strings escaped, the unmapped pointer unreadable).
fn logged(out: &str, funcs: &[&str]) -> Vec<String> {
    out.lines()
        .filter_map(|l| l.strip_prefix("CALL "))
        .filter(|c| funcs.iter().any(|f| c.starts_with(&format!("{f}("))))
        .map(|c| {
            c.replace("be\"ta", "be\\\"ta")
                .replace("tag(1, 41)", "tag(<unreadable 0x1>, 41)")
        })
        .collect()
}

/// The call-tree lines of `trace`/`replay` output, past `[TID] | `.
fn tree_bodies(out: &str) -> Vec<&str> {
    out.lines()
        .filter_map(|l| l.split_once("] | ").map(|(_, b)| b.trim()))
        .collect()
}

/// The `--summary` table row of `func`.
fn summary_row<'a>(out: &'a str, func: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(&format!("{func} ")))
        .unwrap_or_else(|| panic!("no summary row:\n{out}"))
}

/// The program's stdout and exit status, untraced.
fn untraced(bin: &Path, n: &str) -> (String, Option<i32>) {
    let o = std::process::Command::new(bin).arg(n).output().unwrap();
    (text(&o.stdout), o.status.code())
}

#[test]
fn record_a_copies_strings_and_stack_arguments_on_the_fast_path() {
    for opt in ["-O0", "-O2"] {
        let bin = program(opt);
        let dir = tmp().join(format!("rec{opt}"));
        let _ = std::fs::remove_dir_all(&dir);
        let bin_s = bin.to_str().unwrap();
        let rec = hotprobe(&[
            "record",
            "-a",
            "word",
            "slen",
            "tag",
            "eight",
            "-o",
            dir.to_str().unwrap(),
            "--",
            bin_s,
            "40",
        ]);
        let (out, err) = (text(&rec.stdout), text(&rec.stderr));
        assert_eq!(
            (out.clone(), rec.status.code()),
            untraced(&bin, "40"),
            "{err}"
        );
        let probes = probes_line(&err);
        assert!(
            probes.contains("4 functions (") && !probes.contains("trap"),
            "{opt}: {probes}"
        );
        let shown = replayed_leaf_calls(&dir);
        let want = logged(&out, &["word", "slen", "tag", "eight"]);
        // word 40 times, slen 42 (one string of exactly the 128 bytes
        // copied, shown whole), eight 40, tag twice.
        assert_eq!(want.len(), 3 * 40 + 4, "{opt}");
        assert_eq!(shown, want, "{opt}");
    }
}

#[test]
fn trace_shows_a_field_through_a_pointer_copied_in_the_target() {
    let bin = program("-O2");
    let t = hotprobe(&[
        "trace",
        "--summary",
        "getx(p->x)",
        "--",
        bin.to_str().unwrap(),
        "25",
    ]);
    let (out, err) = (text(&t.stdout), text(&t.stderr));
    assert_eq!(t.status.code(), Some(7), "{err}");
    // `getx(p->x=N) {` then `} /* getx */ = N`.
    let mut shown = Vec::new();
    let mut open = None;
    for l in tree_bodies(&out) {
        if let Some(e) = l.strip_suffix(" {") {
            open = Some(e.to_string());
        } else if let Some(r) = l.strip_prefix("} /* getx */ = ") {
            shown.push(format!("{} = {r}", open.take().expect("entry first")));
        }
    }
    assert_eq!(shown, logged(&out, &["getx"]));
    assert_eq!(shown.len(), 25);
    let row = summary_row(&out, "getx");
    assert!(
        row.contains("typed values copied in the target") && !row.contains("trap"),
        "{row}"
    );
}

/// A program that makes a page of its own image unreadable between two
/// calls: the value read in the target is the string the first time and
/// `<unreadable 0x…>` the second (reads go through `process_vm_readv`
/// only: a direct read of the executable's mapping killed the program with
/// SIGSEGV), and the program's output and exit status are unchanged.
#[test]
fn a_page_of_its_own_image_made_unreadable_gives_unreadable_not_a_crash() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/typed_mprotect.c");
    let bin = gcc(&src, &tmp().join("typed_mprotect"), &["-O0", "-g"]);
    let t = hotprobe(&["trace", "-a", "show", "--", bin.to_str().unwrap()]);
    let (out, err) = (text(&t.stdout), text(&t.stderr));
    assert_eq!(t.status.code(), Some(0), "{err}");
    assert!(out.contains("r=2\n"), "{out}");
    let ptr = out
        .lines()
        .find_map(|l| l.strip_prefix("CALL2 "))
        .unwrap_or_else(|| panic!("{out}"));
    let entries: Vec<&str> = tree_bodies(&out)
        .into_iter()
        .filter(|l| l.starts_with("show("))
        .collect();
    assert_eq!(
        entries,
        [
            "show(\"a literal in rodata\") {".to_string(),
            format!("show(<unreadable {ptr}>) {{")
        ],
        "{out}"
    );
}

/// One function named twice: by a name and a pattern, each call is shown
/// once (it was shown twice); by two names, the second is refused (its
/// values were printed with the first spec's shapes; found by review).
#[test]
fn one_function_named_twice_is_traced_once_or_refused() {
    let bin = program("-O2");
    let b = bin.to_str().unwrap();
    let entries = |args: &[&str]| {
        let t = hotprobe(args);
        assert_eq!(t.status.code(), Some(7), "{}", text(&t.stderr));
        text(&t.stdout)
            .lines()
            .filter(|l| l.contains("] | slen(") && l.ends_with(" {"))
            .count()
    };
    let once = entries(&["trace", "-a", "slen", "--", b, "3"]);
    assert!(once > 0);
    assert_eq!(entries(&["trace", "-a", "slen", "sl*", "--", b, "3"]), once);
    let t = hotprobe(&["trace", "slen(s)", "slen", "--", b, "3"]);
    let err = text(&t.stderr);
    assert_eq!(t.status.code(), Some(2), "{err}");
    assert!(
        err.contains("`slen`: an earlier spec (`slen`) traces that function already"),
        "{err}"
    );
}

/// Two argument lists for one function: values and their shapes are kept
/// per function, so the second list is refused with both named (one
/// spec's values were printed with the other's shapes), before the program
/// runs.
#[test]
fn one_function_given_two_argument_lists_is_refused() {
    let bin = program("-O2");
    let t = hotprobe(&[
        "trace",
        "getx(p->x)",
        "getx(p)",
        "--",
        bin.to_str().unwrap(),
        "3",
    ]);
    let (out, err) = (text(&t.stdout), text(&t.stderr));
    assert_eq!(t.status.code(), Some(2), "{err}");
    assert!(
        err.contains("`getx`: an earlier spec (`getx`) traces that function already"),
        "{err}"
    );
    // A pattern that matches only functions traced already is left out.
    let t = hotprobe(&[
        "trace",
        "-a",
        "getx(p->x)",
        "get*",
        "--",
        bin.to_str().unwrap(),
        "3",
    ]);
    let err = text(&t.stderr);
    assert_eq!(t.status.code(), Some(7), "{err}");
    assert!(
        err.contains("get*: every function it matches is traced already"),
        "{err}"
    );
    assert!(!out.contains("CALL "), "the program did not run: {out}");
}

#[test]
fn a_cpp_member_function_gets_its_string_and_reference_field_copied() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/typed_fast.cc");
    let bin = hotprobe_testkit::compile(
        "g++",
        &src,
        &tmp().join("typed_fast_cc"),
        &["-O2", "-g"],
        &[],
    );
    let t = hotprobe(&[
        "trace",
        "--summary",
        "Greeter::say(who, p->x)",
        "--",
        bin.to_str().unwrap(),
        "30",
    ]);
    let (out, err) = (text(&t.stdout), text(&t.stderr));
    assert_eq!(t.status.code(), Some(0), "{err}");
    // `Greeter::say(char const*, Point const&) const(who="ada", p->x=0) {`
    // then `} /* … */ = 103`.
    let mut shown = Vec::new();
    let mut open = None;
    for l in tree_bodies(&out) {
        if let Some(e) = l.strip_suffix(" {") {
            let args = e
                .rsplit_once("const(")
                .expect("the values after the name")
                .1;
            open = Some(format!("say({args}"));
        } else if let Some((_, r)) = l.split_once("*/ = ") {
            shown.push(format!("{} = {r}", open.take().expect("entry first")));
        }
    }
    assert_eq!(shown, logged(&out, &["say"]));
    assert_eq!(shown.len(), 30);
    let row = summary_row(&out, "Greeter::say");
    assert!(row.contains("typed values copied in the target"), "{row}");
}

/// tests/programs/typed_seccomp.c, built once.
fn seccomp_program() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/typed_seccomp.c");
    gcc(&src, &tmp().join("typed_seccomp"), &["-O1"])
}

#[test]
fn after_a_seccomp_filter_strings_show_unreadable_and_the_program_runs_on() {
    // The filter comes while traced (through the preloaded agent's
    // prctl): the agent stops reading memory through process_vm_readv (a
    // filter may kill on it), its only way to read (no direct loads: the
    // program may make any page unreadable): a literal and a heap string
    // after it show unreadable.
    let bin = seccomp_program();
    let t = hotprobe(&[
        "trace",
        "-a",
        "--summary",
        "slen",
        "--",
        bin.to_str().unwrap(),
    ]);
    let (out, err) = (text(&t.stdout), text(&t.stderr));
    assert_eq!(t.status.code(), Some(5), "{err}");
    let entries: Vec<&str> = tree_bodies(&out)
        .into_iter()
        .filter(|b| b.ends_with(" {"))
        .collect();
    assert_eq!(entries.len(), 3, "{out}");
    assert_eq!(entries[0], "slen(\"before\") {");
    assert!(entries[1].starts_with("slen(<unreadable 0x"), "{out}");
    assert!(entries[2].starts_with("slen(<unreadable 0x"), "{out}");
    assert_eq!(
        logged(&out, &["slen"]),
        [
            "slen(\"before\") = 6",
            "slen(\"after\") = 5",
            "slen(\"on the heap\") = 11"
        ]
    );
}

#[test]
fn a_process_already_under_a_seccomp_filter_keeps_the_traps_reads() {
    use std::io::{BufRead, Write};
    let bin = seccomp_program();
    let mut child = std::process::Command::new(&bin)
        .arg("wait")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    lines.read_line(&mut line).unwrap();
    line.clear();
    lines.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    let pid = child.id().to_string();
    let mut stdin = child.stdin.take().unwrap();
    let ((), _, out, err) =
        common::while_attached(&["trace", "-a", "--summary", "slen", "-p", &pid], || {
            stdin.write_all(b"go\n").unwrap()
        });
    assert!(err.contains("exited with code 5"), "{err}");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut lines, &mut rest).unwrap();
    assert_eq!(
        rest,
        "CALL slen(\"after\") = 5\nCALL slen(\"on the heap\") = 11\n"
    );
    assert_eq!(child.wait().unwrap().code(), Some(5));
    assert!(out.contains("| slen(\"after\") {"), "{out}");
    assert!(out.contains("| slen(\"on the heap\") {"), "{out}");
    let row = summary_row(&out, "slen");
    assert!(
        row.contains("typed values read at the hit") && !row.contains("copied in the target"),
        "{row}"
    );
}

/// `trace -f -a` into a program a shell executes: the probes placed at
/// the exec show no typed values, and the run says so (they were shown
/// bare without a word; found by review).
#[test]
fn typed_values_across_exec_are_said_to_be_missing() {
    let bin = program("-O0");
    let script = format!("{} 1", bin.display());
    let t = hotprobe(&["trace", "-f", "-a", "slen", "--", "sh", "-c", &script]);
    let err = text(&t.stderr);
    assert_eq!(t.status.code(), Some(7), "{err}");
    assert!(
        err.contains("probes placed in programs started by exec show no typed values"),
        "{err}"
    );
}

/// The four values tests/programs/typed_strings.c's racy string can hold.
const RACY: [&str; 4] = ["\"Axyzw\"", "\"Bxyzw\"", "\"Axyz\"", "\"Bxyz\""];

/// Checks `shown` (`show(S, k) = k` per call) against the calls
/// tests/programs/typed_strings.c logged in `out`: equal, but for the
/// racy calls, each of which shows one of [`RACY`].
fn assert_edge_strings(shown: &[String], out: &str, racy_calls: usize, what: &str) {
    let want: Vec<&str> = out
        .lines()
        .filter_map(|l| l.strip_prefix("CALL "))
        .collect();
    assert_eq!(want.len(), 6 + racy_calls, "{what}: {out}");
    assert_eq!(shown.len(), want.len(), "{what}: {shown:?}");
    for (s, w) in shown.iter().zip(&want) {
        if *w == "show(racy, 7) = 7" {
            assert!(
                RACY.iter().any(|r| *s == format!("show({r}, 7) = 7")),
                "{what}: {s}"
            );
        } else {
            assert_eq!(s, w, "{what}");
        }
    }
}

/// Strings at the edges of readable memory, copied in the target (a
/// hardware transaction where the processor has one, else or when it
/// aborts `process_vm_readv`): NULL, a string whose NUL is the last byte
/// before an unmapped page (whole), one running into a `PROT_NONE` page
/// (cut), an anonymous page never touched and a file mapping not yet
/// faulted in (read, not unreadable), 300 bytes (cut at 128), and a
/// string another thread rewrites during the calls (each call shows one
/// of the values it can hold), by `record -a` + `replay` and by
/// `trace -a`; the function stays on a jump or patch, and the program's
/// output and exit status are unchanged.
#[test]
fn strings_at_the_edges_of_readable_memory_are_copied_exactly() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/typed_strings.c");
    let bin = gcc(&src, &tmp().join("typed_strings"), &["-O2"]);
    let b = bin.to_str().unwrap();
    let calls = 300;
    let n = calls.to_string();
    let dir = tmp().join("strings");
    let _ = std::fs::remove_dir_all(&dir);
    let rec = hotprobe(&[
        "record",
        "-a",
        "show",
        "-o",
        dir.to_str().unwrap(),
        "--",
        b,
        &n,
    ]);
    let (out, err) = (text(&rec.stdout), text(&rec.stderr));
    assert_eq!(
        (out.clone(), rec.status.code()),
        untraced(&bin, &n),
        "{err}"
    );
    let probes = probes_line(&err);
    assert!(
        probes.contains("1 functions (") && !probes.contains("trap"),
        "{probes}"
    );
    let shown = replayed_leaf_calls(&dir);
    assert_edge_strings(&shown, &out, calls, "record -a + replay");

    let t = hotprobe(&["trace", "-a", "--summary", "show", "--", b, &n]);
    let (out, err) = (text(&t.stdout), text(&t.stderr));
    assert_eq!(t.status.code(), Some(3), "{err}");
    let mut shown = Vec::new();
    let mut open = None;
    for l in tree_bodies(&out) {
        if let Some(e) = l.strip_suffix(" {") {
            open = Some(e.to_string());
        } else if let Some(r) = l.strip_prefix("} /* show */ = ") {
            shown.push(format!("{} = {r}", open.take().expect("entry first")));
        }
    }
    assert_edge_strings(&shown, &out, calls, "trace -a");
    let row = summary_row(&out, "show");
    assert!(
        row.contains("typed values copied in the target") && !row.contains("trap"),
        "{row}"
    );
}

/// record's summary line `probes: …` in `err`.
fn probes_line(err: &str) -> &str {
    err.lines()
        .find(|l| l.trim_start().starts_with("probes:"))
        .unwrap_or_else(|| panic!("no probes line:\n{err}"))
}

/// The leaf calls `replay` shows of the trace in `dir`: the bodies of its
/// `| name(args) = ret;` lines, without the `;`.
fn replayed_leaf_calls(dir: &std::path::Path) -> Vec<String> {
    let replay = hotprobe(&["replay", dir.to_str().unwrap()]);
    assert!(replay.status.success(), "{}", text(&replay.stderr));
    tree_bodies(&text(&replay.stdout))
        .into_iter()
        .filter_map(|b| b.strip_suffix(';'))
        .map(str::to_string)
        .collect()
}
