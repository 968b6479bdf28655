//! The embedded (release) agent's run-time paths call nothing of libc a
//! probe could be on (issue 22): from every entry a hit, a return, a
//! `SIGTRAP`, a thread's exit or a fork reaches, the only functions of
//! other modules called are `pthread_setspecific` (a thread's
//! registration, made as the agent's own call: its hits are not counted)
//! and `abort` (a return with no shadow entry: the process is lost
//! anyway); the agent's `prctl` adds `__errno_location`. Clocks, futexes,
//! `mmap`, `madvise`, `gettid` are `syscall` instructions.
//!
//! Read from `objdump -d` of the agent `find_agent` hands out: direct
//! calls and jumps are followed through the agent's own functions.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::Command;

/// Function name → its disassembly lines.
fn functions() -> HashMap<String, Vec<String>> {
    let so = hotprobe_fastpath::find_agent().expect("the embedded agent");
    let o = Command::new("objdump")
        .args(["-d", "--no-show-raw-insn", "-M", "intel"])
        .arg(&so)
        .output()
        .expect("objdump runs (binutils)");
    assert!(o.status.success(), "objdump {}", so.display());
    let text = String::from_utf8(o.stdout).unwrap();
    let mut funcs: HashMap<String, Vec<String>> = HashMap::new();
    let mut cur: Option<String> = None;
    for l in text.lines() {
        if let Some(name) = l
            .strip_suffix(">:")
            .and_then(|l| l.split_once(" <"))
            .map(|(_, n)| n.to_string())
        {
            funcs.entry(name.clone()).or_default();
            cur = Some(name);
        } else if let Some(c) = &cur {
            funcs.get_mut(c).unwrap().push(l.to_string());
        }
    }
    funcs
}

/// Every function of other modules reachable from `root` by direct calls
/// and jumps (`name@VERSION` or `name@plt`), with its callers.
fn external_calls(
    funcs: &HashMap<String, Vec<String>>,
    root: &str,
) -> BTreeMap<String, BTreeSet<String>> {
    walk(funcs, root).1
}

/// The agent's functions reachable from `root` (direct calls and jumps),
/// and the functions of other modules they call, with their callers.
#[allow(clippy::type_complexity)]
fn walk(
    funcs: &HashMap<String, Vec<String>>,
    root: &str,
) -> (BTreeSet<String>, BTreeMap<String, BTreeSet<String>>) {
    let start: Vec<&String> = funcs
        .keys()
        .filter(|k| k.contains(root) && !k.contains('@'))
        .collect();
    assert_eq!(start.len(), 1, "one function named like {root}: {start:?}");
    let mut todo = vec![start[0].clone()];
    let mut seen = BTreeSet::new();
    let mut ext: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    while let Some(f) = todo.pop() {
        if !seen.insert(f.clone()) {
            continue;
        }
        for l in &funcs[&f] {
            let w: Vec<&str> = l.split_whitespace().collect();
            if !w.iter().any(|x| *x == "call" || x.starts_with('j')) {
                continue;
            }
            let Some(target) = l
                .rsplit_once('<')
                .and_then(|(_, n)| n.strip_suffix('>'))
                .map(|n| n.split('+').next().unwrap().to_string())
            else {
                continue;
            };
            if target.contains('@') {
                let name = target.split('@').next().unwrap().to_string();
                ext.entry(name).or_default().insert(f.clone());
            } else if funcs.contains_key(&target) && target != f {
                todo.push(target);
            }
        }
    }
    assert!(seen.len() > 1 || root.contains("exit"), "{root}: {seen:?}");
    (seen, ext)
}

/// The trampolines save no vector register on the fast path: nothing a
/// hit or a return reaches may touch one — the clock of a thread under
/// `PR_TSC_SIGSEGV` included (zeroing its timespec compiled to an `xmm`
/// store once). The agent crate's own check of this runs in release
/// builds only; the embedded agent is always the release build.
#[test]
fn the_embedded_agents_fast_path_uses_no_vector_register() {
    let funcs = functions();
    for root in ["hit8fast_hit", "hit7ret_hit"] {
        let (seen, _) = walk(&funcs, root);
        assert!(
            seen.iter().any(|f| f.contains("now_tsc_slow")),
            "{root} reaches the system-call clock: {seen:?}"
        );
        for f in &seen {
            for l in &funcs[f] {
                assert!(
                    !["xmm", "ymm", "zmm"].iter().any(|r| l.contains(r)),
                    "{root} reaches {f}: {l}"
                );
            }
        }
    }
}

#[test]
fn the_agents_run_time_paths_call_no_probeable_libc_function() {
    let funcs = functions();
    let allowed: &[(&str, &[&str])] = &[
        ("hit8fast_hit", &[]),
        ("hit7ret_hit", &["abort"]),
        ("hit8slow_hit", &["pthread_setspecific"]),
        ("inproc11handler_hit", &["pthread_setspecific"]),
        ("orphan10on_sigtrap", &["pthread_setspecific"]),
        ("threads11thread_exit", &[]),
        ("threads16after_fork_child", &[]),
    ];
    for (root, ok) in allowed {
        let ext = external_calls(&funcs, root);
        let names: BTreeSet<&str> = ext.keys().map(String::as_str).collect();
        let ok: BTreeSet<&str> = ok.iter().copied().collect();
        assert!(names.is_subset(&ok), "{root} calls {ext:?}");
        if let Some(callers) = ext.get("pthread_setspecific") {
            // Inlined from `as_own_call` into the registration.
            assert!(
                callers.iter().all(|c| c.contains("register_current")),
                "{root}: pthread_setspecific called from {callers:?}"
            );
        }
    }
    // The exported prctl: the system call, and errno on failure.
    let p = funcs
        .get("prctl")
        .expect("the agent exports prctl (issue 22)");
    let ext: Vec<&String> = p
        .iter()
        .filter(|l| l.contains('@') && l.contains("call"))
        .collect();
    assert!(
        ext.iter().all(|l| l.contains("__errno_location@")),
        "prctl calls {ext:?}"
    );
    assert!(p.iter().any(|l| l.trim_end().ends_with("syscall")));
}
