//! Issue 23: functions shorter than a jump take one where padding follows
//! them. tests/programs/short_fns.c has two 4-byte functions and a 1-byte
//! `ret`; built at -O2 (functions aligned, padding after each) all three
//! take a jump that displaces the whole function and overwrites padding
//! only; built with -falign-functions=1 (no padding) the 4-byte ones take
//! a punned jump (punned_jumps.rs) and the 1-byte `ret` stays on the
//! in-process trap. Counts equal the calls, the program's output is
//! unchanged, `record` keeps every call, and after a `-p` detach the
//! bytes (the function and its padding) are the file's again. Debian's
//! libsqlite3 and libjq keep at most 15 and 3 functions on a trap.

mod common;

use common::{file_offset_of, gcc, hotprobe, memory_at, text, while_attached, CountTable};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const SHORT: [&str; 3] = ["inc", "nothing", "twice"];

fn program(aligned: bool) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("short_functions");
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/short_fns.c");
    match aligned {
        true => gcc(&src, &dir.join("short_fns"), &["-O2"]),
        false => gcc(
            &src,
            &dir.join("short_fns_packed"),
            &["-O2", "-falign-functions=1"],
        ),
    }
}

#[test]
fn short_functions_before_padding_take_a_jump_and_count_exactly() {
    for aligned in [true, false] {
        let bin = program(aligned);
        let b = bin.to_str().unwrap();
        let native = Command::new(&bin).arg("1000").output().unwrap();
        let want = text(&native.stdout);
        let mut args = vec!["count"];
        args.extend(SHORT);
        args.extend(["--", b, "1000"]);
        let o = hotprobe(&args);
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert!(o.status.success(), "{err}");
        assert!(out.starts_with(&want), "{out}");
        let t = CountTable::parse(&out, &err);
        for f in SHORT {
            assert_eq!(t.hits(f), 1000, "{f}: {}", t.all);
            let ex = t.execution(f);
            if aligned {
                assert_eq!(ex, "jump", "{f}: {}", t.all);
                let why = &t.row(f)[t.col("WHY")..].join(" ");
                assert!(
                    why.starts_with("the whole ") && why.contains("bytes of the padding after it"),
                    "{f}: {why}"
                );
            } else if f == "nothing" {
                // 1 byte: a punned jump would fix 4 bytes of the next function.
                assert!(ex.starts_with("in-process"), "{f}: {}", t.all);
            } else {
                // 4 bytes, no padding: a punned jump (punned_jumps.rs).
                assert_eq!(ex, "jump", "{f}: {}", t.all);
                let why = &t.row(f)[t.col("WHY")..].join(" ");
                assert!(
                    why.starts_with("punned jump over the whole 4-byte"),
                    "{f}: {why}"
                );
            }
        }
    }
    // Two probes on one short function: the second chains on the first's
    // jump (planned on the jump, not on the function's bytes, which the
    // jump covers: "invalid instruction at +0x0" before), both exact.
    let bin = program(true);
    let o = hotprobe(&["count", "inc", "inc", "--", bin.to_str().unwrap(), "1000"]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{err}");
    let t = CountTable::parse(&out, &err);
    let rows = t.rows_of("inc");
    assert_eq!(rows.len(), 2, "{}", t.all);
    for r in rows {
        let cell = |c: &str| r[t.col(c)].as_str();
        assert_eq!(
            (cell("HITS"), cell("NMISSED"), cell("EXECUTION")),
            ("1000", "0", "jump"),
            "{r:?}"
        );
    }
    // record keeps each call, with its argument and return value.
    let bin = program(true);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("short_functions/t.d");
    let d = dir.to_str().unwrap();
    let mut args = vec!["record", "--force", "--args", "1", "-o", d];
    args.extend(SHORT);
    args.extend(["--", bin.to_str().unwrap(), "1000"]);
    let o = hotprobe(&args);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r = hotprobe(&["report", "--json", d]);
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    for f in SHORT {
        let row = v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["function"] == f)
            .unwrap_or_else(|| panic!("{f}: {v}"));
        assert_eq!(row["calls"], 1000, "{f}: {row}");
        assert_eq!(row["no_exit"], 0, "{f}: {row}");
    }
}

#[test]
fn after_a_detach_the_function_and_its_padding_are_the_files() {
    let bin = program(true);
    let file = std::fs::read(&bin).unwrap();
    let mut server = Command::new(&bin)
        .arg("serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut ready = String::new();
    BufReader::new(server.stdout.take().unwrap())
        .read_line(&mut ready)
        .unwrap();
    assert_eq!(ready, "ready\n");
    let pid = server.id().to_string();
    let mut args = vec!["count", "-p", &pid, "--duration", "1"];
    args.extend(SHORT);
    let (_, status, stdout, stderr) = while_attached(&args, || ());
    assert!(status.success(), "{stderr}");
    let t = CountTable::parse(&stdout, &stderr);
    for f in SHORT {
        assert_eq!(t.execution(f), "jump", "{}", t.all);
        assert!(t.hits(f) > 0, "{f}: {}", t.all);
        let addr =
            u64::from_str_radix(t.row(f)[t.col("ADDRESS")].trim_start_matches("0x"), 16).unwrap();
        let off = file_offset_of(server.id(), addr) as usize;
        assert_eq!(
            memory_at(server.id(), addr, 8),
            &file[off..off + 8],
            "{f} at {addr:#x} after detach"
        );
    }
    drop(server.stdin.take());
    assert!(server.wait().unwrap().success());
}

#[test]
fn stock_libsqlite3_and_libjq_keep_few_functions_on_a_trap() {
    for (lib, most) in [
        ("/usr/lib/x86_64-linux-gnu/libsqlite3.so.0", 15),
        ("/usr/lib/x86_64-linux-gnu/libjq.so.1", 3),
    ] {
        assert!(
            Path::new(lib).exists(),
            "{lib} missing: scripts/setup.sh installs sqlite3 and jq"
        );
        let o = hotprobe(&["list", lib, "--summary"]);
        let out = text(&o.stdout);
        assert!(o.status.success(), "{}", text(&o.stderr));
        let on_traps: u64 = out
            .lines()
            .find_map(|l| l.strip_prefix("on traps"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{out}"));
        assert!(on_traps <= most, "{lib}: {on_traps} on traps\n{out}");
        // Each one is listed with its reason.
        let listed: u64 = out
            .lines()
            .skip_while(|l| !l.contains("WHY (traps)"))
            .skip(1)
            .map(|l| l.split_whitespace().next().unwrap().parse::<u64>().unwrap())
            .sum();
        assert_eq!(listed, on_traps, "{out}");
    }
}
