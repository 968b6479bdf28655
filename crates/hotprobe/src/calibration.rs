//! Each mechanism's cost per hit, measured when a recording starts
//! (issue 23's "true timings").
//!
//! A probe's hit costs the traced thread time, and a recorded duration
//! holds the costs of every hit inside it: a few ns on the fast path, µs
//! on a trap. [`calibrate`] measures them on this machine, with the same
//! session, agent and kernel paths as a recording: a small program embedded
//! in the library (calibration/target.c, built by the build script,
//! written out as a file) calls one of its functions N times and times the
//! loop itself, without probes and recorded (entry and exit) through the
//! mechanism measured. On a loaded machine a run's preemptions and cache
//! misses add to its time, so each figure is a low one: the 10th
//! percentile of the run's batches of 100 calls, and the least of several
//! short runs ([`ROUNDS`]). The difference per call, halved, is the cost
//! of one hit. A figure beyond what the mechanism can cost
//! ([`CostClass::plausible_ns`]), or a recorded run faster than the
//! native one by more than noise, is measured again, and refused if it
//! stays there. Each class stands on its own: a class refused (or whose
//! runs failed) is left out of the trace's costs with the reason (its
//! hits stay in the times, and `info` and `report` say so), the others
//! are used. The trace keeps the figures
//! ([`hotprobe_trace::ProbeCosts`]); its readers take them out of the
//! times, each capped at the shortest call measured on its mechanism
//! (docs/ANALYSIS.md, "Probe costs").
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

    /// The most one hit can plausibly cost, in ns: a fast-path hit is
    /// some instructions, a trap a kernel entry and a signal or a ptrace
    /// stop. More means the run was disturbed.
    pub fn plausible_ns(self) -> f64 {
        match self {
            CostClass::Patch | CostClass::Jump => 5_000.0,
            CostClass::InProcessTrap => 100_000.0,
            CostClass::Trap => 1_000_000.0,
        }
    }

    /// The target's function, the mechanism asked for and the calls of
    /// a run's loop.
    fn plan(self) -> (&'static str, MechanismChoice, u64) {
        match self {
            CostClass::Patch => ("hotprobe_calibration_patch", MechanismChoice::Patch, 50_000),
            CostClass::Jump => ("hotprobe_calibration_leaf", MechanismChoice::Jump, 50_000),
            CostClass::InProcessTrap => {
                ("hotprobe_calibration_short", MechanismChoice::Auto, 2_000)
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
    /// Every round measured more than the mechanism can cost, or a
    /// recorded run faster than the native one by more than noise
    /// ([`NEGATIVE_SLACK_NS`]): `ns` is negative then, and not finite
    /// when a run's figure was not.
    #[error(
        "calibrating the {class}: {ns:.0} ns a hit in every round, outside what it can \
         cost (0 to {bound:.0} ns): the machine is too loaded to measure it"
    )]
    Implausible {
        /// The class measured.
        class: &'static str,
        /// The least figure measured.
        ns: f64,
        /// The class's plausible bound.
        bound: f64,
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

/// Runs of each class, native and recorded: the least figure of them
/// counts.
pub const ROUNDS: usize = 3;

/// Further rounds when every figure so far is implausible.
const RETRIES: usize = 2;

/// A recorded run faster than the native one by at most this much a hit
/// is noise (the hit then costs 0); by more, the figure is implausible.
pub const NEGATIVE_SLACK_NS: f64 = 50.0;

/// The cost a hit of `class` from a recorded and a native run's ns a call
/// (a call is two hits), or why it is implausible: not finite, beyond
/// [`CostClass::plausible_ns`], or negative beyond [`NEGATIVE_SLACK_NS`].
pub fn per_hit_checked(
    class: CostClass,
    probed: f64,
    native: f64,
) -> Result<f64, CalibrationError> {
    let ns = (probed - native) / 2.0;
    if ns.is_finite() && ns >= -NEGATIVE_SLACK_NS && ns <= class.plausible_ns() {
        Ok(ns.max(0.0))
    } else {
        Err(CalibrationError::Implausible {
            class: class.label(),
            ns,
            bound: class.plausible_ns(),
        })
    }
}

/// Why a class's calibration was refused, in the words a trace keeps
/// ([`hotprobe_trace::UncalibratedMechanism::why`]): the error without
/// its class, which the trace names beside it.
pub fn refusal(e: &CalibrationError) -> String {
    match e {
        CalibrationError::Implausible { ns, bound, .. } => format!(
            "{ns:.0} ns a hit in every round, outside what it can cost (0 to {bound:.0} ns): \
             the machine was too loaded to measure it"
        ),
        CalibrationError::Session { source, .. } => format!("its runs failed: {source}"),
        CalibrationError::Mechanism { function, got, .. } => {
            format!("its function {function} went to {got}")
        }
        e => e.to_string(),
    }
}

/// One class's calibration: its cost, or why it was refused.
pub type ClassCalibration = (CostClass, Result<MeasuredCost, CalibrationError>);

/// The trace's costs from each class's calibration `measured` and each
/// probe's class `probes` (probe id, class): a class refused is listed
/// as uncalibrated with the reason ([`refusal`]), its probes under it;
/// the others' costs are used.
pub fn costs_of(
    measured: Vec<ClassCalibration>,
    probes: &[(u32, CostClass)],
) -> hotprobe_trace::ProbeCosts {
    use hotprobe_trace::{MechanismCost, ProbeCosts, UncalibratedMechanism};
    let mut costs = ProbeCosts::default();
    // Class → (calibrated, index in its list).
    let mut index = Vec::new();
    for (class, m) in measured {
        match m {
            Ok(m) => {
                let i = costs.mechanism(MechanismCost {
                    label: class.label().into(),
                    ns_per_hit: m.ns_per_hit,
                    how: m.how,
                });
                index.push((class, true, i));
            }
            Err(e) => {
                let i = costs.uncalibrated(UncalibratedMechanism {
                    label: class.label().into(),
                    why: refusal(&e),
                });
                index.push((class, false, i));
            }
        }
    }
    for &(id, class) in probes {
        match index.iter().find(|(c, _, _)| *c == class) {
            Some(&(_, true, i)) => {
                costs.probes.insert(id, i);
            }
            Some(&(_, false, i)) => {
                costs.uncalibrated_probes.insert(id, i);
            }
            None => {}
        }
    }
    costs
}

/// The target's low figure (`ns_per_call_low`: the 10th-percentile batch).
fn parse_timing(out: &str) -> Result<f64, CalibrationError> {
    out.lines()
        .find_map(|l| l.strip_prefix("ns_per_call_low "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|v| v.is_finite() && *v >= 0.0)
        .ok_or_else(|| CalibrationError::Output {
            what: format!("{:?}", out.chars().take(200).collect::<String>()),
        })
}

/// The calibrated costs of the mechanisms `placed` uses, with each
/// probe's mechanism, as a trace keeps them (`None` when no placement is a
/// process's: a guest's probes are not calibrated). A class whose
/// calibration was refused is listed uncalibrated with the reason, the
/// others used ([`costs_of`]); an error only when nothing can be measured.
pub fn probe_costs(
    placed: &[crate::Placement],
) -> Result<Option<hotprobe_trace::ProbeCosts>, CalibrationError> {
    let probes: Vec<(u32, CostClass)> = placed
        .iter()
        .filter_map(|p| Some((p.id.0, CostClass::of(p)?)))
        .collect();
    let mut classes: Vec<CostClass> = Vec::new();
    for &(_, c) in &probes {
        if !classes.contains(&c) {
            classes.push(c);
        }
    }
    if classes.is_empty() {
        return Ok(None);
    }
    Ok(Some(costs_of(calibrate(&classes)?, &probes)))
}

/// Measures the cost per hit of each class in `classes` (about 0.1 s a
/// class; a ptrace trap's in this process's own build, the tracer's speed
/// being part of it). Each class stands on its own: its figure, or why it
/// was refused. An error only when the calibration target cannot be
/// written out (no class can be measured).
pub fn calibrate(classes: &[CostClass]) -> Result<Vec<ClassCalibration>, CalibrationError> {
    let target = TargetFile::create()?;
    let program = target.path.clone();
    Ok(classes
        .iter()
        .map(|&class| (class, calibrate_class(&program, class)))
        .collect())
}

/// [`calibrate`] of one class with the target `program`.
fn calibrate_class(program: &Path, class: CostClass) -> Result<MeasuredCost, CalibrationError> {
    let (function, mechanism, calls) = class.plan();
    let argv: Vec<OsString> = vec![function.into(), calls.to_string().into()];
    // The least of several short runs each, so that a preempted run does
    // not count; more rounds while the figure is implausible.
    let (mut native, mut probed) = (f64::INFINITY, f64::INFINITY);
    let mut rounds = 0;
    while rounds < ROUNDS
        || (rounds < ROUNDS + RETRIES && per_hit_checked(class, probed, native).is_err())
    {
        native = native.min(native_run(program, &argv)?);
        probed = probed.min(recorded_run(program, &argv, class, function, mechanism)?);
        rounds += 1;
    }
    Ok(MeasuredCost {
        class,
        ns_per_hit: per_hit_checked(class, probed, native)?,
        how: format!(
            "{calls} calls recorded, the least of {rounds} runs' 10th-percentile \
             batches: {probed:.1} ns a call, {native:.1} native"
        ),
    })
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
        assert_eq!(
            parse_timing("ns_per_call 14.000\nns_per_call_low 12.500\n").unwrap(),
            12.5
        );
        for bad in [
            "",
            "ns_per_call 12.5",
            "ns_per_call_low x",
            "ns_per_call_low -1",
            "ns_per_call_low NaN",
        ] {
            assert!(parse_timing(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_figure_outside_what_a_class_can_cost_is_refused() {
        let jump = CostClass::Jump;
        assert_eq!(per_hit_checked(jump, 30.0, 10.0).unwrap(), 10.0);
        // Faster recorded than native by noise: the hit costs nothing.
        assert_eq!(per_hit_checked(jump, 10.0, 60.0).unwrap(), 0.0);
        for (probed, native) in [
            // Faster by more than noise: 100 ns a hit below zero.
            (10.0, 210.0),
            // Absurd for a jump: 10 µs a hit.
            (20_010.0, 10.0),
            (f64::NAN, 10.0),
            (f64::INFINITY, 10.0),
        ] {
            let e = per_hit_checked(jump, probed, native).unwrap_err();
            assert!(
                matches!(e, CalibrationError::Implausible { class: "jump", .. }),
                "{probed} {native}: {e}"
            );
        }
        // 10 µs is within what an in-process trap can cost.
        assert_eq!(
            per_hit_checked(CostClass::InProcessTrap, 20_010.0, 10.0).unwrap(),
            10_000.0
        );
    }

    #[test]
    fn one_class_refused_leaves_the_others_used() {
        let measured = |class, ns| {
            Ok(MeasuredCost {
                class,
                ns_per_hit: ns,
                how: "by the test".into(),
            })
        };
        let refused = per_hit_checked(CostClass::InProcessTrap, 1e9, 0.0).unwrap_err();
        let why = refusal(&refused);
        let costs = costs_of(
            vec![
                (CostClass::Jump, measured(CostClass::Jump, 4.0)),
                (CostClass::InProcessTrap, Err(refused)),
                (CostClass::Trap, measured(CostClass::Trap, 9_000.0)),
            ],
            &[
                (0, CostClass::Jump),
                (1, CostClass::InProcessTrap),
                (2, CostClass::Trap),
                (3, CostClass::Jump),
            ],
        );
        let labels: Vec<&str> = costs.mechanisms.iter().map(|m| m.label.as_str()).collect();
        assert_eq!(labels, ["jump", "ptrace trap"]);
        assert_eq!(
            (
                costs.ns_per_hit(0),
                costs.ns_per_hit(2),
                costs.ns_per_hit(3)
            ),
            (4.0, 9_000.0, 4.0)
        );
        // The refused class: listed with the reason, its probe under it,
        // at no cost (its times as measured).
        assert_eq!(costs.uncalibrated.len(), 1);
        assert_eq!(costs.uncalibrated[0].label, "in-process trap");
        assert_eq!(costs.uncalibrated[0].why, why);
        assert!(
            why.starts_with("500000000 ns a hit in every round, outside what it can cost"),
            "{why}"
        );
        assert_eq!(costs.ns_per_hit(1), 0.0);
        assert_eq!(costs.label_of(1), Some(("in-process trap", false)));
        assert_eq!(costs.label_of(2), Some(("ptrace trap", true)));
        // It round-trips through costs.tsv.
        let dir = std::env::temp_dir().join(format!("hotprobe-costs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("costs.tsv");
        costs.write(&path).unwrap();
        let back =
            hotprobe_trace::ProbeCosts::parse(&std::fs::read_to_string(&path).unwrap(), &path);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(back.unwrap(), costs);
    }

    #[test]
    fn every_class_is_measured_on_its_own_mechanism() {
        let all = [
            CostClass::Patch,
            CostClass::Jump,
            CostClass::InProcessTrap,
            CostClass::Trap,
        ];
        let m: Vec<MeasuredCost> = calibrate(&all)
            .expect("calibration")
            .into_iter()
            .map(|(class, m)| m.unwrap_or_else(|e| panic!("{class:?}: {e}")))
            .collect();
        assert_eq!(m.iter().map(|c| c.class).collect::<Vec<_>>(), all);
        // A trap costs the thread more than a patch or a jump: a kernel
        // entry at the least (no timing bound: only the order).
        let ns = |c: CostClass| m.iter().find(|x| x.class == c).unwrap().ns_per_hit;
        assert!(ns(CostClass::Trap) > ns(CostClass::Jump), "{m:?}");
        assert!(ns(CostClass::InProcessTrap) > ns(CostClass::Patch), "{m:?}");
    }
}
