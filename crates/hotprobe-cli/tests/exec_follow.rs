//! Issue 24, "-f follows exec": the probes are placed again in each
//! program a followed process executes, a row per (pid, image) with the
//! command name; `--no-follow-exec` keeps the old behaviour.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, text, CountTable, HOTPROBE};

/// `leafn` (calls `leafwork` N times) built into a directory of this
/// test's, which is returned.
fn leafn_dir(tag: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("exec-follow-{tag}"));
    std::fs::create_dir_all(&dir).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/leafn.c");
    gcc(&src, &dir.join("leafn"), &["-O1"]);
    dir
}

/// `hotprobe ARGS` run in `dir`.
fn hotprobe_in(dir: &Path, args: &[&str]) -> std::process::Output {
    let mut c = Command::new(HOTPROBE);
    c.args(args).current_dir(dir);
    common::output_within(c, Duration::from_secs(60))
}

const SCRIPT: &str = "./leafn 3; ./leafn 5; exit 7";
const OUTPUT: &str = "leafn 3 sum 10\nleafn 5 sum 35\n";

/// The `(pid, comm, hits)` of each row of `probe`.
fn rows(t: &CountTable, probe: &str) -> Vec<(String, String, u64)> {
    let (p, c, h) = (t.col("PID"), t.col("COMM"), t.col("HITS"));
    t.rows_of(probe)
        .into_iter()
        .map(|r| (r[p].clone(), r[c].clone(), r[h].parse().unwrap()))
        .collect()
}

#[test]
fn count_follows_exec_with_a_row_per_process_and_program() {
    let dir = leafn_dir("count");
    // dash vforks its commands, bash forks them: both are followed.
    for sh in ["sh", "bash"] {
        let o = hotprobe_in(&dir, &["count", "-f", "leafwork", "--", sh, "-c", SCRIPT]);
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert_eq!(o.status.code(), Some(7), "{sh}: the script's status\n{err}");
        assert!(
            out.starts_with(OUTPUT),
            "{sh}: the program's output:\n{out}\n{err}"
        );
        let t = CountTable::parse(&out, &err);
        let got = rows(&t, "leafwork");
        assert_eq!(got.len(), 2, "{sh}: a row per leafn:\n{}", t.all);
        let hits: Vec<u64> = got.iter().map(|r| r.2).collect();
        assert_eq!(hits, [3, 5], "{sh}:\n{}", t.all);
        assert!(got.iter().all(|r| r.1 == "leafn"), "{sh}: COMM:\n{}", t.all);
        assert_ne!(got[0].0, got[1].0, "{sh}: two processes:\n{}", t.all);
        for (pid, _, _) in &got {
            assert!(
                err.contains(&format!(
                    "pid {pid} executed {}",
                    dir.join("leafn").display()
                )),
                "{sh}: the exec of {pid} said:\n{err}"
            );
        }
    }
}

#[test]
fn no_follow_exec_keeps_the_probes_to_the_first_program() {
    let dir = leafn_dir("nofollow");
    let o = hotprobe_in(
        &dir,
        &[
            "count",
            "-f",
            "--no-follow-exec",
            "leafwork",
            "--",
            "sh",
            "-c",
            SCRIPT,
        ],
    );
    let err = text(&o.stderr);
    // As before exec was followed: the spec names nothing in sh.
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("function `leafwork` not found in dash"),
        "the refusal:\n{err}"
    );
    assert!(!text(&o.stdout).contains("leafwork"), "no row");
    // --no-follow-exec is -f's.
    let o = hotprobe_within(
        &["count", "--no-follow-exec", "leafwork", "--", "true"],
        Duration::from_secs(20),
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o.stderr));
}

#[test]
fn record_follows_exec_with_the_pid_and_comm_of_each_process() {
    let dir = leafn_dir("record");
    let trace = dir.join("trace");
    let t = trace.to_str().unwrap();
    let o = hotprobe_in(
        &dir,
        &[
            "record", "--force", "-o", t, "-f", "leafwork", "--", "sh", "-c", SCRIPT,
        ],
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(7), "{err}");
    assert_eq!(text(&o.stdout), OUTPUT, "{err}");
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(trace.join("info.json")).unwrap()).unwrap();
    let procs = info["processes"]
        .as_array()
        .expect("processes in info.json");
    assert_eq!(procs.len(), 2, "{info}");
    let pids: Vec<u64> = procs.iter().map(|p| p["pid"].as_u64().unwrap()).collect();
    for p in procs {
        assert_eq!(p["comm"], "leafn", "{info}");
        assert_eq!(p["program"], dir.join("leafn").to_str().unwrap(), "{info}");
    }
    // Each process's calls, under its pid (single-threaded: its tid).
    let replay = text(&hotprobe_within(&["replay", t], Duration::from_secs(20)).stdout);
    let calls = common::call_tree(&replay);
    for (pid, n) in pids.iter().zip([3, 5]) {
        let mine = calls
            .iter()
            .filter(|(tid, _, name)| u64::from(*tid) == *pid && name == "leafwork")
            .count();
        assert_eq!(mine, n, "pid {pid}:\n{replay}");
    }
    let shown = text(&hotprobe_within(&["info", t], Duration::from_secs(20)).stdout);
    for pid in &pids {
        assert!(
            shown.contains(&format!(
                "pid {pid} leafn ({})",
                dir.join("leafn").display()
            )),
            "info names pid {pid} and its comm:\n{shown}"
        );
    }
}
