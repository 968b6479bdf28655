//! What a hit does: entry and return callbacks, live instances, filters, and
//! delivery to counters, ring or mailbox.

use super::*;

impl Plugin {
    pub(super) fn counters(&self, v: u32, p: u32) -> Option<&ProbeCounters> {
        self.shm.counters(v, p)
    }

    /// Hands an event on as the probe's delivery says.
    pub(super) fn deliver(&self, v: u32, cfg: &ProbeCfg, ev: &PluginEvent, data: &[u8]) {
        match cfg.delivery {
            DELIVER_ASYNC => {
                // SAFETY: this vCPU's thread is its ring's only producer.
                unsafe { self.shm.push(v, ev, data) };
            }
            DELIVER_SYNC => self.deliver_sync(v, ev, data),
            _ => {}
        }
    }

    /// Posts the event in the vCPU's mailbox and waits for hotprobe's
    /// answer: spinning first, then on a futex; released by the timeout, or
    /// at once while hotprobe's heartbeat is stale.
    pub(super) fn deliver_sync(&self, v: u32, ev: &PluginEvent, data: &[u8]) {
        let h = self.shm.header();
        let stale = h.stale_ms as u64 * 1_000_000;
        let t0 = now_ns();
        if t0.saturating_sub(h.heartbeat_ns.load(Relaxed)) > stale {
            h.orphaned.fetch_add(1, Relaxed);
            return;
        }
        let (Some(ctl), Some(slot)) = (self.shm.vcpu(v), self.shm.mbox_slot(v)) else {
            return;
        };
        // SAFETY: the mailbox is FREE: hotprobe does not read it.
        unsafe { self.shm.write_slot(slot, ev, data) };
        ctl.mbox_seq.fetch_add(1, Relaxed);
        // Release pairs with hotprobe's `mbox_state.load(Acquire)`: the
        // event is written before it sees POSTED.
        ctl.mbox_state.store(MBOX_POSTED, Release);
        // SeqCst: Dekker with hotprobe's service thread (it sets
        // host_sleeping, reads the doorbell, re-checks the mailboxes).
        h.doorbell.fetch_add(1, SeqCst);
        if h.host_sleeping.load(SeqCst) != 0 {
            h.sync_host_wakes.fetch_add(1, Relaxed);
            futex_wake(&h.doorbell);
        }
        let answered = || {
            ctl.mbox_state.store(MBOX_FREE, Release);
            h.sync_wait_ns
                .fetch_add(now_ns().saturating_sub(t0), Relaxed);
        };
        // Spin for a bounded time (the clock read every 8 spins: a `pause`
        // costs 10-100 ns depending on the CPU), then sleep.
        let spin_ns = h.sync_spin_ns as u64;
        let mut i = 0u32;
        loop {
            // Acquire pairs with hotprobe's `store(MBOX_ANSWERED, Release)`.
            if ctl.mbox_state.load(Acquire) == MBOX_ANSWERED {
                answered();
                return;
            }
            std::hint::spin_loop();
            i = i.wrapping_add(1);
            if i.is_multiple_of(8) && now_ns().saturating_sub(t0) >= spin_ns {
                break;
            }
        }
        h.sync_vcpu_sleeps.fetch_add(1, Relaxed);
        let timeout = h.sync_timeout_ms as u64 * 1_000_000;
        loop {
            // SeqCst: Dekker with hotprobe, which answers then reads
            // mbox_waiting to decide whether to wake us.
            ctl.mbox_waiting.store(1, SeqCst);
            if ctl.mbox_state.load(SeqCst) == MBOX_POSTED {
                futex_wait(&ctl.mbox_state, MBOX_POSTED, Duration::from_millis(5));
            }
            ctl.mbox_waiting.store(0, Relaxed);
            if ctl.mbox_state.load(Acquire) == MBOX_ANSWERED {
                answered();
                return;
            }
            let now = now_ns();
            let gone = now.saturating_sub(h.heartbeat_ns.load(Relaxed)) > stale;
            if gone || now - t0 > timeout {
                // Take the event back unless the answer arrived meanwhile.
                if ctl
                    .mbox_state
                    .compare_exchange(MBOX_POSTED, MBOX_FREE, Relaxed, Relaxed)
                    .is_ok()
                {
                    h.sync_timeouts.fetch_add(1, Relaxed);
                } else {
                    ctl.mbox_state.store(MBOX_FREE, Release);
                }
                return;
            }
        }
    }

    pub(super) fn on_entry(&self, v: u32, probe: u32, pc: u64) {
        let Some(t) = self.tables.get() else { return };
        let Some(cfg) = t.probes.get(probe as usize) else {
            return;
        };
        // The scoreboard gate may lag a disable by a few instructions: the
        // flag itself is checked too.
        if !matches!(self.shm.probe(probe), Some(d) if d.enabled.load(Relaxed) != 0) {
            return;
        }
        let Some(c) = self.counters(v, probe) else {
            self.shm.header().vcpu_overflow.fetch_add(1, Relaxed);
            return;
        };
        // SAFETY: a callback on vCPU `v`'s thread; one live reference.
        let Some(st) = (unsafe { self.vcpu(v) }) else {
            return;
        };
        let is_ret = cfg.kind == PROBE_RETURN;
        let events = cfg.delivery != DELIVER_COUNT;
        let mut regs = [None; N_REGS];
        let mut task = None;
        let mut ev = PluginEvent {
            probe,
            kind: if is_ret { EV_ENTRY } else { EV_HIT },
            vcpu: v,
            ..PluginEvent::default()
        };
        if cfg.filter_cr3 != 0 || events {
            ev.cr3 = self.reg(st, &mut regs, Reg::Cr3);
            if cfg.filter_cr3 != 0 && ev.cr3 & !0xfff != cfg.filter_cr3 & !0xfff {
                bump(&c.filtered);
                return;
            }
        }
        if events || cfg.filter_index != NO_FILTER {
            for (k, f) in cfg.fetch.iter().enumerate() {
                ev.values[k] = match *f {
                    Fetch::Reg(r) => self.reg(st, &mut regs, r),
                    Fetch::Load { reg, offset, size } => {
                        let base = self.reg(st, &mut regs, reg);
                        self.load(st, base.wrapping_add(offset as i64 as u64), size)
                    }
                    Fetch::LoadValue {
                        index,
                        offset,
                        size,
                    } => {
                        let base = ev.values[(index as usize).min(k.saturating_sub(1))];
                        self.load(st, base.wrapping_add(offset as i64 as u64), size)
                    }
                    Fetch::Task(f) => self.task_field(st, &mut regs, &mut task, f),
                };
            }
            ev.nvalues = cfg.fetch.len() as u8;
            if cfg.filter_index != NO_FILTER
                && ev.values.get(cfg.filter_index as usize).copied() != Some(cfg.filter_value)
            {
                bump(&c.filtered);
                return;
            }
        }
        bump(&c.hits);
        let mut dl = 0;
        if events {
            if let Some(s) = cfg.string {
                let a = ev.values[(s.index as usize).min(MAX_VALUES - 1)];
                dl = self.read_string(st, a, s.max_len as usize);
            }
        }
        if is_ret {
            let sp = self.reg(st, &mut regs, Reg::Rsp);
            let cur = self.current_task(st, &mut regs, &mut task);
            let live = &mut st.live[probe as usize];
            // An instance on this stack at or below this one was abandoned.
            let before = live.len();
            live.retain(|i| !(same_kernel_stack(i.sp, sp) && i.sp <= sp));
            let dropped = before - live.len();
            if dropped > 0 {
                add(&c.nmissed, dropped as u64);
            }
            if live.len() < cfg.maxactive {
                live.push(Instance { sp, task: cur });
            } else {
                bump(&c.nmissed);
            }
            self.set_depth(v, st, probe, before);
        }
        if events {
            ev.pc = pc;
            ev.tsc = hotprobe_abi::rdtsc();
            let data = std::mem::take(&mut st.data);
            self.deliver(v, cfg, &ev, &data[..dl]);
            st.data = data;
        }
    }

    /// Publishes probe `probe`'s live-instance count on vCPU `v` (its
    /// scoreboard depth gating the in-range `ret` callbacks) and keeps the
    /// vCPU's total (gating the `ret` callbacks elsewhere, for returns
    /// through a tail call). `before` is the count before the change.
    pub(super) fn set_depth(&self, v: u32, st: &mut Vcpu, probe: u32, before: usize) {
        let n = st.live[probe as usize].len();
        if (before == 0) != (n == 0) {
            if n == 0 {
                st.live_probes.retain(|p| *p != probe);
            } else {
                st.live_probes.push(probe);
            }
        }
        st.total = (st.total + n).saturating_sub(before);
        // SAFETY: our vCPU's own depth entries.
        unsafe {
            self.score_entry(v, self.max_probes + probe as usize)
                .write_volatile(n as u64);
            self.score_entry(v, 2 * self.max_probes)
                .write_volatile(st.total as u64);
        }
    }

    pub(super) fn on_return(&self, v: u32, probe: u32, pc: u64) {
        // SAFETY: a callback on vCPU `v`'s thread; one live reference.
        let Some(st) = (unsafe { self.vcpu(v) }) else {
            return;
        };
        let sp = self.read_reg(st, Reg::Rsp);
        self.finish_return(v, st, probe, pc, sp);
    }

    /// A `ret` outside every return probe's function while some instance
    /// is live on this vCPU: the return of a function that tail-called
    /// out of the probed one (its `ret` is the probed call's return when
    /// rsp is the entry's).
    pub(super) fn on_any_return(&self, v: u32, pc: u64) {
        // SAFETY: a callback on vCPU `v`'s thread; one live reference.
        let Some(st) = (unsafe { self.vcpu(v) }) else {
            return;
        };
        let sp = self.read_reg(st, Reg::Rsp);
        let mut k = 0;
        while k < st.live_probes.len() {
            let p = st.live_probes[k];
            if st.live[p as usize].iter().any(|i| i.sp == sp) {
                self.finish_return(v, st, p, pc, sp);
                // The list may have shrunk: look at the same index again.
                if st.live_probes.get(k) == Some(&p) {
                    k += 1;
                }
            } else {
                k += 1;
            }
        }
    }

    pub(super) fn finish_return(&self, v: u32, st: &mut Vcpu, probe: u32, pc: u64, sp: u64) {
        let Some(t) = self.tables.get() else { return };
        let Some(cfg) = t.probes.get(probe as usize) else {
            return;
        };
        let Some(c) = self.counters(v, probe) else {
            return;
        };
        let Some(k) = st.live[probe as usize].iter().position(|i| i.sp == sp) else {
            return;
        };
        let want = st.live[probe as usize][k].task;
        let mut regs = [None; N_REGS];
        let stale = want != 0 && self.current_task(st, &mut regs, &mut None) != want;
        let live = &mut st.live[probe as usize];
        let before_all = live.len();
        live.remove(k);
        if stale {
            // The task that made the call is gone (its stack reused).
            bump(&c.nmissed);
            self.set_depth(v, st, probe, before_all);
            return;
        }
        // Deeper instances on the same stack were abandoned (a frame left
        // without its ret: a tail call out, an exception fixup).
        let before = live.len();
        live.retain(|i| !(same_kernel_stack(i.sp, sp) && i.sp < sp));
        let dropped = before - live.len();
        if dropped > 0 {
            add(&c.nmissed, dropped as u64);
        }
        self.set_depth(v, st, probe, before_all);
        bump(&c.returns);
        if cfg.delivery != DELIVER_COUNT {
            let mut regs = [None; N_REGS];
            let pid = self.task_field(st, &mut regs, &mut None, TaskField::Pid);
            let ev = PluginEvent {
                tsc: hotprobe_abi::rdtsc(),
                probe,
                kind: EV_EXIT,
                nvalues: 4,
                vcpu: v,
                cr3: self.read_reg(st, Reg::Cr3),
                pc,
                values: [
                    self.read_reg(st, Reg::Rax),
                    self.read_reg(st, Reg::Rdx),
                    sp,
                    pid,
                    0,
                    0,
                ],
                ..PluginEvent::default()
            };
            self.deliver(v, cfg, &ev, &[]);
        }
    }
}
