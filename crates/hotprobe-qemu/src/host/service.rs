//! The service thread: heartbeat, synchronous mailboxes answered, futex waits and wakes.

use super::*;

/// Sleeps on `word` while it holds `val`, `timeout` at most; the caller
/// looks at the word again whatever woke it.
pub(super) fn futex_wait(word: &AtomicU32, val: u32, timeout: Duration) {
    let _ = hotprobe_os::futex_wait(word, val, Some(timeout));
}

/// Wakes every waiter on `word`.
pub(super) fn futex_wake(word: &AtomicU32) {
    let _ = hotprobe_os::futex_wake(word, i32::MAX as u32);
}

/// The service thread: refreshes the heartbeat, answers synchronous events
/// (spinning for a while after each, then sleeping on the doorbell).
pub(super) fn service(m: &Mapped) {
    let shm = &m.shm;
    let h = shm.header();
    let max = shm.layout().params.max_vcpus;
    let mut data = vec![0u8; shm.data_cap()];
    let mut last_work = Instant::now();
    while !m.stop.load(Relaxed) {
        h.heartbeat_ns.store(now_ns(), Relaxed);
        let nv = h.vcpus.load(Acquire).min(max);
        let mut served = false;
        for v in 0..nv {
            let (Some(ctl), Some(slot)) = (shm.vcpu(v), shm.mbox_slot(v)) else {
                continue;
            };
            // Acquire pairs with the plugin's `store(MBOX_POSTED, Release)`:
            // the event is written.
            if ctl.mbox_state.load(Acquire) != MBOX_POSTED {
                continue;
            }
            // SAFETY: a POSTED mailbox is not written by the vCPU until we
            // answer (or it times out: then the event may be torn, which
            // the handler tolerates as it would a late one).
            let ev = unsafe { shm.read_slot(slot, v, &mut data) };
            let answer = match m.handler.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
                Some(f) => f(&ev, &data[..ev.data_len as usize]),
                None => 0,
            };
            ctl.mbox_answer.store(answer, Relaxed);
            ctl.sync_answered.fetch_add(1, Relaxed);
            m.sync.answered.fetch_add(1, Relaxed);
            // Release pairs with the vCPU's `load(Acquire)` of the state;
            // SeqCst: Dekker with the vCPU's `mbox_waiting` (it sets it,
            // then re-reads the state before sleeping).
            if ctl
                .mbox_state
                .compare_exchange(MBOX_POSTED, MBOX_ANSWERED, SeqCst, Relaxed)
                .is_ok()
                && ctl.mbox_waiting.load(SeqCst) != 0
            {
                futex_wake(&ctl.mbox_state);
            }
            served = true;
        }
        if served {
            last_work = Instant::now();
            continue;
        }
        if last_work.elapsed() < m.host_spin {
            std::hint::spin_loop();
            continue;
        }
        // Dekker with the vCPU: it posts, bumps the doorbell, then reads
        // host_sleeping; we set host_sleeping, read the doorbell, re-check
        // the mailboxes, then sleep unless the doorbell moved.
        h.host_sleeping.store(1, SeqCst);
        let bell = h.doorbell.load(SeqCst);
        let posted = (0..nv).any(|v| {
            shm.vcpu(v)
                .is_some_and(|c| c.mbox_state.load(SeqCst) == MBOX_POSTED)
        });
        if !posted {
            m.sync.sleeps.fetch_add(1, Relaxed);
            futex_wait(&h.doorbell, bell, Duration::from_millis(10));
        }
        h.host_sleeping.store(0, SeqCst);
    }
}
