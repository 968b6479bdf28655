//! `record` of library functions (issue 15, item 2): `MODULE:GLOB`
//! patterns on zlib and SQLite, their calls nested under the program's
//! callers in `replay`, the callers' self time in `report` net of them, and
//! a function only a trap can take recorded through the trap (or left out
//! with `--no-traps`), the summary saying which.
//!
//! The program (tests/programs/libcalls.c) prints how many calls it made;
//! every count below is compared with what it printed.

mod common;

use common::{call_tree, gcc_with, hotprobe, text};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Calls the program makes: compress2 from do_compress, sqlite3_exec from
/// do_sql (one row each: one row_cb, one compressBound), twice from main;
/// and compress once from do_tail.
const COMPRESSES: usize = 5;
const EXECS: usize = 4;
const TWICES: usize = 3;

fn tmp() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("libcalls");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The test program, linked with zlib and SQLite (scripts/setup.sh installs
/// their -dev packages).
fn program() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/libcalls.c");
    gcc_with(
        &src,
        &tmp().join("libcalls"),
        &["-O2"],
        &["-lz", "-lsqlite3"],
    )
}

/// What the program prints for the call counts above.
fn expected_output() -> String {
    format!(
        "compress2 {COMPRESSES} ok {COMPRESSES}\nsqlite3_exec {EXECS} ok {EXECS}\n\
         row_cb {EXECS} compressBound {EXECS}\ntwice {TWICES} sum {}\ncompress 1 ok 1\n",
        (0..TWICES as i64).map(|i| 2 * i).sum::<i64>()
    )
}

/// `hotprobe record -o DIR --force ARGS -- PROGRAM COUNTS`: (stdout,
/// stderr); panics unless it succeeded.
fn record(dir: &Path, args: &[&str]) -> (String, String) {
    let prog = program();
    let (c, e, t) = (
        COMPRESSES.to_string(),
        EXECS.to_string(),
        TWICES.to_string(),
    );
    let mut a = vec!["record", "-o", dir.to_str().unwrap(), "--force"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["--", prog.to_str().unwrap(), &c, &e, &t]);
    let o = hotprobe(&a);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "record {args:?} failed:\n{out}\n{err}");
    (out, err)
}

/// `replay DIR` as (depth, name) in order (one thread).
fn replay(dir: &Path) -> Vec<(usize, String)> {
    let o = hotprobe(&["replay", dir.to_str().unwrap()]);
    assert!(o.status.success(), "replay: {}", text(&o.stderr));
    let tree = call_tree(&text(&o.stdout));
    let tids: std::collections::BTreeSet<u32> = tree.iter().map(|c| c.0).collect();
    assert_eq!(tids.len(), 1, "one thread in the trace: {tids:?}");
    tree.into_iter().map(|(_, d, n)| (d, n)).collect()
}

/// The calls directly under each call named `parent`: for each such call,
/// the names of its children in order.
fn children(tree: &[(usize, String)], parent: &str) -> Vec<Vec<String>> {
    let mut all = Vec::new();
    for (i, (d, n)) in tree.iter().enumerate() {
        if n != parent {
            continue;
        }
        let kids = tree[i + 1..]
            .iter()
            .take_while(|(cd, _)| cd > d)
            .filter(|(cd, _)| *cd == d + 1)
            .map(|(_, cn)| cn.clone())
            .collect();
        all.push(kids);
    }
    all
}

/// `report DIR --json [EXTRA]` rows by function.
fn report(dir: &Path, extra: &[&str]) -> BTreeMap<String, Value> {
    let mut a = vec!["report", dir.to_str().unwrap(), "--json"];
    a.extend_from_slice(extra);
    let o = hotprobe(&a);
    assert!(o.status.success(), "report: {}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).expect("report --json is JSON");
    v["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|r| (r["function"].as_str().unwrap().to_string(), r.clone()))
        .collect()
}

fn ns(rows: &BTreeMap<String, Value>, f: &str, key: &str) -> u64 {
    rows.get(f)
        .unwrap_or_else(|| panic!("no row for {f} in {rows:?}"))[key]
        .as_u64()
        .unwrap_or_else(|| panic!("no {key} for {f}"))
}

const CALLERS: &[&str] = &["do_compress", "do_sql", "row_cb", "do_tail"];
const LIBRARY: &[&str] = &[
    "libz.so.1:compress*",
    "libz.so.1:deflate*",
    "libsqlite3.so.0:sqlite3_exec",
    "libsqlite3.so.0:sqlite3_step",
];

#[test]
fn library_calls_nest_under_their_callers() {
    let with = tmp().join("with-libs");
    let mut args = CALLERS.to_vec();
    args.extend_from_slice(LIBRARY);
    let (out, err) = record(&with, &args);
    assert_eq!(out, expected_output(), "the program's output\n{err}");
    let tree = replay(&with);

    // do_compress → compress2 × 5 (its PLT call), each → deflateInit_,
    // deflate, deflateEnd (selected by `deflate*`).
    let dc = children(&tree, "do_compress");
    assert_eq!(dc.len(), 1, "{tree:?}");
    assert_eq!(dc[0], vec!["compress2"; COMPRESSES], "{tree:?}");
    // do_tail → compress, which tail-calls compress2 (jmp through zlib's
    // PLT): compress's frame is gone when compress2 runs, in do_tail's
    // (as a debugger's backtrace shows it), so compress ends there and
    // compress2 follows it under do_tail.
    assert_eq!(
        children(&tree, "do_tail"),
        vec![vec!["compress", "compress2"]],
        "{tree:?}"
    );
    assert_eq!(children(&tree, "compress"), vec![Vec::<String>::new()]);
    let c2 = children(&tree, "compress2");
    assert_eq!(c2.len(), COMPRESSES + 1);
    for kids in &c2 {
        assert_eq!(kids, &["deflateInit_", "deflate", "deflateEnd"], "{tree:?}");
    }
    // deflateInit_ → deflateInit2_ (zlib calls it through its own PLT or
    // directly; both nest).
    for kids in children(&tree, "deflateInit_") {
        assert_eq!(kids.first().map(String::as_str), Some("deflateInit2_"));
    }

    // do_sql → sqlite3_exec × 4, each → sqlite3_step (library callee) and
    // row_cb (the program's callback, entered from SQLite) → compressBound
    // (back into zlib).
    let ds = children(&tree, "do_sql");
    assert_eq!(ds.len(), 1);
    assert_eq!(ds[0], vec!["sqlite3_exec"; EXECS], "{tree:?}");
    // (sqlite3_exec is also called by SQLite itself, elsewhere.)
    let at = tree.iter().position(|(_, n)| n == "do_sql").unwrap();
    let sql_depth = tree[at].0;
    let under_sql: Vec<usize> = (at + 1..tree.len())
        .take_while(|i| tree[*i].0 > sql_depth)
        .filter(|i| tree[*i].0 == sql_depth + 1 && tree[*i].1 == "sqlite3_exec")
        .collect();
    assert_eq!(under_sql.len(), EXECS);
    for i in under_sql {
        let d = tree[i].0;
        let kids: Vec<&str> = tree[i + 1..]
            .iter()
            .take_while(|(cd, _)| *cd > d)
            .filter(|(cd, _)| *cd == d + 1)
            .map(|(_, n)| n.as_str())
            .collect();
        assert!(kids.contains(&"sqlite3_step"), "{kids:?}");
        assert_eq!(
            kids.iter().filter(|k| **k == "row_cb").count(),
            1,
            "{kids:?}"
        );
    }
    let cb = children(&tree, "row_cb");
    assert_eq!(cb.len(), EXECS);
    for kids in &cb {
        assert_eq!(kids, &["compressBound"]);
    }

    // Each function's module is the one it lives in.
    let rows = report(&with, &[]);
    let module = |f: &str| rows[f]["module"].as_str().unwrap().to_string();
    assert!(
        module("compress2").contains("libz.so.1"),
        "{}",
        module("compress2")
    );
    assert!(module("sqlite3_exec").contains("libsqlite3.so.0"));
    assert!(module("do_compress").ends_with("libcalls"));
    assert_eq!(ns(&rows, "compress2", "calls"), COMPRESSES as u64 + 1);

    // The callers' self time is net of the library calls under them
    // (report -F CALLER: the calls under CALLER only)...
    let dc = report(&with, &["-F", "do_compress"]);
    assert_eq!(ns(&dc, "compress2", "calls"), COMPRESSES as u64);
    let total = ns(&dc, "do_compress", "total_ns");
    let selft = ns(&dc, "do_compress", "self_ns");
    let lib = ns(&dc, "compress2", "total_ns");
    assert!(
        lib > 0 && lib <= total,
        "compress2 {lib} ns in do_compress {total} ns"
    );
    assert!(
        selft <= total - lib + 1_000,
        "do_compress self {selft} ns > total {total} − compress2 {lib} ns"
    );
    let sql = report(&with, &["-F", "do_sql"]);
    let (t, s, l) = (
        ns(&sql, "do_sql", "total_ns"),
        ns(&sql, "do_sql", "self_ns"),
        ns(&sql, "sqlite3_exec", "total_ns"),
    );
    assert_eq!(ns(&sql, "sqlite3_exec", "calls"), EXECS as u64);
    assert!(
        l > 0 && s <= t - l + 1_000,
        "do_sql self {s}, total {t}, sqlite3_exec {l}"
    );

    // ... where without the library patterns it is all of their time.
    let without = tmp().join("without-libs");
    let (out, err) = record(&without, CALLERS);
    assert_eq!(out, expected_output(), "{err}");
    let plain = report(&without, &[]);
    assert!(!plain.contains_key("compress2"), "{plain:?}");
    assert_eq!(
        ns(&plain, "do_compress", "self_ns"),
        ns(&plain, "do_compress", "total_ns")
    );
    let t = ns(&plain, "do_sql", "total_ns");
    let cbs = ns(&plain, "row_cb", "total_ns");
    assert!(ns(&plain, "do_sql", "self_ns") + cbs >= t - 1_000);
}

#[test]
fn a_bare_library_function_is_found_in_its_module() {
    let dir = tmp().join("bare");
    let (out, _) = record(&dir, &["do_compress", "compress2"]);
    assert_eq!(out, expected_output());
    let dc = children(&replay(&dir), "do_compress");
    assert_eq!(dc, vec![vec!["compress2"; COMPRESSES]]);
    // A module that is not loaded (nor anywhere the loader looks) is an
    // error naming the loaded ones.
    let prog = program();
    let o = hotprobe(&[
        "record",
        "-o",
        tmp().join("nomod").to_str().unwrap(),
        "--force",
        "libnosuch.so.7:*",
        "--",
        prog.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("libnosuch.so.7") && err.contains("libz.so.1"),
        "{err}"
    );
}

#[test]
fn a_function_only_a_trap_takes_is_recorded_through_an_in_process_trap() {
    // By default: an in-process trap (the agent's SIGTRAP handler records
    // the entry and hooks the return), no ptrace stop while it runs.
    let dir = tmp().join("traps");
    let (out, err) = record(&dir, &["main", "twice"]);
    assert_eq!(out, expected_output());
    assert!(err.contains("(in-process 1, jump 1)"), "{err}");
    assert!(!err.contains("  traps:"), "{err}");
    let line = err
        .lines()
        .find(|l| l.trim_start().starts_with("in-process:"))
        .unwrap_or_else(|| panic!("no in-process line in the summary:\n{err}"));
    assert!(
        line.contains("1 functions recorded through in-process traps")
            && line.contains(&format!("{TWICES} calls; ptrace stops while running: 0")),
        "{line}"
    );
    let twice_under_main = |dir: &Path| {
        let tree = replay(dir);
        let m = children(&tree, "main");
        assert_eq!(m.len(), 1);
        assert_eq!(
            m[0].iter().filter(|n| *n == "twice").count(),
            TWICES,
            "{tree:?}"
        );
    };
    twice_under_main(&dir);

    // --no-traps leaves out every trap kind, the in-process one too
    // (issue 23): twice is listed with its reason, main alone recorded.
    let (out, err) = record(&dir, &["--no-traps", "main", "twi*"]);
    assert_eq!(out, expected_output());
    assert!(err.contains("probes:   1 functions (jump 1)"), "{err}");
    assert!(
        err.contains(
            "not probed (needs a trap (a jump lands inside the first 5 bytes at +4 \
             (from `jne short "
        ) && err.contains(": twice"),
        "{err}"
    );
    let tree = replay(&dir);
    assert!(!tree.iter().any(|(_, n)| n == "twice"), "{tree:?}");
    assert_eq!(children(&tree, "main").len(), 1, "{tree:?}");
}

/// `record -o DIR --force ARGS -- libcalls_dlopen 4` (zlib dlopened, its
/// compress2 called 4 times from caller()): the replayed tree; panics unless
/// it succeeded with the program's output and `pending` in the start line.
fn record_dlopen(name: &str, args: &[&str]) -> Vec<(usize, String)> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/libcalls_dlopen.c");
    let prog = gcc_with(&src, &tmp().join("libcalls_dlopen"), &["-O2"], &["-ldl"]);
    let dir = tmp().join(name);
    let mut a = vec!["record", "-o", dir.to_str().unwrap(), "--force"];
    a.extend_from_slice(args);
    a.extend_from_slice(&["--", prog.to_str().unwrap(), "4"]);
    let o = hotprobe(&a);
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(text(&o.stdout), "compress2 4 ok 4\n");
    assert!(err.contains("pending"), "{err}");
    replay(&dir)
}

#[test]
fn a_library_function_of_a_library_loaded_later_is_recorded_once_loaded() {
    let tree = record_dlopen("dlopen", &["caller", "libz.so.1:compress2"]);
    assert_eq!(
        children(&tree, "caller"),
        vec![vec!["compress2"]; 4],
        "{tree:?}"
    );
}

#[test]
fn a_pattern_on_a_library_loaded_later_records_what_it_matches() {
    let tree = record_dlopen(
        "dlopen-pattern",
        &["caller", "libz.so.1:compress*", "libz.so.1:deflate*"],
    );
    assert_eq!(
        children(&tree, "caller"),
        vec![vec!["compress2"]; 4],
        "{tree:?}"
    );
    for kids in children(&tree, "compress2") {
        assert_eq!(kids, &["deflateInit_", "deflate", "deflateEnd"], "{tree:?}");
    }
    // A pattern matching nothing in the library's file is an error at once.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/libcalls_dlopen.c");
    let prog = gcc_with(&src, &tmp().join("libcalls_dlopen"), &["-O2"], &["-ldl"]);
    let o = hotprobe(&[
        "record",
        "-o",
        tmp().join("dlopen-none").to_str().unwrap(),
        "--force",
        "libz.so.1:nosuch*",
        "--",
        prog.to_str().unwrap(),
    ]);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(err.contains("no function matches `nosuch*`"), "{err}");
}
