//! Issue 23: no trap where a trap-free placement exists. The prologues
//! Debian's builds start functions with — `sub $8,%rsp; call f`,
//! `push %rbx; call f`, `push %rbx; call *p(%rip)`, a `jmp rel8` over
//! padding, a `jcc rel8`, an `endbr64` (`-fcf-protection`) — take a jump
//! (tests/programs/prologues.c, their bytes checked with objdump); the
//! counts equal the program's own, its output and exit status are
//! unchanged, a longjmp through such a function works, and after a `-p`
//! detach the code is the file's again. `--no-traps` and a forced
//! `--mechanism jump` with a pattern list what they leave out, with the
//! reason. On Debian's stock libsqlite3, `list --summary` shows no
//! function on a trap for a call or a short jump in its first bytes.

mod common;

use common::{file_offset_of, gcc, hotprobe, memory_at, text, while_attached, CountTable};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const LIBSQLITE3: &str = "/usr/lib/x86_64-linux-gnu/libsqlite3.so.0";

/// The functions of prologues.c that must take a jump.
const JUMPED: &[&str] = &[
    "sub_call",
    "push_call",
    "push_icall",
    "jmp_first",
    "jcc_first",
    "sub_jump",
    "c_wrap",
    "c_tiny",
];

fn tmp() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("stock_prologues");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// prologues.c built without (`plain`) or with `-fcf-protection=full`
/// (`cet`).
fn program(cet: bool) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/prologues.c");
    let (name, flag) = match cet {
        false => ("prologues_plain", "-fcf-protection=none"),
        true => ("prologues_cet", "-fcf-protection=full"),
    };
    gcc(&src, &tmp().join(name), &["-O2", flag])
}

/// The first instructions of `func` in `prog` as objdump shows them:
/// (address, raw bytes, text).
fn disassembly(prog: &Path, func: &str) -> Vec<(u64, String, String)> {
    let o = Command::new("objdump")
        .arg("-d")
        .arg(format!("--disassemble={func}"))
        .arg(prog)
        .output()
        .expect("objdump runs");
    assert!(o.status.success(), "objdump: {}", text(&o.stderr));
    text(&o.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            let addr = u64::from_str_radix(f.next()?.trim().strip_suffix(':')?, 16).ok()?;
            let bytes = f.next()?.trim().to_string();
            let insn = f.next().unwrap_or("").trim().to_string();
            Some((addr, bytes, insn))
        })
        .collect()
}

/// The text of the first instructions of `func` in `prog`.
fn first_instructions(prog: &Path, func: &str) -> Vec<String> {
    disassembly(prog, func)
        .into_iter()
        .map(|(_, _, i)| i)
        .collect()
}

/// Asserts the prologue shapes prologues.c writes in assembly (and, for
/// `cet`, gcc's endbr64 in front of c_wrap and c_tiny).
fn assert_shapes(prog: &Path, cet: bool) {
    let d = |f: &str| disassembly(prog, f);
    let first = |f: &str| first_instructions(prog, f);
    let sub = first("sub_call");
    assert!(
        sub[0].starts_with("sub    $0x8,%rsp")
            && sub[1].starts_with("call")
            && sub[1].ends_with("<leaf>"),
        "{sub:?}"
    );
    let push = first("push_call");
    assert!(
        push[0] == "push   %rbx" && push[1].starts_with("call") && push[1].ends_with("<leaf>"),
        "{push:?}"
    );
    let ipush = d("push_icall");
    assert!(
        ipush[0].2 == "push   %rbx" && ipush[1].1.starts_with("ff 15"),
        "call *x(%rip): {ipush:?}"
    );
    let j = d("jmp_first");
    assert!(
        j[0].1.starts_with("eb ") && j[1].2.starts_with("nop"),
        "jmp rel8 over padding: {j:?}"
    );
    let jc = d("jcc_first");
    assert!(jc[1].1.starts_with("74 "), "je rel8 at +3: {jc:?}");
    for f in ["c_wrap", "c_tiny"] {
        let c = d(f);
        assert_eq!(c[0].2 == "endbr64", cet, "{f}: {c:?}");
    }
}

/// `name N` in the program's last line.
fn field(out: &str, name: &str) -> u64 {
    let words: Vec<&str> = out.split_whitespace().collect();
    let i = words
        .iter()
        .position(|w| *w == name)
        .unwrap_or_else(|| panic!("no {name} in {out}"));
    words[i + 1].parse().unwrap()
}

fn count_run(prog: &Path, probes: &[&str], args: &[&str]) -> (String, String, Option<i32>) {
    let mut a = vec!["count"];
    a.extend_from_slice(probes);
    a.push("--");
    a.push(prog.to_str().unwrap());
    a.extend_from_slice(args);
    let o = hotprobe(&a);
    (text(&o.stdout), text(&o.stderr), o.status.code())
}

fn counts_on_jump_equal_the_programs_own(cet: bool) {
    let prog = program(cet);
    assert_shapes(&prog, cet);
    let plain = Command::new(&prog).arg("20").output().unwrap();
    let expected = text(&plain.stdout);
    assert_eq!(plain.status.code(), Some(3), "{expected}");
    assert!(expected.contains("longjmp 42"), "{expected}");
    let mut probes = JUMPED.to_vec();
    probes.extend(["leaf", "jumper"]);
    let (stdout, stderr, status) = count_run(&prog, &probes, &["20"]);
    assert_eq!(status, Some(3), "{stdout}\n{stderr}");
    assert_eq!(common::program_output(&stdout), expected, "{stderr}");
    let t = CountTable::parse(&stdout, &stderr);
    for f in JUMPED {
        assert_eq!(t.execution(f), "jump", "{}", t.all);
    }
    for (f, n) in [
        ("sub_call", 20),
        ("push_call", 20),
        ("push_icall", 20),
        ("jmp_first", 20),
        ("jcc_first", 20),
        // 20 rounds and the one that longjmps out of jumper.
        ("sub_jump", 21),
        // Directly and through wrap_ptr.
        ("c_wrap", 40),
        ("c_tiny", 20),
    ] {
        assert_eq!(t.hits(f), n, "{f}: {}", t.all);
    }
    assert_eq!(t.hits("leaf"), field(&expected, "leaf"), "{}", t.all);
    assert_eq!(t.hits("jumper"), field(&expected, "jumper"), "{}", t.all);
    for f in ["c_wrap", "c_tiny"] {
        let why = t.row(f).join(" ");
        assert_eq!(
            why.contains("after the entry's endbr64"),
            cet,
            "{f}: {}",
            t.all
        );
    }
}

#[test]
fn call_and_short_jump_prologues_take_a_jump_and_count_exactly() {
    counts_on_jump_equal_the_programs_own(false);
}

#[test]
fn after_an_endbr64_the_jump_goes_at_entry_plus_4_and_the_endbr64_stays() {
    counts_on_jump_equal_the_programs_own(true);
    let prog = program(true);
    // What the process itself reads at c_wrap while probed: endbr64 then
    // the jump (e9); unprobed, endbr64 then its call (e8).
    let alone = Command::new(&prog).arg("code").output().unwrap();
    assert!(
        text(&alone.stdout).starts_with("f3 0f 1e fa e8 "),
        "{}",
        text(&alone.stdout)
    );
    let (stdout, stderr, status) = count_run(&prog, &["c_wrap"], &["code"]);
    assert_eq!(status, Some(0), "{stdout}\n{stderr}");
    assert!(
        common::program_output(&stdout).starts_with("f3 0f 1e fa e9 "),
        "{stdout}\n{stderr}"
    );
    // %return (a trap at the entry, on the endbr64) beside the jump at
    // entry + 4: both count every call.
    let (stdout, stderr, status) = count_run(&prog, &["c_wrap", "c_wrap%return"], &["20"]);
    assert_eq!(status, Some(3), "{stdout}\n{stderr}");
    let t = CountTable::parse(&stdout, &stderr);
    assert_eq!(t.execution("c_wrap"), "jump", "{}", t.all);
    assert_eq!(t.hits("c_wrap"), 40, "{}", t.all);
    assert_eq!(t.hits("c_wrap%return"), 40, "{}", t.all);
}

/// A C++ exception thrown through `sub $8,%rsp; call thrower`
/// (prologue_throw.cc): the unwinder walks the frame by its original
/// return address, under `count` and under `trace` (return hooks).
#[test]
fn an_exception_through_a_relocated_call_is_caught() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/prologue_throw.cc");
    let prog = hotprobe_testkit::compile(
        "g++",
        &src,
        &tmp().join("prologue_throw"),
        &["-O2", "-g"],
        &[],
    );
    let sub = first_instructions(&prog, "sub_throw");
    assert!(
        sub[0].starts_with("sub    $0x8,%rsp") && sub[1].ends_with("<thrower>"),
        "{sub:?}"
    );
    let expected = "sum 70 caught 2\n";
    assert_eq!(
        text(&Command::new(&prog).output().unwrap().stdout),
        expected
    );
    let (stdout, stderr, status) = count_run(&prog, &["sub_throw", "thrower"], &[]);
    assert_eq!(status, Some(0), "{stdout}\n{stderr}");
    assert_eq!(common::program_output(&stdout), expected, "{stderr}");
    let t = CountTable::parse(&stdout, &stderr);
    for f in ["sub_throw", "thrower"] {
        assert_eq!(t.execution(f), "jump", "{}", t.all);
        assert_eq!(t.hits(f), 10, "{}", t.all);
    }
    let o = hotprobe(&[
        "trace",
        "sub_throw",
        "thrower",
        "--",
        prog.to_str().unwrap(),
    ]);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains(expected), "{stdout}");
    let calls: Vec<(usize, String)> = common::call_tree(&stdout)
        .into_iter()
        .map(|(_, d, n)| (d, n))
        .collect();
    let mut want = Vec::new();
    for _ in 0..10 {
        want.push((0, "sub_throw".to_string()));
        want.push((1, "thrower".to_string()));
    }
    assert_eq!(calls, want, "{stdout}");
}

/// `count -p` on the `lines` server: exact counts while attached, the
/// same answers, and once detached every probed function's bytes in
/// memory are the file's.
#[test]
fn after_a_detach_the_code_is_the_files() {
    let prog = program(true);
    let file = std::fs::read(&prog).unwrap();
    let mut server = Command::new(&prog)
        .arg("lines")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = server.stdin.take().unwrap();
    let mut output = BufReader::new(server.stdout.take().unwrap()).lines();
    assert_eq!(output.next().unwrap().unwrap(), "ready");
    let mut ask = |n: u32| -> String {
        writeln!(input, "{n}").unwrap();
        output.next().unwrap().unwrap()
    };
    let before = ask(10);
    let pid = server.id().to_string();
    let mut args = vec!["count", "-p", &pid, "--duration", "2"];
    args.extend_from_slice(JUMPED);
    let (during, status, stdout, stderr) = while_attached(&args, || ask(10));
    assert!(status.success(), "{stdout}\n{stderr}");
    assert_eq!(during, before, "computed otherwise under the probes");
    let t = CountTable::parse(&stdout, &stderr);
    for f in JUMPED {
        assert_eq!(t.execution(f), "jump", "{}", t.all);
        let n = if *f == "c_wrap" { 20 } else { 10 };
        assert_eq!(t.hits(f), n, "{f}: {}", t.all);
    }
    for f in JUMPED {
        // The site: the entry, or entry + 4 after an endbr64.
        let addr =
            u64::from_str_radix(t.row(f)[t.col("ADDRESS")].trim_start_matches("0x"), 16).unwrap();
        let off = file_offset_of(server.id(), addr) as usize;
        assert_eq!(
            memory_at(server.id(), addr, 12),
            &file[off..off + 12],
            "{f} at {addr:#x} after detach"
        );
    }
    assert_eq!(ask(10), before);
    drop(input);
    assert!(server.wait().unwrap().success());
}

/// The `hotprobe: skipping …` lines of `stderr`, in order.
fn skipping(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("hotprobe: skipping "))
        .collect()
}

/// t_short's reason: 3 bytes and the next function right after it.
const T_SHORT_WHY: &str = "function shorter than 5 bytes (3 bytes); no punned jump: it would fix \
     2 bytes of the next function, which a probe there would change (only a 4-byte function, \
     one fixed byte, is punned)";

/// t_loop's reason: its `jne` back to +4, as the planner prints it.
fn t_loop_branch(prog: &Path) -> String {
    let d = disassembly(prog, "t_loop");
    let start = d[0].0;
    let (at, _, _) = d
        .iter()
        .find(|(_, _, i)| i.starts_with("jne"))
        .unwrap_or_else(|| panic!("no jne in t_loop: {d:?}"));
    format!(
        "a jump lands inside the first 5 bytes at +4 (from `jne short {:#x}` at +{:#x})",
        start + 4,
        at - start
    )
}

#[test]
fn no_traps_leaves_out_and_lists_what_needs_a_trap() {
    let prog = program(false);
    let expected = text(&Command::new(&prog).arg("20").output().unwrap().stdout);
    let branch = t_loop_branch(&prog);
    let listed = vec![
        format!("hotprobe: skipping t_short: needs a trap ({T_SHORT_WHY})"),
        format!("hotprobe: skipping t_loop: needs a trap ({branch})"),
    ];
    // count
    let (stdout, stderr, status) = count_run(&prog, &["--no-traps", "t_*"], &["20"]);
    assert_eq!(status, Some(3), "{stdout}\n{stderr}");
    assert_eq!(common::program_output(&stdout), expected);
    assert_eq!(skipping(&stderr), listed, "{stderr}");
    let t = CountTable::parse(&stdout, &stderr);
    assert_eq!(t.rows.len(), 1, "{}", t.all);
    assert_eq!(t.execution("t_ok"), "jump", "{}", t.all);
    assert_eq!(t.hits("t_ok"), 20, "{}", t.all);
    // Without --no-traps both are probed (in-process traps) and counted.
    let (stdout, stderr, _) = count_run(&prog, &["t_*"], &["20"]);
    let t = CountTable::parse(&stdout, &stderr);
    assert_eq!(t.hits("t_short") + t.hits("t_loop"), 40, "{}", t.all);
    assert!(skipping(&stderr).is_empty(), "{stderr}");
    // trace
    let o = hotprobe(&[
        "trace",
        "--no-traps",
        "t_*",
        "--",
        prog.to_str().unwrap(),
        "3",
    ]);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(3), "{stdout}\n{stderr}");
    assert_eq!(skipping(&stderr), listed, "{stderr}");
    let calls: Vec<String> = common::call_tree(&stdout)
        .into_iter()
        .map(|(_, _, n)| n)
        .collect();
    assert_eq!(calls, vec!["t_ok"; 3], "{stdout}");
}

#[test]
fn a_forced_jump_with_a_pattern_places_what_it_can_and_lists_the_rest() {
    let prog = program(false);
    let expected = text(&Command::new(&prog).arg("20").output().unwrap().stdout);
    let (stdout, stderr, status) = count_run(&prog, &["--mechanism", "jump", "t_*"], &["20"]);
    assert_eq!(status, Some(3), "{stdout}\n{stderr}");
    assert_eq!(common::program_output(&stdout), expected);
    assert_eq!(
        skipping(&stderr),
        vec![
            format!("hotprobe: skipping t_short: cannot use the jump mechanism for t_short: {T_SHORT_WHY}"),
            format!(
                "hotprobe: skipping t_loop: cannot use the jump mechanism for t_loop: {}",
                t_loop_branch(&prog)
            ),
        ],
        "{stderr}"
    );
    let t = CountTable::parse(&stdout, &stderr);
    assert_eq!(t.rows.len(), 1, "{}", t.all);
    assert_eq!(t.execution("t_ok"), "jump", "{}", t.all);
    assert_eq!(t.hits("t_ok"), 20, "{}", t.all);
}

#[test]
fn stock_libsqlite3_has_no_function_on_a_trap_for_a_call_or_a_short_jump() {
    assert!(
        Path::new(LIBSQLITE3).exists(),
        "{LIBSQLITE3} missing: scripts/setup.sh installs sqlite3"
    );
    let o = hotprobe(&["list", LIBSQLITE3, "--summary"]);
    let (stdout, stderr) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{stderr}");
    let number = |label: &str| -> u64 {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(label))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no `{label}` line:\n{stdout}"))
    };
    let (total, jump, on_traps) = (number("total"), number("jump"), number("on traps"));
    assert_eq!(
        on_traps,
        number("in-process trap") + number("trap"),
        "{stdout}"
    );
    assert!(total > 1000 && jump + on_traps <= total, "{stdout}");
    let reasons: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.contains("WHY (traps)"))
        .skip(1)
        .collect();
    let listed: u64 = reasons
        .iter()
        .map(|l| l.split_whitespace().next().unwrap().parse::<u64>().unwrap())
        .sum();
    assert_eq!(listed, on_traps, "{stdout}");
    for l in &reasons {
        assert!(
            !l.contains("is a call") && !l.contains("jumps away"),
            "a call or a short jump in the first bytes still traps: {l}\n{stdout}"
        );
    }
}
