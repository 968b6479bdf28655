//! `hotprobe count`: probes that only count, and a table at the end.
//!
//! The session picks each site's mechanism (`--mechanism auto`): **patch**
//! (a placeholder NOP becomes a `call`), then **jump** (the first
//! instructions move to a trampoline), both counted in the target by the
//! hotprobe agent, else **trap**. The table says which mechanism each probe
//! got and why.

use crate::session::{print_table, Traced};
use anyhow::Result;
use hotprobe::{Action, MechanismChoice, SessionConfig};
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
    /// `--mechanism`.
    pub mechanism: MechanismChoice,
    /// `-f`: follow forked children, a row per probe and process.
    pub follow_forks: bool,
    /// `--force`: probe addresses not shown to start an instruction.
    pub force: bool,
}

/// Run `count`; returns hotprobe's exit code (the command's).
pub fn run(o: &CountOptions<'_>) -> Result<u8> {
    let config = SessionConfig {
        mechanism: o.mechanism,
        maxactive: o.maxactive,
        follow_forks: o.follow_forks,
        force: o.force,
        ..SessionConfig::default()
    };
    let mut t = Traced::open(config, o.pid, o.cmd)?;
    let placed = match t.add_all(o.probes, |_| Action::Count) {
        Ok(p) => p,
        Err(e) => {
            t.abandon();
            return Err(e);
        }
    };
    // The table prints whatever happened to the run.
    let ran = t.run(&placed, o.duration, None);
    print_table(&t.session, &placed, o.follow_forks);
    ran?;
    Ok(t.exit_code())
}
