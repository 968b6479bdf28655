//! What `count`, `trace` and `demo` share: getting a target (spawned or
//! attached), turning probe specs into checked addresses, running the event
//! loop until the target exits, Ctrl-C or `--duration`, and leaving the
//! target clean.

use crate::glob;
use crate::signals::{self, StopReason};
use anyhow::{bail, Context, Result};
use hotprobe::{
    ProbeId, ProbeSpec, ProcessResolver, ProcessTarget, ResolvedProbe, RunEnd, Session,
    SpawnOptions, TargetId,
};
use hotprobe_symbols::ProcessSymbols;
use indicatif::{ProgressBar, ProgressStyle};
use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

/// A target under a session.
pub struct Traced {
    /// The session holding the target.
    pub session: Session,
    /// The target's id in the session.
    pub target: TargetId,
    /// Its process id.
    pub pid: i32,
    /// Started by us (`-- CMD`) rather than attached (`-p PID`).
    pub spawned: bool,
    /// The fast path (patch and jump probes run by the in-target agent),
    /// when `count` uses it; its bytes are restored before any detach.
    pub fast: Option<hotprobe_fastpath::FastPath>,
}

/// One address a probe spec resolved to, with the label shown to the user.
pub struct Site {
    /// What the user sees: the spec, or for a spec naming several
    /// addresses, the spec and the function+offset of this one.
    pub label: String,
    /// Where and what.
    pub resolved: ResolvedProbe,
    /// A return probe (`%return`).
    pub is_return: bool,
}

/// A probe that was placed, for the summary.
pub struct Placed {
    /// The label of its site.
    pub label: String,
    /// Its id in the session.
    pub id: ProbeId,
    /// The run-time address.
    pub addr: u64,
    /// A return probe (its hits are returns; `nmissed` matters).
    pub is_return: bool,
    /// How hits are executed ("trap (boosted)", ...), read when placed
    /// (the engine forgets it at detach).
    pub execution: String,
}

impl Traced {
    /// Attach to `pid`, or start `cmd` stopped at its entry point.
    pub fn open(pid: Option<i32>, cmd: &[OsString]) -> Result<Traced> {
        let mut session = Session::new();
        match (pid, cmd.split_first()) {
            (Some(pid), None) => {
                let target = session.attach(pid)?;
                Ok(Traced {
                    session,
                    target,
                    pid,
                    spawned: false,
                    fast: None,
                })
            }
            (None, Some((prog, args))) => {
                let t = ProcessTarget::spawn_with(Path::new(prog), args, &SpawnOptions::default())?;
                let pid = t.pid();
                let r = ProcessResolver::new(pid)?;
                let target = session.add_target(Box::new(t), Some(Box::new(r)));
                Ok(Traced {
                    session,
                    target,
                    pid,
                    spawned: true,
                    fast: None,
                })
            }
            _ => bail!("give either -p PID or -- CMD ARGS"),
        }
    }

    /// A target opened by the caller (with a fast path set up on it).
    pub fn from_target(
        t: ProcessTarget,
        spawned: bool,
        fast: Option<hotprobe_fastpath::FastPath>,
    ) -> Result<Traced> {
        let pid = t.pid();
        let r = ProcessResolver::new(pid)?;
        let mut session = Session::new();
        let target = session.add_target(Box::new(t), Some(Box::new(r)));
        Ok(Traced {
            session,
            target,
            pid,
            spawned,
            fast,
        })
    }

    /// Restores the bytes the fast path rewrote (before a detach).
    fn detach_fast(&mut self) -> Result<()> {
        if let Some(fp) = &mut self.fast {
            let t = self.session.engine(self.target)?.target();
            fp.detach(t)
                .with_context(|| format!("cannot remove the fast probes from pid {}", self.pid))?;
        }
        Ok(())
    }

    /// Leave the target as it was after a failure: an attached one is
    /// detached (text restored, running on); a spawned one is killed when
    /// the session drops.
    pub fn abandon(mut self) {
        if !self.spawned {
            let _ = self.detach_fast();
            let _ = self.session.detach();
        }
    }

    /// Resolve every spec (wildcards in a function name are expanded over
    /// the module's functions; matches that cannot be probed are skipped
    /// with a warning), with a progress bar when there are many.
    pub fn resolve_all(&mut self, specs: &[String]) -> Result<Vec<Site>> {
        let bar = progress(specs.len() as u64, "resolving");
        let mut sites = Vec::new();
        for spec in specs {
            bar.set_message(spec.clone());
            let parsed: ProbeSpec = spec.parse()?;
            match &parsed {
                ProbeSpec::Function { module, name, .. } if glob::is_pattern(name) => {
                    let found = self.expand(module.as_deref(), name, parsed.is_return(), &bar)?;
                    if found.is_empty() {
                        bail!("no function matches `{spec}`");
                    }
                    sites.extend(found);
                }
                _ => {
                    let resolved = self.session.resolve(self.target, spec)?;
                    let many = resolved.len() > 1;
                    for r in resolved {
                        let label = if many {
                            format!("{spec} @ {}", short(&r))
                        } else {
                            spec.clone()
                        };
                        sites.push(Site {
                            label,
                            is_return: parsed.is_return(),
                            resolved: r,
                        });
                    }
                }
            }
            bar.inc(1);
        }
        bar.finish_and_clear();
        Ok(sites)
    }

    fn expand(
        &mut self,
        module: Option<&str>,
        pattern: &str,
        is_return: bool,
        bar: &ProgressBar,
    ) -> Result<Vec<Site>> {
        let syms = ProcessSymbols::for_pid(self.pid as u32)?;
        let lm = match module {
            Some(m) => syms.find_module(m)?,
            None => syms
                .main_module()
                .context("the target's main executable is not mapped")?,
        };
        let mut seen = std::collections::BTreeSet::new();
        let matches: Vec<_> = lm
            .module
            .functions()
            .iter()
            .filter(|f| glob::matches(pattern, &f.name) || glob::matches(pattern, &f.raw_name))
            .filter(|f| seen.insert(f.addr))
            .collect();
        if matches.len() > 2000 {
            bail!(
                "`{pattern}` matches {} functions in {}: narrow it down (at most 2000)",
                matches.len(),
                lm.name
            );
        }
        bar.inc_length(matches.len() as u64);
        let mut out = Vec::new();
        for f in matches {
            bar.inc(1);
            let spec = format!(
                "{}:{:#x}{}",
                lm.name,
                f.addr.0,
                if is_return { "%return" } else { "" }
            );
            match self.session.resolve(self.target, &spec) {
                Ok(rs) => out.extend(rs.into_iter().map(|r| Site {
                    label: format!("{}{}", f.name, if is_return { "%return" } else { "" }),
                    is_return,
                    resolved: r,
                })),
                Err(e) => bar.suspend(|| eprintln!("hotprobe: skipping {}: {e}", f.name)),
            }
        }
        Ok(out)
    }

    /// How hits of probe `id` execute, as a column value.
    pub fn execution(&self, id: ProbeId) -> String {
        match self.session.execution_of(id) {
            Some(e) => format!("trap ({e})"),
            None => "trap".into(),
        }
    }

    /// Let the target run with its probes and handle events until it exits,
    /// a signal arrives or `duration` elapses; then detach if it still runs,
    /// and print what happened on stderr.
    pub fn run(&mut self, nprobes: usize, duration: Option<Duration>) -> Result<()> {
        self.session.start()?;
        if self.spawned {
            eprintln!("hotprobe: started pid {}: {nprobes} probes", self.pid);
        } else {
            eprintln!("hotprobe: attached to pid {}: {nprobes} probes", self.pid);
        }
        if let Some(d) = duration {
            signals::stop_after(d);
        }
        let end = match self.session.run_until(&signals::STOP) {
            Ok(end) => end,
            Err(e) => {
                let _ = self.detach_fast();
                let _ = self.session.detach();
                self.print_notices();
                return Err(e).context("the event loop failed; detached");
            }
        };
        match end {
            RunEnd::AllExited => {}
            RunEnd::Interrupted | RunEnd::Stopped => {
                self.detach_fast()?;
                self.session
                    .detach()
                    .with_context(|| format!("cannot detach from pid {}", self.pid))?;
                let why = match signals::stop_reason() {
                    Some(StopReason::Timer) => "duration elapsed".to_string(),
                    Some(StopReason::Signal(libc::SIGINT)) => "interrupted".to_string(),
                    Some(StopReason::Signal(s)) => format!("signal {s}"),
                    None => "stopped".to_string(),
                };
                if self.spawned {
                    eprintln!(
                        "hotprobe: {why}: detached from pid {} (started by hotprobe), \
                         which runs on without probes",
                        self.pid
                    );
                } else {
                    eprintln!(
                        "hotprobe: {why}: detached from pid {}, which runs on with its code restored",
                        self.pid
                    );
                }
            }
        }
        self.print_notices();
        Ok(())
    }

    fn print_notices(&mut self) {
        for n in self.session.take_notices() {
            eprintln!("hotprobe: {n}");
        }
    }
}

/// `compute+0x4 [target]`.
fn short(r: &ResolvedProbe) -> String {
    match &r.function {
        Some(f) if r.offset == 0 => f.clone(),
        Some(f) => format!("{f}+{:#x}", r.offset),
        None => format!("{:#x}", r.addr.0),
    }
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    if let Ok(style) =
        ProgressStyle::with_template(&format!("{{spinner}} {what} {{pos}}/{{len}} {{wide_msg}}"))
    {
        bar.set_style(style);
    }
    bar
}
