//! The exports of a trace recorded from a program that logs its own calls
//! (tests/programs/calls.c): flame graphs rendered by rsvg-convert, OTLP
//! decoded by the Python opentelemetry-proto package on a local receiver,
//! Parquet read by DuckDB, Chrome arguments as strings.
//!
//! The Python checks use the virtualenv scripts/setup.sh makes at the
//! repository root (`.venv`); they fail with a message saying so when it
//! is missing, unless HOTPROBE_SKIP_PY=1.

mod common;

use common::calls_log::*;
use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

#[test]
fn export_flame_graphs_svg_and_html() {
    let run = run3();
    let svg = tmp().join(format!("calls-{}.svg", std::process::id()));
    ok(&[
        "export",
        run.d(),
        "--format",
        "svg",
        "-o",
        svg.to_str().unwrap(),
    ]);
    check_svg(&svg, &["main", "worker", "slow"]);
    let html = ok(&["export", run.d(), "--format", "html", "--calls"]);
    assert!(html.starts_with("<!DOCTYPE html>"), "{}", &html[..200]);
    assert!(html.contains("<svg ") && html.contains("function init(evt)"));
    assert!(html.contains(" calls, "), "widths in calls");
    assert!(html.trim_end().ends_with("</html>"));
}

#[test]
fn chrome_arguments_are_strings() {
    let run = run3();
    let out = ok(&["export", run.d(), "--format", "chrome"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    let mut seen = 0;
    for e in v["traceEvents"].as_array().unwrap() {
        if e["name"] == "leaf" && e["ph"] == "X" {
            let args = e["args"]["args"].as_array().unwrap();
            assert!(args.iter().all(Value::is_string), "{e}");
            if args[0] == "-1" {
                assert_eq!(e["args"]["retval"], "-2", "{e}");
                seen += 1;
            }
        }
    }
    assert_eq!(seen, run.count(|c| c.name == "leaf" && c.arg == -1));
}

/// The virtualenv of scripts/setup.sh, or None (with a loud note) when it
/// is missing and HOTPROBE_SKIP_PY=1.
fn venv_python() -> Option<PathBuf> {
    let py = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/python");
    if py.exists() {
        return Some(py);
    }
    if std::env::var("HOTPROBE_SKIP_PY").as_deref() == Ok("1") {
        eprintln!("SKIPPED LOUDLY: no {} (HOTPROBE_SKIP_PY=1)", py.display());
        return None;
    }
    panic!(
        "{} is missing: run scripts/setup.sh (it installs opentelemetry-proto and duckdb \
         into .venv), or set HOTPROBE_SKIP_PY=1 to skip the Python-backed checks",
        py.display()
    );
}

#[test]
fn otlp_spans_follow_the_call_tree() {
    let Some(py) = venv_python() else { return };
    let run = run3();
    let out = tmp().join(format!("otlp-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&out);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/otlp_receiver.py");
    let mut rx = Command::new(&py)
        .arg(&script)
        .arg(&out)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python runs");
    let lines = line_reader(rx.stdout.take().unwrap());
    let port = match lines.recv_timeout(std::time::Duration::from_secs(20)) {
        Ok(l) => l.trim_start_matches("PORT ").to_string(),
        Err(_) => {
            let _ = rx.kill();
            let err = rx.wait_with_output().unwrap();
            panic!(
                "the OTLP receiver did not start (is opentelemetry-proto in .venv? \
                 run scripts/setup.sh): {}",
                text(&err.stderr)
            );
        }
    };
    let url = format!("http://127.0.0.1:{port}");
    let o = hotprobe(&["export", run.d(), "--format", "otlp", "--endpoint", &url]);
    let _ = rx.kill();
    let _ = rx.wait();
    assert!(o.status.success(), "{}", text(&o.stderr));
    let got: Vec<Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(got.iter().all(|v| v["signal"] != "error"), "decode errors");
    let spans: Vec<&Value> = got.iter().filter(|v| v["signal"] == "span").collect();
    assert_eq!(spans.len(), run.calls.len(), "one span per call");
    let prog = calls_program();
    let res = &spans[0]["resource"];
    assert_eq!(
        res["service.name"].as_str().unwrap(),
        prog.file_name().unwrap().to_str().unwrap()
    );
    assert_eq!(res["process.pid"].as_u64(), Some(run.calls[0].tid as u64));
    // Parent links: per thread, (function, caller) pairs as the program
    // logged them.
    let by_id: BTreeMap<&str, &Value> = spans
        .iter()
        .map(|s| (s["span_id"].as_str().unwrap(), *s))
        .collect();
    let mut got_edges: Vec<(u32, String, String)> = spans
        .iter()
        .map(|s| {
            let parent =
                by_id
                    .get(s["parent_span_id"].as_str().unwrap())
                    .map_or("-".to_string(), |p| {
                        assert_eq!(p["trace_id"], s["trace_id"]);
                        assert!(p["start"].as_u64() <= s["start"].as_u64());
                        assert!(p["end"].as_u64() >= s["end"].as_u64());
                        p["name"].as_str().unwrap().to_string()
                    });
            assert_eq!(s["attributes"]["code.function.name"], s["name"]);
            (
                s["attributes"]["thread.id"].as_u64().unwrap() as u32,
                s["name"].as_str().unwrap().to_string(),
                parent,
            )
        })
        .collect();
    let mut want_edges = Vec::new();
    let mut stack: Vec<&str> = Vec::new();
    for c in &run.calls {
        stack.truncate(c.depth);
        let parent = stack.last().map_or("-", |p| p).to_string();
        want_edges.push((c.tid, c.name.clone(), parent));
        stack.push(&c.name);
    }
    got_edges.sort();
    want_edges.sort();
    assert_eq!(got_edges, want_edges);
    // Arguments: leaf(-1).
    let neg = spans
        .iter()
        .filter(|s| s["name"] == "leaf" && s["attributes"]["hotprobe.args"][0] == -1)
        .count() as u64;
    assert_eq!(neg, run.count(|c| c.name == "leaf" && c.arg == -1));
    // Metrics: calls per function.
    let mut calls: BTreeMap<String, u64> = BTreeMap::new();
    for m in got
        .iter()
        .filter(|v| v["signal"] == "metric" && v["name"] == "hotprobe.calls")
    {
        assert_eq!(m["monotonic"], true);
        *calls
            .entry(
                m["attributes"]["code.function.name"]
                    .as_str()
                    .unwrap()
                    .into(),
            )
            .or_default() += m["value"].as_u64().unwrap();
    }
    assert_eq!(calls, run.per_function());
}

#[test]
fn parquet_rows_read_by_duckdb() {
    let run = run3();
    let file = tmp().join(format!("calls-{}.parquet", std::process::id()));
    let _ = std::fs::remove_file(&file);
    let o = hotprobe(&["export", run.d(), "--format", "parquet"]);
    assert_eq!(o.status.code(), Some(2), "parquet needs -o");
    ok(&[
        "export",
        run.d(),
        "--format",
        "parquet",
        "-o",
        file.to_str().unwrap(),
    ]);
    let Some(py) = venv_python() else { return };
    let q = format!(
        "import duckdb, json\n\
         f = {file:?}\n\
         one = lambda s: duckdb.sql(s).fetchall()\n\
         print(json.dumps({{\n\
           'rows': one(f\"select count(*) from '{{f}}'\")[0][0],\n\
           'by': dict(one(f\"select function, count(*) from '{{f}}' group by 1\")),\n\
           'neg': one(f\"select count(*) from '{{f}}' where function = 'leaf' and arg0 = -1 and retval = -2\")[0][0],\n\
           'maxdepth': one(f\"select max(depth) from '{{f}}'\")[0][0],\n\
           'tids': sorted(r[0] for r in one(f\"select distinct tid from '{{f}}'\")),\n\
           'slow': one(f\"select min(duration_ns) from '{{f}}' where function = 'slow'\")[0][0],\n\
         }}))\n",
        file = file.to_str().unwrap()
    );
    let o = Command::new(&py).arg("-c").arg(&q).output().unwrap();
    assert!(
        o.status.success(),
        "duckdb (in .venv: run scripts/setup.sh): {}",
        text(&o.stderr)
    );
    let v: Value = serde_json::from_str(text(&o.stdout).trim()).unwrap();
    assert_eq!(v["rows"].as_u64().unwrap(), run.calls.len() as u64);
    for (f, n) in run.per_function() {
        assert_eq!(v["by"][&f].as_u64(), Some(n), "{f}");
    }
    assert_eq!(
        v["neg"].as_u64().unwrap(),
        run.count(|c| c.name == "leaf" && c.arg == -1)
    );
    assert_eq!(
        v["maxdepth"].as_u64().unwrap() as usize,
        run.calls.iter().map(|c| c.depth).max().unwrap()
    );
    let mut tids = run.tids();
    tids.sort_unstable();
    let got: Vec<u32> = v["tids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(got, tids);
    assert!(v["slow"].as_u64().unwrap() >= 19_600_000);
}
