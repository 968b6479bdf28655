//! `hotprobe count`: probes that only count, and a table at the end.
//!
//! The session picks each site's mechanism (`--mechanism auto`): **patch**
//! (a placeholder NOP becomes a `call`), then **jump** (the first
//! instructions move to a trampoline), both counted in the target by the
//! hotprobe agent, else **trap**. The table says which mechanism each probe
//! got and why.
//!
//! With a condition (`'PROBE if arg0 > 5'`, see [`crate::cond`]) or
//! `--hist`, the probes record instead of counting: entries (with the
//! arguments the conditions name) and exits go to the library's
//! [`CountSink`], which counts the entries whose condition holds and builds
//! a log2 histogram of the durations of those calls. This module only
//! turns the command line into probes and conditions, and prints.

use crate::cond::{split_spec, Cond};
use crate::out::errln;
use crate::session::{print_table_with, TableExtras, Traced};
use anyhow::{bail, Context, Result};
use hotprobe::{Action, CountSink, FastPathConfig, MechanismChoice, Placement, SessionConfig};
use std::collections::HashMap;
use std::ffi::OsString;
use std::time::Duration;

/// What `count` needs from the command line.
pub struct CountOptions<'a> {
    /// Probe specs, each maybe with ` if CONDITION`.
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
    /// `--no-traps`: leave out what needs a trap.
    pub no_traps: bool,
    /// `-f`: follow forked children, a row per probe and process.
    pub follow_forks: bool,
    /// `-f` without `--no-follow-exec`: probes placed again in each
    /// program a followed process executes, a row per process and image.
    pub follow_exec: bool,
    /// `--exe`/`--comm`: every matching process, running or started later.
    pub new_processes: Option<hotprobe::ProcessMatch>,
    /// `--hist`: a histogram of each function's call durations.
    pub hist: bool,
    /// `--json`: the table as JSON.
    pub json: bool,
    /// `--all`: also the rows of patterns' functions nothing hit.
    pub all: bool,
    /// `--force`: probe addresses not shown to start an instruction.
    pub force: bool,
}

/// A probe spec split from its condition.
struct Spec {
    probe: String,
    /// The condition's text and, unless it names parameters (compiled
    /// per function once placed), the condition.
    cond: Option<(String, Option<Cond>)>,
}

/// Run `count`; returns hotprobe's exit code (the command's).
/// The condition `text`, whose names are parameters of the function `p`
/// is placed on (from its DWARF).
fn named_cond(
    typing: &hotprobe::typed::Typing,
    p: &hotprobe::Placement,
    text: &str,
) -> Result<Cond, String> {
    let func = p.function.clone().unwrap_or_else(|| p.label.clone());
    let Some(regs) = typing.param_registers(p.addr.0) else {
        return Err(format!(
            "the condition names a parameter, and {func} has no DWARF (build with -g)"
        ));
    };
    let map = |name: &str| regs.iter().find(|(n, _)| n == name).map(|(_, r)| r.clone());
    Cond::parse_with(text, &map).map_err(|e| match e {
        crate::cond::CondError::UnknownName { name, .. } => format!(
            "the condition: {func} has no parameter {name}; its parameters: {}",
            regs.iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        e => format!("the condition: {e}"),
    })
}

pub fn run(o: &CountOptions<'_>) -> Result<u8> {
    let mut specs = Vec::new();
    for s in o.probes {
        let (probe, cond) = split_spec(s);
        let cond = match cond {
            // A parameter name: compiled per function once placed.
            Some(text) => match Cond::parse(text) {
                Err(crate::cond::CondError::UnknownName { .. }) => Some((text.to_string(), None)),
                c => Some((
                    text.to_string(),
                    Some(c.map_err(|e| {
                        crate::UsageError(format!("`{}`: the condition: {e}", crate::cond::cut(s)))
                    })?),
                )),
            },
            None => None,
        };
        specs.push(Spec {
            probe: probe.to_string(),
            cond,
        });
    }
    let recording = o.hist || specs.iter().any(|s| s.cond.is_some());
    if recording {
        if o.follow_forks {
            bail!(crate::UsageError(
                "conditions and --hist do not work with -f yet".into()
            ));
        }
        if let Some(s) = specs.iter().find(|s| s.probe.ends_with("%return")) {
            bail!(crate::UsageError(format!(
                "{}: conditions and --hist work on function entries (no %return)",
                s.probe
            )));
        }
    }
    let record_args = specs
        .iter()
        .filter_map(|s| {
            s.cond
                .as_ref()
                .map(|c| c.1.as_ref().map_or(6, Cond::args_needed))
        })
        .max()
        .unwrap_or(0);
    let config = SessionConfig {
        mechanism: o.mechanism,
        maxactive: o.maxactive,
        follow_forks: o.follow_forks,
        follow_exec: o.follow_exec,
        fast_path: FastPathConfig {
            record_args,
            ..FastPathConfig::default()
        },
        force: o.force,
        no_traps: o.no_traps,
        ..SessionConfig::default()
    };
    let mut t = match &o.new_processes {
        Some(what) => Traced::waiting(config, what.clone())?,
        None => Traced::open(config, o.pid, o.cmd)?,
    };
    let mut placed = Vec::new();
    let mut conds: HashMap<u32, Cond> = HashMap::new();
    let mut cond_text: HashMap<u32, String> = HashMap::new();
    // Probes placed for a pattern (`libc:str*`): their rows without a hit
    // are left out of the table unless --all.
    let mut from_pattern: std::collections::HashSet<u32> = std::collections::HashSet::new();
    let typing = std::rc::Rc::new(hotprobe::typed::Typing::new(t.pid));
    for s in &specs {
        let named = matches!(&s.cond, Some((_, None)));
        t.session.set_capture(named.then(|| typing.name_chooser()));
        let added = t.add_all(std::slice::from_ref(&s.probe), |_| {
            if recording {
                Action::Record
            } else {
                Action::Count
            }
        });
        t.session.set_capture(None);
        let added = match added {
            Ok(p) => p,
            Err(e) => {
                t.abandon();
                return Err(e);
            }
        };
        if let Some((text, c)) = &s.cond {
            for p in &added {
                let c = match c {
                    Some(c) => c.clone(),
                    None => match named_cond(&typing, p, text) {
                        Ok(c) => c,
                        Err(e) => {
                            t.abandon();
                            return Err(crate::UsageError(format!("`{}`: {e}", s.probe)).into());
                        }
                    },
                };
                conds.insert(p.id.0, c);
                cond_text.insert(p.id.0, text.clone());
            }
        }
        if hotprobe::symbols::is_pattern(&s.probe) {
            from_pattern.extend(added.iter().map(|p| p.id.0));
        }
        placed.extend(added);
    }
    let ids: Vec<u32> = placed.iter().map(|p| p.id.0).collect();
    let mut sink = recording.then(|| CountSink::with_conditions(conds, o.hist, &ids));
    // The table prints whatever happened to the run.
    let ran = match sink.as_mut() {
        Some(s) => t.run(&placed, o.duration, Some(s)),
        None => t.run(&placed, o.duration, None),
    };
    if let Some(s) = &sink {
        if s.lost_events() > 0 {
            errln!(
                "hotprobe: {} events lost (full rings): the counts are low",
                s.lost_events()
            );
        }
    }
    let extras = TableExtras {
        hits: sink.as_ref().map(CountSink::all_hits),
        conditions: Some(&cond_text),
        hists: sink
            .as_ref()
            .filter(|_| o.hist)
            .map(CountSink::all_histograms),
        json: o.json,
        guests: None,
        comms: None,
    };
    let hits_of = |p: &Placement| -> u64 {
        match &extras.hits {
            Some(h) => h.get(&p.id.0).copied().unwrap_or(0),
            None => t
                .session
                .stats(p.id)
                .map_or(0, |st| st.hits + st.returns + st.nmissed),
        }
    };
    // -f across exec: the probes placed in each program executed, a
    // COMM column (see crate::exec_rows).
    let (placed, comms) = crate::session::with_exec_rows(&t.session, placed, &mut from_pattern);
    let extras = TableExtras {
        comms: comms.as_ref(),
        ..extras
    };
    let (shown, hidden): (Vec<Placement>, Vec<Placement>) = placed
        .iter()
        .cloned()
        .partition(|p| o.all || o.json || !from_pattern.contains(&p.id.0) || hits_of(p) > 0);
    let per_process = o.follow_forks || o.new_processes.is_some();
    print_table_with(&t.session, &shown, per_process, &extras);
    if !hidden.is_empty() {
        errln!(
            "hotprobe: {} probes of patterns had no hit and are not shown (--all shows them)",
            hidden.len()
        );
    }
    for (module, n) in crate::record::never_armed(&t.session, &placed) {
        errln!("hotprobe: never armed: {n} probes on {module}: the program never loaded it");
    }
    t.print_skipped();
    ran.context("the run failed")?;
    Ok(t.exit_code())
}
