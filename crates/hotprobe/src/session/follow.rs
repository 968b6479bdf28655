//! Fork children followed as targets of their own (`--follow-forks`).

use super::*;

impl Session {
    /// Takes the fork child `child` of slot `i` as a target of its own:
    /// the fast path's code stays in it (its agent counts into slots of
    /// its own), the trap `Count`/`Record` probes are placed in it again,
    /// return addresses swapped in its stack are put back (`fixes`).
    /// Where that fails the child is released without probes, with a notice.
    pub(super) fn follow_child(
        &mut self,
        i: usize,
        child: u64,
        fixes: Vec<(RuntimeAddr, Vec<u8>)>,
    ) {
        // A process that executed another program gives its children the
        // probes of its new image.
        let root = match self.slots[i].execd {
            true => i,
            false => self.slots[i].root.unwrap_or(i),
        };
        // The agent's writes in the parent's code, from its ledger.
        let rs = &mut self.slots[root];
        rs.sync_ledger();
        let inherited: Vec<(RuntimeAddr, Vec<u8>)> = rs
            .ledger
            .agent_writes()
            .into_iter()
            .map(|(a, b)| (RuntimeAddr(a), b))
            .collect();
        let adopted = Slot::process(&mut self.slots[i].engine)
            .ok_or_else(|| "not a process".to_string())
            .and_then(|pt| pt.adopt_fork_child(child).map_err(|e| e.to_string()));
        let mut pt = match adopted {
            Ok(pt) => pt,
            Err(why) => {
                let slot = &mut self.slots[i];
                let mut all = inherited;
                all.extend(fixes);
                let _ = slot.engine.target().release_fork_child(child, &all);
                slot.notice(format!(
                    "cannot follow forked child {child}: {why}; released without probes"
                ));
                return;
            }
        };
        for (a, b) in &fixes {
            let _ = pt.write_memory(*a, b);
        }
        let resolver = crate::ProcessResolver::new(child as i32).ok();
        let t = self.push_slot(
            pt.into(),
            resolver.map(|r| Box::new(r) as Box<dyn Resolver>),
            Some(child as i32),
            true,
            AgentState::Off("a followed child counts through its parent's fast path".into()),
        );
        let recording = self.slots[root].recording;
        let followable = self.slots[root].mechs.trap.followable.clone();
        let slot = &mut self.slots[t.0];
        slot.root = Some(root);
        slot.inherited = inherited;
        slot.recording = recording;
        let mut failed = Vec::new();
        for (rid, addr, is_return, record, exits) in followable {
            let placed = self
                .trap_form(t, is_return, record, None, exits)
                .and_then(|form| match form {
                    (_, Some(rp)) => self.retprobe_addr(t, addr, rp),
                    (p, None) => self.probe_addr(t, addr, p.unwrap_or_default()),
                });
            match placed {
                Ok(cid) => {
                    self.slots[t.0].origin.insert(cid, rid);
                    self.trap_stacks_followed(root, t, cid, rid);
                }
                Err(e) => failed.push(format!("{addr}: {e}")),
            }
        }
        let parent = self.slots[i].pid.unwrap_or(0);
        let slot = &mut self.slots[t.0];
        let msg = if failed.is_empty() {
            format!("pid {parent} forked {child}: followed")
        } else {
            format!(
                "pid {parent} forked {child}: followed, but without {} of its probes ({})",
                failed.len(),
                failed.join("; ")
            )
        };
        slot.notice(msg);
        match slot.engine.target().resume_all() {
            Ok(()) => slot.engine.started = true,
            Err(e) => slot.notice(format!("forked child {child} could not be resumed: {e}")),
        }
    }
}
