//! Issue 22: vfork children the agent's interposers do not see — made by
//! a `syscall` instruction of the program's own (clone3 with `CLONE_VM |
//! CLONE_VFORK` in inline assembly) or inside glibc (`system`'s internal
//! posix_spawn) — count as their own processes. Before, a raw clone3
//! child's 400 calls were in its parent's row (1400) and `system`'s
//! child's `execve` was the parent's. The tracer sees every vfork and
//! tells the agent, in the child before it runs and in the parent before
//! it runs on. And posix_spawn (interposed) with a known number of calls
//! in its child: 25 `dup2`s of its file actions, the parent's own 7.
//! And return probes on the ptrace trap: a vfork child's returns were
//! counted as its parent's (`f%return`: parent 1400, child 0).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, program_output, text, CountTable};

const LIMIT: Duration = Duration::from_secs(120);

fn program() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/vfork_unseen.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("vfork-unseen");
    std::fs::create_dir_all(&dir).unwrap();
    gcc(&src, &dir.join("vfork_unseen"), &["-O1"])
}

/// The program's output but its last line, and the two pids there.
fn split_pids(out: &str) -> (&str, i32, i32) {
    let body = out.trim_end_matches('\n');
    let (head, last) = body.rsplit_once('\n').unwrap_or(("", body));
    let pid = |k: &str| -> i32 {
        last.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {last:?}"))
    };
    (head, pid("parent="), pid("child="))
}

/// `hotprobe count [-f] MECHANISM PROBES -- BIN HOW`: the program's output
/// as natively, and the table.
fn run(how: &str, follow: bool, mechanism: &[&str], probes: &[&str]) -> (i32, i32, CountTable) {
    let bin = program();
    let native = Command::new(&bin).arg(how).output().unwrap();
    assert_eq!(native.status.code(), Some(7), "{how} natively");
    let native = text(&native.stdout);
    let (want, _, _) = split_pids(&native);
    let mut args = vec!["count"];
    if follow {
        args.push("-f");
    }
    args.extend(mechanism);
    args.extend(probes);
    args.extend(["--", bin.to_str().unwrap(), how]);
    let o = hotprobe_within(&args, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    let ctx = format!("{args:?}\n{out}\n{err}");
    assert_eq!(o.status.code(), Some(7), "{ctx}");
    let (got, parent, child) = split_pids(program_output(&out));
    assert_eq!(got, want, "{ctx}");
    (parent, child, CountTable::parse(&out, &err))
}

#[test]
fn a_raw_clone3_vfork_child_has_its_own_row() {
    for mechanism in [&[][..], &["--mechanism", "trap"][..]] {
        let (parent, child, t) = run("raw", true, mechanism, &["leaf"]);
        assert_eq!(t.hits_of("leaf", parent), 1000, "{}", t.all);
        assert_eq!(t.hits_of("leaf", child), 400, "{}", t.all);
        let (_, child, t) = run("raw", false, mechanism, &["leaf"]);
        assert_eq!(t.hits("leaf"), 1000, "{}", t.all);
        let line = format!(
            "hotprobe: leaf: 400 hits in vfork child {child} not counted \
             (-f counts them as its own)"
        );
        assert_eq!(
            t.all.lines().filter(|l| *l == line).count(),
            1,
            "{line}\n{}",
            t.all
        );
    }
}

#[test]
fn a_system_child_has_its_own_execve() {
    for mechanism in [&[][..], &["--mechanism", "trap"][..]] {
        let (parent, _, t) = run("system", true, mechanism, &["leaf", "execve"]);
        assert_eq!(t.hits_of("leaf", parent), 1000, "{}", t.all);
        assert_eq!(t.hits_of("execve", parent), 0, "{}", t.all);
        let pid_col = t.col("PID");
        let children: Vec<_> = t
            .rows_of("execve")
            .into_iter()
            .filter(|r| r[pid_col] != parent.to_string())
            .collect();
        assert_eq!(children.len(), 1, "{}", t.all);
        assert_eq!(children[0][t.col("HITS")], "1", "{}", t.all);
    }
}

#[test]
fn a_posix_spawn_child_has_its_own_calls() {
    let (parent, child, t) = run("spawn", true, &[], &["dup2"]);
    assert_eq!(t.hits_of("dup2", parent), 7, "{}", t.all);
    assert_eq!(t.hits_of("dup2", child), 25, "{}", t.all);
}

/// `leaf%return` on the ptrace trap: each process's returns in its own
/// row with `-f`, the child's said not counted without it.
#[test]
fn a_vfork_childs_returns_are_its_own_on_the_trap() {
    for how in ["vfork", "raw"] {
        let probes = ["leaf%return", "leaf"];
        let (parent, child, t) = run(how, true, &["--mechanism", "trap"], &probes);
        for p in probes {
            assert_eq!(t.hits_of(p, parent), 1000, "{how} {p}: {}", t.all);
            assert_eq!(t.hits_of(p, child), 400, "{how} {p}: {}", t.all);
        }
        let (_, child, t) = run(how, false, &["--mechanism", "trap"], &["leaf%return"]);
        assert_eq!(t.hits("leaf%return"), 1000, "{how}: {}", t.all);
        let line = format!(
            "hotprobe: leaf%return: 400 hits in vfork child {child} not counted \
             (-f counts them as its own)"
        );
        assert_eq!(
            t.all.lines().filter(|l| *l == line).count(),
            1,
            "{line}\n{}",
            t.all
        );
    }
}

/// An agent injected into a running process binds none of its
/// interposers: a plain vfork() child counted as its parent (1400 in one
/// row). Attached with `-p -f` while the program waits, then let go: each
/// process has its own row.
#[test]
fn a_vfork_child_of_an_attached_process_has_its_own_row() {
    use std::io::{BufRead, BufReader, Write};
    use std::process::Stdio;
    for how in ["vfork", "raw"] {
        let mut prog = Command::new(program())
            .args([how, "wait"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = BufReader::new(prog.stdout.take().unwrap());
        let mut ready = String::new();
        out.read_line(&mut ready).unwrap();
        assert_eq!(ready, "ready\n");
        let pid = prog.id().to_string();
        let mut stdin = prog.stdin.take().unwrap();
        let (printed, status, stdout, stderr) =
            common::while_attached(&["count", "-f", "-p", &pid, "leaf"], || {
                stdin.write_all(b"go\n").unwrap();
                let mut rest = String::new();
                std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
                rest
            });
        assert!(prog.wait().unwrap().code() == Some(7), "{how}: {stderr}");
        let ctx = format!("{how}\n{printed}\n{stdout}\n{stderr}");
        // hotprobe exits with the status of the process it followed.
        assert_eq!(status.code(), Some(7), "{ctx}");
        assert!(stderr.contains("exited with code 7"), "{ctx}");
        let (got, parent, child) = split_pids(&printed);
        assert_eq!(
            got,
            format!("{how}: parent calls=1000 child calls=400 child status=3"),
            "{ctx}"
        );
        let t = CountTable::parse(&stdout, &stderr);
        let exec = t.col("EXECUTION");
        assert!(t.rows_of("leaf").iter().all(|r| r[exec] == "jump"), "{ctx}");
        assert_eq!(t.hits_of("leaf", parent), 1000, "{ctx}");
        assert_eq!(t.hits_of("leaf", child), 400, "{ctx}");
    }
}
