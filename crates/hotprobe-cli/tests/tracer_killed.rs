//! Issue 22 item 3 and issue 21 item 2: `hotprobe` killed with SIGKILL
//! while it arms, runs or detaches leaves the program running its original
//! code. The fast path mirrors every site it writes in the shared memory's
//! code ledger; the agent hears of the tracer's death (its hang-up pipe)
//! and puts every published site back, int3 first.
//!
//! A C program generated here with a few thousand functions (half with a
//! `-fpatchable-function-entry` placeholder: patch sites; half without:
//! jump sites, some with `int3` padding) calls all of them in rounds and
//! prints each round's running checksum. `hotprobe count -p PID 'f_*'`
//! probes every function; it is killed at a moment drawn from a seed the
//! test prints (`HOTPROBE_KILL_SEED` repeats it): once the first sites are
//! in the code, the threads still stopped (arming), after a seeded number
//! of rounds with the probes in (running), or a seeded delay after Ctrl-C
//! or once the detach restored the code (detach). Every run must hold: the agent's ledger ends with no site
//! published, the program's executable mappings equal the file byte for
//! byte, and the program, told to stop, prints the checksum of every round
//! it ran and exits with its own status (7).
//!
//! Attached processes only: a program `hotprobe` spawned dies with it
//! while traced (`PTRACE_O_EXITKILL`, by design); one running untraced
//! (every probe on the fast path) outlives it, as an attached one does
//! (trace_loss_cli's killed record). A kill while a remote system call
//! borrows a thread's registers is hotprobe-process's remote_killed test;
//! not covered: one during the remote function calls of the agent's
//! injection (docs/DESIGN.md, "Remote system calls and a tracer's death").

use hotprobe_testkit::GroupKilled;
use hotprobe_testkit::Killed;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

mod common;
use common::{gcc, line_reader, HOTPROBE};
use hotprobe_testkit::text_differences;

use hotprobe::fastpath::{ledger_state, UndoState};

/// Functions of the generated program.
const FUNCTIONS: u64 = 3000;
/// Runs per phase.
const RUNS: usize = 10;
/// The longest any wait here may take; longer is a hang.
const LIMIT: Duration = Duration::from_secs(30);

/// `f_i(x)` of the generated program.
fn f(i: u64, x: i64) -> i64 {
    x.wrapping_mul(3)
        .wrapping_add(i as i64)
        .wrapping_sub(x >> 2)
}

/// The program: `ready PID`, then rounds of calls of every function,
/// each round's line `round R sum S`, until a line on stdin; then
/// `done R rounds sum S`, exit status 7.
fn source() -> String {
    let mut s = String::from("#include <poll.h>\n#include <stdio.h>\n#include <unistd.h>\n\n");
    for i in 0..FUNCTIONS {
        let attr = if i % 2 == 1 {
            "__attribute__((noinline, patchable_function_entry(5, 0)))"
        } else {
            "__attribute__((noinline))"
        };
        s += &format!("{attr} long f_{i}(long x) {{ return x * 3 + {i} - (x >> 2); }}\n");
    }
    s += "static long (*const table[])(long) = {\n";
    for i in 0..FUNCTIONS {
        s += &format!("    f_{i},\n");
    }
    s += &format!(
        r#"}};

int main(void) {{
    printf("ready %d\n", getpid());
    fflush(stdout);
    unsigned long sum = 0;
    long rounds = 0;
    for (;;) {{
        for (long i = 0; i < {FUNCTIONS}; i++)
            sum += (unsigned long)(table[i](rounds + i) & 0xffff);
        rounds++;
        printf("round %ld sum %lu\n", rounds, sum);
        fflush(stdout);
        struct pollfd p = {{ 0, POLLIN, 0 }};
        if (poll(&p, 1, 1) > 0)
            break;
    }}
    printf("done %ld rounds sum %lu\n", rounds, sum);
    return 7;
}}
"#
    );
    s
}

fn program() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tracer-killed");
    let src = hotprobe_testkit::write_source(&dir, "many.c", &source());
    gcc(&src, &dir.join("many"), &["-O1"])
}

/// A small seeded PRNG (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Fails, saying how, when `child` (the program) ended: what these tests
/// catch is a program killed around the tracer's death, and the memory of
/// an ended process cannot be read (`/proc/PID/mem` gives ESRCH once it is
/// a zombie, even to root), so this comes before every read of it.
/// `what` gives the context (the kill moment, what hotprobe said).
fn assert_running(child: &mut Child, what: impl FnOnce() -> String) {
    if let Some(status) = child.try_wait().unwrap() {
        panic!("{}: the program ended: {status:?}", what());
    }
}

/// The program's code bytes that differ from the file
/// ([`text_differences`]); a program that ended meanwhile fails the test
/// with its wait status, which names the signal that ended it, if one did.
fn code_differences(
    child: &mut Child,
    prog: &Path,
    what: impl FnOnce() -> String,
) -> Vec<(u64, u8, u8)> {
    let pid = child.id();
    if std::fs::File::open(format!("/proc/{pid}/mem")).is_err() {
        let status = child.wait().unwrap();
        panic!("{}: the program ended: {status:?}", what());
    }
    text_differences(pid, prog)
}

/// Where a kill is aimed.
#[derive(Clone, Copy, Debug)]
enum Phase {
    Arming,
    Running,
    Detach,
}

/// The lines of the program, checked as they come: consecutive rounds,
/// each with the checksum the functions' original code gives.
struct Rounds {
    rounds: i64,
    sum: u64,
    done: Option<String>,
}

impl Rounds {
    fn take(&mut self, line: &str, ctx: &str) {
        if let Some(rest) = line.strip_prefix("round ") {
            let (r, s) = rest
                .split_once(" sum ")
                .unwrap_or_else(|| panic!("{ctx}: line {line:?}"));
            for i in 0..FUNCTIONS {
                self.sum = self
                    .sum
                    .wrapping_add((f(i, self.rounds + i as i64) & 0xffff) as u64);
            }
            self.rounds += 1;
            assert_eq!(
                (r.parse::<i64>().unwrap(), s.parse::<u64>().unwrap()),
                (self.rounds, self.sum),
                "{ctx}: round line {line:?}: not what the program's own code computes"
            );
        } else if line.starts_with("done ") {
            self.done = Some(line.to_string());
        } else {
            panic!("{ctx}: unexpected line {line:?}");
        }
    }
}

/// One run: the program started, `hotprobe count -p` on it, killed where
/// `phase` says, then everything checked.
fn run(prog: &Path, phase: Phase, rng: &mut Rng, ctx: &str) -> String {
    let mut target = Killed(
        Command::new(prog)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let lines = line_reader(target.0.stdout.take().unwrap());
    let ready = lines.recv_timeout(LIMIT).expect("the program's first line");
    let pid: u32 = ready
        .strip_prefix("ready ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{ctx}: {ready:?}"));
    assert_eq!(pid, target.0.id());
    let mut rounds = Rounds {
        rounds: 0,
        sum: 0,
        done: None,
    };
    use std::os::unix::process::CommandExt;
    let mut hp = Command::new(HOTPROBE)
        .args(["count", "-p", &pid.to_string(), "f_*"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let _group = GroupKilled(hp.id() as i32);
    let errs = line_reader(hp.stderr.take().unwrap());
    let mut said: Vec<String> = Vec::new();
    let attached = |said: &[String]| said.iter().any(|l| l.contains("attached to pid"));
    // Takes whatever the two processes printed; true once hotprobe said
    // it is attached.
    let pump = |lines: &Receiver<String>, said: &mut Vec<String>, rounds: &mut Rounds| {
        while let Ok(l) = errs.try_recv() {
            said.push(l);
        }
        while let Ok(l) = lines.try_recv() {
            rounds.take(&l, ctx);
        }
        attached(said)
    };
    let deadline = Instant::now() + LIMIT;
    let moment = match phase {
        Phase::Arming => {
            // Killed once the first sites are in the code: the batch
            // written or being written, the threads still stopped,
            // "attached" not said yet; the moment within the batch's
            // writes is the poll's (a seeded number of extra polls).
            let extra = rng.next() % 4;
            let mut polls = 0;
            loop {
                assert_running(&mut target.0, || format!("{ctx} (arming): {said:?}"));
                let published = ledger_state(pid).unwrap().map_or(0, |s| s.published);
                if published > 0
                    && !code_differences(&mut target.0, prog, || format!("{ctx} (arming)"))
                        .is_empty()
                {
                    polls += 1;
                    if polls > extra {
                        break format!("{published} sites published and written ({extra} polls)");
                    }
                }
                if pump(&lines, &mut said, &mut rounds) {
                    break format!("{published} sites published, arming over");
                }
                assert!(Instant::now() < deadline, "{ctx}: no arming: {said:?}");
                std::thread::yield_now();
            }
        }
        Phase::Running => {
            while !pump(&lines, &mut said, &mut rounds) {
                // hotprobe's next line (or its end, which fails here).
                match errs.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(l) => said.push(l),
                    Err(e) => panic!("{ctx}: not attached ({e}): {said:?}"),
                }
            }
            // A seeded number of rounds with the probes in.
            let n = 1 + rng.next() % 5;
            let from = rounds.rounds;
            while rounds.rounds < from + n as i64 {
                let l = lines.recv_timeout(LIMIT).expect("a round");
                rounds.take(&l, ctx);
            }
            format!("{n} rounds after the probes went in")
        }
        Phase::Detach => {
            while !pump(&lines, &mut said, &mut rounds) {
                // hotprobe's next line (or its end, which fails here).
                match errs.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                    Ok(l) => said.push(l),
                    Err(e) => panic!("{ctx}: not attached ({e}): {said:?}"),
                }
            }
            let l = lines.recv_timeout(LIMIT).expect("a round");
            rounds.take(&l, ctx);
            // SAFETY: a plain syscall on the child this test started.
            unsafe { libc::kill(hp.id() as i32, libc::SIGINT) };
            if rng.next().is_multiple_of(2) {
                // The kill moment: a seeded delay into the detach.
                let delay = Duration::from_micros(rng.next() % 3_000);
                let until = Instant::now() + delay;
                while let Some(left) = until.checked_duration_since(Instant::now()) {
                    if let Ok(l) = errs.recv_timeout(left) {
                        said.push(l);
                    }
                }
                format!("{delay:?} after Ctrl-C")
            } else {
                // The kill moment: the code restored by the detach (its
                // sites still in the ledger, or just taken out).
                loop {
                    assert_running(&mut target.0, || format!("{ctx} (detach): {said:?}"));
                    let diffs = code_differences(&mut target.0, prog, || {
                        format!("{ctx} (detach): {said:?}")
                    });
                    if diffs.is_empty() {
                        break;
                    }
                    assert!(Instant::now() < deadline, "{ctx}: no detach: {said:?}");
                }
                let left = ledger_state(pid).unwrap().map_or(0, |s| s.published);
                format!("once the code was restored ({left} sites still published)")
            }
        }
    };
    // SAFETY: a plain syscall on the child this test started.
    unsafe { libc::kill(hp.id() as i32, libc::SIGKILL) };
    hp.wait().unwrap();
    while let Ok(l) = errs.try_recv() {
        said.push(l);
    }
    // The agent puts every published site back: none left published, and
    // the program's code is the file's again.
    let deadline = Instant::now() + LIMIT;
    let state = loop {
        assert_running(&mut target.0, || {
            format!("{ctx} (killed {moment}): hotprobe said {said:?}")
        });
        let state = ledger_state(pid).unwrap();
        let settled = state.is_none_or(|s| s.published == 0 && s.undo != UndoState::Running);
        if settled {
            let diffs = code_differences(&mut target.0, prog, || {
                format!("{ctx} (killed {moment}): hotprobe said {said:?}")
            });
            if diffs.is_empty() {
                break state;
            }
            assert!(
                Instant::now() < deadline,
                "{ctx} (killed {moment}): {} bytes of the program's code differ from the \
                 file, the first {:x?}; ledger {state:?}; hotprobe said {said:?}",
                diffs.len(),
                &diffs[..diffs.len().min(8)]
            );
        }
        assert!(
            Instant::now() < deadline,
            "{ctx} (killed {moment}): sites still published: {state:?}; hotprobe said {said:?}"
        );
        if let Ok(l) = lines.recv_timeout(Duration::from_millis(5)) {
            rounds.take(&l, ctx);
        }
    };
    assert!(
        target.0.try_wait().unwrap().is_none(),
        "{ctx} (killed {moment}): the program ended: {:?}; hotprobe said {said:?}",
        target.0.try_wait()
    );
    // Told to stop, it ends with its own output and status.
    let mut stdin = target.0.stdin.take().unwrap();
    stdin.write_all(b"q\n").unwrap();
    drop(stdin);
    for l in lines.iter() {
        rounds.take(&l, ctx);
    }
    let status = target.0.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(7),
        "{ctx} (killed {moment}): {status:?}; hotprobe said {said:?}"
    );
    assert_eq!(
        rounds.done.as_deref(),
        Some(format!("done {} rounds sum {}", rounds.rounds, rounds.sum).as_str()),
        "{ctx} (killed {moment})"
    );
    format!(
        "{ctx}: killed {moment}; {}; {} rounds checked; undo {:?}",
        if attached(&said) {
            "after 'attached'"
        } else {
            "before 'attached'"
        },
        rounds.rounds,
        state
    )
}

#[test]
fn hotprobe_killed_while_arming_running_or_detaching_leaves_the_programs_code_as_it_was() {
    let seed: u64 = std::env::var("HOTPROBE_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        });
    eprintln!("kill moments from seed {seed} (HOTPROBE_KILL_SEED={seed} repeats them)");
    let mut rng = Rng(seed);
    let prog = program();
    for phase in [Phase::Arming, Phase::Running, Phase::Detach] {
        for n in 0..RUNS {
            let ctx = format!("seed {seed}, {phase:?} run {n}");
            eprintln!("{}", run(&prog, phase, &mut rng, &ctx));
        }
    }
}

mod sigtrap_own_support;

/// The seed of a test's kill moments (`HOTPROBE_KILL_SEED` repeats it).
fn kill_seed() -> u64 {
    std::env::var("HOTPROBE_KILL_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                | 1
        })
}

/// `hotprobe count -p PID --mechanism trap probed` on `own`, until it
/// says it is attached: the running hotprobe, its process group and what
/// it said.
/// `count -p PID --mechanism trap probed`, its stderr read until a line
/// holds `until`: (hotprobe, its process group, the lines read).
fn attach_trap(pid: u32, ctx: &str, until: &str) -> (Child, GroupKilled, Vec<String>) {
    use std::os::unix::process::CommandExt;
    let mut hp = Command::new(HOTPROBE)
        .args([
            "count",
            "-p",
            &pid.to_string(),
            "--mechanism",
            "trap",
            "probed",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .unwrap();
    let group = GroupKilled(hp.id() as i32);
    let errs = line_reader(hp.stderr.take().unwrap());
    let mut said = Vec::new();
    let deadline = Instant::now() + LIMIT;
    while !said.iter().any(|l: &String| l.contains(until)) {
        match errs.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            Ok(l) => said.push(l),
            Err(e) => panic!("{ctx}: no line with {until:?} ({e}): {said:?}"),
        }
    }
    (hp, group, said)
}

/// Issue 22: with the ptrace trap, the process layer puts an `int3` on
/// each of libc's `rt_sigaction`/`rt_sigprocmask` system calls (its
/// signal-state sites, `hotprobe-process`'s `sigtrap.rs`). A hotprobe
/// killed with SIGKILL while attached left them in: the program's next
/// `sigaction` or `sigprocmask` died (SIGSEGV: the agent put the site's
/// first byte back under the trap mechanism's guard, and `0f cc` ran as
/// `bswap esp`). Now the injected agent puts them back with the rest when
/// it hears of the death: libc's code in memory equals the file again at
/// every site, and the program, asked for 1,000 rounds of `sigprocmask`
/// and `sigaction` calls, more probed calls and a `SIGTRAP` of its own
/// (which its own handler takes), prints its own lines and exits with its
/// own status. Its own `sigaction(SIGTRAP)` reads back the action it set
/// before, during and after (the agent's handler stays the disposition,
/// threads may still trap on what the tracer left, but the program's
/// `sigaction` is the agent's, bound into its GOT). 10 runs, with a seeded
/// number of rounds while attached.
///
/// Not covered: a thread that blocks `SIGTRAP` (the hang-up's `SIGTRAP`
/// stays pending there, and a site's trap resets the agent's handler: the
/// program dies of it).
#[test]
fn a_killed_tracer_leaves_libcs_signal_state_calls_as_they_were() {
    use sigtrap_own_support::{build, mapped_file, signal_state_sites, Own};
    let seed = kill_seed();
    eprintln!("kill moments from seed {seed} (HOTPROBE_KILL_SEED={seed} repeats them)");
    let mut rng = Rng(seed);
    let bin = build(false);
    for run in 0..RUNS {
        let ctx = format!("seed {seed}, run {run}");
        let mut p = Own::start(&bin, &[]);
        assert_eq!(p.ask("raise"), "raised handled=1", "{ctx}");
        let view = p.ask("report");
        assert!(view.starts_with("handler=on_trap "), "{ctx}: {view}");
        let libc = mapped_file(p.pid, "libc.so.6").expect("libc mapped");
        let sites = signal_state_sites(p.pid, &libc);
        assert!(!sites.is_empty(), "{ctx}: no signal-state call in {libc:?}");
        let (mut hp, _group, said) = attach_trap(p.pid, &ctx, "attached to pid");
        // The sites are in (with the trap mechanism's guards one byte in).
        let armed = text_differences(p.pid, &libc);
        assert!(
            sites
                .iter()
                .any(|s| armed.iter().any(|d| d.0 == *s && d.1 == 0xcc)),
            "{ctx}: no site armed: {armed:x?}; hotprobe said {said:?}"
        );
        assert!(
            armed
                .iter()
                .all(|d| sites.contains(&d.0) || sites.contains(&(d.0 - 1))),
            "{ctx}: libc changed elsewhere than at its sites: {armed:x?}"
        );
        assert_eq!(p.ask("report"), view, "{ctx}: attached");
        let mut calls = 0;
        for _ in 0..rng.next() % 4 {
            assert_eq!(p.ask("call 50"), "called 50", "{ctx}");
            assert_eq!(p.ask("sig 20"), "sig 20: 0", "{ctx}");
            calls += 50;
        }
        hp.kill().unwrap();
        hp.wait().unwrap();
        // The agent's undo, heard through its hang-up pipe.
        let deadline = Instant::now() + LIMIT;
        loop {
            assert_running(&mut p.child, || format!("{ctx}: after the kill"));
            let left = text_differences(p.pid, &libc);
            if left.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{ctx}: {} bytes of libc still differ from the file after the kill, the \
                 first {:x?}",
                left.len(),
                &left[..left.len().min(8)]
            );
            std::thread::yield_now();
        }
        assert_eq!(p.ask("sig 1000"), "sig 1000: 0", "{ctx}");
        assert_eq!(p.ask("call 100"), "called 100", "{ctx}");
        assert_eq!(p.ask("raise"), "raised handled=2", "{ctx}");
        assert_eq!(
            p.ask("report"),
            view.replace("handled=1 usr1_inside=1", "handled=2 usr1_inside=1"),
            "{ctx}: after the kill"
        );
        calls += 100;
        // Each site holds the file's bytes (and the probe's int3 went at
        // its first hit: the program's code is the file's too).
        let mut file = std::fs::File::open(&libc).unwrap();
        for &s in &sites {
            use std::io::{Read, Seek, SeekFrom};
            let off = common::file_offset_of(p.pid, s);
            let mut want = [0u8; 2];
            file.seek(SeekFrom::Start(off)).unwrap();
            file.read_exact(&mut want).unwrap();
            assert_eq!(
                common::memory_at(p.pid, s, 2),
                want,
                "{ctx}: the site at {s:#x}"
            );
        }
        assert_eq!(text_differences(p.pid, &bin), vec![], "{ctx}");
        let (last, status) = p.quit();
        assert_eq!(last, format!("done calls={calls}"), "{ctx}");
        assert_eq!(status, Some(5), "{ctx}");
    }
}

/// Where no agent is in the process (a static program), nothing puts the
/// int3s back after a kill: what stays is counted here — every
/// signal-state site of the program's own code (its libc is linked in)
/// and the probe, each with the trap mechanism's guard where it has one —
/// and nothing else. hotprobe says so when it starts ("a hotprobe killed
/// with SIGKILL would leave its int3s in the program", `no_agent.rs`),
/// before any kill.
#[test]
fn without_an_agent_a_killed_tracer_leaves_exactly_its_int3s() {
    use sigtrap_own_support::{build, signal_state_sites, Own};
    let bin = build(true);
    let mut p = Own::start(&bin, &[]);
    let sites = signal_state_sites(p.pid, &bin);
    assert!(!sites.is_empty(), "no signal-state call in {bin:?}");
    // Said before the kill: at the start, not with the summary.
    let (mut hp, _group, said) = attach_trap(
        p.pid,
        "static",
        "a hotprobe killed with SIGKILL would leave its int3s in the program",
    );
    hp.kill().unwrap();
    hp.wait().unwrap();
    assert_running(&mut p.child, || format!("static: after the kill: {said:?}"));
    assert!(!p.has_agent(), "{said:?}");
    let left = text_differences(p.pid, &bin);
    let probe = {
        let nm = Command::new("nm").arg(&bin).output().unwrap();
        let text = String::from_utf8(nm.stdout).unwrap();
        let a = text
            .lines()
            .find_map(|l| l.strip_suffix(" T probed"))
            .expect("probed in nm");
        u64::from_str_radix(a, 16).unwrap()
    };
    let armed: Vec<u64> = left
        .iter()
        .map(|d| d.0)
        .filter(|a| sites.contains(a))
        .collect();
    assert_eq!(armed, sites, "every site stays armed: {left:x?}");
    assert!(
        left.iter().any(|d| d.0 == probe),
        "the probe's int3: {left:x?}"
    );
    assert!(
        left.iter().all(|d| d.1 == 0xcc
            && (sites.contains(&d.0)
                || sites.contains(&(d.0 - 1))
                || d.0 == probe
                || d.0 == probe + 1)),
        "int3s elsewhere: {left:x?}"
    );
    eprintln!(
        "static program after the kill: {} int3s left ({} signal-state sites, the probe, guards)",
        left.len(),
        sites.len()
    );
}
