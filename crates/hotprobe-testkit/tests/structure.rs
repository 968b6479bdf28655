//! The repository's shape: no source file past 800 lines (a ratchet for the
//! files still over it), and every test docs/DESIGN.md names exists.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// The most lines a file under `crates/*/src` may have.
const MAX_LINES: usize = 800;

/// Files still over [`MAX_LINES`], each with its line count when it was
/// listed as a ceiling: a listed file may not grow, and once it is at or
/// under the limit it must come off the list (the list only shrinks).
const OVER_LIMIT: &[(&str, usize)] = &[
    // Sizes when issues 21-23's first work was merged (2026-11-27: the
    // ledger, the signal guards, --no-traps and the OS layer went into
    // these files before they were cut); process/lib.rs, agent/hit.rs and
    // trace/format.rs left the list then, capi/lib.rs and py/lib.rs
    // after them (cut by job).
];

/// Backticked snake_case names in DESIGN.md that are not this project's
/// functions (kernel, libc, QEMU symbols): not checked.
const NOT_OURS: &[&str] = &[
    "process_vm_readv",
    "do_one_initcall",
    "do_initcall_level",
    "run_init_process",
    "set_virtual_clock",
    "qemu_clock_advance_virtual_time",
    "qemu_plugin_update_ns",
    "qemu_plugin_request_time_control",
    "qemu_plugin_register_vcpu_insn_exec_cond_cb",
    "qemu_plugin_read_memory_vaddr",
    // A libc function and a counter field, not tests.
    "pthread_key_create",
    "drops_no_thread",
];

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("crates/hotprobe-testkit has a grandparent")
        .to_path_buf()
}

/// Every file under `dir`, recursively.
fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("a readable directory entry").path();
        if path.is_dir() {
            walk(&path, out);
        } else {
            out.push(path);
        }
    }
}

/// The crates' directories: `crates/*`.
fn crate_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(root.join("crates"))
        .expect("crates/ is readable")
        .map(|e| e.expect("a readable directory entry").path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

fn relative(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .expect("under the root")
        .to_string_lossy()
        .into_owned()
}

#[test]
fn source_files_are_at_most_800_lines_or_listed_and_not_growing() {
    let root = repo_root();
    let mut counts = BTreeMap::new();
    for dir in crate_dirs(&root) {
        let mut files = Vec::new();
        walk(&dir.join("src"), &mut files);
        for file in files {
            let text = fs::read(&file).expect("a readable source file");
            let lines = text.iter().filter(|&&b| b == b'\n').count();
            counts.insert(relative(&root, &file), lines);
        }
    }
    assert!(!counts.is_empty(), "no file found under crates/*/src");

    let listed: BTreeMap<&str, usize> = OVER_LIMIT.iter().copied().collect();
    assert_eq!(listed.len(), OVER_LIMIT.len(), "a file listed twice");
    let mut problems = Vec::new();
    for (path, &lines) in &counts {
        match listed.get(path.as_str()) {
            None if lines > MAX_LINES => problems.push(format!(
                "{path}: {lines} lines, over {MAX_LINES}: split it by job"
            )),
            Some(&ceiling) if lines > ceiling => problems.push(format!(
                "{path}: {lines} lines, grew past its ceiling of {ceiling}: split it by job"
            )),
            Some(_) if lines <= MAX_LINES => problems.push(format!(
                "{path}: {lines} lines, now within {MAX_LINES}: take it off OVER_LIMIT"
            )),
            _ => {}
        }
    }
    for path in listed.keys() {
        if !counts.contains_key(*path) {
            problems.push(format!(
                "{path}: listed in OVER_LIMIT but gone: take it off"
            ));
        }
    }
    assert!(problems.is_empty(), "\n{}", problems.join("\n"));
}

/// Whether `s` is a snake_case identifier of at least three words.
fn is_long_snake(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_lowercase())
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && s.split('_').filter(|w| !w.is_empty()).count() >= 3
}

/// The function names a backticked span of DESIGN.md names, each with
/// whether it is a prefix (the span ends with `…`): `a_b_c`, `a_b_c…`,
/// and `a_b_o0/_o2` (two names, the last word swapped).
fn named_functions(span: &str) -> Vec<(String, bool)> {
    if let Some(prefix) = span.strip_suffix('…') {
        if is_long_snake(prefix) {
            return vec![(prefix.to_string(), true)];
        }
    }
    if let Some((name, suffix)) = span.split_once('/') {
        if is_long_snake(name) && suffix.starts_with('_') && is_long_snake(&format!("a_b{suffix}"))
        {
            let (stem, _) = name.rsplit_once('_').expect("three words");
            return vec![
                (name.to_string(), false),
                (format!("{stem}{suffix}"), false),
            ];
        }
    }
    if is_long_snake(span) {
        return vec![(span.to_string(), false)];
    }
    Vec::new()
}

/// Every `fn NAME` under `crates/*/src` and `crates/*/tests` (and the
/// benches), by name.
fn function_names(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    for dir in crate_dirs(root) {
        walk(&dir.join("src"), &mut files);
        walk(&dir.join("tests"), &mut files);
    }
    walk(&root.join("benches"), &mut files);
    let mut names = Vec::new();
    for file in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
    {
        let text = fs::read_to_string(file).expect("a readable source file");
        for (at, _) in text.match_indices("fn ") {
            let before = text[..at].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
                continue;
            }
            let name: String = text[at + 3..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                names.push(name);
            }
        }
    }
    names
}

#[test]
fn every_test_design_md_names_exists() {
    let root = repo_root();
    let design = fs::read_to_string(root.join("docs/DESIGN.md")).expect("docs/DESIGN.md");
    let functions = function_names(&root);
    let mut missing = Vec::new();

    // Backticked snake_case names of three words or more: this project's
    // functions (its tests among them), unless known to be someone else's.
    for (i, span) in design.split('`').enumerate() {
        if i % 2 == 0 || span.starts_with('_') || NOT_OURS.contains(&span) {
            continue;
        }
        for (name, prefix) in named_functions(span) {
            let found = if prefix {
                functions.iter().any(|f| f.starts_with(&name))
            } else {
                functions.contains(&name)
            };
            if !found {
                missing.push(format!("`{span}`: no `fn {name}` in the tree"));
            }
        }
    }

    // Test files: `--test NAME` and `tests/NAME.rs` (a crate's, or the path
    // given in full).
    let test_files: Vec<String> = crate_dirs(&root)
        .iter()
        .flat_map(|dir| {
            let mut files = Vec::new();
            walk(&dir.join("tests"), &mut files);
            files
        })
        .map(|f| relative(&root, &f))
        .collect();
    let words: Vec<&str> = design
        .split(|c: char| c.is_whitespace() || c == '`')
        .collect();
    for (i, word) in words.iter().enumerate() {
        let word = word
            .trim_start_matches('(')
            .trim_end_matches(['.', ',', ';', ':', ')']);
        if word == "--test" {
            if let Some(name) = words.get(i + 1) {
                let name = name.trim_end_matches(['.', ',', ';', ':', ')']);
                let file = format!("/tests/{name}.rs");
                if !test_files.iter().any(|f| f.ends_with(&file)) {
                    missing.push(format!("`--test {name}`: no tests/{name}.rs in a crate"));
                }
            }
        } else if word.ends_with(".rs") && word.contains("tests/") {
            let found = if word.starts_with("crates/") {
                root.join(word).is_file()
            } else {
                test_files.iter().any(|f| f.ends_with(&format!("/{word}")))
            };
            if !found {
                missing.push(format!("{word}: no such test file"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "docs/DESIGN.md names tests that do not exist:\n{}",
        missing.join("\n")
    );
}

/// Where `downcast` may stand under crates/*/src, and why: a panic's
/// payload (`Box<dyn Any>`: std gives nothing else) and the kind of an
/// `anyhow` error in the CLI. Never a target or a mechanism (issue 21:
/// optional abilities are typed accessors).
const DOWNCASTS: &[(&str, &str)] = &[
    ("crates/hotprobe-capi/src/error.rs", "a panic's payload"),
    ("crates/hotprobe-fuzzcheck/src/lib.rs", "a panic's payload"),
    (
        "crates/hotprobe-process/src/wait_tests.rs",
        "a panic's payload (a unit test)",
    ),
    ("crates/hotprobe-cli/src/demo.rs", "an anyhow error's kind"),
    ("crates/hotprobe-cli/src/out.rs", "an anyhow error's kind"),
    ("crates/hotprobe-cli/src/main.rs", "an anyhow error's kind"),
];

#[test]
fn no_target_or_mechanism_is_reached_by_a_downcast() {
    let root = repo_root();
    let mut files = Vec::new();
    for dir in crate_dirs(&root) {
        walk(&dir.join("src"), &mut files);
    }
    let mut found = Vec::new();
    for f in files
        .iter()
        .filter(|f| f.extension().is_some_and(|e| e == "rs"))
    {
        let rel = relative(&root, f);
        let text = fs::read_to_string(f).unwrap_or_default();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if code.contains("as_any") {
                found.push(format!("{rel}:{}: as_any", i + 1));
            }
            if code.contains("downcast") && !DOWNCASTS.iter().any(|(p, _)| *p == rel) {
                found.push(format!("{rel}:{}: downcast", i + 1));
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// Where the OS layer's system calls may be made directly: the OS layer
/// itself, and the two crates that cannot link std (the in-target agent
/// and the QEMU plugin keep libc-only copies). Issue 21: ptrace and wait,
/// shared memory and futex are each written once.
const OS_CALLS_ALLOWED: &[&str] = &[
    "crates/hotprobe-os/",
    "crates/hotprobe-agent/",
    "crates/hotprobe-qemu-plugin/",
];

/// The calls of the OS layer, made through a crate path (`libc::waitpid(`,
/// `use libc::{ptrace, …}`, `rustix::fs::memfd_create`, …).
const OS_CALLS: &[&str] = &[
    "ptrace",
    "waitpid",
    "process_vm_readv",
    "process_vm_writev",
    "memfd_create",
];

/// The same as raw system call numbers (`syscall(libc::SYS_futex, …)`).
const OS_SYSCALL_NUMBERS: &[&str] = &[
    "SYS_futex",
    "SYS_ptrace",
    "SYS_wait4",
    "SYS_process_vm_readv",
    "SYS_process_vm_writev",
    "SYS_memfd_create",
];

/// The crates whose paths make a raw call.
const SYSCALL_CRATES: &[&str] = &["libc", "nix", "rustix"];

/// Whether the `r` at `i` continues an identifier (`for`, `r#ident`
/// aside): not a raw string's prefix. `br"…"` and `cr"…"` are raw strings.
fn code_char_before(c: &[char], i: usize) -> bool {
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    match i.checked_sub(1).map(|j| c[j]) {
        Some('b') | Some('c') => i >= 2 && ident(c[i - 2]),
        Some(ch) => ident(ch),
        None => false,
    }
}

/// `text` with its comments removed and the insides of its string and
/// character literals blanked (newlines kept, so line numbers hold): what
/// is left is code.
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < c.len() {
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if c[i] == 'r'
            && matches!(c.get(i + 1), Some('"') | Some('#'))
            && !code_char_before(&c, i)
        {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while c.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            out.push('"');
            j += 1;
            loop {
                if j >= c.len() {
                    break;
                }
                if c[j] == '"' && (1..=hashes).all(|k| c.get(j + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break;
                }
                out.push(blank(c[j]));
                j += 1;
            }
            out.push('"');
            i = j;
        } else if c[i] == '"' {
            out.push('"');
            i += 1;
            while i < c.len() && c[i] != '"' {
                if c[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < c.len() {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
        } else if c[i] == '\'' && c.get(i + 1) == Some(&'\\') {
            // '\n', '\'', '\u{…}': the escaped character is skipped.
            out.push('\'');
            i += 3;
            while i < c.len() && c[i] != '\'' {
                i += 1;
            }
            out.push('\'');
            i += 1;
        } else if c[i] == '\'' && c.get(i + 2) == Some(&'\'') {
            out.push_str("' '");
            i += 3;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// Whether `code[at..]`, the identifier `name`, is reached through a path
/// rooted at one of [`SYSCALL_CRATES`] (`libc::name`, `nix::a::b::name`).
fn through_syscall_crate(code: &str, at: usize) -> bool {
    let mut head = code[..at].trim_end();
    while let Some(rest) = head.strip_suffix("::") {
        let rest = rest.trim_end();
        let seg_start = rest
            .rfind(|ch: char| !(ch.is_ascii_alphanumeric() || ch == '_'))
            .map_or(0, |p| p + 1);
        let seg = &rest[seg_start..];
        if SYSCALL_CRATES.contains(&seg) {
            return true;
        }
        if seg.is_empty() {
            return false;
        }
        head = rest[..seg_start].trim_end();
    }
    false
}

/// Where `name` stands in `code` as a whole identifier.
fn identifier_at(code: &str, name: &str) -> Vec<usize> {
    code.match_indices(name)
        .filter(|(at, _)| {
            let before = code[..*at].chars().next_back();
            let after = code[at + name.len()..].chars().next();
            let ident =
                |ch: Option<char>| ch.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
            !ident(before) && !ident(after)
        })
        .map(|(at, _)| at)
        .collect()
}

/// The OS layer's calls made in `text` (a source file's), as `line: what`.
fn os_calls_in(text: &str) -> Vec<String> {
    let code = code_only(text);
    let line_of = |at: usize| code[..at].matches('\n').count() + 1;
    let mut found = Vec::new();
    for name in OS_CALLS {
        for at in identifier_at(&code, name) {
            let line_start = code[..at].rfind('\n').map_or(0, |p| p + 1);
            let line = code[line_start..].lines().next().unwrap_or("").trim_start();
            let in_use = (line.starts_with("use ") || line.starts_with("pub use "))
                && SYSCALL_CRATES.iter().any(|c| {
                    line.contains(&format!("use {c}::")) || line.contains(&format!(" {c}::"))
                });
            if through_syscall_crate(&code, at) || in_use {
                found.push(format!("{}: {name}", line_of(at)));
            }
        }
    }
    for name in OS_SYSCALL_NUMBERS {
        for at in identifier_at(&code, name) {
            found.push(format!("{}: {name}", line_of(at)));
        }
    }
    found.sort_by_key(|f| f.split(':').next().and_then(|n| n.parse::<usize>().ok()));
    found
}

#[test]
fn the_scan_for_os_calls_finds_calls_and_skips_comments_and_strings() {
    let sample = r##"
        // libc::waitpid(pid, null, 0) in a comment
        /* libc::ptrace(...) /* nested */ SYS_futex */
        let s = "libc::memfd_create(name, 0) and SYS_futex";
        let r = r#"libc::waitpid("x")"#;
        let q = '"'; let l: &'static str = ""; let e = '\''; let n = '\n';
        let a = unsafe { libc::waitpid(pid, &mut st, 0) };
        self.sys.waitpid(pid, 0);
        hotprobe::os::sys::waitpid(pid, 0);
        let b = unsafe { libc::syscall(libc::SYS_futex, w, op) };
        use libc::{c_int, ptrace};
        let c = rustix::fs::memfd_create("n", flags);
        let d = nix :: sys :: ptrace :: attach(pid);
        let e = my_waitpid(pid);
        let f = unsafe { libc::memfd_create(c"hotprobe".as_ptr(), 0) };
        let g = "\"libc::waitpid(\"";
    "##;
    assert_eq!(
        os_calls_in(sample),
        [
            "7: waitpid",
            "10: SYS_futex",
            "11: ptrace",
            "12: memfd_create",
            "13: ptrace",
            "15: memfd_create"
        ]
    );
}

#[test]
fn no_ptrace_wait_memfd_or_futex_call_outside_the_os_layer() {
    let root = repo_root();
    let mut found = Vec::new();
    for dir in crate_dirs(&root) {
        let mut files = Vec::new();
        walk(&dir.join("src"), &mut files);
        for f in files
            .iter()
            .filter(|f| f.extension().is_some_and(|e| e == "rs"))
        {
            let rel = relative(&root, f);
            if OS_CALLS_ALLOWED.iter().any(|p| rel.starts_with(p)) {
                continue;
            }
            let text = fs::read_to_string(f).expect("a readable source file");
            found.extend(os_calls_in(&text).into_iter().map(|l| format!("{rel}:{l}")));
        }
    }
    assert!(
        found.is_empty(),
        "system calls of the OS layer made outside it (use hotprobe-os):\n{}",
        found.join("\n")
    );
}

/// The CLI only parses and prints: among the project's crates it depends
/// on the `hotprobe` facade alone (its tests may use others, the testkit
/// first), as `cargo metadata` sees the manifests.
#[test]
fn the_cli_depends_on_the_facade_alone() {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(repo_root())
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("its JSON");
    let cli = meta["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == "hotprobe-cli")
        .expect("hotprobe-cli is a workspace member");
    let deps = cli["dependencies"].as_array().expect("dependencies");
    let ours: Vec<(&str, &str)> = deps
        .iter()
        .filter(|d| d["path"].is_string())
        .map(|d| {
            (
                d["name"].as_str().unwrap_or("?"),
                d["kind"].as_str().unwrap_or("normal"),
            )
        })
        .collect();
    let not_dev: Vec<&str> = ours
        .iter()
        .filter(|(_, kind)| *kind != "dev")
        .map(|(name, _)| *name)
        .collect();
    assert_eq!(not_dev, ["hotprobe"], "hotprobe-cli's path dependencies");
    // The check sees path dependencies at all (the dev ones are there).
    assert!(ours.contains(&("hotprobe-testkit", "dev")), "{ours:?}");
}
