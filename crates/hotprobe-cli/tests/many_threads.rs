//! `count -p` on a server of 2,000 threads while other threads are made
//! and end all the time (tests/programs/many_threads.c): hotprobe attaches,
//! counts exactly the calls the program says it made while attached,
//! detaches with the text as in the file and the process untraced, and
//! the program runs on to its usual end. Before, most runs failed: the
//! agent's remote `dlopen` waited 10 s for a loader lock a stopped
//! churner held, and the call given up left the lock held (the program
//! hung; now the other threads run while a remote call is blocked,
//! `remote_call.rs`); and a thread whose exit an earlier drain had
//! reaped stayed "running" after `stop_all`, failing detach with "thread
//! N is not a stopped thread". Seizing every task, at attach and when a
//! released process is taken back, skips a thread that ends or that a
//! just-seized thread made (`ProcessTarget::seize_tasks`).

use hotprobe_testkit::Killed;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::Duration;

mod common;
use common::attached::{hotprobe_mappings, CountAttached};
use common::{gcc, line_reader, CountTable};

const LIMIT: Duration = Duration::from_secs(120);
/// Worker threads, each calling `work` 10 times a round.
const THREADS: u64 = 2000;
/// Threads that make and join 4 short threads at a time, all the time.
const CHURNERS: u64 = 4;

/// The sum of `work`'s results in a round of `calls` calls: the workers'
/// (`work(id + i)` = 3 (id + i) + 1, id < THREADS, i < 10), and 145 for
/// each churn thread (`work(i)`, i < 10) that called it.
fn round_sum(calls: u64) -> u64 {
    let workers = 30 * THREADS * (THREADS - 1) / 2 + 145 * THREADS;
    let churned = (calls - 10 * THREADS) / 10;
    workers + 145 * churned
}

/// Sends "go" and takes the round's line: its calls, checked against its
/// sum (every call's result as without hotprobe).
fn round(stdin: &mut std::process::ChildStdin, out: &Receiver<String>, what: &str) -> u64 {
    writeln!(stdin, "go").unwrap();
    stdin.flush().unwrap();
    let line = out.recv_timeout(LIMIT).expect("the round's line");
    let f: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(f.len(), 7, "{what}: {line}");
    assert_eq!(
        f[..3],
        ["round:", "workers", &THREADS.to_string()],
        "{line}"
    );
    let (calls, sum): (u64, u64) = (f[4].parse().unwrap(), f[6].parse().unwrap());
    assert!(calls >= 10 * THREADS && calls % 10 == 0, "{what}: {line}");
    assert_eq!(sum, round_sum(calls), "{what}: {line}");
    calls
}

/// The tasks of `pid` a tracer holds (`TracerPid` not 0). A thread that
/// ends while the list is read is skipped (common::untraced takes its
/// unreadable status for a traced task: churn threads end all the time).
fn traced_tasks(pid: u32) -> Vec<String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).unwrap();
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| {
            let status = std::fs::read_to_string(t.path().join("status")).ok()?;
            let tracer = status.lines().find(|l| l.starts_with("TracerPid:"))?;
            (tracer.split_whitespace().nth(1) != Some("0"))
                .then(|| format!("{}: {tracer}", t.file_name().to_string_lossy()))
        })
        .collect()
}

#[test]
fn count_p_on_two_thousand_threads_under_churn_counts_exactly_and_detaches() {
    let src =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/programs/many_threads.c");
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("many-threads");
    let bin = gcc(&src, &dir.join("many_threads"), &["-O2", "-pthread"]);
    let mut prog = Killed(
        Command::new(&bin)
            .args([THREADS.to_string(), CHURNERS.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = prog.0.id();
    let mut stdin = prog.0.stdin.take().unwrap();
    let out = line_reader(prog.0.stdout.take().unwrap());
    assert_eq!(out.recv_timeout(LIMIT).unwrap(), format!("ready {pid}"));
    round(&mut stdin, &out, "before attach");

    let session = CountAttached::start(pid, &["work"], LIMIT);
    let first = session.first.clone();
    assert!(
        first.starts_with(&format!("hotprobe: attached to pid {pid}")),
        "{first}\n{:?}",
        session.said_so_far()
    );
    // Every call of this round is made while the probes are in: it starts
    // after hotprobe said so, and hotprobe is stopped after its line.
    let calls = round(&mut stdin, &out, "attached");
    let (status, stdout, stderr) = session.interrupt();
    assert!(status.success(), "hotprobe: {status}\n{stdout}\n{stderr}");
    let t = CountTable::parse(&stdout, &stderr);
    assert_eq!(t.hits("work"), calls, "{stdout}\n{stderr}");

    // Detached: untraced, nothing of hotprobe's mapped (the agent
    // unloaded), its text as in the file, and it runs on.
    assert_eq!(traced_tasks(pid), Vec::<String>::new(), "after the detach");
    assert_eq!(
        hotprobe_mappings(pid),
        Vec::<String>::new(),
        "left mapped after the detach:\n{stderr}"
    );
    assert_eq!(hotprobe_testkit::text_differences(pid, &bin), vec![]);
    round(&mut stdin, &out, "after detach");
    drop(stdin);
    let last = out.recv_timeout(LIMIT).expect("the program's last line");
    let end = prog.0.wait().unwrap();
    assert!(end.success(), "the program ended with {end}: {last}");
    assert_eq!(last, format!("threads {THREADS} rounds 3 churned>0 1"));
}
