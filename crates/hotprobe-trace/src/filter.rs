//! Filters at the source and aggregation: the per-thread state machine
//! between the drained events and the encoder.
//!
//! [`Filter`] is the configuration; [`CompiledFilter`] binds it to a symbol
//! table (one decision per probe id, O(1) per event); [`ThreadFilter`] is the
//! per-thread state: a stack of open frames, some *pending* (entries not yet
//! written). Nothing is allocated per event once the stack has grown to the
//! call depth. The agent can run the same logic.
//!
//! Order of the filters for an entry: pattern (include/exclude), depth,
//! sampling; the decision is remembered in the frame and applied to the
//! matching exit, so an entry and its exit are kept or dropped together.
//! Minimum duration is decided at the exit: the entry is held (pending) until
//! its exit arrives — a call shorter than the bound is then dropped — or until
//! a nested record must be written, which writes the held entries first
//! (their exits are then always written; counted in
//! [`FilterStats::kept_short`]). Since a call's children are never longer than
//! the call, the calls kept are exactly those lasting at least the bound
//! unless a hit or an unfiltered record nested in a short call forces it out.
//!
//! Aggregation: an entry that is still pending when its exit arrives is
//! emitted as one [`Record::Call`].

use hotprobe_symbols::NamePattern;
use serde::{Deserialize, Serialize};

use crate::error::{Result, TraceError};
use crate::event::{Args, EventKind, Record, TimeBase, TraceEvent};
use crate::symbols::SymbolTable;

/// Filter configuration (what `record` takes on its command line).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Filter {
    /// Keep only functions matching one of these patterns (`*` matches any
    /// run of characters, `?` one character, `[abc]` one of a class; see
    /// [`glob_match`]); empty keeps all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub include: Vec<String>,
    /// Drop functions matching one of these patterns.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude: Vec<String>,
    /// Keep calls nested at most this deep (1 = outermost recorded calls);
    /// the depth counts the open calls that passed the pattern filter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_depth: Option<u32>,
    /// Drop calls lasting less than this many nanoseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_duration_ns: Option<u64>,
    /// Keep one call in N, per function and thread (the first, the N+1-th, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample_every: Option<u32>,
}

impl Filter {
    /// No filtering.
    pub fn none() -> Filter {
        Filter::default()
    }
    /// Adds an include pattern.
    pub fn include(mut self, pat: impl Into<String>) -> Filter {
        self.include.push(pat.into());
        self
    }
    /// Adds an exclude pattern.
    pub fn exclude(mut self, pat: impl Into<String>) -> Filter {
        self.exclude.push(pat.into());
        self
    }
    /// Sets the maximum depth.
    pub fn max_depth(mut self, d: u32) -> Filter {
        self.max_depth = Some(d);
        self
    }
    /// Sets the minimum duration.
    pub fn min_duration_ns(mut self, ns: u64) -> Filter {
        self.min_duration_ns = Some(ns);
        self
    }
    /// Sets 1-in-N sampling.
    pub fn sample_every(mut self, n: u32) -> Filter {
        self.sample_every = Some(n);
        self
    }
    /// True when nothing is filtered.
    pub fn is_empty(&self) -> bool {
        *self == Filter::default()
    }
}

/// Whether `name` matches the glob `pat` ([`hotprobe_symbols::pattern`]:
/// `*` any run of characters, `?` one character, `[abc]` a class; a pattern
/// that does not compile matches only itself).
pub fn glob_match(pat: &str, name: &str) -> bool {
    hotprobe_symbols::pattern::matches(pat, name)
}

/// A filter pattern compiled once ([`glob_match`] semantics).
struct Pattern<'a> {
    text: &'a str,
    glob: Option<NamePattern>,
}

impl<'a> Pattern<'a> {
    fn new(text: &'a str) -> Self {
        Pattern {
            text,
            glob: NamePattern::new(text).ok(),
        }
    }

    fn matches(&self, name: &str) -> bool {
        match &self.glob {
            Some(g) => g.matches(name),
            None => self.text == name,
        }
    }
}

/// Events each filter removed (an entry and its exit count as two).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilterStats {
    /// Removed by include/exclude patterns.
    pub pattern: u64,
    /// Removed by the maximum depth.
    pub depth: u64,
    /// Removed by the minimum duration.
    pub duration: u64,
    /// Removed by sampling.
    pub sampling: u64,
    /// Calls shorter than the minimum duration kept because a nested record
    /// had to be written first.
    pub kept_short: u64,
    /// Timestamps that went backwards and were clamped to the previous one.
    pub clamped: u64,
    /// Exits that matched no open entry.
    pub orphan_exits: u64,
}

impl FilterStats {
    /// Sum of the removals.
    pub fn removed(&self) -> u64 {
        self.pattern + self.depth + self.duration + self.sampling
    }
    /// Adds another thread's counters.
    pub fn add(&mut self, o: &FilterStats) {
        self.pattern += o.pattern;
        self.depth += o.depth;
        self.duration += o.duration;
        self.sampling += o.sampling;
        self.kept_short += o.kept_short;
        self.clamped += o.clamped;
        self.orphan_exits += o.orphan_exits;
    }
}

#[derive(Clone, Copy, Debug)]
struct ProbeRule {
    pattern_ok: bool,
    nargs: u8,
    retval: bool,
    /// A phase marker: never removed by depth, sampling or duration.
    marker: bool,
}

/// A [`Filter`] bound to a symbol table and a time base.
#[derive(Clone, Debug)]
pub struct CompiledFilter {
    rules: Vec<ProbeRule>,
    default_rule: ProbeRule,
    max_depth: u32,
    min_ticks: u64,
    sample_every: u32,
    aggregate: bool,
}

impl CompiledFilter {
    /// Compiles `f` for the probes of `symbols` (probes missing from the table
    /// match only when there are no include patterns and keep no arguments).
    /// `aggregate` = false writes every entry and exit as its own record.
    pub fn new(
        f: &Filter,
        symbols: &SymbolTable,
        time: &TimeBase,
        aggregate: bool,
    ) -> Result<CompiledFilter> {
        if f.sample_every == Some(0) {
            return Err(TraceError::Invalid("sampling 1 in 0".into()));
        }
        if f.max_depth == Some(0) {
            return Err(TraceError::Invalid("maximum depth 0".into()));
        }
        let include: Vec<Pattern<'_>> = f.include.iter().map(|p| Pattern::new(p)).collect();
        let exclude: Vec<Pattern<'_>> = f.exclude.iter().map(|p| Pattern::new(p)).collect();
        let pattern_ok = |name: &str| {
            (include.is_empty() || include.iter().any(|p| p.matches(name)))
                && !exclude.iter().any(|p| p.matches(name))
        };
        let default_rule = ProbeRule {
            pattern_ok: f.include.is_empty(),
            nargs: 0,
            retval: false,
            marker: false,
        };
        let rules = (0..symbols.id_bound())
            .map(|id| match symbols.get(id) {
                Some(s) => ProbeRule {
                    pattern_ok: pattern_ok(&s.name),
                    nargs: s.nargs,
                    retval: s.retval,
                    marker: s.kind == crate::ProbeKind::Marker,
                },
                None => default_rule,
            })
            .collect();
        Ok(CompiledFilter {
            rules,
            default_rule,
            max_depth: f.max_depth.unwrap_or(u32::MAX),
            min_ticks: f.min_duration_ns.map_or(0, |ns| time.ticks_of_ns(ns)),
            sample_every: f.sample_every.unwrap_or(1),
            aggregate,
        })
    }

    /// A filter that keeps everything and all arguments, aggregating.
    pub fn pass_all() -> CompiledFilter {
        let r = ProbeRule {
            pattern_ok: true,
            nargs: crate::MAX_ARGS as u8,
            retval: true,
            marker: false,
        };
        CompiledFilter {
            rules: Vec::new(),
            default_rule: r,
            max_depth: u32::MAX,
            min_ticks: 0,
            sample_every: 1,
            aggregate: true,
        }
    }

    #[inline]
    fn rule(&self, probe: u32) -> ProbeRule {
        *self.rules.get(probe as usize).unwrap_or(&self.default_rule)
    }
}

/// Where a [`ThreadFilter`] sends the records it keeps.
pub trait Sink {
    /// One record, in timestamp order (timestamps in ticks of the time base).
    fn record(&mut self, r: &Record);
}

impl Sink for Vec<Record> {
    fn record(&mut self, r: &Record) {
        self.push(*r);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Kept, entry not written yet.
    Pending,
    /// Kept, entry written.
    Written,
    /// Removed at entry by the pattern filter.
    DropPattern,
    /// Removed at entry by the depth filter.
    DropDepth,
    /// Removed at entry by sampling.
    DropSample,
}

#[derive(Clone, Copy, Debug)]
struct Frame {
    probe: u32,
    ts: u64,
    args: Args,
    state: State,
    in_tree: bool,
}

/// Per-thread filter and aggregation state.
#[derive(Clone, Debug, Default)]
pub struct ThreadFilter {
    frames: Vec<Frame>,
    /// Index of the lowest pending frame (`frames.len()` when none).
    first_pending: usize,
    tree_depth: u32,
    samples: Vec<u32>,
    last_ts: u64,
    stats: FilterStats,
}

impl ThreadFilter {
    /// A fresh thread.
    pub fn new() -> ThreadFilter {
        ThreadFilter::default()
    }

    /// What this thread's filters removed so far.
    pub fn stats(&self) -> &FilterStats {
        &self.stats
    }

    /// Feeds one event; records to write go to `sink`.
    #[inline]
    pub fn push(&mut self, f: &CompiledFilter, ev: &TraceEvent, sink: &mut impl Sink) {
        let mut ts = ev.ts;
        if ts < self.last_ts {
            ts = self.last_ts;
            self.stats.clamped += 1;
        }
        self.last_ts = ts;
        let rule = f.rule(ev.probe);
        match ev.kind {
            EventKind::Entry => self.entry(f, rule, ev, ts, sink),
            EventKind::Exit => self.exit(f, rule, ev, ts, sink),
            EventKind::Hit => {
                if !rule.pattern_ok {
                    self.stats.pattern += 1;
                } else if self.tree_depth > f.max_depth {
                    self.stats.depth += 1;
                } else {
                    self.flush(sink);
                    sink.record(&Record::Hit {
                        ts,
                        probe: ev.probe,
                        args: ev.args.truncated(rule.nargs as usize),
                    });
                }
            }
        }
    }

    #[inline]
    fn entry(
        &mut self,
        f: &CompiledFilter,
        rule: ProbeRule,
        ev: &TraceEvent,
        ts: u64,
        sink: &mut impl Sink,
    ) {
        let state = if !rule.pattern_ok {
            State::DropPattern
        } else if rule.marker {
            State::Pending
        } else if self.tree_depth >= f.max_depth {
            State::DropDepth
        } else if f.sample_every > 1 && !self.sample(ev.probe, f.sample_every) {
            State::DropSample
        } else {
            State::Pending
        };
        let args = ev.args.truncated(rule.nargs as usize);
        match state {
            State::DropPattern => self.stats.pattern += 1,
            State::DropDepth => self.stats.depth += 1,
            State::DropSample => self.stats.sampling += 1,
            _ => {}
        }
        let mut state = state;
        if state == State::Pending {
            if f.min_ticks == 0 {
                // Only the innermost entry is held (one event of look-ahead).
                self.flush(sink);
            }
            if !f.aggregate && f.min_ticks == 0 {
                sink.record(&Record::Entry {
                    ts,
                    probe: ev.probe,
                    args,
                });
                state = State::Written;
            }
        }
        let in_tree = rule.pattern_ok;
        if in_tree {
            self.tree_depth += 1;
        }
        let was_len = self.frames.len();
        self.frames.push(Frame {
            probe: ev.probe,
            ts,
            args,
            state,
            in_tree,
        });
        if state != State::Pending && self.first_pending == was_len {
            self.first_pending = self.frames.len();
        }
    }

    fn sample(&mut self, probe: u32, every: u32) -> bool {
        let i = probe as usize;
        if i >= self.samples.len() {
            if i >= 1 << 24 {
                return true;
            }
            self.samples.resize(i + 1, 0);
        }
        let c = self.samples[i];
        self.samples[i] = if c + 1 >= every { 0 } else { c + 1 };
        c == 0
    }

    #[inline]
    fn pop(&mut self) -> Option<Frame> {
        let fr = self.frames.pop()?;
        if fr.in_tree {
            self.tree_depth -= 1;
        }
        if self.first_pending > self.frames.len() {
            self.first_pending = self.frames.len();
        }
        Some(fr)
    }

    #[inline]
    fn exit(
        &mut self,
        f: &CompiledFilter,
        rule: ProbeRule,
        ev: &TraceEvent,
        ts: u64,
        sink: &mut impl Sink,
    ) {
        let Some(pos) = self.frames.iter().rposition(|fr| fr.probe == ev.probe) else {
            // Entered before recording started (or the entry was lost).
            self.stats.orphan_exits += 1;
            if !rule.pattern_ok {
                self.stats.pattern += 1;
            } else if self.tree_depth >= f.max_depth {
                self.stats.depth += 1;
            } else {
                self.flush(sink);
                sink.record(&Record::Exit {
                    ts,
                    probe: ev.probe,
                    ret: ev.ret.filter(|_| rule.retval),
                    unwound: ev.unwound,
                });
            }
            return;
        };
        // Frames above the match never saw their exit (skipped by a longjmp
        // the agent did not report): held ones are written as plain entries.
        if pos + 1 < self.frames.len() {
            self.flush(sink);
            while self.frames.len() > pos + 1 {
                self.pop();
            }
        }
        let Some(fr) = self.pop() else { return };
        let ret = ev.ret.filter(|_| rule.retval);
        match fr.state {
            State::DropPattern => self.stats.pattern += 1,
            State::DropDepth => self.stats.depth += 1,
            State::DropSample => self.stats.sampling += 1,
            State::Pending => {
                let dur = ts - fr.ts;
                if dur < f.min_ticks && !rule.marker {
                    self.stats.duration += 2;
                    return;
                }
                self.flush(sink);
                if f.aggregate && !ev.unwound {
                    sink.record(&Record::Call {
                        ts: fr.ts,
                        dur,
                        probe: fr.probe,
                        args: fr.args,
                        ret,
                    });
                } else {
                    sink.record(&Record::Entry {
                        ts: fr.ts,
                        probe: fr.probe,
                        args: fr.args,
                    });
                    sink.record(&Record::Exit {
                        ts,
                        probe: ev.probe,
                        ret,
                        unwound: ev.unwound,
                    });
                }
            }
            State::Written => {
                if ts - fr.ts < f.min_ticks {
                    self.stats.kept_short += 1;
                }
                self.flush(sink);
                sink.record(&Record::Exit {
                    ts,
                    probe: ev.probe,
                    ret,
                    unwound: ev.unwound,
                });
            }
        }
    }

    /// Writes every held entry (outermost first).
    #[inline]
    fn flush(&mut self, sink: &mut impl Sink) {
        for fr in &mut self.frames[self.first_pending..] {
            if fr.state == State::Pending {
                sink.record(&Record::Entry {
                    ts: fr.ts,
                    probe: fr.probe,
                    args: fr.args,
                });
                fr.state = State::Written;
            }
        }
        self.first_pending = self.frames.len();
    }

    /// End of recording: writes the entries still held (calls still running).
    pub fn finish(&mut self, sink: &mut impl Sink) {
        self.flush(sink);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("*", ""));
        assert!(glob_match("foo*", "foobar"));
        assert!(glob_match("*bar", "foobar"));
        assert!(glob_match("f*o*r", "foobar"));
        assert!(glob_match("f?o", "foo"));
        assert!(!glob_match("f?o", "fo"));
        assert!(!glob_match("foo", "foobar"));
        assert!(glob_match("a*b*c", "aXbYbZc"));
        assert!(!glob_match("a*b*c", "aXbYbZ"));
        // Where this matcher (bytewise, literal-first) and the CLI's used to
        // disagree: `?` is one character, a name's `*` does not hide the
        // pattern's.
        assert!(glob_match("f?o", "fäo"));
        assert!(!glob_match("f??o", "fäo"));
        assert!(glob_match("*a", "*ba"));
        assert!(glob_match("ns::*", "ns::Foo::bar"));
    }

    #[test]
    fn filter_patterns_compile_once() {
        let syms = SymbolTable::new([
            crate::Symbol::function(0, "sys_getppid"),
            crate::Symbol::function(1, "sys_setuid"),
            crate::Symbol::function(2, "operator[]"),
            crate::Symbol::function(3, "other"),
        ])
        .unwrap();
        let f = Filter::none()
            .include("sys_[gs]et*")
            .include("operator[]")
            .exclude("*uid");
        let cf = CompiledFilter::new(&f, &syms, &TimeBase::Ns, true).unwrap();
        let ok: Vec<bool> = (0..4).map(|i| cf.rule(i).pattern_ok).collect();
        // `operator[]` does not compile as a glob: it matches itself.
        assert_eq!(ok, [true, false, true, false]);
    }

    #[test]
    fn markers_survive_depth_sampling_and_duration() {
        let mut marker = crate::Symbol::function(0, "phase");
        marker.kind = crate::ProbeKind::Marker;
        let syms = SymbolTable::new([marker, crate::Symbol::function(1, "work")]).unwrap();
        let f = Filter::none()
            .max_depth(1)
            .sample_every(2)
            .min_duration_ns(100);
        let cf = CompiledFilter::new(&f, &syms, &TimeBase::Ns, true).unwrap();
        let mut tf = ThreadFilter::new();
        let mut out: Vec<Record> = Vec::new();
        // work { phase (short, nested too deep, every call) } twice.
        for base in [0, 1000] {
            for ev in [
                TraceEvent::entry(base, 1, 1),
                TraceEvent::entry(base + 10, 1, 0),
                TraceEvent::exit(base + 11, 1, 0),
                TraceEvent::entry(base + 20, 1, 0),
                TraceEvent::exit(base + 21, 1, 0),
                TraceEvent::exit(base + 500, 1, 1),
            ] {
                tf.push(&cf, &ev, &mut out);
            }
        }
        tf.finish(&mut out);
        let phases = out.iter().filter(|r| r.probe() == Some(0)).count();
        assert_eq!(phases, 4, "{out:?}");
        // `work` itself is still sampled: its second call is dropped (the
        // first is an entry and an exit record around the markers).
        let works = out.iter().filter(|r| r.probe() == Some(1)).count();
        assert_eq!(works, 2, "{out:?}");
    }
}
