//! Issue 21's three bugs, through the CLI, on programs the tests compile:
//! two probes of different mechanisms at one function (one site joins or
//! takes over the other, never writes over it), return hooks where `[rsp]`
//! is no return address, and the exit notice. Each program prints its own
//! counts; the table must equal them and the output must be the program's.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;
use common::{
    file_offset_of, hotprobe_within, memory_at, mix_program, program_output, text, CountTable,
    MixServer,
};

#[path = "../../hotprobe/tests/nonlocal_support/mod.rs"]
mod nonlocal_support;
use nonlocal_support::*;

/// The longest any run here may take; one still going is a hang.
const LIMIT: Duration = Duration::from_secs(120);

/// HITS and NMISSED of the one row of `probe`.
fn hits_and_missed(t: &CountTable, probe: &str) -> (u64, u64) {
    let r = t.row(probe);
    let n = |c: &str| r[t.col(c)].parse::<u64>().unwrap();
    (n("HITS"), n("NMISSED"))
}

/// `hotprobe count ARGS -- BIN PROGRAM_ARGS`: its table, checked to come
/// with the program's own output and a zero exit.
fn count(args: &[&str], bin: &Path, program_args: &[&str]) -> (CountTable, String) {
    let mut all: Vec<&str> = vec!["count"];
    all.extend(args);
    all.push("--");
    all.push(bin.to_str().unwrap());
    all.extend(program_args);
    let out = hotprobe_within(&all, LIMIT);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{all:?}\n{stdout}\n{stderr}");
    let want = native_output(bin, program_args);
    assert_eq!(program_output(&stdout), want, "{all:?}\n{stderr}");
    (CountTable::parse(&stdout, &stderr), stderr)
}

#[test]
fn an_entry_and_a_return_probe_on_a_function_an_exception_goes_through_in_both_orders() {
    let bin = throw_cc();
    let want = native_output(&bin, &["300"]);
    let (calls, returns) = (field(&want, "leaf_calls"), field(&want, "leaf_returns"));
    for mechanism in ["auto", "trap"] {
        for pair in [["leaf%return", "leaf"], ["leaf", "leaf%return"]] {
            let args = ["--mechanism", mechanism, pair[0], pair[1]];
            let (t, stderr) = count(&args, &bin, &["300"]);
            assert_eq!(
                hits_and_missed(&t, "leaf"),
                (calls, 0),
                "{args:?}\n{stderr}"
            );
            assert_eq!(
                hits_and_missed(&t, "leaf%return"),
                (returns, 0),
                "{args:?}\n{stderr}"
            );
        }
    }
}

#[test]
fn an_entry_and_a_return_probe_on_a_function_longjmp_leaves_in_both_orders() {
    let bin = nonlocal_c("-O1");
    let want = native_output(&bin, &["longjmp", "100"]);
    let (calls, returns) = (field(&want, "calls"), field(&want, "returns"));
    for pair in [["deep%return", "deep"], ["deep", "deep%return"]] {
        let (t, stderr) = count(&pair, &bin, &["longjmp", "100"]);
        assert_eq!(hits_and_missed(&t, "deep").0, calls, "{pair:?}\n{stderr}");
        assert_eq!(t.hits("deep%return"), returns, "{pair:?}\n{stderr}");
    }
}

#[test]
fn a_probe_inside_the_bytes_of_a_jump_and_the_jump_count_in_both_orders() {
    let bin = mix_program();
    for pair in [["mix", "mix+3"], ["mix+3", "mix"]] {
        let (t, stderr) = count(&pair, &bin, &["10"]);
        assert_eq!(hits_and_missed(&t, "mix"), (10, 0), "{pair:?}\n{stderr}");
        assert_eq!(hits_and_missed(&t, "mix+3"), (10, 0), "{pair:?}\n{stderr}");
    }
    // The jump placed first is handed to the trap, and says so.
    let (t, stderr) = count(&["mix", "mix+3"], &bin, &["10"]);
    assert!(
        stderr.contains("the fast-path site at") && stderr.contains("was handed to the trap"),
        "{stderr}"
    );
    assert!(t.execution("mix+3").starts_with("trap"), "{}", t.all);
}

#[test]
fn return_probes_are_refused_where_nothing_returns_and_main_returns_once() {
    let bin = mix_program();
    let b = bin.to_str().unwrap();
    for (spec, why) in [
        (
            "_start%return",
            "_start does not return: it is the entry point of mix ([rsp] holds argc, not a return address)",
        ),
        ("libc.so.6:exit%return", "exit does not return"),
        (
            "libc.so.6:__libc_start_main%return",
            "__libc_start_main does not return",
        ),
    ] {
        let out = hotprobe_within(&["count", spec, "--", b, "10"], LIMIT);
        let stderr = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{spec}: {stderr}");
        assert!(
            stderr.contains(&format!("cannot probe {spec}: {why}")),
            "{spec}: {stderr}"
        );
    }
    let (t, _) = count(&["main%return"], &bin, &["10"]);
    assert_eq!(hits_and_missed(&t, "main%return"), (1, 0));
}

#[test]
fn record_and_trace_of_entry_points_leave_argc_and_take_entries_only() {
    let bin = mix_program();
    let b = bin.to_str().unwrap();
    let want = native_output(&bin, &["10"]);
    assert_eq!(want, "argc=2\niterations=10 sum=103\n");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ledger-traces");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for (i, args) in [
        vec!["record", "-o", "", "*"],
        vec!["record", "-o", "", "_start"],
        vec!["trace", "_start"],
    ]
    .into_iter()
    .enumerate()
    {
        let out_dir = dir.join(format!("t{i}"));
        let mut all: Vec<&str> = args
            .iter()
            .map(|a| match *a {
                "" => out_dir.to_str().unwrap(),
                a => a,
            })
            .collect();
        all.extend(["--", b, "10"]);
        let out = hotprobe_within(&all, LIMIT);
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{all:?}\n{stdout}\n{stderr}");
        // The program's own lines, unchanged (trace prints its tree too).
        let lines: Vec<&str> = stdout
            .lines()
            .filter(|l| l.starts_with("argc=") || l.starts_with("iterations="))
            .collect();
        assert_eq!(
            lines,
            ["argc=2", "iterations=10 sum=103"],
            "{all:?}\n{stderr}"
        );
        assert!(
            stderr.contains(
                "hotprobe: _start: entries only, no return hooked (_start does not return"
            ),
            "{all:?}\n{stderr}"
        );
        if args[0] == "record" {
            assert!(
                stderr.contains("entry only (1 that do not return: no return hooked): _start"),
                "{all:?}\n{stderr}"
            );
        }
    }
}

#[test]
fn a_normal_exit_names_no_dropped_probes() {
    let bin = throw_cc();
    // A return probe brings the session's own trap-table publisher.
    let (t, stderr) = count(&["leaf%return"], &bin, &["30"]);
    assert!(t.hits("leaf%return") > 0);
    assert!(stderr.contains(" exited with code 0\n"), "{stderr}");
    assert!(!stderr.contains("dropped"), "{stderr}");
}

/// The bytes of `bin`'s file behind run-time address `addr` of `pid`.
fn file_bytes_at(pid: u32, bin: &Path, addr: u64, len: usize) -> Vec<u8> {
    let off = file_offset_of(pid, addr) as usize;
    std::fs::read(bin).unwrap()[off..off + len].to_vec()
}

#[test]
fn after_detach_a_running_program_holds_the_files_code_where_both_probes_were() {
    let bin = mix_program();
    for pair in [["mix", "mix+3"], ["mix+3", "mix"]] {
        let mut server = MixServer::start();
        let pid = server.pid();
        let p = pid.to_string();
        let out = hotprobe_within(
            &["count", "-p", &p, "--duration", "1", pair[0], pair[1]],
            LIMIT,
        );
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert!(out.status.success(), "{pair:?}\n{stdout}\n{stderr}");
        let t = CountTable::parse(&stdout, &stderr);
        let mix = t.row("mix");
        let addr = u64::from_str_radix(mix[t.col("ADDRESS")].trim_start_matches("0x"), 16).unwrap();
        // Both probes counted the same calls (the program runs on).
        let (a, b) = (t.hits("mix"), t.hits("mix+3"));
        assert!(a > 0 && a.abs_diff(b) <= 1, "{pair:?}: {a} {b}\n{stderr}");
        // The program still runs, on the file's code.
        assert!(
            server.child.try_wait().unwrap().is_none(),
            "{pair:?}: the program died"
        );
        assert_eq!(
            memory_at(pid, addr, 16),
            file_bytes_at(pid, &bin, addr, 16),
            "{pair:?}\n{stderr}"
        );
    }
}

/// noreturn.c, built with gcc -O1 -g.
fn noreturn_program() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ledger");
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/noreturn.c");
    common::gcc(&src, &dir.join("noreturn"), &["-O1"])
}

#[test]
fn a_function_dwarf_marks_noreturn_gets_no_return_hook() {
    let bin = noreturn_program();
    let b = bin.to_str().unwrap();
    let native = std::process::Command::new(&bin).arg("4").output().unwrap();
    assert_eq!(native.status.code(), Some(7));
    assert_eq!(text(&native.stdout), "sum=22\nfinishing with 7\n");

    let out = hotprobe_within(&["count", "finish_run%return", "--", b, "4"], LIMIT);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "cannot probe finish_run%return: finish_run does not return (DWARF: DW_AT_noreturn)"
        ),
        "{stderr}"
    );

    // Its entry counts; the program's output and status are its own.
    let out = hotprobe_within(&["count", "finish_run", "work", "--", b, "4"], LIMIT);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(7), "{stdout}\n{stderr}");
    assert_eq!(program_output(&stdout), "sum=22\nfinishing with 7\n");
    let t = CountTable::parse(&stdout, &stderr);
    assert_eq!(t.hits("finish_run"), 1, "{}", t.all);
    assert_eq!(t.hits("work"), 4, "{}", t.all);

    // record takes its entry only, and says so.
    let dir = hotprobe_testkit::TempDir::new("noreturn-record");
    let trace = dir.path().join("t");
    let out = hotprobe_within(
        &[
            "record",
            "-o",
            trace.to_str().unwrap(),
            "finish_run",
            "work",
            "--",
            b,
            "4",
        ],
        LIMIT,
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(7), "{stdout}\n{stderr}");
    assert!(stdout.contains("sum=22\nfinishing with 7\n"), "{stdout}");
    assert!(
        stderr.contains("finish_run: entries only, no return hooked (finish_run does not return"),
        "{stderr}"
    );
}
