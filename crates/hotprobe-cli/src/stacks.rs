//! `--stacks`: prints the stacks the session counted at each probe
//! (`count --stacks FUNC`), most frequent first, symbolized. The stacks
//! are captured and symbolized by the library (`Session::stacks`); this
//! module only prints.

use crate::out::{errln, outln};
use hotprobe::{Placement, Session};

/// Prints each probe's stacks: a block per stack, its count, then its
/// frames (the probed function's caller first), `[truncated]` where the
/// walk stopped early; and on stderr what could not be captured.
pub fn print_stacks(session: &Session, placed: &[Placement]) {
    for p in placed {
        let Some((stacks, totals)) = session.stacks(p.id) else {
            errln!(
                "hotprobe: --stacks: no stacks for {} ({}: only the patch and jump mechanisms capture them)",
                p.label,
                p.mechanism
            );
            continue;
        };
        outln!();
        outln!("stacks of {} (most frequent first):", p.label);
        for s in &stacks {
            outln!("  {:>10}", s.count);
            for f in &s.frames {
                outln!("      {f}");
            }
            if s.truncated {
                outln!("      [truncated]");
            }
        }
        let lost = totals.torn + totals.table_full;
        if lost > 0 {
            errln!(
                "hotprobe: --stacks: {lost} stacks not counted ({} walked while the tables changed, {} with the stack table full)",
                totals.torn,
                totals.table_full
            );
        }
        if totals.no_region > 0 {
            errln!(
                "hotprobe: --stacks: {} hits on a stack the tracer had not published (a thread started later): no frames",
                totals.no_region
            );
        }
    }
}
