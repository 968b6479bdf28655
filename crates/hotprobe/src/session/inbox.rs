//! What the session holds for each target: the notices its engine and
//! mechanisms gave, in order, and the forked children held for it to
//! follow. The engine reports them ([`crate::engine::Report`]); the
//! session drains its reports into the target's [`Inbox`] after each call
//! into it, and before any notice of its own, so the notices keep the
//! order they were given in.

use crate::engine::{Engine, Report, Restores};

/// A forked child held stopped for the session to follow.
#[derive(Debug)]
pub(crate) struct HeldChild {
    /// Its pid.
    pub child: u64,
    /// The writes that put back the return addresses swapped in the
    /// forking thread's stack (address, original bytes).
    pub fixes: Restores,
}

/// One target's notices and held children (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Inbox {
    notices: Vec<String>,
    children: Vec<HeldChild>,
}

impl Inbox {
    /// Takes in what `engine` reported since the last call.
    pub(crate) fn collect(&mut self, engine: &mut Engine) {
        for r in engine.take_reports() {
            match r {
                Report::Notice(n) => self.notices.push(n.to_string()),
                Report::Forked { child, fixes } => self.children.push(HeldChild { child, fixes }),
            }
        }
    }

    /// A notice of the session's or a mechanism's about this target,
    /// after what `engine` reported before it.
    pub(crate) fn notice(&mut self, engine: &mut Engine, text: String) {
        self.collect(engine);
        self.notices.push(text);
    }

    /// The notices given since the last call, oldest first.
    pub(crate) fn take_notices(&mut self, engine: &mut Engine) -> Vec<String> {
        self.collect(engine);
        std::mem::take(&mut self.notices)
    }

    /// The forked children held since the last call, oldest first.
    pub(crate) fn take_children(&mut self, engine: &mut Engine) -> Vec<HeldChild> {
        self.collect(engine);
        std::mem::take(&mut self.children)
    }
}
