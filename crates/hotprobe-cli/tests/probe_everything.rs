//! Probing everything (issue 14): `count 'libc.so.6:*'` puts a probe on
//! every function of libc the blacklist allows, on real programs (`ls`,
//! `sort`, the `sqlite3` shell), and the programs run to completion with
//! their output unchanged; the counts of `malloc`, `free` and every
//! `__strlen_*` implementation (the IFUNC-selected one among them) equal
//! bpftrace's uprobe counts for the same deterministic workload.
//!
//! Needs root (bpftrace), bpftrace and sqlite3 (scripts/setup.sh installs
//! both); a missing one fails the test, it is never skipped.

mod common;

// bpftrace and hotprobe never run beside each other: see
// common::bpftrace for why.
use common::bpftrace::no_kernel_uprobes;
use common::{program_output, text, CountTable};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

fn tmp(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("probe_everything")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The libc the programs map (the path bpftrace attaches to): the
/// loader's answer for `/usr/bin/true`.
fn libc_path() -> PathBuf {
    let out = Command::new("ldd")
        .arg("/usr/bin/true")
        .output()
        .expect("ldd runs");
    let s = text(&out.stdout);
    let path = s
        .lines()
        .filter(|l| l.contains("libc.so.6"))
        .find_map(|l| l.split_whitespace().find(|w| w.starts_with('/')))
        .unwrap_or_else(|| panic!("no libc.so.6 in ldd's output:\n{s}"));
    std::fs::canonicalize(path).unwrap()
}

/// The program's output, run without any tracer.
fn native(cmd: &[&str], env: &[(&str, &str)]) -> String {
    let out = Command::new(cmd[0])
        .args(&cmd[1..])
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{cmd:?} fails natively: {out:?}");
    text(&out.stdout)
}

/// `hotprobe count --all SPECS -- CMD` (every row, those without a hit
/// too): checks it ran to completion with the program's output unchanged
/// and every probe placed, and returns the table and hotprobe's stderr.
fn count_everything(specs: &[&str], cmd: &[&str], env: &[(&str, &str)]) -> (CountTable, String) {
    let expected = native(cmd, env);
    let mut args: Vec<&str> = vec!["count", "--all"];
    args.extend_from_slice(specs);
    args.push("--");
    args.extend_from_slice(cmd);
    let mut c = Command::new(common::HOTPROBE);
    c.args(&args).envs(env.iter().copied());
    let out = {
        let _shared = no_kernel_uprobes();
        common::output_within(c, LIMIT)
    };
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        out.status.success(),
        "hotprobe {args:?}: {:?}\nstderr:\n{stderr}",
        out.status
    );
    assert!(
        stderr.contains("exited with code 0"),
        "{cmd:?} did not run to completion:\n{stderr}"
    );
    // (Not assert_eq: the outputs are long.)
    assert!(
        program_output(&stdout) == expected,
        "the output of {cmd:?} under `hotprobe count {specs:?}` differs from its own \
         ({} bytes, {} expected)",
        program_output(&stdout).len(),
        expected.len()
    );
    let table = CountTable::parse(&stdout, &stderr);
    // Far more than a few: every function libc's blacklist allows.
    assert!(
        table.rows.len() > 2000,
        "{} probes only:\n{stderr}",
        table.rows.len()
    );
    (table, stderr)
}

/// The libc counts of `cmd` under `count 'libc.so.6:*'` against
/// bpftrace's for malloc, free and every `__strlen_*` implementation.
fn libc_counts_match_bpftrace(cmd: &[&str], env: &[(&str, &str)]) {
    let (table, _) = count_everything(&["libc.so.6:*"], cmd, env);
    let strlens: Vec<String> = table
        .rows
        .iter()
        .filter_map(|r| r.first())
        .filter(|n| n.starts_with("__strlen_"))
        .cloned()
        .collect();
    assert!(
        !strlens.is_empty(),
        "no __strlen_* implementation probed (libc6-dbg's symbols?):\n{}",
        table.all
    );
    let mut functions = vec!["malloc".to_string(), "free".to_string()];
    functions.extend(strlens.iter().cloned());
    let bt = common::bpftrace::counts(&libc_path(), &functions, cmd, env, &native(cmd, env));
    let hotprobe: BTreeMap<String, u64> = functions
        .iter()
        .map(|f| (f.clone(), table.hits(f)))
        .collect();
    assert_eq!(
        hotprobe, bt,
        "hotprobe's counts (left) against bpftrace's (right) for {cmd:?}"
    );
    // The IFUNC selected one implementation, and the program used it (the
    // equality above is no accident of zeros).
    assert!(
        strlens.iter().any(|f| bt[f] > 0),
        "no strlen implementation called: {bt:?}"
    );
    assert!(bt["malloc"] > 0 && bt["free"] > 0, "{bt:?}");
}

#[test]
fn count_every_libc_function_of_ls() {
    libc_counts_match_bpftrace(
        &["/usr/bin/ls", "-la", "/usr/share/doc"],
        &[("LC_ALL", "C")],
    );
}

#[test]
fn count_every_libc_function_of_sort() {
    let d = tmp("sort");
    let input = d.join("input.txt");
    // 20,000 lines of pseudo-random words (an LCG: the same every run).
    let mut x: u64 = 12345;
    let mut s = String::new();
    for i in 0..20_000 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        s.push_str(&format!("{:016x} line {i} {}\n", x >> 11, x % 977));
    }
    std::fs::write(&input, s).unwrap();
    let input = input.to_str().unwrap();
    // One thread: the same calls every run.
    libc_counts_match_bpftrace(
        &["/usr/bin/sort", "--parallel=1", "-k3,3n", "-k1,1", input],
        &[("LC_ALL", "C")],
    );
}

#[test]
fn count_every_sqlite_and_libc_function_of_the_sqlite3_shell() {
    let d = tmp("sqlite3");
    let script = d.join("script.sql");
    std::fs::write(
        &script,
        "CREATE TABLE t(id INTEGER PRIMARY KEY, name TEXT, v REAL);\n\
         WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c WHERE i < 3000)\n\
         INSERT INTO t(name, v) SELECT printf('row-%05d', (i * 7919) % 10007), i / 7.0 FROM c;\n\
         CREATE INDEX t_name ON t(name);\n\
         SELECT count(*), printf('%.3f', sum(v)), min(name), max(name) FROM t;\n\
         SELECT substr(name, 1, 6) AS p, count(*), printf('%.2f', avg(v)) FROM t GROUP BY p ORDER BY p;\n\
         UPDATE t SET v = v * 2 WHERE id % 3 = 0;\n\
         DELETE FROM t WHERE id % 5 = 0;\n\
         SELECT count(*), printf('%.3f', total(v)) FROM t;\n\
         SELECT name FROM t WHERE name LIKE 'row-000%' ORDER BY name LIMIT 5;\n",
    )
    .unwrap();
    let read = format!(".read {}", script.display());
    let cmd = ["/usr/bin/sqlite3", "-batch", ":memory:", read.as_str()];
    let (table, _) = count_everything(&["libsqlite3.so.0:*", "libc.so.6:*"], &cmd, &[]);
    // Both libraries were probed, and SQLite's own functions ran.
    // Each of the script's 9 statements is stepped at least once.
    assert!(table.hits("sqlite3_step") >= 9, "{}", table.all);
    assert!(table.hits("malloc") > 0, "{}", table.all);
}

/// Module globs (issue 14): `count '*:*'` probes every function of `ls`
/// and of every library it maps, the agent left out; each row is named
/// `module:function`; the output is unchanged, the blacklist refuses what
/// it must (with its reason), and `'*:malloc'` finds libc's malloc alone,
/// with the same count as under `'*:*'`.
#[test]
fn count_every_function_of_every_module_of_ls() {
    let cmd = ["/usr/bin/ls", "-la", "/usr/share/doc"];
    let env = [("LC_ALL", "C")];
    let (table, stderr) = count_everything(&["*:*"], &cmd, &env);
    // The blacklist still refuses, per module, with its reason.
    for m in ["libc.so.6", "ld-linux-x86-64.so.2"] {
        assert!(
            stderr.contains(&format!("skipping {m}:__restore_rt: "))
                && stderr.contains(&format!("__restore_rt in {m} (signal return trampoline)")),
            "{m}'s __restore_rt not refused:\n{stderr}"
        );
    }
    let names: Vec<&str> = table
        .rows
        .iter()
        .filter_map(|r| r.first())
        .map(|s| s.as_str())
        .collect();
    let in_module = |m: &str| {
        names
            .iter()
            .filter(|n| n.starts_with(&format!("{m}:")))
            .count()
    };
    for m in ["ls", "libc.so.6", "ld-linux-x86-64.so.2"] {
        assert!(in_module(m) > 0, "no row of {m}:\n{}", table.all);
    }
    assert!(in_module("libc.so.6") > 2000, "{}", table.all);
    assert!(
        !names.iter().any(|n| n.contains("hotprobe_agent")),
        "the agent was probed:\n{}",
        table.all
    );
    // ld.so runs its finalizer once, at exit.
    assert_eq!(table.hits("ld-linux-x86-64.so.2:_dl_fini"), 1);
    let malloc = table.hits("libc.so.6:malloc");
    assert!(malloc > 0);

    let mut args = vec!["count", "*:malloc", "--"];
    args.extend_from_slice(&cmd);
    let mut c = Command::new(common::HOTPROBE);
    c.args(&args).envs(env.iter().copied());
    let out = {
        let _shared = no_kernel_uprobes();
        common::output_within(c, LIMIT)
    };
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    let one = CountTable::parse(&stdout, &stderr);
    let probes: Vec<&String> = one.rows.iter().filter_map(|r| r.first()).collect();
    assert_eq!(probes, ["libc.so.6:malloc"], "{stdout}");
    assert_eq!(one.hits("libc.so.6:malloc"), malloc);
}

/// A module glob that matches no module, or a function no matching module
/// has, is a clear error naming what was searched.
#[test]
fn module_glob_matching_nothing_is_an_error() {
    let out = common::hotprobe(&["count", "nomodule*:*", "--", "/usr/bin/true"]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("none matches \"nomodule*\"") && err.contains("libc.so.6"),
        "{err}"
    );
    let out = common::hotprobe(&["count", "*:no_such_function_here", "--", "/usr/bin/true"]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("no function matches `*:no_such_function_here`"),
        "{err}"
    );
}
