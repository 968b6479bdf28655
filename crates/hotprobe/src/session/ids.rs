//! Probe ids: the session numbers the probes of each target and hands
//! every mechanism the id to use for a probe it places.

use crate::handler::ProbeId;

/// The probe ids of one target: the target's number in the high bits
/// (see `TARGET_SHIFT` in the session), a count in the low ones. A
/// session holds one per target; an engine driven on its own
/// ([`crate::StandaloneEngine::new`]) holds its own.
#[derive(Clone, Debug)]
pub(crate) struct ProbeIds {
    base: u32,
    next: u32,
}

impl ProbeIds {
    /// Ids from `base` on.
    pub(crate) fn new(base: u32) -> Self {
        ProbeIds { base, next: 0 }
    }

    /// The next id, taken.
    pub(crate) fn take(&mut self) -> ProbeId {
        let id = ProbeId(self.base + self.next);
        self.next += 1;
        id
    }

    /// Runs `place` with the next id, which is taken only if `place`
    /// succeeds: a probe that could not be placed uses no id.
    pub(crate) fn place<T, E>(
        &mut self,
        place: impl FnOnce(ProbeId) -> Result<T, E>,
    ) -> Result<T, E> {
        let r = place(ProbeId(self.base + self.next));
        if r.is_ok() {
            self.next += 1;
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_carry_the_base_and_a_failed_placement_uses_none() {
        let mut ids = ProbeIds::new(3 << 24);
        assert_eq!(ids.take(), ProbeId(3 << 24));
        let failed: Result<ProbeId, ()> = ids.place(|_| Err(()));
        assert!(failed.is_err());
        assert_eq!(ids.place(Ok::<_, ()>), Ok(ProbeId((3 << 24) + 1)));
        assert_eq!(ids.take(), ProbeId((3 << 24) + 2));
    }
}
