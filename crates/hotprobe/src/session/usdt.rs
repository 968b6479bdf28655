//! USDT markers' semaphores (issue 24): a marker with a semaphore is only
//! reached while its 16-bit counter is nonzero (sdt.h's `if
//! (provider_name_semaphore)` around the marker and its argument
//! computations). Placing a probe on such a marker adds one to the
//! counter, in the target's memory; detaching takes it off again, so the
//! program goes back to skipping the marker's code. An exec forgets them
//! (the counters are gone with the image).

use super::*;

impl Session {
    /// Adds one to the semaphore at `at` (placing a probe on its marker).
    pub(super) fn raise_semaphore(
        &mut self,
        t: TargetId,
        at: RuntimeAddr,
    ) -> Result<(), EngineError> {
        let slot = self.slot(t)?;
        adjust(slot.target.as_target(), at, 1)?;
        slot.semaphores.push(at);
        Ok(())
    }
}

/// Takes back every semaphore increment of `slot` (detach). A target that
/// cannot be written any more keeps nothing of ours to take back.
pub(super) fn lower_semaphores(slot: &mut Slot) {
    for at in std::mem::take(&mut slot.semaphores) {
        let _ = adjust(slot.target.as_target(), at, -1);
    }
}

/// Adds `delta` to the little-endian u16 at `at`.
fn adjust(target: &mut dyn Target, at: RuntimeAddr, delta: i16) -> Result<(), TargetError> {
    let mut b = [0u8; 2];
    target.read_memory(at, &mut b)?;
    let v = u16::from_le_bytes(b).wrapping_add_signed(delta);
    target.write_memory(at, &v.to_le_bytes())
}
