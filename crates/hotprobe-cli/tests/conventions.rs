//! What a uftrace/bpftrace/perf user expects on day one: the default trace
//! directory `hotprobe.data` (and `record` not overwriting a trace without
//! --force), man pages and shell completions from the build, errors that
//! point at the subcommand's --help (and at a program given without
//! `--`), a pager and colours on terminals only, and a quiet end when the
//! reader of the output goes away (`| head`).

mod common;

use common::{gcc, text, HOTPROBE};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn tmp(name: &str) -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("conventions")
        .join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// tests/programs/many_calls.c, with patchable entries.
fn many_calls() -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/many_calls.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("conventions");
    std::fs::create_dir_all(&dir).unwrap();
    gcc(
        &src,
        &dir.join("many_calls-pfe"),
        &["-O2", "-fpatchable-function-entry=5"],
    )
}

/// `hotprobe ARGS` run in `cwd`, stdin closed, stdout and stderr captured.
fn hotprobe_in(cwd: &Path, args: &[&str]) -> Output {
    Command::new(HOTPROBE)
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .output()
        .expect("hotprobe runs")
}

fn hotprobe(args: &[&str]) -> Output {
    hotprobe_in(Path::new("."), args)
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Single quotes for `sh`.
fn quote(a: &str) -> String {
    format!("'{}'", a.replace('\'', r"'\''"))
}

/// `sh -c CMD` on a pseudo-terminal (util-linux `script`), with `env`
/// added: what a user at a terminal sees (CR LF line ends).
fn on_terminal(cmd: &str, env: &[(&str, &str)]) -> Output {
    let mut c = Command::new("script");
    c.args(["-qec", cmd, "/dev/null"])
        .stdin(Stdio::null())
        .env_remove("NO_COLOR")
        .env("TERM", "xterm");
    for (k, v) in env {
        c.env(k, v);
    }
    common::output_within(c, std::time::Duration::from_secs(60))
}

#[test]
fn record_defaults_to_hotprobe_data_and_replaces_a_trace_only_with_force() {
    let prog = many_calls();
    let cwd = tmp("default-dir");
    let o = hotprobe_in(&cwd, &["record", "--", s(&prog), "100"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(cwd.join("hotprobe.data/info.json").is_file());
    assert!(
        text(&o.stderr).contains("hotprobe.data"),
        "{}",
        text(&o.stderr)
    );

    // replay, report and export read it without a DIR.
    let o = hotprobe_in(&cwd, &["replay"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout).matches("leaf(").count(), 100);
    let o = hotprobe_in(&cwd, &["report"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(text(&o.stdout).contains("leaf"), "{}", text(&o.stdout));
    let o = hotprobe_in(&cwd, &["export", "--format", "ctf"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(cwd.join("hotprobe.data/ctf").is_dir());

    // Again: refused, naming the directory and the flag; nothing ran.
    let o = hotprobe_in(&cwd, &["record", "--", s(&prog), "7"]);
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("hotprobe.data") && err.contains("--force"),
        "{err}"
    );
    assert!(!text(&o.stdout).contains("done"), "the program ran");
    assert!(cwd.join("hotprobe.data/ctf").is_dir());

    // With --force: the old content (the stale export too) is gone.
    let o = hotprobe_in(&cwd, &["record", "--force", "--", s(&prog), "7"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(!cwd.join("hotprobe.data/ctf").exists());
    let o = hotprobe_in(&cwd, &["replay", "hotprobe.data"]);
    assert_eq!(text(&o.stdout).matches("leaf(").count(), 7);

    // A directory that holds no trace is never written into.
    let other = cwd.join("notes");
    std::fs::create_dir_all(&other).unwrap();
    std::fs::write(other.join("todo.txt"), "keep me").unwrap();
    for force in [false, true] {
        let mut a = vec!["record", "-o", "notes"];
        if force {
            a.push("--force");
        }
        a.extend(["--", s(&prog), "3"]);
        let o = hotprobe_in(&cwd, &a);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{err}");
        assert!(err.contains("notes is not a trace directory"), "{err}");
    }
    assert_eq!(
        std::fs::read_to_string(other.join("todo.txt")).unwrap(),
        "keep me"
    );

    // An empty directory is fine.
    std::fs::create_dir_all(cwd.join("empty")).unwrap();
    let o = hotprobe_in(&cwd, &["record", "-o", "empty", "--", s(&prog), "3"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(cwd.join("empty/info.json").is_file());

    // Without a trace: the error names the default directory.
    let o = hotprobe_in(&cwd.join("empty"), &["report"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("hotprobe.data"));
}

/// The subcommands `hotprobe --help` lists (without `help`).
fn subcommands() -> Vec<String> {
    let o = hotprobe(&["--help"]);
    let help = text(&o.stdout);
    let v: Vec<String> = help
        .lines()
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(String::from)
        .collect();
    assert!(v.len() >= 10, "{help}");
    v
}

#[test]
fn the_build_writes_man_pages_and_completions() {
    let out = Path::new(env!("OUT_DIR"));
    // And the copy next to the binary, target/<profile>/.
    let profile = Path::new(HOTPROBE).parent().unwrap();
    let mut pages = vec!["hotprobe".to_string()];
    pages.extend(subcommands().iter().map(|c| format!("hotprobe-{c}")));
    pages.extend(["hotprobe-guest-count".into(), "hotprobe-guest-trace".into()]);
    for dir in [out.join("man/man1"), profile.join("man/man1")] {
        for p in &pages {
            let file = dir.join(format!("{p}.1"));
            assert!(file.is_file(), "no man page {}", file.display());
            let o = Command::new("man")
                .arg("-l")
                .arg(&file)
                .env("MANPAGER", "cat")
                .env("MANWIDTH", "80")
                .output()
                .expect("man runs (man-db: scripts/setup.sh)");
            let page = text(&o.stdout);
            assert!(
                o.status.success(),
                "man -l {}: {}",
                file.display(),
                text(&o.stderr)
            );
            assert!(
                page.contains("NAME") && page.contains("SYNOPSIS") && page.contains(p.as_str()),
                "man -l {}:\n{page}",
                file.display()
            );
        }
    }
    let record = std::fs::read_to_string(out.join("man/man1/hotprobe-record.1")).unwrap();
    assert!(record.contains("hotprobe.data") && record.contains("force"));
    for dir in [out.join("completions"), profile.join("completions")] {
        let bash = std::fs::read_to_string(dir.join("hotprobe.bash")).unwrap();
        for c in subcommands() {
            assert!(bash.contains(&c), "{c} not in the bash completion");
        }
        assert!(bash.contains("complete -F"), "{bash}");
        for f in ["_hotprobe", "hotprobe.fish"] {
            let t = std::fs::read_to_string(dir.join(f)).unwrap();
            assert!(t.contains("record") && t.contains("force"), "{f}");
        }
    }
    // bash reads it.
    let o = Command::new("bash")
        .arg("-c")
        .arg(format!(
            ". {} && complete -p hotprobe",
            quote(s(&out.join("completions/hotprobe.bash")))
        ))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o.stderr));
}

#[test]
fn errors_point_at_the_subcommands_help() {
    let err = |args: &[&str]| {
        let o = hotprobe(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o.stderr));
        let e = text(&o.stderr);
        assert_eq!(e.lines().count(), 1, "{e}");
        e
    };
    for (args, see) in [
        (&["count", "work"][..], "hotprobe count"),
        (&["trace", "--bogus", "f", "--", "true"], "hotprobe trace"),
        (
            &["record", "--sample", "0", "--", "true"],
            "hotprobe record",
        ),
        (&["list", "-p", "1", "a", "b"], "hotprobe list"),
        (&["--color", "never", "replay", "a", "b"], "hotprobe replay"),
        (
            &["count", "--duration", "-1", "f", "--", "true"],
            "hotprobe count",
        ),
        (
            &["guest", "--gdb", "localhost:1", "--symbols", "x", "count"],
            "hotprobe guest count",
        ),
        (&["nosuch"], "hotprobe"),
    ] {
        let e = err(args);
        assert!(e.starts_with("hotprobe: error: "), "{e}");
        assert!(e.contains(&format!("(see {see} --help)")), "{args:?}: {e}");
    }
}

#[test]
fn a_program_without_dashdash_is_named() {
    let prog = many_calls();
    let p = s(&prog);
    let cases: Vec<(Vec<&str>, String, String)> = vec![
        (
            vec!["count", "work", p],
            p.to_string(),
            format!("hotprobe count work -- {p}"),
        ),
        (
            vec!["trace", "--args", "1", "work", "leaf", p, "5"],
            p.to_string(),
            format!("hotprobe trace --args 1 work leaf -- {p} 5"),
        ),
        (
            vec!["count", "work*", "sleep", "1"],
            "sleep".into(),
            "hotprobe count 'work*' -- sleep 1".into(),
        ),
        (
            vec!["record", p, "-x"],
            p.to_string(),
            format!("hotprobe record -- {p} -x"),
        ),
        (
            vec!["count", p],
            p.to_string(),
            format!("hotprobe count PROBE... -- {p}"),
        ),
    ];
    for (args, what, fix) in cases {
        let o = hotprobe(&args);
        let e = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert_eq!(
            e.trim_end(),
            format!(
                "hotprobe: error: `{what}` looks like a program: put `--` before the command ({fix})"
            ),
            "{args:?}"
        );
    }
    // A probe name that is no program: clap's own message.
    let o = hotprobe(&["count", "work", "no_such_program_here"]);
    let e = text(&o.stderr);
    assert!(!e.contains("looks like a program"), "{e}");
    assert!(e.contains("see hotprobe count --help"), "{e}");
}

#[test]
fn pager_and_colours_only_on_terminals() {
    let prog = many_calls();
    let list = format!("{} list {}", quote(HOTPROBE), quote(s(&prog)));
    let pager = [("PAGER", "sed s/^/PAGED:/")];
    // Captured: no pager, no colours.
    let o = hotprobe(&["list", s(&prog)]);
    assert!(o.status.success());
    assert!(!text(&o.stdout).contains('\x1b') && !text(&o.stdout).contains("PAGED"));

    // A terminal: paged, the function names in bold.
    let t = text(&on_terminal(&list, &pager).stdout);
    assert!(t.lines().count() >= 2, "{t}");
    assert!(t.lines().all(|l| l.starts_with("PAGED:")), "{t}");
    assert!(t.contains("\x1b[1mmain\x1b[0m"), "{t:?}");
    // --no-pager, NO_COLOR, --color never.
    let t = text(&on_terminal(&format!("{list} --no-pager"), &pager).stdout);
    assert!(!t.contains("PAGED") && t.contains('\x1b'), "{t:?}");
    let t = text(&on_terminal(&list, &[pager[0], ("NO_COLOR", "1")]).stdout);
    assert!(t.contains("PAGED") && !t.contains('\x1b'), "{t:?}");
    let t = text(&on_terminal(&format!("{list} --color never"), &pager).stdout);
    assert!(t.contains("PAGED") && !t.contains('\x1b'), "{t:?}");
    // PAGER=cat (or empty): none.
    let t = text(&on_terminal(&list, &[("PAGER", "cat")]).stdout);
    assert!(t.contains("main") && !t.contains("PAGED"), "{t:?}");
    // --color always into a pipe.
    let o = hotprobe(&["--color", "always", "list", s(&prog)]);
    assert!(text(&o.stdout).contains("\x1b[1mmain\x1b[0m"));

    // The error prefix: red on a terminal, plain when captured.
    let o = on_terminal(&format!("{} report /nonexistent", quote(HOTPROBE)), &pager);
    assert_eq!(o.status.code(), Some(1));
    let t = text(&o.stdout);
    assert!(
        t.contains("\x1b[1;31mhotprobe: error:\x1b[0m cannot read"),
        "{t:?}"
    );
    let o = hotprobe(&["report", "/nonexistent"]);
    assert!(text(&o.stderr).starts_with("hotprobe: error: cannot read"));
}

#[test]
fn the_live_trace_is_not_paged() {
    let prog = many_calls();
    let o = on_terminal(
        &format!("{} trace work -- {} 3", quote(HOTPROBE), quote(s(&prog))),
        &[("PAGER", "sed s/^/PAGED:/")],
    );
    let t = text(&o.stdout);
    assert!(o.status.success(), "{t}");
    assert!(
        t.contains("\x1b[1mwork\x1b[0m(") && t.contains("done 3"),
        "{t:?}"
    );
    assert!(!t.contains("PAGED"), "{t}");
}

/// `CMD | head -1` through bash: (hotprobe's exit status, its stderr).
fn into_head(cmd: &str) -> (i32, String) {
    let script = format!("{cmd} 2>err.txt | head -1 >/dev/null; exit ${{PIPESTATUS[0]}}");
    let dir = tmp("head");
    let o = Command::new("bash")
        .args(["-c", &script])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = std::fs::read_to_string(dir.join("err.txt")).unwrap_or_default();
    (o.status.code().unwrap_or(-1), err)
}

#[test]
fn a_reader_going_away_ends_the_output_quietly() {
    let h = quote(HOTPROBE);
    // The C library's functions: more lines than a pipe holds.
    let libc = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("a libc.so.6");
    for cmd in [
        format!("{h} list {libc}"),
        format!("{h} --color always list {libc}"),
    ] {
        let (code, err) = into_head(&cmd);
        assert!(!err.contains("panicked"), "{cmd}: {err}");
        assert_eq!((code, err.as_str()), (0, ""), "{cmd}");
    }
    let prog = many_calls();
    let dir = tmp("pipe-trace").join("t");
    let o = hotprobe(&["record", "-o", s(&dir), "--", s(&prog), "20000"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    for what in ["replay", "report", "export --format chrome"] {
        let cmd = format!("{h} {what} {}", quote(s(&dir)));
        let (code, err) = into_head(&cmd);
        assert!(!err.contains("panicked"), "{cmd}: {err}");
        assert_eq!((code, err.as_str()), (0, ""), "{cmd}");
    }
    // The live trace: the program runs to its end, hotprobe detaches.
    let cmd = format!("{h} trace leaf -- {} 2000", quote(s(&prog)));
    let (code, err) = into_head(&cmd);
    assert!(!err.contains("panicked"), "{cmd}: {err}");
    assert_eq!(code, 0, "{cmd}: {err}");
    assert!(err.contains("exited with code 0"), "{err}");
}
