//! Issue 24, stacks at a hit: `count --stacks 'libc:malloc'` on a program
//! that reaches malloc from three known call paths 3, 5 and 7 times gives
//! those three stacks with exactly those counts, on a build with frame
//! pointers and on an `-O2 -fomit-frame-pointer` one (libc and that build
//! keep none: the agent walks the tracer's `.eh_frame` tables), across
//! the agent's return trampoline and the tracer's trap return trampoline.
//! The program's output and exit status are its own.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, program_output, text};

const LIMIT: Duration = Duration::from_secs(120);

fn build(tag: &str, flags: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/stack_paths.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stacks");
    std::fs::create_dir_all(&dir).unwrap();
    gcc(&src, &dir.join(tag), flags)
}

/// One block of `--stacks` output: count, frames, truncated.
#[derive(Debug, PartialEq, Eq)]
struct Stack {
    count: u64,
    frames: Vec<String>,
    truncated: bool,
}

/// The stacks printed under `stacks of LABEL`.
fn stacks_of(stdout: &str, label: &str) -> Vec<Stack> {
    let head = format!("stacks of {label} (most frequent first):");
    let mut lines = stdout.lines().skip_while(|l| *l != head).skip(1);
    let mut out: Vec<Stack> = Vec::new();
    for l in lines.by_ref() {
        if l.is_empty() || l.starts_with("stacks of") {
            break;
        }
        if let Ok(n) = l.trim().parse::<u64>() {
            out.push(Stack {
                count: n,
                frames: Vec::new(),
                truncated: false,
            });
        } else if let Some(s) = out.last_mut() {
            match l.trim() {
                "[truncated]" => s.truncated = true,
                f => s.frames.push(f.to_string()),
            }
        }
    }
    out
}

/// The program run without hotprobe: its stdout.
fn native(bin: &Path) -> String {
    let o = Command::new(bin).output().unwrap();
    assert!(o.status.success());
    text(&o.stdout)
}

/// Checks the three known paths with their counts, each complete down to
/// `_start`; returns the stacks.
fn check_three_paths(stdout: &str, stderr: &str) -> Vec<Stack> {
    check_three_paths_of(stdout, stderr, "libc:malloc")
}

/// [`check_three_paths`] under `stacks of LABEL`.
fn check_three_paths_of(stdout: &str, stderr: &str, label: &str) -> Vec<Stack> {
    let stacks = stacks_of(stdout, label);
    let want: [(&[&str], u64); 3] = [
        (&["alloc_leaf", "path_c_inner", "path_c", "main"], 7),
        (&["alloc_leaf", "path_b", "main"], 5),
        (&["alloc_leaf", "path_a", "main"], 3),
    ];
    for (frames, count) in want {
        let found: Vec<&Stack> = stacks
            .iter()
            .filter(|s| s.frames.len() > frames.len() && s.frames[..frames.len()] == *frames)
            .collect();
        assert_eq!(found.len(), 1, "{frames:?} in\n{stdout}\n{stderr}");
        let s = found[0];
        assert_eq!(s.count, count, "{frames:?}:\n{stdout}");
        assert!(!s.truncated, "{s:?}");
        assert_eq!(s.frames.last().map(String::as_str), Some("_start"), "{s:?}");
    }
    // Most frequent first.
    assert!(
        stacks.windows(2).all(|w| w[0].count >= w[1].count),
        "{stdout}"
    );
    stacks
}

fn run_count(bin: &Path, probes: &[&str], extra: &[&str]) -> (String, String) {
    let mut args = vec!["count", "--stacks"];
    args.extend_from_slice(extra);
    args.extend_from_slice(probes);
    args.push("--");
    args.push(bin.to_str().unwrap());
    let o = hotprobe_within(&args, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    assert_eq!(program_output(&out), native(bin), "{err}");
    (out, err)
}

#[test]
fn count_stacks_of_malloc_with_and_without_frame_pointers() {
    for (tag, flags) in [
        ("fp", &["-O0", "-fno-omit-frame-pointer"][..]),
        ("nofp", &["-O2", "-fomit-frame-pointer"][..]),
        // No .eh_frame for the program's own functions: its frames are
        // walked by the frame-pointer chain.
        (
            "fp-nocfi",
            &[
                "-O1",
                "-fno-omit-frame-pointer",
                "-fno-asynchronous-unwind-tables",
                "-fno-unwind-tables",
            ][..],
        ),
    ] {
        let bin = build(tag, flags);
        let (out, err) = run_count(&bin, &["libc:malloc"], &[]);
        check_three_paths(&out, &err);
        assert!(!err.contains("not counted"), "{tag}: {err}");
    }
}

/// `trace --stacks`: the live call tree, then the same three stacks as
/// `count --stacks`, counted.
#[test]
fn trace_stacks_prints_the_three_paths_at_the_end() {
    let bin = build("omit_fp", &["-O2", "-fomit-frame-pointer"]);
    let o = hotprobe_within(
        &[
            "trace",
            "--stacks",
            "libc:malloc",
            "--",
            bin.to_str().unwrap(),
        ],
        LIMIT,
    );
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    // Every call in the tree (the 15 of the three paths and stdio's own
    // buffer) is in one of the stacks printed after it.
    let stacks = check_three_paths(&out, &err);
    let total: u64 = stacks.iter().map(|s| s.count).sum();
    assert_eq!(out.matches("malloc() {").count() as u64, total, "{out}");
}

#[test]
fn count_stacks_across_return_trampolines() {
    let bin = build("nofp", &["-O2", "-fomit-frame-pointer"]);
    // path_b%return: a trap return probe (the tracer's return trampoline
    // in path_b's return slot while malloc runs).
    let (out, err) = run_count(&bin, &["libc:malloc", "path_b%return"], &[]);
    check_three_paths(&out, &err);
    // --hist hooks path_c's and path_c_inner's returns with the agent's
    // return trampoline.
    let (out, err) = run_count(
        &bin,
        &["libc:malloc", "path_c", "path_c_inner"],
        &["--hist"],
    );
    check_three_paths(&out, &err);
    // path_c_inner's own stacks: 7, from path_c.
    let inner = stacks_of(&out, "path_c_inner");
    assert_eq!(inner.len(), 1, "{out}");
    assert_eq!(inner[0].count, 7);
    assert_eq!(inner[0].frames[..2], ["path_c", "main"]);
}

/// `record --stacks`: the trace's stacks give the same three paths to
/// `report --callers malloc` and `export --format folded`, and `report
/// --graph main` shows the recorded call tree's paths with their calls.
#[test]
fn record_stacks_callers_folded_and_graph_agree() {
    let bin = build("nofp", &["-O2", "-fomit-frame-pointer"]);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stacks-trace");
    let (out, err) = run_count(&bin, &["libc:malloc"], &[]);
    let counted = check_three_paths(&out, &err);
    let o = hotprobe_within(
        &[
            "record",
            "--force",
            "-o",
            dir.to_str().unwrap(),
            "--stacks",
            "libc:malloc",
            "main",
            "path_*",
            "alloc_leaf",
            "--",
            bin.to_str().unwrap(),
        ],
        LIMIT,
    );
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), native(&bin));
    let d = dir.to_str().unwrap();

    // report --callers: alloc_leaf called malloc 15 times, by the three
    // paths with their counts; and the printf path once, as counted.
    let o = hotprobe_within(&["report", d, "--callers", "malloc"], LIMIT);
    let rep = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let lines: Vec<&str> = rep.lines().map(str::trim).collect();
    assert!(lines.contains(&"15  alloc_leaf -> malloc"), "{rep}");
    for s in &counted {
        let path = s.frames.join(" <- ");
        assert!(
            lines.contains(&format!("{}      {path}", s.count).as_str()),
            "{path} ×{} in\n{rep}",
            s.count
        );
    }

    // export --format folded: one line per counted stack, outermost first.
    let o = hotprobe_within(&["export", d, "--format", "folded"], LIMIT);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let folded = text(&o.stdout);
    for s in &counted {
        let mut frames: Vec<&str> = s.frames.iter().rev().map(String::as_str).collect();
        frames.push("malloc");
        let line = format!("{} {}", frames.join(";"), s.count);
        assert!(folded.lines().any(|l| l == line), "{line} in\n{folded}");
    }

    // report --graph main: the recorded call tree below main.
    let o = hotprobe_within(&["report", d, "--graph", "main"], LIMIT);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let graph = text(&o.stdout);
    let tree: Vec<&str> = graph
        .lines()
        .filter_map(|l| l.split_once(" : ").map(|(_, t)| t.trim_end()))
        .collect();
    for want in [
        "(1) main",
        " +-(3) path_a",
        " | +-(3) alloc_leaf",
        " |   +-(3) malloc",
        " +-(5) path_b",
        " +-(7) path_c",
        " | +-(7) path_c_inner",
        " |   +-(7) alloc_leaf",
        " |     +-(7) malloc",
    ] {
        assert!(tree.contains(&want), "{want:?} in\n{graph}");
    }

    // replay: each recorded call's own stack ends its line (call_stacks.tsv):
    // malloc's 15 calls by the three paths in the program's order, then
    // printf's; every call of main, path_*, alloc_leaf and malloc has one.
    let o = hotprobe_within(&["replay", d], LIMIT);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let replay = text(&o.stdout);
    let calls: Vec<&str> = replay
        .lines()
        .filter(|l| l.contains("() {") || l.ends_with(" */") && l.contains("(); /* <- "))
        .collect();
    assert!(calls.iter().all(|l| l.contains(" /* <- ")), "{replay}");
    let mallocs: Vec<&str> = calls
        .iter()
        .filter_map(|l| l.split_once("malloc(); /* <- ")?.1.strip_suffix(" */"))
        .collect();
    let tail = " <- main <- __libc_start_call_main <- __libc_start_main <- _start";
    let mut want = Vec::new();
    for (path, n) in [
        ("alloc_leaf <- path_a", 3),
        ("alloc_leaf <- path_b", 5),
        ("alloc_leaf <- path_c_inner <- path_c", 7),
    ] {
        want.extend(std::iter::repeat_n(format!("{path}{tail}"), n));
    }
    assert_eq!(mallocs[..want.len()], want[..], "{replay}");
    assert!(
        mallocs[want.len()..].iter().all(|s| s.contains("printf")),
        "{replay}"
    );
    let inner: Vec<&&str> = calls
        .iter()
        .filter(|l| l.contains("path_c_inner() {"))
        .collect();
    assert_eq!(inner.len(), 7, "{replay}");
    assert!(
        inner
            .iter()
            .all(|l| l.ends_with(&format!("/* <- path_c{tail} */"))),
        "{replay}"
    );

    // A function with no captured stack.
    let o = hotprobe_within(&["report", d, "--callers", "nosuchfunc"], LIMIT);
    assert!(o.status.success());
    assert!(text(&o.stdout).contains("no call matches --callers nosuchfunc"));
}

/// Threads started after the probes were placed: their stacks are walked
/// too (fault-safe reads until the tracer publishes them), each ending at
/// the thread's first frame (`clone3`, return address undefined).
#[test]
fn count_stacks_of_threads_started_later() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/stack_threads.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stacks");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = gcc(&src, &dir.join("threads"), &["-O2", "-fomit-frame-pointer"]);
    let (out, err) = run_count(&bin, &["libc:malloc"], &[]);
    let stacks = stacks_of(&out, "libc:malloc");
    let s = stacks
        .iter()
        .find(|s| {
            s.frames
                .starts_with(&["alloc_leaf".into(), "thread_path".into()])
        })
        .unwrap_or_else(|| panic!("{out}\n{err}"));
    assert_eq!(s.count, 20, "{out}\n{err}");
    assert!(!s.truncated, "{s:?}");
    assert_eq!(
        s.frames.get(2).map(String::as_str),
        Some("thread_main"),
        "{s:?}"
    );
    assert!(!err.contains("not counted"), "{err}");
}

/// Probes on the ptrace trap (`--mechanism trap`; a static binary, which
/// takes no agent): the tracer walks the stack at the stop with the same
/// tables, and gives the same three stacks and counts, across the trap
/// return trampoline in path_b's return slot.
#[test]
fn count_stacks_on_the_ptrace_trap() {
    let bin = build("nofp", &["-O2", "-fomit-frame-pointer"]);
    let trap = ["--mechanism", "trap"];
    let (out, err) = run_count(&bin, &["libc:malloc"], &trap);
    check_three_paths(&out, &err);
    assert!(out.contains("trap"), "{out}");
    let (out, err) = run_count(&bin, &["libc:malloc", "path_b%return"], &trap);
    check_three_paths(&out, &err);
    // path_c_inner's own stacks, on the trap: 7, from path_c.
    let (out, err) = run_count(&bin, &["libc:malloc", "path_c_inner"], &trap);
    check_three_paths(&out, &err);
    let inner = stacks_of(&out, "path_c_inner");
    assert_eq!(inner.len(), 1, "{out}");
    assert_eq!(inner[0].count, 7, "{out}");
    assert_eq!(inner[0].frames[..2], ["path_c", "main"], "{out}");

    // A static build: no agent at all, every probe on the trap.
    let stat = build("nofp-static", &["-O2", "-fomit-frame-pointer", "-static"]);
    let (out, err) = run_count(&stat, &["malloc"], &[]);
    check_three_paths_of(&out, &err, "malloc");
    // record --stacks there: report --callers gives the same paths.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stacks-trap-trace");
    let d = dir.to_str().unwrap();
    let args = ["record", "--force", "-o", d, "--stacks", "malloc", "--"];
    let o = hotprobe_within(&[&args[..], &[stat.to_str().unwrap()]].concat(), LIMIT);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let o = hotprobe_within(&["report", d, "--callers", "malloc"], LIMIT);
    let rep = text(&o.stdout);
    let lines: Vec<&str> = rep.lines().map(str::trim).collect();
    assert!(lines.contains(&"15  alloc_leaf -> malloc"), "{rep}");
    for (n, path) in [(7, "path_c_inner <- path_c"), (5, "path_b"), (3, "path_a")] {
        let want = format!("{n}      alloc_leaf <- {path} <- main <- ");
        assert!(
            lines.iter().any(|l| l.starts_with(&want)),
            "{want} in\n{rep}"
        );
    }
}

/// `-f --stacks`: a forked child's hits on the trap are walked too (in
/// its own memory) and counted with its parent's: work() from main, 8
/// calls in the parent and 10 in the child, on the trap and on the jump.
#[test]
fn count_stacks_of_forked_children() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/fork_args.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stacks");
    std::fs::create_dir_all(&dir).unwrap();
    for (tag, flags, extra) in [
        ("fork-o1", &["-O1"][..], &["-f", "--mechanism", "trap"][..]),
        ("fork-o0", &["-O0"][..], &["-f"][..]),
    ] {
        let bin = gcc(&src, &dir.join(tag), flags);
        let mut args = vec!["count", "--stacks"];
        args.extend_from_slice(extra);
        args.extend_from_slice(&["work", "--", bin.to_str().unwrap()]);
        let o = hotprobe_within(&args, LIMIT);
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
        let stacks = stacks_of(&out, "work");
        assert_eq!(stacks.len(), 1, "{tag}: {out}\n{err}");
        assert_eq!(stacks[0].count, 18, "{tag}: {out}");
        assert_eq!(stacks[0].frames[0], "main", "{tag}: {out}");
        assert_eq!(stacks[0].frames.last().map(String::as_str), Some("_start"));
    }
}

/// `trace --stacks`: each call's own stack ends its entry line (the entry
/// event carries the id of the stack the agent walked for it): the 15
/// calls of the three paths in the order the program makes them, then
/// printf's, every call with one.
#[test]
fn trace_stacks_shows_each_calls_own_stack() {
    let bin = build("nofp", &["-O2", "-fomit-frame-pointer"]);
    let o = hotprobe_within(
        &[
            "trace",
            "--stacks",
            "libc:malloc",
            "--",
            bin.to_str().unwrap(),
        ],
        LIMIT,
    );
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    let calls: Vec<&str> = out.lines().filter(|l| l.contains("malloc() {")).collect();
    let stacks: Vec<&str> = calls
        .iter()
        .filter_map(|l| l.split_once("malloc() { /* <- ")?.1.strip_suffix(" */"))
        .collect();
    assert_eq!(
        stacks.len(),
        calls.len(),
        "a call without its stack:\n{out}"
    );
    let tail = " <- main <- __libc_start_call_main <- __libc_start_main <- _start";
    let mut want = Vec::new();
    for (path, n) in [
        ("alloc_leaf <- path_a", 3),
        ("alloc_leaf <- path_b", 5),
        ("alloc_leaf <- path_c_inner <- path_c", 7),
    ] {
        want.extend(std::iter::repeat_n(format!("{path}{tail}"), n));
    }
    assert!(stacks.len() > want.len(), "{out}");
    assert_eq!(stacks[..want.len()], want[..], "{out}");
    assert!(
        stacks[want.len()..].iter().all(|s| s.contains("printf")),
        "{out}"
    );
}
