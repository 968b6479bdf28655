//! Aggregations of `count` (`--hist=arg0`, `--lhist=arg0:0:4096:256`,
//! `--by arg0|tid|comm`): the specs and their parsing, the tables read
//! back from the target (computed there on the fast path, see
//! `hotprobe_abi::agg`) or built here from events (other mechanisms), and
//! their text, as bpftrace prints `hist`, `lhist` and maps.

use std::collections::HashMap;
use std::fmt::Write as _;

use hotprobe_fastpath::agg::{
    linear_bucket, log2_bucket, log2_range, narrow, AggKind, AggRule, AGG_SIGNED, AGG_SRC_ARG0,
    AGG_SRC_COMM, AGG_SRC_RETVAL, AGG_SRC_TID,
};

use crate::{EventSink, ProbeId, RecordedEvent, SinkError};

/// What an aggregation reads at each hit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AggSource {
    /// Argument register `n` (0–5).
    Arg(u8),
    /// A parameter named in the function's DWARF.
    Name(String),
    /// The return value (on `%return` probes).
    Retval,
    /// The thread id.
    Tid,
    /// The thread's command name.
    Comm,
}

/// An aggregation asked for on the command line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AggSpec {
    /// Histogram or count per key.
    pub kind: AggKind,
    /// The value or key.
    pub source: AggSource,
}

/// A bad aggregation spec.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AggSpecError {
    /// `argN` with N above 5.
    #[error("{0}: only arg0..arg5 (the six integer argument registers) can be read")]
    ArgOutOfRange(String),
    /// Not an argument, a parameter name, `retval`, `tid` or `comm`.
    #[error("{0}: not arg0..arg5, a parameter name, retval, tid or comm")]
    BadSource(String),
    /// A histogram of something that is no number.
    #[error("{0}: a histogram needs a number (arg0..arg5, a parameter name or retval)")]
    NotANumber(String),
    /// `--lhist` without its four fields.
    #[error("{0}: --lhist takes VALUE:MIN:MAX:STEP")]
    LhistShape(String),
    /// A field of `--lhist` is no integer.
    #[error("{0}: {1} is no integer")]
    NotAnInteger(String, String),
    /// `--lhist` bounds that make no buckets.
    #[error("{0}: MIN must be below MAX, STEP positive, and at most 4096 buckets")]
    LhistBounds(String),
    /// A parameter name, and the function has no DWARF.
    #[error("{name}: {func} has no DWARF (build with -g), use arg0..arg5")]
    NoDwarf {
        /// The name.
        name: String,
        /// The function.
        func: String,
    },
    /// A parameter name the function does not have.
    #[error("{func} has no parameter {name}; its parameters: {params}")]
    NoParameter {
        /// The name.
        name: String,
        /// The function.
        func: String,
        /// Its parameters, comma-separated.
        params: String,
    },
    /// A parameter no integer register holds at the entry.
    #[error("{name} of {func}: {why}")]
    NotReadable {
        /// The name.
        name: String,
        /// The function.
        func: String,
        /// Why (its type, a register it is not in).
        why: String,
    },
}

fn source(s: &str) -> Result<AggSource, AggSpecError> {
    let s = s.trim();
    if let Some(n) = s.strip_prefix("arg").filter(|n| !n.is_empty()) {
        if n.bytes().all(|b| b.is_ascii_digit()) {
            return match n.parse::<u8>() {
                Ok(i) if i <= 5 => Ok(AggSource::Arg(i)),
                _ => Err(AggSpecError::ArgOutOfRange(s.into())),
            };
        }
    }
    match s {
        "tid" => Ok(AggSource::Tid),
        "retval" => Ok(AggSource::Retval),
        "comm" => Ok(AggSource::Comm),
        _ if !s.is_empty()
            && !s.starts_with(|c: char| c.is_ascii_digit())
            && s.chars().all(|c| c == '_' || c.is_ascii_alphanumeric()) =>
        {
            Ok(AggSource::Name(s.into()))
        }
        _ => Err(AggSpecError::BadSource(s.into())),
    }
}

fn number(s: &str) -> Result<AggSource, AggSpecError> {
    match source(s)? {
        AggSource::Tid | AggSource::Comm => Err(AggSpecError::NotANumber(s.into())),
        src => Ok(src),
    }
}

impl AggSpec {
    /// `--hist=VALUE`: a log2 histogram.
    pub fn hist(s: &str) -> Result<AggSpec, AggSpecError> {
        Ok(AggSpec {
            kind: AggKind::Log2,
            source: number(s)?,
        })
    }

    /// `--lhist=VALUE:MIN:MAX:STEP`: a linear histogram.
    pub fn lhist(s: &str) -> Result<AggSpec, AggSpecError> {
        let f: Vec<&str> = s.split(':').collect();
        let [v, min, max, step] = f[..] else {
            return Err(AggSpecError::LhistShape(s.into()));
        };
        let int = |x: &str| {
            x.trim()
                .parse::<i64>()
                .map_err(|_| AggSpecError::NotAnInteger(s.into(), x.into()))
        };
        let (min, max, step) = (int(min)?, int(max)?, int(step)?);
        let kind = AggKind::Linear {
            min,
            max,
            step: u64::try_from(step).map_err(|_| AggSpecError::LhistBounds(s.into()))?,
        };
        let spec = AggSpec {
            kind,
            source: number(v)?,
        };
        match spec.rule(0).buckets() {
            Some(n) if n > 0 => Ok(spec),
            _ => Err(AggSpecError::LhistBounds(s.into())),
        }
    }

    /// `--by KEY`: a count per key.
    pub fn by(s: &str) -> Result<AggSpec, AggSpecError> {
        Ok(AggSpec {
            kind: AggKind::Keyed,
            source: source(s)?,
        })
    }

    /// The rule of the spec for function `func` placed at `addr`: a
    /// parameter name is looked up in what `typing` noted of the function
    /// (its DWARF, see [`crate::typed::Typing::name_chooser`]) and read from
    /// its argument register at its width and sign.
    pub fn rule_for(
        &self,
        typing: &crate::typed::Typing,
        addr: u64,
        func: &str,
    ) -> Result<AggRule, AggSpecError> {
        let AggSource::Name(name) = &self.source else {
            return Ok(self.rule(0));
        };
        let (name, func) = (name.clone(), func.to_string());
        let Some(regs) = typing.param_registers(addr) else {
            return Err(AggSpecError::NoDwarf { name, func });
        };
        match regs.iter().find(|(n, _)| *n == name) {
            Some((_, Ok(crate::cond::Operand::Param { reg, size, signed }))) => {
                let sign = if *signed { AGG_SIGNED } else { 0 };
                Ok(self.rule_with(*reg, *size as u32 | sign))
            }
            Some((_, Ok(_))) => Err(AggSpecError::NotReadable {
                name,
                func,
                why: "not an integer argument".into(),
            }),
            Some((_, Err(why))) => Err(AggSpecError::NotReadable {
                name,
                func,
                why: why.clone(),
            }),
            None => Err(AggSpecError::NoParameter {
                name,
                func,
                params: regs
                    .iter()
                    .map(|(n, _)| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// The rule of the spec, a parameter name resolved to argument
    /// register `arg` of `width` (see [`AggRule::width`]; 0 for a whole
    /// register).
    pub fn rule_with(&self, arg: u8, width: u32) -> AggRule {
        AggRule {
            width,
            ..self.rule(arg)
        }
    }

    /// The rule of the spec, a parameter name resolved to argument
    /// register `arg` (unused for others), read whole.
    pub fn rule(&self, arg: u8) -> AggRule {
        let source = match &self.source {
            AggSource::Arg(n) => AGG_SRC_ARG0 + *n as u32,
            AggSource::Name(_) => AGG_SRC_ARG0 + arg as u32,
            AggSource::Tid => AGG_SRC_TID,
            AggSource::Comm => AGG_SRC_COMM,
            AggSource::Retval => AGG_SRC_RETVAL,
        };
        AggRule {
            kind: self.kind,
            source,
            width: 0,
        }
    }

    /// What the spec reads, as the user wrote it.
    pub fn describe(&self) -> String {
        let src = match &self.source {
            AggSource::Arg(n) => format!("arg{n}"),
            AggSource::Name(n) => n.clone(),
            AggSource::Tid => "tid".into(),
            AggSource::Comm => "comm".into(),
            AggSource::Retval => "retval".into(),
        };
        match self.kind {
            AggKind::Log2 => format!("hist({src})"),
            AggKind::Linear { min, max, step } => format!("lhist({src}, {min}, {max}, {step})"),
            AggKind::Keyed => format!("count by {src}"),
        }
    }
}

/// A key of a `--by` table.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AggKey {
    /// An argument's value.
    Value(u64),
    /// A signed argument's value (its type is signed: `-5`, not
    /// 18446744073709551611).
    Signed(i64),
    /// A thread id.
    Tid(u32),
    /// A command name.
    Comm(String),
}

impl std::fmt::Display for AggKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AggKey::Value(v) => write!(f, "{v}"),
            AggKey::Signed(v) => write!(f, "{v}"),
            AggKey::Tid(t) => write!(f, "{t}"),
            AggKey::Comm(c) => write!(f, "{c}"),
        }
    }
}

/// One probe's aggregation: histogram buckets or key counts, and the hits
/// that could not be aggregated (a full key table, a key that could not
/// be read).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AggTable {
    /// What is aggregated.
    pub rule: AggRule,
    /// Histogram buckets (see `hotprobe_abi::agg`); empty for keys.
    pub buckets: Vec<u64>,
    /// Count per key.
    pub keys: HashMap<AggKey, u64>,
    /// Hits not aggregated.
    pub uncounted: u64,
}

impl AggTable {
    /// An empty table for `rule`.
    pub fn new(rule: AggRule) -> AggTable {
        AggTable {
            rule,
            buckets: vec![0; rule.buckets().unwrap_or(0)],
            keys: HashMap::new(),
            uncounted: 0,
        }
    }

    /// Adds `n` hits of the key words `(k0, k1)` (as the target stores them).
    pub fn add_key(&mut self, k0: u64, k1: u64, n: u64) {
        let key = match self.rule.source {
            AGG_SRC_TID => AggKey::Tid(k0 as u32),
            AGG_SRC_COMM => {
                let mut b = [0u8; 16];
                b[..8].copy_from_slice(&k0.to_le_bytes());
                b[8..].copy_from_slice(&k1.to_le_bytes());
                let end = b.iter().position(|&c| c == 0).unwrap_or(16);
                AggKey::Comm(String::from_utf8_lossy(&b[..end]).into_owned())
            }
            _ if self.rule.width & AGG_SIGNED != 0 => AggKey::Signed(k0 as i64),
            _ => AggKey::Value(k0),
        };
        *self.keys.entry(key).or_default() += n;
    }

    /// Adds one hit of value `v` (read as signed) into the histogram.
    pub fn add_value(&mut self, v: u64) {
        let n = self.buckets.len();
        let i = match self.rule.kind {
            AggKind::Linear { min, max, step } => linear_bucket(v as i64, min, max, step, n),
            _ => log2_bucket(v as i64),
        };
        match self.buckets.get_mut(i) {
            Some(b) => *b += 1,
            None => self.uncounted += 1,
        }
    }

    /// Adds a recorded event (the mechanisms that do not aggregate in the
    /// target): an entry's arguments, or its thread (and the thread's
    /// name, read from `/proc` now); an exit's return value for `retval`
    /// (a frame left without returning has none). Other events are not
    /// this table's.
    pub fn add_event(&mut self, ev: &RecordedEvent) {
        let exit = ev.kind == crate::KIND_EXIT;
        if exit != (self.rule.source == AGG_SRC_RETVAL)
            || (exit && ev.reserved & crate::fastpath::EXIT_UNWOUND != 0)
        {
            return;
        }
        if exit {
            return match self.rule.kind {
                AggKind::Keyed => self.add_key(ev.args[0], 0, 1),
                _ => self.add_value(ev.args[0]),
            };
        }
        let width = self.rule.width;
        let arg = |i: u32| {
            ev.args
                .get(i.wrapping_sub(AGG_SRC_ARG0) as usize)
                .map(|v| narrow(*v, width))
        };
        let keyed = self.rule.kind == AggKind::Keyed;
        match (self.rule.source, keyed) {
            (AGG_SRC_TID, true) => self.add_key(ev.tid as u64, 0, 1),
            (AGG_SRC_COMM, true) => match std::fs::read(format!("/proc/{}/comm", ev.tid)) {
                Ok(name) => {
                    let name = name.strip_suffix(b"\n").unwrap_or(&name);
                    *self
                        .keys
                        .entry(AggKey::Comm(String::from_utf8_lossy(name).into_owned()))
                        .or_default() += 1;
                }
                Err(_) => self.uncounted += 1,
            },
            (s, true) => match arg(s) {
                Some(v) => self.add_key(v, 0, 1),
                None => self.uncounted += 1,
            },
            (s, false) => match arg(s) {
                Some(v) => self.add_value(v),
                None => self.uncounted += 1,
            },
        }
    }

    /// Adds another table of the same rule into this one.
    pub fn merge(&mut self, other: &AggTable) {
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        for (k, n) in &other.keys {
            *self.keys.entry(k.clone()).or_default() += n;
        }
        self.uncounted += other.uncounted;
    }

    /// Hits the table holds (aggregated ones).
    pub fn total(&self) -> u64 {
        self.buckets.iter().sum::<u64>() + self.keys.values().sum::<u64>()
    }

    /// The values `[lo, hi)` of histogram bucket `i` (`None`: open below
    /// or above).
    pub fn bucket_range(&self, i: usize) -> (Option<i128>, Option<i128>) {
        let n = self.buckets.len();
        match self.rule.kind {
            AggKind::Linear { min, max, step } => {
                let lo = min as i128 + (i as i128 - 1) * step as i128;
                match i {
                    0 => (None, Some(min as i128)),
                    _ if i + 1 == n => (Some(max as i128), None),
                    _ => (Some(lo), Some((lo + step as i128).min(max as i128))),
                }
            }
            _ => match (i, log2_range(i)) {
                (0, _) => (None, Some(0)),
                (_, (lo, i64::MAX)) => (Some(lo as i128), None),
                (_, (lo, hi)) => (Some(lo as i128), Some(hi as i128)),
            },
        }
    }

    /// The histogram's buckets from the first with a hit to the last:
    /// `(lo, hi, count)` (see [`AggTable::bucket_range`]).
    pub fn hist_ranges(&self) -> Vec<(Option<i128>, Option<i128>, u64)> {
        let first = self.buckets.iter().position(|&c| c > 0);
        let last = self.buckets.iter().rposition(|&c| c > 0);
        let (Some(first), Some(last)) = (first, last) else {
            return Vec::new();
        };
        (first..=last)
            .map(|i| {
                let (lo, hi) = self.bucket_range(i);
                (lo, hi, self.buckets[i])
            })
            .collect()
    }

    /// The histogram's rows from the first bucket with a hit to the last:
    /// `(label, count)`, labels as bpftrace writes them (`[4, 8)`,
    /// `[1K, 2K)`, `(..., 0)`, `[4096, ...)`).
    pub fn hist_rows(&self) -> Vec<(String, u64)> {
        let log2 = self.rule.kind == AggKind::Log2;
        let bound = |v: i128| if log2 { size(v as i64) } else { v.to_string() };
        self.hist_ranges()
            .into_iter()
            .map(|(lo, hi, n)| {
                let label = match (lo, hi) {
                    (None, Some(hi)) => format!("(..., {hi})"),
                    (Some(lo), None) => format!("[{}, ...)", bound(lo)),
                    (Some(lo), Some(hi)) if log2 && hi == lo + 1 => format!("[{lo}]"),
                    (Some(lo), Some(hi)) => format!("[{}, {})", bound(lo), bound(hi)),
                    (None, None) => "(..., ...)".into(),
                };
                (label, n)
            })
            .collect()
    }

    /// The keys, most hits first (ties by key), at most `top`.
    pub fn key_rows(&self, top: Option<usize>) -> Vec<(AggKey, u64)> {
        let mut rows: Vec<(AggKey, u64)> = self.keys.iter().map(|(k, n)| (k.clone(), *n)).collect();
        rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        rows.truncate(top.unwrap_or(usize::MAX));
        rows
    }

    /// The table as text: a histogram with bars, or `@[KEY]: COUNT` rows.
    pub fn render(&self, top: Option<usize>) -> String {
        let mut out = String::new();
        if self.rule.kind == AggKind::Keyed {
            let rows = self.key_rows(top);
            let w = rows
                .iter()
                .map(|r| r.0.to_string().len())
                .max()
                .unwrap_or(0);
            for (k, n) in &rows {
                let _ = writeln!(out, "@[{k}]:{:pad$} {n}", "", pad = w - k.to_string().len());
            }
            if rows.len() < self.keys.len() {
                let _ = writeln!(out, "({} more keys)", self.keys.len() - rows.len());
            }
            return out;
        }
        let rows = self.hist_rows();
        let max = rows.iter().map(|r| r.1).max().unwrap_or(0).max(1);
        let w = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(20);
        for (label, n) in rows {
            let bar = (n * 52).div_ceil(max) as usize;
            let _ = writeln!(out, "{label:<w$} {n:>8} |{:<52}|", "@".repeat(bar));
        }
        out
    }
}

/// A bound of a log2 bucket as bpftrace writes it: `1K`, `4M`, …
fn size(v: i64) -> String {
    if v == i64::MAX {
        return "...".into();
    }
    let units = ["", "K", "M", "G", "T", "P", "E"];
    let mut v = v;
    let mut u = 0;
    while v >= 1024 && v % 1024 == 0 && u + 1 < units.len() {
        v /= 1024;
        u += 1;
    }
    format!("{v}{}", units[u])
}

/// An [`EventSink`] that aggregates the entries of the probes it is given
/// (those the target could not aggregate itself: trap mechanisms) and
/// hands every event on to `inner`.
pub struct AggSink<'a, S: EventSink> {
    /// Where events go on.
    pub inner: &'a mut S,
    /// The tables, by session probe id.
    pub tables: HashMap<u32, AggTable>,
    /// The condition an entry of a probe must satisfy to be aggregated.
    pub conditions: HashMap<u32, crate::cond::Cond>,
}

impl<S: EventSink> EventSink for AggSink<'_, S> {
    fn event(&mut self, ev: &RecordedEvent) -> Result<(), SinkError> {
        let n = (ev.nargs as usize).min(ev.args.len());
        let holds = self
            .conditions
            .get(&ev.probe_id)
            .is_none_or(|c| c.eval(&ev.args[..n]));
        if let Some(t) = self.tables.get_mut(&ev.probe_id).filter(|_| holds) {
            t.add_event(ev);
        }
        self.inner.event(ev)
    }

    fn lost(&mut self, tid: u32, ts: u64, count: u64) -> Result<(), SinkError> {
        self.inner.lost(tid, ts, count)
    }

    fn idle(&mut self) {
        self.inner.idle()
    }

    fn pending_armed(&mut self, armed: &crate::ArmedPending) -> Result<(), SinkError> {
        self.inner.pending_armed(armed)
    }
}

impl<'a, S: EventSink> AggSink<'a, S> {
    /// A sink aggregating nothing yet.
    pub fn new(inner: &'a mut S) -> Self {
        AggSink {
            inner,
            tables: HashMap::new(),
            conditions: HashMap::new(),
        }
    }

    /// Aggregates the entries of probe `id` with `rule`.
    pub fn add(&mut self, id: ProbeId, rule: AggRule) {
        self.tables.insert(id.0, AggTable::new(rule));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_refuse() {
        assert_eq!(AggSpec::hist("arg0").unwrap().source, AggSource::Arg(0));
        assert_eq!(
            AggSpec::hist("size").unwrap().source,
            AggSource::Name("size".into())
        );
        assert!(matches!(
            AggSpec::hist("arg9"),
            Err(AggSpecError::ArgOutOfRange(_))
        ));
        assert!(matches!(
            AggSpec::hist("comm"),
            Err(AggSpecError::NotANumber(_))
        ));
        assert!(matches!(
            AggSpec::lhist("arg0:10:0:1"),
            Err(AggSpecError::LhistBounds(_))
        ));
        assert!(matches!(
            AggSpec::lhist("arg0:0:10"),
            Err(AggSpecError::LhistShape(_))
        ));
        assert!(matches!(
            AggSpec::lhist("arg0:0:x:1"),
            Err(AggSpecError::NotAnInteger(..))
        ));
        let l = AggSpec::lhist("arg2:0:4096:256").unwrap();
        assert_eq!(l.rule(0).buckets(), Some(18));
        assert_eq!(AggSpec::by("comm").unwrap().source, AggSource::Comm);
        assert!(AggSpec::by("9x").is_err());
    }

    #[test]
    fn histogram_rows_name_their_ranges() {
        let mut t = AggTable::new(AggSpec::hist("arg0").unwrap().rule(0));
        for v in [0u64, 1, 2, 3, 1024, 2047] {
            t.add_value(v);
        }
        let rows = t.hist_rows();
        assert_eq!(rows.first().unwrap(), &("[0]".to_string(), 1));
        assert!(rows.contains(&("[2, 4)".to_string(), 2)));
        assert_eq!(rows.last().unwrap(), &("[1K, 2K)".to_string(), 2));
        let mut l = AggTable::new(AggSpec::lhist("arg0:0:100:10").unwrap().rule(0));
        for v in [5u64, 99, 100, (-1i64) as u64] {
            l.add_value(v);
        }
        let rows = l.hist_rows();
        assert_eq!(rows.first().unwrap(), &("(..., 0)".to_string(), 1));
        assert_eq!(rows[1], ("[0, 10)".to_string(), 1));
        assert_eq!(rows.last().unwrap(), &("[100, ...)".to_string(), 1));
        // A step that does not divide the span: the last bucket ends at MAX.
        let mut u = AggTable::new(AggSpec::lhist("arg0:0:100:30").unwrap().rule(0));
        for v in [95u64, 100] {
            u.add_value(v);
        }
        let rows = u.hist_rows();
        assert_eq!(rows[0], ("[90, 100)".to_string(), 1));
        assert_eq!(rows[1], ("[100, ...)".to_string(), 1));
    }
}
