//! Issue 22, signal state round 2: small alternate signal stacks (an
//! in-process trap hit inside an `SA_ONSTACK` handler) and signal state
//! changed by raw system calls. Each program runs as it does alone (its
//! output and exit status) and every call is counted, or the probe is
//! placed on the ptrace trap with the reason.

use std::path::{Path, PathBuf};
use std::time::Duration;

mod common;
use common::{gcc, hotprobe_within, program_output, text, CountTable};
mod record_support;
use record_support::{info, record, trace_dir, Info};

#[path = "../../hotprobe/tests/nonlocal_support/mod.rs"]
mod nonlocal_support;
use nonlocal_support::{field, native_output};

const LIMIT: Duration = Duration::from_secs(120);

/// The agent's `AGENT_FRAME` (crates/hotprobe-agent/src/altstack.rs): the
/// stack its `SIGTRAP` handler may use beyond a trivial handler's.
const AGENT_FRAME: u64 = 4096;

fn program(name: &str) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/programs/{name}.c"));
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("signal-state2");
    std::fs::create_dir_all(&dir).unwrap();
    gcc(&src, &dir.join(name), &["-O1"])
}

/// `hotprobe count PROBE -- BIN ARGS`: the program's output (hotprobe and
/// the program succeeded) and the table.
fn count(probe: &str, bin: &Path, args: &[&str]) -> (String, CountTable) {
    let mut a = vec!["count", probe, "--", bin.to_str().unwrap()];
    a.extend_from_slice(args);
    let out = hotprobe_within(&a, LIMIT);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{args:?}: {stdout}\n{stderr}");
    assert!(stderr.contains("exited with code 0"), "{args:?}: {stderr}");
    (
        program_output(&stdout).to_string(),
        CountTable::parse(&stdout, &stderr),
    )
}

#[test]
fn an_in_process_trap_hit_on_a_small_alternate_stack_is_counted_and_recorded() {
    let bin = program("altstack");
    for size in ["4096", "6000"] {
        let args = ["onstack", size];
        let want = native_output(&bin, &args);
        assert_eq!(field(&want, "handler"), 1000, "{want}");
        assert_eq!(field(&want, "shown"), 1, "{want}");
        let (got, t) = count("tiny", &bin, &args);
        assert_eq!(got, want, "{}", t.all);
        assert_eq!(t.execution("tiny"), "in-process", "{}", t.all);
        assert_eq!(
            (t.hits("tiny"), t.row("tiny")[t.col("NMISSED")].as_str()),
            (2000, "0"),
            "{}",
            t.all
        );
        // Recorded: the return hooked inside the handler too.
        let dir = trace_dir(&format!("altstack-{size}"));
        let (out, _) = record(
            &dir,
            &["tiny"],
            &[bin.to_str().unwrap(), "onstack", size],
            LIMIT,
        );
        assert_eq!(out, want);
        assert_eq!(
            info(&dir, LIMIT),
            Info {
                calls: 2000,
                records: 2000,
                lost: 0
            }
        );
    }
}

/// The agent's room on an alternate stack is measured, not guessed: a
/// program paints its stack and finds how deep a hit writes, against a
/// signal with a trivial handler.
#[test]
fn the_agent_handler_uses_no_more_stack_than_it_reserves() {
    let bin = program("altstack");
    let native = native_output(&bin, &["depth"]);
    assert_eq!(field(&native, "probed"), 0, "{native}");
    let (got, t) = count("tiny", &bin, &["depth"]);
    assert_eq!(t.hits("tiny"), 1, "{}", t.all);
    let extra = field(&got, "probed").saturating_sub(field(&got, "trivial"));
    assert!(extra > 0 && extra <= AGENT_FRAME, "{got}");
    // Recording, with the thread's first hit (its registration) inside.
    let dir = trace_dir("altstack-depth");
    let (got, _) = record(&dir, &["tiny"], &[bin.to_str().unwrap(), "depth"], LIMIT);
    let extra = field(&got, "probed").saturating_sub(field(&got, "trivial"));
    assert!(extra > 0 && extra <= AGENT_FRAME, "{got}");
}
