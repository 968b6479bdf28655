//! Issue 23 item 3, escape hatches that work, end to end: `--no-traps` on
//! `count`, `trace` and `record` leaves out every trap kind — the
//! in-process trap (a function under 5 bytes, a branch into the first 5
//! bytes) and the ptrace trap (`count`'s return probes) — and lists each
//! function left out with the reason; a forced `--mechanism jump` with a
//! pattern places what it can and lists the rest. A pattern that these
//! leave empty no longer ends the run when other specs were placed: it is
//! named, and the others run. On tests/programs/prologues.c (t_short: 4
//! bytes; t_loop: a `jne` back to +4; t_ok: a jump) and on Debian's jq with
//! libc's SSE2 memmove variants (a branch elsewhere in libc lands inside
//! their first bytes: an in-process trap otherwise). Typed values
//! (`-a`, `func(arg)`) whose copy in the target the fast path refuses
//! (past its full capture table) are not read at a ptrace trap instead:
//! listed. At a coldpatched function, values are read at a jump on its
//! entry, not at the placeholder. Counts equal the program's own calls,
//! its output and exit status are unchanged.

mod common;

use common::{call_tree, gcc, hotprobe, text, CountTable};
use std::path::{Path, PathBuf};
use std::process::Command;

fn tmp() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("no_traps");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// prologues.c, built as stock_prologues.rs builds its plain form.
fn program() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/prologues.c");
    gcc(
        &src,
        &tmp().join("prologues"),
        &["-O2", "-fcf-protection=none"],
    )
}

/// The `hotprobe: skipping …` lines of `stderr`, as (label, reason).
fn skipped(stderr: &str) -> Vec<(String, String)> {
    stderr
        .lines()
        .filter_map(|l| l.strip_prefix("hotprobe: skipping "))
        .map(|l| {
            let (f, why) = l.split_once(": ").unwrap_or_else(|| panic!("{l}"));
            (f.to_string(), why.to_string())
        })
        .collect()
}

/// The program's own output and status for `arg` rounds.
fn native(prog: &Path, arg: &str) -> (String, Option<i32>) {
    let o = Command::new(prog).arg(arg).output().unwrap();
    (text(&o.stdout), o.status.code())
}

fn run(args: &[&str]) -> (String, String, Option<i32>) {
    let o = hotprobe(args);
    (text(&o.stdout), text(&o.stderr), o.status.code())
}

#[test]
fn count_leaves_out_ptrace_and_in_process_traps_and_runs_the_rest() {
    let prog = program();
    let p = prog.to_str().unwrap();
    let (expected, status) = native(&prog, "20");
    // Return counts need the ptrace trap; t_short and t_loop the
    // in-process one (under --no-traps, a trap either way).
    let (stdout, stderr, code) = run(&[
        "count",
        "--no-traps",
        "t_*%return",
        "t_s*",
        "t_ok",
        "--",
        p,
        "20",
    ]);
    assert_eq!(code, status, "{stdout}\n{stderr}");
    assert_eq!(common::program_output(&stdout), expected);
    let s = skipped(&stderr);
    let of = |f: &str| {
        s.iter()
            .find(|(l, _)| l == f)
            .map(|(_, w)| w.as_str())
            .unwrap_or_else(|| panic!("{f} not listed:\n{stderr}"))
    };
    for f in ["t_short%return", "t_loop%return", "t_ok%return"] {
        assert_eq!(of(f), "needs a trap (return counts use a return probe)");
    }
    assert_eq!(of("t_short"), SHORT_REASON);
    assert_eq!(s.len(), 4, "{stderr}");
    // Both patterns placed nothing: named, and the run went on.
    for spec in ["t_*%return", "t_s*"] {
        assert!(
            stderr.contains(&format!(
                "hotprobe: no function matching `{spec}` can be probed (reasons above): left out"
            )),
            "{stderr}"
        );
    }
    let t = CountTable::parse(&stdout, &stderr);
    assert_eq!(t.rows.len(), 1, "{}", t.all);
    assert_eq!(t.execution("t_ok"), "jump", "{}", t.all);
    assert_eq!(t.hits("t_ok"), 20, "{}", t.all);
    assert!(
        stderr.contains("hotprobe: 1 probes by mechanism: jump 1\n"),
        "{stderr}"
    );
    assert!(!stderr.contains("on a trap"), "{stderr}");
    // Nothing placed at all: an error, after the list.
    let (_, stderr, code) = run(&["count", "--no-traps", "t_s*", "--", p, "20"]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.ends_with("hotprobe: error: no function matching `t_s*` can be probed\n"),
        "{stderr}"
    );
}

#[test]
fn trace_and_record_leave_out_what_needs_a_trap_and_a_forced_jump_too() {
    let prog = program();
    let p = prog.to_str().unwrap();
    let (expected, status) = native(&prog, "5");
    // trace: t_short is left out, the pattern named, t_ok traced.
    let (stdout, stderr, code) = run(&["trace", "--no-traps", "t_s*", "t_ok", "--", p, "5"]);
    assert_eq!(code, status, "{stdout}\n{stderr}");
    assert_eq!(
        skipped(&stderr),
        [("t_short".to_string(), SHORT_REASON.to_string())],
        "{stderr}"
    );
    let calls: Vec<String> = call_tree(&stdout).into_iter().map(|(_, _, n)| n).collect();
    assert_eq!(calls, vec!["t_ok"; 5], "{stdout}");
    // record: with --no-traps and with --mechanism jump, t_ok alone is
    // recorded, the summary lists the other two with the reason.
    for (flag, why) in [
        (&["--no-traps"][..], "needs a trap ("),
        (
            &["--mechanism", "jump"][..],
            "cannot use the jump mechanism for ",
        ),
    ] {
        let dir = tmp().join(format!("record{}", flag.len()));
        let mut a = vec!["record", "--force", "-o", dir.to_str().unwrap()];
        a.extend_from_slice(flag);
        a.extend(["t_*", "--", p, "5"]);
        let (stdout, stderr, code) = run(&a);
        assert_eq!(
            (stdout.as_str(), code),
            (expected.as_str(), status),
            "{stderr}"
        );
        assert!(
            stderr.contains("probes:   1 functions (jump 1)"),
            "{flag:?}: {stderr}"
        );
        for f in ["t_short", "t_loop"] {
            assert!(
                stderr.lines().any(
                    |l| l.trim_start().starts_with(&format!("not probed ({why}"))
                        && l.ends_with(&format!("): {f}"))
                ),
                "{flag:?} {f}: {stderr}"
            );
        }
        let o = hotprobe(&["replay", dir.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let calls: Vec<String> = call_tree(&text(&o.stdout))
            .into_iter()
            .map(|(_, _, n)| n)
            .collect();
        assert_eq!(calls, vec!["t_ok"; 5], "{flag:?}");
    }
}

const JQ: &str = "/usr/bin/jq";

/// libc's SSE2 memmove variants (a branch elsewhere in Debian's libc
/// lands inside their first bytes) and fclose (a jump), under jq reading
/// one file (one fclose).
const LIBC_SPECS: [&str; 2] = [
    "libc.so.6:__memmove_sse2_unaligned*",
    "libc.so.6:_IO_new_fclose",
];

#[test]
fn stock_jq_with_libc_functions_that_need_a_trap() {
    assert!(
        Path::new(JQ).exists(),
        "{JQ} missing: scripts/setup.sh installs jq"
    );
    let input = tmp().join("in.json");
    std::fs::write(&input, "{\"a\":[1,2,{\"b\":\"x\"}]}\n").unwrap();
    let i = input.to_str().unwrap();
    let plain = Command::new(JQ).args(["-c", ".", i]).output().unwrap();
    let expected = text(&plain.stdout);
    assert_eq!(expected, "{\"a\":[1,2,{\"b\":\"x\"}]}\n");
    // As chosen: the memmove variants go to in-process traps.
    let mut a = vec!["count"];
    a.extend(LIBC_SPECS);
    a.extend(["--all", "--", JQ, "-c", ".", i]);
    let (stdout, stderr, code) = run(&a);
    assert_eq!(code, Some(0), "{stderr}");
    let t = CountTable::parse(&stdout, &stderr);
    for f in ["__memmove_sse2_unaligned", "__memmove_sse2_unaligned_erms"] {
        assert!(
            t.row(f).join(" ").contains(" in-process trap "),
            "{f}: {}",
            t.all
        );
    }
    // --no-traps and a forced jump: both listed with the reason, the
    // pattern named, fclose counted once on its jump, jq's output as ever.
    for (flag, why) in [
        (&["--no-traps"][..], "needs a trap (a branch at "),
        (
            &["--mechanism", "jump"][..],
            "cannot use the jump mechanism for ",
        ),
    ] {
        let mut a = vec!["count"];
        a.extend_from_slice(flag);
        a.extend(LIBC_SPECS);
        a.extend(["--", JQ, "-c", ".", i]);
        let (stdout, stderr, code) = run(&a);
        assert_eq!(code, Some(0), "{flag:?}: {stderr}");
        assert_eq!(common::program_output(&stdout), expected, "{flag:?}");
        let s = skipped(&stderr);
        let labels: Vec<&str> = s.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(
            labels,
            ["__memmove_sse2_unaligned", "__memmove_sse2_unaligned_erms"],
            "{flag:?}: {stderr}"
        );
        for (l, w) in &s {
            assert!(
                w.starts_with(why) && w.contains("lands at +0x3, inside the first 7 bytes"),
                "{flag:?} {l}: {w}"
            );
        }
        assert!(
            stderr.contains(&format!(
                "hotprobe: no function matching `{}` can be probed (reasons above): left out",
                LIBC_SPECS[0]
            )),
            "{stderr}"
        );
        let t = CountTable::parse(&stdout, &stderr);
        assert_eq!(t.rows.len(), 1, "{}", t.all);
        assert_eq!(t.execution(LIBC_SPECS[1]), "jump", "{}", t.all);
        assert_eq!(t.hits(LIBC_SPECS[1]), 1, "{}", t.all);
        assert!(!stderr.contains("on a trap"), "{stderr}");
    }
}

/// Why prologues.c's `t_short` (3 bytes since punned jumps came: a 4-byte
/// one takes one) needs a trap.
const SHORT_REASON: &str =
    "needs a trap (function shorter than 5 bytes (3 bytes); no punned jump: \
     it would fix 2 bytes of the next function, which a probe there would change \
     (only a 4-byte function, one fixed byte, is punned))";

/// tests/programs/typed_fast.c built with `-finstrument-functions` and
/// coldpatched: every function's entry is a coldpatch placeholder (after
/// the prologue), where the fast path copies no typed value in the target
/// (neither the argument registers nor the stack are the entry's there).
fn coldpatched_typed() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/typed_fast.c");
    let inst = gcc(
        &src,
        &tmp().join("typed_fast-inst"),
        &["-O0", "-finstrument-functions"],
    );
    let cold = tmp().join("typed_fast-cold");
    let o = hotprobe(&[
        "coldpatch",
        inst.to_str().unwrap(),
        "-o",
        cold.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    cold
}

/// Typed values at a coldpatched function: its placeholder runs after the
/// prologue, with `__cyg_profile_func_enter`'s arguments in the
/// registers, and its exit placeholder before the return value is in rax,
/// so a probe that reads values goes on a jump at the entry instead (no
/// trap, so `--no-traps` leaves nothing out); one that reads none stays on
/// the placeholder; `--mechanism patch` with values is an error. The
/// values shown are the ones the program printed (before, `getx` showed
/// `__cyg_profile_func_enter`'s arguments and its own address as its
/// return value).
#[test]
fn values_at_a_coldpatched_function_are_read_at_its_entry() {
    let prog = coldpatched_typed();
    let p = prog.to_str().unwrap();
    let (expected, status) = native(&prog, "5");
    assert_eq!(status, Some(7));
    let (stdout, stderr, code) = run(&[
        "trace",
        "--no-traps",
        "--summary",
        "-a",
        "sl*",
        "getx",
        "--",
        p,
        "5",
    ]);
    assert_eq!(code, status, "{stdout}\n{stderr}");
    assert!(skipped(&stderr).is_empty(), "{stderr}");
    assert!(stderr.contains(": 2 probes (jump 2)\n"), "{stderr}");
    let own: String = common::program_output(&stdout)
        .lines()
        .filter(|l| !l.contains("] | ") && !l.starts_with("# DURATION") && !l.is_empty())
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(own, expected);
    // getx's return values and slen's strings and lengths, as the program
    // printed them ("CALL getx(p->x=3) = 3", "CALL slen("alpha") = 5").
    let returns = |f: &str| -> Vec<String> {
        stdout
            .lines()
            .filter_map(|l| l.split_once(&format!("}} /* {f} */ = ")))
            .map(|(_, v)| v.to_string())
            .collect()
    };
    let printed = |f: &str| -> Vec<String> {
        expected
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("CALL {f}(")))
            .filter_map(|l| l.rsplit_once(") = "))
            .map(|(_, v)| v.to_string())
            .collect()
    };
    assert_eq!(returns("getx"), printed("getx"), "{stdout}");
    assert_eq!(returns("getx").len(), 5, "{stdout}");
    assert_eq!(returns("slen"), printed("slen"), "{stdout}");
    assert!(stdout.contains("| slen(\"alpha\") {\n"), "{stdout}");
    let t = CountTable::parse(&stdout, &stderr);
    assert_eq!(t.hits("getx"), 5, "{}", t.all);
    assert!(t.row("getx").join(" ").contains(" jump "), "{}", t.all);

    // No value read: the placeholder.
    let (stdout, stderr, code) = run(&["trace", "--summary", "getx", "--", p, "5"]);
    assert_eq!(code, status, "{stdout}\n{stderr}");
    let t = CountTable::parse(&stdout, &stderr);
    assert_eq!(t.hits("getx"), 5, "{}", t.all);
    assert!(
        t.row("getx").join(" ").contains(" patch (coldpatch) "),
        "{}",
        t.all
    );

    // The placeholder forced with values: an error, the program never
    // started.
    let (stdout, stderr, code) = run(&["trace", "--mechanism", "patch", "getx(p)", "--", p, "5"]);
    assert_eq!((stdout.as_str(), code), ("", Some(1)), "{stderr}");
    assert!(
        stderr.starts_with("hotprobe: error: cannot probe getx")
            && stderr.ends_with(
                ": arguments and return values are not the function's at a coldpatched \
                 -finstrument-functions placeholder (it runs after the prologue): use \
                 --mechanism jump or trap\n"
            ),
        "{stderr}"
    );
}

/// Functions whose typed values are copied in the target, more than its
/// capture table holds (`CAPTURE_SLOTS`, 1,024): generated, each taking a
/// string.
const COPIED: usize = 1030;

fn many_string_functions() -> PathBuf {
    let mut src = String::from("#include <stdio.h>\n");
    for i in 0..COPIED {
        src.push_str(&format!(
            "__attribute__((noinline)) int f_{i}(const char *s) {{ return s[0] + {i}; }}\n"
        ));
    }
    src.push_str("int main(void) {\n    long sum = 0;\n");
    for i in 0..COPIED {
        src.push_str(&format!("    sum += f_{i}(\"s{i}\");\n"));
    }
    src.push_str("    printf(\"sum %ld\\n\", sum);\n    return 4;\n}\n");
    let c = tmp().join("many_strings.c");
    if std::fs::read_to_string(&c).ok().as_deref() != Some(src.as_str()) {
        std::fs::write(&c, &src).unwrap();
    }
    // -O0: every function has room for a jump (at -O1, f_0 is 4 bytes).
    gcc(&c, &tmp().join("many_strings"), &["-O0", "-g"])
}

/// Typed values the fast path refuses to copy in the target (here: past
/// its full capture table) are not read at a ptrace trap under
/// `--no-traps`: each function is listed with the reason, the others are
/// recorded, one per call; without `--no-traps` they are read at a trap.
/// The program's output and exit status are its own.
#[test]
fn typed_values_the_fast_path_refuses_are_not_read_at_a_trap() {
    let prog = many_string_functions();
    let p = prog.to_str().unwrap();
    let (expected, status) = native(&prog, "");
    assert_eq!(status, Some(4));
    let full = COPIED - 1024;
    for no_traps in [true, false] {
        let dir = tmp().join(format!("many-strings-{no_traps}"));
        let d = dir.to_str().unwrap();
        let mut args = vec!["record", "--force", "-o", d, "-a"];
        if no_traps {
            args.push("--no-traps");
        }
        args.extend(["f_*", "--", p]);
        let (stdout, stderr, code) = run(&args);
        assert_eq!(
            (stdout.as_str(), code),
            (expected.as_str(), status),
            "{stderr}"
        );
        let reason = "needs a trap (typed values read at the hit; fast path: shared memory: \
                      the capture table is full (1024 functions copy typed values in the target))";
        let listed: Vec<&str> = stderr
            .lines()
            .filter_map(|l| {
                l.trim_start()
                    .strip_prefix(&format!("not probed ({reason}): "))
            })
            .collect();
        let o = hotprobe(&["report", "--json", d]);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let rows = v["rows"].as_array().unwrap();
        assert!(rows.iter().all(|r| r["calls"] == 1), "{v}");
        if no_traps {
            assert_eq!(listed.len(), 1, "{stderr}");
            assert_eq!(listed[0].split(", ").count(), full, "{stderr}");
            assert_eq!(rows.len(), 1024, "{stderr}");
            assert!(v.get("on_traps").is_none(), "{v}");
        } else {
            assert!(listed.is_empty(), "{stderr}");
            assert_eq!(rows.len(), COPIED, "{stderr}");
        }
    }
}
