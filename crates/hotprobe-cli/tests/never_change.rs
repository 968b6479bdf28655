//! "Never change what the program does", the agent's part: a longjmp out
//! of recorded frames replays as the program ran; a SIGALRM handler is
//! counted exactly, and under `record` what the agent could not write is
//! reported, not lost silently; and killing hotprobe with SIGKILL while
//! it is attached (trap probes, fast-path probes), 20 times at moments
//! drawn from a printed seed (`HOTPROBE_KILL_SEED` repeats them), leaves
//! a program that finishes with its normal output.
//!
//! The C programs (tests/programs/) print their own counts; every
//! assertion compares with what they printed.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{
    call_tree, drops, gcc, hotprobe_within, kill_group, line_reader, printed, text, CountTable,
    HOTPROBE,
};
use hotprobe_testkit::SeededMoments;

const LIMIT: Duration = Duration::from_secs(60);

fn out_dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("never-change");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// tests/programs/NAME.c built with `flags` (once per tag).
fn build(name: &str, tag: &str, flags: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/programs")
        .join(format!("{name}.c"));
    gcc(&src, &out_dir().join(format!("{name}-{tag}")), flags)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// `hotprobe record -o DIR ARGS -- CMD`: (program's stdout, hotprobe's stderr).
fn record(dir: &Path, args: &[&str], cmd: &[&str]) -> (String, String) {
    let _ = std::fs::remove_dir_all(dir);
    let mut a = vec!["record", "-o", s(dir)];
    a.extend_from_slice(args);
    a.push("--");
    a.extend_from_slice(cmd);
    let o = hotprobe_within(&a, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "record failed: {err}");
    (out, err)
}

fn analyse(args: &[&str]) -> String {
    let o = hotprobe_within(args, LIMIT);
    assert!(o.status.success(), "{args:?}: {}", text(&o.stderr));
    text(&o.stdout)
}

/// Calls per function as `report` counts them.
fn report_calls(dir: &Path) -> BTreeMap<String, u64> {
    let report = analyse(&["report", s(dir)]);
    let mut calls = BTreeMap::new();
    for l in report.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.len() >= 2 {
            if let Ok(n) = w[w.len() - 2].parse::<u64>() {
                calls.insert(w[w.len() - 1].to_string(), n);
            }
        }
    }
    calls
}

#[test]
fn longjmp_out_of_recorded_frames_replays_as_the_program_ran() {
    let prog = build(
        "longjmp",
        "o1",
        &["-O1", "-fno-inline", "-fno-optimize-sibling-calls"],
    );
    let dir = out_dir().join("longjmp.trace");
    let (out, err) = record(&dir, &["--exclude", "note_*"], &[s(&prog)]);
    assert!(err.contains("drops:    0 "), "{err}");
    let logged: Vec<(u32, usize, String)> = out
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(f.len(), 3, "odd program line {l:?}");
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].to_string(),
            )
        })
        .collect();
    assert_eq!(logged.len(), 1 + 100 * (1 + 5 + 2));
    let replay = analyse(&["replay", s(&dir)]);
    assert!(!replay.contains("lost"), "{replay}");
    assert_eq!(call_tree(&replay), logged, "replay:\n{replay}");
}

fn alarm() -> PathBuf {
    build("alarm", "o1", &["-O1", "-fno-inline"])
}

#[test]
fn a_sigalrm_handler_is_counted_exactly() {
    let prog = alarm();
    for _ in 0..5 {
        let o = hotprobe_within(
            &["count", "on_alarm", "work", "--", s(&prog), "1000", "50"],
            LIMIT,
        );
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert!(o.status.success(), "{err}");
        let t = CountTable::parse(&out, &err);
        for f in ["on_alarm", "work"] {
            assert_ne!(t.execution(f), "trap", "{f} on the fast path:\n{out}");
        }
        assert_eq!(t.hits("on_alarm"), printed(&out, "handled "), "{out}");
        assert_eq!(t.hits("work"), printed(&out, "work "), "{out}");
        let missed = t.col("NMISSED");
        assert_eq!(t.row("on_alarm")[missed], "0", "{out}");
    }
}

/// The handler interrupts `work` while the agent records it (its thread
/// is then inside the agent: the handler's hit counts but cannot be
/// written): every call of the handler is in the trace, or its two events
/// are in the drops record reports, and nothing of `work` is lost.
#[test]
fn sigalrm_handler_events_lost_under_record_are_reported() {
    let prog = alarm();
    let mut refused = 0;
    for run in 0..3 {
        let dir = out_dir().join(format!("alarm-{run}.trace"));
        let (out, err) = record(
            &dir,
            &[
                "--ring-events",
                "4194304",
                "--max-threads",
                "2",
                "on_alarm",
                "work",
            ],
            &[s(&prog), "200", "1000", "400"],
        );
        let handled = printed(&out, "handled ");
        let calls = report_calls(&dir);
        let recorded = calls.get("on_alarm").copied().unwrap_or(0);
        let lost = drops(&err);
        assert_eq!(
            2 * recorded + lost,
            2 * handled,
            "events recorded + drops = the handler's events:\n{out}\n{err}"
        );
        assert_eq!(calls.get("work"), Some(&printed(&out, "work ")), "{err}");
        refused += lost;
    }
    // The signal landed in the agent at least once over the runs (≈ 10 %
    // of the main loop's time is spent there).
    assert!(
        refused > 0,
        "no refused event in 3 runs: the test tests nothing"
    );
}

const ROUNDS: u64 = 400;

/// `rounds` run natively: its output after the "ready" line.
fn rounds_output(prog: &Path) -> String {
    let mut c = Command::new(prog)
        .arg(ROUNDS.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(b"go\n").unwrap();
    let o = c.wait_with_output().unwrap();
    assert!(o.status.success());
    text(&o.stdout)
        .lines()
        .skip(1)
        .map(|l| format!("{l}\n"))
        .collect()
}

/// 20 times: starts `rounds`, attaches `hotprobe count PROBES -p PID`,
/// lets the program go once the probes are in, reads a seeded number of
/// its lines (the seed printed, `HOTPROBE_KILL_SEED` repeats it), kills
/// hotprobe with SIGKILL; the program must finish with its normal output
/// and status.
fn sigkill_during_count(probes: &[&str], trap: bool) {
    // Every function begins with endbr64: room for a guard int3 one byte
    // into each probed instruction (see hotprobe_abi::TRAP_GUARD; a
    // 1-byte first instruction leaves a window of a few µs per hit).
    let prog = build(
        "rounds",
        "cet",
        &["-O1", "-fno-inline", "-fcf-protection=branch"],
    );
    let expected = rounds_output(&prog);
    let mut moments = SeededMoments::from_env("HOTPROBE_KILL_SEED", "kill moments");
    let seed = moments.seed();
    for run in 0..20u64 {
        // The kill moment: after this many lines of the program's output.
        let lines_before_kill = moments.in_range(0..60);
        let mut child = Command::new(&prog)
            .arg(ROUNDS.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let pgid = child.id() as i32;
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let ready = lines.next().unwrap().unwrap();
        let pid = ready.strip_prefix("ready ").expect("ready PID").to_string();
        let mut args = vec!["count"];
        args.extend_from_slice(probes);
        args.extend(["-p", &pid]);
        let mut hp = Command::new(HOTPROBE)
            .args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let err = line_reader(hp.stderr.take().unwrap());
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut said = Vec::new();
        loop {
            let l = err
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .unwrap_or_else(|_| panic!("hotprobe never attached: {said:?}"));
            let attached = l.contains("attached to pid");
            said.push(l);
            if attached {
                break;
            }
        }
        // "... N probes (trap 3)", or patch/jump only.
        assert_eq!(said.last().unwrap().contains("trap"), trap, "{said:?}");
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        let mut out = String::new();
        for _ in 0..lines_before_kill {
            let l = lines.next().unwrap().unwrap();
            out.push_str(&l);
            out.push('\n');
        }
        hp.kill().unwrap();
        hp.wait().unwrap();
        for l in lines {
            out.push_str(&l.unwrap());
            out.push('\n');
        }
        let status = child.wait().unwrap();
        let mut stderr = String::new();
        let _ = std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr);
        kill_group(pgid);
        assert!(
            status.success(),
            "run {run} (HOTPROBE_KILL_SEED={seed}, killed after {lines_before_kill} lines): \
             the program ended with {status} after hotprobe was killed\n\
             hotprobe said {said:?}\nprogram printed:\n{out}\n{stderr}"
        );
        // The lines read before the kill and after it, together.
        assert_eq!(
            out, expected,
            "run {run} (HOTPROBE_KILL_SEED={seed}, killed after {lines_before_kill} lines)"
        );
    }
}

#[test]
fn sigkill_of_hotprobe_with_trap_probes_leaves_the_program_running() {
    sigkill_during_count(
        &[
            "--mechanism",
            "trap",
            "step",
            "step%return",
            "round_%return",
        ],
        true,
    );
}

#[test]
fn sigkill_of_hotprobe_with_fast_path_probes_leaves_the_program_running() {
    sigkill_during_count(&["step", "round_"], false);
}
