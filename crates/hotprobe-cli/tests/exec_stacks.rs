//! Issue 24, `count -f --stacks` across exec: the program a shell
//! executes gets stack tables of its own (published as its probes are
//! placed and its libraries load, walked on the trap: no agent is in it),
//! so its three known call paths to malloc (stack_paths.c: 3, 5 and 7
//! times) come out with those counts, named with its own symbols, while
//! the shell's stacks stay named with the shell's. With dash (which
//! vforks the command) and bash (which executes it in its own process,
//! where the agent served the shell's probes: arming the program's probe
//! on the old agent's trampoline killed it with SIGSEGV). The program's
//! output and status are its own.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, text, CountTable};

const LIMIT: Duration = Duration::from_secs(120);

/// One block of `--stacks` output.
#[derive(Debug)]
struct Stack {
    count: u64,
    frames: Vec<String>,
    truncated: bool,
}

/// Every `stacks of LABEL` section of stdout, in order.
fn sections(stdout: &str, label: &str) -> Vec<Vec<Stack>> {
    let head = format!("stacks of {label} (most frequent first):");
    let mut out: Vec<Vec<Stack>> = Vec::new();
    let mut inside = false;
    for l in stdout.lines() {
        if l == head {
            out.push(Vec::new());
            inside = true;
            continue;
        }
        if l.is_empty() || l.starts_with("stacks of") {
            inside = false;
            continue;
        }
        let Some(sec) = out.last_mut().filter(|_| inside) else {
            continue;
        };
        if let Ok(n) = l.trim().parse::<u64>() {
            sec.push(Stack {
                count: n,
                frames: Vec::new(),
                truncated: false,
            });
        } else if let Some(s) = sec.last_mut() {
            match l.trim() {
                "[truncated]" => s.truncated = true,
                f => s.frames.push(f.to_string()),
            }
        }
    }
    out
}

/// tests/programs/stack_paths.c built with `flags` as `name`.
fn stack_paths(name: &str, flags: &[&str]) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("exec-stacks");
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/stack_paths.c");
    gcc(&src, &dir.join(name), flags)
}

/// The three paths of stack_paths.c (7, 5 and 3 calls of malloc), each
/// once among `prog`'s stacks with its count, whole, from `_start`.
fn assert_three_paths(prog: &[Stack], what: &str, out: &str) {
    for (path, count) in [
        (&["alloc_leaf", "path_c_inner", "path_c", "main"][..], 7),
        (&["alloc_leaf", "path_b", "main"][..], 5),
        (&["alloc_leaf", "path_a", "main"][..], 3),
    ] {
        let found: Vec<&Stack> = prog
            .iter()
            .filter(|s| s.frames.len() > path.len() && s.frames[..path.len()] == *path)
            .collect();
        assert_eq!(found.len(), 1, "{what}: {path:?} in\n{out}");
        assert_eq!(found[0].count, count, "{what}: {path:?}:\n{out}");
        assert!(!found[0].truncated, "{what}: {:?}", found[0]);
        assert_eq!(
            found[0].frames.last().map(String::as_str),
            Some("_start"),
            "{what}: {:?}",
            found[0]
        );
    }
}

#[test]
fn count_stacks_of_a_program_executed_by_a_shell() {
    let bin = stack_paths("paths", &["-O2", "-fomit-frame-pointer"]);
    let native = Command::new(&bin).output().unwrap();
    assert!(native.status.success());
    assert_eq!(text(&native.stdout), "allocated 15\n");
    let script = format!("{}; exit 3", bin.display());
    let direct = bin.to_str().unwrap();
    for (sh, cmd, status) in [
        ("sh", script.as_str(), 3),
        ("bash", direct, 0),
        ("sh-exec", &*format!("exec {direct}"), 0),
    ] {
        let shell = if sh == "bash" { "bash" } else { "sh" };
        let o = hotprobe_within(
            &[
                "count",
                "-f",
                "--stacks",
                "libc:malloc",
                "--",
                shell,
                "-c",
                cmd,
            ],
            LIMIT,
        );
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert_eq!(o.status.code(), Some(status), "{sh}: {out}\n{err}");
        assert!(out.starts_with("allocated 15\n"), "{sh}: {out}\n{err}");
        let t = CountTable::parse(&out, &err);
        let (comm, hits) = (t.col("COMM"), t.col("HITS"));
        let mine: Vec<u64> = t
            .rows_of("libc:malloc")
            .into_iter()
            .filter(|r| r[comm] == "paths")
            .map(|r| r[hits].parse().unwrap())
            .collect();
        // The 15 of the three paths and printf's buffer.
        assert_eq!(mine, [16], "{sh}: {}", t.all);

        // Two sections, the shell's probe's and the program's: the
        // program's has its paths, and the shell's every hit of the
        // shell (its stacks named with the shell's modules, none of the
        // program's functions among them).
        let all = sections(&out, "libc:malloc");
        assert_eq!(all.len(), 2, "{sh}:\n{out}");
        let names_prog = |sec: &Vec<Stack>| {
            sec.iter()
                .any(|s| s.frames.iter().any(|f| f.starts_with("path_")))
        };
        let (prog, shells): (Vec<_>, Vec<_>) = all.iter().partition(|sec| names_prog(sec));
        assert_eq!(prog.len(), 1, "{sh}: one section of the program:\n{out}");
        let shell_hits: u64 = t
            .rows_of("libc:malloc")
            .into_iter()
            .filter(|r| r[comm] != "paths")
            .map(|r| r[hits].parse::<u64>().unwrap())
            .sum();
        let shell_stacks: u64 = shells[0].iter().map(|s| s.count).sum();
        assert!(shell_hits > 0, "{sh}: {}", t.all);
        assert_eq!(shell_stacks, shell_hits, "{sh}:\n{out}");
        let prog = prog[0];
        assert_three_paths(prog, sh, &format!("{out}\n{err}"));
        // Every hit of the program has its stack.
        let total: u64 = prog.iter().map(|s| s.count).sum();
        assert_eq!(total, 16, "{sh}:\n{out}");
    }
}

/// `trace -f --stacks`: the stacks printed after the calls include the
/// executed program's section, with its three paths and their counts.
#[test]
fn trace_stacks_of_a_program_executed_by_a_shell() {
    let bin = stack_paths("paths-trace", &["-O2", "-fomit-frame-pointer"]);
    let o = hotprobe_within(
        &[
            "trace",
            "-f",
            "--stacks",
            "libc:malloc",
            "--",
            "sh",
            "-c",
            bin.to_str().unwrap(),
        ],
        LIMIT,
    );
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("allocated 15\n"), "{out}\n{err}");
    let prog: Vec<Vec<Stack>> = sections(&out, "libc:malloc")
        .into_iter()
        .filter(|sec| {
            sec.iter()
                .any(|s| s.frames.iter().any(|f| f.starts_with("path_")))
        })
        .collect();
    assert_eq!(prog.len(), 1, "one section of the program:\n{out}");
    assert_three_paths(&prog[0], "trace", &format!("{out}\n{err}"));
}

/// `record -f --stacks`: the trace's stacks.tsv has the executed
/// program's three paths with their counts, beside the shell's stacks.
#[test]
fn record_stacks_of_a_program_executed_by_a_shell() {
    let bin = stack_paths("paths-rec", &["-O1"]);
    let trace = bin.with_file_name("trace");
    let o = hotprobe_within(
        &[
            "record",
            "--force",
            "-f",
            "--stacks",
            "-o",
            trace.to_str().unwrap(),
            "libc:malloc",
            "--",
            "sh",
            "-c",
            bin.to_str().unwrap(),
        ],
        LIMIT,
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_eq!(text(&o.stdout), "allocated 15\n", "{err}");
    let tsv = std::fs::read_to_string(trace.join("stacks.tsv")).unwrap();
    // COUNT, TRUNCATED, FUNCTION, callers joined with `;`.
    let tail = ";main;__libc_start_call_main;__libc_start_main;_start";
    for (path, count) in [
        ("alloc_leaf;path_c_inner;path_c", 7),
        ("alloc_leaf;path_b", 5),
        ("alloc_leaf;path_a", 3),
    ] {
        let want = format!("{count}\t0\tlibc:malloc\t{path}{tail}");
        assert_eq!(
            tsv.lines().filter(|l| *l == want).count(),
            1,
            "{want:?} in\n{tsv}\n{err}"
        );
    }
    let others = tsv.lines().filter(|l| !l.contains("alloc_leaf")).count();
    assert!(others > 1, "the shell's stacks and printf's too:\n{tsv}");
    // The writer keeps the executed program's calls (its probe, placed
    // before libc was loaded, is named malloc as the include is): 16
    // calls of malloc in the program, none filtered out.
    assert!(err.contains("pattern 0;"), "{err}");
    let o = hotprobe_within(&["report", "--json", trace.to_str().unwrap()], LIMIT);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let calls: Vec<u64> = v["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["function"] == "malloc")
        .map(|r| r["calls"].as_u64().unwrap())
        .collect();
    assert!(calls.contains(&16), "{calls:?}: {v}");
}
