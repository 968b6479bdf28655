//! Recorded functions with hooked returns on per-site stubs, where the
//! stub's return hook (the agent's assembly) declines and the generic path
//! takes over: a recursion past the shadow stack's 4,096 entries, a tail
//! call into a probed function (its return address already swapped), and
//! a longjmp out of probed frames (dead frames popped at the next entry).
//! tests/programs/hooked_returns.c counts its own calls; `report` must
//! give the same counts, no exit missing but the returns past the shadow
//! stack's capacity, each of those reported as lost, and the program's
//! output must be its own. Built as jump sites (plain `-O2`) and as patch
//! sites (`-fpatchable-function-entry`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;
use common::{drops, gcc, hotprobe_within, printed, text};

const LIMIT: Duration = Duration::from_secs(120);
/// Entries of a thread's shadow stack (the agent's `SHADOW_CAP`).
const SHADOW_CAP: u64 = 4096;
/// How deep the program's first recursion goes, and its rounds.
const DEEP: u64 = 5000;
const ROUNDS: u64 = 100;

fn build(tag: &str, flags: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/hooked_returns.c");
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hooked-returns");
    std::fs::create_dir_all(&dir).unwrap();
    gcc(&src, &dir.join(format!("hooked_returns-{tag}")), flags)
}

/// Calls and exits missing per function, from `report`'s table.
fn report(trace: &Path) -> BTreeMap<String, (u64, u64)> {
    let o = hotprobe_within(&["report", trace.to_str().unwrap()], LIMIT);
    let out = text(&o.stdout);
    assert!(o.status.success(), "{out}{}", text(&o.stderr));
    let header = out
        .lines()
        .find(|l| l.contains("Calls") && l.contains("Function"))
        .unwrap_or_else(|| panic!("no table: {out}"));
    let has_no_exit = header.contains("No exit");
    let mut rows = BTreeMap::new();
    for l in out.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        let n = w.len();
        let Some(calls) = n.checked_sub(2).and_then(|i| w[i].parse::<u64>().ok()) else {
            continue;
        };
        let no_exit = if has_no_exit {
            w[n - 3].parse::<u64>().unwrap_or_else(|_| panic!("{l}"))
        } else {
            0
        };
        rows.insert(w[n - 1].to_string(), (calls, no_exit));
    }
    rows
}

#[test]
fn hooked_returns_declined_by_the_stub_are_taken_by_the_generic_path() {
    let args = [DEEP.to_string(), ROUNDS.to_string()];
    for (tag, flags) in [
        ("jump", &["-O2", "-foptimize-sibling-calls"][..]),
        (
            "patch",
            &[
                "-O2",
                "-foptimize-sibling-calls",
                "-fpatchable-function-entry=5",
            ][..],
        ),
    ] {
        let bin = build(tag, flags);
        let native = Command::new(&bin).args(&args).output().unwrap();
        assert!(native.status.success());
        let native = text(&native.stdout);
        let trace = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("hooked-{tag}.trace"));
        let b = bin.to_str().unwrap();
        let t = trace.to_str().unwrap();
        let o = hotprobe_within(
            &[
                "record", "--force", "-o", t, "depth", "tail_*", "lj_*", "--", b, &args[0],
                &args[1],
            ],
            LIMIT,
        );
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert!(o.status.success(), "{tag}: {err}");
        assert_eq!(out, native, "{tag}: {err}");
        let mechanism = if tag == "jump" { "jump 5" } else { "patch 5" };
        assert!(err.contains(mechanism), "{tag}: {err}");
        // The deepest returns of the first recursion find the shadow stack
        // full: not hooked, each exit counted as lost.
        let unhooked = DEEP + 1 - SHADOW_CAP;
        assert_eq!(drops(&err), unhooked, "{tag}: {err}");
        let rows = report(&trace);
        let want = |name: &str, missing: u64| {
            let calls = printed(&native, &format!("{name}_calls "));
            assert_eq!(
                rows.get(name),
                Some(&(calls, missing)),
                "{tag}: {name}: {rows:?}"
            );
        };
        want("depth", unhooked);
        want("tail_a", 0);
        want("tail_b", 0);
        want("lj_outer", 0);
        want("lj_inner", 0);
        assert_eq!(
            printed(&native, "depth_calls "),
            DEEP + 1 + 4 * ROUNDS,
            "{native}"
        );
    }
}
