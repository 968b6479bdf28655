//! Each mechanism's cost per hit, measured when a recording starts
//! (issue 23's "true timings").
//!
//! A probe's hit costs the traced thread time, and a recorded duration
//! holds the costs of every hit inside it: a few ns on the fast path, µs
//! on a trap. [`calibrate`] measures them on this machine, with the same
//! session, agent and kernel paths as a recording: a small program embedded
//! in the library (calibration/target.c, built by the build script,
//! written out as a file) calls one of its functions N times and times the
//! loop itself, once without probes and once recorded (entry and exit)
//! through the mechanism measured (each the median of batches of 100
//! calls, so that preempted batches do not count). The difference per
//! call, halved, is the cost of one hit. The trace keeps the figures
//! ([`hotprobe_trace::ProbeCosts`]); its readers take them out of the
//! times.
//!
//! The target's functions are written in assembly so that each mechanism
//! takes the one it is for: a 5-byte NOP placeholder (the patch), a 10-byte
//! function with a frame (the jump, and the ptrace trap when forced), a
//! 4-byte one (only a trap fits: the in-process trap).

use crate::{Action, EngineError, MechanismChoice, RunEnd, Session, SessionConfig, SpawnOptions};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The embedded calibration target (calibration/target.c).
static TARGET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/hotprobe-calibration"));

/// What a mechanism's cost is measured for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CostClass {
    /// The fast path's patch (a placeholder NOP rewritten into a call).
    Patch,
    /// The fast path's jump (a trampoline).
    Jump,
    /// The agent's in-process trap.
    InProcessTrap,
    /// The ptrace trap.
    Trap,
}

impl CostClass {
    /// The class of a placement's mechanism (`None` for a guest's, or a
    /// probe not placed yet).
    pub fn of(p: &crate::Placement) -> Option<CostClass> {
        use crate::Mechanism as M;
        match p.mechanism {
            M::Patch(_) => Some(CostClass::Patch),
            M::Jump => Some(CostClass::Jump),
            M::InProcessTrap => Some(CostClass::InProcessTrap),
            M::Trap => Some(CostClass::Trap),
            M::Stub | M::Plugin | M::Pending => None,
        }
    }

    /// Its name in traces and reports.
    pub fn label(self) -> &'static str {
        match self {
            CostClass::Patch => "patch",
            CostClass::Jump => "jump",
            CostClass::InProcessTrap => "in-process trap",
            CostClass::Trap => "ptrace trap",
        }
    }

    /// The target's function, the mechanism asked for and the calls of
    /// the loop.
    fn plan(self) -> (&'static str, MechanismChoice, u64) {
        match self {
            CostClass::Patch => (
                "hotprobe_calibration_patch",
                MechanismChoice::Patch,
                100_000,
            ),
            CostClass::Jump => ("hotprobe_calibration_leaf", MechanismChoice::Jump, 100_000),
            CostClass::InProcessTrap => {
                ("hotprobe_calibration_short", MechanismChoice::Auto, 3_000)
            }
            CostClass::Trap => ("hotprobe_calibration_leaf", MechanismChoice::Trap, 1_000),
        }
    }
}

/// One class's measured cost.
#[derive(Clone, Debug, PartialEq)]
pub struct MeasuredCost {
    /// The class.
    pub class: CostClass,
    /// ns one hit (an entry or an exit) costs the thread.
    pub ns_per_hit: f64,
    /// How it was measured, in words.
    pub how: String,
}

/// Why a calibration failed.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    /// The embedded target could not be written or run.
    #[error("cannot run the calibration target: {0}")]
    Run(#[source] std::io::Error),
    /// The target ran but did not print its timing.
    #[error("the calibration target printed no timing ({what})")]
    Output {
        /// What it printed or how it ended.
        what: String,
    },
    /// A session on the target failed.
    #[error("calibrating the {class}: {source}")]
    Session {
        /// The class measured.
        class: &'static str,
        /// Why.
        source: EngineError,
    },
    /// The function was placed on another mechanism than the one measured.
    #[error("calibrating the {class}: {function} went to {got}")]
    Mechanism {
        /// The class measured.
        class: &'static str,
        /// The function.
        function: &'static str,
        /// Where it went.
        got: String,
    },
}

/// The embedded target written out as a file of its own (a target's
/// executable must be a file its `/proc/PID/exe` opens), in a directory
/// only this user reads, both removed on drop.
struct TargetFile {
    dir: PathBuf,
    path: PathBuf,
}

impl TargetFile {
    fn create() -> Result<TargetFile, CalibrationError> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "hotprobe-calibration-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(CalibrationError::Run)?;
        let t = TargetFile {
            path: dir.join("hotprobe-calibration"),
            dir,
        };
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o700)
            .open(&t.path)
            .map_err(CalibrationError::Run)?;
        std::io::Write::write_all(&mut f, TARGET).map_err(CalibrationError::Run)?;
        Ok(t)
    }
}

impl Drop for TargetFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn parse_timing(out: &str) -> Result<f64, CalibrationError> {
    out.lines()
        .find_map(|l| l.strip_prefix("ns_per_call "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| CalibrationError::Output {
            what: format!("{:?}", out.chars().take(200).collect::<String>()),
        })
}

/// The calibrated costs of the mechanisms `placed` uses, with each
/// probe's mechanism, as a trace keeps them (`None` when no placement is a
/// process's: a guest's probes are not calibrated).
pub fn probe_costs(
    placed: &[crate::Placement],
) -> Result<Option<hotprobe_trace::ProbeCosts>, CalibrationError> {
    use hotprobe_trace::{MechanismCost, ProbeCosts};
    let mut classes: Vec<CostClass> = Vec::new();
    for c in placed.iter().filter_map(CostClass::of) {
        if !classes.contains(&c) {
            classes.push(c);
        }
    }
    if classes.is_empty() {
        return Ok(None);
    }
    let mut costs = ProbeCosts::default();
    let mut index = Vec::new();
    for m in calibrate(&classes)? {
        let i = costs.mechanism(MechanismCost {
            label: m.class.label().into(),
            ns_per_hit: m.ns_per_hit,
            how: m.how,
        });
        index.push((m.class, i));
    }
    for p in placed {
        let class = CostClass::of(p);
        if let Some(&(_, i)) = index.iter().find(|(c, _)| Some(*c) == class) {
            costs.probes.insert(p.id.0, i);
        }
    }
    Ok(Some(costs))
}

/// Measures the cost per hit of each class in `classes` (about 0.1 s a
/// class; a ptrace trap's in this process's own build, the tracer's speed
/// being part of it).
pub fn calibrate(classes: &[CostClass]) -> Result<Vec<MeasuredCost>, CalibrationError> {
    let target = TargetFile::create()?;
    let program = target.path.clone();
    let mut out = Vec::new();
    for &class in classes {
        let (function, mechanism, calls) = class.plan();
        let argv: Vec<OsString> = vec![function.into(), calls.to_string().into()];
        // The best of three native runs, and of two recorded ones on the
        // fast path, so that a preempted run does not count.
        let mut native = f64::INFINITY;
        for _ in 0..3 {
            native = native.min(native_run(&program, &argv)?);
        }
        let runs = if matches!(class, CostClass::Patch | CostClass::Jump) {
            2
        } else {
            1
        };
        let mut probed = f64::INFINITY;
        for _ in 0..runs {
            probed = probed.min(recorded_run(&program, &argv, class, function, mechanism)?);
        }
        out.push(MeasuredCost {
            class,
            ns_per_hit: ((probed - native) / 2.0).max(0.0),
            how: format!("{calls} calls recorded: {probed:.1} ns a call, {native:.1} native"),
        });
    }
    Ok(out)
}

fn native_run(program: &Path, argv: &[OsString]) -> Result<f64, CalibrationError> {
    let o = std::process::Command::new(program)
        .args(argv)
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .map_err(CalibrationError::Run)?;
    if !o.status.success() {
        return Err(CalibrationError::Output {
            what: format!("{}", o.status),
        });
    }
    parse_timing(&String::from_utf8_lossy(&o.stdout))
}

fn recorded_run(
    program: &Path,
    argv: &[OsString],
    class: CostClass,
    function: &'static str,
    mechanism: MechanismChoice,
) -> Result<f64, CalibrationError> {
    let session_err = |source| CalibrationError::Session {
        class: class.label(),
        source,
    };
    let mut stdout = unnamed_file().map_err(CalibrationError::Run)?;
    let mut s = Session::with_config(SessionConfig {
        mechanism,
        ..SessionConfig::default()
    });
    let t = s
        .spawn_with(
            program,
            argv,
            &SpawnOptions {
                stdout: Some(stdout.try_clone().map_err(CalibrationError::Run)?),
                ..Default::default()
            },
        )
        .map_err(session_err)?;
    let added = s.add(t, function, Action::Record).map_err(session_err)?;
    match added.placements.first() {
        Some(p) if CostClass::of(p) == Some(class) => {}
        // Dropping the session kills the target it started.
        other => {
            return Err(CalibrationError::Mechanism {
                class: class.label(),
                function,
                got: other.map_or("nothing".into(), |p| p.execution.clone()),
            })
        }
    }
    s.start().map_err(session_err)?;
    let end = s.run().map_err(session_err)?;
    if end != RunEnd::AllExited {
        return Err(CalibrationError::Output {
            what: format!("the run ended with {end:?}"),
        });
    }
    use std::io::{Read, Seek};
    let mut text = String::new();
    stdout
        .seek(std::io::SeekFrom::Start(0))
        .and_then(|_| stdout.read_to_string(&mut text))
        .map_err(CalibrationError::Run)?;
    parse_timing(&text)
}

/// A file for the target's output, removed from its directory at once (it
/// lives while open).
fn unnamed_file() -> std::io::Result<std::fs::File> {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let p = std::env::temp_dir().join(format!(
        ".hotprobe-calibration-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&p)?;
    std::fs::remove_file(&p)?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timing_lines_parse_and_bad_ones_do_not() {
        assert_eq!(parse_timing("ns_per_call 12.500\n").unwrap(), 12.5);
        for bad in ["", "ns_per_call x", "ns_per_call -1", "ns_per_call NaN"] {
            assert!(parse_timing(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn every_class_is_measured_on_its_own_mechanism() {
        let all = [
            CostClass::Patch,
            CostClass::Jump,
            CostClass::InProcessTrap,
            CostClass::Trap,
        ];
        let m = calibrate(&all).expect("calibration");
        assert_eq!(m.iter().map(|c| c.class).collect::<Vec<_>>(), all);
        // A trap costs the thread more than a patch or a jump: a kernel
        // entry at the least (no timing bound: only the order).
        let ns = |c: CostClass| m.iter().find(|x| x.class == c).unwrap().ns_per_hit;
        assert!(ns(CostClass::Trap) > ns(CostClass::Jump), "{m:?}");
        assert!(ns(CostClass::InProcessTrap) > ns(CostClass::Patch), "{m:?}");
    }
}
