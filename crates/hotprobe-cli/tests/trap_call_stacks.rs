//! Issue 24, per-call stacks of calls recorded through the ptrace trap:
//! the tracer walks each entry's stack at its stop and records it with
//! the call (call_stacks.tsv), as the agent's fast paths do, so `report
//! --callers`, `export --format folded` (with the filters that need
//! per-call stacks) and `replay` see every call. stack_paths.c reaches
//! malloc from three known call paths 3, 5 and 7 times, then once from
//! printf. Its probes are all on the ptrace trap where no agent is: a
//! static build (at -O0 with frame pointers and at `-O2
//! -fomit-frame-pointer`, walked by the `.eh_frame` tables), the program
//! a shell executes under `-f` (no agent in the new image), and 4-byte
//! functions with no room for a jump in a process attached with `-p` (no
//! in-process trap there). The program's output is its own.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::record::trace_dir;
use common::{gcc, hotprobe_within, text};

const LIMIT: Duration = Duration::from_secs(120);

/// The outer frames of every stack of the program's main thread,
/// innermost first.
const TAIL: &str = "main <- __libc_start_call_main <- __libc_start_main <- _start";

/// The three paths to malloc, callers innermost first up to `main`'s
/// caller (excluded), and their calls.
const PATHS: [(&str, u64); 3] = [
    ("alloc_leaf <- path_c_inner <- path_c", 7),
    ("alloc_leaf <- path_b", 5),
    ("alloc_leaf <- path_a", 3),
];

fn build(tag: &str, flags: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/stack_paths.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("trap_call_stacks");
    std::fs::create_dir_all(&dir).unwrap();
    gcc(&src, &dir.join(tag), flags)
}

/// `hotprobe ARGS`: asserts success; stdout and stderr.
fn run(args: &[&str]) -> (String, String) {
    let o = hotprobe_within(args, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{args:?}: {out}\n{err}");
    (out, err)
}

/// `record --stacks EXTRA PROBES -- CMD` into a fresh trace `tag`: the
/// trace, and record's stderr; the program printed `allocated 15`.
fn record(tag: &str, extra: &[&str], probes: &[&str], cmd: &[&str]) -> (PathBuf, String) {
    let dir = trace_dir(tag);
    let mut a = vec!["record", "-o", dir.to_str().unwrap(), "--stacks"];
    a.extend_from_slice(extra);
    a.extend_from_slice(probes);
    a.push("--");
    a.extend_from_slice(cmd);
    let (out, err) = run(&a);
    assert_eq!(out, "allocated 15\n", "{err}");
    assert!(err.contains("exited with code 0"), "{err}");
    (dir, err)
}

/// `report --callers malloc` (with `extra`): the lines, trimmed.
fn callers(dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = vec!["report", dir.to_str().unwrap(), "--callers", "malloc"];
    a.extend_from_slice(extra);
    let (out, _) = run(&a);
    out.lines().map(|l| l.trim().to_string()).collect()
}

/// `export --format folded` (with `extra`): the lines.
fn folded(dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut a = vec!["export", dir.to_str().unwrap(), "--format", "folded"];
    a.extend_from_slice(extra);
    let (out, _) = run(&a);
    out.lines().map(str::to_string).collect()
}

/// The folded line of a malloc path (callers innermost first) counted `n`.
fn folded_line(path: &str, n: u64) -> String {
    let stack = format!("{path} <- {TAIL}");
    let mut frames: Vec<&str> = stack.split(" <- ").collect();
    frames.reverse();
    frames.push("malloc");
    format!("{} {n}", frames.join(";"))
}

/// Checks the three paths in the trace `dir`: `report --callers`, the
/// folded export, the same under `-F` (only per-call stacks can be
/// filtered), and `replay`'s per-call stacks in the program's order.
fn check_three_paths(dir: &Path) {
    assert!(
        dir.join("call_stacks.tsv").is_file(),
        "no per-call stacks in {}",
        dir.display()
    );
    let lines = callers(dir, &[]);
    assert!(
        lines.contains(&"15  alloc_leaf -> malloc".to_string()),
        "{lines:#?}"
    );
    for (path, n) in PATHS {
        let want = format!("{n}      {path} <- {TAIL}");
        assert!(lines.contains(&want), "{want} in {lines:#?}");
    }
    // printf's allocation of stdout's buffer, once.
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("1      ") && l.contains("printf <- main")),
        "{lines:#?}"
    );
    assert!(!lines.iter().any(|l| l.contains("[unknown]")), "{lines:#?}");

    let out = folded(dir, &[]);
    for (path, n) in PATHS {
        let want = folded_line(path, n);
        assert!(out.contains(&want), "{want} in {out:#?}");
    }

    // Filters need each call's stack (a trace with only counted stacks
    // refuses them): under path_b, its 5 calls alone.
    let lines = callers(dir, &["-F", "path_b"]);
    assert!(
        lines.contains(&"5  alloc_leaf -> malloc".to_string()),
        "{lines:#?}"
    );
    let paths: Vec<&String> = lines.iter().filter(|l| l.contains(" <- ")).collect();
    assert_eq!(
        paths,
        [&format!("5      alloc_leaf <- path_b <- {TAIL}")],
        "{lines:#?}"
    );
    let out = folded(dir, &["-F", "path_c"]);
    let mallocs: Vec<&String> = out.iter().filter(|l| l.contains(";malloc ")).collect();
    assert_eq!(
        mallocs,
        [&folded_line("alloc_leaf <- path_c_inner <- path_c", 7)],
        "{out:#?}"
    );

    // replay: each malloc call ends with its own stack, the three paths'
    // in the program's order (3 by path_a, 5 by path_b, 7 by path_c),
    // then printf's; every call of malloc has one.
    let (out, _) = run(&["replay", dir.to_str().unwrap()]);
    let stacks: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once("malloc(); /* <- ")?.1.strip_suffix(" */"))
        .collect();
    let mut want: Vec<String> = Vec::new();
    for (path, n) in PATHS.iter().rev() {
        want.extend(std::iter::repeat_n(
            format!("{path} <- {TAIL}"),
            *n as usize,
        ));
    }
    let paths: Vec<&str> = stacks
        .iter()
        .copied()
        .filter(|s| s.starts_with("alloc_leaf"))
        .collect();
    assert_eq!(paths, want, "{out}");
    assert_eq!(
        stacks
            .iter()
            .filter(|s| s.contains("printf <- main"))
            .count(),
        1,
        "{out}"
    );
    let malloc_lines = out.lines().filter(|l| l.contains("malloc()")).count();
    assert_eq!(stacks.len(), malloc_lines, "a stack for every call:\n{out}");

    // Each call's stacks counted are the stacks the tracer counted at
    // the stops (stacks.tsv: count, truncated, function, callers).
    let counted = std::fs::read_to_string(dir.join("stacks.tsv")).unwrap();
    let out = folded(dir, &[]);
    for l in counted.lines().skip(1) {
        let f: Vec<&str> = l.split('\t').collect();
        assert_eq!(f[1], "0", "not truncated: {l}");
        let mut frames: Vec<&str> = f[3].split(';').collect();
        frames.reverse();
        frames.push(f[2]);
        let line = format!("{} {}", frames.join(";"), f[0]);
        assert!(out.contains(&line), "{line} in {out:#?}");
    }
}

/// A static build (no agent: every probe on the ptrace trap), with and
/// without frame pointers: every call of main, the paths, alloc_leaf and
/// malloc is recorded through a ptrace stop, with its stack.
#[test]
fn record_stacks_on_the_ptrace_trap_give_each_call_its_stack() {
    for (tag, flags) in [
        (
            "fp-static",
            &["-O0", "-fno-omit-frame-pointer", "-static"][..],
        ),
        (
            "nofp-static",
            &["-O2", "-fomit-frame-pointer", "-static"][..],
        ),
    ] {
        let bin = build(tag, flags);
        let (dir, err) = record(
            &format!("trap-call-stacks-{tag}"),
            &[],
            &["malloc", "main", "path_*", "alloc_leaf"],
            &[bin.to_str().unwrap()],
        );
        assert!(err.contains("(trap 7)"), "{tag}: {err}");
        assert!(!err.contains("could not be read"), "{tag}: {err}");
        check_three_paths(&dir);
    }
}

/// `-f` across exec: the program a shell executes has no agent, so its
/// malloc is recorded on the trap; each of its calls has its stack, named
/// with its own symbols, beside the shell's.
#[test]
fn record_stacks_of_a_program_a_shell_executes() {
    let bin = build("exec", &["-O2", "-fomit-frame-pointer"]);
    let (dir, err) = record(
        "trap-call-stacks-exec",
        &["-f"],
        &["libc:malloc"],
        &["sh", "-c", bin.to_str().unwrap()],
    );
    let lines = callers(&dir, &[]);
    assert!(
        lines.contains(&"15  alloc_leaf -> malloc".to_string()),
        "{lines:#?}\n{err}"
    );
    for (path, n) in PATHS {
        let want = format!("{n}      {path} <- {TAIL}");
        assert!(lines.contains(&want), "{want} in {lines:#?}");
    }
    // Per thread: the program's thread (the shell's vfork child, which
    // called malloc once before its exec) holds the three paths' 15 calls
    // and printf's; the shell's none of them.
    let (out, _) = run(&[
        "report",
        dir.to_str().unwrap(),
        "--callers",
        "malloc",
        "--task",
    ]);
    let blocks: Vec<&str> = out.split("# thread ").skip(1).collect();
    let program: Vec<&&str> = blocks.iter().filter(|b| b.contains("alloc_leaf")).collect();
    assert_eq!(program.len(), 1, "{out}");
    let lines: Vec<&str> = program[0].lines().map(str::trim).collect();
    assert!(lines.contains(&"15  alloc_leaf -> malloc"), "{out}");
    assert!(lines.contains(&"1  _IO_file_doallocate -> malloc"), "{out}");
}

/// tests/programs/short_fns.c's 1-byte `nothing`, packed
/// (`-falign-functions=1`: no padding for a jump, and too short for a
/// punned one; the 4-byte `inc` and `twice` take punned jumps), in a
/// process attached with `-p` (no in-process trap): recorded through the
/// ptrace trap, and every recorded call has its stack, main's.
#[test]
fn record_stacks_of_short_functions_in_an_attached_process() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/short_fns.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("trap_call_stacks");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = gcc(
        &src,
        &dir.join("short_fns_packed"),
        &["-O2", "-falign-functions=1"],
    );
    let mut server = Command::new(&bin)
        .arg("serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready, "ready\n");
    let pid = server.id().to_string();
    let trace = trace_dir("trap-call-stacks-attached");
    let d = trace.to_str().unwrap();
    let args = [
        "record",
        "-p",
        &pid,
        "-o",
        d,
        "--stacks",
        "--duration",
        "1",
        "nothing",
    ];
    let (_, err) = run(&args);
    drop(server.stdin.take());
    assert!(server.wait().unwrap().success(), "the program runs on");
    assert!(err.contains("(trap 1)"), "{err}");
    assert!(trace.join("call_stacks.tsv").is_file(), "{err}");

    let rep: serde_json::Value = serde_json::from_str(&run(&["report", d, "--json"]).0).unwrap();
    let lines = callers_of(&trace, "*");
    let f = "nothing";
    let calls = rep["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["function"] == f)
        .and_then(|r| r["calls"].as_u64())
        .unwrap_or_else(|| panic!("{f}: {rep}"));
    assert!(calls > 0, "{rep}");
    // Every call: its caller and full stack.
    assert!(
        lines.contains(&format!("{calls}  main -> {f}")),
        "{f} ×{calls}: {lines:#?}"
    );
    let path = format!("{calls}      {TAIL}");
    assert!(lines.contains(&path), "{path} in {lines:#?}");
    assert_eq!(lines.len(), 3, "a header, a caller, its path: {lines:#?}");
}

/// `report --callers FUNC`: the lines, trimmed.
fn callers_of(dir: &Path, func: &str) -> Vec<String> {
    let (out, _) = run(&["report", dir.to_str().unwrap(), "--callers", func]);
    out.lines().map(|l| l.trim().to_string()).collect()
}
