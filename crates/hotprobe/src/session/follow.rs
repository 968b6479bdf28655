//! Forked children: what each gets back, from one walk of its parent's
//! code ledger, and those followed as targets of their own
//! (`--follow-forks`).

use super::*;

impl Session {
    /// A child forked by slot `i`'s process, held stopped since its fork
    /// (the session holds every fork: what the child gets back is decided
    /// here, by one walk of the forking process's code ledger). Not
    /// followed: every byte of every mechanism goes back to its original in
    /// the child, and the return addresses swapped in the forking thread's
    /// stack (`fixes`), before it is let go without probes. Followed
    /// (`--follow-forks`): the `int3`s go back too, the agent's writes
    /// stay (its agent counts through them into slots of its own; the
    /// child's ledger takes them in as inherited), and the child is taken
    /// as a target of its own (see [`Session::follow_child`]).
    pub(super) fn take_fork_child(
        &mut self,
        i: usize,
        child: u64,
        fixes: Vec<(RuntimeAddr, Vec<u8>)>,
    ) {
        let follow = self.slots[i].follow_forks;
        let slot = &mut self.slots[i];
        slot.tell_mechanisms_of(&mech::TargetChange::Forked { child });
        slot.sync_ledger();
        let Slot { target, ledger, .. } = slot;
        let Some(pt) = target.process() else {
            return;
        };
        let walk = ledger.fork_walk(follow, |a| pt.breakpoint_at(a));
        let mut put_back: Vec<(RuntimeAddr, Vec<u8>)> = walk
            .put_back
            .into_iter()
            .map(|(a, b)| (RuntimeAddr(a), b))
            .collect();
        put_back.extend(fixes);
        if follow {
            self.follow_child(i, child, put_back, walk.kept);
            return;
        }
        let written = pt.write_into_child(child, &put_back);
        let released = pt.release_fork_child_with(child, &[]);
        let target = pt.describe();
        let slot = &mut self.slots[i];
        match released {
            Ok(()) => slot.notice(format!(
                "{target}: forked child {child} (released without probes)"
            )),
            Err(e) => slot.notice(format!(
                "{target}: forked child {child} could not be released: {e}"
            )),
        }
        slot.note_unwritten(&target, child, &put_back, written);
    }

    /// Takes the fork child `child` of slot `i` as a target of its own:
    /// `put_back` (from [`Session::take_fork_child`]'s walk: the `int3`s'
    /// originals, the return addresses) is written into it, the agent's
    /// writes it keeps (`kept`: address, original) go into its ledger as
    /// inherited, and the trap `Count`/`Record` probes are placed in it
    /// again. Where that fails the child is released without probes (the
    /// kept bytes put back too), with a notice.
    fn follow_child(
        &mut self,
        i: usize,
        child: u64,
        put_back: Vec<(RuntimeAddr, Vec<u8>)>,
        kept: Vec<(u64, Vec<u8>)>,
    ) {
        // A process that executed another program gives its children the
        // probes of its new image.
        let root = match self.slots[i].execd {
            true => i,
            false => self.slots[i].root.unwrap_or(i),
        };
        // Written before the child's target is made: it arms the loader's
        // rendezvous, which it must find as the file has it.
        let mut written = None;
        let adopted = Slot::process(&mut self.slots[i].target)
            .ok_or_else(|| "not a process".to_string())
            .and_then(|pt| {
                written = Some((pt.describe(), pt.write_into_child(child, &put_back)));
                pt.adopt_fork_child(child).map_err(|e| e.to_string())
            });
        if let (Some((target, n)), Ok(_)) = (&written, &adopted) {
            self.slots[i].note_unwritten(target, child, &put_back, *n);
        }
        let mut pt = match adopted {
            Ok(pt) => pt,
            Err(why) => {
                let slot = &mut self.slots[i];
                let mut all: Vec<(RuntimeAddr, Vec<u8>)> =
                    kept.into_iter().map(|(a, b)| (RuntimeAddr(a), b)).collect();
                all.extend(put_back);
                if let Some(pt) = slot.target.process() {
                    let _ = pt.release_fork_child_with(child, &all);
                }
                slot.notice(format!(
                    "cannot follow forked child {child}: {why}; released without probes"
                ));
                return;
            }
        };
        // The bytes it keeps, as it got them.
        let mut inherited = Vec::with_capacity(kept.len());
        for (a, original) in kept {
            let mut now = vec![0u8; original.len()];
            if pt.read_memory(RuntimeAddr(a), &mut now).is_ok() && now != original {
                inherited.push((a, original, now));
            }
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
        for (a, original, now) in inherited {
            slot.ledger.insert_inherited(a, &original, &now);
        }
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
        match slot.target.as_target().resume_all() {
            Ok(()) => slot.engine.started = true,
            Err(e) => slot.notice(format!("forked child {child} could not be resumed: {e}")),
        }
    }
}

impl Slot {
    /// Says which of hotprobe's bytes could not be put back in forked
    /// child `child` (`written` of the bytes `put_back` spans): it runs
    /// with them, never silently.
    fn note_unwritten(
        &mut self,
        target: &str,
        child: u64,
        put_back: &[(RuntimeAddr, Vec<u8>)],
        written: usize,
    ) {
        let want = spanned(put_back);
        if written < want {
            self.notice(format!(
                "{target}: forked child {child}: {} of {want} bytes of hotprobe's code could \
                 not be put back (its memory could not be written): it runs with them",
                want - written
            ));
        }
    }
}

/// How many bytes `writes` cover (overlapping and adjacent ones once, as
/// `write_into_child` writes them).
fn spanned(writes: &[(RuntimeAddr, Vec<u8>)]) -> usize {
    let mut spans: Vec<(u64, u64)> = writes
        .iter()
        .map(|(a, b)| (a.0, a.0 + b.len() as u64))
        .collect();
    spans.sort_unstable();
    let mut total = 0u64;
    let mut end = 0u64;
    for (s, e) in spans {
        let from = s.max(end);
        if e > from {
            total += e - from;
        }
        end = end.max(e);
    }
    total as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spanned_counts_overlapping_and_adjacent_bytes_once() {
        let w = |a: u64, n: usize| (RuntimeAddr(a), vec![0u8; n]);
        assert_eq!(spanned(&[]), 0);
        assert_eq!(spanned(&[w(10, 2), w(12, 3), w(11, 1), w(30, 1)]), 6);
    }
}
