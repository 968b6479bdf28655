//! Issue 22: a reader that goes away (`hotprobe trace -p PID | head`)
//! ends the session: hotprobe detaches at once instead of holding a live
//! server until it exits, says why, and leaves the server running its
//! own code.

use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};
use std::time::Duration;

mod common;
use common::{MixServer, HOTPROBE};

#[test]
fn a_reader_that_goes_away_detaches_hotprobe_from_a_live_server() {
    let mut server = MixServer::start();
    let pid = server.pid().to_string();
    let mut trace = Command::new(HOTPROBE)
        .args(["trace", "-p", &pid, "mix"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read the tree's first lines, as `head -3` would, then go away.
    let mut out = BufReader::new(trace.stdout.take().unwrap());
    let mut first = String::new();
    for _ in 0..3 {
        assert!(out.read_line(&mut first).unwrap() > 0, "{first}");
    }
    assert!(first.contains("mix()"), "{first}");
    drop(out);
    // hotprobe ends by itself while the server runs on (a hang would
    // last as long as the server: the limit is generous, no timing).
    let mut err_pipe = trace.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(trace.wait());
    });
    let status = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("hotprobe still attached after the reader went away")
        .unwrap();
    let mut err = String::new();
    err_pipe.read_to_string(&mut err).unwrap();
    assert_eq!(status.code(), Some(0), "{err}");
    assert!(
        err.contains(&format!(
            "hotprobe: the output's reader went away: detached from pid {pid}, which runs on \
             with its code restored"
        )),
        "{err}"
    );
    assert!(
        server.child.try_wait().unwrap().is_none(),
        "the server died"
    );
    // Detached: no tracer holds it.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    assert!(status.contains("TracerPid:\t0\n"), "{status}");
}
