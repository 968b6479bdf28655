//! The probes' calibrated costs (costs.tsv) taken out of a trace's times,
//! when the calibration is too high for what was measured (a recording
//! calibrated on a loaded machine): each correction is capped at the
//! shortest whole call measured on the mechanism, the reader says so
//! (`correction_warning`, the overhead note), and a calibration that fits
//! gives no warning. Traces written through the writer API with exact
//! times: no timing here.

use hotprobe_trace::*;

const MAIN: u32 = 0;
const LEAF: u32 = 1;
/// The leaf's ten calls as measured (ns): the shortest is 2000.
const LEAF_NS: [u64; 10] = [2600, 2000, 3000, 2500, 4000, 2200, 2000, 9000, 2100, 3300];
/// The gap between two leaf calls, and main's tail after the last: as a
/// gap holds half of a hit's cost either side, more than any cost here.
const GAP: u64 = 2500;

/// A trace of main (jump) calling leaf (in-process trap) ten times, with
/// `trap_ns` and `jump_ns` a hit in costs.tsv, main's exit `tail` ns after
/// the last leaf's. Returns main's measured duration.
fn write(dir: &std::path::Path, trap_ns: f64, jump_ns: f64, tail: u64) -> u64 {
    let syms = vec![
        Symbol::function(MAIN, "main"),
        Symbol::function(LEAF, "leaf"),
    ];
    let mut w = TraceWriter::create(dir, TraceMeta::new("costs", syms)).unwrap();
    let mut costs = ProbeCosts::default();
    let jump = costs.mechanism(MechanismCost {
        label: "jump".into(),
        ns_per_hit: jump_ns,
        how: "written by the test".into(),
    });
    let trap = costs.mechanism(MechanismCost {
        label: "in-process trap".into(),
        ns_per_hit: trap_ns,
        how: "written by the test".into(),
    });
    costs.probes.insert(MAIN, jump);
    costs.probes.insert(LEAF, trap);
    w.set_probe_costs(&costs).unwrap();
    let t0 = 1_000_000;
    let mut t = t0;
    w.write_event(&TraceEvent::entry(t, 7, MAIN)).unwrap();
    for d in LEAF_NS {
        t += GAP;
        w.write_event(&TraceEvent::entry(t, 7, LEAF)).unwrap();
        t += d;
        w.write_event(&TraceEvent::exit(t, 7, LEAF)).unwrap();
    }
    t += tail;
    w.write_event(&TraceEvent::exit(t, 7, MAIN)).unwrap();
    w.finish().unwrap();
    t - t0
}

fn rows(r: &TraceReader) -> (ReportRow, ReportRow) {
    let rep = report(r, None).unwrap();
    (
        rep.row("main").unwrap().clone(),
        rep.row("leaf").unwrap().clone(),
    )
}

#[test]
fn a_cost_above_the_shortest_call_is_capped_there_and_said() {
    let dir = tempfile::Builder::new()
        .prefix("costs-capped")
        .tempdir()
        .unwrap();
    // 16 µs a trap hit, as calibrated on a loaded machine: every leaf
    // call measured less.
    let main_ns = write(dir.path(), 16_000.0, 10.0, GAP);
    let mut r = TraceReader::open(dir.path()).unwrap();
    let (main, leaf) = rows(&r);
    let cap = 2000;
    let measured: u64 = LEAF_NS.iter().sum();
    // Each leaf call loses the cap, not 16 µs: the shortest ones at
    // exactly 0, the others more.
    assert_eq!(leaf.calls, 10);
    assert_eq!(leaf.total_ns, measured - 10 * cap);
    assert_eq!(leaf.min_ns, 0);
    assert_eq!(leaf.max_ns, 9000 - cap);
    // The 30 µs that a leaf call's hits would cost its caller outside the
    // leaf take each 2.5 µs gap before a leaf below zero: each held at
    // 0, the excess dropped, so that main's tail loses only its exit's
    // 10 ns.
    assert_eq!(main.self_ns, GAP - 10);
    assert_eq!(main.total_ns, main.self_ns + leaf.total_ns);
    assert!(main.total_ns < main_ns);
    let w = r.correction_warning().expect("a warning");
    assert_eq!(
        w,
        "warning: 10 of 22 probe hits came sooner after the record before them than the \
         probes' calibrated costs allow (that time held at zero); in-process trap: 16.00 µs \
         a hit, its shortest call 2.00 µs; the calibration looks too high (a loaded machine \
         when recording?): --raw-times gives the times as measured"
    );
    let note = r.overhead_note().unwrap();
    assert!(
        note.contains("in-process trap 16.00 µs (2.00 µs of it within its calls: their shortest)"),
        "{note}"
    );

    // As measured: no correction, no warning.
    r.set_overhead_correction(false);
    let (main, leaf) = rows(&r);
    assert_eq!((main.total_ns, leaf.total_ns), (main_ns, measured));
    assert_eq!(r.correction_warning(), None);
}

#[test]
fn a_cost_that_fits_is_taken_out_whole_without_a_warning() {
    let dir = tempfile::Builder::new()
        .prefix("costs-sane")
        .tempdir()
        .unwrap();
    let main_ns = write(dir.path(), 1_000.0, 10.0, GAP);
    let r = TraceReader::open(dir.path()).unwrap();
    let (main, leaf) = rows(&r);
    let measured: u64 = LEAF_NS.iter().sum();
    // A leaf call loses its two hits' share within it (1000 ns), main
    // its exit's (10 ns) and both hits of each leaf call.
    assert_eq!(leaf.total_ns, measured - 10 * 1000);
    assert_eq!(main.total_ns, main_ns - 10 - 20 * 1000);
    assert_eq!(r.correction_warning(), None);
    let note = r.overhead_note().unwrap();
    assert!(!note.contains("within its calls"), "{note}");
}

#[test]
fn calls_the_correction_holds_at_zero_are_counted_and_said() {
    let dir = tempfile::Builder::new()
        .prefix("costs-held")
        .tempdir()
        .unwrap();
    // main's hits cost 100 ns, but its exit came 20 ns after the last
    // leaf's: the correction (its exit's 100 ns: no leaf on the jump caps
    // it) would put it before that exit. 1 hit of 22 held.
    write(dir.path(), 1_000.0, 100.0, 20);
    let r = TraceReader::open(dir.path()).unwrap();
    let (main, leaf) = rows(&r);
    // Each gap before a leaf loses its entry's 1000 ns, the tail is held
    // at 0.
    assert_eq!(main.self_ns, 10 * (GAP - 1000), "{main:?}");
    assert_eq!(leaf.calls, 10);
    let w = r.correction_warning().expect("a warning");
    assert!(
        w.starts_with(
            "warning: 1 of 22 probe hits came sooner after the record before them than the \
             probes' calibrated costs allow (that time held at zero); the calibration"
        ),
        "{w}"
    );
}

#[test]
fn the_warning_waits_for_the_streams_to_be_read() {
    let dir = tempfile::Builder::new()
        .prefix("costs-unread")
        .tempdir()
        .unwrap();
    write(dir.path(), 16_000.0, 10.0, GAP);
    let r = TraceReader::open(dir.path()).unwrap();
    assert_eq!(r.correction_warning(), None, "nothing read yet");
    // Reading a stream twice counts its calls once.
    for _ in 0..2 {
        for rec in r.thread(7).unwrap() {
            rec.unwrap();
        }
    }
    assert!(r.correction_warning().is_some());
}

/// `info.json`'s version rewritten to `v`.
fn set_version(dir: &std::path::Path, v: u32) {
    let ip = dir.join(INFO_FILE);
    let mut info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&ip).unwrap()).unwrap();
    assert_eq!(
        info["version"], FORMAT_VERSION,
        "written in the current version"
    );
    info["version"] = v.into();
    std::fs::write(&ip, info.to_string()).unwrap();
}

#[test]
fn version_6_has_the_costs_and_a_version_5_trace_still_reads() {
    assert_eq!(FORMAT_VERSION, 6);
    let dir = tempfile::Builder::new()
        .prefix("costs-v5")
        .tempdir()
        .unwrap();
    let main_ns = write(dir.path(), 1_000.0, 10.0, GAP);
    let measured: u64 = LEAF_NS.iter().sum();
    assert_eq!(TraceReader::open(dir.path()).unwrap().info().version, 6);
    // A version 5 trace as its recorder wrote it: no costs.tsv. It reads,
    // with its times as measured and no note.
    set_version(dir.path(), 5);
    let costs = dir.path().join(COSTS_FILE);
    let kept = std::fs::read_to_string(&costs).unwrap();
    std::fs::remove_file(&costs).unwrap();
    let r = TraceReader::open(dir.path()).unwrap();
    assert_eq!(r.info().version, 5);
    assert!(r.probe_costs().is_none() && !r.overhead_corrected());
    assert_eq!(r.overhead_note(), None);
    assert!(r.trap_functions().is_empty());
    let (main, leaf) = rows(&r);
    assert_eq!((main.total_ns, leaf.total_ns), (main_ns, measured));
    let mut out = Vec::new();
    replay(&r, &mut out, None).unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap().matches("leaf();").count(),
        10
    );
    // A version 5 trace written with costs.tsv before the bump, in the
    // file's first form (its v1 header): read with its costs.
    std::fs::write(
        &costs,
        kept.replace("#hotprobe probe costs v2", "#hotprobe probe costs v1"),
    )
    .unwrap();
    let r = TraceReader::open(dir.path()).unwrap();
    assert!(r.overhead_corrected());
    let (_, leaf) = rows(&r);
    assert_eq!(leaf.total_ns, measured - 10 * 1000);
}

#[test]
fn an_uncalibrated_mechanism_keeps_its_hits_and_the_others_are_taken_out() {
    let dir = tempfile::Builder::new()
        .prefix("costs-uncalibrated")
        .tempdir()
        .unwrap();
    let main_ns = write(dir.path(), 1_000.0, 10.0, GAP);
    let measured: u64 = LEAF_NS.iter().sum();
    // The in-process trap's calibration refused: its line says why, its
    // probe keeps its mechanism; the jump's cost stays.
    let path = dir.path().join(COSTS_FILE);
    let mut c = ProbeCosts::parse(&std::fs::read_to_string(&path).unwrap(), &path).unwrap();
    c.mechanisms.retain(|m| m.label == "jump");
    c.probes.retain(|&id, _| id == MAIN);
    c.probes.insert(MAIN, 0);
    let u = c.uncalibrated(UncalibratedMechanism {
        label: "in-process trap".into(),
        why: "200000 ns a hit in every round, more than it can cost".into(),
    });
    c.uncalibrated_probes.insert(LEAF, u);
    c.write(&path).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        text,
        "#hotprobe probe costs v2\n\
         mechanism\tjump\t10.000\twritten by the test\n\
         uncalibrated\tin-process trap\t200000 ns a hit in every round, more than it can cost\n\
         probe\t0\tjump\n\
         probe\t1\tin-process trap\n"
    );
    assert_eq!(ProbeCosts::parse(&text, &path).unwrap(), c);
    let r = TraceReader::open(dir.path()).unwrap();
    let (main, leaf) = rows(&r);
    // The leaf's calls as measured; main loses its own exit's 10 ns only.
    assert_eq!(leaf.total_ns, measured);
    assert_eq!(main.total_ns, main_ns - 10);
    let note = r.overhead_note().unwrap();
    assert!(
        note.starts_with("times without the probes' costs (a hit: jump 10 ns")
            && note.ends_with(
                "; in-process trap not calibrated (200000 ns a hit in every round, more \
                 than it can cost): its hits' cost left in the times"
            ),
        "{note}"
    );
    assert_eq!(
        r.trap_functions(),
        vec![("leaf".to_string(), "in-process trap".to_string())]
    );
    // The report marks it on a trap, its cost left in.
    let text = report(&r, None).unwrap().to_text();
    assert!(
        text.ends_with("# * on a trap (in-process trap: µs a hit, left in these times)\n"),
        "{text}"
    );
    // A label listed as both, or a probe listed twice, is refused.
    for bad in [
        format!("{text}uncalibrated\tjump\twhy\n"),
        format!("{text}probe\t1\tjump\n"),
    ] {
        assert!(ProbeCosts::parse(&bad, &path).is_err(), "{bad}");
    }
}

/// `replay`'s tree of the trace `write` wrote (thread 7), each leaf call
/// `leaf_ns` and main `main_ns`, as it must read with the leaf's lines
/// marked `*` and `legend` last (`None`: no mark, no legend).
fn marked_tree(leaf_ns: &[u64], main_ns: u64, legend: Option<&str>) -> String {
    let mark = if legend.is_some() { '*' } else { ' ' };
    let mut t = String::from("# DURATION     TID     FUNCTION\n");
    t.push_str("            [     7] | main() {\n");
    for &ns in leaf_ns {
        t.push_str(&format!(
            "{mark}{} [     7] |   leaf();\n",
            fmt_duration(ns)
        ));
    }
    t.push_str(&format!(
        " {} [     7] | }}; /* main */\n",
        fmt_duration(main_ns)
    ));
    if let Some(l) = legend {
        t.push_str(&format!("{l}\n"));
    }
    t
}

fn replayed(r: &TraceReader) -> String {
    let mut out = Vec::new();
    replay(r, &mut out, None).unwrap();
    String::from_utf8(out).unwrap()
}

fn folded(r: &TraceReader) -> String {
    let mut out = Vec::new();
    export_folded(r, &mut out, FoldedOptions::default(), None).unwrap();
    String::from_utf8(out).unwrap()
}

#[test]
fn the_report_text_marks_functions_on_a_trap_with_a_legend() {
    let dir = tempfile::Builder::new()
        .prefix("costs-marked")
        .tempdir()
        .unwrap();
    let main_ns = write(dir.path(), 1_000.0, 10.0, GAP);
    let mut r = TraceReader::open(dir.path()).unwrap();
    let text = report(&r, None).unwrap().to_text();
    let lines: Vec<&str> = text.lines().collect();
    // The header as ever; the leaf's row (on the in-process trap) starts
    // with `*`, main's (jump) with a space; the legend ends the table.
    assert!(lines[0].starts_with("  Total time   Self time"), "{text}");
    let row = |f: &str| {
        *lines
            .iter()
            .find(|l| l.split_whitespace().last() == Some(f))
            .unwrap_or_else(|| panic!("no {f} in\n{text}"))
    };
    assert!(row("leaf").starts_with("* "), "{text}");
    assert!(row("main").starts_with("  "), "{text}");
    assert_eq!(
        lines.last().copied(),
        Some("# * on a trap (in-process trap: µs a hit, taken out of these times as calibrated)")
    );
    // JSON: the row says its mechanism, main's has no such field.
    let rep = report(&r, None).unwrap();
    let v = serde_json::to_value(&rep).unwrap();
    let json_rows = v["rows"].as_array().unwrap();
    let of = |f: &str| {
        json_rows
            .iter()
            .find(|x| x["function"] == f)
            .unwrap()
            .clone()
    };
    assert_eq!(of("leaf")["on_trap"], "in-process trap");
    assert!(of("main").get("on_trap").is_none());
    // replay marks the leaf's lines the same way and ends with the same
    // legend: each call 1 µs shorter (its share of the trap's two hits,
    // 1 µs each); main's lines unmarked.
    let (main, leaf) = rows(&r);
    let measured: u64 = LEAF_NS.iter().sum();
    assert_eq!(leaf.self_ns, measured - 10 * 1000);
    let corrected: Vec<u64> = LEAF_NS.iter().map(|ns| ns - 1000).collect();
    let legend =
        "# * on a trap (in-process trap: µs a hit, taken out of these times as calibrated)";
    assert_eq!(
        replayed(&r),
        marked_tree(&corrected, main.total_ns, Some(legend))
    );
    // The folded stacks: the mechanism after the leaf's name.
    assert_eq!(
        folded(&r),
        format!(
            "main {}\nmain;leaf [in-process trap] {}\n",
            main.self_ns, leaf.self_ns
        )
    );
    // As measured: still marked, the legend says the cost is in.
    r.set_overhead_correction(false);
    let text = report(&r, None).unwrap().to_text();
    assert!(
        text.ends_with("# * on a trap (in-process trap: µs a hit, left in these times)\n"),
        "{text}"
    );
    let (main, leaf) = rows(&r);
    assert_eq!((main.total_ns, leaf.self_ns), (main_ns, measured));
    let legend = "# * on a trap (in-process trap: µs a hit, left in these times)";
    assert_eq!(replayed(&r), marked_tree(&LEAF_NS, main_ns, Some(legend)));
    assert_eq!(
        folded(&r),
        format!(
            "main {}\nmain;leaf [in-process trap] {measured}\n",
            main_ns - measured
        )
    );
    // A trace without costs (before version 6): no mark, no legend.
    std::fs::remove_file(dir.path().join(COSTS_FILE)).unwrap();
    let r = TraceReader::open(dir.path()).unwrap();
    let text = report(&r, None).unwrap().to_text();
    assert!(!text.contains('*') && !text.contains("# "), "{text}");
    assert_eq!(replayed(&r), marked_tree(&LEAF_NS, main_ns, None));
    assert_eq!(
        folded(&r),
        format!("main {}\nmain;leaf {measured}\n", main_ns - measured)
    );
}

/// What the exports with room for text say of the times and the
/// functions on a trap (the leaf, on the in-process trap): the CTF
/// metadata's env, the flame graph's subtitle, the Parquet file's
/// key-value metadata, the OTLP resource and the leaf's spans.
#[test]
fn the_exports_say_what_the_times_are_and_name_the_functions_on_a_trap() {
    let dir = tempfile::Builder::new()
        .prefix("costs-exports")
        .tempdir()
        .unwrap();
    write(dir.path(), 1_000.0, 10.0, GAP);
    let r = TraceReader::open(dir.path()).unwrap();
    let line = "times without the probes' costs (a hit: jump 10 ns, in-process trap 1.00 µs, \
                calibrated when the recording started; --raw-times: as measured); on a trap: \
                leaf (in-process trap)";
    let ctf = dir.path().join("ctf");
    export_ctf(&r, &ctf, None).unwrap();
    let meta = std::fs::read_to_string(ctf.join("metadata")).unwrap();
    // TSDL strings are ASCII: `µ` is written `?`.
    let ascii = line.replace('µ', "?");
    assert!(
        meta.contains(&format!("probe_costs = \"{ascii}\";")),
        "{meta}"
    );
    #[cfg(feature = "flamegraph")]
    {
        let mut svg = Vec::new();
        export_flamegraph(
            &r,
            &CompiledQuery::all(),
            &FlameOptions::default(),
            &mut svg,
            None,
        )
        .unwrap();
        let svg = String::from_utf8(svg).unwrap();
        assert!(svg.contains("on a trap: leaf (in-process trap)"), "{svg}");
    }
    #[cfg(feature = "parquet")]
    {
        use parquet::file::reader::{FileReader, SerializedFileReader};
        let path = dir.path().join("calls.parquet");
        let f = std::fs::File::create(&path).unwrap();
        export_parquet(&r, &CompiledQuery::all(), f, None).unwrap();
        let rd = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
        let kv: std::collections::HashMap<String, Option<String>> = rd
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .unwrap()
            .iter()
            .map(|k| (k.key.clone(), k.value.clone()))
            .collect();
        assert_eq!(kv["hotprobe.probe_costs"].as_deref(), Some(line));
        assert_eq!(
            kv["hotprobe.on_traps"].as_deref(),
            Some(r#"[{"function":"leaf","mechanism":"in-process trap"}]"#)
        );
    }
    #[cfg(feature = "otlp")]
    {
        let mut bodies = Vec::new();
        export_otlp(
            &r,
            &CompiledQuery::all(),
            &OtlpOptions::default(),
            |sig, body| {
                if sig == OtlpSignal::Traces {
                    bodies.push(body);
                }
                Ok(())
            },
            None,
        )
        .unwrap();
        let has = |s: &str| {
            bodies
                .iter()
                .any(|b| b.windows(s.len()).any(|w| w == s.as_bytes()))
        };
        assert!(has("hotprobe.probe_costs") && has(line), "resource");
        assert!(has("hotprobe.on_trap") && has("in-process trap"), "spans");
    }
}
