//! Issue 24: a `count` condition naming parameters, on a function of a
//! library the program loads later (dlopen): the probe is pending at the
//! start, and its condition compiles when the library is loaded, from the
//! library's DWARF, on the fast path and on the trap. Where it cannot (a
//! stripped library, a name that is no parameter), a notice says why and
//! the hits are reported as not counted.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;
use common::{hotprobe_within, program_output, text, CountTable};

const LIMIT: Duration = Duration::from_secs(120);
const CALLS: &str = "12";

fn dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pending_conditions");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The program, and the library built with `flags` as `lib`NAME`.so` next
/// to it (where the resolver finds a library the program names by path).
fn build(lib: &str, flags: &[&str]) -> (PathBuf, PathBuf) {
    common::dlopen_cond(&dir(), lib, flags)
}

/// The calls the program printed: (n, weight).
fn calls(out: &str) -> Vec<(i64, i64)> {
    out.lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("call ")?.split(' ');
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect()
}

/// The program's own output, run without hotprobe.
fn untraced(prog: &Path, so: &Path) -> String {
    let o = Command::new(prog)
        .args([so.to_str().unwrap(), CALLS])
        .output()
        .unwrap();
    assert!(o.status.success(), "{o:?}");
    text(&o.stdout)
}

/// `hotprobe count [extra] SPEC -- prog so CALLS`: (stdout, stderr); the
/// run must succeed with the program's output as without hotprobe.
fn count(prog: &Path, so: &Path, spec: &str, extra: &[&str]) -> (String, String) {
    let mut a = vec!["count"];
    a.extend_from_slice(extra);
    a.extend_from_slice(&[
        spec,
        "--",
        prog.to_str().unwrap(),
        so.to_str().unwrap(),
        CALLS,
    ]);
    let o = hotprobe_within(&a, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{out}\n{err}");
    assert_eq!(program_output(&out), untraced(prog, so), "{err}");
    assert!(
        err.contains("pending 1"),
        "the probe starts pending:\n{err}"
    );
    (out, err)
}

#[test]
fn a_condition_on_a_library_loaded_later_counts_the_calls_it_holds_for() {
    let (prog, so) = build("condlib", &["-g"]);
    let made = calls(&untraced(&prog, &so));
    assert_eq!(made.len(), 12);
    let expected = made.iter().filter(|(n, w)| *n >= 2 && *w > -150).count() as u64;
    assert_eq!(expected, 7, "{made:?}");
    let spec = "libcondlib.so:scale if n >= 2 && weight > -150";
    // The fast path where it takes the function, the trap when asked: the
    // row shows where the probe was armed.
    let runs: [(&[&str], &[&str]); 2] = [
        (&[], &["patch", "jump"]),
        (&["--mechanism", "trap"], &["trap"]),
    ];
    for (extra, on) in runs {
        let (out, err) = count(&prog, &so, spec, extra);
        let table = CountTable::parse(&out, &err);
        let probe = "libcondlib.so:scale";
        assert_eq!(table.hits(probe), expected, "{extra:?}\n{err}");
        assert!(on.contains(&&*table.execution(probe)), "{}", table.all);
        assert!(!err.contains("not counted"), "{extra:?}\n{err}");
    }
}

/// The row of `probe` in a count table shows its hits as not counted:
/// `-` under HITS, and the table's footnote says what `-` means.
fn not_counted_row(out: &str, err: &str, probe: &str) {
    let table = CountTable::parse(out, err);
    assert_eq!(table.row(probe)[table.col("HITS")], "-", "{}", table.all);
    assert!(
        out.lines().any(|l| l
            == "HITS -: not counted: the probe's condition does not compile where it was \
                placed (said on stderr)"),
        "{out}"
    );
}

#[test]
fn a_condition_that_does_not_compile_in_the_loaded_library_is_said_and_not_counted() {
    // Stripped at the link: no DWARF names its parameters.
    let (prog, so) = build("condlib_stripped", &["-s"]);
    let made = calls(&untraced(&prog, &so)).len();
    let (out, err) = count(&prog, &so, "libcondlib_stripped.so:scale if n > 3", &[]);
    assert!(
        err.contains(
            "`libcondlib_stripped.so:scale if n > 3`: the condition names a parameter, and \
             scale has no DWARF (build with -g); its hits are not counted"
        ),
        "{err}"
    );
    assert!(
        err.contains(&format!("hotprobe: {made} hits not counted")),
        "{err}"
    );
    not_counted_row(&out, &err, "libcondlib_stripped.so:scale");
    // The same in JSON (the row after the program's output): no number
    // of hits, and why.
    let spec = "libcondlib_stripped.so:scale if n > 3";
    let (p, l) = (prog.to_str().unwrap(), so.to_str().unwrap());
    let o = hotprobe_within(&["count", "--json", spec, "--", p, l, CALLS], LIMIT);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{out}\n{}", text(&o.stderr));
    let (program, json) = out.rsplit_once("\n[{").expect("a JSON row");
    assert_eq!(format!("{program}\n"), untraced(&prog, &so));
    let rows: serde_json::Value = serde_json::from_str(&format!("[{{{json}")).unwrap();
    assert_eq!(rows[0]["hits"], serde_json::Value::Null, "{rows}");
    assert_eq!(rows[0]["not_counted"], true, "{rows}");

    // With DWARF, a name that is none of the function's parameters.
    let (prog, so) = build("condlib_named", &["-g"]);
    let (out, err) = count(&prog, &so, "libcondlib_named.so:scale if size > 3", &[]);
    assert!(
        err.contains(
            "`libcondlib_named.so:scale if size > 3`: the condition: scale has no parameter \
             size; its parameters: n, weight; its hits are not counted"
        ),
        "{err}"
    );
    assert!(
        err.contains(&format!("hotprobe: {made} hits not counted")),
        "{err}"
    );
    not_counted_row(&out, &err, "libcondlib_named.so:scale");
}

/// `count -f` across exec: each program the shell executes loads the
/// library later; the condition compiles in each, and each row counts its
/// own process's calls that satisfy it (7 of 12, 3 of 5).
#[test]
fn a_condition_on_a_library_an_executed_program_loads_later_counts_in_each() {
    let (prog, so) = build("condlib_exec", &["-g"]);
    let (p, s) = (prog.to_str().unwrap(), so.to_str().unwrap());
    let script = format!("{p} {s} 12; {p} {s} 5");
    let mut c = Command::new(common::HOTPROBE);
    c.args([
        "count",
        "-f",
        "libcondlib_exec.so:scale if n >= 2 && weight > -150",
    ])
    .args(["--", "/bin/sh", "-c", &script])
    // Where the resolver finds the library for the shell's spec.
    .env("LD_LIBRARY_PATH", dir());
    let o = common::output_within(c, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert!(o.status.success(), "{out}\n{err}");
    let made = calls(&out);
    assert_eq!(made.len(), 17, "{out}");
    assert!(!err.contains("not counted"), "{err}");
    let table = CountTable::parse(&out, &err);
    let (comm, hits) = (table.col("COMM"), table.col("HITS"));
    let mut counted: Vec<u64> = table
        .rows_of("libcondlib_exec.so:scale")
        .iter()
        .filter(|r| r[comm] == "dlopen_cond")
        .map(|r| r[hits].parse().unwrap())
        .collect();
    counted.sort();
    assert_eq!(counted, vec![3, 7], "{}", table.all);
}
