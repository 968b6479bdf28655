//! Issue 23: a function shorter than a jump with no padding after it
//! takes an E9Patch-style punned jump when it owns 4 bytes: `e9` and three
//! free displacement bytes, the fourth being the next function's first
//! byte, never written. tests/programs/punned_fns.c lays out, in assembly,
//! 4-, 3- (+1 byte of padding), 2- and 1-byte functions each followed at
//! once by another function, and a 4-byte one whose byte 2 a branch
//! elsewhere targets; four threads call them all. The neighbours are
//! probed too (their jump or int3 changes the punned jump's fixed byte:
//! it then lands at a copy of its trampoline). Counts are exact, `record`
//! keeps each call's entry and exit, the program's output and exit status
//! are its own, and after a `-p` detach the text is the file's and the
//! trampoline page is gone, and a SIGKILLed tracer's sites are put back by
//! the agent. In a non-PIE executable (and so in Debian's python3.11) the
//! copies of the trampoline would lie below address 0: the 4-byte
//! functions stay on the trap, with that reason.

mod common;

use common::{gcc, hotprobe, text, while_attached, CountTable};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Probed, with the mechanism each gets and the start of its reason.
const PROBES: [(&str, &str, &str); 10] = [
    (
        "pun4",
        "jump",
        "punned jump over the whole 4-byte function (",
    ),
    (
        "pun3p",
        "jump",
        "punned jump over the whole 3-byte function and 1 bytes of padding",
    ),
    (
        "pun2",
        "in-process",
        "function shorter than 5 bytes (2 bytes); no punned jump: it would fix 3 bytes",
    ),
    (
        "pun1",
        "in-process",
        "function shorter than 5 bytes (1 bytes); no punned jump: it would fix 4 bytes",
    ),
    (
        "b4",
        "in-process",
        "function shorter than 5 bytes (4 bytes); no punned jump: a branch at ",
    ),
    ("after4", "jump", "6 bytes of relocatable"),
    ("after3", "jump", "6 bytes of relocatable"),
    ("after2", "jump", "6 bytes of relocatable"),
    ("after1", "jump", "6 bytes of relocatable"),
    ("bjump", "jump", "6 bytes of relocatable"),
];

const THREADS: u64 = 4;

fn program() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("punned_jumps");
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/punned_fns.c");
    gcc(&src, &dir.join("punned_fns"), &["-O2"])
}

/// Calls of `f` in a run of `rounds` rounds per thread (bjump is called
/// twice a round).
fn calls(f: &str, rounds: u64) -> u64 {
    THREADS * rounds * if f == "bjump" { 2 } else { 1 }
}

#[test]
fn short_functions_without_padding_take_a_punned_jump_and_count_exactly() {
    let bin = program();
    let b = bin.to_str().unwrap();
    let native = Command::new(&bin).arg("2000").output().unwrap();
    assert_eq!(native.status.code(), Some(3));
    let want = text(&native.stdout);
    // Neighbours probed after and before the punned functions: both orders.
    for order in [false, true] {
        let mut args = vec!["count"];
        let mut names: Vec<&str> = PROBES.iter().map(|p| p.0).collect();
        if order {
            names.reverse();
        }
        args.extend(&names);
        args.extend(["--", b, "2000"]);
        let o = hotprobe(&args);
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert_eq!(o.status.code(), Some(3), "{err}");
        assert!(out.starts_with(&want), "{out}");
        let t = CountTable::parse(&out, &err);
        for (f, mechanism, why) in PROBES {
            assert_eq!(t.hits(f), calls(f, 2000), "{f}: {}", t.all);
            assert_eq!(t.execution(f), mechanism, "{f}: {}", t.all);
            let reason = t.row(f)[t.col("WHY")..].join(" ");
            // (the EXECUTION cell is several words for a trap)
            assert!(reason.contains(why), "{f}: {reason}");
        }
        let b4 = t.row("b4")[t.col("WHY")..].join(" ");
        assert!(b4.contains("lands at +0x2, inside the 4 bytes"), "{b4}");
    }
    // Alone, the punned ones count as well (their fixed byte unchanged).
    let o = hotprobe(&["count", "pun4", "pun3p", "--", b, "2000"]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(out.starts_with(&want), "{out}");
    let t = CountTable::parse(&out, &err);
    for f in ["pun4", "pun3p"] {
        assert_eq!(t.hits(f), calls(f, 2000), "{}", t.all);
        assert_eq!(t.execution(f), "jump", "{}", t.all);
    }
}

#[test]
fn record_keeps_each_call_of_a_punned_function() {
    let bin = program();
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("punned_jumps/t.d");
    let d = dir.to_str().unwrap();
    let mut args = vec!["record", "--force", "-o", d];
    args.extend(PROBES.iter().map(|p| p.0));
    args.extend(["--", bin.to_str().unwrap(), "500"]);
    let o = hotprobe(&args);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o.stderr));
    let r = hotprobe(&["report", "--json", d]);
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    for (f, _, _) in PROBES {
        let row = v["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["function"] == f)
            .unwrap_or_else(|| panic!("{f}: {v}"));
        assert_eq!(row["calls"], calls(f, 500), "{f}: {row}");
        assert_eq!(row["no_exit"], 0, "{f}: {row}");
    }
}

/// Link address of `f` in `bin`, from `hotprobe list` (whose mechanism
/// column must say `jump (punned)`).
fn punned_link_addr(bin: &Path, f: &str) -> u64 {
    let o = hotprobe(&["list", bin.to_str().unwrap()]);
    let out = text(&o.stdout);
    let line = out
        .lines()
        .find(|l| l.split_whitespace().last() == Some(f))
        .unwrap_or_else(|| panic!("{f}: {out}"));
    assert!(line.contains("jump (punned)"), "{line}");
    let a = line.split_whitespace().next().unwrap();
    u64::from_str_radix(a.trim_start_matches("0x"), 16).unwrap()
}

/// Where the file's offset 0 is mapped in `pid`.
fn load_base(pid: u32, bin: &Path) -> u64 {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let name = std::fs::canonicalize(bin).unwrap();
    maps.lines()
        .find_map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            (w.get(5) == Some(&name.to_str().unwrap()) && w[2] == "00000000")
                .then(|| u64::from_str_radix(w[0].split_once('-').unwrap().0, 16).unwrap())
        })
        .unwrap_or_else(|| panic!("{bin:?} not mapped:\n{maps}"))
}

fn mapped(pid: u32, addr: u64) -> bool {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines().any(|l| {
        let (s, e) = l
            .split_whitespace()
            .next()
            .unwrap()
            .split_once('-')
            .unwrap();
        let (s, e) = (
            u64::from_str_radix(s, 16).unwrap(),
            u64::from_str_radix(e, 16).unwrap(),
        );
        (s..e).contains(&addr)
    })
}

/// The program in `serve` mode, past its `ready` line.
fn serving(bin: &Path) -> std::process::Child {
    let mut server = Command::new(bin)
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
    server
}

#[test]
fn after_a_detach_the_text_is_the_files_and_the_trampoline_page_is_gone() {
    let bin = program();
    let link = punned_link_addr(&bin, "pun4");
    let mut server = serving(&bin);
    let pid = server.id();
    let addr = load_base(pid, &bin) + link;
    let p = pid.to_string();
    let mut args = vec!["count", "-p", &p, "--duration", "1"];
    args.extend(PROBES.iter().map(|p| p.0));
    // While attached: pun4 starts with a jump whose last displacement byte
    // is after4's first (now after4's own jump, e9), into a mapped page.
    let (target, status, stdout, stderr) = while_attached(&args, || {
        let m = common::memory_at(pid, addr, 9);
        assert_eq!(m[0], 0xe9, "{m:02x?}");
        assert_eq!(m[4], 0xe9, "after4's jump: {m:02x?}");
        let rel = i32::from_le_bytes(m[1..5].try_into().unwrap()) as i64;
        let target = (addr as i64 + 5 + rel) as u64;
        assert!(mapped(pid, target), "{target:#x}");
        target
    });
    assert!(status.success(), "{stderr}");
    let t = CountTable::parse(&stdout, &stderr);
    for (f, mechanism, _) in PROBES {
        assert!(t.hits(f) > 0, "{f}: {}", t.all);
        // An injected agent takes no in-process trap: those are ptrace's.
        assert_eq!(
            t.execution(f) == "jump",
            mechanism == "jump",
            "{f}: {}",
            t.all
        );
    }
    assert_eq!(hotprobe_testkit::text_differences(pid, &bin), vec![]);
    assert!(
        !mapped(pid, target),
        "{target:#x} still mapped after detach"
    );
    drop(server.stdin.take());
    assert!(server.wait().unwrap().success());
}

/// The planner's reason for a 4-byte function of a non-PIE executable.
const NON_PIE: &str = "function shorter than 5 bytes (4 bytes); no punned jump: its trampoline \
     and the copies where an int3, jmp or patch on the next function would send it cannot all be \
     in user space (a non-PIE executable's low addresses: the copies would lie below 0)";

#[test]
fn a_non_pie_executable_keeps_its_4_byte_functions_on_the_trap_and_says_why() {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("punned_jumps");
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/punned_fns.c");
    let bin = gcc(&src, &dir.join("punned_fns_nopie"), &["-O2", "-no-pie"]);
    let b = bin.to_str().unwrap();
    let native = Command::new(&bin).arg("500").output().unwrap();
    let o = hotprobe(&["count", "pun4", "after4", "pun3p", "--", b, "500"]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(out.starts_with(&text(&native.stdout)), "{out}");
    let t = CountTable::parse(&out, &err);
    for f in ["pun4", "pun3p"] {
        assert_eq!(t.hits(f), calls(f, 500), "{}", t.all);
        assert_eq!(t.execution(f), "in-process", "{}", t.all);
        let why = t.row(f)[t.col("WHY")..].join(" ");
        let want = NON_PIE.replace(
            "(4 bytes)",
            if f == "pun4" {
                "(4 bytes)"
            } else {
                "(3 bytes)"
            },
        );
        assert!(why.contains(&want), "{f}: {why}");
    }
    assert_eq!(t.hits("after4"), calls("after4", 500), "{}", t.all);
}

/// Debian's python3.11 is a non-PIE executable: its 5 functions of 4
/// bytes with the next one right after them stay on the in-process trap
/// (the copies of a punned jump's trampoline would lie below address 0),
/// each listed with that reason; so do the 2- and 1-byte ones.
#[test]
fn python3_11_lists_why_its_short_functions_stay_on_the_in_process_trap() {
    let py = "/usr/bin/python3.11";
    assert!(Path::new(py).exists(), "{py} missing");
    let o = hotprobe(&["list", py, "--summary"]);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let count = |class: &str| -> u64 {
        out.lines()
            .find_map(|l| l.strip_prefix(class))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{class}: {out}"))
    };
    assert_eq!(count("jump (punned)"), 0, "{out}");
    let inproc = count("in-process trap");
    assert_eq!(inproc, 16, "{out}");
    let why: Vec<&str> = out
        .lines()
        .skip_while(|l| !l.contains("WHY (traps)"))
        .skip(1)
        .collect();
    let with = |s: &str| -> u64 {
        why.iter()
            .filter(|l| l.contains(s))
            .map(|l| l.split_whitespace().next().unwrap().parse::<u64>().unwrap())
            .sum()
    };
    assert_eq!(with(NON_PIE), 5, "{out}");
    assert_eq!(
        with("(2 bytes); no punned jump: it would fix 3 bytes"),
        4,
        "{out}"
    );
    assert_eq!(
        with("(1 bytes); no punned jump: it would fix 4 bytes"),
        3,
        "{out}"
    );
    assert_eq!(with("a jump lands inside the first 5 bytes"), 4, "{out}");
    assert_eq!(
        why.iter()
            .map(|l| l.split_whitespace().next().unwrap().parse::<u64>().unwrap())
            .sum::<u64>(),
        inproc,
        "{out}"
    );
}

#[test]
fn a_killed_tracers_punned_sites_are_put_back_by_the_agent() {
    use std::time::{Duration, Instant};
    let bin = program();
    let link = punned_link_addr(&bin, "pun4");
    let mut server = serving(&bin);
    let pid = server.id();
    let addr = load_base(pid, &bin) + link;
    let p = pid.to_string();
    let mut hp = Command::new(common::HOTPROBE)
        .args(["count", "-p", &p, "--duration", "120"])
        .args(["pun4", "after4", "pun3p", "after3"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let err = common::line_reader(hp.stderr.take().unwrap());
    let l = err.recv_timeout(Duration::from_secs(60)).unwrap();
    assert!(
        l.contains(&format!("attached to pid {pid}: 4 probes (jump 4)")),
        "{l}"
    );
    assert_eq!(common::memory_at(pid, addr, 1), [0xe9]);
    hp.kill().unwrap();
    hp.wait().unwrap();
    // The agent puts every site back once it sees its tracer gone.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let diffs = hotprobe_testkit::text_differences(pid, &bin);
        if diffs.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "still patched: {diffs:x?}");
        std::thread::yield_now();
    }
    drop(server.stdin.take());
    assert!(server.wait().unwrap().success(), "the program runs on");
}
