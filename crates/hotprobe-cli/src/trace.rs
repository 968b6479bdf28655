//! `hotprobe trace`: a live call tree in the manner of `uftrace replay`.
//!
//! ```text
//! # DURATION     TID     FUNCTION
//!             [ 41234] | fib(3) {
//!             [ 41234] |   fib(2) {
//!    1.234 us [ 41234] |   } /* fib */ = 1
//!   12.345 us [ 41234] | } /* fib */ = 2
//! ```
//! Each traced function gets a `Record` probe: on the fast path (patch or
//! jump) where the site allows, so durations are those of the real calls,
//! else a trap return probe. The session hands the recorded entries and
//! exits to [`LiveTree`], which prints them as they are drained;
//! indentation is the call depth of followed calls on that thread.
//!
//! The lines of a function placed on a trap (in-process or ptrace: µs a
//! hit, in its times) have `*` in their first column, as `replay` and
//! `report` mark them, and the same legend line follows the tree:
//!
//! ```text
//! *           [ 41234] |   leaf() {
//! *  3.210 us [ 41234] |   } /* leaf */
//! # * on a trap (in-process trap: µs a hit, left in these times)
//! ```

use crate::out::{self, errln, outln};
use crate::session::Traced;
use anyhow::{bail, Result};
use hotprobe::calibration::CostClass;
use hotprobe::trace::{fmt_duration, TrapMarks};
use hotprobe::typed::{self, TypedShapes, Typing};
use hotprobe::{
    Action, EventSink, FastPathConfig, MechanismChoice, Placement, RecordedEvent, SessionConfig,
    SinkError, KIND_EXIT, KIND_HIT,
};
use std::collections::HashMap;
use std::ffi::OsString;
use std::rc::Rc;
use std::time::Duration;

/// What `trace` needs from the command line.
pub struct TraceOptions<'a> {
    /// Function specs.
    pub probes: &'a [String],
    /// Attach to this process.
    pub pid: Option<i32>,
    /// Or start this command.
    pub cmd: &'a [OsString],
    /// Show this many argument registers and the return value.
    pub args: Option<usize>,
    /// `-a`: every parameter and the return value, typed from DWARF.
    pub auto_args: bool,
    /// Live calls followed at once per function.
    pub maxactive: usize,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Print the count table at the end.
    pub summary: bool,
    /// `--stacks`: the stacks at the entries, counted, at the end.
    pub stacks: bool,
    /// `--mechanism`.
    pub mechanism: MechanismChoice,
    /// `--no-traps`: leave out what needs a trap.
    pub no_traps: bool,
    /// `-f`: follow forked children.
    pub follow_forks: bool,
    /// `-f` without `--no-follow-exec`: probes placed again in each
    /// program a followed process executes.
    pub follow_exec: bool,
    /// `--exe`/`--comm`: every matching process, running or started later.
    pub new_processes: Option<hotprobe::ProcessMatch>,
    /// `--force`: probe addresses not shown to start an instruction.
    pub force: bool,
}

/// The column header, as uftrace prints it.
pub const HEADER: &str = "# DURATION     TID     FUNCTION";

/// A register value as the user most likely wants it: small values
/// (|v| < 2^32, as signed) in decimal, others (pointers) in hex.
pub fn format_value(v: u64) -> String {
    let s = v as i64;
    if s.unsigned_abs() < (1 << 32) {
        s.to_string()
    } else {
        format!("{v:#x}")
    }
}

/// A line's start up to its thread: the mark column (`*` for a function
/// placed on the trap mechanism `on_trap`, noted in `marks` for the
/// legend, as `replay` marks its lines), then the call's duration `dur`
/// as `replay` writes it (`  1.234 us`, yellow from 1 ms and red from 1 s
/// when stdout has colours), or blanks for a line without one.
fn lead(marks: &mut TrapMarks, on_trap: Option<&str>, dur: Option<Duration>) -> String {
    let mut s = String::from(" ");
    marks.mark(&mut s, on_trap);
    match dur {
        Some(d) => {
            let text = fmt_duration(d.as_nanos() as u64);
            s.push_str(&if d >= Duration::from_secs(1) {
                out::paint(out::SLOWER, &text)
            } else if d >= Duration::from_millis(1) {
                out::paint(out::SLOW, &text)
            } else {
                text
            });
        }
        None => s.push_str(&" ".repeat(10)),
    }
    s
}

/// The trap mechanism `p` was placed on, by the name `record` gives it
/// in a trace's costs and `replay` and `report` mark its lines with
/// ("in-process trap", "ptrace trap"); `None` on the fast path.
fn trap_label(p: &Placement) -> Option<&'static str> {
    CostClass::of(p)
        .filter(|_| p.mechanism.is_trap())
        .map(CostClass::label)
}

/// The live call tree: an [`EventSink`] printing each recorded entry and
/// exit as it is drained (fast-path rings and trap record probes alike).
pub struct LiveTree {
    names: HashMap<u32, String>,
    /// Probe id → its spec as given (hit events: `f+off`).
    labels: HashMap<u32, String>,
    args: Option<usize>,
    /// Typed probes' shapes (their events come with captured bytes).
    typed: TypedShapes,
    /// What typed them: asked again for a pending probe's shapes when it
    /// is armed in a module loaded later.
    typing: Option<Rc<Typing>>,
    /// Probe id → the trap mechanism it was placed on (none for the fast
    /// path): its lines are marked.
    traps: HashMap<u32, &'static str>,
    /// The mechanisms of the lines marked so far.
    marks: TrapMarks,
    /// Per thread: the open calls (probe, entry time stamp).
    stacks: HashMap<u32, Vec<(u32, u64)>>,
    /// TSC ticks per ns.
    ticks_per_ns: f64,
    /// `--stacks`: names each entry's own stack.
    call_stacks: Option<hotprobe::stacks::StackNames>,
}

impl LiveTree {
    /// A printer for the probes `placed`, showing `args` argument
    /// registers (and return values). Measures the TSC rate (10 ms).
    pub fn new(placed: &[Placement], args: Option<usize>) -> LiveTree {
        let names = placed
            .iter()
            .map(|p| {
                let name = p
                    .function
                    .clone()
                    .unwrap_or_else(|| p.label.trim_end_matches("%return").to_string());
                (p.id.0, name)
            })
            .collect();
        let labels = placed.iter().map(|p| (p.id.0, p.label.clone())).collect();
        let traps = placed
            .iter()
            .filter_map(|p| Some((p.id.0, trap_label(p)?)))
            .collect();
        LiveTree {
            names,
            labels,
            traps,
            marks: TrapMarks::default(),
            args,
            typed: TypedShapes::default(),
            typing: None,
            stacks: HashMap::new(),
            ticks_per_ns: tsc_ticks_per_ns(),
            call_stacks: None,
        }
    }
}

/// The TSC rate, from two (TSC, CLOCK_MONOTONIC) pairs 10 ms apart.
pub(crate) use hotprobe::tsc_ticks_per_ns;

impl LiveTree {
    /// Prints typed probes' values (see [`hotprobe::typed`]).
    pub fn with_types(mut self, typed: TypedShapes) -> LiveTree {
        self.typed = typed;
        self
    }

    /// Pending probes armed later are typed by `typing` (see
    /// [`EventSink::pending_armed`]).
    pub fn with_typing(mut self, typing: Rc<Typing>) -> LiveTree {
        self.typing = Some(typing);
        self
    }

    /// `--stacks`: each entry line ends with the call's own stack
    /// (` /* <- caller <- its caller … */`), where the agent walked it.
    pub fn with_call_stacks(mut self, names: hotprobe::stacks::StackNames) -> LiveTree {
        self.call_stacks = Some(names);
        self
    }

    /// The legend of the lines marked `*` (functions placed on a trap),
    /// worded as `replay`'s: their times hold the traps' costs. `None`
    /// when no line was marked.
    pub fn trap_legend(&self) -> Option<String> {
        self.marks.legend(&[])
    }

    fn print(&mut self, ev: &RecordedEvent, typed: Option<Vec<String>>) {
        let tid = ev.tid;
        let name = self
            .names
            .get(&ev.probe_id)
            .map_or("?", String::as_str)
            .to_string();
        let on_trap = self.traps.get(&ev.probe_id).copied();
        let marks = &mut self.marks;
        let stack = self.stacks.entry(tid).or_default();
        match ev.kind {
            KIND_EXIT => {
                // Frames left without an exit (longjmp) are closed with it.
                let pos = stack.iter().rposition(|(p, _)| *p == ev.probe_id);
                let (depth, dur) = match pos {
                    Some(i) => {
                        let start = stack[i].1;
                        stack.truncate(i);
                        let ns = ev.tsc.saturating_sub(start) as f64 / self.ticks_per_ns;
                        (i, Duration::from_nanos(ns as u64))
                    }
                    None => (stack.len(), Duration::ZERO),
                };
                let indent = "  ".repeat(depth);
                let ret = match (typed, self.args) {
                    (Some(v), _) if ev.reserved & hotprobe::fastpath::EXIT_UNWOUND != 0 => {
                        let _ = v;
                        String::new()
                    }
                    (Some(v), _) => v.first().map_or(String::new(), |r| format!(" = {r}")),
                    (None, Some(_)) if ev.nargs > 0 => format!(" = {}", format_value(ev.args[0])),
                    _ => String::new(),
                };
                outln!(
                    "{} [{tid:>6}] | {indent}}} /* {name} */{ret}",
                    lead(marks, on_trap, Some(dur))
                );
            }
            KIND_HIT => {
                // An instruction inside a function: a point, not a call.
                let indent = "  ".repeat(stack.len());
                let label = self.labels.get(&ev.probe_id).unwrap_or(&name);
                // A typed hit (a USDT marker's arguments) shows its values.
                let values = typed.map_or(String::new(), |v| format!(" ({})", v.join(", ")));
                outln!(
                    "{} [{tid:>6}] | {indent}/* {}{values} */",
                    lead(marks, on_trap, None),
                    out::paint(out::NAME, label)
                );
            }
            _ => {
                let indent = "  ".repeat(stack.len());
                stack.push((ev.probe_id, ev.tsc));
                let args = match (typed, self.args) {
                    (Some(v), _) => v.join(", "),
                    (None, Some(n)) => ev.args[..n.min(ev.nargs as usize)]
                        .iter()
                        .map(|v| format_value(*v))
                        .collect::<Vec<_>>()
                        .join(", "),
                    (None, None) => String::new(),
                };
                let from = match self.call_stacks.as_ref().and_then(|n| n.of_event(ev)) {
                    Some(cs) => {
                        let more = if cs.truncated { " <- [truncated]" } else { "" };
                        format!(" /* <- {}{more} */", cs.frames.join(" <- "))
                    }
                    None => String::new(),
                };
                outln!(
                    "{} [{tid:>6}] | {indent}{}({args}) {{{from}",
                    lead(marks, on_trap, None),
                    out::paint(out::NAME, &name)
                );
            }
        }
    }
}

impl EventSink for LiveTree {
    fn event(&mut self, ev: &RecordedEvent) -> Result<(), SinkError> {
        self.print(ev, None);
        Ok(())
    }

    fn event_data(&mut self, ev: &RecordedEvent, data: &[u8]) -> Result<(), SinkError> {
        let typed = self.typed.format(ev.probe_id, ev.kind == KIND_EXIT, data);
        self.print(ev, typed);
        Ok(())
    }

    fn lost(&mut self, tid: u32, _ts: u64, count: u64) -> Result<(), SinkError> {
        outln!(
            "{:>11} [{tid:>6}] | /* {count} events lost: the ring was full */",
            ""
        );
        Ok(())
    }

    /// A pending probe armed in a module the program loaded: its typed
    /// values are shown from now on (planned at its arming).
    fn pending_armed(&mut self, armed: &hotprobe::ArmedPending) -> Result<(), SinkError> {
        // Its lines are marked as the mechanism it was armed on says.
        let p = &armed.placement;
        match trap_label(p) {
            Some(label) => self.traps.insert(p.id.0, label),
            None => self.traps.remove(&p.id.0),
        };
        if let Some(typing) = &self.typing {
            self.typed.note_armed(typing, armed);
        }
        Ok(())
    }

    /// `-f` across exec: the probes of the program a process executed,
    /// said in the tree with its pid and command name.
    fn exec_image(&mut self, image: &hotprobe::ExecImage) -> Result<(), SinkError> {
        let more = LiveTree::new(&image.placements, self.args);
        self.names.extend(more.names);
        self.labels.extend(more.labels);
        self.traps.extend(more.traps);
        outln!(
            "{:>11} [{:>6}] | /* pid {} executed {} ({}) */",
            "",
            image.pid,
            image.pid,
            image.path.display(),
            image.comm
        );
        Ok(())
    }
}

/// Run `trace`; returns hotprobe's exit code (the command's).
pub fn run(o: &TraceOptions<'_>) -> Result<u8> {
    if let Some(n) = o.args {
        if n > 6 {
            bail!("--args {n}: at most 6 argument registers (rdi, rsi, rdx, rcx, r8, r9)");
        }
    }
    let typed_specs = o.auto_args || o.probes.iter().any(|s| s.contains(['(', ' ']));
    let config = SessionConfig {
        mechanism: o.mechanism,
        maxactive: o.maxactive,
        fast_path: FastPathConfig {
            // Typed values in integer registers come from the recorded ones.
            record_args: if typed_specs {
                6
            } else {
                o.args.unwrap_or(0) as u8
            },
            stacks: o.stacks,
            ..FastPathConfig::default()
        },
        follow_forks: o.follow_forks,
        follow_exec: o.follow_exec,
        force: o.force,
        no_traps: o.no_traps,
        ..SessionConfig::default()
    };
    let specs = o
        .probes
        .iter()
        .map(|s| typed::split_spec(s))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut t = match &o.new_processes {
        Some(what) => Traced::waiting(config, what.clone())?,
        None => Traced::open(config, o.pid, o.cmd)?,
    };
    let typing = Rc::new(Typing::new(t.pid));
    let mut placed: Vec<Placement> = Vec::new();
    for (func, exprs) in specs {
        // One function named by two specs would be traced twice, each call
        // shown twice (and typed by one spec's shapes only): an explicit
        // second name is refused, a pattern's overlap left out below.
        if hotprobe::symbols::is_pattern(&func) && o.new_processes.is_none() {
            if let Ok(rs) = t.session.resolve(t.target, &func) {
                if !rs.is_empty() && rs.iter().all(|r| placed.iter().any(|p| p.addr == r.addr)) {
                    errln!("hotprobe: {func}: every function it matches is traced already");
                    continue;
                }
            }
        } else if o.new_processes.is_none() {
            if let Ok(rs) = t.session.resolve(t.target, &func) {
                if let Some(first) = placed.iter().find(|p| rs.iter().any(|r| r.addr == p.addr)) {
                    let first = first.label.clone();
                    t.abandon();
                    bail!(crate::UsageError(format!(
                        "`{func}`: an earlier spec (`{first}`) traces that function already: \
                         name each function once (with every expression it should show)"
                    )));
                }
            }
        }
        // A USDT marker's arguments are always shown: its note types them.
        let auto = o.auto_args || func.starts_with(hotprobe::symbols::USDT_PREFIX);
        t.session
            .set_xmm_layout(typing.xmm_chooser_for(exprs.clone(), auto));
        t.session
            .set_fast_capture(typing.fast_chooser_for(exprs.clone(), auto));
        t.session.set_capture(typing.chooser_for(exprs, auto));
        let added = t.add_all(std::slice::from_ref(&func), |_| Action::Record);
        t.session.set_capture(None);
        t.session.set_xmm_layout(None);
        t.session.set_fast_capture(None);
        match added.and_then(|a| typing.check().map(|()| a).map_err(anyhow::Error::from)) {
            Ok(p) => {
                for p in p {
                    // A pending probe has no address yet (0 for all):
                    // two on a library not loaded are two functions.
                    let pending = p.mechanism == hotprobe::Mechanism::Pending;
                    if !pending && placed.iter().any(|q| q.addr == p.addr) {
                        // A pattern's match another spec traces already.
                        let _ = t.session.remove_probe(p.id);
                        continue;
                    }
                    placed.push(p);
                }
            }
            Err(e) => {
                t.abandon();
                return Err(e);
            }
        }
    }
    if let Err(e) = t.check_placed(&placed) {
        t.abandon();
        return Err(e);
    }
    // -a: a function without type information shows its raw argument
    // registers and return value (all six: how many it takes is unknown),
    // as `--args 6` would; a typed one its values.
    let shown_args = o.args.or(o.auto_args.then_some(6));
    let untyped_shown = match shown_args {
        Some(_) => "shown with its raw argument registers and return value",
        None => "shown without arguments",
    };
    crate::session::note_untyped(&typing, untyped_shown);
    let sources_at_start = note_type_sources(&typing, 0);
    let mut tree = LiveTree::new(&placed, shown_args)
        .with_types(TypedShapes::new(&typing, &placed))
        .with_typing(typing.clone());
    let untyped_at_start = typing.untyped().len();
    if o.stacks {
        tree = tree.with_call_stacks(t.session.stack_names());
    }
    outln!("{HEADER}");
    let mut typed_sink = typed::RegisterTyped::new(&mut tree, &typing, &placed);
    let ran = t.run(&placed, o.duration, Some(&mut typed_sink));
    // The lines marked `*`: what they mean, after the tree as `replay`
    // says it.
    if let Some(legend) = tree.trap_legend() {
        outln!("{legend}");
    }
    note_untyped_armed(&typing, untyped_at_start, untyped_shown);
    note_type_sources(&typing, sources_at_start);
    if o.stacks {
        // With the probes placed in each image a followed process executed.
        let (rows, _) =
            crate::session::with_exec_rows(&t.session, placed.clone(), &mut Default::default());
        crate::stacks::print_stacks(&t.session, &rows);
    }
    if o.summary {
        outln!();
        let mut from_pattern = Default::default();
        let (rows, comms) = crate::session::with_exec_rows(&t.session, placed, &mut from_pattern);
        let per_process = o.follow_forks || o.new_processes.is_some();
        let extras = crate::session::TableExtras {
            comms: comms.as_ref(),
            ..Default::default()
        };
        crate::session::print_table_with(&t.session, &rows, per_process, &extras);
    }
    t.print_skipped();
    crate::session::note_vfork_unrecorded(&t.session);
    // Probes placed at an exec are not typed (the typing is the first
    // image's): said, not silently shown bare.
    let typed_asked = o.auto_args || o.probes.iter().any(|p| p.contains(['(', ' ']));
    let at_exec: usize = t
        .session
        .exec_images()
        .iter()
        .map(|i| i.placements.len())
        .sum();
    if typed_asked && at_exec > 0 {
        errln!(
            "hotprobe: {at_exec} probes placed in programs started by exec show no typed values \
             (-a and argument names apply to the first program): trace the program itself"
        );
    }
    ran?;
    Ok(t.exit_code())
}

/// Says where the types of the functions typed since the `before`th came
/// from, when not from the function's own file (a separate debug file, or
/// the table of libc prototypes), one line per source; returns how many
/// functions were said in all.
pub(crate) fn note_type_sources(typing: &Typing, before: usize) -> usize {
    let sources = typing.type_sources();
    let new = sources.get(before..).unwrap_or_default();
    let mut order: Vec<&hotprobe::typed::TypeSource> = Vec::new();
    for (_, s) in new {
        if !order.contains(&s) {
            order.push(s);
        }
    }
    for source in order {
        let funcs: Vec<&str> = new
            .iter()
            .filter(|(_, s)| s == source)
            .map(|(f, _)| f.as_str())
            .collect();
        let which = match funcs.len() {
            1..=5 => funcs.join(", "),
            n => format!("{n} functions (e.g. {})", funcs[..3].join(", ")),
        };
        errln!("hotprobe: types of {which} from {source}");
    }
    sources.len()
}

/// Says which pending probes armed during the run (their library loaded
/// later) had no DWARF, so were shown without typed values, as
/// `note_untyped` says it of those placed at start (`before`: how many
/// untyped functions were said then; `shown`: how their calls are shown).
pub(crate) fn note_untyped_armed(typing: &Typing, before: usize, shown: &str) {
    // Argument names a pending probe's function turned out not to have
    // (or no DWARF for them): shown without values, said here.
    if let Err(e) = typing.check() {
        errln!("hotprobe: {e}: {shown}");
    }
    let untyped = typing.untyped();
    let Some(armed) = untyped.get(before..).filter(|u| !u.is_empty()) else {
        return;
    };
    let which = match armed.len() {
        1..=5 => armed.join(", "),
        n => format!("{n} functions (e.g. {})", armed[..3].join(", ")),
    };
    errln!(
        "hotprobe: no DWARF for {which} in the library the program loaded (build it with -g): \
         {shown}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_durations() {
        assert_eq!(format_value(7), "7");
        assert_eq!(format_value(u64::MAX), "-1");
        assert_eq!(format_value(0x7ffd_1234_5678), "0x7ffd12345678");
        let mut marks = TrapMarks::default();
        let mut lead = |on_trap, d| lead(&mut marks, on_trap, d);
        assert_eq!(lead(None, Some(Duration::from_nanos(1234))), "   1.234 us");
        assert_eq!(lead(None, Some(Duration::from_micros(2500))), "   2.500 ms");
        assert_eq!(lead(None, Some(Duration::from_millis(1500))), "   1.500  s");
        // A call of 1000 s or more keeps the mark column.
        assert_eq!(lead(None, Some(Duration::from_secs(1234))), " 1234.000  s");
        assert_eq!(lead(None, None), " ".repeat(11));
        assert_eq!(lead(None, Some(Duration::ZERO)).len(), 11);
        let trap = Some("in-process trap");
        assert_eq!(lead(trap, Some(Duration::from_nanos(950))), "*  0.950 us");
        assert_eq!(lead(trap, None), format!("*{}", " ".repeat(10)));
        assert_eq!(
            marks.legend(&[]).as_deref(),
            Some("# * on a trap (in-process trap: µs a hit, left in these times)")
        );
    }
}
