//! The host kernel's events in a trace (format version 3): written
//! through a TSC time base, read back in ns, shown by replay inside the
//! call that made them, summed per function by report, put on the
//! thread's track by the Chrome export and counted by info; a version 2
//! trace (no kernel events) still reads.

use hotprobe_trace::*;

const TID: u32 = 4242;
const MS: u64 = 1_000_000;

/// `main` calls `wait_for_data` (a leaf: one call record) whose `read`
/// blocks 200 ms, off the CPU for 199 ms of it; `main` also calls
/// `getpid` outside it. The TSC runs at 3 GHz, tick 0 at ns 1e9.
fn trace(dir: &std::path::Path) -> TimeBase {
    let tb = TimeBase::Tsc {
        tsc0: 0,
        ns0: 1_000 * MS,
        tsc1: 3_000_000_000,
        ns1: 2_000 * MS,
    };
    let mut meta = TraceMeta::new(
        "prog",
        vec![
            Symbol::function(0, "main"),
            Symbol::function(1, "wait_for_data"),
        ],
    );
    meta.time_base = tb;
    meta.pid = Some(TID);
    let mut w = TraceWriter::create(dir, meta).unwrap();
    let t = |ms: u64| tb.ticks_at_ns(1_000 * MS + ms * MS);
    for ev in [
        TraceEvent::entry(t(10), TID, 0),
        TraceEvent::entry(t(20), TID, 1),
        TraceEvent::exit(t(221), TID, 1),
        TraceEvent::exit(t(230), TID, 0),
    ] {
        w.write_event(&ev).unwrap();
    }
    let ns = |ms: u64| 1_000 * MS + ms * MS;
    let kernel = [
        KernelEvent {
            start: ns(15),
            end: ns(15) + 500,
            kind: KernelKind::Syscall {
                nr: 39,
                ret: TID as i64,
            },
        },
        KernelEvent {
            start: ns(20) + 1000,
            end: ns(220) + 1000,
            kind: KernelKind::Syscall { nr: 0, ret: 5 },
        },
        KernelEvent {
            start: ns(21),
            end: ns(220),
            kind: KernelKind::OffCpu { preempted: false },
        },
    ];
    w.write_kernel_thread(TID, TID, &kernel).unwrap();
    w.note_kernel(6, 2, 0, 0);
    w.finish().unwrap();
    tb
}

#[test]
fn replay_report_chrome_and_info_show_the_kernel_events() {
    let dir = tempfile::tempdir().unwrap();
    trace(dir.path());
    let r = TraceReader::open(dir.path()).unwrap();
    assert_eq!(r.info().version, FORMAT_VERSION);
    let k = r.kernel_events(TID).unwrap();
    assert_eq!(k.len(), 3);
    let read = k.iter().find(|e| e.name() == "read").unwrap();
    assert!(read.dur().abs_diff(200 * MS) <= 2, "{read:?}");

    let mut out = Vec::new();
    replay(&r, &mut out, None).unwrap();
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.split(" | ").nth(1).unwrap_or(l))
        .collect();
    assert_eq!(
        lines[1..],
        [
            "main() {",
            "  syscall:getpid() = 4242;",
            "  wait_for_data() {",
            "    syscall:read() = 5;",
            "  }; /* wait_for_data */",
            "}; /* main */",
        ],
        "{text}"
    );
    let read_line = text.lines().find(|l| l.contains("syscall:read")).unwrap();
    assert!(
        read_line.trim_start().starts_with("200.000 ms"),
        "{read_line}"
    );

    let rep = report(&r, None).unwrap();
    assert!(rep.kernel);
    let w = rep.row("wait_for_data").unwrap();
    assert_eq!(
        w.off_cpu_ns.map(|n| n.abs_diff(199 * MS) <= 2),
        Some(true),
        "{w:?}"
    );
    assert_eq!(
        w.syscall_ns.map(|n| n.abs_diff(200 * MS) <= 2),
        Some(true),
        "{w:?}"
    );
    let m = rep.row("main").unwrap();
    assert!(m.syscall_ns.unwrap() > w.syscall_ns.unwrap());
    let text = rep.to_text();
    assert!(
        text.starts_with("  Total time   Self time     Off-CPU  In syscall"),
        "{text}"
    );
    assert!(
        text.lines()
            .any(|l| l.contains("199.") && l.ends_with("wait_for_data")),
        "{text}"
    );

    let mut out = Vec::new();
    let st = export_chrome(&r, &mut out, None).unwrap();
    assert_eq!(st.kernel, 3);
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let ev = v["traceEvents"].as_array().unwrap();
    let span = ev.iter().find(|e| e["name"] == "read").unwrap();
    assert_eq!(span["cat"], "syscall");
    assert_eq!(span["tid"], TID);
    assert_eq!(span["ph"], "X");
    let dur = span["dur"].as_f64().unwrap();
    assert!((dur - 200_000.0).abs() < 0.01, "{span}");
    let func = ev.iter().find(|e| e["name"] == "wait_for_data").unwrap();
    assert_eq!(
        (func["pid"].clone(), func["tid"].clone()),
        (span["pid"].clone(), span["tid"].clone())
    );
    assert!(ev.iter().any(|e| e["cat"] == "off-cpu" && e["tid"] == TID));

    let s = summarize(&r, None).unwrap();
    let line = s
        .to_text()
        .lines()
        .find(|l| l.starts_with("# kernel:"))
        .unwrap()
        .to_string();
    assert_eq!(
        line,
        "# kernel:        2 syscalls, 1 off-CPU intervals in 1 threads; 6 records taken, \
         2 lost by the kernel, 0 unpaired"
    );
}

#[test]
fn a_damaged_kernel_file_is_an_error_and_a_version_2_trace_still_reads() {
    let dir = tempfile::tempdir().unwrap();
    trace(dir.path());
    let kfile = dir.path().join(kernel_file_name(TID));
    let bytes = std::fs::read(&kfile).unwrap();
    let mut bad = bytes.clone();
    bad[24] = 9;
    std::fs::write(&kfile, &bad).unwrap();
    let r = TraceReader::open(dir.path()).unwrap();
    let e = r.kernel_events(TID).unwrap_err().to_string();
    assert!(e.contains("unknown record tag 9"), "{e}");
    assert!(replay(&r, &mut Vec::new(), None).is_err());
    std::fs::write(&kfile, &bytes[..bytes.len() - 1]).unwrap();
    let e = r.kernel_events(TID).unwrap_err().to_string();
    assert!(e.contains("info.json says"), "{e}");

    // Version 2: no `kernel` in info.json, no kernel files.
    std::fs::remove_file(&kfile).unwrap();
    let ip = dir.path().join(INFO_FILE);
    let mut info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&ip).unwrap()).unwrap();
    info["version"] = 2.into();
    info.as_object_mut().unwrap().remove("kernel");
    std::fs::write(&ip, info.to_string()).unwrap();
    let r = TraceReader::open(dir.path()).unwrap();
    assert!(r.kernel_info().is_none());
    let mut out = Vec::new();
    replay(&r, &mut out, None).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert!(!text.contains("syscall:"), "{text}");
    assert!(text.contains("wait_for_data();"), "{text}");
    let rep = report(&r, None).unwrap();
    assert!(!rep.kernel && rep.row("main").unwrap().off_cpu_ns.is_none());
    assert!(!rep.to_text().contains("Off-CPU"));
}
