//! The mark of the lines of a function probed through a trap, and its
//! legend: `*` in the first column of `report`'s rows, `replay`'s lines and
//! `hotprobe trace`'s live lines, and one line after them saying what it
//! means (docs/ANALYSIS.md, "Probe costs").

/// What marks a line of a function probed through a trap.
pub const TRAP_MARK: char = '*';

/// The first column of a line: [`TRAP_MARK`] for a function probed
/// through a trap (`on_trap`), else a blank.
pub fn mark_column(on_trap: bool) -> char {
    if on_trap {
        TRAP_MARK
    } else {
        ' '
    }
}

/// The trap mechanisms of the lines marked so far, for the legend after
/// them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrapMarks {
    /// Each mechanism marked, once, in the order first marked.
    labels: Vec<String>,
}

impl TrapMarks {
    /// Marks `lead`, a line's start whose first character is a blank kept
    /// for the mark, when its function went through the trap mechanism
    /// `on_trap` ("in-process trap", "ptrace trap"): [`TRAP_MARK`] in
    /// place of that blank, the mechanism noted for [`TrapMarks::legend`].
    /// `None` (the fast path, or a line of no function) leaves it as is.
    pub fn mark(&mut self, lead: &mut String, on_trap: Option<&str>) {
        let Some(label) = on_trap else { return };
        if !self.labels.iter().any(|l| l == label) {
            self.labels.push(label.to_string());
        }
        if !lead.is_empty() {
            lead.replace_range(..1, TRAP_MARK.encode_utf8(&mut [0; 4]));
        }
    }

    /// The legend of the lines marked ([`trap_legend`]), `corrected`
    /// naming the mechanisms whose cost a hit the times leave out; `None`
    /// when no line was marked.
    pub fn legend(&self, corrected: &[String]) -> Option<String> {
        trap_legend(self.labels.iter().map(String::as_str), corrected)
    }
}

/// The legend of the lines marked `*` (functions on a trap) in `report`'s
/// table, `replay`'s tree and `hotprobe trace`'s live one: `# * on a trap
/// (LABEL: µs a hit, taken out of these times as calibrated; …)`, each
/// mechanism of `labels` once, sorted, `left in these times` for one not
/// in `corrected`. `None` when `labels` is empty.
pub fn trap_legend<'a>(
    labels: impl IntoIterator<Item = &'a str>,
    corrected: &[String],
) -> Option<String> {
    let mut labels: Vec<&str> = labels.into_iter().collect();
    labels.sort_unstable();
    labels.dedup();
    if labels.is_empty() {
        return None;
    }
    let each: Vec<String> = labels
        .iter()
        .map(|l| {
            let how = if corrected.iter().any(|c| c == l) {
                "taken out of these times as calibrated"
            } else {
                "left in these times"
            };
            format!("{l}: µs a hit, {how}")
        })
        .collect();
    Some(format!("# {TRAP_MARK} on a trap ({})", each.join("; ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_replace_the_blank_and_the_legend_names_each_mechanism_once() {
        let mut marks = TrapMarks::default();
        assert_eq!(marks.legend(&[]), None);
        let mut fast = String::from("    1.234 us [  42] ");
        marks.mark(&mut fast, None);
        assert_eq!(fast, "    1.234 us [  42] ");
        assert_eq!(marks.legend(&[]), None);
        for label in ["ptrace trap", "in-process trap", "ptrace trap"] {
            let mut lead = String::from("            [  42] ");
            marks.mark(&mut lead, Some(label));
            assert_eq!(lead, "*           [  42] ");
        }
        assert_eq!(
            marks.legend(&["ptrace trap".to_string()]).as_deref(),
            Some(
                "# * on a trap (in-process trap: µs a hit, left in these times; ptrace trap: \
                 µs a hit, taken out of these times as calibrated)"
            )
        );
        assert_eq!(mark_column(true), '*');
        assert_eq!(mark_column(false), ' ');
    }
}
