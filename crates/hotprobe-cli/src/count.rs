//! `hotprobe count`: probes that only count, and a table at the end.
//!
//! Each probe on a function's entry in the main executable gets the
//! cheapest mechanism that fits (`--mechanism auto`): **patch** (a
//! placeholder NOP becomes a `call`), then **jump** (the first instructions
//! move to a trampoline), both counted in the target by the hotprobe agent
//! (LD_PRELOADed into a spawned target, injected into an attached one);
//! else **trap** through the engine's probes, as every other spec
//! (offsets, addresses, lines, `%return`, other modules, patterns). The
//! table says which mechanism each probe got and why.

use crate::glob;
use crate::session::{progress, Placed, Traced};
use anyhow::{bail, Context, Result};
use hotprobe::{Probe, ProbeSpec, ProcessTarget, RetProbe, Session, SpawnOptions};
use hotprobe_fastpath::{
    find_agent, Action, FastPath, FastPathConfig, FastPathError, Mechanism, MechanismChoice,
};
use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

/// What `count` needs from the command line.
pub struct CountOptions<'a> {
    /// Probe specs.
    pub probes: &'a [String],
    /// Attach to this process.
    pub pid: Option<i32>,
    /// Or start this command.
    pub cmd: &'a [OsString],
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Live return instances followed at once for `%return` probes.
    pub maxactive: usize,
    /// `--mechanism`.
    pub mechanism: MechanismChoice,
}

/// A probe installed by the fast path.
struct FastPlaced {
    label: String,
    info: hotprobe_fastpath::SiteInfo,
}

/// Run `count`.
pub fn run(o: &CountOptions<'_>) -> Result<()> {
    let (mut t, fast, trap_specs) = if o.mechanism == MechanismChoice::Trap {
        let specs = o
            .probes
            .iter()
            .map(|s| (s.clone(), "--mechanism trap".to_string()))
            .collect();
        (Traced::open(o.pid, o.cmd)?, Vec::new(), specs)
    } else {
        open_fast(o)?
    };
    let specs: Vec<String> = trap_specs.iter().map(|(s, _)| s.clone()).collect();
    let placed = match place(&mut t, o, &specs) {
        Ok(p) => p,
        Err(e) => {
            t.abandon();
            return Err(e);
        }
    };
    t.run(placed.len() + fast.len(), o.duration)?;
    print_count_table(&t, &placed, &trap_specs, &fast);
    Ok(())
}

/// A `function` spec (main executable, entry, no pattern) the fast path may take.
fn fast_candidate(spec: &str) -> Option<String> {
    match spec.parse::<ProbeSpec>().ok()? {
        ProbeSpec::Function {
            module: None,
            name,
            offset: 0,
            is_return: false,
        } if !glob::is_pattern(&name) => Some(name),
        _ => None,
    }
}

type Opened = (Traced, Vec<FastPlaced>, Vec<(String, String)>);

/// Starts or attaches to the target with the agent, installs every probe
/// the fast path can take; returns the other specs with why they trap.
fn open_fast(o: &CountOptions<'_>) -> Result<Opened> {
    let forced = o.mechanism != MechanismChoice::Auto;
    let all_trap = |why: &str| -> Vec<(String, String)> {
        o.probes
            .iter()
            .map(|s| (s.clone(), why.to_string()))
            .collect()
    };
    if forced {
        if let Some(bad) = o.probes.iter().find(|s| fast_candidate(s).is_none()) {
            bail!(
                "`{bad}`: --mechanism patch|jump applies to function entries of the main \
                 executable (`function`, no offset, module, pattern or %return)"
            );
        }
    }
    let agent = match find_agent() {
        Ok(a) => a,
        // An explicit HOTPROBE_AGENT that does not exist is a mistake to
        // report, not a reason to trap silently.
        Err(e @ FastPathError::AgentOverride { .. }) => return Err(e.into()),
        Err(e) if !forced => {
            eprintln!("hotprobe: {e}; every probe uses the trap mechanism");
            let why = "no agent library";
            return Ok((Traced::open(o.pid, o.cmd)?, Vec::new(), all_trap(why)));
        }
        Err(e) => return Err(e.into()),
    };
    let config = FastPathConfig::default();
    let (mut pt, fp, spawned) = match (o.pid, o.cmd.split_first()) {
        (Some(pid), None) => {
            let mut pt = ProcessTarget::attach(pid)?;
            let fp = FastPath::inject(&mut pt, &agent, config);
            (pt, fp, false)
        }
        (None, Some((prog, args))) => {
            let mut opts = SpawnOptions::default();
            let pending = FastPath::for_spawn(&mut opts, &agent, config)?;
            let mut pt = ProcessTarget::spawn_with(Path::new(prog), args, &opts)?;
            let fp = pending.attach(&mut pt);
            (pt, fp, true)
        }
        _ => bail!("give either -p PID or -- CMD ARGS"),
    };
    let mut fp = match fp {
        Ok(fp) => fp,
        Err(e) if !forced => {
            eprintln!("hotprobe: {e}; every probe uses the trap mechanism");
            let why = format!("no agent in the target ({e})");
            return Ok((
                Traced::from_target(pt, spawned, None)?,
                Vec::new(),
                all_trap(&why),
            ));
        }
        Err(e) => {
            if !spawned {
                use hotprobe::Target;
                let _ = pt.detach();
            }
            return Err(e.into());
        }
    };
    let mut fast = Vec::new();
    let mut trap = Vec::new();
    let mut failure = None;
    for spec in o.probes {
        let Some(name) = fast_candidate(spec) else {
            trap.push((
                spec.clone(),
                "not a function entry of the main executable".to_string(),
            ));
            continue;
        };
        match fp.add(&mut pt, &name, Action::count(), o.mechanism) {
            Ok(info) if info.mechanism == Mechanism::Trap => trap.push((spec.clone(), info.reason)),
            Ok(info) => fast.push(FastPlaced {
                label: spec.clone(),
                info,
            }),
            Err(FastPathError::NoSuchFunction(_)) if !forced => {
                trap.push((spec.clone(), "not in the main executable".to_string()))
            }
            Err(e) if !forced => trap.push((spec.clone(), e.to_string())),
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let t = Traced::from_target(pt, spawned, Some(fp))?;
    if let Some(e) = failure {
        t.abandon();
        return Err(e).context("cannot place the probe");
    }
    Ok((t, fast, trap))
}

fn place(t: &mut Traced, o: &CountOptions<'_>, specs: &[String]) -> Result<Vec<Placed>> {
    if specs.is_empty() {
        return Ok(Vec::new());
    }
    let sites = t.resolve_all(specs)?;
    let bar = progress(sites.len() as u64, "placing probes");
    let mut placed = Vec::new();
    for s in sites {
        bar.inc(1);
        let addr = s.resolved.addr;
        let id = if s.is_return {
            if s.resolved.offset != 0 {
                bail!(
                    "cannot probe {}: a return probe goes on a function's first instruction, \
                     and {:#x} is {} bytes into {}",
                    s.label,
                    addr.0,
                    s.resolved.offset,
                    s.resolved.function.as_deref().unwrap_or("its function")
                );
            }
            t.session
                .retprobe_addr(t.target, addr, RetProbe::new(o.maxactive))?
        } else {
            t.session.probe_addr(t.target, addr, Probe::new())?
        };
        placed.push(Placed {
            label: s.label,
            id,
            addr: addr.0,
            is_return: s.is_return,
            execution: t.execution(id),
        });
    }
    bar.finish_and_clear();
    Ok(placed)
}

/// The `count` table: [`print_table`]'s columns and WHY (the reason for
/// the mechanism), fast-path probes first.
fn print_count_table(
    t: &Traced,
    placed: &[Placed],
    trap_specs: &[(String, String)],
    fast: &[FastPlaced],
) {
    let mut rows: Vec<[String; 6]> = Vec::new();
    for f in fast {
        let hits = t.fast.as_ref().map_or(0, |fp| fp.count(f.info.probe_id));
        rows.push([
            f.label.clone(),
            format!("{:#x}", f.info.addr),
            hits.to_string(),
            "-".into(),
            f.info.mechanism.to_string(),
            f.info.reason.clone(),
        ]);
    }
    for p in placed {
        let st = t.session.stats(p.id).unwrap_or_default();
        let (hits, missed) = if p.is_return {
            (st.returns, st.nmissed.to_string())
        } else {
            (st.hits, "-".to_string())
        };
        // The spec a site came from: its label, or the label's prefix
        // before ` @ ` (a spec resolving to several sites), or a pattern.
        let spec = p.label.split(" @ ").next().unwrap_or(&p.label);
        let why = trap_specs
            .iter()
            .find(|(s, _)| s == spec)
            .map_or("", |(_, w)| w.as_str());
        rows.push([
            p.label.clone(),
            format!("{:#x}", p.addr),
            hits.to_string(),
            missed,
            p.execution.clone(),
            why.to_string(),
        ]);
    }
    let head = ["PROBE", "ADDRESS", "HITS", "NMISSED", "EXECUTION", "WHY"];
    let mut w = head.map(str::len);
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |c: &[String; 6]| {
        format!(
            "{:<w0$}  {:<w1$}  {:>w2$}  {:>w3$}  {:<w4$}  {}",
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            c[5],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2],
            w3 = w[3],
            w4 = w[4]
        )
    };
    println!("{}", line(&head.map(String::from)).trim_end());
    for r in &rows {
        println!("{}", line(r).trim_end());
    }
}

/// Print the per-probe table on stdout: spec, address, hits (returns for a
/// `%return` probe), nmissed (return probes only), execution.
pub fn print_table(session: &Session, placed: &[Placed]) {
    let rows: Vec<[String; 5]> = placed
        .iter()
        .map(|p| {
            let st = session.stats(p.id).unwrap_or_default();
            let (hits, missed) = if p.is_return {
                (st.returns, st.nmissed.to_string())
            } else {
                (st.hits, "-".to_string())
            };
            [
                p.label.clone(),
                format!("{:#x}", p.addr),
                hits.to_string(),
                missed,
                p.execution.clone(),
            ]
        })
        .collect();
    let head = ["PROBE", "ADDRESS", "HITS", "NMISSED", "EXECUTION"];
    let mut w = head.map(str::len);
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |c: &[String; 5]| {
        format!(
            "{:<w0$}  {:<w1$}  {:>w2$}  {:>w3$}  {}",
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2],
            w3 = w[3]
        )
    };
    println!("{}", line(&head.map(String::from)));
    for r in &rows {
        println!("{}", line(r));
    }
}
