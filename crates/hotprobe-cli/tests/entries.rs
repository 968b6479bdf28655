//! Never change what the program does: probes that need a function entry
//! (`%return` counts, `trace`, `record`) refuse gcc's `.cold` partitions
//! and labels with the reason, patterns leave them out and say so, and raw
//! addresses in stripped binaries are probed only where decoding from a
//! known instruction boundary (a symbol, else an `.eh_frame` FDE) reaches
//! them (`--force` skips that check). In every case the program prints
//! what it prints alone, and the counts are the calls it made.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Output, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

mod common;
use common::{
    call_tree, gcc, hotprobe_within, line_reader, output_within, program_output, ready_pid, text,
    CountTable, HOTPROBE,
};

const LIMIT: Duration = Duration::from_secs(120);
const WAIT: Duration = Duration::from_secs(30);

const COLD_REASON: &str = "g.cold is a cold partition of g (gcc -freorder-blocks-and-partition), \
                           not a function entry: its [rsp] is not a return address";
const COLD_SUMMARY: &str = "not a function entry: a cold partition of a function \
                            (gcc -freorder-blocks-and-partition): its [rsp] is not a return address";

fn programs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/programs")
}

fn out_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("entries");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// coldsplit.c with gcc -O2 (and -g, from the helper).
fn coldsplit() -> PathBuf {
    gcc(
        &programs().join("coldsplit.c"),
        &out_dir().join("coldsplit"),
        &["-O2"],
    )
}

/// `strip -o OUT IN` (once per OUT).
fn stripped(input: &Path, name: &str) -> PathBuf {
    let out = out_dir().join(name);
    let part = out.with_extension(format!("{}.part", std::process::id()));
    let st = Command::new("strip")
        .arg("-o")
        .arg(&part)
        .arg(input)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::rename(&part, &out).unwrap();
    out
}

/// clones.cc with g++ -O2 -g (written aside and renamed: tests run at once).
fn clones() -> PathBuf {
    let out = out_dir().join("clones");
    hotprobe_testkit::compile(
        "g++",
        &programs().join("clones.cc"),
        &out,
        &["-O2", "-g"],
        &[],
    )
}

/// The link address `nm` gives `name` in `bin`.
fn nm(bin: &Path, name: &str) -> u64 {
    let o = Command::new("nm").arg(bin).output().unwrap();
    text(&o.stdout)
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] == name).then(|| u64::from_str_radix(f[0], 16).unwrap())
        })
        .unwrap_or_else(|| panic!("nm shows no {name} in {}", bin.display()))
}

/// What the program prints run alone.
fn alone(bin: &Path, args: &[&str]) -> String {
    let o = Command::new(bin).args(args).output().unwrap();
    assert!(o.status.success());
    text(&o.stdout)
}

fn hp(args: &[&str]) -> Output {
    hotprobe_within(args, LIMIT)
}

/// `hotprobe ARGS -- BIN BIN_ARGS`.
fn hp_run(args: &[&str], bin: &Path, bin_args: &[&str]) -> Output {
    let mut c = Command::new(HOTPROBE);
    c.args(args).arg("--").arg(bin).args(bin_args);
    output_within(c, LIMIT)
}

/// A refusal: exit code 1, the one error line, the program never ran.
fn assert_refused(o: &Output, message: &str) {
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(1), "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        err.lines()
            .any(|l| l.starts_with("hotprobe: error: ") && l.contains(message)),
        "no error line with {message:?}:\n{err}"
    );
    assert!(!out.contains("t="), "the program ran:\n{out}");
}

#[test]
fn cold_partition_return_probes_are_refused() {
    let bin = coldsplit();
    assert!(nm(&bin, "g.cold") > 0, "gcc -O2 made g.cold");
    let expected = alone(&bin, &[]);

    // The user's report: a %return count on g.cold changed t=.
    let o = hp_run(&["count", "g.cold%return"], &bin, &[]);
    assert_refused(&o, &format!("cannot probe g.cold%return: {COLD_REASON}"));
    // By address too.
    let addr = format!("coldsplit:{:#x}%return", nm(&bin, "g.cold"));
    assert_refused(&hp_run(&["count", &addr], &bin, &[]), COLD_REASON);
    // trace and record are entry probes as well.
    assert_refused(&hp_run(&["trace", "g.cold"], &bin, &[]), COLD_REASON);
    let dir = out_dir().join("rec-refused");
    let o = hp_run(
        &[
            "record",
            "-o",
            dir.to_str().unwrap(),
            "--phase",
            "g.cold",
            "g",
        ],
        &bin,
        &[],
    );
    assert_refused(&o, COLD_REASON);
    // A label is no entry either.
    assert_refused(
        &hp_run(&["count", "asm_twice_done%return"], &bin, &[]),
        "asm_twice_done is a label inside a function (a local symbol without a function \
         type), not a function entry",
    );

    // Counting its entries is fine (a trap where it starts): the program
    // prints the same, g.cold ran every 97th call.
    let o = hp_run(
        &["count", "g.cold", "g", "asm_twice_done", "g%return"],
        &bin,
        &[],
    );
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert_eq!(program_output(&out), expected);
    let t = CountTable::parse(&out, &err);
    assert_eq!(t.hits("g.cold"), 3);
    // Taken in the process by the agent (no ptrace stop).
    assert_eq!(t.execution("g.cold"), "in-process");
    assert_eq!(t.hits("g"), 300);
    assert_eq!(t.hits("g%return"), 300);
    assert_eq!(t.hits("asm_twice_done"), 300);
}

#[test]
fn patterns_leave_cold_parts_and_labels_out() {
    let bin = coldsplit();
    let expected = alone(&bin, &[]);

    let o = hp_run(&["count", "g*%return", "asm*"], &bin, &[]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert_eq!(program_output(&out), expected);
    assert!(
        err.contains(&format!("hotprobe: skipping g.cold%return: {COLD_SUMMARY}")),
        "{err}"
    );
    assert!(
        err.contains(
            "hotprobe: skipping asm_twice_done: not a function entry: a label inside a \
             function (a local symbol without a function type)"
        ),
        "{err}"
    );
    let t = CountTable::parse(&out, &err);
    assert_eq!(t.hits("g%return"), 300);
    assert_eq!(t.hits("asm_twice"), 300);
    assert!(t.rows_of("g.cold%return").is_empty(), "{}", t.all);
    assert!(t.rows_of("asm_twice_done").is_empty(), "{}", t.all);

    // trace 'g*' traces g only.
    let o = hp_run(&["trace", "g*"], &bin, &[]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains(&format!("hotprobe: skipping g.cold: {COLD_SUMMARY}")),
        "{err}"
    );
    let program: String = out
        .lines()
        .filter(|l| l.starts_with("t="))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(program, expected);
    let calls = call_tree(&out);
    assert_eq!(calls.len(), 300, "{out}");
    assert!(calls
        .iter()
        .all(|(_, depth, name)| name == "g" && *depth == 0));

    // record's default set: every function but g.cold (and the label).
    let dir = out_dir().join("rec-default");
    // A trace of an earlier run is not replaced without --force.
    let _ = std::fs::remove_dir_all(&dir);
    let o = hp_run(&["record", "-o", dir.to_str().unwrap()], &bin, &[]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert_eq!(out, expected);
    assert!(
        err.lines()
            .any(|l| l.trim() == format!("not probed ({COLD_SUMMARY}): g.cold")),
        "{err}"
    );
    assert!(
        err.lines().any(|l| l.trim()
            == "not probed (not a function entry: a label inside a function (a local \
                symbol without a function type)): asm_twice_done"),
        "{err}"
    );
    let replay = hp(&["replay", dir.to_str().unwrap()]);
    let names: BTreeSet<String> = call_tree(&text(&replay.stdout))
        .into_iter()
        .map(|(_, _, n)| n)
        .collect();
    assert!(names.contains("g") && names.contains("h"), "{names:?}");
    assert!(!names.contains("g.cold"), "{names:?}");

    // list says which are not entries.
    let o = hp(&["list", bin.to_str().unwrap(), "*"]);
    let out = text(&o.stdout);
    let line = |name: &str| {
        out.lines()
            .find(|l| l.ends_with(&format!(" {name}")))
            .unwrap_or_else(|| panic!("no {name}:\n{out}"))
            .to_string()
    };
    assert!(
        line("g.cold").contains("not a function entry: a cold partition of g"),
        "{out}"
    );
    assert!(line("asm_twice_done").contains("not a function entry: a label"));
    assert!(!line("g").contains("not a function entry"), "{out}");
}

/// `coldsplit serve`, started here; killed on drop.
struct Serve {
    child: Child,
    stdin: ChildStdin,
    lines: Receiver<String>,
    pid: i32,
}

impl Serve {
    fn start(bin: &Path) -> Serve {
        let mut child = Command::new(bin)
            .arg("serve")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let lines = line_reader(child.stdout.take().unwrap());
        let pid = ready_pid(&lines, WAIT) as i32;
        Serve {
            child,
            stdin,
            lines,
            pid,
        }
    }

    fn run(&mut self, n: u32) -> String {
        writeln!(self.stdin, "run {n}").unwrap();
        self.stdin.flush().unwrap();
        self.lines.recv_timeout(WAIT).expect("an answer")
    }

    /// The bytes of its executable mappings.
    fn text(&self) -> Vec<(u64, Vec<u8>)> {
        use std::os::unix::fs::FileExt;
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)).unwrap();
        let mem = std::fs::File::open(format!("/proc/{}/mem", self.pid)).unwrap();
        let mut v = Vec::new();
        for l in maps.lines() {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f[1] != "r-xp" || l.contains("[vsyscall]") {
                continue;
            }
            let (a, b) = f[0].split_once('-').unwrap();
            let (a, b) = (
                u64::from_str_radix(a, 16).unwrap(),
                u64::from_str_radix(b, 16).unwrap(),
            );
            let mut buf = vec![0u8; (b - a) as usize];
            mem.read_exact_at(&mut buf, a).unwrap();
            v.push((a, buf));
        }
        v
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn refusals_on_a_running_process_write_nothing() {
    let bin = coldsplit();
    let expected = alone(&bin, &["1000"]);
    let mut s = Serve::start(&bin);
    let before = s.text();
    let pid = s.pid.to_string();
    for spec in ["g.cold%return", "asm_twice_done%return"] {
        let o = hp(&["count", spec, "-p", &pid]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
        assert!(text(&o.stderr).contains("not a function entry"));
        assert!(s.text() == before, "{spec}: the text changed");
    }
    let o = hp(&["trace", "g.cold", "-p", &pid]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains(COLD_REASON));
    assert!(s.text() == before, "trace: the text changed");
    // It runs on as before.
    assert_eq!(format!("{}\n", s.run(1000)), expected);
}

#[test]
fn cxx_clones_are_probed_and_cold_parts_left_out() {
    let bin = clones();
    let expected = alone(&bin, &[]);
    // `calls work=200 big_sum=200 scaled=400 lookup_slow=S`.
    let calls: Vec<u64> = expected
        .lines()
        .find(|l| l.starts_with("calls "))
        .unwrap()
        .split_whitespace()
        .skip(1)
        .map(|kv| kv.split_once('=').unwrap().1.parse().unwrap())
        .collect();
    let [work, big_sum, scaled, slow] = calls[..] else {
        panic!("{expected}")
    };

    let o = hp_run(
        &[
            "count",
            "work*",
            "big_sum*",
            "scaled*",
            "lookup*",
            "big_sum*%return",
            "scaled*%return",
            "lookup*%return",
        ],
        &bin,
        &[],
    );
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert_eq!(program_output(&out), expected);
    let cold = "work(std::vector<long, std::allocator<long> >&, long) [clone .cold]";
    assert!(
        err.contains(&format!("hotprobe: skipping {cold}: {COLD_SUMMARY}")),
        "{err}"
    );
    let t = CountTable::parse(&out, &err);
    // Labels with spaces span several words: match rows by their start.
    let hits = |prefix: &str| -> u64 {
        let rows: Vec<&Vec<String>> = t
            .rows
            .iter()
            .filter(|r| r.join(" ").starts_with(prefix))
            .collect();
        assert_eq!(rows.len(), 1, "one row {prefix}:\n{}", t.all);
        let line = rows[0].join(" ");
        let rest = &line[prefix.len()..];
        // ADDRESS then HITS.
        rest.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    assert_eq!(
        hits("work(std::vector<long, std::allocator<long> >&, long) 0x"),
        work
    );
    assert_eq!(hits("big_sum(Big, long) [clone .isra.0] 0x"), big_sum);
    assert_eq!(hits("scaled(long, long) [clone .constprop.0] 0x"), scaled);
    assert_eq!(hits("lookup(long) [clone .part.0] 0x"), slow);
    assert_eq!(hits("big_sum(Big, long) [clone .isra.0]%return"), big_sum);
    assert_eq!(
        hits("scaled(long, long) [clone .constprop.0]%return"),
        scaled
    );
    assert_eq!(hits("lookup(long) [clone .part.0]%return"), slow);
    assert!(!t.all.contains("[clone .cold]%return"), "{}", t.all);

    // The cold part by its own name: refused.
    let o = hp_run(
        &["count", "_Z4workRSt6vectorIlSaIlEEl.cold%return"],
        &bin,
        &[],
    );
    assert_refused(&o, &format!("{cold} is a cold partition of work("));

    // record's default set leaves out every .cold part, runs the same.
    let dir = out_dir().join("rec-clones");
    // A trace of an earlier run is not replaced without --force.
    let _ = std::fs::remove_dir_all(&dir);
    let o = hp_run(&["record", "-o", dir.to_str().unwrap()], &bin, &[]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert_eq!(out, expected);
    let line = err
        .lines()
        .find(|l| {
            l.trim()
                .starts_with(&format!("not probed ({COLD_SUMMARY}): "))
        })
        .unwrap_or_else(|| panic!("{err}"));
    for c in [cold, "checked(long) [clone .cold]", "main.cold"] {
        assert!(line.contains(c), "{c} not in {line}");
    }
}

#[test]
fn stripped_addresses_need_a_known_boundary() {
    let bin = coldsplit();
    let expected = alone(&bin, &[]);
    let (g, cold) = (nm(&bin, "g"), nm(&bin, "g.cold"));
    let s = stripped(&bin, "coldsplit-stripped");

    // Inside g.cold's first instruction: found by decoding from its FDE.
    let spec = format!("coldsplit-stripped:{:#x}", cold + 1);
    let o = hp_run(&["count", &spec], &s, &[]);
    assert_refused(
        &o,
        "is in the middle of an instruction (decoded from the FDE start 0x",
    );
    // g's entry is an FDE start with the return address on top: an entry.
    let spec = format!("coldsplit-stripped:{g:#x}");
    let ret = format!("{spec}%return");
    let o = hp_run(&["count", &spec, &ret], &s, &[]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert_eq!(program_output(&out), expected);
    let t = CountTable::parse(&out, &err);
    assert_eq!(t.hits(&spec), 300);
    assert_eq!(t.hits(&ret), 300);
    // g.cold's FDE start: [rsp] is g's saved register, not a return address.
    let spec = format!("coldsplit-stripped:{cold:#x}%return");
    assert_refused(
        &hp_run(&["count", &spec], &s, &[]),
        "starts an .eh_frame FDE but has no symbol, and [rsp] is not the return address there",
    );

    // No .eh_frame, no symbols: nothing is known before g's code.
    let bare = gcc(
        &programs().join("coldsplit.c"),
        &out_dir().join("coldsplit-bare"),
        &[
            "-O2",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
        ],
    );
    let g = nm(&bare, "g");
    let s = stripped(&bare, "coldsplit-bare-stripped");
    let spec = format!("coldsplit-bare-stripped:{g:#x}");
    let o = hp_run(&["count", &spec], &s, &[]);
    assert_refused(
        &o,
        &format!(
            "(coldsplit-bare-stripped:{g:#x}) (no symbol covers it and no .eh_frame entry: \
             stripped?): pass --force to probe it anyway"
        ),
    );
    assert!(text(&o.stderr).contains("no known instruction boundary before 0x"));
    // --force: the user knows g starts there.
    let o = hp_run(&["count", "--force", &spec], &s, &[]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{err}");
    assert_eq!(program_output(&out), expected);
    assert_eq!(CountTable::parse(&out, &err).hits(&spec), 300);
    // trace takes --force, but still wants a known entry.
    let o = hp_run(&["trace", "--force", &spec], &s, &[]);
    assert_refused(&o, "has no symbol and no .eh_frame entry in coldsplit-bare-stripped: not known to be a function entry");
}
