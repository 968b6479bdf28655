//! bpftrace's uprobe counts of a deterministic workload, to compare with
//! hotprobe's counts of a separate run of the same workload.
//!
//! bpftrace's uprobes are the kernel's: while it runs, an `int3` sits on
//! every probed function of *every* process mapping the file, the
//! hotprobe targets of the tests running beside it included. An `int3`
//! written over the first byte of a hotprobe jump makes the kernel run
//! the file's original first instruction and resume in the middle of
//! the jump (a SIGSEGV in `__strlen_evex` of the sqlite3 shell, about 1
//! run in 8 of probe_everything.rs). Two tools patching one instruction
//! is a conflict hotprobe detects but cannot undo (docs/DESIGN.md, "Code
//! shared with other tools"), so a bpftrace run holds [`KERNEL_UPROBES`]
//! exclusively and every hotprobe run shares it ([`no_kernel_uprobes`]).
//! The lock is the test binary's: its tests are threads of one process
//! under `cargo test` (as scripts/test.sh runs them, one binary at a
//! time), not under a runner that starts a process per test.

use super::text;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::Duration;

/// The longest a bpftrace run may take.
const LIMIT: Duration = Duration::from_secs(300);

/// Held exclusively while bpftrace's uprobes are in, shared by every
/// hotprobe run (see the module's documentation).
static KERNEL_UPROBES: RwLock<()> = RwLock::new(());

/// Held around a hotprobe run: no bpftrace run is beside it.
pub fn no_kernel_uprobes() -> RwLockReadGuard<'static, ()> {
    KERNEL_UPROBES.read().unwrap_or_else(|e| e.into_inner())
}

/// Held around a bpftrace run: no hotprobe run is beside it.
fn kernel_uprobes() -> RwLockWriteGuard<'static, ()> {
    KERNEL_UPROBES.write().unwrap_or_else(|e| e.into_inner())
}

/// bpftrace's counts of uprobes on `functions` of `lib`, for the process
/// it starts with `cmd` only (`/pid == cpid/`), with `env` and stdin
/// closed, after checking the program's output (printed before the maps)
/// is `expected`. bpftrace 0.17's `-c` splits the command on spaces: no
/// word of `cmd` may hold one. The command's environment is `env` added
/// to the test's, as in a hotprobe run of it (`BPFTRACE_MAX_PROBES` is
/// set only for more probes than bpftrace's default 512: the program
/// sees it, and some count their environment, python3's `PyDict_SetDefault`
/// for one). Panics when
/// bpftrace is missing or does not run (scripts/setup.sh installs it; it
/// needs root): never a silent skip.
pub fn counts(
    lib: &Path,
    functions: &[String],
    cmd: &[&str],
    env: &[(&str, &str)],
    expected: &str,
) -> BTreeMap<String, u64> {
    assert!(
        !cmd.iter().any(|w| w.contains(char::is_whitespace)),
        "bpftrace -c splits on spaces: {cmd:?}"
    );
    let probes: Vec<String> = functions
        .iter()
        .map(|f| format!("uprobe:{}:{f}", lib.display()))
        .collect();
    let prog = format!(
        "{} /pid == cpid/ {{ @[probe] = count(); }} END {{ printf(\"--counts--\\n\"); }}",
        probes.join(",")
    );
    let mut c = Command::new("bpftrace");
    c.args(["-e", &prog, "-c", &cmd.join(" ")])
        .envs(env.iter().copied());
    if probes.len() > 512 {
        c.env("BPFTRACE_MAX_PROBES", "4096");
    }
    let out = {
        let _alone = kernel_uprobes();
        super::output_within(c, LIMIT)
    };
    let stdout = text(&out.stdout);
    let (prog_out, counts) = stdout.split_once("--counts--\n").unwrap_or_else(|| {
        panic!(
            "bpftrace did not run (installed by scripts/setup.sh; needs root): {:?}\n{}\n{}",
            out.status,
            stdout,
            text(&out.stderr)
        )
    });
    // bpftrace prints `Attaching N probes...` first and a blank line
    // after the program's output.
    let prog_out = match prog_out.split_once('\n') {
        Some((first, rest)) if first.starts_with("Attaching ") => rest,
        _ => prog_out,
    };
    assert!(
        prog_out.trim_end() == expected.trim_end(),
        "the program's output under bpftrace differs from its own ({} bytes, {} expected)",
        prog_out.len(),
        expected.len()
    );
    let mut m: BTreeMap<String, u64> = functions.iter().map(|f| (f.clone(), 0)).collect();
    for l in counts.lines() {
        // @[uprobe:/usr/lib/x86_64-linux-gnu/libc.so.6:malloc]: 1135
        let Some((k, v)) = l.strip_prefix("@[").and_then(|l| l.split_once("]: ")) else {
            continue;
        };
        let f = k.rsplit(':').next().unwrap().to_string();
        m.insert(f, v.trim().parse().unwrap());
    }
    m
}
