//! Issue 22: `-f` with vfork and clone3(CLONE_VFORK) gives each process
//! its own calls. A vfork child runs in its parent's memory, on its
//! thread pointer: before, its hits counted as the parent's (one row,
//! 2500 hits) on every mechanism. Now, with `-f`, the parent's row has
//! its 1500 calls and the child's row (its pid) its 1000; without `-f`,
//! the parent's row has its 1500 and the child's calls are said not to be
//! counted. Made by vfork(), glibc's clone(CLONE_VFORK) and clone3
//! through syscall(); `leaf` goes to a jump, `leaf4` (4 bytes) to the
//! in-process trap, and both to the ptrace trap with `--mechanism trap`.
//! The libc function that makes the child is probed too: its one call is
//! the parent's. `record` keeps the child's events under its own thread
//! id with `-f`, and without it records none of them and says how many.
//! And posix_spawn, whose child (glibc's internal
//! clone(CLONE_VFORK)) calls execve once, made before the parent's first
//! probed call: before, the child registered the parent's thread and
//! the parent's later calls all counted as the child's.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, program_output, text, CountTable};

const LIMIT: Duration = Duration::from_secs(120);

fn program() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/vfork_counts.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("vfork-counts");
    std::fs::create_dir_all(&dir).unwrap();
    // -no-pie: its 4-byte functions stay on the in-process trap these
    // tests are about (in a PIE they take a punned jump; a non-PIE's
    // punned-jump copies would fall below address 0).
    gcc(&src, &dir.join("vfork_counts"), &["-O1", "-no-pie"])
}

/// The program's output but its last line (the pids), and the pids.
fn split_pids(out: &str) -> (&str, i32, i32) {
    let body = out.trim_end_matches('\n');
    let (head, last) = body.rsplit_once('\n').unwrap_or(("", body));
    let pid = |k: &str| -> i32 {
        last.split_whitespace()
            .find_map(|w| w.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {last:?}"))
    };
    let parent = pid("parent=");
    let child = pid("child=");
    (head, parent, child)
}

fn check(how: &str, mechanism: &[&str], follow: bool) {
    let bin = program();
    let b = bin.to_str().unwrap();
    let native = Command::new(&bin).arg(how).output().unwrap();
    assert_eq!(native.status.code(), Some(7), "{how} natively");
    let native = text(&native.stdout);
    let (want, _, _) = split_pids(&native);
    let child_calls = if how == "vfork4" { "leaf4" } else { "calls" };
    assert_eq!(
        want,
        format!("{how}: parent calls=1500 child {child_calls}=1000 child status=3")
    );
    let mut args = vec!["count"];
    if follow {
        args.push("-f");
    }
    args.extend(mechanism);
    // The libc function that makes the child, probed too: one call, the
    // parent's (its hit lies between the agent's interposer and the
    // system call).
    let maker = match how {
        "vfork" | "vfork0" | "vfork4" => "vfork",
        "clone" => "clone",
        _ => "syscall",
    };
    args.extend(["leaf", "leaf4", maker, "--", b, how]);
    let o = hotprobe_within(&args, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    let ctx = format!("{args:?}\n{out}\n{err}");
    assert_eq!(o.status.code(), Some(7), "{ctx}");
    assert!(err.contains("exited with code 7"), "{ctx}");
    let (got, parent, child) = split_pids(program_output(&out));
    assert_eq!(got, want, "{ctx}");
    let t = CountTable::parse(&out, &err);
    let execution = |probe: &str| {
        let c = t.col("EXECUTION");
        t.rows_of(probe)[0][c].clone()
    };
    if mechanism.is_empty() {
        assert_eq!(execution("leaf"), "jump", "{ctx}");
        assert_eq!(execution("leaf4"), "in-process", "{ctx}");
    } else {
        assert_eq!(execution("leaf"), "trap", "{ctx}");
        assert_eq!(execution("leaf4"), "trap", "{ctx}");
    }
    assert_eq!(t.rows_of(maker).len(), 1, "{ctx}");
    if follow {
        assert_eq!(t.hits_of(maker, parent), 1, "{ctx}");
    } else {
        assert_eq!(t.hits(maker), 1, "{ctx}");
    }
    for probe in ["leaf", "leaf4"] {
        if how == "vfork4" && probe == "leaf" {
            // Not called by the child.
            assert_eq!(t.rows_of(probe).len(), 1, "{ctx}");
            assert_eq!(t.rows_of(probe)[0][t.col("HITS")], "1500", "{ctx}");
            continue;
        }
        let not_counted = format!(
            "hotprobe: {probe}: 1000 hits in vfork child {child} not counted \
             (-f counts them as its own)"
        );
        if follow {
            assert_eq!(t.rows_of(probe).len(), 2, "{ctx}");
            assert_eq!(t.hits_of(probe, parent), 1500, "{ctx}");
            assert_eq!(t.hits_of(probe, child), 1000, "{ctx}");
            assert!(!err.contains("not counted"), "{ctx}");
        } else {
            assert_eq!(t.hits(probe), 1500, "{ctx}");
            assert_eq!(
                err.lines().filter(|l| *l == not_counted).count(),
                1,
                "{not_counted}\n{ctx}"
            );
        }
    }
}

#[test]
fn vfork_child_has_its_own_row_on_jump_and_in_process_trap() {
    check("vfork", &[], true);
}

#[test]
fn vfork_child_has_its_own_row_on_the_trap() {
    check("vfork", &["--mechanism", "trap"], true);
}

/// A child whose only probed calls are an in-process trap's count site:
/// its first hit is in the agent's `SIGTRAP` handler, which claims its
/// slot (before, it counted into the process's global counters).
#[test]
fn vfork_child_with_in_process_hits_only_has_its_own_row() {
    check("vfork4", &[], true);
    check("vfork4", &[], false);
}

/// The case: the parent's thread made no probed call before the
/// child's (before: the child registered it, and every later call of the
/// parent's counted as the child's).
#[test]
fn vfork_child_before_any_call_of_the_parent_has_its_own_row() {
    check("vfork0", &[], true);
    check("vfork0", &["--mechanism", "trap"], true);
    check("vfork0", &[], false);
}

#[test]
fn clone_vfork_child_has_its_own_row_on_every_mechanism() {
    check("clone", &[], true);
    check("clone", &["--mechanism", "trap"], true);
}

#[test]
fn clone3_vfork_child_has_its_own_row_on_every_mechanism() {
    check("clone3", &[], true);
    check("clone3", &["--mechanism", "trap"], true);
}

#[test]
fn without_follow_a_vfork_child_is_not_counted_and_said_so() {
    for how in ["vfork", "clone", "clone3"] {
        check(how, &[], false);
        check(how, &["--mechanism", "trap"], false);
    }
}

fn check_spawn(mechanism: &[&str], follow: bool) {
    let bin = program();
    let b = bin.to_str().unwrap();
    let native = Command::new(&bin).arg("spawn").output().unwrap();
    assert_eq!(native.status.code(), Some(7), "spawn natively");
    let native = text(&native.stdout);
    let (want, _, _) = split_pids(&native);
    assert_eq!(
        want,
        "spawn: parent calls=1500 child execve=1 child status=0"
    );
    let mut args = vec!["count"];
    if follow {
        args.push("-f");
    }
    args.extend(mechanism);
    args.extend(["leaf", "leaf4", "posix_spawn", "execve", "--", b, "spawn"]);
    let o = hotprobe_within(&args, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    let ctx = format!("{args:?}\n{out}\n{err}");
    assert_eq!(o.status.code(), Some(7), "{ctx}");
    let (got, parent, child) = split_pids(program_output(&out));
    assert_eq!(got, want, "{ctx}");
    let t = CountTable::parse(&out, &err);
    let not_counted = format!(
        "hotprobe: execve: 1 hit in vfork child {child} not counted (-f counts them as its own)"
    );
    if follow {
        for (probe, n) in [("leaf", 1500), ("leaf4", 1500), ("posix_spawn", 1)] {
            assert_eq!(t.rows_of(probe).len(), 1, "{probe}: {ctx}");
            assert_eq!(t.hits_of(probe, parent), n, "{probe}: {ctx}");
        }
        assert_eq!(t.hits_of("execve", parent), 0, "{ctx}");
        assert_eq!(t.hits_of("execve", child), 1, "{ctx}");
        assert!(!err.contains("not counted"), "{ctx}");
    } else {
        for (probe, n) in [
            ("leaf", 1500),
            ("leaf4", 1500),
            ("posix_spawn", 1),
            ("execve", 0),
        ] {
            assert_eq!(t.hits(probe), n, "{probe}: {ctx}");
        }
        assert_eq!(
            err.lines().filter(|l| *l == not_counted).count(),
            1,
            "{not_counted}\n{ctx}"
        );
        assert_eq!(err.matches("not counted").count(), 1, "{ctx}");
    }
}

#[test]
fn posix_spawn_child_has_its_own_calls_and_the_parent_keeps_its_own() {
    for follow in [true, false] {
        check_spawn(&[], follow);
        check_spawn(&["--mechanism", "trap"], follow);
    }
}

/// `n` vfork children, one after the other, while another thread of the
/// parent calls the probed functions all along: the parent's row holds
/// its two threads' calls exactly; with `-f` each child's row its own 100,
/// and a child that found no free thread slot (the shared memory has a
/// fixed number) counts its hits as missed (NMISSED of the parent's row),
/// never as the parent's; without `-f` one line says how many hits of how
/// many children were not counted.
fn check_many(n: u64) {
    let bin = program();
    let b = bin.to_str().unwrap();
    let arg = n.to_string();
    let native = Command::new(&bin).args(["many", &arg]).output().unwrap();
    assert_eq!(native.status.code(), Some(7), "many natively");
    let native = text(&native.stdout);
    let (want, _, _) = split_pids(&native);
    let parent_calls = 200_000 + n;
    assert_eq!(
        want,
        format!("many: parent calls={parent_calls} children={n} child calls=100")
    );
    for mechanism in [&[][..], &["--mechanism", "trap"][..]] {
        for follow in [true, false] {
            let mut args = vec!["count"];
            if follow {
                args.push("-f");
            }
            args.extend(mechanism);
            args.extend(["leaf", "leaf4", "--", b, "many", &arg]);
            let o = hotprobe_within(&args, LIMIT);
            let (out, err) = (text(&o.stdout), text(&o.stderr));
            let ctx = format!("{args:?}\n{out}\n{err}");
            assert_eq!(o.status.code(), Some(7), "{ctx}");
            let (got, parent, _) = split_pids(program_output(&out));
            assert_eq!(got, want, "{ctx}");
            let t = CountTable::parse(&out, &err);
            let (hits, nmissed) = (t.col("HITS"), t.col("NMISSED"));
            for probe in ["leaf", "leaf4"] {
                let rows = t.rows_of(probe);
                let mine =
                    |r: &&&Vec<String>| r[t.col("PROBE") + follow as usize] == parent.to_string();
                let num = |r: &Vec<String>, c: usize| -> u64 { r[c].parse().unwrap() };
                let (parent_row, children): (Vec<_>, Vec<_>) = if follow {
                    rows.iter().partition(mine)
                } else {
                    (rows.iter().collect(), Vec::new())
                };
                assert_eq!(parent_row.len(), 1, "{ctx}");
                assert_eq!(num(parent_row[0], hits), parent_calls, "{probe}: {ctx}");
                let missed = num(parent_row[0], nmissed);
                assert_eq!(missed % 100, 0, "{probe}: {ctx}");
                if follow {
                    for c in &children {
                        assert_eq!(num(c, hits), 100, "{probe}: {ctx}");
                    }
                    let counted = children.len() as u64 * 100;
                    assert_eq!(counted + missed, n * 100, "{probe}: {ctx}");
                    assert!(!err.contains("not counted"), "{ctx}");
                } else {
                    let k = n - missed / 100;
                    let line = if k == 1 {
                        String::new()
                    } else {
                        format!(
                            "hotprobe: {probe}: {} hits in {k} vfork children not counted \
                             (-f counts them as their own)",
                            k * 100
                        )
                    };
                    assert_eq!(
                        err.lines().filter(|l| *l == line).count(),
                        1,
                        "{line}\n{ctx}"
                    );
                }
            }
        }
    }
}

#[test]
fn many_vfork_children_beside_a_busy_thread_count_exactly() {
    check_many(50);
}

/// More children than the shared memory has thread slots (64 by
/// default): the children past them count as missed, not as the parent's.
#[test]
fn vfork_children_past_the_thread_slots_are_missed_not_the_parents() {
    check_many(100);
}

#[test]
fn record_keeps_a_vfork_childs_events_its_own_or_says_they_were_not_recorded() {
    let bin = program();
    let b = bin.to_str().unwrap();
    let native = Command::new(&bin).arg("vfork").output().unwrap();
    let native = text(&native.stdout);
    let (want, _, _) = split_pids(&native);
    for follow in [true, false] {
        let dir = common::record::trace_dir(if follow { "vfork-f" } else { "vfork" });
        let mut args = vec!["record"];
        if follow {
            args.push("-f");
        }
        args.extend([
            "-o",
            dir.to_str().unwrap(),
            "leaf",
            "leaf4",
            "--",
            b,
            "vfork",
        ]);
        let o = hotprobe_within(&args, LIMIT);
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        let ctx = format!("{args:?}\n{out}\n{err}");
        assert_eq!(o.status.code(), Some(7), "{ctx}");
        let (got, parent, child) = split_pids(&out);
        assert_eq!(got, want, "{ctx}");
        let info = common::record::info(&dir, LIMIT);
        let threads = text(&hotprobe_within(&["info", dir.to_str().unwrap()], LIMIT).stdout)
            .lines()
            .find(|l| l.starts_with("# threads:"))
            .map(|l| l.split_whitespace().skip(2).collect::<Vec<_>>().join(" "))
            .unwrap_or_default();
        let not_recorded = format!(
            "hotprobe: 4000 events of vfork child {child} not recorded (-f records them as its own)"
        );
        if follow {
            // Two probes, 2500 calls each: the parent's 1500 and the child's 1000.
            assert_eq!(info.calls, 5000, "{ctx}");
            // In tid order: the child's pid is the smaller one after a
            // wrap of the pid space.
            let (lo, hi) = (parent.min(child), parent.max(child));
            assert_eq!(threads, format!("2 ({lo} {hi})"), "{ctx}");
            assert!(!err.contains("not recorded"), "{ctx}");
        } else {
            assert_eq!(info.calls, 3000, "{ctx}");
            assert_eq!(threads, format!("1 ({parent})"), "{ctx}");
            assert_eq!(
                err.lines().filter(|l| *l == not_recorded).count(),
                1,
                "{not_recorded}\n{ctx}"
            );
        }
        assert_eq!(info.lost, 0, "{ctx}");
    }
}
