//! A C++ function's name without its parameter list (`ns::f`) stands for
//! every overload, as gdb's `break ns::f` does: `count` gives a row per
//! overload with its own calls, `%return` too, and `record` records them
//! all (its writer matched the name against `ns::f(int)` and dropped
//! every event). A full name (`ns::f(double)`) or a mangled one takes one.
//! The program prints what it prints alone.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;
use common::{hotprobe_within, program_output, text};

const LIMIT: Duration = Duration::from_secs(120);
const NATIVE: &str = "t=870\n";

fn overloads() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("overloads");
    std::fs::create_dir_all(&dir).unwrap();
    hotprobe_testkit::compile(
        "g++",
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/overloads.cc"),
        &dir.join("overloads"),
        &["-O2", "-g"],
        &[],
    )
}

/// `count --json SPECS -- bin`: (probe label, hits) of each row.
fn count_rows(bin: &Path, specs: &[&str]) -> Vec<(String, u64)> {
    let mut args = vec!["count", "--json"];
    args.extend_from_slice(specs);
    args.extend(["--", bin.to_str().unwrap()]);
    let o = hotprobe_within(&args, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{err}");
    let (program, json) = out.split_at(out.find("\n[").expect("a JSON table") + 1);
    assert_eq!(program_output(program), NATIVE, "{err}");
    let rows: Value = serde_json::from_str(json.trim()).unwrap();
    sorted_pairs(&rows, "probe", "hits")
}

/// Each JSON row of `rows` as (its `name` field, its `number` field),
/// sorted.
fn sorted_pairs(rows: &Value, name: &str, number: &str) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r[name].as_str().unwrap().to_string(),
                r[number].as_u64().unwrap(),
            )
        })
        .collect();
    v.sort();
    v
}

#[test]
fn a_name_without_parameters_takes_every_overload() {
    let bin = overloads();
    let want = |spec: &str| {
        vec![
            (format!("{spec} @ ns::f(char const*)"), 7),
            (format!("{spec} @ ns::f(double)"), 5),
            (format!("{spec} @ ns::f(int)"), 3),
        ]
    };
    assert_eq!(count_rows(&bin, &["ns::f"]), want("ns::f"));
    assert_eq!(count_rows(&bin, &["ns::f%return"]), want("ns::f%return"));
    // One overload by its full or mangled name.
    assert_eq!(
        count_rows(&bin, &["ns::f(double)"]),
        vec![("ns::f(double)".to_string(), 5)]
    );
    assert_eq!(
        count_rows(&bin, &["_ZN2ns1fEi"]),
        vec![("_ZN2ns1fEi".to_string(), 3)]
    );
}

#[test]
fn record_of_a_name_keeps_the_events_of_every_overload() {
    let bin = overloads();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("overloads-trace");
    let d = dir.to_str().unwrap();
    let o = hotprobe_within(
        &[
            "record",
            "--force",
            "-o",
            d,
            "ns::f",
            "--",
            bin.to_str().unwrap(),
        ],
        LIMIT,
    );
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert_eq!(program_output(&text(&o.stdout)), NATIVE);
    assert!(err.contains("pattern 0;"), "{err}");
    let o = hotprobe_within(&["report", d, "--json"], LIMIT);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        sorted_pairs(&v["rows"], "function", "calls"),
        vec![
            ("ns::f(char const*)".to_string(), 7),
            ("ns::f(double)".to_string(), 5),
            ("ns::f(int)".to_string(), 3),
        ]
    );
}
