//! The agent of a process target: hotprobe's library inside the process
//! and the shared memory between it and the session. It is a resource of
//! the target that several mechanisms share, not a mechanism: the fast
//! path's patch and jump sites and the in-process traps run in it, their
//! counters and rings are in its shared memory, and the trap mechanism
//! publishes its `int3`s in its trap table (so that an agent whose tracer
//! died undoes them).

use super::foreign::note_foreign_writes;
use super::*;

/// How long an attach lets another thread's `dlopen` or `dlclose` run to
/// its end before it loads the agent (a program loading plugins all the
/// time is inside one at most moments).
const LOADER_SETTLE: std::time::Duration = std::time::Duration::from_millis(500);

/// Whether the target has the agent.
pub(super) enum AgentState {
    /// Not used, and why.
    Off(String),
    /// An attached process: the agent goes in at the first probe.
    Injectable,
    /// The agent is in and attached to our shared memory.
    On(Box<FastPath>),
}

/// The agent of one target, and the session probes its counters count for.
pub(super) struct Agent {
    pub(super) state: AgentState,
    /// Session probe id of each fast-path counter (the rings' events name
    /// counters).
    pub(super) ids: Vec<Option<ProbeId>>,
    /// The counters of each session probe the agent counts for: entries,
    /// and the exit placeholders' hits (returns) if any; one pair per
    /// place it was armed (a library loaded again at another address is
    /// probed again under the same probe).
    pub(super) counters: HashMap<ProbeId, Vec<(u32, Option<u32>)>>,
    /// Probes whose handlers run in the session through shared memory, by
    /// counter (a patch or jump's stub handler, an in-process trap's).
    pub(super) handlers: HashMap<u32, (ProbeId, Probe)>,
    /// Handler calls the session took, by counter, for every counter that
    /// ever had a shared-memory handler: its hits are the calls taken plus
    /// those the agent withdrew (see `Agent::add_counts`).
    pub(super) taken: HashMap<u32, u64>,
    /// The unwind tables published for `--stacks` (issue 24, `stacks.rs`).
    pub(super) stack_tables: crate::stacks::StackTables,
    /// The last serve of handler calls was woken for a wait status that
    /// was not this process's (a child of the host program's): the next
    /// one waits in a slice instead (`Session::poll_slot`).
    pub(super) child_wake_missed: bool,
}

impl Agent {
    pub(super) fn new(state: AgentState) -> Agent {
        Agent {
            state,
            ids: Vec::new(),
            counters: HashMap::new(),
            handlers: HashMap::new(),
            taken: HashMap::new(),
            stack_tables: crate::stacks::StackTables::new(),
            child_wake_missed: false,
        }
    }

    /// The fast path, when the agent is in.
    pub(super) fn fast_path(&self) -> Option<&FastPath> {
        match &self.state {
            AgentState::On(fp) => Some(fp),
            _ => None,
        }
    }

    /// The fast path, when the agent is in.
    pub(super) fn fast_path_mut(&mut self) -> Option<&mut FastPath> {
        match &mut self.state {
            AgentState::On(fp) => Some(fp),
            _ => None,
        }
    }

    /// The fast path's trap table, when the agent is in.
    pub(super) fn trap_table(&self) -> Option<TrapTable> {
        self.fast_path().map(FastPath::trap_table)
    }

    /// The agent loaded and attached, loading it into an attached process
    /// on first use; `Err(reason)` when it cannot be had.
    pub(super) fn ensure(
        &mut self,
        target: &mut HeldTarget,
        config: &FastPathConfig,
    ) -> Result<&mut FastPath, String> {
        if let AgentState::Injectable = self.state {
            if target
                .process()
                .is_some_and(|pt| pt.loader_busy() && !pt.settle_loader(LOADER_SETTLE))
            {
                // Attached while ld.so loads or relocates (a program just
                // started: a remote dlopen would run in an unrelocated
                // libc), or while another thread's dlopen did not end
                // within LOADER_SETTLE. Traps for now; a later placement
                // tries again.
                return Err(
                    "the agent could not be loaded yet: the program's dynamic loader \
                            is still loading (attached during its start or a dlopen)"
                        .into(),
                );
            }
            let r = match hotprobe_fastpath::find_agent() {
                Err(e) => Err(e.to_string()),
                Ok(agent) => match target.process() {
                    None => Err("not a process".to_string()),
                    Some(pt) => FastPath::inject(pt, &agent, *config).map_err(|e| e.to_string()),
                },
            };
            self.state = match r {
                Ok(fp) => AgentState::On(Box::new(fp)),
                Err(why) => AgentState::Off(format!("the agent could not be loaded: {why}")),
            };
        }
        match &mut self.state {
            AgentState::On(fp) => Ok(fp),
            AgentState::Off(why) => Err(why.clone()),
            AgentState::Injectable => Err("the agent is not loaded".into()),
        }
    }

    /// Binds counters `entry` (and `exit`, an exit placeholder's) to
    /// session probe `id`: its counts are theirs.
    pub(super) fn bind(&mut self, id: ProbeId, entry: u32, exit: Option<u32>) {
        self.counters.entry(id).or_default().push((entry, exit));
        for c in std::iter::once(entry).chain(exit) {
            let c = c as usize;
            if self.ids.len() <= c {
                self.ids.resize(c + 1, None);
            }
            self.ids[c] = Some(id);
        }
    }

    /// Session probe `id` on counter `counter`, whose handler runs in the
    /// session through shared memory: its hits are the calls taken or
    /// withdrawn, not the agent's count, which includes a call still
    /// waiting.
    pub(super) fn add_handler(&mut self, id: ProbeId, counter: u32, probe: Probe) {
        self.bind(id, counter, None);
        self.handlers.insert(counter, (id, probe));
        self.taken.entry(counter).or_insert(0);
    }

    /// Takes probe `id`'s shared-memory handler away (no call of it is
    /// served any more), handing it back.
    pub(super) fn take_handler(&mut self, id: ProbeId) -> Option<Probe> {
        let k = self
            .handlers
            .iter()
            .find_map(|(k, (p, _))| (*p == id).then_some(*k))?;
        self.handlers.remove(&k).map(|(_, p)| p)
    }

    /// Adds probe `id`'s counts in the agent's counters to `by`; false
    /// when the agent counts nothing for it.
    pub(super) fn add_counts(&self, id: ProbeId, me: i32, by: &mut ByProcess) -> bool {
        let Some(counters) = self.counters.get(&id) else {
            return false;
        };
        let Some(fp) = self.fast_path() else {
            return true;
        };
        for (c, exit) in counters {
            // Events the agent could not write (hits always count).
            let missed = fp.missed(*c);
            // A shared-memory handler's hit counts once its call is
            // taken or withdrawn (as a trap hit counts once handled):
            // the agent counts it before the call, so a thread waiting
            // for the next run would count without a handler run.
            let taken = self.taken.get(c).copied();
            for (pid, n) in fp.counts_by_process(*c) {
                let n = match taken {
                    Some(t) if pid as i32 == me => t + missed,
                    _ => n,
                };
                by.add(pid as i32, |st| st.hits += n);
            }
            if missed > 0 {
                by.add(me, |st| st.nmissed += missed);
            }
            for (pid, n) in exit.map(|e| fp.counts_by_process(e)).unwrap_or_default() {
                by.add(pid as i32, |st| st.returns += n);
            }
            // Returns whose values it aggregates (all processes' at once).
            if let Some(n) = super::agg::returns_aggregated(fp, *c) {
                by.add(me, |st| st.returns += n);
            }
        }
        true
    }

    /// Runs `f` on each counter of probe `id` (enable, disable, remove:
    /// see `hotprobe_fastpath`'s `control` module) with every thread
    /// stopped, then resumes them if the target was running.
    pub(super) fn change(
        &mut self,
        engine: &mut Engine,
        target: &mut HeldTarget,
        inbox: &mut super::Inbox,
        id: ProbeId,
        mut f: impl FnMut(
            &mut FastPath,
            &mut ProcessTarget,
            u32,
        ) -> Result<(), hotprobe_fastpath::FastPathError>,
    ) -> Result<(), EngineError> {
        let refused = |reason: &str| EngineError::RefusedSpec {
            spec: format!("probe {}", id.0),
            reason: reason.into(),
        };
        let counters: Vec<u32> = self
            .counters
            .get(&id)
            .map(|p| p.iter().map(|c| c.0).collect())
            .unwrap_or_default();
        let started = engine.started;
        let AgentState::On(fp) = &mut self.state else {
            return Err(refused("the fast path is not attached"));
        };
        if fp.is_detached() {
            return Err(refused("the fast path is detached"));
        }
        let pt = target.process().ok_or_else(|| refused("not a process"))?;
        // A process running untraced is taken back for the rewrite (the
        // caller lets it go again: `Session::maybe_release`).
        if pt.is_released() {
            pt.reacquire()?;
        }
        let mut r = Ok(());
        for c in counters {
            r = f(fp, pt, c);
            if r.is_err() {
                break;
            }
        }
        let resumed = match started {
            true => pt.resume_all(),
            false => Ok(()),
        };
        note_foreign_writes(engine, self, inbox);
        resumed?;
        Ok(r?)
    }
}

impl Agent {
    /// Writes the fast path's bytes again at `addrs`, sites that hold the
    /// original code again (see [`FastPath::rearm_reverted`]), and lets the
    /// threads go on: the sites rewritten.
    pub(super) fn rearm(
        &mut self,
        engine: &mut Engine,
        target: &mut HeldTarget,
        addrs: &[u64],
    ) -> Result<Vec<u64>, EngineError> {
        let started = engine.started;
        let AgentState::On(fp) = &mut self.state else {
            return Ok(Vec::new());
        };
        if fp.is_detached() {
            return Ok(Vec::new());
        }
        let Some(pt) = target.process() else {
            return Ok(Vec::new());
        };
        if pt.is_released() {
            pt.reacquire()?;
        }
        let r = fp.rearm_reverted(pt, addrs);
        let resumed = match started {
            true => pt.resume_all(),
            false => Ok(()),
        };
        resumed?;
        Ok(r?)
    }
}

/// A probe's counts per process, the process it was placed in first.
pub(super) struct ByProcess(pub(super) Vec<(i32, ProbeStats)>);

impl ByProcess {
    /// Adds to the counts of `pid` (a new row if it has none yet).
    pub(super) fn add(&mut self, pid: i32, f: impl FnOnce(&mut ProbeStats)) {
        match self.0.iter_mut().find(|(p, _)| *p == pid) {
            Some((_, st)) => f(st),
            None => {
                let mut st = ProbeStats::default();
                f(&mut st);
                self.0.push((pid, st));
            }
        }
    }

    /// Adds `s` to the counts of `pid`.
    pub(super) fn add_stats(&mut self, pid: i32, s: &ProbeStats) {
        self.add(pid, |st| {
            st.hits += s.hits;
            st.nmissed += s.nmissed;
            st.returns += s.returns;
            st.abandoned += s.abandoned;
        });
    }
}

/// Takes the agent's writes since the last call into the ledger (only
/// what is new, unless writes were taken back since: probing N names one
/// call each stays linear). An in-process trap is the agent's only
/// one-byte write (a patch call or a jump is 5 bytes at least). What a
/// forked child gets back is read from the ledger (`follow.rs`).
pub(super) fn sync_agent_writes(agent: &Agent, ledger: &mut CodeLedger) {
    let Some(fp) = agent.fast_path() else {
        return;
    };
    ledger.sync_agent(fp.written_count(), fp.removals(), |from| {
        fp.written_since(from)
            .into_iter()
            .map(|(a, b)| {
                let inproc = b.len() == 1;
                (a, b, inproc)
            })
            .collect()
    });
}
