//! What `hotprobe info` prints: a trace's metadata (`info.json`) and what
//! its streams hold (threads, events, calls, time span).

use serde::Serialize;

use crate::analysis::{fmt_duration, CallStack, Progress, Step};
use crate::error::Result;
use crate::event::{Record, TimeBase};
use crate::filter::{Filter, FilterStats};
use crate::reader::TraceReader;

/// One thread of a [`TraceSummary`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ThreadSummary {
    /// Thread id.
    pub tid: u32,
    /// Records in its stream.
    pub records: u64,
    /// Function events they stand for (a call record counts 2).
    pub events: u64,
    /// Calls (entry and exit pairs, and calls still open at the end).
    pub calls: u64,
    /// Of those, calls whose exit is not in the trace (lost, or still
    /// running at the end).
    pub no_exit: u64,
    /// Stream size in bytes.
    pub bytes: u64,
    /// First record time (ns, trace clock), 0 when empty.
    pub first_ns: u64,
    /// Last record time (a call's exit included), 0 when empty.
    pub last_ns: u64,
}

/// A trace's metadata and contents. Serialized (`info --json`) with these
/// field names.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TraceSummary {
    /// Always `hotprobe-trace`.
    pub format: String,
    /// Format version.
    pub version: u32,
    /// What was traced.
    pub target: String,
    /// The traced command line, if spawned.
    pub command: Vec<String>,
    /// Process id.
    pub pid: Option<u32>,
    /// The processes followed across exec, with their programs (version 4).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub processes: Vec<crate::info::ProcessInfo>,
    /// Time base of the streams.
    pub time_base: TimeBase,
    /// Its tick rate (1e9 for ns).
    pub time_base_hz: Option<u64>,
    /// Wall-clock start, ns since the epoch.
    pub start_unix_ns: u64,
    /// The same as RFC 3339 UTC (`2025-01-31T12:34:56.123456789Z`).
    pub start_time: String,
    /// From the first record to the last exit, ns.
    pub duration_ns: u64,
    /// Whether the recorder finished the trace.
    pub complete: bool,
    /// Whether entry+exit pairs were merged into call records.
    pub aggregate: bool,
    /// Per thread.
    pub threads: Vec<ThreadSummary>,
    /// Records of all threads.
    pub records: u64,
    /// Function events of all threads.
    pub events: u64,
    /// Calls of all threads.
    pub calls: u64,
    /// Of those, calls whose exit is not in the trace.
    pub no_exit: u64,
    /// Events lost (full rings, threads without a ring, events the writer
    /// could not write): the larger of what `info.json` counts and what
    /// the streams' lost records count.
    pub lost: u64,
    /// Of those, events the writer could not write (a full disk).
    pub dropped: u64,
    /// The write that failed, if one did (the writer stopped there).
    pub write_error: Option<String>,
    /// Stream bytes.
    pub bytes: u64,
    /// Entries of `symbols.tsv`.
    pub symbols: usize,
    /// The recording's filters.
    pub filter: Filter,
    /// What they removed (events), if the recorder finished.
    pub filtered: Option<FilterStats>,
    /// Phase marker functions.
    pub phase_markers: Vec<String>,
    /// The host kernel's events (`record --kernel`): taken, lost, per thread.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kernel: Option<crate::kernel::KernelInfo>,
    /// Each mechanism's calibrated cost a hit and whether the times leave
    /// them out ([`TraceReader::overhead_note`]; none before `costs.tsv`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe_costs: Option<String>,
}

/// Counts a call (and a call without its exit).
fn count(calls: &mut u64, no_exit: &mut u64, st: &Step) {
    if let Step::Leave { unfinished, .. } = st {
        *calls += 1;
        *no_exit += u64::from(*unfinished);
    }
}

/// Reads every stream once.
pub fn summarize(reader: &TraceReader, mut progress: Progress<'_>) -> Result<TraceSummary> {
    let info = reader.info();
    let mut threads = Vec::new();
    let total = reader.total_bytes();
    let mut done = 0;
    let mut stream_lost = 0u64;
    for s in reader.streams() {
        let mut t = ThreadSummary {
            tid: s.tid,
            bytes: s.bytes,
            first_ns: u64::MAX,
            ..ThreadSummary::default()
        };
        let mut cs = CallStack::new();
        let mut calls = 0u64;
        let mut no_exit = 0u64;
        for r in reader.thread(s.tid)? {
            let r = r?;
            if let Record::Lost { count, .. } = r {
                stream_lost = stream_lost.saturating_add(count);
            }
            t.records += 1;
            t.events += r.event_count();
            t.first_ns = t.first_ns.min(r.ts());
            t.last_ns = t.last_ns.max(match r {
                Record::Call { ts, dur, .. } => ts.saturating_add(dur),
                _ => r.ts(),
            });
            cs.feed(&r, |st| count(&mut calls, &mut no_exit, &st));
        }
        cs.finish(|st| count(&mut calls, &mut no_exit, &st));
        t.calls = calls;
        t.no_exit = no_exit;
        if t.records == 0 {
            t.first_ns = 0;
        }
        threads.push(t);
        done += s.bytes;
        if let Some(p) = progress.as_mut() {
            p(done, total);
        }
    }
    let busy: Vec<&ThreadSummary> = threads.iter().filter(|t| t.records > 0).collect();
    let first = busy.iter().map(|t| t.first_ns).min().unwrap_or(0);
    let last = busy.iter().map(|t| t.last_ns).max().unwrap_or(0);
    let lost = info
        .stats
        .as_ref()
        .map_or(0, |s| s.lost.saturating_add(s.dropped))
        .max(stream_lost);
    Ok(TraceSummary {
        format: info.format.clone(),
        version: info.version,
        target: info.target.clone(),
        command: info.command.clone(),
        pid: info.pid,
        processes: info.processes.clone(),
        time_base: info.time_base,
        time_base_hz: info.time_base.hz(),
        start_unix_ns: info.start_unix_ns,
        start_time: rfc3339(info.start_unix_ns),
        duration_ns: last.saturating_sub(first),
        complete: info.complete,
        aggregate: info.aggregate,
        records: threads.iter().map(|t| t.records).sum(),
        events: threads.iter().map(|t| t.events).sum(),
        calls: threads.iter().map(|t| t.calls).sum(),
        no_exit: threads.iter().map(|t| t.no_exit).sum(),
        bytes: threads.iter().map(|t| t.bytes).sum(),
        threads,
        lost,
        dropped: info.stats.as_ref().map_or(0, |s| s.dropped),
        write_error: info.stats.as_ref().and_then(|s| s.write_error.clone()),
        symbols: info.symbols,
        filter: info.filter.clone(),
        filtered: info.stats.as_ref().map(|s| s.filtered),
        phase_markers: info.phase_markers.clone(),
        kernel: info.kernel.clone(),
        probe_costs: reader.overhead_note(),
    })
}

/// RFC 3339 UTC of a Unix time in ns (proleptic Gregorian calendar).
pub fn rfc3339(unix_ns: u64) -> String {
    let secs = unix_ns / 1_000_000_000;
    let nanos = unix_ns % 1_000_000_000;
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{nanos:09}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

impl TraceSummary {
    /// `key: value` lines, like `uftrace info`.
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let mut kv = |k: &str, v: String| s.push_str(&format!("# {k:<14} {v}\n"));
        kv(
            "format:",
            format!(
                "{} version {}{}",
                self.format,
                self.version,
                if self.complete {
                    ""
                } else {
                    " (not finished by its recorder)"
                }
            ),
        );
        kv("target:", self.target.clone());
        if !self.command.is_empty() {
            kv("command:", self.command.join(" "));
        }
        kv(
            "pid:",
            self.pid.map_or_else(|| "-".to_string(), |p| p.to_string()),
        );
        for p in &self.processes {
            kv(
                "executed:",
                format!("pid {} {} ({})", p.pid, p.comm, p.program),
            );
        }
        kv(
            "time base:",
            match (self.time_base, self.time_base_hz) {
                (TimeBase::Ns, _) => "ns (CLOCK_MONOTONIC)".to_string(),
                (TimeBase::Tsc { .. }, Some(hz)) => {
                    format!("TSC at {:.3} GHz (calibrated)", hz as f64 / 1e9)
                }
                (TimeBase::Tsc { .. }, None) => "TSC".to_string(),
            },
        );
        kv(
            "start time:",
            self.start_time.replace('T', " ").replace('Z', " UTC"),
        );
        kv(
            "duration:",
            fmt_duration(self.duration_ns).trim().to_string(),
        );
        let tids: Vec<String> = self.threads.iter().map(|t| t.tid.to_string()).collect();
        kv(
            "threads:",
            format!("{} ({})", self.threads.len(), tids.join(" ")),
        );
        kv(
            "events:",
            format!(
                "{} function events, {} calls{}, {} records, {} lost",
                self.events,
                self.calls,
                if self.no_exit > 0 {
                    format!(" ({} without their exit)", self.no_exit)
                } else {
                    String::new()
                },
                self.records,
                self.lost
            ),
        );
        if let Some(k) = &self.kernel {
            kv(
                "kernel:",
                format!(
                    "{} syscalls, {} off-CPU intervals in {} threads; {} records taken, \
                     {} lost by the kernel, {} unpaired{}",
                    k.syscalls(),
                    k.off_cpu(),
                    k.threads.len(),
                    k.taken,
                    k.lost,
                    k.unpaired,
                    if k.corrupt > 0 {
                        format!(", {} ring reads not parsed whole", k.corrupt)
                    } else {
                        String::new()
                    }
                ),
            );
        }
        if let Some(e) = &self.write_error {
            kv(
                "write error:",
                format!(
                    "{e}: writing stopped there, {} events not written (counted as lost)",
                    self.dropped
                ),
            );
        }
        kv(
            "size:",
            format!(
                "{} bytes ({:.2} bytes/event)",
                self.bytes,
                if self.events > 0 {
                    self.bytes as f64 / self.events as f64
                } else {
                    0.0
                }
            ),
        );
        kv("symbols:", self.symbols.to_string());
        let f = &self.filter;
        let mut fs = Vec::new();
        if !f.include.is_empty() {
            fs.push(format!("include {}", f.include.join(",")));
        }
        if !f.exclude.is_empty() {
            fs.push(format!("exclude {}", f.exclude.join(",")));
        }
        if let Some(d) = f.max_depth {
            fs.push(format!("max depth {d}"));
        }
        if let Some(ns) = f.min_duration_ns {
            fs.push(format!("min duration {}", fmt_duration(ns).trim()));
        }
        if let Some(n) = f.sample_every {
            fs.push(format!("sample 1 in {n}"));
        }
        kv(
            "filters:",
            if fs.is_empty() {
                "none".into()
            } else {
                fs.join("; ")
            },
        );
        if let Some(fd) = &self.filtered {
            kv(
                "filtered:",
                format!(
                    "pattern {}, depth {}, duration {}, sampling {} (events)",
                    fd.pattern, fd.depth, fd.duration, fd.sampling
                ),
            );
        }
        if !self.phase_markers.is_empty() {
            kv("phase markers:", self.phase_markers.join(", "));
        }
        if let Some(c) = &self.probe_costs {
            kv("probe costs:", c.clone());
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::rfc3339;

    #[test]
    fn dates() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(
            rfc3339(951_782_400_000_000_001),
            "2000-02-29T00:00:00.000000001Z"
        );
        assert_eq!(
            rfc3339(1_700_000_000_123_456_789),
            "2023-11-14T22:13:20.123456789Z"
        );
    }
}
