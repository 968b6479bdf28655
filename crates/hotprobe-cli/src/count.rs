//! `hotprobe count`: trap probes that only count, and a table at the end.

use crate::session::{progress, Placed, Traced};
use anyhow::{bail, Result};
use hotprobe::{Probe, RetProbe, Session};
use std::ffi::OsString;
use std::time::Duration;

/// What `count` needs from the command line.
pub struct CountOptions<'a> {
    /// Probe specs.
    pub probes: &'a [String],
    /// Attach to this process.
    pub pid: Option<i32>,
    /// Or start this command.
    pub cmd: &'a [OsString],
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Live return instances followed at once for `%return` probes.
    pub maxactive: usize,
}

/// Run `count`.
pub fn run(o: &CountOptions<'_>) -> Result<()> {
    let mut t = Traced::open(o.pid, o.cmd)?;
    let placed = match place(&mut t, o) {
        Ok(p) => p,
        Err(e) => {
            t.abandon();
            return Err(e);
        }
    };
    t.run(placed.len(), o.duration)?;
    print_table(&t.session, &placed);
    Ok(())
}

fn place(t: &mut Traced, o: &CountOptions<'_>) -> Result<Vec<Placed>> {
    let sites = t.resolve_all(o.probes)?;
    let bar = progress(sites.len() as u64, "placing probes");
    let mut placed = Vec::new();
    for s in sites {
        bar.inc(1);
        let addr = s.resolved.addr;
        let id = if s.is_return {
            if s.resolved.offset != 0 {
                bail!(
                    "cannot probe {}: a return probe goes on a function's first instruction, \
                     and {:#x} is {} bytes into {}",
                    s.label,
                    addr.0,
                    s.resolved.offset,
                    s.resolved.function.as_deref().unwrap_or("its function")
                );
            }
            t.session
                .retprobe_addr(t.target, addr, RetProbe::new(o.maxactive))?
        } else {
            t.session.probe_addr(t.target, addr, Probe::new())?
        };
        placed.push(Placed {
            label: s.label,
            id,
            addr: addr.0,
            is_return: s.is_return,
            execution: t.execution(id),
        });
    }
    bar.finish_and_clear();
    Ok(placed)
}

/// Print the per-probe table on stdout: spec, address, hits (returns for a
/// `%return` probe), nmissed (return probes only), execution.
pub fn print_table(session: &Session, placed: &[Placed]) {
    let rows: Vec<[String; 5]> = placed
        .iter()
        .map(|p| {
            let st = session.stats(p.id).unwrap_or_default();
            let (hits, missed) = if p.is_return {
                (st.returns, st.nmissed.to_string())
            } else {
                (st.hits, "-".to_string())
            };
            [
                p.label.clone(),
                format!("{:#x}", p.addr),
                hits.to_string(),
                missed,
                p.execution.clone(),
            ]
        })
        .collect();
    let head = ["PROBE", "ADDRESS", "HITS", "NMISSED", "EXECUTION"];
    let mut w = head.map(str::len);
    for r in &rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |c: &[String; 5]| {
        format!(
            "{:<w0$}  {:<w1$}  {:>w2$}  {:>w3$}  {}",
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2],
            w3 = w[3]
        )
    };
    println!("{}", line(&head.map(String::from)));
    for r in &rows {
        println!("{}", line(r));
    }
}
