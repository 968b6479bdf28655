//! The Python package, as installed into the repository's .venv by
//! scripts/setup.sh, runs examples/python/*.py and tests/py/*.py against
//! programs compiled here: exact counts, changed return values, the
//! program's output. A missing package fails the tests (run
//! ./scripts/setup.sh), unless HOTPROBE_SKIP_PY=1.

#[path = "../../hotprobe-capi/tests/common/mod.rs"]
mod common;
use common::*;
use std::path::PathBuf;
use std::process::Command;

/// .venv/bin/python with `hotprobe` importable, or `None` (skipped
/// loudly) with HOTPROBE_SKIP_PY=1; a failure otherwise.
fn python() -> Option<PathBuf> {
    let py = root().join(".venv/bin/python");
    let ok = Command::new(&py)
        .args(["-c", "import hotprobe"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        assert_current(&py);
        return Some(py);
    }
    if std::env::var("HOTPROBE_SKIP_PY").as_deref() == Ok("1") {
        eprintln!(
            "SKIPPED LOUDLY: no hotprobe package in {} (HOTPROBE_SKIP_PY=1)",
            py.display()
        );
        return None;
    }
    panic!(
        "{} cannot import hotprobe: run ./scripts/setup.sh (it builds the package into .venv), \
         or set HOTPROBE_SKIP_PY=1 to skip the Python checks",
        py.display()
    );
}

/// The installed package is not older than this crate's sources (a
/// package built before a change would test the old code): else run
/// ./scripts/setup.sh again.
fn assert_current(py: &PathBuf) {
    let o = run_ok(Command::new(py).args([
        "-c",
        "import hotprobe, hotprobe._native as n; print(hotprobe.__file__); print(n.__file__)",
    ]));
    let installed = text(&o.stdout);
    let mtime = |p: &std::path::Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    let oldest_installed = installed
        .lines()
        .filter_map(|l| mtime(std::path::Path::new(l)))
        .min()
        .expect("installed files");
    let crate_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    for dir in ["src", "python/hotprobe"] {
        for e in std::fs::read_dir(crate_dir.join(dir)).unwrap() {
            let p = e.unwrap().path();
            if let Some(m) = mtime(&p) {
                assert!(
                    m <= oldest_installed,
                    "the hotprobe package in .venv is older than {}: run ./scripts/setup.sh",
                    p.display()
                );
            }
        }
    }
}

fn py_run(py: &PathBuf, args: &[&std::ffi::OsStr]) -> String {
    let o = run_ok(Command::new(py).args(args));
    text(&o.stdout)
}

#[test]
fn python_example_counts_calls_and_changes_a_return_value() {
    let Some(py) = python() else { return };
    let dir = scratch("py-example");
    let prog = compute(&dir, &[]);
    let script = root().join("examples/python/count_and_patch.py");
    let out = py_run(
        &py,
        &[
            script.as_os_str(),
            "compute".as_ref(),
            "7".as_ref(),
            "1000".as_ref(),
            prog.as_os_str(),
            "100".as_ref(),
        ],
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            // compute(7) returned 1000 instead of 49: the sum grows by 951.
            "sum 329301 last 99 twice 200",
            "calls 100 arg_sum 4950 patched 1",
            "probe hits 100 nmissed 0",
            "retprobe hits 100 returns 100 nmissed 0",
            "end exited exit 0",
        ]
    );
}

#[test]
fn python_example_counts_and_records_without_handlers() {
    let Some(py) = python() else { return };
    let dir = scratch("py-record");
    let prog = compute(&dir, &[]);
    let script = root().join("examples/python/count_and_record.py");
    let out = py_run(
        &py,
        &[
            script.as_os_str(),
            "comp*".as_ref(),
            "twice".as_ref(),
            prog.as_os_str(),
            "37".as_ref(),
        ],
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            // The program's own output, unchanged (sum of squares 0..36).
            "sum 16206 last 36 twice 74",
            "count compute 37",
            "total 37",
            "entry twice 37",
            "exit twice 74",
            "lost 0",
        ]
    );
}

#[test]
fn python_api_registers_memory_stop_disable_errors() {
    let Some(py) = python() else { return };
    let dir = scratch("py-api");
    let prog = compute(&dir, &["-no-pie"]);
    let nm = run_ok(Command::new("nm").arg(&prog));
    let last = text(&nm.stdout)
        .lines()
        .find(|l| l.split_whitespace().nth(2) == Some("last"))
        .map(|l| format!("0x{}", l.split_whitespace().next().unwrap()))
        .expect("`last` in nm output");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/api_checks.py");
    let out_path = dir.join("out");
    let out = py_run(
        &py,
        &[
            script.as_os_str(),
            prog.as_os_str(),
            last.as_ref(),
            out_path.as_os_str(),
        ],
    );
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "missing: True",
            "not callable: a handler must be callable",
            "mechanisms: jump trap",
            "run: stopped",
            "seen: [0, 1, 2, 3] lasts: [0, 1, 2]",
            "stale context: the handler context is valid only during its handler's call",
            "run: exited",
            "seen: [0, 1, 2, 3] lasts: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]",
            "nested: ['the session is running (called from a handler?)']",
            "stats: Stats(hits=4, nmissed=0, returns=0, abandoned=0) Stats(hits=10, nmissed=0, returns=10, abandoned=0)",
            "exit: ('exited', 0)",
            // compute(9) returned 0 (285 - 81), `last` as the handler wrote it.
            "out: sum 204 last 4242 twice 20",
            "raised: 'boom at 3'",
            "stop: stopped [0, 1, 2]",
            "rest: exited [0, 1, 2, 3, 4, 5] 6",
            "bad mechanism: mechanism \"teleport\": expected auto, patch, jump or trap",
        ],
        "full output:\n{out}"
    );
}

#[test]
fn python_trace_reader_returns_the_rows_written() {
    use hotprobe_trace::{Symbol, TimeBase, TraceEvent, TraceMeta, TraceWriter};
    let Some(py) = python() else { return };
    let dir = scratch("py-trace");
    let trace = dir.join("trace");
    let mut outer = Symbol::function(0, "outer");
    outer.nargs = 1;
    outer.retval = true;
    let mut inner = Symbol::function(1, "inner");
    inner.nargs = 2;
    inner.retval = true;
    let mut meta = TraceMeta::new("test", vec![outer, inner]);
    meta.time_base = TimeBase::Ns;
    let mut w = TraceWriter::create(&trace, meta).expect("create trace");
    for ev in [
        TraceEvent::entry(1000, 100, 0).with_args(&[7]),
        TraceEvent::entry(1100, 100, 1).with_args(&[1, 2]),
        TraceEvent::exit(1300, 100, 1).with_ret(3),
        TraceEvent::exit(2000, 100, 0).with_ret(9),
        TraceEvent::entry(5000, 200, 1).with_args(&[4, 5]),
        TraceEvent::exit(5050, 200, 1).with_ret(6),
    ] {
        w.write_event(&ev).expect("write event");
    }
    w.finish().expect("finish trace");
    let code = "import sys, hotprobe\n\
                for r in hotprobe.read_trace(sys.argv[1]): print(tuple(r))\n\
                try:\n    import pandas\nexcept ImportError:\n    pandas = None\n\
                if pandas is None:\n\
                \x20   try:\n        hotprobe.trace_frame(sys.argv[1])\n    except ImportError as e:\n        print('no pandas:', e)\n\
                else:\n\
                \x20   df = hotprobe.trace_frame(sys.argv[1])\n\
                \x20   print('no pandas: trace_frame needs pandas: pip install pandas')\n\
                \x20   print('frame', len(df), list(df.columns), int(df[df.kind == 'call'].dur_ns.sum()))\n";
    let out = py_run(&py, &["-c".as_ref(), code.as_ref(), trace.as_os_str()]);
    let mut lines: Vec<&str> = out.lines().collect();
    let frame = lines
        .iter()
        .position(|l| l.starts_with("frame "))
        .map(|i| lines.remove(i));
    assert_eq!(
        lines,
        [
            "(100, 'entry', 'outer', 1000, None, [7], None, 0)",
            "(100, 'call', 'inner', 1100, 200, [1, 2], 3, 0)",
            "(100, 'exit', 'outer', 2000, None, [], 9, 0)",
            "(200, 'call', 'inner', 5000, 50, [4, 5], 6, 0)",
            "no pandas: trace_frame needs pandas: pip install pandas",
        ]
    );
    if let Some(f) = frame {
        assert_eq!(
            f,
            "frame 4 ['tid', 'kind', 'function', 'ts_ns', 'dur_ns', 'args', 'ret', 'lost'] 250"
        );
    }
}

/// A typed probe's values (issue 24: `read_trace` gave their record
/// indices), in a TSC-timed trace (its times in ns once: they were
/// converted twice), with calibrated probe costs taken out as `report`
/// does.
#[test]
fn python_trace_reader_decodes_typed_values() {
    use hotprobe_trace::{
        MechanismCost, ProbeCosts, Shape, ShapeItem, Symbol, TimeBase, TraceEvent, TraceMeta,
        TraceWriter, ValueTypes,
    };
    let Some(py) = python() else { return };
    let dir = scratch("py-typed-trace");
    let trace = dir.join("trace");
    let mut work = Symbol::function(0, "work");
    work.nargs = 1;
    work.retval = true;
    let mut plain = Symbol::function(1, "plain");
    plain.nargs = 1;
    plain.retval = true;
    let mut meta = TraceMeta::new("test", vec![work, plain]);
    // 2 GHz: tick t is t / 2 ns.
    meta.time_base = TimeBase::tsc_hz(2_000_000_000);
    let mut w = TraceWriter::create(&trace, meta).expect("create trace");
    let item = |label: &str, shape| ShapeItem {
        label: label.into(),
        shape,
    };
    let mut types = ValueTypes::default();
    types.insert(
        0,
        vec![
            item("n", Shape::Signed(4)),
            item("name", Shape::Str),
            item("p", Shape::Ptr),
        ],
        vec![item("", Shape::F64)],
    );
    w.set_value_types(&types).expect("types");
    let mut costs = ProbeCosts::default();
    let jump = costs.mechanism(MechanismCost {
        label: "jump".into(),
        ns_per_hit: 100.0,
        how: "test".into(),
    });
    costs.probes.insert(0, jump);
    w.set_probe_costs(&costs).expect("costs");
    // work(16, "abc", NULL) = 2.5, entered at 2000 ticks (1000 ns), left
    // at 4000 (2000 ns): 1000 ns measured, 900 without the part of its
    // hits' cost between its stamps (100 ns: no leaf call on the jump caps
    // it); its entry's time moves back by its whole entry cost (100 ns,
    // before the stamp: docs/ANALYSIS.md, "Probe costs"), its exit's by
    // both.
    let mut entry = vec![0u8];
    entry.extend(16u64.to_le_bytes());
    entry.extend([1, 0]);
    entry.extend(3u16.to_le_bytes());
    entry.extend(b"abc");
    entry.push(4);
    let mut exit = vec![0u8];
    exit.extend(2.5f64.to_bits().to_le_bytes());
    w.write_event_values(&TraceEvent::entry(2000, 7, 0), &entry)
        .expect("entry");
    w.write_event(&TraceEvent::entry(2600, 7, 1).with_args(&[42]))
        .expect("plain entry");
    w.write_event(&TraceEvent::exit(3000, 7, 1).with_ret(5))
        .expect("plain exit");
    w.write_event_values(&TraceEvent::exit(4000, 7, 0), &exit)
        .expect("exit");
    w.finish().expect("finish trace");
    let code = "import sys, hotprobe\n\
                for r in hotprobe.read_trace(sys.argv[1]): print(tuple(r))\n";
    let out = py_run(&py, &["-c".as_ref(), code.as_ref(), trace.as_os_str()]);
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        [
            "(7, 'entry', 'work', 900, None, [16, 'abc', None], None, 0)",
            "(7, 'call', 'plain', 1200, 200, [42], 5, 0)",
            "(7, 'exit', 'work', 1800, None, [], 2.5, 0)",
        ]
    );
}

#[test]
fn python_ctrl_c_interrupts_run() {
    use std::io::BufRead;
    let Some(py) = python() else { return };
    let dir = scratch("py-interrupt");
    let prog = compute(&dir, &[]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/interrupt.py");
    let mut child = Command::new(&py)
        .arg(&script)
        .arg(&prog)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run python");
    let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let target: i32 = first
        .strip_prefix("pid ")
        .and_then(|p| p.trim().parse().ok())
        .unwrap_or_else(|| panic!("first line {first:?}"));
    // Let it run (and count) a moment, then Ctrl-C the Python process.
    std::thread::sleep(std::time::Duration::from_millis(500));
    let st = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut out, &mut rest).unwrap();
    let status = child.wait().unwrap();
    // The program runs on after detach: it is ours to end.
    let alive = Command::new("kill")
        .args(["-KILL", &target.to_string()])
        .status()
        .unwrap()
        .success();
    assert!(status.success(), "python: {status}, output {rest:?}");
    assert_eq!(
        rest.lines().collect::<Vec<_>>(),
        [
            "interrupted: hotprobe run interrupted (the probes stay: run() again, or detach())",
            "counted: True",
            "detached, exit status: ('detached', 0)",
        ]
    );
    assert!(alive, "the program did not survive the detach");
}

#[test]
fn python_session_refuses_other_threads_and_reads_over_1_mib() {
    let Some(py) = python() else { return };
    let dir = scratch("py-limits");
    let prog = compute(&dir, &[]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/limits.py");
    let out = py_run(&py, &[script.as_os_str(), prog.as_os_str()]);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "thread: HotprobeError: a Session is used from the thread that made it only \
             (ptrace ties the targets to that thread)",
            "run: exited",
            "read: ValueError: read of 1099511627776 bytes: at most 1048576 (1 MiB) per read",
            "read_cstr: ValueError: read of 1099511627776 bytes: at most 1048576 (1 MiB) per read",
            "read 8: 8 bytes",
            "exit: ('exited', 0)",
        ]
    );
}

/// `Session.count(t, spec, cond="arg0 > 256")` on a program compiled here
/// that calls `take` with known arguments: 5 of its 10 calls pass, the
/// unconditional count beside it is 10, on the fast path and on traps.
#[test]
fn python_conditional_count() {
    let Some(py) = python() else { return };
    let dir = scratch("py-cond-count");
    let src = root().join("crates/hotprobe-capi/tests/programs/sizes.c");
    let prog = gcc(&src, &dir.join("sizes"), &["-O1", "-g"]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/cond_count.py");
    for mechanism in ["auto", "trap"] {
        let out_path = dir.join(format!("out-{mechanism}"));
        let out = py_run(
            &py,
            &[
                script.as_os_str(),
                prog.as_os_str(),
                mechanism.as_ref(),
                out_path.as_os_str(),
            ],
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "types: ConditionalCount Count",
                "refused: the condition: column 7: expected an argument (arg0 to arg5) or a number, \
                 found the end of the condition",
                "refused: the condition: column 1: arg6 does not exist (arg0 to arg5: rdi, rsi, rdx, \
                 rcx, r8, r9)",
                "refused: take%return: conditions and histograms work on function entries (no \
                 %return)",
                "run: exited",
                "conditional: 5 {'take': 5} arg0 > 256 0 1",
                "unconditional: 10",
                "program: total 7004",
            ],
            "{mechanism}"
        );
    }
}

/// `Session.count(t, "put", cond=...)` with conditions naming `put`'s
/// parameters (tests/programs/params.c, compiled with -g): each count is
/// the number of calls whose arguments match, on the fast path and on
/// traps; an unknown parameter and a bad condition raise ValueError.
#[test]
fn python_conditional_count_by_parameter_name() {
    let Some(py) = python() else { return };
    let dir = scratch("py-named-cond");
    let src = root().join("crates/hotprobe-capi/tests/programs/params.c");
    let prog = gcc(&src, &dir.join("params"), &["-O1", "-g"]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/named_cond.py");
    for mechanism in ["auto", "trap"] {
        let out_path = dir.join(format!("out-{mechanism}"));
        let out = py_run(
            &py,
            &[
                script.as_os_str(),
                prog.as_os_str(),
                mechanism.as_ref(),
                out_path.as_os_str(),
            ],
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "refused: the condition: put has no parameter nosuch; its parameters: key, size",
                "refused: the condition: column 11: expected an argument (arg0 to arg5) or a \
                 number, found the end of the condition",
                "run: exited",
                // -2, -4, -7.
                "key < 0: 3 {'put': 3} 0",
                // 300, 4096, 257, 1000, 4000000000 (unsigned).
                "size > 256: 5 {'put': 5} 0",
                // 4096 (key 3), 257 (5), 4000000000 (8).
                "both: 3 {'put': 3} 0",
                // key 3, and size 0 (key -4).
                "mixed: 2 {'put': 2} 0",
                "program: sum 10",
            ],
            "{mechanism}"
        );
    }
}

/// A typed capture from Python (`Session.record(t, spec, typed=True)`) on
/// a program compiled with -g whose `work(int, double, const char *)`
/// logs each call: every parameter (`work`) and two named ones
/// (`work(s, i)`) in one session, with the values the program logged,
/// with the default mechanism and on traps; bad names and `%return`
/// refused before anything is placed.
#[test]
fn python_typed_capture() {
    let Some(py) = python() else { return };
    let dir = scratch("py-typed");
    let src = root().join("crates/hotprobe-capi/tests/programs/typed.c");
    let prog = gcc(&src, &dir.join("typed"), &["-O1", "-g"]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/typed.py");
    for mechanism in ["auto", "trap"] {
        let out_path = dir.join(format!("out-{mechanism}"));
        let out = py_run(
            &py,
            &[
                script.as_os_str(),
                prog.as_os_str(),
                mechanism.as_ref(),
                out_path.as_os_str(),
            ],
        );
        let printed = std::fs::read_to_string(&out_path).unwrap();
        // "work I D S = R" per call, S possibly with a space or empty.
        let calls: Vec<(&str, f64, &str, &str)> = printed
            .lines()
            .map(|l| {
                let (args, r) = l.strip_prefix("work ").unwrap().rsplit_once(" = ").unwrap();
                let mut it = args.splitn(3, ' ');
                let (i, d, s) = (it.next().unwrap(), it.next().unwrap(), it.next().unwrap());
                (i, d.parse().unwrap(), s, r)
            })
            .collect();
        assert_eq!(calls.len(), 4, "the program printed: {printed}");
        // On the fast path the first capture copies its values in the
        // target, and a second capture of the function is refused (see
        // typed.py); on the trap both are kept.
        let fast = mechanism == "auto";
        let mut want = match fast {
            true => vec![
                "second: refused: True".to_string(),
                "types: TypedRecording NoneType".into(),
            ],
            false => vec!["types: TypedRecording TypedRecording".to_string()],
        };
        want.extend([
            "refused: work has no parameter nosuch".into(),
            "refused: work%return: a typed capture records entries and returns: give the \
             function without %return"
                .into(),
            "run: exited".into(),
        ]);
        for (i, d, s, r) in &calls {
            want.push(format!("work entry True {i} {d} \"{s}\""));
            want.push(format!("work return True {r}"));
        }
        for (i, _, s, r) in calls.iter().filter(|_| !fast) {
            want.push(format!("work entry True s=\"{s}\" i={i}"));
            want.push(format!("work return True {r}"));
        }
        want.push("untyped: []".into());
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines, want, "{mechanism}");
    }
}

/// A conditional count naming a parameter, from Python, on a library the
/// program loads later (dlopen), unloads and loads again: the condition
/// compiles at each load and counts the calls it holds for; one naming
/// what the function lacks is a `ValueError` saying why when read.
#[test]
fn python_conditional_count_on_a_library_loaded_later() {
    let Some(py) = python() else { return };
    let dir = scratch("py-pending-cond");
    let programs = root().join("crates/hotprobe-cli/tests/programs");
    let lib = hotprobe_testkit::compile(
        "gcc",
        &programs.join("libtest.c"),
        &dir.join("libtest.so"),
        &["-O1", "-g", "-shared", "-fPIC"],
        &[],
    );
    let prog = hotprobe_testkit::compile(
        "gcc",
        &programs.join("dlopen_twice.c"),
        &dir.join("dlopen_twice"),
        &["-O1", "-g"],
        &["-ldl"],
    );
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/pending_cond.py");
    for mechanism in ["auto", "trap"] {
        let out_path = dir.join(format!("out-{mechanism}"));
        let out = py_run(
            &py,
            &[
                script.as_os_str(),
                prog.as_os_str(),
                lib.as_os_str(),
                mechanism.as_ref(),
                out_path.as_os_str(),
            ],
        );
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            [
                "placed: ['pending', 'pending']",
                "run: exited",
                // 1, 2 then 1, 2, 3.
                "x >= 1: 5 {'libtest.so:libfn': 5}",
                "size >= 1: `libtest.so:libfn if size >= 1`: the condition: libfn has no \
                 parameter size; its parameters: x; its hits are not counted",
                "program: first libfn 3; unloaded yes; second libfn 4; total libfn 7",
            ],
            "{mechanism}"
        );
    }
}

/// Issue 21's structure check with a Python host: a Python program that
/// installs its own SIGRTMIN+6 handler with `signal.signal` runs sessions
/// (ptrace traps, then the default mechanisms) on two children of
/// tests/programs/compute.c to their exit; its handler is still its own
/// (Python's table and the C-level `sigaction`), did not run meanwhile,
/// and runs on `os.kill(os.getpid(), SIGRTMIN+6)`. The children's counts
/// and output are the program's.
#[test]
fn python_host_keeps_its_own_sigrtmin_6_handler() {
    let Some(py) = python() else { return };
    let dir = scratch("py-host-signal");
    let prog = compute(&dir, &[]);
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/py/host_signal.py");
    let out = py_run(
        &py,
        &[script.as_os_str(), prog.as_os_str(), dir.as_os_str()],
    );
    let plain = text(&run_ok(Command::new(&prog).arg("2000")).stdout);
    // Sum of squares 0..1999.
    assert_eq!(plain, "sum 2664667000 last 1999 twice 4000\n");
    let mut want = vec!["installed: True True".to_string()];
    for m in ["trap", "auto"] {
        want.extend([
            format!("{m} run: exited"),
            format!("{m} hits: [2000, 2000]"),
            format!("{m} exit: [('exited', 0), ('exited', 0)]"),
            format!("{m} program: {}", plain.trim()),
            format!("{m} program: {}", plain.trim()),
            format!("{m} ran during the session: 0"),
            format!("{m} python handler kept: True"),
            format!("{m} C handler kept: True"),
            format!("{m} handler runs: True"),
        ]);
    }
    assert_eq!(out.lines().collect::<Vec<_>>(), want);
}
