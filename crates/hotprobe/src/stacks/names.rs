//! The stack of one recorded call (issue 24): an entry event of a
//! `--stacks` fast-path probe carries the id of the stack the agent
//! stored for it (`RecordedEvent::reserved2`, 1 + its slot in the stack
//! table); [`StackNames`] names it while the session runs (`trace
//! --stacks` prints each call's stack with it). An entry of a trap probe
//! carries the id of the stack the tracer walked at its stop
//! ([`super::trap::TRAP_STACK_ID`] set), named the same way.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use hotprobe_fastpath::StacksHandle;
use hotprobe_symbols::ProcessSymbols;

use super::publish::frame_name;

/// The modules a target's stacks are named with, shared with the
/// session's [`super::StackTables`] (which publishes them again as they change).
pub type SharedSymbols = Rc<RefCell<Option<ProcessSymbols>>>;

/// Names the stacks of recorded entries, per target: its stacks region
/// (kept mapped) and the modules the session last published.
#[derive(Clone, Default)]
pub struct StackNames {
    targets: HashMap<u32, (StacksHandle, SharedSymbols)>,
}

/// One call's stack, named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallStack {
    /// The callers, innermost first (`function` or `module!0xaddr`).
    pub frames: Vec<String>,
    /// The walk stopped before the outermost frame.
    pub truncated: bool,
}

impl StackNames {
    /// No target.
    pub fn new() -> StackNames {
        StackNames::default()
    }

    /// Target `target` (the session's index) has its stacks in `handle`,
    /// named with `symbols`.
    pub fn add_target(&mut self, target: u32, handle: StacksHandle, symbols: SharedSymbols) {
        self.targets.insert(target, (handle, symbols));
    }

    /// The stack of an entry event of a `--stacks` probe; `None` for any
    /// other event, or a stack the agent could not store.
    pub fn of_event(&self, ev: &hotprobe_fastpath::RecordedEvent) -> Option<CallStack> {
        if ev.kind != hotprobe_fastpath::KIND_ENTRY || ev.reserved2 == 0 {
            return None;
        }
        self.call_stack(ev.probe_id >> crate::session::TARGET_SHIFT, ev.reserved2)
    }

    /// The stack of id `stack` (an entry event's `reserved2`) of target
    /// `target`; `None` for 0 or an id with no stack.
    pub fn call_stack(&self, target: u32, stack: u32) -> Option<CallStack> {
        if stack & super::trap::TRAP_STACK_ID != 0 {
            // Walked by the tracer at a trap stop (any target's: a
            // followed child's count with its parent's).
            return super::trap::TrapStacks::call_stack(stack);
        }
        let (handle, symbols) = self.targets.get(&target)?;
        let symbols = symbols.borrow();
        let mut out = None;
        handle.view().with_stack(stack, |_, frames, truncated| {
            let frames = frames
                .iter()
                .map(|a| match &*symbols {
                    Some(s) => frame_name(s, *a),
                    None => format!("{a:#x}"),
                })
                .collect();
            out = Some(CallStack { frames, truncated });
        });
        out
    }
}
