//! Issue 24, what is done with the stacks `record --stacks` captured:
//! `report --callers` and `export --format folded|svg|html` take the
//! filters of the other reports (function, depth, duration, thread and
//! time), per thread too, `--callers` has JSON, `-o -` is standard
//! output; the flame graph draws the same stacks, with the same counts,
//! as the folded export. A trace that has only the target's counted
//! stacks refuses what it cannot answer, with an error that says why.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;
use common::record::trace_dir;
use common::{gcc, hotprobe_within, output_within, text, HOTPROBE};

const LIMIT: Duration = Duration::from_secs(120);

/// The tail of every stack of the program's main thread.
const START: &str = "_start;__libc_start_main;__libc_start_call_main;main";

fn build(program: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(format!("{program}.c"));
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stacks-report");
    std::fs::create_dir_all(&dir).unwrap();
    gcc(&src, &dir.join(program), &["-O2", "-fomit-frame-pointer"])
}

/// `record --stacks EXTRA PROBES -- PROGRAM` into a fresh trace `tag`;
/// the program's output is `want_out`.
fn record(tag: &str, program: &str, extra: &[&str], probes: &[&str], want_out: &str) -> PathBuf {
    let bin = build(program);
    let dir = trace_dir(tag);
    let mut a = vec!["record", "-o", dir.to_str().unwrap(), "--stacks"];
    a.extend_from_slice(extra);
    a.extend_from_slice(probes);
    a.extend(["--", bin.to_str().unwrap()]);
    let o = hotprobe_within(&a, LIMIT);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout), want_out);
    dir
}

/// stack_paths.c recorded with its functions and malloc: every call has
/// its own stack (call_stacks.tsv). Recorded once for the tests that read
/// it.
fn paths_trace() -> PathBuf {
    static TRACE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    TRACE
        .get_or_init(|| {
            record(
                "stacks-report-paths",
                "stack_paths",
                &[],
                &["libc:malloc", "main", "path_*", "alloc_leaf"],
                "allocated 15\n",
            )
        })
        .clone()
}

/// `hotprobe ARGS`: asserts success; stdout and stderr.
fn run(args: &[&str]) -> (String, String) {
    let o = hotprobe_within(args, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{args:?}: {out}\n{err}");
    (out, err)
}

/// `hotprobe ARGS`: asserts a usage error (exit 2); its stderr.
fn refused(args: &[&str]) -> String {
    common::usage_refused(args, LIMIT)
}

/// Folded lines: stack → count.
fn folded(out: &str) -> BTreeMap<String, u64> {
    out.lines()
        .map(|l| {
            let (k, n) = l.rsplit_once(' ').expect("a folded line");
            (k.to_string(), n.parse().expect("a count"))
        })
        .collect()
}

/// `export --format folded DIR ARGS`.
fn export_folded(dir: &Path, args: &[&str]) -> BTreeMap<String, u64> {
    let mut a = vec!["export", dir.to_str().unwrap(), "--format", "folded"];
    a.extend_from_slice(args);
    folded(&run(&a).0)
}

/// The stacks `want` (paths below main, counts) as folded lines.
fn lines(want: &[(&str, u64)]) -> BTreeMap<String, u64> {
    want.iter()
        .map(|(p, n)| {
            let k = if p.is_empty() {
                START.to_string()
            } else {
                format!("{START};{p}")
            };
            (k, *n)
        })
        .collect()
}

/// The frames a flame graph of `folded` has: (name, calls through it),
/// sorted (one per node of the tree of stacks).
fn frames_of_folded(folded: &BTreeMap<String, u64>) -> Vec<(String, u64)> {
    let mut nodes: BTreeMap<Vec<&str>, u64> = BTreeMap::new();
    for (k, n) in folded {
        let f: Vec<&str> = k.split(';').collect();
        for i in 1..=f.len() {
            *nodes.entry(f[..i].to_vec()).or_default() += n;
        }
    }
    let mut v: Vec<(String, u64)> = nodes
        .into_iter()
        .map(|(p, n)| (p.last().unwrap().to_string(), n))
        .collect();
    v.sort();
    v
}

/// The frames an inferno SVG draws: `<title>NAME (N calls, P%)</title>`,
/// sorted, without the root `all`.
fn frames_of_svg(svg: &str) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = svg
        .split("<title>")
        .skip(1)
        .filter_map(|t| {
            let t = t.split("</title>").next()?;
            let (name, rest) = t.rsplit_once(" (")?;
            let n = rest.split(' ').next()?.replace(',', "").parse().ok()?;
            assert!(rest.contains(" calls"), "{t}: counted in calls");
            Some((name.to_string(), n))
        })
        .filter(|(name, _)| name != "all")
        .collect();
    v.sort();
    v
}

/// -F, -N, -D, -t, --since: `export --format folded` and `report
/// --callers` count the stacks of the calls the filters keep, as `replay`
/// keeps them (a callee of a kept call is kept).
#[test]
fn folded_and_callers_apply_the_filters() {
    let dir = paths_trace();
    let d = dir.to_str().unwrap();
    // Unfiltered: every call with a stack, once.
    let all = export_folded(&dir, &[]);
    assert_eq!(all.values().sum::<u64>(), 1 + 15 + 15 + 7 + 16, "{all:?}");

    // -F path_a: path_a's calls and their callees only.
    assert_eq!(
        export_folded(&dir, &["-F", "path_a"]),
        lines(&[
            ("path_a", 3),
            ("path_a;alloc_leaf", 3),
            ("path_a;alloc_leaf;malloc", 3)
        ])
    );
    // -F alloc_leaf -N path_c: not below path_c.
    assert_eq!(
        export_folded(&dir, &["-F", "alloc_leaf", "-N", "path_c"]),
        lines(&[
            ("path_a;alloc_leaf", 3),
            ("path_a;alloc_leaf;malloc", 3),
            ("path_b;alloc_leaf", 5),
            ("path_b;alloc_leaf;malloc", 5)
        ])
    );
    // -D 2: main and its direct recorded callees (printf is not
    // recorded: its malloc is main's direct recorded callee).
    let d2 = export_folded(&dir, &["-D", "2"]);
    let printf = d2
        .keys()
        .find(|k| k.contains(";printf;"))
        .cloned()
        .expect("printf's malloc");
    let mut want = lines(&[("", 1), ("path_a", 3), ("path_b", 5), ("path_c", 7)]);
    want.insert(printf, 1);
    assert_eq!(d2, want);
    // -t 1000s, --since 1000s: no call kept, no stack.
    for f in [["-t", "1000s"], ["--since", "1000s"]] {
        assert_eq!(export_folded(&dir, &f), BTreeMap::new(), "{f:?}");
        let (out, _) = run(&["report", d, "--callers", "malloc", f[0], f[1]]);
        assert_eq!(out, "no call matches --callers malloc\n", "{f:?}");
    }

    // report --callers under -F path_b: path_b's five calls only.
    let (out, _) = run(&["report", d, "--callers", "malloc", "-F", "path_b"]);
    let rows: Vec<&str> = out.lines().map(str::trim).collect();
    assert_eq!(
        rows,
        [
            "CALLS  CALLER -> FUNCTION",
            "5  alloc_leaf -> malloc",
            "5      alloc_leaf <- path_b <- main <- __libc_start_call_main <- \
             __libc_start_main <- _start"
        ],
        "{out}"
    );
    // A filter that matches no function: said, as for the other reports.
    let (out, err) = run(&["report", d, "--callers", "malloc", "-F", "nosuch"]);
    assert_eq!(out, "");
    assert!(err.contains("no call matches -F nosuch"), "{err}");
}

/// `report --callers --json`: one line of JSON with the callers, their
/// calls and the stacks through them (and the filters); with --task (or
/// --per-thread), per thread. `report --graph --json` too.
#[test]
fn callers_as_json() {
    let dir = paths_trace();
    let d = dir.to_str().unwrap();
    let (out, _) = run(&["report", d, "--callers", "malloc", "--json", "-F", "path_*"]);
    assert_eq!(out.lines().count(), 1, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["callers_of"], "malloc");
    assert_eq!(v["query"]["filter"][0], "path_*");
    let callers = v["callers"].as_array().expect("callers");
    assert_eq!(callers.len(), 1, "{out}");
    assert_eq!(callers[0]["function"], "malloc");
    assert_eq!(callers[0]["caller"], "alloc_leaf");
    assert_eq!(callers[0]["calls"], 15);
    let paths: Vec<(String, u64)> = callers[0]["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert_eq!(p["truncated"], false);
            let c: Vec<&str> = p["callers"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| c.as_str().unwrap())
                .collect();
            (c[..c.len() - 4].join(" <- "), p["calls"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(
        paths,
        [
            ("alloc_leaf <- path_c_inner <- path_c".to_string(), 7),
            ("alloc_leaf <- path_b".to_string(), 5),
            ("alloc_leaf <- path_a".to_string(), 3)
        ]
    );
    let (out, _) = run(&["report", d, "--callers", "malloc", "--json", "--per-thread"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    let threads = v["threads"].as_array().expect("threads");
    assert_eq!(threads.len(), 1, "{out}");
    assert!(threads[0]["tid"].as_u64().is_some_and(|t| t > 0), "{out}");
    let calls: u64 = threads[0]["callers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["calls"].as_u64().unwrap())
        .sum();
    assert_eq!(calls, 16, "15 by alloc_leaf, 1 by printf: {out}");

    // report --graph --json: the recorded call tree below main, as JSON.
    let (out, _) = run(&["report", d, "--graph", "main", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(v["graph_of"], "main");
    let graphs = v["graphs"].as_array().expect("graphs");
    assert_eq!(graphs.len(), 1, "{out}");
    let mut node = &graphs[0];
    assert_eq!(
        (node["function"].as_str(), node["calls"].as_u64()),
        (Some("main"), Some(1))
    );
    for (f, n) in [
        ("path_c", 7),
        ("path_c_inner", 7),
        ("alloc_leaf", 7),
        ("malloc", 7),
    ] {
        node = node["children"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["function"] == f)
            .unwrap_or_else(|| panic!("{f} in {out}"));
        assert_eq!(node["calls"], n, "{f}: {out}");
    }
}

/// Four threads, each reaching malloc 5 times through thread_path: `report
/// --callers --task` gives 5 per thread, `--tid` one thread's 5, `export
/// --format folded --per-thread` each thread's stacks under `tid-N`.
#[test]
fn callers_and_folded_per_thread() {
    let dir = record(
        "stacks-report-threads",
        "stack_threads",
        &[],
        &["libc:malloc", "thread_path", "alloc_leaf"],
        "freed 20\n",
    );
    let d = dir.to_str().unwrap();
    let (out, _) = run(&[
        "report",
        d,
        "--callers",
        "malloc",
        "--task",
        "-F",
        "thread_path",
    ]);
    let tids: Vec<u32> = out
        .lines()
        .filter_map(|l| {
            l.strip_prefix("# thread ")?
                .strip_suffix(": 5 calls")?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(tids.len(), 4, "{out}");
    assert_eq!(
        out.lines()
            .filter(|l| l.trim() == "5  alloc_leaf -> malloc")
            .count(),
        4,
        "{out}"
    );
    // --tid: that thread's calls only.
    let t = tids[2].to_string();
    let (out, _) = run(&[
        "report",
        d,
        "--callers",
        "malloc",
        "--tid",
        &t,
        "-F",
        "thread_path",
    ]);
    assert_eq!(
        out.lines().nth(1).map(str::trim),
        Some("5  alloc_leaf -> malloc"),
        "{out}"
    );
    assert_eq!(
        out.lines().filter(|l| l.ends_with(" -> malloc")).count(),
        1,
        "{out}"
    );
    // export --per-thread: each thread's thread_path → alloc_leaf → malloc
    // path 5 times, under its tid.
    let f = export_folded(&dir, &["--per-thread", "-F", "thread_path"]);
    for tid in &tids {
        let mine: Vec<(&String, &u64)> = f
            .iter()
            .filter(|(k, _)| k.starts_with(&format!("tid-{tid};")))
            .collect();
        assert_eq!(mine.len(), 3, "{f:?}");
        for (k, n) in mine {
            assert!(k.contains(";thread_path"), "{k}");
            let want = if k.ends_with(";thread_path") { 1 } else { 5 };
            assert_eq!(*n, want, "{k}");
        }
    }
    assert_eq!(f.len(), 12, "{f:?}");
}

/// `export --format svg` and `html` draw the stacks `--format folded`
/// gives, with the same counts (in calls), filtered or not; `-o -` is
/// standard output (no file named `-`), for parquet too; ctf and otlp
/// refuse it.
#[test]
fn flame_graph_is_the_folded_stacks_and_dash_is_stdout() {
    let dir = paths_trace();
    let d = dir.to_str().unwrap();
    let cwd = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stacks-report-cwd");
    std::fs::create_dir_all(&cwd).unwrap();
    let _ = std::fs::remove_file(cwd.join("-"));
    let in_cwd = |args: &[&str]| {
        let mut c = Command::new(HOTPROBE);
        c.args(args).current_dir(&cwd);
        let o = output_within(c, LIMIT);
        assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
        o.stdout
    };
    for filter in [&[][..], &["-F", "path_b"][..], &["-N", "path_c"][..]] {
        let want = frames_of_folded(&export_folded(&dir, filter));
        assert!(!want.is_empty());
        for format in ["svg", "html"] {
            let mut a = vec!["export", d, "--format", format, "-o", "-"];
            a.extend_from_slice(filter);
            let out = text(&in_cwd(&a));
            assert_eq!(frames_of_svg(&out), want, "{format} {filter:?}");
        }
    }
    // report --flame draws the same.
    let (out, _) = run(&["report", d, "--flame"]);
    let svg = std::fs::read_to_string(out.trim()).unwrap();
    assert_eq!(
        frames_of_svg(&svg),
        frames_of_folded(&export_folded(&dir, &[]))
    );
    // -o - for folded and parquet: standard output.
    let out = text(&in_cwd(&["export", d, "--format", "folded", "-o", "-"]));
    assert_eq!(folded(&out), export_folded(&dir, &[]));
    let out = in_cwd(&["export", d, "--format", "parquet", "-o", "-"]);
    assert!(
        out.starts_with(b"PAR1") && out.ends_with(b"PAR1"),
        "{} bytes",
        out.len()
    );
    assert!(!cwd.join("-").exists(), "a file named -");
    let err = refused(&["export", d, "--format", "ctf", "-o", "-"]);
    assert!(err.contains("--format ctf writes a directory"), "{err}");
    let err = refused(&[
        "export",
        d,
        "--format",
        "otlp",
        "--endpoint",
        "http://127.0.0.1:9",
        "-o",
        "x",
    ]);
    assert!(err.contains("-o goes with the other formats"), "{err}");
}

/// A trace the recorder's filters left calls out of has only the stacks
/// the target counted (no call_stacks.tsv): unfiltered they are shown;
/// filters and per thread are refused with an error saying why.
#[test]
fn counted_stacks_refuse_filters_and_threads() {
    let dir = record(
        "stacks-report-counted",
        "stack_paths",
        &["--max-depth", "2"],
        &["libc:malloc", "main", "path_*", "alloc_leaf"],
        "allocated 15\n",
    );
    let d = dir.to_str().unwrap();
    assert!(dir.join("stacks.tsv").exists() && !dir.join("call_stacks.tsv").exists());
    let all = export_folded(&dir, &[]);
    assert_eq!(
        all.get(&format!("{START};path_b;alloc_leaf;malloc")),
        Some(&5),
        "{all:?}"
    );
    let only = "has only the stacks the target counted (stacks.tsv)";
    for args in [
        &["report", d, "--callers", "malloc", "-F", "path_a"][..],
        &["report", d, "--callers", "malloc", "--tid", "1"],
        &["export", d, "--format", "folded", "-D", "2"],
        &["export", d, "--format", "svg", "-t", "1us"],
        &["export", d, "--format", "html", "--until", "1s"],
    ] {
        let err = refused(args);
        assert!(
            err.contains(only) && err.contains("cannot apply"),
            "{args:?}: {err}"
        );
    }
    for args in [
        &["report", d, "--callers", "malloc", "--per-thread"][..],
        &["export", d, "--format", "folded", "--per-thread"],
    ] {
        let err = refused(args);
        assert!(
            err.contains(only) && err.contains("not split by thread"),
            "{args:?}: {err}"
        );
    }
    // --marker has no meaning with --callers.
    let err = refused(&["report", d, "--callers", "malloc", "--marker", "main"]);
    assert!(err.contains("--callers has none"), "{err}");
}
