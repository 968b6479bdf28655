//! Opening targets: a program started, a process attached to.

use super::*;

impl Session {
    /// Start `program` with `args`, stopped before it runs its own code
    /// (libraries loaded). With the fast path on (any mechanism choice but
    /// `Trap`), the agent is preloaded.
    pub fn spawn(
        &mut self,
        program: &Path,
        args: &[std::ffi::OsString],
    ) -> Result<TargetId, EngineError> {
        self.spawn_with(program, args, &SpawnOptions::default())
    }

    /// As [`Session::spawn`], with the child's standard streams and
    /// environment as `opts` says.
    pub fn spawn_with(
        &mut self,
        program: &Path,
        args: &[std::ffi::OsString],
        opts: &SpawnOptions,
    ) -> Result<TargetId, EngineError> {
        let dup = |f: &Option<std::fs::File>| -> Result<Option<std::fs::File>, EngineError> {
            f.as_ref()
                .map(|f| f.try_clone())
                .transpose()
                .map_err(|e| EngineError::Io {
                    what: "duplicate a standard stream for the target".into(),
                    source: e,
                })
        };
        let mut opts = SpawnOptions {
            stdin: dup(&opts.stdin)?,
            stdout: dup(&opts.stdout)?,
            stderr: dup(&opts.stderr)?,
            env: opts.env.clone(),
            stop_at_entry: opts.stop_at_entry,
        };
        let mut pending = None;
        let mut fast_off = None;
        if self.config.mechanism == MechanismChoice::Trap {
            fast_off = Some("--mechanism trap".to_string());
        } else {
            match hotprobe_fastpath::find_agent() {
                Ok(agent) => {
                    pending = Some(FastPath::for_spawn(
                        &mut opts,
                        &agent,
                        self.config.fast_path,
                    )?)
                }
                // A bad explicit override is the user's error, not a reason
                // to fall back to traps quietly.
                Err(e @ hotprobe_fastpath::FastPathError::AgentOverride { .. }) => {
                    return Err(e.into())
                }
                Err(e) => fast_off = Some(e.to_string()),
            }
        }
        let mut t = ProcessTarget::spawn_with(program, args, &opts)?;
        t.share_strays(&self.strays);
        let fast = match (pending, fast_off) {
            (Some(p), _) => match p.attach(&mut t) {
                Ok(fp) => AgentState::On(Box::new(fp)),
                Err(e) => AgentState::Off(format!("no agent in the target ({e})")),
            },
            (None, Some(why)) => AgentState::Off(why),
            (None, None) => AgentState::Off("no agent".into()),
        };
        let pid = t.pid();
        let r = crate::ProcessResolver::new(pid)?;
        Ok(self.push_slot(t.into(), Some(Box::new(r)), Some(pid), true, fast))
    }

    /// Attach to process `pid` (all threads), stopped until
    /// [`Session::start`]. The agent is loaded at once when it can be
    /// (whatever the mechanisms: should hotprobe be killed, the agent undoes
    /// the trap mechanism's `int3`s, see [`hotprobe_fastpath::TrapTable`]);
    /// when it cannot, probes use traps. A process another hotprobe
    /// session probes is refused ([`hotprobe_fastpath::check_not_probed`]).
    pub fn attach(&mut self, pid: i32) -> Result<TargetId, EngineError> {
        let fast = match hotprobe_fastpath::find_agent() {
            Err(e @ hotprobe_fastpath::FastPathError::AgentOverride { .. }) => return Err(e.into()),
            _ => AgentState::Injectable,
        };
        // Another session's probes, held or released, are not taken over
        // (issue 22): refused before anything is done to the process.
        hotprobe_fastpath::check_not_probed(pid)?;
        let mut t = ProcessTarget::attach(pid)?;
        t.share_strays(&self.strays);
        let r = crate::ProcessResolver::new(pid)?;
        // The agent goes in with the first probe placed (fast or trap: with
        // it the program survives hotprobe's death, see `publish_traps`), so
        // that a refused probe leaves the process untouched.
        Ok(self.push_slot(t.into(), Some(Box::new(r)), Some(pid), false, fast))
    }
}
