//! `hotprobe trace`: a live call tree in the manner of `uftrace replay`.
//!
//! ```text
//! # DURATION     TID     FUNCTION
//!             [ 41234] | fib(3) {
//!             [ 41234] |   fib(2) {
//!    1.234 us [ 41234] |   } /* fib */ = 1
//!   12.345 us [ 41234] | } /* fib */ = 2
//! ```
//! Each traced function gets a return probe whose entry handler prints the
//! opening line and whose return handler prints the closing one with the
//! call's duration; indentation is the call depth of followed calls on
//! that thread.

use crate::count::print_table;
use crate::session::{progress, Placed, Traced};
use anyhow::{bail, Result};
use hotprobe::{HitContext, RetProbe};
use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::OsString;
use std::io::Write;
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
    /// Live calls followed at once per function.
    pub maxactive: usize,
    /// Stop after this long.
    pub duration: Option<Duration>,
    /// Print the count table at the end.
    pub summary: bool,
}

/// Per-thread call depth and the output format, shared by every handler.
pub(crate) struct Printer {
    depth: HashMap<u64, usize>,
    args: Option<usize>,
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

/// A duration in a fixed 11-character column: `1234.567 us`-style with
/// three decimals and the unit (us, ms, s).
pub fn format_duration(d: Duration) -> String {
    let ns = d.as_nanos() as f64;
    let (v, unit) = if ns < 1e6 {
        (ns / 1e3, "us")
    } else if ns < 1e9 {
        (ns / 1e6, "ms")
    } else {
        (ns / 1e9, " s")
    };
    format!("{v:8.3} {unit}")
}

pub(crate) fn emit(line: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    // A closed pipe (e.g. `| head`) must not kill the target's session.
    let _ = out.write_fmt(line);
    let _ = out.write_all(b"\n");
    let _ = out.flush();
}

impl Printer {
    /// A printer showing `args` argument registers (and return values).
    pub(crate) fn new(args: Option<usize>) -> Self {
        Printer {
            depth: HashMap::new(),
            args,
        }
    }

    /// Print the opening line of a call.
    pub(crate) fn entry(&mut self, name: &str, ctx: &HitContext<'_>) {
        let tid = ctx.thread().0;
        let d = self.depth.entry(tid).or_insert(0);
        let indent = "  ".repeat(*d);
        *d += 1;
        let args = match self.args {
            Some(n) => (0..n)
                .filter_map(|i| ctx.arg(i))
                .map(format_value)
                .collect::<Vec<_>>()
                .join(", "),
            None => String::new(),
        };
        emit(format_args!(
            "{:>11} [{tid:>6}] | {indent}{name}({args}) {{",
            ""
        ));
    }

    /// Print the closing line of a call, with its duration.
    pub(crate) fn ret(&mut self, name: &str, ctx: &HitContext<'_>) {
        let tid = ctx.thread().0;
        let (depth, dur) = match ctx.entry() {
            Some(e) => (e.depth, e.time.elapsed()),
            None => (
                self.depth.get(&tid).map_or(0, |d| d.saturating_sub(1)),
                Duration::ZERO,
            ),
        };
        // Resynchronise with the engine (frames abandoned by longjmp).
        self.depth.insert(tid, depth);
        let indent = "  ".repeat(depth);
        let ret = match self.args {
            Some(_) => format!(" = {}", format_value(ctx.return_value())),
            None => String::new(),
        };
        emit(format_args!(
            "{} [{tid:>6}] | {indent}}} /* {name} */{ret}",
            format_duration(dur)
        ));
    }
}

/// Run `trace`.
/// The return probe that prints `r`'s calls into the call tree of
/// `printer`; an error if `r` is not a function's start (`label` is the
/// spec the user gave).
pub(crate) fn call_tree_retprobe(
    printer: &Rc<RefCell<Printer>>,
    label: &str,
    r: &hotprobe::ResolvedProbe,
    maxactive: usize,
) -> Result<RetProbe> {
    if r.offset != 0 {
        bail!(
            "cannot trace {label}: {:#x} is {} bytes into {}; trace follows whole functions \
             (use `count` for other instructions)",
            r.addr.0,
            r.offset,
            r.function.as_deref().unwrap_or("a function")
        );
    }
    let name = r
        .function
        .clone()
        .unwrap_or_else(|| format!("{:#x}", r.addr.0));
    let (p1, p2, n1, n2) = (printer.clone(), printer.clone(), name.clone(), name);
    Ok(RetProbe::new(maxactive)
        .entry(move |ctx| p1.borrow_mut().entry(&n1, ctx))
        .ret(move |ctx| p2.borrow_mut().ret(&n2, ctx)))
}

pub fn run(o: &TraceOptions<'_>) -> Result<()> {
    if let Some(n) = o.args {
        if n > 6 {
            bail!("--args {n}: at most 6 argument registers (rdi, rsi, rdx, rcx, r8, r9)");
        }
    }
    let mut t = Traced::open(o.pid, o.cmd)?;
    let placed = match place(&mut t, o) {
        Ok(p) => p,
        Err(e) => {
            t.abandon();
            return Err(e);
        }
    };
    emit(format_args!("{HEADER}"));
    t.run(placed.len(), o.duration)?;
    if o.summary {
        println!();
        print_table(&t.session, &placed);
    }
    Ok(())
}

fn place(t: &mut Traced, o: &TraceOptions<'_>) -> Result<Vec<Placed>> {
    let sites = t.resolve_all(o.probes)?;
    let printer = Rc::new(RefCell::new(Printer {
        depth: HashMap::new(),
        args: o.args,
    }));
    let bar = progress(sites.len() as u64, "placing probes");
    let mut placed = Vec::new();
    for s in sites {
        bar.inc(1);
        let r = &s.resolved;
        let rp = call_tree_retprobe(&printer, &s.label, r, o.maxactive)?;
        let id = t.session.retprobe_addr(t.target, r.addr, rp)?;
        placed.push(Placed {
            label: s.label.trim_end_matches("%return").to_string(),
            id,
            addr: r.addr.0,
            is_return: true,
            execution: t.execution(id),
        });
    }
    bar.finish_and_clear();
    Ok(placed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_and_durations() {
        assert_eq!(format_value(7), "7");
        assert_eq!(format_value(u64::MAX), "-1");
        assert_eq!(format_value(0x7ffd_1234_5678), "0x7ffd12345678");
        assert_eq!(format_duration(Duration::from_nanos(1234)), "   1.234 us");
        assert_eq!(format_duration(Duration::from_micros(2500)), "   2.500 ms");
        assert_eq!(format_duration(Duration::from_millis(1500)), "   1.500  s");
        assert_eq!(format_duration(Duration::ZERO).len(), 11);
    }
}
