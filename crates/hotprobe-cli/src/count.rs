//! `hotprobe count`: probes that only count, and a table at the end.
//!
//! The session picks each site's mechanism (`--mechanism auto`): **patch**
//! (a placeholder NOP becomes a `call`), then **jump** (the first
//! instructions move to a trampoline), both counted in the target by the
//! hotprobe agent, else **trap**. The table says which mechanism each probe
//! got and why; after it, stderr gives the probes per mechanism and
//! names each one left on a trap, with why.
//!
//! With a condition (`'PROBE if arg0 > 5'`, see [`crate::cond`]) or
//! `--hist`, the probes record instead of counting: entries (with the
//! arguments the conditions name) and exits go to the library's
//! [`CountSink`], which counts the entries whose condition holds and builds
//! a log2 histogram of the durations of those calls. `--hist=VALUE`,
//! `--lhist` and `--by` aggregate (`hotprobe::agg`): in the target on the
//! fast path, from recorded entries elsewhere or under a condition. This
//! module only turns the command line into probes, conditions and
//! aggregations, and prints.

use crate::cond::{split_spec, Cond};
use crate::out::errln;
use crate::session::{print_table_with, TableExtras, Traced};
use anyhow::{bail, Context, Result};
use hotprobe::agg::{AggKey, AggSink, AggSource, AggSpec, AggTable};
use hotprobe::typed::Typing;
use hotprobe::{Action, CountSink, FastPathConfig, MechanismChoice, Placement, SessionConfig};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsString;
use std::rc::Rc;
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
    /// `--hist=VALUE`, `--lhist` or `--by`: an aggregation, computed in
    /// the target on the fast path.
    pub agg: Option<AggSpec>,
    /// `--top N`: the N keys of `--by` with the most calls.
    pub top: Option<usize>,
    /// `--json`: the table as JSON.
    pub json: bool,
    /// `--all`: also the rows of patterns' functions nothing hit.
    pub all: bool,
    /// `--force`: probe addresses not shown to start an instruction.
    pub force: bool,
    /// `--stacks`: count the stacks at each entry too.
    pub stacks: bool,
}

/// A probe spec split from its condition.
struct Spec {
    probe: String,
    /// The condition's text and, unless it names parameters or USDT
    /// arguments (compiled per function or marker once placed), the
    /// condition.
    cond: Option<(String, Option<Cond>)>,
    /// A USDT marker (`usdt:…`): its condition's `argN` are the marker's
    /// arguments, captured at the hit.
    usdt: bool,
}

/// The aggregation of `--hist=VALUE`, `--lhist` or `--by`, if one is asked
/// for (bad specs are usage errors).
pub fn agg_spec(
    hist: Option<&Option<String>>,
    lhist: Option<&str>,
    by: Option<&str>,
) -> Result<Option<AggSpec>> {
    let spec = match (hist, lhist, by) {
        (Some(Some(v)), _, _) => AggSpec::hist(v).map_err(|e| ("--hist", e)),
        (_, Some(l), _) => AggSpec::lhist(l).map_err(|e| ("--lhist", e)),
        (_, _, Some(k)) => AggSpec::by(k).map_err(|e| ("--by", e)),
        _ => return Ok(None),
    };
    match spec {
        Ok(s) => Ok(Some(s)),
        Err((flag, e)) => Err(crate::UsageError(format!("{flag}: {e}")).into()),
    }
}

/// Run `count`; returns hotprobe's exit code (the command's).
pub fn run(o: &CountOptions<'_>) -> Result<u8> {
    let mut specs = Vec::new();
    for s in o.probes {
        let (probe, cond) = split_spec(s);
        let usdt = probe.starts_with(hotprobe::symbols::USDT_PREFIX);
        let cond = match cond {
            // The marker's arguments: compiled once placed.
            Some(text) if usdt => Some((text.to_string(), None)),
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
            usdt,
        });
    }
    let any_cond = specs.iter().any(|s| s.cond.is_some());
    if let Some(a) = &o.agg {
        let retval = a.source == AggSource::Retval;
        let by_value = matches!(
            a.source,
            AggSource::Arg(_) | AggSource::Name(_) | AggSource::Retval
        );
        if let Some(s) = specs.iter().find(|s| s.usdt && by_value) {
            // The agent and the trap read argument registers, and a
            // marker's arguments are wherever its note says: they would
            // aggregate rdi, rsi… (seen: rsi's running total for arg1).
            bail!(crate::UsageError(format!(
                "{}: {} aggregates argument registers, not a USDT marker's arguments: use a \
                 condition ('{} if arg1 > 3') or trace for them, or --by tid|comm|stack",
                s.probe,
                a.describe(),
                s.probe
            )));
        }
        if let Some(s) = specs.iter().find(|s| s.usdt && s.cond.is_some()) {
            bail!(crate::UsageError(format!(
                "{}: {} does not combine with a condition on a USDT marker's arguments yet",
                s.probe,
                a.describe()
            )));
        }
        if o.hist || (any_cond && retval) {
            bail!(crate::UsageError(format!(
                "{}: the latency --hist, and conditions on return values, do not combine with it",
                a.describe()
            )));
        }
        if let Some(s) = specs
            .iter()
            .find(|s| s.probe.ends_with("%return") != retval)
        {
            bail!(crate::UsageError(format!(
                "{}: {} {}",
                s.probe,
                a.describe(),
                if retval {
                    "needs a %return probe"
                } else {
                    "works on function entries (no %return)"
                }
            )));
        }
    }
    let recording = o.hist || specs.iter().any(|s| s.cond.is_some());
    if recording {
        // -f: forked processes keep the probes (and their ids): their
        // entries count under the same conditions, in rows per process.
        // The probes placed in a program a followed process executes are
        // new ones: ExecConds gives them their spec's condition, compiled
        // for that program where it names parameters or USDT arguments
        // (from the DWARF or the notes the placement read), with no
        // aggregation beside.
        if o.follow_exec {
            if let (Some(a), true) = (&o.agg, any_cond) {
                bail!(crate::UsageError(format!(
                    "{} with a condition under -f applies to forked processes only: add --no-follow-exec",
                    a.describe()
                )));
            }
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
        .unwrap_or(0)
        .max(match o.agg.as_ref().map(|a| &a.source) {
            // Exits carry rax only when arguments are recorded.
            Some(AggSource::Arg(_) | AggSource::Name(_) | AggSource::Retval) => 6,
            _ => 0,
        });
    let recording = recording || o.agg.is_some();
    let config = SessionConfig {
        mechanism: o.mechanism,
        maxactive: o.maxactive,
        follow_forks: o.follow_forks,
        follow_exec: o.follow_exec,
        fast_path: FastPathConfig {
            record_args,
            stacks: o.stacks,
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
    // Where the fast path takes a function, it aggregates in the target;
    // elsewhere (and with conditions, which hotprobe evaluates) its
    // entries are recorded and aggregated here.
    if let (Some(a), false) = (&o.agg, any_cond) {
        let (a, ty) = (a.clone(), typing.clone());
        t.session.set_aggregate(Some(std::rc::Rc::new(move |r| {
            let func = r.function.as_deref().unwrap_or_default();
            // A name the function lacks: refused once placed (below).
            a.rule_for(&ty, r.addr.0, func).ok()
        })));
    }
    let mut agg_rules = HashMap::new();
    // USDT markers whose arguments a condition compares: their operands
    // as the note gives them, by address, and the probes.
    let usdt_args = std::rc::Rc::new(std::cell::RefCell::new(HashMap::new()));
    let mut usdt_ids = Vec::new();
    // The same, per program a followed process executes.
    let exec_notes = ExecNotes::default();
    // Probes on a library not loaded yet whose condition names parameters:
    // compiled when it is (CountSink::add_pending_named).
    let mut pending_named = Vec::new();
    for s in &specs {
        let named = !s.usdt && matches!(&s.cond, Some((_, None)))
            || matches!(o.agg.as_ref().map(|a| &a.source), Some(AggSource::Name(_)));
        if o.follow_exec || o.new_processes.is_some() {
            t.session.set_exec_capture(exec_notes.capture(
                &s.probe,
                s.usdt && s.cond.is_some(),
                named,
            ));
        }
        if s.usdt && s.cond.is_some() {
            let args = usdt_args.clone();
            t.session.set_capture(Some(std::rc::Rc::new(
                move |r: &hotprobe::symbols::ResolvedProbe| {
                    args.borrow_mut().insert(r.addr.0, r.usdt_args.clone());
                    hotprobe::typed::usdt_capture(r)
                },
            )));
        } else {
            t.session.set_capture(named.then(|| typing.name_chooser()));
        }
        let added = t.add_all(std::slice::from_ref(&s.probe), |_| {
            if recording {
                Action::Record
            } else {
                Action::Count
            }
        });
        t.session.set_capture(None);
        t.session.set_exec_capture(None);
        let added = match added {
            Ok(p) => p,
            Err(e) => {
                t.abandon();
                return Err(e);
            }
        };
        if let Some((text, c)) = &s.cond {
            // A spec naming nothing here waits for an exec (its
            // placeholder is never hit): its condition compiles there.
            for p in added.iter().filter(|p| p.execution != hotprobe::AT_EXEC) {
                let c = match c {
                    Some(c) => c.clone(),
                    None if s.usdt => {
                        let args = usdt_args
                            .borrow()
                            .get(&p.addr.0)
                            .cloned()
                            .unwrap_or_default();
                        match hotprobe::cond::usdt_cond(text, &args) {
                            Ok(c) => {
                                usdt_ids.push(p.id);
                                c
                            }
                            Err(e) => {
                                t.abandon();
                                return Err(crate::UsageError(format!(
                                    "`{}`: the condition: {e}",
                                    s.probe
                                ))
                                .into());
                            }
                        }
                    }
                    None if p.mechanism == hotprobe::Mechanism::Pending => {
                        pending_named.push((p.id, text.clone()));
                        cond_text.insert(p.id.0, text.clone());
                        continue;
                    }
                    None => match crate::cond::named_cond(&typing, p, text) {
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
        if let Some(a) = &o.agg {
            for p in &added {
                let func = p.function.as_deref().unwrap_or(&p.label);
                match a.rule_for(&typing, p.addr.0, func) {
                    Ok(rule) => {
                        agg_rules.insert(p.id, rule);
                    }
                    Err(e) => {
                        t.abandon();
                        return Err(crate::UsageError(format!("`{}`: {e}", s.probe)).into());
                    }
                }
            }
        }
        if hotprobe::symbols::is_pattern(&s.probe) {
            from_pattern.extend(added.iter().map(|p| p.id.0));
        }
        placed.extend(added);
    }
    if let Err(e) = t.check_placed(&placed) {
        t.abandon();
        return Err(e);
    }
    let ids: Vec<u32> = placed.iter().map(|p| p.id.0).collect();
    let agg_conds = conds.clone();
    let mut sink = recording.then(|| {
        let mut s = CountSink::with_conditions(conds.clone(), o.hist, &ids);
        for (id, text) in &pending_named {
            let c = hotprobe::cond::DeferredCond::new(text, typing.clone());
            s.add_pending_named(*id, c, record_args.min(6));
        }
        for id in &usdt_ids {
            if let Some(c) = conds.get(&id.0) {
                s.add_usdt(*id, c.clone());
            }
        }
        s
    });
    // The table prints whatever happened to the run.
    let mut agg_events = HashMap::new();
    let ran = match sink.as_mut() {
        Some(s) if o.agg.is_some() => {
            let mut a = AggSink::new(s);
            a.conditions = agg_conds;
            for (id, rule) in &agg_rules {
                // Not aggregated in the target: from its recorded entries.
                if t.session.aggregation(*id).is_none() {
                    a.add(*id, *rule);
                }
            }
            let ran = t.run(&placed, o.duration, Some(&mut a));
            agg_events = a.tables;
            ran
        }
        Some(s) => {
            let by_label = specs
                .iter()
                .filter_map(|sp| {
                    let (text, cond) = sp.cond.clone()?;
                    Some((sp.probe.clone(), (text, cond)))
                })
                .collect();
            let mut e = ExecConds {
                sink: s,
                by_label,
                notes: &exec_notes,
            };
            t.run(&placed, o.duration, Some(&mut e))
        }
        None => t.run(&placed, o.duration, None),
    };
    if let Some(s) = &mut sink {
        for n in s.take_notices() {
            errln!("hotprobe: {n}");
        }
        if s.uncountable_hits() > 0 {
            errln!(
                "hotprobe: {} hits not counted: their condition does not compile in the program \
                 they were in (said above)",
                s.uncountable_hits()
            );
        }
        if s.usdt_unread() > 0 {
            errln!(
                "hotprobe: {} USDT hits not counted: an argument their condition compares could not be read",
                s.usdt_unread()
            );
        }
        if s.lost_events() > 0 {
            errln!(
                "hotprobe: {} events lost (full rings): the counts are low",
                s.lost_events()
            );
        }
    }
    // -f across exec: the probes placed in each program executed (their
    // aggregations too: the chooser stays set for them), a COMM column
    // (see crate::exec_rows).
    let (placed, comms) = crate::session::with_exec_rows(&t.session, placed, &mut from_pattern);
    let tables = aggregations(&t, &placed, agg_events);
    if let Some(a) = &o.agg {
        // Probes placed at an exec run on traps there (no agent) and their
        // entries are not recorded for this aggregation: said, not dropped.
        let missing = placed
            .iter()
            .filter(|p| !tables.contains_key(&p.id.0) && !agg_rules.contains_key(&p.id))
            .count();
        if missing > 0 {
            errln!(
                "hotprobe: {}: not aggregated for {missing} probes placed in programs started by \
                 exec (their hits are in the table): add --no-follow-exec and probe the program \
                 itself",
                a.describe()
            );
        }
    }
    let agg_json: HashMap<u32, serde_json::Value> = match (&o.agg, o.json) {
        (Some(a), true) => tables
            .iter()
            .map(|(id, table)| (*id, agg_json(a, table, o.top)))
            .collect(),
        _ => HashMap::new(),
    };
    let per_process = o.follow_forks || o.new_processes.is_some();
    let process_hits = sink
        .as_ref()
        .filter(|_| per_process && (o.agg.is_none() || any_cond))
        .map(|s| s.process_hits(|tid| t.session.process_of_thread(tid)));
    let extras = TableExtras {
        process_hits: process_hits.as_ref(),
        // Aggregating probes count in the target (or the engine).
        hits: sink
            .as_ref()
            .filter(|_| o.agg.is_none() || any_cond)
            .map(CountSink::all_hits),
        conditions: Some(&cond_text),
        hists: sink
            .as_ref()
            .filter(|_| o.hist)
            .map(CountSink::all_histograms),
        json: o.json,
        guests: None,
        aggregations: Some(&agg_json).filter(|m| !m.is_empty()),
        comms: None,
        not_counted: None,
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
    // Probes whose hits were not counted (a condition that did not
    // compile where they were placed): `-` in their rows, not 0.
    let mut not_counted = exec_notes.uncounted.take();
    if let Some(s) = &sink {
        not_counted.extend(
            placed
                .iter()
                .filter(|p| s.not_compiled(p.id).is_some())
                .map(|p| p.id.0),
        );
    }
    let extras = TableExtras {
        comms: comms.as_ref(),
        not_counted: Some(&not_counted),
        ..extras
    };
    let (shown, hidden): (Vec<Placement>, Vec<Placement>) = placed.iter().cloned().partition(|p| {
        o.all
            || o.json
            || !from_pattern.contains(&p.id.0)
            || hits_of(p) > 0
            || not_counted.contains(&p.id.0)
    });
    print_table_with(&t.session, &shown, per_process, &extras);
    crate::session::print_mechanisms(&placed);
    if o.stacks {
        crate::stacks::print_stacks(&t.session, &shown);
    }
    if !hidden.is_empty() {
        errln!(
            "hotprobe: {} probes of patterns had no hit and are not shown (--all shows them)",
            hidden.len()
        );
    }
    if let Some(a) = &o.agg {
        print_aggregations(&shown, &tables, a, o.top, o.json);
    }
    for (module, n) in crate::record::never_armed(&t.session, &placed) {
        errln!("hotprobe: never armed: {n} probes on {module}: the program never loaded it");
    }
    t.print_skipped();
    ran.context("the run failed")?;
    Ok(t.exit_code())
}

/// Each placed probe's aggregation: the target's tables with what was
/// aggregated from recorded events added.
fn aggregations(
    t: &Traced,
    placed: &[Placement],
    mut from_events: HashMap<u32, AggTable>,
) -> HashMap<u32, AggTable> {
    let mut out = HashMap::new();
    for p in placed {
        let events = from_events.remove(&p.id.0);
        let table = match (t.session.aggregation(p.id), events) {
            (Some(mut a), Some(e)) => {
                a.merge(&e);
                a
            }
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => continue,
        };
        out.insert(p.id.0, table);
    }
    out
}

/// An aggregation as a JSON object (`count --json`, docs/JSON.md).
fn agg_json(spec: &AggSpec, table: &AggTable, top: Option<usize>) -> serde_json::Value {
    let mut o = serde_json::json!({
        "aggregate": spec.describe(),
        "not_aggregated": table.uncounted,
    });
    if table.rule.kind == hotprobe::fastpath::agg::AggKind::Keyed {
        let keys: Vec<serde_json::Value> = table
            .key_rows(top)
            .into_iter()
            .map(|(k, n)| {
                let key = match k {
                    AggKey::Value(v) => serde_json::json!(v),
                    AggKey::Signed(v) => serde_json::json!(v),
                    AggKey::Tid(t) => serde_json::json!(t),
                    AggKey::Comm(c) => serde_json::json!(c),
                };
                serde_json::json!({"key": key, "count": n})
            })
            .collect();
        o["keys"] = keys.into();
    } else {
        let buckets: Vec<serde_json::Value> = table
            .hist_ranges()
            .into_iter()
            .map(|(lo, hi, n)| {
                let num = |v: Option<i128>| v.map(|v| serde_json::json!(v as i64));
                serde_json::json!({"lo": num(lo), "hi": num(hi), "count": n})
            })
            .collect();
        o["buckets"] = buckets.into();
    }
    o
}

/// Prints each probe's aggregation under the table (unless `json`: they
/// are in it), as bpftrace prints its maps, and says how many hits could
/// not be aggregated.
fn print_aggregations(
    shown: &[Placement],
    tables: &HashMap<u32, AggTable>,
    spec: &AggSpec,
    top: Option<usize>,
    json: bool,
) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    for p in shown {
        let Some(table) = tables.get(&p.id.0) else {
            continue;
        };
        if !json {
            let _ = writeln!(out, "\n@{} {}:", spec.describe(), p.label);
            let text = table.render(top);
            let _ = if text.is_empty() {
                writeln!(out, "(no calls)")
            } else {
                write!(out, "{text}")
            };
        }
        if table.uncounted > 0 {
            errln!(
                "hotprobe: {}: {} calls not aggregated (the key table was full, or the key could not be read)",
                p.label,
                table.uncounted
            );
        }
    }
}

/// What the probes placed in each program a followed process executes
/// noted as they were placed, by image ([`hotprobe::ExecImage::index`])
/// and spec: each function's parameters (its DWARF, read in that
/// process), each USDT marker's arguments (its note).
#[derive(Default, Clone)]
struct ExecNotes {
    typings: Rc<RefCell<TypingsByImage>>,
    usdt_args: Rc<RefCell<UsdtArgsByImage>>,
    /// Probe ids whose condition did not compile in an executed program.
    uncounted: RefCell<std::collections::HashSet<u32>>,
}

/// The parameters noted in each image, by (image, spec).
type TypingsByImage = HashMap<(usize, String), Rc<Typing>>;

/// A USDT marker's arguments, by (image, spec, run-time address).
type UsdtArgsByImage = HashMap<(usize, String, u64), Vec<hotprobe::symbols::UsdtArg>>;

impl ExecNotes {
    /// The exec capture of a spec (`usdt`: a marker's; `named`: a
    /// condition or aggregation naming parameters), `None` when it needs
    /// nothing noted.
    fn capture(&self, spec: &str, usdt: bool, named: bool) -> Option<hotprobe::ExecCapture> {
        let spec = spec.to_string();
        if usdt {
            let args = self.usdt_args.clone();
            return Some(Rc::new(move |at: &hotprobe::ExecPlacing| {
                let (args, spec, image) = (args.clone(), spec.clone(), at.image);
                Some(Rc::new(move |r: &hotprobe::symbols::ResolvedProbe| {
                    args.borrow_mut()
                        .insert((image, spec.clone(), r.addr.0), r.usdt_args.clone());
                    hotprobe::typed::usdt_capture(r)
                }) as hotprobe::CaptureChooser)
            }));
        }
        if !named {
            return None;
        }
        let typings = self.typings.clone();
        Some(Rc::new(move |at: &hotprobe::ExecPlacing| {
            let typing = Rc::new(Typing::new(at.pid));
            typings
                .borrow_mut()
                .insert((at.image, spec.clone()), typing.clone());
            Some(typing.name_chooser())
        }))
    }

    /// The condition `text` of spec `spec` for probe `p`, placed in image
    /// `image` (`usdt`: on a marker), or why it does not compile there.
    fn compile(
        &self,
        image: usize,
        spec: &str,
        usdt: bool,
        p: &Placement,
        text: &str,
    ) -> Result<Cond, String> {
        if p.mechanism == hotprobe::Mechanism::Pending {
            return Err(format!(
                "{} is not loaded yet: the condition names {}, which are read when it is placed",
                p.module,
                if usdt {
                    "marker arguments"
                } else {
                    "parameters"
                }
            ));
        }
        if usdt {
            let key = (image, spec.to_string(), p.addr.0);
            let args = self.usdt_args.borrow().get(&key).cloned();
            let args = args.ok_or_else(|| "its marker's arguments were not noted".to_string())?;
            return hotprobe::cond::usdt_cond(text, &args).map_err(|e| e.to_string());
        }
        let typing = self
            .typings
            .borrow()
            .get(&(image, spec.to_string()))
            .cloned();
        let typing = typing.ok_or_else(|| "its parameters were not noted".to_string())?;
        crate::cond::named_cond(&typing, p, text).map_err(|e| e.to_string())
    }
}

/// The recording sink of `count -f` with conditions: the probes placed in
/// a program a followed process executes get the condition of the spec
/// they were placed for (their ids are new; the forked processes' are
/// their parent's), compiled for that program where it names parameters
/// or marker arguments. Where it does not compile (no DWARF, no such
/// parameter), that is said and the probe's hits are not counted (the
/// sink says how many at the end).
struct ExecConds<'a> {
    sink: &'a mut CountSink,
    /// Each spec's condition text and, unless it names parameters or USDT
    /// arguments (compiled per image), the condition.
    by_label: HashMap<String, (String, Option<Cond>)>,
    notes: &'a ExecNotes,
}

impl hotprobe::EventSink for ExecConds<'_> {
    fn event(&mut self, ev: &hotprobe::RecordedEvent) -> Result<(), hotprobe::SinkError> {
        self.sink.event(ev)
    }
    fn event_data(
        &mut self,
        ev: &hotprobe::RecordedEvent,
        data: &[u8],
    ) -> Result<(), hotprobe::SinkError> {
        self.sink.event_data(ev, data)
    }
    fn lost(&mut self, tid: u32, ts: u64, count: u64) -> Result<(), hotprobe::SinkError> {
        self.sink.lost(tid, ts, count)
    }
    fn pending_armed(&mut self, armed: &hotprobe::ArmedPending) -> Result<(), hotprobe::SinkError> {
        self.sink.pending_armed(armed)?;
        for n in self.sink.take_notices() {
            errln!("hotprobe: {n}");
        }
        Ok(())
    }
    fn exec_image(&mut self, image: &hotprobe::ExecImage) -> Result<(), hotprobe::SinkError> {
        for p in &image.placements {
            let usdt = p.label.starts_with(hotprobe::symbols::USDT_PREFIX);
            match self.by_label.get(&p.label) {
                None => self.sink.add(p.id, None),
                Some((_, Some(c))) => self.sink.add(p.id, Some(c.clone())),
                // On a library the new image loads later: compiled when
                // it does.
                Some((text, None)) if p.mechanism == hotprobe::Mechanism::Pending && !usdt => {
                    let key = (image.index, p.label.clone());
                    let typing = self.notes.typings.borrow().get(&key).cloned();
                    let typing = typing.unwrap_or_else(|| Rc::new(Typing::new(image.pid)));
                    let c = hotprobe::cond::DeferredCond::new(text, typing);
                    self.sink.add_pending_named(p.id, c, 6);
                }
                Some((text, None)) => {
                    match self.notes.compile(image.index, &p.label, usdt, p, text) {
                        Ok(c) if usdt => self.sink.add_usdt(p.id, c),
                        Ok(c) => self.sink.add(p.id, Some(c)),
                        Err(why) => {
                            errln!(
                                "hotprobe: pid {} ({}): `{} if {text}`: {why}; its hits there are not counted",
                                image.pid,
                                image.comm,
                                p.label
                            );
                            self.sink.add_uncountable(p.id);
                            self.notes.uncounted.borrow_mut().insert(p.id.0);
                        }
                    }
                }
            }
        }
        self.sink.exec_image(image)
    }
}
