//! `hotprobe watch`: a global written by 4 threads (tests/programs/watched.c,
//! built here with gcc -pthread) — every write reported with its thread
//! and value, exact counts per thread, the program's own output
//! unchanged; attached with -p and detached with Ctrl-C, no thread keeps
//! a debug register and the program writes on without being stopped.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, line_reader, text, HOTPROBE};

const LIMIT: Duration = Duration::from_secs(60);

fn watched() -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/watched.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("watch");
    std::fs::create_dir_all(&dir).unwrap();
    gcc(&src, &dir.join("watched"), &["-O0", "-pthread"])
}

/// A watch line: `TIME  TID  INSTRUCTION  OLD -> NEW [notes]`.
#[derive(Debug)]
struct Access {
    tid: u64,
    insn: String,
    old: u64,
    new: u64,
    notes: String,
}

fn parse_access(l: &str) -> Option<Access> {
    let (head, values) = l.split_once(" -> ").map(|(h, v)| (h, v.trim()))?;
    let f: Vec<&str> = head.split_whitespace().collect();
    f.first()?.parse::<f64>().ok()?;
    let (new, notes) = values.split_once(' ').unwrap_or((values, ""));
    Some(Access {
        tid: f.get(1)?.parse().ok()?,
        insn: f[2..f.len() - 1].join(" "),
        old: f.last()?.parse().ok()?,
        new: new.parse().ok()?,
        notes: notes.to_string(),
    })
}

/// `writer K tid T wrote N values, last V` lines: K → (tid, N).
fn writers(out: &str) -> BTreeMap<u64, (u64, u64)> {
    out.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.first() == Some(&"writer")).then(|| {
                (
                    f[1].parse().unwrap(),
                    (f[3].parse().unwrap(), f[5].parse().unwrap()),
                )
            })
        })
        .collect()
}

/// The summary's `TID ACCESSES` rows.
fn summary(out: &str) -> BTreeMap<u64, u64> {
    let Some(at) = out.find("    TID  ACCESSES") else {
        panic!("no summary in:\n{out}");
    };
    out[at..]
        .lines()
        .skip(1)
        .map_while(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.first()?.parse().ok()?, f.get(1)?.parse().ok()?))
        })
        .collect()
}

/// Every access of one round against the program's log: writer k's
/// thread stored (k+1)*1000 + 1..=10*(k+1) in order, the main thread 0
/// once; each old value is the previous line's new one.
fn check_round(acc: &[Access], program: &str) {
    let w = writers(program);
    assert_eq!(w.len(), 4, "4 writer lines in:\n{program}");
    let main: u64 = program
        .lines()
        .find_map(|l| l.split_once(" main tid ").map(|(_, r)| r))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("no round line in:\n{program}"));
    let mut by: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for a in acc {
        by.entry(a.tid).or_default().push(a.new);
        assert!(
            a.insn.starts_with("store+0x") || a.insn.starts_with("round_+0x"),
            "{a:?}"
        );
        assert!(a.insn.contains(" [watched"), "{a:?}");
        assert_eq!(a.notes, "", "a store's value is its operand's: {a:?}");
    }
    assert_eq!(by.remove(&main), Some(vec![0]), "the main thread's store");
    for (k, (tid, n)) in &w {
        let expect: Vec<u64> = (1..=*n).map(|i| (k + 1) * 1000 + i).collect();
        assert_eq!(
            by.remove(tid).as_ref(),
            Some(&expect),
            "writer {k} tid {tid}"
        );
    }
    assert!(by.is_empty(), "stores by unknown threads: {by:?}");
    for p in acc.windows(2) {
        assert_eq!(p[1].old, p[0].new, "{p:?}");
    }
}

/// Lines with the thread ids replaced (they differ from run to run).
fn without_tids(out: &str) -> Vec<String> {
    let mut v: Vec<String> = out
        .lines()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.iter()
                .enumerate()
                .map(|(i, x)| if i > 0 && w[i - 1] == "tid" { "T" } else { x })
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    v.sort();
    v
}

#[test]
fn every_write_of_four_threads_with_thread_and_value() {
    let bin = watched();
    let out = hotprobe_within(
        &["watch", "counter", "--", bin.to_str().unwrap(), "run"],
        LIMIT,
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("watching counter (writes)"), "{stderr}");
    let acc: Vec<Access> = stdout.lines().filter_map(parse_access).collect();
    let program: String = stdout
        .lines()
        .filter(|l| l.starts_with("writer ") || l.starts_with("round "))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(acc.len(), 101, "{stdout}");
    check_round(&acc, &program);
    assert_eq!(acc[0].old, 0);
    // The summary: exact counts per thread.
    assert!(stdout.contains("counter: 101 accesses"), "{stdout}");
    let s = summary(&stdout);
    assert_eq!(s.len(), 5, "{stdout}");
    for (tid, n) in writers(&program).values() {
        assert_eq!(s.get(tid), Some(n), "{stdout}");
    }
    // The program prints what it prints untraced.
    let plain = Command::new(&bin).arg("run").output().unwrap();
    assert_eq!(without_tids(&program), without_tids(&text(&plain.stdout)));
}

#[test]
fn reads_with_read_and_refusals() {
    let bin = watched();
    let b = bin.to_str().unwrap();
    // `other += 1` reads and writes `other`, the printf reads it.
    let out = hotprobe_within(&["watch", "--read", "other", "--", b, "run"], LIMIT);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let acc: Vec<Access> = stdout.lines().filter_map(parse_access).collect();
    assert_eq!(acc.len(), 3, "{stdout}");
    assert_eq!(
        acc.iter().map(|a| (a.old, a.new)).collect::<Vec<_>>(),
        [(0, 0), (0, 1), (1, 1)]
    );
    assert!(acc[0].notes.contains("(read)") && acc[2].notes.contains("(read)"));
    assert!(!acc[1].notes.contains("(read)"), "{stdout}");
    assert!(stdout.contains("other: 3 accesses"), "{stdout}");

    // --exec: a line before each call of `store`, by the calling thread.
    let out = hotprobe_within(&["watch", "--exec", "store", "--", b, "run"], LIMIT);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let calls: Vec<&str> = stdout
        .lines()
        .filter(|l| l.ends_with("  executed"))
        .collect();
    assert_eq!(calls.len(), 100, "{stdout}");
    assert!(
        calls.iter().all(|l| l.contains("  store [watched]  ")),
        "{stdout}"
    );
    assert!(stdout.contains("store: 100 accesses"), "{stdout}");
    assert_eq!(writers(&stdout).len(), 4, "{stdout}");

    let refused = |args: &[&str], what: &str| {
        let out = hotprobe_within(args, LIMIT);
        let err = text(&out.stderr);
        assert!(!out.status.success(), "accepted {args:?}");
        assert!(err.contains(what), "{args:?}: {err}");
    };
    refused(&["watch", "no_such_var", "--", b, "run"], "no data symbol");
    refused(
        &["watch", "counter", b, "run"],
        "put `--` before the command",
    );
    refused(
        &["watch", "counter:3", "--", b, "run"],
        "1, 2, 4 or 8 bytes",
    );
    refused(
        &[
            "watch",
            "counter",
            "counter:2",
            "counter:1",
            "other",
            "other:4",
            "--",
            b,
            "run",
        ],
        "at most 4 watchpoints",
    );
}

#[test]
fn a_hex_address() {
    use object::{Object, ObjectSymbol};
    // Not position-independent: the variable's address is the file's.
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs/watched.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("watch");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = gcc(
        &src,
        &dir.join("watched-nopie"),
        &["-O0", "-pthread", "-no-pie"],
    );
    let bytes = std::fs::read(&bin).unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    let addr = file
        .symbols()
        .find(|s| s.name() == Ok("counter"))
        .expect("counter in the symbol table")
        .address();
    let spec = format!("{addr:#x}:4");
    let out = hotprobe_within(&["watch", &spec, "--", bin.to_str().unwrap(), "run"], LIMIT);
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let acc: Vec<Access> = stdout.lines().filter_map(parse_access).collect();
    let program: String = stdout
        .lines()
        .filter(|l| l.starts_with("writer ") || l.starts_with("round "))
        .map(|l| format!("{l}\n"))
        .collect();
    check_round(&acc, &program);
    assert!(
        stdout.contains(&format!("{spec}: 101 accesses")),
        "{stdout}"
    );
}

/// DR7 of every thread of `pid` (seized, read, released).
fn dr7_of_every_thread(pid: i32) -> Vec<(i32, u64)> {
    let dr7 = std::mem::offset_of!(libc::user, u_debugreg) + 7 * 8;
    let mut v = Vec::new();
    for e in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let tid: i32 = e.unwrap().file_name().to_str().unwrap().parse().unwrap();
        // SAFETY: ptrace on a process this test started; PEEKUSER reads a
        // word of the stopped thread's `struct user`.
        unsafe {
            assert_eq!(libc::ptrace(libc::PTRACE_SEIZE, tid, 0, 0), 0);
            assert_eq!(libc::ptrace(libc::PTRACE_INTERRUPT, tid, 0, 0), 0);
            let mut st = 0;
            assert_eq!(libc::waitpid(tid, &mut st, libc::__WALL), tid);
            *libc::__errno_location() = 0;
            let val = libc::ptrace(libc::PTRACE_PEEKUSER, tid, dr7, 0);
            assert_eq!(*libc::__errno_location(), 0, "PEEKUSER DR7 of {tid}");
            v.push((tid, val as u64));
            assert_eq!(libc::ptrace(libc::PTRACE_DETACH, tid, 0, 0), 0);
        }
    }
    v
}

#[test]
fn attach_then_ctrl_c_leaves_no_debug_register() {
    let bin = watched();
    let mut prog = Command::new(&bin)
        .arg("serve")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = prog.stdin.take().unwrap();
    let prog_out = line_reader(prog.stdout.take().unwrap());
    let next = |what: &str| {
        prog_out
            .recv_timeout(LIMIT)
            .unwrap_or_else(|_| panic!("the program printed no {what}"))
    };
    let ready = next("ready line");
    let pid: i32 = ready.strip_prefix("ready ").unwrap().parse().unwrap();

    let mut hp = Command::new(HOTPROBE)
        .args(["watch", "counter:4", "-p", &pid.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let hp_out = line_reader(hp.stdout.take().unwrap());
    let hp_err = line_reader(hp.stderr.take().unwrap());
    let started = hp_err
        .recv_timeout(LIMIT)
        .expect("hotprobe says it watches");
    assert!(
        started.contains(&format!("attached to pid {pid}: watching counter:4")),
        "{started}"
    );
    writeln!(stdin, "go").unwrap();
    stdin.flush().unwrap();
    let mut program = String::new();
    loop {
        let l = next("round 1 line");
        program.push_str(&l);
        program.push('\n');
        if l.starts_with("round 1 ") {
            break;
        }
    }
    let mut acc = Vec::new();
    while acc.len() < 101 {
        let l = hp_out
            .recv_timeout(LIMIT)
            .unwrap_or_else(|_| panic!("{} accesses reported", acc.len()));
        acc.extend(parse_access(&l));
    }
    check_round(&acc, &program);

    // Ctrl-C: hotprobe detaches and prints its summary.
    // SAFETY: a signal to the hotprobe process this test started.
    unsafe { libc::kill(hp.id() as i32, libc::SIGINT) };
    let st = hp.wait().unwrap();
    let rest: Vec<String> = hp_out.iter().collect();
    let err: Vec<String> = hp_err.iter().collect();
    assert!(st.success(), "hotprobe: {st}\n{}", err.join("\n"));
    assert!(
        err.iter().any(|l| l.contains("detached from pid")),
        "{}",
        err.join("\n")
    );
    let rest = rest.join("\n");
    assert!(rest.contains("counter:4: 101 accesses"), "{rest}");
    assert!(
        rest.lines().filter_map(parse_access).next().is_none(),
        "no access after the round's 101: {rest}"
    );
    let s = summary(&rest);
    for (tid, n) in writers(&program).values() {
        assert_eq!(s.get(tid), Some(n), "{rest}");
    }

    for (tid, dr7) in dr7_of_every_thread(pid) {
        assert_eq!(dr7, 0, "DR7 of thread {tid} after detach");
    }
    // The program writes on, untraced and unstopped.
    writeln!(stdin, "go").unwrap();
    stdin.flush().unwrap();
    let mut round2 = String::new();
    loop {
        let l = next("round 2 line");
        round2.push_str(&l);
        round2.push('\n');
        if l.starts_with("round 2 ") {
            break;
        }
    }
    assert_eq!(writers(&round2).len(), 4, "{round2}");
    assert!(round2.contains("other 2"), "{round2}");
    writeln!(stdin, "quit").unwrap();
    drop(stdin);
    let st = prog.wait().unwrap();
    assert!(st.success(), "the program ended with {st}");
}

/// kernel_write.c, built with gcc -O0.
fn kernel_write() -> PathBuf {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/programs/kernel_write.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("watch");
    std::fs::create_dir_all(&dir).unwrap();
    gcc(&src, &dir.join("kernel_write"), &["-O0"])
}

#[test]
fn a_write_by_the_kernel_is_said_and_the_next_old_value_is_the_one_read() {
    let bin = kernel_write();
    let out = hotprobe_within(&["watch", "counter", "--", bin.to_str().unwrap()], LIMIT);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("after read 1005\n") && stdout.contains("after store 2001\n"),
        "{stdout}"
    );
    // The kernel's write: no debug register sees it; said with both values.
    assert!(
        stderr.contains(":4: 10 -> 1005 with no watched access: written by the kernel"),
        "{stderr}"
    );
    // The program's own store: its old value is the one read since, not 10.
    let stores: Vec<Access> = stdout.lines().filter_map(parse_access).collect();
    assert_eq!(stores.len(), 1, "{stdout}");
    assert_eq!((stores[0].old, stores[0].new), (1005, 2001), "{stdout}");
}
