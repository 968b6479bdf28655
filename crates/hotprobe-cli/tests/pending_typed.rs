//! Issues 23/24: typed values (`trace -a`, `trace 'f(a, b)'`, `record -a`
//! then `replay`) of a function in a library the program loads later
//! (dlopen): the probe is pending at the start and is typed when it is
//! armed, from the library's DWARF, on the fast path and on the trap, as
//! a probe placed at start is. A stripped library's calls are shown
//! untyped (`-a`: with their raw argument registers), and a notice says
//! why.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;
use common::record::{record, trace_dir};
use common::{hotprobe_within, text};

const LIMIT: Duration = Duration::from_secs(120);
const CALLS: &str = "7";

fn dir() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pending_typed");
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// The program, and the library built with `flags` as `lib`NAME`.so` next
/// to it.
fn build(lib: &str, flags: &[&str]) -> (PathBuf, PathBuf) {
    common::dlopen_cond(&dir(), lib, flags)
}

/// The program's own lines in `out` ("call N WEIGHT", "sum S"), without
/// the call tree's.
fn program_lines(out: &str) -> Vec<String> {
    out.lines()
        .filter(|l| l.starts_with("call ") || l.starts_with("sum "))
        .map(str::to_string)
        .collect()
}

/// The program run without hotprobe: its lines, and each call's (n,
/// weight) with the value `scale` returns for it (`n * weight` plus the
/// running total of the weights, as dlopen_cond_lib.c computes it). The
/// returns add up to the sum the program prints.
fn untraced(prog: &Path, so: &Path) -> (Vec<String>, Vec<(i64, i64, i64)>) {
    let o = Command::new(prog)
        .args([so.to_str().unwrap(), CALLS])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let out = text(&o.stdout);
    let mut total = 0;
    let calls: Vec<(i64, i64, i64)> = out
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("call ")?.split(' ');
            let n: i64 = w.next()?.parse().ok()?;
            let weight: i64 = w.next()?.parse().ok()?;
            total += weight;
            Some((n, weight, n * weight + total))
        })
        .collect();
    assert_eq!(calls.len(), 7, "{out}");
    let sum: i64 = calls.iter().map(|c| c.2).sum();
    assert!(out.contains(&format!("sum {sum}\n")), "{out}");
    (program_lines(&out), calls)
}

/// The calls of `name` in a call tree as `trace` (`name(ARGS) {` then
/// `} /* name */ = RET`) or `replay` (`name(ARGS) = RET;`) prints them:
/// (arguments as printed, return value as printed).
fn traced_calls(out: &str, name: &str) -> Vec<(String, String)> {
    let mut calls = Vec::new();
    let mut open: Option<String> = None;
    for l in out.lines() {
        let Some((_, body)) = l.split_once("] | ") else {
            continue;
        };
        let body = body.trim();
        if let Some(rest) = body.strip_prefix(&format!("{name}(")) {
            let (args, after) = rest.split_once(')').unwrap();
            match after.trim().strip_prefix("= ") {
                // replay's leaf: `name(args) = ret;`
                Some(ret) => calls.push((args.to_string(), ret.trim_end_matches(';').into())),
                None => open = Some(args.to_string()),
            }
        } else if body.starts_with(&format!("}} /* {name} */")) {
            let ret = body.split_once("= ").map_or("", |(_, r)| r).to_string();
            calls.push((open.take().expect("an entry before its exit"), ret));
        }
    }
    calls
}

/// `hotprobe ARGS -- prog so CALLS`: (stdout, stderr); hotprobe exits
/// with the program's status (0), the program's own lines unchanged and
/// the probe pending at the start.
fn run(args: &[&str], prog: &Path, so: &Path, lines: &[String]) -> (String, String) {
    let mut a = args.to_vec();
    a.extend_from_slice(&["--", prog.to_str().unwrap(), so.to_str().unwrap(), CALLS]);
    let o = hotprobe_within(&a, LIMIT);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
    assert!(err.contains("exited with code 0"), "{err}");
    assert!(
        err.contains("pending 1"),
        "the probe starts pending:\n{err}"
    );
    assert_eq!(program_lines(&out), lines, "{err}");
    (out, err)
}

#[test]
fn trace_shows_the_typed_values_of_a_function_in_a_library_loaded_later() {
    let (prog, so) = build("typedlib", &["-g"]);
    let (lines, made) = untraced(&prog, &so);
    let name = "libtypedlib.so:scale";
    for mechanism in [&[][..], &["--mechanism", "trap"][..]] {
        // -a: every parameter's value, and the return value.
        let mut a = vec!["trace", "-a", "--summary"];
        a.extend_from_slice(mechanism);
        a.push(name);
        let (out, err) = run(&a, &prog, &so, &lines);
        let want: Vec<(String, String)> = made
            .iter()
            .map(|(n, w, r)| (format!("{n}, {w}"), r.to_string()))
            .collect();
        assert_eq!(
            traced_calls(&out, name),
            want,
            "{mechanism:?}\n{out}\n{err}"
        );
        // Where it was armed: the fast path by default, the trap when asked.
        let row = out
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no summary row:\n{out}"));
        let on_trap = row.contains(" trap");
        assert_eq!(on_trap, !mechanism.is_empty(), "{row}");
        assert!(!err.contains("DWARF"), "{err}");

        // Named arguments: each shown with its name.
        let spec = format!("{name}(weight, n)");
        let mut a = vec!["trace"];
        a.extend_from_slice(mechanism);
        a.push(&spec);
        let (out, err) = run(&a, &prog, &so, &lines);
        let want: Vec<(String, String)> = made
            .iter()
            .map(|(n, w, r)| (format!("weight={w}, n={n}"), r.to_string()))
            .collect();
        assert_eq!(
            traced_calls(&out, name),
            want,
            "{mechanism:?}\n{out}\n{err}"
        );
    }
}

#[test]
fn record_then_replay_shows_the_typed_values_of_a_function_in_a_library_loaded_later() {
    let (prog, so) = build("recordlib", &["-g"]);
    let (lines, made) = untraced(&prog, &so);
    let want: Vec<(String, String)> = made
        .iter()
        .map(|(n, w, r)| (format!("{n}, {w}"), r.to_string()))
        .collect();
    for (tag, mechanism) in [("auto", &[][..]), ("jump", &["--mechanism", "jump"][..])] {
        let d = trace_dir(&format!("pending_typed_{tag}"));
        let mut probes = vec!["-a"];
        probes.extend_from_slice(mechanism);
        probes.push("librecordlib.so:scale");
        let cmd = [prog.to_str().unwrap(), so.to_str().unwrap(), CALLS];
        let (out, err) = record(&d, &probes, &cmd, LIMIT);
        assert_eq!(program_lines(&out), lines, "{err}");
        assert!(err.contains("pending 1"), "{err}");
        assert!(!err.contains("DWARF"), "{err}");
        let o = hotprobe_within(&["replay", d.to_str().unwrap()], LIMIT);
        let replayed = text(&o.stdout);
        assert!(o.status.success(), "{replayed}\n{}", text(&o.stderr));
        assert_eq!(traced_calls(&replayed, "scale"), want, "{tag}\n{replayed}");
    }
}

#[test]
fn a_stripped_library_loaded_later_is_shown_untyped_with_a_notice() {
    let (prog, so) = build("strippedlib", &["-s"]);
    let (lines, made) = untraced(&prog, &so);
    let name = "libstrippedlib.so:scale";
    let (out, err) = run(&["trace", "-a", name], &prog, &so, &lines);
    assert!(
        err.contains(
            "hotprobe: no DWARF for scale in the library the program loaded (build it with -g): \
             shown with its raw argument registers and return value"
        ),
        "{err}"
    );
    // Every call shown with its raw argument registers (issue 23: "a
    // function with no type information keeps its raw registers under
    // -a"): all six (how many it takes is unknown), the first two the n
    // and weight the program passed (rdi, rsi), and rax, what it returned.
    let calls = traced_calls(&out, name);
    assert_eq!(calls.len(), made.len(), "{out}");
    for ((args, ret), (n, weight, r)) in calls.iter().zip(&made) {
        let regs: Vec<&str> = args.split(", ").collect();
        assert_eq!(regs.len(), 6, "{out}");
        assert_eq!(regs[..2].join(", "), format!("{n}, {weight}"), "{out}");
        assert_eq!(*ret, r.to_string(), "{out}");
    }

    // Names asked of a function without DWARF: said, the calls shown bare.
    let spec = format!("{name}(n)");
    let (out, err) = run(&["trace", &spec], &prog, &so, &lines);
    assert!(
        err.contains(
            "hotprobe: scale: no DWARF for it in libstrippedlib.so (build with -g): argument \
             names need it: shown without arguments"
        ),
        "{err}"
    );
    assert_eq!(traced_calls(&out, name).len(), made.len(), "{out}");

    // record -a: the raw registers and return value, said so, as on a
    // linked function (typed_args.rs).
    let d = trace_dir("pending_typed_stripped");
    let cmd = [prog.to_str().unwrap(), so.to_str().unwrap(), CALLS];
    let (out, err) = record(&d, &["-a", name], &cmd, LIMIT);
    assert_eq!(program_lines(&out), lines, "{err}");
    assert!(
        err.contains(
            "hotprobe: no DWARF for scale in the library the program loaded (build it with -g): \
             recorded with its raw argument registers and return value"
        ),
        "{err}"
    );
    let o = hotprobe_within(&["replay", d.to_str().unwrap()], LIMIT);
    let replayed = text(&o.stdout);
    assert!(o.status.success(), "{replayed}");
    let calls = traced_calls(&replayed, "scale");
    assert_eq!(calls.len(), made.len(), "{replayed}");
    for ((args, ret), (n, weight, r)) in calls.iter().zip(&made) {
        let regs: Vec<&str> = args.split(", ").collect();
        assert_eq!(regs.len(), 6, "{replayed}");
        assert_eq!(regs[..2].join(", "), format!("{n}, {weight}"), "{replayed}");
        assert_eq!(*ret, r.to_string(), "{replayed}");
    }
}

/// A library with a string and a double parameter (`slen`: copied in the
/// target on the fast path, read at the hit on the trap) and a double in
/// an xmm register (`half`: the fast path's xmm layout), and the program
/// that loads it (dlopen) and prints each call's values and result.
const STRING_LIB: &str = r#"
__attribute__((noinline)) int slen(const char *s, double f) {
    int n = 0;
    while (s[n]) n++;
    return n + (int)f;
}
__attribute__((noinline)) double half(int n, double x) { return x / 2 + n; }
"#;
const STRING_MAIN: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) return 3;
    int (*slen)(const char *, double) = (int (*)(const char *, double))dlsym(h, "slen");
    double (*half)(int, double) = (double (*)(int, double))dlsym(h, "half");
    const char *words[] = {"alpha", "be", "gamma-ray"};
    for (int i = 0; i < 3; i++) {
        printf("slen %s %g = %d\n", words[i], i * 0.5, slen(words[i], i * 0.5));
        printf("half %d %g = %g\n", i, i + 0.25, half(i, i + 0.25));
    }
    return 0;
}
"#;

#[test]
fn strings_and_doubles_of_a_library_loaded_later_are_typed_on_each_mechanism() {
    let d = dir();
    std::fs::write(d.join("strlib.c"), STRING_LIB).unwrap();
    std::fs::write(d.join("strmain.c"), STRING_MAIN).unwrap();
    let so = hotprobe_testkit::compile(
        "gcc",
        &d.join("strlib.c"),
        &d.join("libstrlib.so"),
        &["-O1", "-g", "-shared", "-fPIC"],
        &[],
    );
    let prog = hotprobe_testkit::compile(
        "gcc",
        &d.join("strmain.c"),
        &d.join("strmain"),
        &["-O1"],
        &["-ldl"],
    );
    let o = Command::new(&prog).arg(&so).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let own = text(&o.stdout);
    assert!(own.contains("slen gamma-ray 1 = 10\n"), "{own}");
    assert!(own.contains("half 2 2.25 = 3.125\n"), "{own}");
    let (slen, half) = ("libstrlib.so:slen", "libstrlib.so:half");
    let want_slen = [
        ("\"alpha\", 0", "5"),
        ("\"be\", 0.5", "2"),
        ("\"gamma-ray\", 1", "10"),
    ];
    let want_half = [
        ("0, 0.25", "0.125"),
        ("1, 1.25", "1.625"),
        ("2, 2.25", "3.125"),
    ];
    let as_owned = |w: &[(&str, &str)]| -> Vec<(String, String)> {
        w.iter()
            .map(|(a, r)| (a.to_string(), r.to_string()))
            .collect()
    };
    for mechanism in [&[][..], &["--mechanism", "trap"][..]] {
        let mut a = vec!["trace", "-a", "--summary"];
        a.extend_from_slice(mechanism);
        a.extend_from_slice(&[
            slen,
            half,
            "--",
            prog.to_str().unwrap(),
            so.to_str().unwrap(),
        ]);
        let o = hotprobe_within(&a, LIMIT);
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert_eq!(o.status.code(), Some(0), "{out}\n{err}");
        let mine: String = out
            .lines()
            .filter(|l| l.starts_with("slen ") || l.starts_with("half "))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(mine, own, "{err}");
        assert_eq!(
            traced_calls(&out, slen),
            as_owned(&want_slen),
            "{mechanism:?}\n{out}\n{err}"
        );
        assert_eq!(
            traced_calls(&out, half),
            as_owned(&want_half),
            "{mechanism:?}\n{out}\n{err}"
        );
        if mechanism.is_empty() {
            // On the fast path: the string copied in the target, the
            // double from its xmm register.
            assert!(out.contains("typed values copied in the target"), "{out}");
            assert!(
                out.contains("float/double values from xmm registers"),
                "{out}"
            );
        }
    }
    // record -a then replay: the same values.
    let dir = trace_dir("pending_typed_strings");
    let cmd = [prog.to_str().unwrap(), so.to_str().unwrap()];
    let (out, err) = record(&dir, &["-a", slen, half], &cmd, LIMIT);
    assert_eq!(out, own, "{err}");
    let o = hotprobe_within(&["replay", dir.to_str().unwrap()], LIMIT);
    let replayed = text(&o.stdout);
    assert!(o.status.success(), "{replayed}");
    assert_eq!(
        traced_calls(&replayed, "slen"),
        as_owned(&want_slen),
        "{replayed}"
    );
    assert_eq!(
        traced_calls(&replayed, "half"),
        as_owned(&want_half),
        "{replayed}"
    );
}

/// The typed capture of the C and Python APIs
/// (`hotprobe::typed_capture::TypedCapture`) on the library loaded later:
/// each call's parameters and return value, on the fast path and on the
/// trap.
#[test]
fn the_typed_capture_api_types_a_function_in_a_library_loaded_later() {
    use hotprobe::typed_capture::TypedCapture;
    use hotprobe::{Mechanism, MechanismChoice, Session, SessionConfig, SpawnOptions};
    let (prog, so) = build("apilib", &["-g"]);
    let (lines, made) = untraced(&prog, &so);
    for trap in [false, true] {
        let mut config = SessionConfig::default();
        config.fast_path.record_args = 6;
        if trap {
            config.mechanism = MechanismChoice::Trap;
        }
        let out = dir().join(format!("api-{trap}.out"));
        let mut session = Session::with_config(config);
        let t = session
            .spawn_with(
                &prog,
                &[so.clone().into_os_string(), CALLS.into()],
                &SpawnOptions {
                    stdout: Some(std::fs::File::create(&out).unwrap()),
                    ..Default::default()
                },
            )
            .unwrap();
        let mut typed = TypedCapture::new();
        let added = typed
            .place(&mut session, t, "libapilib.so:scale(n, weight)")
            .unwrap();
        assert_eq!(added.placements[0].mechanism, Mechanism::Pending);
        session.start().unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        typed.with_sink(None, |sink| session.run_with(&stop, Some(sink)).unwrap());
        let armed = session.armed_pending();
        assert_eq!(armed.len(), 1);
        assert_eq!(armed[0].placement.mechanism == Mechanism::Trap, trap);
        let shown: Vec<(Vec<String>, bool)> = typed
            .take_events()
            .into_iter()
            .map(|e| (e.values, e.exit))
            .collect();
        let want: Vec<(Vec<String>, bool)> = made
            .iter()
            .flat_map(|(n, w, r)| {
                [
                    (vec![format!("n={n}"), format!("weight={w}")], false),
                    (vec![r.to_string()], true),
                ]
            })
            .collect();
        assert_eq!(shown, want, "trap {trap}");
        drop(session);
        let own = std::fs::read_to_string(&out).unwrap();
        assert_eq!(program_lines(&own), lines);
    }
}
