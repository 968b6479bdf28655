//! `hotprobe export --format otlp` to a real OpenTelemetry Collector (built
//! by scripts/setup.sh through scripts/otelcol.sh with the collector
//! builder: OTLP receiver, file exporter). A program with typed arguments
//! on four threads (tests/programs/otlp_typed.c) logs each call with its
//! thread id; `record -a` records it, the export goes to the collector on
//! a free port, and what the collector wrote to its own files must hold
//! every recorded call as a span with its function name, thread and typed
//! arguments and return value, and the call counts as metrics.

mod common;

use common::{gcc, hotprobe, line_reader, text};
use hotprobe_testkit::TempDir;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The functions the program logs (`CALL <tid> name(args) = ret`); each
/// calls `tid()` once.
const LOGGED: &[&str] = &["greet", "scale", "paint"];
/// Threads: main runs worker 0, then three more threads run workers 1-3.
const THREADS: usize = 4;

fn tmp() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("otlp-collector");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The collector binary, where scripts/otelcol.sh puts it (its `--path`
/// says where, without building). Missing: the test fails, saying how to
/// build it.
fn collector() -> PathBuf {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/otelcol.sh");
    let o = Command::new("bash")
        .arg(&script)
        .arg("--path")
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
    assert!(o.status.success(), "{}", text(&o.stderr));
    let bin = PathBuf::from(text(&o.stdout).trim());
    assert!(
        bin.is_file(),
        "no OpenTelemetry Collector at {}: run scripts/setup.sh (it builds one with \
         scripts/otelcol.sh, about 5 minutes once, then reuses it)",
        bin.display()
    );
    bin
}

/// A running collector, killed on drop (a failed assertion leaves none).
struct Collector {
    child: Child,
    port: u16,
    traces: PathBuf,
    metrics: PathBuf,
    log: std::sync::mpsc::Receiver<String>,
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Collector {
    /// Starts `bin` with an OTLP/HTTP receiver on a free loopback port and
    /// one file exporter per signal into `dir`; returns once it says it is
    /// ready. A port taken between choosing and binding is tried again.
    fn start(bin: &Path, dir: &Path) -> Collector {
        let mut last = String::new();
        for attempt in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let traces = dir.join(format!("traces-{attempt}.jsonl"));
            let metrics = dir.join(format!("metrics-{attempt}.jsonl"));
            let config = dir.join(format!("collector-{attempt}.yaml"));
            let yaml = [
                "receivers:".to_string(),
                "  otlp:".into(),
                "    protocols:".into(),
                "      http:".into(),
                format!("        endpoint: 127.0.0.1:{port}"),
                "exporters:".into(),
                "  file/traces:".into(),
                format!("    path: {}", traces.display()),
                "    flush_interval: 100ms".into(),
                "  file/metrics:".into(),
                format!("    path: {}", metrics.display()),
                "    flush_interval: 100ms".into(),
                "service:".into(),
                // No internal metrics server (it would take port 8888).
                "  telemetry:".into(),
                "    metrics:".into(),
                "      level: none".into(),
                "  pipelines:".into(),
                "    traces:".into(),
                "      receivers: [otlp]".into(),
                "      exporters: [file/traces]".into(),
                "    metrics:".into(),
                "      receivers: [otlp]".into(),
                "      exporters: [file/metrics]".into(),
            ];
            std::fs::write(&config, yaml.join("\n") + "\n").unwrap();
            let mut child = Command::new(bin)
                .arg("--config")
                .arg(&config)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
            let log = line_reader(child.stderr.take().unwrap());
            let deadline = Instant::now() + Duration::from_secs(60);
            last.clear();
            loop {
                let left = deadline.saturating_duration_since(Instant::now());
                match log.recv_timeout(left) {
                    Ok(l) if l.contains("Everything is ready") => {
                        return Collector {
                            child,
                            port,
                            traces,
                            metrics,
                            log,
                        };
                    }
                    Ok(l) => {
                        last.push_str(&l);
                        last.push('\n');
                    }
                    // Closed stderr (it exited) or no word within the limit.
                    Err(_) => break,
                }
            }
            let _ = child.kill();
            let _ = child.wait();
            if !last.contains("address already in use") {
                break;
            }
        }
        panic!("the collector did not start:\n{last}");
    }

    /// SIGTERM, then its exit: the file exporters flush and close.
    fn stop(mut self) {
        // SAFETY: a signal to the child this test started (not yet waited).
        let r = unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        assert_eq!(r, 0, "kill: {}", std::io::Error::last_os_error());
        // Its stderr (the log) closes when it exits.
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut log = Vec::new();
        loop {
            match self
                .log
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(l) => log.push(l),
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!(
                    "the collector did not stop within 30 s of SIGTERM:\n{}",
                    log.join("\n")
                ),
            }
        }
        let st = self.child.wait().unwrap();
        assert!(
            st.success(),
            "the collector ended with {st}:\n{}",
            log.join("\n")
        );
    }
}

/// The OTLP JSON requests of a file exporter's complete lines (a line
/// being written is left for the next read).
fn requests(file: &Path) -> Vec<Value> {
    let s = std::fs::read_to_string(file).unwrap_or_default();
    let complete = s.rfind('\n').map_or("", |i| &s[..=i]);
    complete
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// Every span of the requests, with its resource's attributes.
fn spans(reqs: &[Value]) -> Vec<(&Value, &Value)> {
    let mut out = Vec::new();
    for r in reqs {
        for rs in r["resourceSpans"].as_array().unwrap() {
            for ss in rs["scopeSpans"].as_array().unwrap() {
                assert_eq!(ss["scope"]["name"], "hotprobe");
                for s in ss["spans"].as_array().unwrap() {
                    out.push((s, &rs["resource"]));
                }
            }
        }
    }
    out
}

/// An attribute's value: strings as they are, ints (OTLP JSON writes
/// int64 as a string) as their digits, arrays as their items joined by
/// ", ".
fn attr(owner: &Value, key: &str) -> Option<String> {
    let kv = owner["attributes"]
        .as_array()?
        .iter()
        .find(|kv| kv["key"] == key)?;
    Some(any_value(&kv["value"]))
}

fn any_value(v: &Value) -> String {
    if let Some(s) = v["stringValue"].as_str() {
        s.to_string()
    } else if let Some(i) = v.get("intValue") {
        i.as_str().map_or_else(|| i.to_string(), str::to_string)
    } else if let Some(a) = v.get("arrayValue") {
        a["values"]
            .as_array()
            .map(|vs| vs.iter().map(any_value).collect::<Vec<_>>().join(", "))
            .unwrap_or_default()
    } else {
        panic!("unexpected value {v}")
    }
}

#[test]
fn every_recorded_call_arrives_at_a_real_collector() {
    let bin = collector();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/otlp_typed.c");
    let prog = gcc(&src, &tmp().join("otlp_typed"), &["-O0"]);
    let work = TempDir::new("otlp-collector");
    let rec = work.path().join("rec");
    let o = hotprobe(&[
        "record",
        "-a",
        "-o",
        rec.to_str().unwrap(),
        "--",
        prog.to_str().unwrap(),
    ]);
    let stderr = text(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    // The program's own log: "<tid> name(args) = ret" per call.
    let mut logged: Vec<String> = stderr
        .lines()
        .filter_map(|l| l.strip_prefix("CALL "))
        .map(str::to_string)
        .collect();
    logged.sort();
    // Workers w make 2 + w rounds of the three functions.
    let rounds: usize = (0..THREADS).map(|w| 2 + w).sum();
    assert_eq!(logged.len(), rounds * LOGGED.len(), "{stderr}");
    let tid_of = |l: &str| l.split_once(' ').unwrap().0.to_string();
    let mut logged_per_thread: BTreeMap<String, u64> = BTreeMap::new();
    for l in &logged {
        *logged_per_thread.entry(tid_of(l)).or_default() += 1;
    }
    assert_eq!(logged_per_thread.len(), THREADS, "{logged:#?}");
    // Recorded: main, each worker, each logged call and its tid() call.
    let want_spans = 1 + THREADS + 2 * logged.len();

    let col = Collector::start(&bin, work.path());
    let url = format!("http://127.0.0.1:{}", col.port);
    let o = hotprobe(&[
        "export",
        rec.to_str().unwrap(),
        "--format",
        "otlp",
        "--endpoint",
        &url,
    ]);
    let says = text(&o.stderr);
    assert!(o.status.success(), "{says}");
    assert!(
        says.contains(&format!("hotprobe: {want_spans} spans, ")) && says.contains(&url),
        "{says}"
    );
    // Until the collector's files hold every span and the metrics.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = spans(&requests(&col.traces)).len();
        if n >= want_spans && !requests(&col.metrics).is_empty() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "after 60 s the collector wrote {n} of {want_spans} spans to {}",
            col.traces.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (traces, metrics) = (col.traces.clone(), col.metrics.clone());
    col.stop();

    let trace_reqs = requests(&traces);
    let got = spans(&trace_reqs);
    assert_eq!(got.len(), want_spans, "one span per recorded call");
    let main_tid = main_tid(&stderr, &logged);
    for (_, res) in &got {
        assert_eq!(
            attr(res, "service.name").as_deref(),
            prog.file_name().unwrap().to_str()
        );
        assert_eq!(attr(res, "process.pid"), Some(main_tid.clone()));
    }
    // Per span: its thread, name, typed arguments and return value, as the
    // program logged them.
    let by_id: BTreeMap<(&str, &str), &Value> = got
        .iter()
        .map(|(s, _)| {
            (
                (
                    s["traceId"].as_str().unwrap(),
                    s["spanId"].as_str().unwrap(),
                ),
                *s,
            )
        })
        .collect();
    let mut shown = Vec::new();
    let mut per_thread: BTreeMap<(String, String), u64> = BTreeMap::new();
    for (s, _) in &got {
        let name = s["name"].as_str().unwrap();
        let tid = attr(s, "thread.id").expect("a thread.id attribute");
        assert_eq!(attr(s, "code.function.name").as_deref(), Some(name));
        *per_thread
            .entry((name.to_string(), tid.clone()))
            .or_default() += 1;
        let parent = s["parentSpanId"]
            .as_str()
            .filter(|p| !p.is_empty())
            .map(|p| {
                let ps = by_id[&(s["traceId"].as_str().unwrap(), p)];
                assert_eq!(attr(ps, "thread.id").as_ref(), Some(&tid));
                ps["name"].as_str().unwrap()
            });
        let args = attr(s, "hotprobe.args").unwrap_or_default();
        let ret = attr(s, "hotprobe.retval").unwrap_or_default();
        match name {
            n if LOGGED.contains(&n) => {
                assert_eq!(parent, Some("worker"), "{s}");
                shown.push(format!("{tid} {name}({args}) = {ret}"));
            }
            "tid" => {
                assert!(LOGGED.contains(&parent.unwrap()), "{s}");
                assert_eq!(
                    (args.as_str(), &ret),
                    ("", &tid),
                    "tid() returns its thread id"
                );
            }
            "worker" => assert_eq!(parent, (tid == main_tid).then_some("main"), "{s}"),
            "main" => assert_eq!((parent, &tid), (None, &main_tid), "{s}"),
            _ => panic!("a span of a function the program does not have: {s}"),
        }
    }
    shown.sort();
    assert_eq!(
        shown, logged,
        "typed calls: the collector's spans vs the log"
    );
    for (tid, n) in &logged_per_thread {
        assert_eq!(per_thread[&("tid".to_string(), tid.clone())], *n);
        assert_eq!(per_thread[&("worker".to_string(), tid.clone())], 1);
    }

    // Metrics: hotprobe.calls per function and thread, as counted above.
    let mut calls: BTreeMap<(String, String), u64> = BTreeMap::new();
    for r in requests(&metrics) {
        for rm in r["resourceMetrics"].as_array().unwrap() {
            for sm in rm["scopeMetrics"].as_array().unwrap() {
                for m in sm["metrics"].as_array().unwrap() {
                    if m["name"] != "hotprobe.calls" {
                        continue;
                    }
                    assert_eq!(m["sum"]["isMonotonic"], true);
                    for p in m["sum"]["dataPoints"].as_array().unwrap() {
                        let key = (
                            attr(p, "code.function.name").unwrap(),
                            attr(p, "thread.id").unwrap(),
                        );
                        let v: u64 = p["asInt"].as_str().unwrap().parse().unwrap();
                        *calls.entry(key).or_default() += v;
                    }
                }
            }
        }
    }
    assert_eq!(calls, per_thread, "hotprobe.calls vs the spans");
}

/// The main thread's id (the pid): the thread whose worker(0) greets
/// "ada", as the program logged it.
fn main_tid(stderr: &str, logged: &[String]) -> String {
    logged
        .iter()
        .find(|l| l.contains(" greet(\"ada\", "))
        .map(|l| l.split_once(' ').unwrap().0.to_string())
        .unwrap_or_else(|| panic!("no greet(\"ada\") in the log: {stderr}"))
}
