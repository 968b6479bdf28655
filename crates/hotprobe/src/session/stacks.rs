//! Stacks at a hit (issue 24, `--stacks`): the session publishes a
//! process's unwind tables when a probe is placed, and reads the stacks the
//! agent counted, symbolized with the modules it published.

use super::*;

/// One captured stack of a probe, symbolized.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeStack {
    /// The callers, innermost first: the probed function's caller, its
    /// caller, … (`function` or `module!0xaddr`).
    pub frames: Vec<String>,
    /// The return addresses of the first stack seen with these names.
    pub addrs: Vec<u64>,
    /// The walk stopped before the outermost frame (depth limit, a frame it
    /// could not unwind).
    pub truncated: bool,
    /// Hits with this stack.
    pub count: u64,
}

/// The stack tables of an image a process left by executing another
/// program: its probes' stacks are named with its modules, and the walks
/// of its fork children still running it go on counting there.
pub(super) struct RetiredStacks {
    /// The slot of the process.
    slot: usize,
    /// The image's tables (its modules, its trap probes' stacks).
    tables: crate::stacks::StackTables,
    /// Its fast-path probes (their stacks are in the agent's region).
    fast: std::collections::HashSet<ProbeId>,
}

impl RetiredStacks {
    /// Whether probe `id` was placed in this image.
    fn owns(&self, id: ProbeId) -> bool {
        self.fast.contains(&id) || self.tables.trap.has_probe(id)
    }
}

impl Agent {
    /// The agent's stacks region, when these tables go there.
    fn stacks_view(&self) -> Option<hotprobe_abi::stacks::StacksView> {
        if !self.stack_tables.publishes_to_agent() {
            return None;
        }
        self.fast_path().and_then(|fp| fp.stacks())
    }

    /// Publishes the process's unwind tables and stack regions again where
    /// they changed (into the agent's stacks region, and for the trap's
    /// walks); a notice when they could not be.
    pub(super) fn refresh_stacks(&mut self, pid: i32) -> Option<String> {
        let view = self.stacks_view();
        if view.is_none() && !self.stack_tables.trap.is_active() {
            return None;
        }
        match self.stack_tables.refresh(pid as u32, view.as_ref()) {
            Ok(r) if r.failed.is_empty() => None,
            Ok(r) => Some(format!(
                "--stacks: no unwind table for {} (walked by frame pointers): {}",
                r.failed.len(),
                r.failed
                    .iter()
                    .map(|(p, e)| format!("{}: {e}", p.display()))
                    .collect::<Vec<_>>()
                    .join("; ")
            )),
            Err(e) => Some(format!("--stacks: {e}")),
        }
    }
}

impl Agent {
    /// After a thread started: its stack is published as readable (else
    /// its hits are counted as on an unpublished stack, with no frames).
    pub(super) fn refresh_stack_regions(&mut self, pid: i32) -> Option<String> {
        let view = self.stacks_view()?;
        match self.stack_tables.refresh_regions(pid as u32, &view) {
            Ok(_) => None,
            Err(e) => Some(format!("--stacks: {e}")),
        }
    }
}

impl Session {
    /// Slot `i` executed another program: the stack tables of the image it
    /// left are kept for that image's probes (named with its modules), and
    /// the new image gets tables of its own, walked by the trap (the agent
    /// is not in it), published as its probes are placed and its modules
    /// load.
    pub(super) fn retire_stacks(&mut self, i: usize) {
        let Some(slot) = self.slots.get_mut(i) else {
            return;
        };
        let old = std::mem::replace(
            &mut slot.agent.stack_tables,
            crate::stacks::StackTables::without_agent(),
        );
        // A fork child's hook is its root's tables: its new probes walk
        // into the new image's own.
        slot.engine.stack_hook = None;
        let fast: std::collections::HashSet<ProbeId> = match slot.agent.fast_path() {
            Some(fp) if fp.stacks().is_some() => slot.agent.counters.keys().copied().collect(),
            _ => Default::default(),
        };
        if old.trap.is_active() || !fast.is_empty() {
            self.retired_stacks.push(RetiredStacks {
                slot: i,
                tables: old,
                fast,
            });
        }
    }

    /// The stack tables probe `id` was placed with: those of the image it
    /// was placed in.
    fn stack_tables_of(&self, i: usize, id: ProbeId) -> Option<&crate::stacks::StackTables> {
        let retired = self
            .retired_stacks
            .iter()
            .find(|r| r.slot == i && r.owns(id));
        match retired {
            Some(r) => Some(&r.tables),
            None => self.slots.get(i).map(|s| &s.agent.stack_tables),
        }
    }

    /// Publishes the unwind tables (a library loaded) or the stack regions
    /// (a thread started) of target `i` again, for `--stacks`.
    pub(super) fn stacks_on_event(&mut self, i: usize, ev: &TargetEvent) {
        let Some(slot) = self.slots.get_mut(i) else {
            return;
        };
        let Some(pid) = slot.pid else { return };
        let notice = match ev {
            TargetEvent::ModulesChanged { .. } => slot.agent.refresh_stacks(pid),
            TargetEvent::ThreadCreated(_) => slot.agent.refresh_stack_regions(pid),
            _ => None,
        };
        if let Some(n) = notice {
            slot.notice(n);
        }
    }

    /// Trap probe `id` of target `t`, placed at a function's entry in a
    /// session opened with [`FastPathConfig::stacks`], walks its stack at
    /// each hit in the tracer (issue 24: the agent's walk needs its
    /// trampoline); the unwind tables are compiled at its first such probe.
    pub(super) fn trap_stacks_placed(&mut self, t: TargetId, id: ProbeId, at_entry: bool) {
        if !self.config.fast_path.stacks || !at_entry {
            return;
        }
        let Ok(slot) = self.slot(t) else { return };
        let Some(pid) = slot.pid.filter(|_| slot.is_process()) else {
            return;
        };
        let trap = slot.agent.stack_tables.trap.clone();
        let first = !trap.is_active();
        trap.add_probe(id);
        slot.engine.stack_hook.get_or_insert(trap);
        if first {
            if let Some(n) = slot.agent.refresh_stacks(pid) {
                slot.notice(n);
            }
        }
    }

    /// Probe `child` of followed fork child `t`, placed again for probe
    /// `parent` of slot `root`: its hits walk into the parent's stacks
    /// (the child's engine shares them; the modules are the parent's
    /// until the child executes another program).
    pub(super) fn trap_stacks_followed(
        &mut self,
        root: usize,
        t: TargetId,
        child: ProbeId,
        parent: ProbeId,
    ) {
        let Some(trap) = self
            .slots
            .get(root)
            .map(|s| s.agent.stack_tables.trap.clone())
        else {
            return;
        };
        if !trap.has_probe(parent) {
            return;
        }
        trap.add_alias(child, parent);
        if let Ok(slot) = self.slot(t) {
            slot.engine.stack_hook.get_or_insert(trap);
        }
    }

    /// The stacks captured at probe `id`'s entries (a fast-path probe of a
    /// session opened with [`FastPathConfig::stacks`], or a trap probe at
    /// a function's entry, walked in the tracer), most frequent first,
    /// with what the agent and the tracer counted beside them. `None` when
    /// the probe captures no stacks.
    pub fn stacks(&self, id: ProbeId) -> Option<(Vec<ProbeStack>, crate::stacks::StackTotals)> {
        let i = (id.0 >> TARGET_SHIFT) as usize;
        let slot = self.slots.get(i)?;
        let tables = self.stack_tables_of(i, id)?;
        let trap_totals = tables.trap.totals();
        // The agent's region holds the stacks of the image it was in.
        let view = slot
            .agent
            .fast_path()
            .and_then(|fp| fp.stacks())
            .filter(|_| tables.publishes_to_agent());
        let (all, mut totals) = if tables.trap.has_probe(id) {
            let totals = match &view {
                Some(v) => crate::stacks::read_stacks(v).1,
                None => crate::stacks::StackTotals::default(),
            };
            (tables.trap.stacks_of(id), totals)
        } else {
            let view = view?;
            let counters = slot.agent.counters.get(&id)?;
            let (all, totals) = crate::stacks::read_stacks(&view);
            let mine = all
                .into_iter()
                .filter(|s| counters.iter().any(|(c, _)| *c == s.probe))
                .collect();
            (mine, totals)
        };
        totals.captured += trap_totals.captured;
        totals.truncated += trap_totals.truncated;
        totals.no_region += trap_totals.no_region;
        totals.unwalked += trap_totals.unwalked;
        // Stacks with the same callers (by name) are one: a loop the
        // compiler unrolled calls from several addresses of one function.
        let mut merged: Vec<ProbeStack> = Vec::new();
        for s in all {
            let frames: Vec<String> = s.frames.iter().map(|a| tables.frame_name(*a)).collect();
            match merged
                .iter_mut()
                .find(|m| m.frames == frames && m.truncated == s.truncated)
            {
                Some(m) => m.count += s.count,
                None => merged.push(ProbeStack {
                    frames,
                    addrs: s.frames,
                    truncated: s.truncated,
                    count: s.count,
                }),
            }
        }
        merged.sort_by(|a, b| b.count.cmp(&a.count).then_with(|| a.frames.cmp(&b.frames)));
        Some((merged, totals))
    }

    /// Names the stacks of recorded entries of the targets placed so far
    /// (`RecordedEvent::reserved2` of an entry of a `--stacks` fast-path
    /// probe): [`crate::stacks::StackNames::call_stack`] with the target
    /// of the event's probe (`probe_id >> 24`). Usable while the session
    /// runs (it holds the stacks regions mapped).
    pub fn stack_names(&self) -> crate::stacks::StackNames {
        let mut names = crate::stacks::StackNames::new();
        for (i, slot) in self.slots.iter().enumerate() {
            if let Some(h) = slot.agent.fast_path().and_then(|fp| fp.stacks_handle()) {
                // The agent's stacks are of the image it was in: the first
                // one, if the process executed another program since.
                let tables = self
                    .retired_stacks
                    .iter()
                    .find(|r| r.slot == i)
                    .map_or(&slot.agent.stack_tables, |r| &r.tables);
                names.add_target(i as u32, h, tables.shared_symbols());
            }
        }
        names
    }

    /// The stacks of every probe of `placed` that has some, and of the
    /// probes placed in the programs followed processes executed
    /// ([`Session::exec_images`]), for a trace's `stacks.tsv` (the
    /// function's name, or the probe's label), with the totals of what
    /// the agents could not capture.
    pub fn captured_stacks(
        &self,
        placed: &[Placement],
    ) -> (
        Vec<hotprobe_trace::stacks::CapturedStack>,
        crate::stacks::StackTotals,
    ) {
        let mut out = Vec::new();
        let mut totals = crate::stacks::StackTotals::default();
        let mut seen_slots = std::collections::HashSet::new();
        let given: std::collections::HashSet<ProbeId> = placed.iter().map(|p| p.id).collect();
        let execd = self
            .exec_images
            .iter()
            .flat_map(|img| &img.placements)
            .filter(|p| !given.contains(&p.id));
        for p in placed.iter().chain(execd) {
            let Some((stacks, t)) = self.stacks(p.id) else {
                continue;
            };
            // One stacks region per target: its totals once.
            if seen_slots.insert(p.id.0 >> TARGET_SHIFT) {
                totals.captured += t.captured;
                totals.truncated += t.truncated;
                totals.torn += t.torn;
                totals.table_full += t.table_full;
                totals.no_region += t.no_region;
                totals.unwalked += t.unwalked;
            }
            let function = p.function.clone().unwrap_or_else(|| p.label.clone());
            out.extend(
                stacks
                    .into_iter()
                    .map(|s| hotprobe_trace::stacks::CapturedStack {
                        function: function.clone(),
                        callers: s.frames,
                        truncated: s.truncated,
                        count: s.count,
                    }),
            );
        }
        (out, totals)
    }
}
