//! `hotprobe-bench inproc`: per hit, in one run, on a 2-byte function
//! (`benches/programs/inproc.c`): an in-process trap counting; a
//! shared-memory pre handler (spinning, then sleeping); the ptrace trap
//! counting (boosted) and with a pre handler (boosted); a kernel uprobe
//! (bpftrace `count()`); `Record` through the in-process trap (entry and
//! exit events from the agent's `SIGTRAP` handler); and, on a function a
//! jump fits (`five`), the shared-memory pre handler through the jump
//! site's handler trampoline (no signal: spinning, then sleeping) beside a
//! jump counting.

use anyhow::{bail, Result};
use hotprobe::{Action, MechanismChoice, Probe, RunEnd, Session, SessionConfig, SpawnOptions};
use std::path::Path;
use std::time::Duration;

use crate::{build, have, loop_ns, median, pin};

/// How the probe on `two` is placed.
#[derive(Clone, Copy)]
enum Kind {
    InprocCount,
    ShmHandler {
        spin: Duration,
    },
    TrapCount,
    TrapHandler,
    InprocRecord,
    /// On `five`: a jump counting.
    JumpCount,
    /// On `five`: a pre handler through the jump site's trampoline.
    StubHandler {
        spin: Duration,
    },
}

impl Kind {
    fn on_five(self) -> bool {
        matches!(self, Kind::JumpCount | Kind::StubHandler { .. })
    }
}

/// Counts the recorded events.
#[derive(Default)]
struct Tally(u64);

impl hotprobe::EventSink for Tally {
    fn event(&mut self, _ev: &hotprobe::RecordedEvent) -> Result<(), hotprobe::SinkError> {
        self.0 += 1;
        Ok(())
    }
    fn lost(&mut self, _tid: u32, _ts: u64, count: u64) -> Result<(), hotprobe::SinkError> {
        Err(hotprobe::SinkError(format!("{count} events lost").into()))
    }
}

fn run_one(bin: &Path, n: u64, kind: Kind) -> Result<(f64, String)> {
    let out = std::env::temp_dir().join(format!("hotprobe-bench-inproc-{}", std::process::id()));
    let f = std::fs::File::create(&out)?;
    let mechanism = match kind {
        Kind::TrapCount => MechanismChoice::Trap,
        _ => MechanismChoice::Auto,
    };
    let mut s = Session::with_config(SessionConfig {
        mechanism,
        ..Default::default()
    });
    let mut args: Vec<std::ffi::OsString> = vec![n.to_string().into()];
    if kind.on_five() {
        args.push("jump".into());
    }
    let t = s.spawn_with(
        bin,
        &args,
        &SpawnOptions {
            stdout: Some(f),
            ..Default::default()
        },
    )?;
    let (id, exec) = match kind {
        Kind::InprocCount | Kind::TrapCount => {
            let a = s.add(t, "two", Action::Count)?;
            (a.placements[0].id, a.placements[0].execution.clone())
        }
        Kind::ShmHandler { spin } => {
            s.set_handler_spin(spin);
            let a = s.add(t, "two", Action::Handler(Probe::new().pre(|_| {})))?;
            (a.placements[0].id, a.placements[0].execution.clone())
        }
        Kind::InprocRecord => {
            let a = s.add(t, "two", Action::Record)?;
            (a.placements[0].id, a.placements[0].execution.clone())
        }
        Kind::JumpCount => {
            let a = s.add(t, "five", Action::Count)?;
            (a.placements[0].id, a.placements[0].execution.clone())
        }
        Kind::StubHandler { spin } => {
            s.set_handler_spin(spin);
            let a = s.add(t, "five", Action::Handler(Probe::new().pre(|_| {})))?;
            (a.placements[0].id, a.placements[0].execution.clone())
        }
        Kind::TrapHandler => {
            let id = s.probe(t, "two", Probe::new().pre(|_| {}))?;
            (id, format!("trap ({})", s.execution_of(id).unwrap_or("?")))
        }
    };
    s.start()?;
    let stops = s.ptrace_stops(t).unwrap_or(0);
    let mut tally = Tally::default();
    let sink: Option<&mut dyn hotprobe::EventSink> = match kind {
        Kind::InprocRecord => Some(&mut tally),
        _ => None,
    };
    if s.run_with(&std::sync::atomic::AtomicBool::new(false), sink)? != RunEnd::AllExited {
        bail!("run ended early");
    }
    if matches!(kind, Kind::InprocRecord) && tally.0 != 2 * n {
        bail!("expected {} events, saw {}", 2 * n, tally.0);
    }
    let during = s.ptrace_stops(t).unwrap_or(0) - stops;
    let hits = s.stats(id).map(|st| st.hits).unwrap_or(0);
    if hits != n {
        bail!("expected {n} hits, saw {hits}");
    }
    let text = std::fs::read_to_string(&out)?;
    let _ = std::fs::remove_file(&out);
    Ok((loop_ns(&text)?, format!("{exec}; {during} ptrace stops")))
}

fn run_native(bin: &Path, n: u64, mode: &str) -> Result<f64> {
    let out = std::process::Command::new(bin)
        .arg(n.to_string())
        .arg(mode)
        .output()?;
    loop_ns(&String::from_utf8_lossy(&out.stdout))
}

fn run_bpftrace(bin: &Path, n: u64) -> Result<f64> {
    let prog = format!("uprobe:{}:two {{ @hits = count(); }}", bin.display());
    let out = std::process::Command::new("bpftrace")
        .arg("-e")
        .arg(&prog)
        .arg("-c")
        .arg(format!("{} {n}", bin.display()))
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !text.contains(&format!("@hits: {n}")) {
        bail!(
            "bpftrace did not count {n} hits: {}",
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .next()
                .unwrap_or("")
        );
    }
    loop_ns(&text)
}

/// The `inproc` benchmark (see the module docs).
pub fn run(cpu: Option<usize>, hits: u64, runs: usize) -> Result<()> {
    if let Some(c) = cpu {
        pin(c)?;
    }
    let bin = build("inproc", &["-O2"])?;
    let native = median(
        (0..runs)
            .map(|_| run_native(&bin, 100_000_000, "call"))
            .collect::<Result<_>>()?,
    );
    let floor_n = hits * 5;
    let floor = median(
        (0..runs)
            .map(|_| run_native(&bin, floor_n, "floor"))
            .collect::<Result<_>>()?,
    );
    eprintln!("int3 + own SIGTRAP handler: {floor:.0} ns/hit");
    let mut rows: Vec<(String, u64, f64)> = vec![
        ("native call".into(), 100_000_000, native),
        (
            "floor: int3 caught by the program's own SIGTRAP handler (no hotprobe)".into(),
            floor_n,
            floor,
        ),
    ];
    for (what, kind) in [
        ("in-process trap, count", Kind::InprocCount),
        (
            "shared-memory pre handler (null), spinning (50 µs each side)",
            Kind::ShmHandler {
                spin: Duration::from_micros(50),
            },
        ),
        (
            "shared-memory pre handler (null), sleeping (futex, no spin)",
            Kind::ShmHandler {
                spin: Duration::ZERO,
            },
        ),
        (
            "record (entry + exit events) through the in-process trap",
            Kind::InprocRecord,
        ),
        ("jump, count (on five)", Kind::JumpCount),
        (
            "shared-memory pre handler (null) at a jump site (on five), spinning (50 µs each side)",
            Kind::StubHandler {
                spin: Duration::from_micros(50),
            },
        ),
        (
            "shared-memory pre handler (null) at a jump site (on five), sleeping (futex, no spin)",
            Kind::StubHandler {
                spin: Duration::ZERO,
            },
        ),
        ("ptrace trap, count (--mechanism trap)", Kind::TrapCount),
        ("ptrace trap, null pre handler", Kind::TrapHandler),
    ] {
        let mut exec = String::new();
        let v = median(
            (0..runs)
                .map(|_| {
                    let (v, e) = run_one(&bin, hits, kind)?;
                    exec = e;
                    Ok(v)
                })
                .collect::<Result<_>>()?,
        );
        let name = format!("hotprobe {what}: {exec}");
        eprintln!("{name}: {v:.0} ns/hit");
        rows.push((name, hits, v));
    }
    if have("bpftrace") {
        let n = hits * 10;
        match (0..runs)
            .map(|_| run_bpftrace(&bin, n))
            .collect::<Result<Vec<_>>>()
        {
            Ok(v) => {
                let v = median(v);
                eprintln!("bpftrace uprobe: {v:.0} ns/hit");
                rows.push(("bpftrace uprobe (kernel), count()".into(), n, v));
            }
            Err(e) => eprintln!("bpftrace row left out: {e}"),
        }
    } else {
        eprintln!("bpftrace not installed: its row is left out");
    }
    println!(
        "In-process traps and shared-memory handlers on a 2-byte function, median of {runs} runs, {}",
        match cpu {
            Some(c) => format!("tracer and target pinned to CPU {c}"),
            None => "not pinned".into(),
        }
    );
    println!();
    println!("| mechanism | calls | ns per call | × native |");
    println!("|---|---:|---:|---:|");
    for (name, n, v) in rows {
        println!("| {name} | {n} | {v:.1} | {:.0} |", v / native);
    }
    Ok(())
}
