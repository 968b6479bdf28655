//! Bad input (issue 22): one clear error line and exit code 2, never a
//! panic, a stack overflow or a hang, and the program not started. A
//! trace directory with a corrupt time base, a FIFO or a device in it,
//! and an empty or invalid filter are errors too (exit 1 or 2), and a
//! filter matching nothing says so.

mod common;

use common::{gcc, hotprobe_within, output_within, text, HOTPROBE};

mod record_support;
use record_support::{self as rs, json, record, row, run, tmp, SPIN};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(60);

/// A program that says it ran (`CALL` lines): consts.c at -O0.
fn program() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/consts.c");
    let out = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bad-input/consts");
    gcc(&src, &out, &["-O0"])
}

/// Exit code 2, exactly `line` on stderr, nothing on stdout, the program
/// not run.
fn assert_bad_input(o: &Output, line: &str) {
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(
        o.status.code(),
        Some(2),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert_eq!(stderr, format!("{line}\n"));
    assert_eq!(stdout, "");
}

#[test]
fn a_condition_20000_parentheses_deep_is_refused() {
    let prog = program();
    let deep = format!("{}arg0 == 1{}", "(".repeat(20_000), ")".repeat(20_000));
    let spec = format!("off if {deep}");
    let o = hotprobe_within(&["count", &spec, "--", prog.to_str().unwrap()], LIMIT);
    assert_bad_input(
        &o,
        &format!(
            "hotprobe: error: `off if {}...`: the condition: column 65: the condition nests \
             deeper than 64 levels (parentheses and `!`) (see hotprobe count --help)",
            "(".repeat(73)
        ),
    );
    // 64 levels are fine.
    let ok = format!("off if {}arg0 > 0{}", "(".repeat(64), ")".repeat(64));
    let o = hotprobe_within(&["count", &ok, "--", prog.to_str().unwrap()], LIMIT);
    assert!(o.status.success(), "{}", text(&o.stderr));
    // A chain of 5,000 comparisons: too long, not a deep recursion (one
    // argument holds at most 128 KiB).
    let spec = format!("off if {}", vec!["arg0 == 1"; 5_000].join(" && "));
    let o = hotprobe_within(&["count", &spec, "--", prog.to_str().unwrap()], LIMIT);
    // The 257th comparison starts after 256 of `arg0 == 1 && `.
    let column = 256 * "arg0 == 1 && ".len() + 1;
    assert_bad_input(
        &o,
        &format!(
            "hotprobe: error: `{}...`: the condition: column {column}: the condition has more \
             than 256 comparisons (see hotprobe count --help)",
            &spec[..80]
        ),
    );
}

#[test]
fn negative_and_zero_line_numbers_are_refused() {
    let prog = program();
    for (spec, why) in [
        ("prog.c:-1", "bad line number -1: line numbers start at 1"),
        (
            "consts.c:-20",
            "bad line number -20: line numbers start at 1",
        ),
        ("consts.c:+3", "bad line number +3: line numbers start at 1"),
        ("consts.c:0", "line numbers start at 1"),
    ] {
        let o = hotprobe_within(&["count", spec, "--", prog.to_str().unwrap()], LIMIT);
        assert_bad_input(
            &o,
            &format!(
                "hotprobe: error: cannot probe {spec}: bad probe spec \"{spec}\": {why} \
                 (expected [module:]function[+offset], [module:]0xADDR or file.c:LINE, \
                 optionally followed by %return)"
            ),
        );
    }
}

#[test]
fn hotprobe_agent_must_be_an_x86_64_shared_object() {
    let prog = program();
    let run = |agent: &Path| {
        let mut c = Command::new(HOTPROBE);
        c.args(["count", "off", "--", prog.to_str().unwrap()])
            .env("HOTPROBE_AGENT", agent);
        output_within(c, LIMIT)
    };
    let o = run(Path::new("/etc/passwd"));
    assert_bad_input(
        &o,
        "hotprobe: error: HOTPROBE_AGENT=/etc/passwd: not an ELF file (the agent is an ELF \
         shared object)",
    );
    // An executable (a PIE is ET_DYN too).
    let o = run(&prog);
    assert_bad_input(
        &o,
        &format!(
            "hotprobe: error: HOTPROBE_AGENT={}: a position-independent executable (DF_1_PIE), \
             not a shared object",
            prog.display()
        ),
    );
    // A relocatable object.
    let obj = prog.with_extension("o");
    let st = Command::new("gcc")
        .args(["-c", "-o"])
        .arg(&obj)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/consts.c"))
        .status()
        .expect("gcc runs");
    assert!(st.success());
    let o = run(&obj);
    assert_bad_input(
        &o,
        &format!(
            "hotprobe: error: HOTPROBE_AGENT={}: a relocatable object (ET_REL), not a shared \
             object (ET_DYN)",
            obj.display()
        ),
    );
}

/// A recorded `spin 3000` (3,000 calls of `work`) in `dir`.
fn spin_trace(dir: &Path) {
    let (rc, out, err) = record(dir, &[], &rs::program("spin", SPIN), &["3000"]);
    assert_eq!(rc, 3, "{err}");
    assert!(out.ends_with("end 3000\n"), "{out}");
    let (rc, info, err) = run(&["info", "--json", dir.to_str().unwrap()]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(json(&info)["calls"], 3001, "{info}");
}

/// Rewrites `info.json`'s time base with `f`.
fn edit_time_base(dir: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("info.json");
    let mut info = json(&std::fs::read_to_string(&p).unwrap());
    f(&mut info["time_base"]);
    std::fs::write(&p, serde_json::to_string(&info).unwrap()).unwrap();
}

#[test]
fn a_corrupt_time_base_is_an_error() {
    let good = tmp().join("timebase-good");
    spin_trace(&good);
    let d = good.to_str().unwrap();
    let (rc, rep, err) = run(&["report", "--json", d]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(row(&json(&rep), "work")["calls"], 3000);
    // Both calibration pairs at the same ns: every time the same (today:
    // a report of zeros); the first pair moved past the data: times before
    // ns 0 (today: clamped, zeros again).
    type Edit = fn(&mut serde_json::Value);
    let cases: [(&str, Edit); 2] = [
        ("same-ns", |tb| tb["ns1"] = tb["ns0"].clone()),
        ("tsc0-late", |tb| {
            let (t0, t1) = (tb["tsc0"].as_u64().unwrap(), tb["tsc1"].as_u64().unwrap());
            tb["tsc0"] = (t0 * 1000).into();
            tb["tsc1"] = (t0 * 1000 + (t1 - t0)).into();
        }),
    ];
    for (name, f) in cases {
        let dir = tmp().join(format!("timebase-{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for e in std::fs::read_dir(&good).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
        edit_time_base(&dir, f);
        let d = dir.to_str().unwrap();
        for cmd in [&["report", d][..], &["replay", d], &["info", d]] {
            let (rc, out, err) = run(cmd);
            assert_eq!(rc, 1, "{name}: hotprobe {cmd:?}: {out}{err}");
            let line = err.lines().find(|l| l.starts_with("hotprobe: error: "));
            let line = line.unwrap_or_else(|| panic!("{name}: no error line: {err}"));
            assert!(line.contains("corrupt time base"), "{name}: {line}");
            assert!(!out.contains("work"), "{name}: {cmd:?} printed {out}");
        }
    }
}

#[test]
fn fifos_and_devices_in_a_trace_directory_are_refused() {
    let good = tmp().join("fifo-good");
    spin_trace(&good);
    let tid = std::fs::read_dir(&good)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("tid-"))
        .unwrap();
    for (file, kind) in [
        ("info.json", "fifo"),
        ("symbols.tsv", "fifo"),
        (tid.as_str(), "fifo"),
        ("types.tsv", "fifo"),
        ("symbols.tsv", "device"),
    ] {
        let dir = tmp().join(format!("fifo-{kind}-{file}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for e in std::fs::read_dir(&good).unwrap() {
            let e = e.unwrap();
            std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
        }
        let p = dir.join(file);
        std::fs::remove_file(&p).unwrap();
        let what = if kind == "fifo" {
            let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
            // SAFETY: a valid NUL-terminated path.
            assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
            "a FIFO"
        } else {
            std::os::unix::fs::symlink("/dev/zero", &p).unwrap();
            "a character device"
        };
        let d = dir.to_str().unwrap();
        let refused = format!(
            "{}: not a regular file but {what}: refused (reading it could block or have effects)",
            p.display()
        );
        for cmd in [
            &["replay", d][..],
            &["report", d],
            &["info", d],
            &["export", "--format", "chrome", d],
        ] {
            let t = Instant::now();
            let (rc, out, err) = run(cmd);
            assert_eq!(rc, 1, "{file} {kind}: hotprobe {cmd:?}: {out}{err}");
            assert!(
                err.lines()
                    .any(|l| l.starts_with("hotprobe: error: ") && l.ends_with(&refused)),
                "{file} {kind}: hotprobe {cmd:?}: {err}"
            );
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{cmd:?} took {:?}",
                t.elapsed()
            );
        }
    }
}

#[test]
fn invalid_or_empty_filters_are_errors_and_filters_matching_nothing_say_so() {
    let dir = tmp().join("filters");
    spin_trace(&dir);
    let d = dir.to_str().unwrap();
    let bad = "filter pattern: bad name pattern \"[\": unclosed character class; missing ']'";
    for (cmd, line) in [
        (
            &["replay", "-F", "[", d][..],
            format!("{bad} (see hotprobe replay --help)"),
        ),
        (
            &["replay", "-F", "", d],
            "empty filter pattern (it would match nothing) (see hotprobe replay --help)".into(),
        ),
        (
            &["replay", "-N", "", d],
            "empty notrace pattern (it would match nothing) (see hotprobe replay --help)".into(),
        ),
        (
            &["report", "-F", "[", d],
            format!("{bad} (see hotprobe report --help)"),
        ),
        (
            &["report", "--marker", "", d],
            "--marker \"\": give a function name (see hotprobe report --help)".into(),
        ),
    ] {
        let (rc, out, err) = run(cmd);
        assert_eq!(rc, 2, "hotprobe {cmd:?}: {out}{err}");
        assert_eq!(out, "", "{cmd:?}");
        assert_eq!(err, format!("hotprobe: error: {line}\n"), "{cmd:?}");
    }
    for cmd in [
        &["replay", "-F", "nosuch*", d][..],
        &["report", "-F", "nosuch*", d],
    ] {
        let (rc, out, err) = run(cmd);
        assert_eq!(rc, 0, "hotprobe {cmd:?}: {err}");
        assert_eq!(out, "", "{cmd:?}");
        assert_eq!(err, "hotprobe: no call matches -F nosuch*\n", "{cmd:?}");
    }
    let (rc, out, err) = run(&["report", "--marker", "nosuch", d]);
    assert_eq!(rc, 0, "{err}");
    assert!(
        err.lines()
            .any(|l| l == "hotprobe: no call matches --marker nosuch"),
        "{err}"
    );
    assert!(out.contains("work"), "{out}");
    // A valid filter that matches keeps its calls.
    let (rc, out, err) = run(&["replay", "-F", "wor?", d]);
    assert_eq!(rc, 0, "{err}");
    assert_eq!(out.matches("work();").count(), 3000, "{out}");
}
