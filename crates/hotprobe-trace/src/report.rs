//! [`Report`]: per-function calls, total and self time, as `report`
//! prints them; calls whose exit was lost are counted (also apart) and kept out
//! of the times.

use std::collections::HashMap;

use serde::Serialize;

use crate::analysis::{fmt_duration, Step};
use crate::kernel::ThreadKernel;

/// One function's line of a report. Serialized (`--json`) with the field
/// names `function`, `module`, `calls`, `total_ns`, `self_ns`, `avg_ns`,
/// `min_ns`, `max_ns`, `no_exit`, and `on_trap` for a function probed
/// through a trap.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReportRow {
    /// Probe id.
    #[serde(skip)]
    pub probe: u32,
    /// Function name.
    #[serde(rename = "function")]
    pub name: String,
    /// Module (executable or library path; may be empty).
    pub module: String,
    /// Calls, those without their exit included.
    pub calls: u64,
    /// Of those, calls whose exit is not in the trace (lost: an outer exit
    /// came first, or the trace ends inside them): their duration is not
    /// known, so they are in no time of the row (the average, minimum and
    /// maximum are over `calls - no_exit`).
    pub no_exit: u64,
    /// Time inside the function, counting recursive calls once.
    pub total_ns: u64,
    /// Time not spent in recorded callees.
    pub self_ns: u64,
    /// Average duration of a call (recursive calls each count).
    pub avg_ns: u64,
    /// Shortest call.
    pub min_ns: u64,
    /// Longest call.
    pub max_ns: u64,
    /// Sum of the call durations (recursive calls each count).
    #[serde(skip)]
    pub sum_ns: u64,
    /// Outermost calls with their exit (those `total_ns` adds up).
    #[serde(skip)]
    pub outer_calls: u64,
    /// Of `total_ns`, time the thread was off the CPU (a trace with the
    /// host kernel's events: `record --kernel`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub off_cpu_ns: Option<u64>,
    /// Of `total_ns`, time the thread was in a syscall (idem).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub syscall_ns: Option<u64>,
    /// The trap mechanism the function was probed through ("in-process
    /// trap", "ptrace trap"), from the trace's `costs.tsv`: its hits cost
    /// µs each. `None` on the fast path, or in a trace without costs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_trap: Option<String>,
}

/// What a report is sorted by (descending; ties: calls, then name).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SortKey {
    /// Total time.
    #[default]
    Total,
    /// Self time.
    SelfTime,
    /// Calls.
    Calls,
    /// Average call duration.
    Avg,
    /// Longest call.
    Max,
}

impl SortKey {
    /// The row's value for this key.
    pub fn of(self, r: &ReportRow) -> u64 {
        match self {
            SortKey::Total => r.total_ns,
            SortKey::SelfTime => r.self_ns,
            SortKey::Calls => r.calls,
            SortKey::Avg => r.avg_ns,
            SortKey::Max => r.max_ns,
        }
    }
}

/// Per-function totals, sorted by total time (descending) unless
/// [`Report::sort`] said otherwise.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The rows.
    pub rows: Vec<ReportRow>,
    /// The trace has the host kernel's events: the text has an off-CPU
    /// and an in-syscall column.
    #[serde(skip)]
    pub kernel: bool,
    /// The mechanisms whose calibrated cost a hit these times leave out
    /// (the text's legend of the rows on a trap says so).
    #[serde(skip)]
    pub corrected: Vec<String>,
}

#[derive(Default)]
pub(crate) struct Acc {
    pub(crate) by_probe: HashMap<u32, ReportRow>,
    /// The host kernel's events per thread, when the trace has them.
    pub(crate) kernel: Option<HashMap<u32, ThreadKernel>>,
}

impl Acc {
    /// An accumulator that also sums off-CPU and in-syscall time per
    /// function when the trace has the host kernel's events.
    pub(crate) fn for_trace(reader: &crate::TraceReader) -> crate::Result<Acc> {
        Ok(Acc {
            kernel: match reader.kernel_info() {
                Some(_) => Some(reader.kernel_threads()?),
                None => None,
            },
            ..Acc::default()
        })
    }

    /// [`Acc::leave`] of a step of thread `tid`: with kernel events, the
    /// call's off-CPU and in-syscall time too (outermost calls, as the
    /// total time).
    pub(crate) fn leave_on(&mut self, tid: u32, s: &Step) {
        self.leave(s);
        let Some(kernel) = &self.kernel else { return };
        if let Step::Leave {
            probe,
            start,
            end,
            outermost,
            unfinished,
            ..
        } = *s
        {
            let row = self.by_probe.entry(probe).or_default();
            let (off, sys) = match kernel.get(&tid) {
                Some(k) if outermost && !unfinished => (
                    ThreadKernel::overlap(&k.off_cpu, start, end),
                    ThreadKernel::overlap(&k.syscalls, start, end),
                ),
                _ => (0, 0),
            };
            *row.off_cpu_ns.get_or_insert(0) += off;
            *row.syscall_ns.get_or_insert(0) += sys;
        }
    }

    pub(crate) fn leave(&mut self, s: &Step) {
        if let Step::Leave {
            probe,
            start,
            end,
            self_ns,
            outermost,
            unfinished,
            ..
        } = *s
        {
            let row = self.by_probe.entry(probe).or_insert_with(|| ReportRow {
                probe,
                min_ns: u64::MAX,
                ..ReportRow::default()
            });
            if unfinished {
                row.calls += 1;
                row.no_exit += 1;
                return;
            }
            let dur = end - start;
            row.calls += 1;
            row.self_ns += self_ns;
            row.sum_ns += dur;
            row.min_ns = row.min_ns.min(dur);
            row.max_ns = row.max_ns.max(dur);
            if outermost {
                row.total_ns += dur;
                row.outer_calls += 1;
            }
        }
    }

    /// The report of what was accumulated, with each row's trap mechanism
    /// and the mechanisms whose costs the times leave out, from `reader`.
    pub(crate) fn into_report(self, reader: &crate::TraceReader) -> Report {
        let syms = reader.symbols();
        let corrected = reader.corrected_mechanisms();
        let rows: Vec<ReportRow> = self
            .by_probe
            .into_values()
            .map(|mut r| {
                r.name = syms.name(r.probe).into_owned();
                r.on_trap = reader.trap_of(r.probe).map(str::to_string);
                r.module = syms
                    .get(r.probe)
                    .map_or_else(String::new, |s| s.module.clone());
                let timed = r.calls - r.no_exit;
                r.avg_ns = r.sum_ns / timed.max(1);
                if timed == 0 {
                    r.min_ns = 0;
                }
                r
            })
            .collect();
        let kernel = self.kernel.is_some();
        let mut rep = Report {
            rows,
            kernel,
            corrected,
        };
        rep.sort(SortKey::Total);
        rep
    }
}

impl Report {
    /// The row of a function name.
    pub fn row(&self, name: &str) -> Option<&ReportRow> {
        self.rows.iter().find(|r| r.name == name)
    }

    /// Sorts the rows by `key`, descending (ties: more calls, then name).
    pub fn sort(&mut self, key: SortKey) {
        self.rows.sort_by(|a, b| {
            key.of(b)
                .cmp(&key.of(a))
                .then(b.calls.cmp(&a.calls))
                .then(a.name.cmp(&b.name))
        });
    }

    /// All calls (those without their exit included).
    pub fn calls(&self) -> u64 {
        self.rows.iter().map(|r| r.calls).sum()
    }

    /// Calls without their exit.
    pub fn no_exit(&self) -> u64 {
        self.rows.iter().map(|r| r.no_exit).sum()
    }

    /// The table as text (like `uftrace report`): total, self, average,
    /// shortest and longest call, calls, function.
    pub fn to_text(&self) -> String {
        self.to_text_colored(false)
    }

    /// [`Report::to_text`], with ANSI colours when `color`: function names
    /// bold, total and self times of 1 ms or more yellow and of 1 s or
    /// more red (as `replay` and `count` colour durations), a nonzero
    /// "No exit" red.
    pub fn to_text_colored(&self, color: bool) -> String {
        let paint = |text: String, code: &str| {
            if color {
                format!("\x1b[{code}m{text}\x1b[0m")
            } else {
                text
            }
        };
        let time = |text: String, ns: u64| match ns {
            1_000_000_000.. => paint(text, "31"),
            1_000_000.. => paint(text, "33"),
            _ => text,
        };
        // Calls whose exit was lost get a column of their own, when any.
        let lost = self.no_exit() > 0;
        let mut s = String::new();
        // With the host kernel's events: off-CPU and in-syscall time after
        // the self time.
        let (kh, ku) = if self.kernel {
            ("     Off-CPU  In syscall", "  ==========  ==========")
        } else {
            ("", "")
        };
        s.push_str(&if lost {
            format!("  Total time   Self time{kh}     Average     Minimum     Maximum     No exit       Calls  Function\n")
        } else {
            format!("  Total time   Self time{kh}     Average     Minimum     Maximum       Calls  Function\n")
        });
        s.push_str(&if lost {
            format!("  ==========  =========={ku}  ==========  ==========  ==========  ==========  ==========  ====================\n")
        } else {
            format!("  ==========  =========={ku}  ==========  ==========  ==========  ==========  ====================\n")
        });
        for r in &self.rows {
            // No call with its exit: no time is known; no outermost call
            // with its exit (recursion whose outer exits were lost): no
            // total.
            let unknown = format!("{:>10}", "-");
            let t = |ns: u64| {
                if r.calls == r.no_exit {
                    unknown.clone()
                } else {
                    fmt_duration(ns)
                }
            };
            let total = if r.outer_calls == 0 {
                unknown.clone()
            } else {
                time(fmt_duration(r.total_ns), r.total_ns)
            };
            let self_time = if r.calls == r.no_exit {
                unknown.clone()
            } else {
                time(fmt_duration(r.self_ns), r.self_ns)
            };
            let no_exit = match (lost, r.no_exit) {
                (false, _) => String::new(),
                (true, 0) => format!("{:>10}  ", 0),
                (true, n) => format!("{}  ", paint(format!("{n:>10}"), "31")),
            };
            let kernel = if self.kernel {
                let k = |ns: Option<u64>| match ns {
                    Some(ns) if r.outer_calls > 0 => time(fmt_duration(ns), ns),
                    _ => unknown.clone(),
                };
                format!("  {}  {}", k(r.off_cpu_ns), k(r.syscall_ns))
            } else {
                String::new()
            };
            // A function on a trap: `*` in the first column (the legend
            // after the table).
            let mark = crate::mark_column(r.on_trap.is_some());
            s.push_str(&format!(
                "{mark} {}  {}{kernel}  {}  {}  {}  {no_exit}{:>10}  {}\n",
                total,
                self_time,
                t(r.avg_ns),
                t(r.min_ns),
                t(r.max_ns),
                r.calls,
                paint(r.name.clone(), "1")
            ));
        }
        if lost {
            s.push_str(&format!(
                "# {} of the calls have no exit (lost): not in the times\n",
                self.no_exit()
            ));
        }
        if let Some(legend) = self.trap_legend() {
            s.push_str(&legend);
            s.push('\n');
        }
        s
    }

    /// The legend of the rows marked `*` (functions on a trap), when
    /// there are some: each trap mechanism, and whether its calibrated
    /// cost a hit is out of these times.
    pub fn trap_legend(&self) -> Option<String> {
        crate::trap_legend(
            self.rows.iter().filter_map(|r| r.on_trap.as_deref()),
            &self.corrected,
        )
    }
}
