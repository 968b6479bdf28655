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
                "hotprobe: --stacks: no stacks for {} ({}: only probes at a function's entry capture them, on the patch, jump or trap mechanism)",
                p.label,
                p.mechanism
            );
            continue;
        };
        if stacks.is_empty() && session.stats(p.id).is_some_and(|s| s.hits > 0) {
            errln!(
                "hotprobe: --stacks: no stacks for {} ({}: only sites at a function's first instruction capture them)",
                p.label,
                p.mechanism
            );
        }
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
    }
}

/// `record --stacks`: writes the stacks the session captured into the
/// trace in `dir` (stacks.tsv), and says on stderr what was not captured.
pub fn write_trace_stacks(
    session: &Session,
    placed: &[Placement],
    dir: &std::path::Path,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let (stacks, totals) = session.captured_stacks(placed);
    hotprobe::trace::stacks::write_stacks(dir, &stacks).context("cannot write the stacks")?;
    let lost = totals.torn + totals.table_full;
    if lost > 0 {
        errln!(
            "hotprobe: --stacks: {lost} stacks not captured ({} walked while the tables changed, {} with the stack table full)",
            totals.torn,
            totals.table_full
        );
    }
    Ok(())
}

/// `report --callers FUNC`: the direct callers of the functions matching
/// the glob `func` in the stacks the trace in `dir` captured, most calls
/// first, each with the full stacks through it.
pub fn print_callers(dir: &std::path::Path, func: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    let stacks = hotprobe::trace::stacks::read_stacks(dir)
        .with_context(|| format!("cannot read the stacks of {}", dir.display()))?;
    let Some(stacks) = stacks else {
        anyhow::bail!(
            "{} has no captured stacks: record with --stacks",
            dir.display()
        );
    };
    let callers = hotprobe::trace::stacks::callers_of(&stacks, |f| {
        hotprobe::symbols::pattern::matches(func, f)
    });
    if callers.is_empty() {
        outln!("no call matches --callers {func}");
        return Ok(());
    }
    outln!("{:>10}  CALLER -> FUNCTION", "CALLS");
    for c in &callers {
        outln!("{:>10}  {} -> {}", c.count, c.caller, c.function);
        for (path, truncated, n) in &c.paths {
            let more = if *truncated { " <- [truncated]" } else { "" };
            outln!("{:>10}      {}{more}", n, path.join(" <- "));
        }
    }
    Ok(())
}

/// `export --format folded` of a trace with captured stacks (`record
/// --stacks`): the stacks in folded form, counted in calls; `None` when
/// the trace has none (the call tree is folded then).
pub fn captured_folded(dir: &std::path::Path, per_thread: bool) -> anyhow::Result<Option<String>> {
    use anyhow::Context;
    let Some(stacks) = hotprobe::trace::stacks::read_stacks(dir)
        .with_context(|| format!("cannot read the stacks of {}", dir.display()))?
    else {
        return Ok(None);
    };
    if per_thread {
        errln!("hotprobe: --per-thread: captured stacks are counted over all threads; folding the call tree");
        return Ok(None);
    }
    errln!("hotprobe: folded from the captured stacks (record --stacks), in calls");
    Ok(Some(hotprobe::trace::stacks::folded_stacks(&stacks)))
}

/// `report --graph FUNC`: the call graph below the functions matching the
/// glob `func`, from the recorded call tree.
pub fn print_graph(
    r: &hotprobe::trace::TraceReader,
    query: &hotprobe::trace::CompiledQuery,
    func: &str,
) -> anyhow::Result<()> {
    let roots = hotprobe::trace::graph::call_graph(
        r,
        query,
        |f| hotprobe::symbols::pattern::matches(func, f),
        None,
    )?;
    if roots.is_empty() {
        outln!("no call matches --graph {func}");
        return Ok(());
    }
    for g in &roots {
        outln!("# call graph of {}", g.function);
        for line in g.to_text().lines() {
            outln!("{line}");
        }
    }
    Ok(())
}
