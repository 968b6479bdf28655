//! `count -p` on a plugin-loading server (tests/programs/plugin_loader.c:
//! threads that `dlopen`, call and `dlclose` a plugin without end), over
//! several attach and detach cycles: each attach gets its probes in,
//! counts exactly the calls the program made while attached, and each
//! detach leaves the process untraced, its text as in the file and
//! nothing of hotprobe's mapped; the program runs on to its usual end.
//!
//! Before, the agent's injection and unload ran with the other threads
//! stopped, and a loader thread stopped inside its own `dlopen` holds the
//! loader's lock: the injection's `dlsym` waited for it for good (`count
//! -p` hung), and the unload's `dlclose` gave up after 10 s, leaving the
//! agent in. A loader thread that reached the loader's rendezvous
//! breakpoint while let run stopped there holding the lock. Now a blocked
//! remote call lets the others run, the rendezvous `int3` lifted
//! meanwhile (`hotprobe-process` `lend.rs`). And an attach that found a
//! loader thread inside its `dlopen` put the probe on a trap (no agent
//! while the loader is busy, 2 attaches in 20); now the threads run until
//! the loader is done, and the agent goes in.

use hotprobe_testkit::Killed;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

mod common;
use common::attached::{hotprobe_mappings, CountAttached};
use common::{gcc, line_reader, CountTable};

const LIMIT: Duration = Duration::from_secs(60);
/// Threads loading the plugin all the time.
const LOADERS: &str = "2";
/// Attach and detach cycles.
const CYCLES: usize = 5;
/// `work`'s calls in a round, and the sum of their results (3 i + 1).
const ROUND: u64 = 100_000;
const ROUND_SUM: u64 = 3 * (ROUND * (ROUND - 1) / 2) + ROUND;

/// Sends a line and checks the round's line (every call's result as
/// without hotprobe).
fn round(stdin: &mut std::process::ChildStdin, out: &Receiver<String>, what: &str) {
    writeln!(stdin, "go").unwrap();
    stdin.flush().unwrap();
    let line = out.recv_timeout(LIMIT).expect("the round's line");
    assert_eq!(
        line,
        format!("round: calls {ROUND} sum {ROUND_SUM}"),
        "{what}"
    );
}

#[test]
fn count_p_on_a_plugin_loading_server_attaches_counts_and_detaches_every_time() {
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("plugin-loader");
    let programs = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs");
    let plugin = gcc(
        &programs.join("plugin_lib.c"),
        &dir.join("libplugin.so"),
        &["-O2", "-shared", "-fPIC"],
    );
    let bin = gcc(
        &programs.join("plugin_loader.c"),
        &dir.join("plugin_loader"),
        &["-O2", "-pthread"],
    );
    let mut prog = Killed(
        Command::new(&bin)
            .args([plugin.to_str().unwrap(), LOADERS])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = prog.0.id();
    let mut stdin = prog.0.stdin.take().unwrap();
    let out = line_reader(prog.0.stdout.take().unwrap());
    assert_eq!(out.recv_timeout(LIMIT).unwrap(), format!("ready {pid}"));
    round(&mut stdin, &out, "before attach");
    for cycle in 0..CYCLES {
        let what = format!("cycle {cycle}");
        let session = CountAttached::start(pid, &["work"], LIMIT);
        let first = session.first.clone();
        // The agent in, its jump placed: a loader thread inside its own
        // `dlopen` at the attach is let run to its end first (a trap
        // otherwise, "the agent could not be loaded yet").
        assert_eq!(
            first,
            format!("hotprobe: attached to pid {pid}: 1 probes (jump 1)"),
            "{what}: {:?}",
            session.said_so_far()
        );
        // The round starts after hotprobe said its probes are in, and
        // hotprobe is stopped after the round's line.
        round(&mut stdin, &out, &what);
        let (status, stdout, stderr) = session.interrupt();
        assert!(
            status.success(),
            "{what}: hotprobe {status}\n{stdout}\n{stderr}"
        );
        let t = CountTable::parse(&stdout, &stderr);
        assert_eq!(t.hits("work"), ROUND, "{what}:\n{stdout}\n{stderr}");
        assert!(
            !stderr.contains("stays") && !stderr.contains("could not be loaded:"),
            "{what}: {stderr}"
        );
        assert!(
            common::untraced(pid),
            "{what}: still traced after the detach"
        );
        assert_eq!(
            hotprobe_mappings(pid),
            Vec::<String>::new(),
            "{what}: left mapped\n{stderr}"
        );
        assert_eq!(
            hotprobe_testkit::text_differences(pid, &bin),
            vec![],
            "{what}"
        );
    }
    round(&mut stdin, &out, "after the last detach");
    drop(stdin);
    let last = out.recv_timeout(LIMIT).expect("the program's last line");
    let end = prog.0.wait().unwrap();
    assert!(end.success(), "the program ended with {end}: {last}");
    assert_eq!(last, "loads>0 1 bad 0");
}
