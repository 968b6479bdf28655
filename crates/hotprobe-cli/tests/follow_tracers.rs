//! Issue 22: `-f` never kills a process it follows. A program that runs
//! tracers of its own on its children (hotprobe itself, strace) keeps its
//! output and its exit status under `hotprobe count -f` and `record -f`.

use std::path::PathBuf;
use std::time::Duration;

mod common;
use common::{hotprobe_within, mix_program, text, HOTPROBE};

#[test]
fn a_followed_program_running_tracers_of_its_own_keeps_its_output_and_status() {
    let mix = mix_program();
    let m = mix.to_str().unwrap();
    let script = format!(
        "{HOTPROBE} count mix -- {m} 3 >/dev/null 2>&1; echo inner=$?; \
         strace -o /dev/null {m} 2; echo strace=$?; exit 5"
    );
    let want = "inner=0\nargc=2\niterations=2 sum=3\nstrace=0\n";
    let native = std::process::Command::new("sh")
        .args(["-c", &script])
        .output()
        .unwrap();
    assert_eq!(native.status.code(), Some(5));
    assert_eq!(text(&native.stdout), want);
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("follow-tracers");
    let _ = std::fs::remove_dir_all(&dir);
    let trace = dir.join("t");
    for args in [
        vec!["count", "-f", "libc.so.6:getpid"],
        vec!["count", "-f", "--mechanism", "trap", "libc.so.6:getpid"],
        vec![
            "record",
            "-f",
            "-o",
            trace.to_str().unwrap(),
            "libc.so.6:getpid",
        ],
    ] {
        let mut all = args.clone();
        all.extend(["--", "sh", "-c", &script]);
        let out = hotprobe_within(&all, Duration::from_secs(120));
        let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
        assert_eq!(out.status.code(), Some(5), "{args:?}\n{stdout}\n{stderr}");
        assert!(stdout.starts_with(want), "{args:?}\n{stdout}\n{stderr}");
    }
}
