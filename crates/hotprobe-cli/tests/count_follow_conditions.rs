//! Issue 24: `count -f` with conditions, the latency `--hist` and value
//! aggregations. A program forks; its child calls work(0) .. work(9), the
//! parent work(0) .. work(7): each process's row counts its own calls
//! whose condition holds, on the fast path and on the trap, and across an
//! exec (the probes placed in the new image get their spec's condition).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, program_output, text, CountTable};

const LIMIT: Duration = Duration::from_secs(120);

fn build(tag: &str, flags: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/fork_args.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("count_follow_conditions");
    std::fs::create_dir_all(&dir).unwrap();
    gcc(&src, &dir.join(tag), flags)
}

/// The pids the program printed: (parent, child), in the order printed.
fn pids(out: &str) -> Vec<(i32, i32)> {
    let num =
        |l: &str, w: &str| -> Option<i32> { l.strip_prefix(w)?.split(' ').next()?.parse().ok() };
    let children: Vec<i32> = out.lines().filter_map(|l| num(l, "child ")).collect();
    let parents: Vec<i32> = out.lines().filter_map(|l| num(l, "parent ")).collect();
    assert_eq!(children.len(), parents.len(), "{out}");
    parents.into_iter().zip(children).collect()
}

/// Runs `hotprobe ARGS -- CMD`: exit 0, the program's output its own.
fn count(args: &[&str], cmd: &[&str], native: &str) -> (CountTable, String) {
    let all: Vec<&str> = args.iter().chain(&["--"]).chain(cmd).copied().collect();
    let o = hotprobe_within(&all, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    let prog = program_output(&out);
    // The pids differ from run to run: the lines, with pids taken out.
    let strip = |s: &str| -> Vec<String> {
        s.lines()
            .map(|l| {
                l.split(' ')
                    .filter(|w| w.parse::<i32>().is_err())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect()
    };
    assert_eq!(strip(prog), strip(native), "{err}");
    (CountTable::parse(&out, &err), out)
}

fn native(cmd: &[&str]) -> String {
    let o = Command::new(cmd[0]).args(&cmd[1..]).output().unwrap();
    assert!(o.status.success());
    text(&o.stdout)
}

#[test]
fn conditions_count_per_process_under_follow_forks() {
    // -O0: work() takes a jump (agent); -O1 on the trap.
    for (tag, flags, extra) in [
        ("o0", &["-O0"][..], &[][..]),
        ("o1", &["-O1"][..], &["--mechanism", "trap"][..]),
    ] {
        let bin = build(tag, flags);
        let cmd = [bin.to_str().unwrap()];
        let nat = native(&cmd);
        let args: Vec<&str> = ["count", "-f"]
            .iter()
            .chain(extra)
            .chain(&["work if arg0 > 5"])
            .copied()
            .collect();
        let (table, out) = count(&args, &cmd, &nat);
        let [(parent, child)] = pids(&out)[..] else {
            panic!("{out}")
        };
        // Child: 6, 7, 8, 9; parent: 6, 7.
        assert_eq!(table.hits_of("work", child), 4, "{tag}");
        assert_eq!(table.hits_of("work", parent), 2, "{tag}");
        assert_eq!(table.rows_of("work").len(), 2, "{tag}: {out}");

        // The latency histogram: every call, per process; the histogram
        // over both.
        let args: Vec<&str> = ["count", "-f", "--hist"]
            .iter()
            .chain(extra)
            .chain(&["work"])
            .copied()
            .collect();
        let (table, out) = count(&args, &cmd, &nat);
        let [(parent, child)] = pids(&out)[..] else {
            panic!("{out}")
        };
        assert_eq!(table.hits_of("work", child), 10, "{tag}");
        assert_eq!(table.hits_of("work", parent), 8, "{tag}");
        assert!(out.contains("# work: 18 calls"), "{tag}: {out}");
    }
}

#[test]
fn aggregations_with_conditions_under_follow_forks() {
    let bin = build("o0", &["-O0"]);
    let cmd = [bin.to_str().unwrap()];
    let nat = native(&cmd);
    let (table, out) = count(
        &[
            "count",
            "-f",
            "--no-follow-exec",
            "--lhist=arg0:0:10:5",
            "work if arg0 > 5",
        ],
        &cmd,
        &nat,
    );
    let [(parent, child)] = pids(&out)[..] else {
        panic!("{out}")
    };
    assert_eq!(table.hits_of("work", child), 4);
    assert_eq!(table.hits_of("work", parent), 2);
    // Over both processes: 6 and 7 twice, 8 and 9 once.
    let bucket = out
        .lines()
        .find(|l| l.starts_with("[5, 10)"))
        .unwrap_or_else(|| panic!("{out}"));
    assert_eq!(bucket.split_whitespace().nth(2), Some("6"), "{out}");
    assert!(!out.contains("[0, 5)"), "no call below 5 counted: {out}");

    // Across exec, the aggregation and its condition are refused, and say why.
    let o = hotprobe_within(
        &[
            "count",
            "-f",
            "--lhist=arg0:0:10:5",
            "work if arg0 > 5",
            "--",
            cmd[0],
        ],
        LIMIT,
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        text(&o.stderr).contains("add --no-follow-exec"),
        "{}",
        text(&o.stderr)
    );
}

#[test]
fn conditions_follow_exec_into_each_program() {
    let bin = build("o0", &["-O0"]);
    let trap = build("o1", &["-O1"]);
    let script = format!("{}; {}", bin.display(), trap.display());
    let cmd = ["sh", "-c", script.as_str()];
    let nat = native(&cmd);
    let (table, out) = count(&["count", "-f", "work if arg0 > 5"], &cmd, &nat);
    let runs = pids(&out);
    assert_eq!(runs.len(), 2, "{out}");
    for (parent, child) in runs {
        assert_eq!(table.hits_of("work", child), 4, "{out}");
        assert_eq!(table.hits_of("work", parent), 2, "{out}");
    }
}

/// An aggregation under -f across exec: the programs the shell executes
/// run on traps (no agent in them) and their entries are not aggregated;
/// that is said, with the way out, and their hits are still in the table
/// (before, the aggregation section was silently missing; found by review).
#[test]
fn an_aggregation_across_exec_says_what_it_did_not_aggregate() {
    let bin = build("o0", &["-O0"]);
    let script = format!("{}; {}", bin.display(), bin.display());
    let cmd = ["sh", "-c", script.as_str()];
    let all = ["count", "-f", "work", "--hist=arg0", "--"]
        .into_iter()
        .chain(cmd)
        .collect::<Vec<_>>();
    let o = hotprobe_within(&all, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    assert!(
        err.contains("hist(arg0): not aggregated for 2 probes placed in programs started by exec"),
        "{err}"
    );
    let table = CountTable::parse(&out, &err);
    let runs = pids(&out);
    assert_eq!(runs.len(), 2, "{out}");
    for (parent, child) in runs {
        assert_eq!(table.hits_of("work", child), 10, "{out}");
        assert_eq!(table.hits_of("work", parent), 8, "{out}");
    }
}

/// A condition naming a parameter (`n`, from the DWARF) under -f: in a
/// program that never executes another (no refusal any more), and in
/// each program a shell executes, compiled there from that program's own
/// DWARF (an -O0 build on the trap, an -O1 one). Each process's row has
/// exactly its calls with n > 5.
#[test]
fn conditions_naming_parameters_follow_exec_into_each_program() {
    let bin = build("o0", &["-O0"]);
    let trap = build("o1", &["-O1"]);
    let cmd = [bin.to_str().unwrap()];
    let (table, out) = count(&["count", "-f", "work if n > 5"], &cmd, &native(&cmd));
    let [(parent, child)] = pids(&out)[..] else {
        panic!("{out}")
    };
    assert_eq!(table.hits_of("work", child), 4, "{out}");
    assert_eq!(table.hits_of("work", parent), 2, "{out}");

    let script = format!("{}; {}", bin.display(), trap.display());
    let cmd = ["sh", "-c", script.as_str()];
    let nat = native(&cmd);
    for cond in ["work if n > 5", "work if n > 5 && arg0 >= 0"] {
        let (table, out) = count(&["count", "-f", cond], &cmd, &nat);
        let runs = pids(&out);
        assert_eq!(runs.len(), 2, "{out}");
        for (parent, child) in runs {
            assert_eq!(table.hits_of("work", child), 4, "{cond}: {out}");
            assert_eq!(table.hits_of("work", parent), 2, "{cond}: {out}");
        }
        assert_eq!(table.rows_of("work").len(), 4, "{cond}: {out}");
    }
}

/// Where the condition does not compile in a program a shell executes (a
/// build without DWARF; one whose work() calls its parameter `count`),
/// that is said, naming the process, and its hits are not counted: their
/// number is said at the end. The program with the parameter still
/// counts exactly.
#[test]
fn a_condition_that_does_not_compile_in_an_executed_program_is_said() {
    let bin = build("o0", &["-O0"]);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("count_follow_conditions");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/fork_args.c");
    // Without -g: no DWARF.
    let nodwarf = hotprobe_testkit::compile("gcc", &src, &dir.join("nodwarf"), &["-O0"], &[]);
    let renamed = gcc(&src, &dir.join("renamed"), &["-O0", "-Dn=count"]);
    let script = format!(
        "{}; {}; {}",
        bin.display(),
        nodwarf.display(),
        renamed.display()
    );
    let cmd = ["sh", "-c", script.as_str()];
    let all = ["count", "-f", "work if n > 5", "--"]
        .into_iter()
        .chain(cmd)
        .collect::<Vec<_>>();
    let o = hotprobe_within(&all, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    let runs = pids(&out);
    assert_eq!(runs.len(), 3, "{out}");
    let table = CountTable::parse(&out, &err);
    let (first_parent, first_child) = runs[0];
    assert_eq!(table.hits_of("work", first_child), 4, "{out}");
    assert_eq!(table.hits_of("work", first_parent), 2, "{out}");
    // Where the condition did not compile, the rows do not claim 0: `-`,
    // and the footnote says why.
    let (pid, hits) = (table.col("PID"), table.col("HITS"));
    for (parent, child) in &runs[1..] {
        for p in [parent, child] {
            let row = table
                .rows_of("work")
                .into_iter()
                .find(|r| r[pid] == p.to_string())
                .unwrap_or_else(|| panic!("no row of pid {p}:\n{out}"));
            assert_eq!(row[hits], "-", "{out}");
        }
    }
    assert!(out.contains("\nHITS -: not counted: "), "{out}");
    let said = |pid: i32, comm: &str, why: &str| {
        format!(
            "hotprobe: pid {pid} ({comm}): `work if n > 5`: {why}; its hits there are not counted"
        )
    };
    let (nodwarf_pid, renamed_pid) = (runs[1].0, runs[2].0);
    assert!(
        err.contains(&said(
            nodwarf_pid,
            "nodwarf",
            "the condition names a parameter, and work has no DWARF (build with -g)"
        )),
        "{err}"
    );
    assert!(
        err.contains(&said(
            renamed_pid,
            "renamed",
            "the condition: work has no parameter n; its parameters: count"
        )),
        "{err}"
    );
    // Two programs of 18 calls each (parent and child).
    assert!(
        err.contains(
            "hotprobe: 36 hits not counted: their condition does not compile in the program they \
             were in (said above)"
        ),
        "{err}"
    );
}

/// `count --exe` with a condition naming a parameter: each process that
/// starts later gets it compiled from its DWARF (read in that process),
/// a row per process with its calls with n > 5 (the parent's work(0) ..
/// work(7): 6 and 7; its forked child is let go without probes). Needs
/// root, as --exe does.
#[test]
fn conditions_naming_parameters_in_processes_started_later() {
    use std::io::{BufRead, BufReader, Read};
    use std::process::Stdio;
    let bin = build("exe", &["-O0"]);
    let mut c = Command::new(common::HOTPROBE)
        .args(["count", "--exe", bin.to_str().unwrap(), "work if n > 5"])
        .args(["--duration", "120"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(c.stderr.take().unwrap());
    let mut seen = String::new();
    // Until it waits: a process started after that line is taken.
    while !seen.contains("waiting for processes") {
        let mut l = String::new();
        assert!(err.read_line(&mut l).unwrap() > 0, "{seen}");
        seen.push_str(&l);
    }
    let runs: Vec<String> = (0..2).map(|_| native(&[bin.to_str().unwrap()])).collect();
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(c.id() as i32, libc::SIGINT) };
    let mut out = String::new();
    c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    err.read_to_string(&mut seen).unwrap();
    assert_eq!(c.wait().unwrap().code(), Some(0), "{seen}");
    let table = CountTable::parse(&out, &seen);
    assert_eq!(table.rows_of("work").len(), 2, "{}", table.all);
    for run in runs {
        let [(parent, _)] = pids(&run)[..] else {
            panic!("{run}")
        };
        assert_eq!(table.hits_of("work", parent), 2, "{}", table.all);
    }
    assert!(!seen.contains("not counted"), "{seen}");
}
