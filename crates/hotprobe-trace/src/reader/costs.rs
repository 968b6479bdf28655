//! What a reader says of the probes' costs: the note on its times, the
//! warning when the calibration looks too high, and the functions that
//! went through a trap (docs/ANALYSIS.md, "Probe costs").

use super::TraceReader;

impl TraceReader {
    /// One line saying whether the times leave the probes' costs out, with
    /// each mechanism's cost a hit (`None` for a trace without costs).
    pub fn overhead_note(&self) -> Option<String> {
        let c = self.costs.as_ref()?;
        use crate::overhead::fmt_cost;
        let scan = self.correct.then(|| self.cost_scan()).flatten();
        let each = c
            .mechanisms
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let cap = scan.and_then(|s| s.shortest.get(i).copied().flatten());
                match cap {
                    Some(cap) if (cap as f64) < m.ns_per_hit.round() => format!(
                        "{} {} ({} of it within its calls: their shortest)",
                        m.label,
                        fmt_cost(m.ns_per_hit),
                        fmt_cost(cap as f64)
                    ),
                    _ => format!("{} {}", m.label, fmt_cost(m.ns_per_hit)),
                }
            })
            .collect::<Vec<_>>()
            .join(", ");
        // Mechanisms whose calibration was refused: their hits stay in.
        let left: String = c
            .uncalibrated
            .iter()
            .map(|u| {
                format!(
                    "; {} not calibrated ({}): its hits' cost left in the times",
                    u.label, u.why
                )
            })
            .collect();
        if c.mechanisms.is_empty() {
            return Some(format!(
                "times as measured, the probes' costs in them{}",
                left.strip_prefix(';').unwrap_or(&left)
            ));
        }
        Some(if self.correct {
            format!(
                "times without the probes' costs (a hit: {each}, calibrated when the \
                 recording started; --raw-times: as measured){left}"
            )
        } else if self.info.kernel.is_some() {
            format!(
                "times as measured, the probes' costs in them (a hit: {each}; not taken \
                 out: the host kernel's events share the clock){left}"
            )
        } else {
            format!("times as measured, the probes' costs in them (a hit: {each}){left}")
        })
    }

    /// A warning, once the streams were read, when the calibrated costs
    /// look too high for the times measured (see docs/ANALYSIS.md, "Probe
    /// costs"): more than 1 % of the probe hits read came sooner after
    /// the record before them than the costs allow, the time between held
    /// at zero. It names the mechanisms whose cost a hit is more than 1.5
    /// times their shortest call measured. `None` for measured times, a
    /// trace without costs, or costs that fit.
    pub fn correction_warning(&self) -> Option<String> {
        use crate::overhead::fmt_cost;
        let c = self.costs.as_ref().filter(|_| self.correct)?;
        let scan = self.scan.get()?;
        let (hits, held) = self.held.totals();
        if held == 0 || held.saturating_mul(100) <= hits {
            return None;
        }
        let mut high = String::new();
        for (m, cap) in c.mechanisms.iter().zip(&scan.shortest) {
            if let Some(cap) = cap.filter(|&cap| m.ns_per_hit > 1.5 * cap as f64) {
                high.push_str(&format!(
                    "; {}: {} a hit, its shortest call {}",
                    m.label,
                    fmt_cost(m.ns_per_hit),
                    fmt_cost(cap as f64)
                ));
            }
        }
        Some(format!(
            "warning: {held} of {hits} probe hits came sooner after the record before them \
             than the probes' calibrated costs allow (that time held at zero){high}; the \
             calibration looks too high (a loaded machine when recording?): --raw-times \
             gives the times as measured"
        ))
    }

    /// The trap mechanism `probe` went through ("in-process trap",
    /// "ptrace trap"), from the trace's `costs.tsv`: its hits cost µs
    /// each. `None` on the fast path, or in a trace without costs.
    pub fn trap_of(&self, probe: u32) -> Option<&str> {
        let (label, _) = self.costs.as_ref()?.label_of(probe)?;
        label.contains("trap").then_some(label)
    }

    /// The mechanisms whose calibrated cost a hit these times leave out
    /// (none for times as measured, `--raw-times`).
    pub fn corrected_mechanisms(&self) -> Vec<String> {
        match &self.costs {
            Some(c) if self.correct => c.mechanisms.iter().map(|m| m.label.clone()).collect(),
            _ => Vec::new(),
        }
    }

    /// The functions probed through a trap (ptrace or in-process), each
    /// with its mechanism, by name (empty for a trace without costs).
    pub fn trap_functions(&self) -> Vec<(String, String)> {
        let Some(c) = &self.costs else {
            return Vec::new();
        };
        let mut v: Vec<(String, String)> = c
            .probes
            .keys()
            .chain(c.uncalibrated_probes.keys())
            .filter_map(|&id| {
                let label = self.trap_of(id)?;
                Some((self.symbols.name(id).into_owned(), label.to_string()))
            })
            .collect();
        v.sort();
        v.dedup();
        v
    }
}

/// One line saying what `reader`'s times are
/// ([`TraceReader::overhead_note`]) and which functions went through a
/// trap, for exports with room for a line of text (`None` for a trace
/// without costs).
pub(crate) fn times_line(reader: &TraceReader) -> Option<String> {
    let note = reader.overhead_note()?;
    let traps = reader.trap_functions();
    if traps.is_empty() {
        return Some(note);
    }
    let names: Vec<String> = traps.iter().map(|(f, m)| format!("{f} ({m})")).collect();
    Some(format!("{note}; on a trap: {}", names.join(", ")))
}
