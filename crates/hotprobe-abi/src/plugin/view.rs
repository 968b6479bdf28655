//! The validated view of a plugin mapping: its header, probes, sites, vCPU
//! blocks, mailboxes and rings.

use super::*;

/// A validated view of a plugin mapping (both sides).
#[derive(Debug)]
pub struct PluginShm {
    base: *mut u8,
    layout: PluginLayout,
}

// SAFETY: shared state is reached through atomics and volatile copies; the
// pointer is an address inside a mapping that outlives the view (contract
// of `create` / `attach`).
unsafe impl Send for PluginShm {}
// SAFETY: as above.
unsafe impl Sync for PluginShm {}

/// One decoded event.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PluginEvent {
    /// Host time stamp counter at the hit.
    pub tsc: u64,
    /// The plugin probe index.
    pub probe: u32,
    /// `EV_*`.
    pub kind: u8,
    /// Values meaningful.
    pub nvalues: u8,
    /// Flags (reserved).
    pub flags: u8,
    /// The vCPU.
    pub vcpu: u32,
    /// cr3 at the hit.
    pub cr3: u64,
    /// The instruction's address.
    pub pc: u64,
    /// Values.
    pub values: [u64; MAX_VALUES],
    /// Bytes of data in the slot.
    pub data_len: u16,
}

/// Packs an event's meta word.
pub const fn pack_event_meta(probe: u32, kind: u8, nvalues: u8, data_len: u16) -> u64 {
    (probe as u64 & 0xff_ffff)
        | ((kind as u64) & 3) << 24
        | ((nvalues as u64) & 7) << 26
        | (data_len as u64) << 32
}

impl PluginShm {
    /// Writes a fresh header for `params` (hotprobe's side). The memory must
    /// be zero-filled (a new memfd is).
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes, page-aligned,
    /// for as long as the view lives, and nobody else may use it before this
    /// returns.
    pub unsafe fn create(ptr: *mut u8, len: usize, params: PluginParams) -> Result<Self, AbiError> {
        let layout = PluginLayout::new(params)?;
        if ptr.is_null() {
            return Err(AbiError::Null);
        }
        if (ptr as usize) & 4095 != 0 {
            return Err(AbiError::Misaligned);
        }
        if len < layout.total_size {
            return Err(AbiError::TooSmall {
                needed: layout.total_size,
                len,
            });
        }
        let h = ptr as *mut PluginHeader;
        // SAFETY: valid, exclusive, aligned memory (contract, checked above);
        // plain fields written through raw field pointers.
        unsafe {
            core::ptr::addr_of_mut!((*h).version).write(PLUGIN_VERSION);
            core::ptr::addr_of_mut!((*h).header_size).write(PLUGIN_HEADER_SIZE as u32);
            core::ptr::addr_of_mut!((*h).total_size).write(layout.total_size as u64);
            core::ptr::addr_of_mut!((*h).max_probes).write(params.max_probes);
            core::ptr::addr_of_mut!((*h).max_sites).write(params.max_sites);
            core::ptr::addr_of_mut!((*h).max_vcpus).write(params.max_vcpus);
            core::ptr::addr_of_mut!((*h).ring_capacity).write(params.ring_capacity);
            core::ptr::addr_of_mut!((*h).slot_size).write(params.slot_size);
            core::ptr::addr_of_mut!((*h).probes_offset).write(layout.probes_offset as u64);
            core::ptr::addr_of_mut!((*h).sites_offset).write(layout.sites_offset as u64);
            core::ptr::addr_of_mut!((*h).vcpus_offset).write(layout.vcpus_offset as u64);
            core::ptr::addr_of_mut!((*h).vcpu_stride).write(layout.vcpu_stride as u64);
            core::ptr::addr_of_mut!((*h).sync_timeout_ms).write(1000);
            core::ptr::addr_of_mut!((*h).stale_ms).write(300);
            core::ptr::addr_of_mut!((*h).sync_spin_ns).write(5_000);
            for p in 0..params.max_probes as usize {
                let d = ptr.add(layout.probes_offset + p * core::mem::size_of::<ProbeDef>())
                    as *mut ProbeDef;
                core::ptr::addr_of_mut!((*d).filter_index).write(NO_FILTER);
            }
            core::ptr::addr_of_mut!((*h).magic).write_volatile(PLUGIN_MAGIC);
        }
        Ok(PluginShm { base: ptr, layout })
    }

    /// Validates an existing mapping (the plugin's side).
    ///
    /// # Safety
    /// `ptr` must be valid for reads and writes of `len` bytes for as long as
    /// the view lives.
    pub unsafe fn attach(ptr: *mut u8, len: usize) -> Result<Self, AbiError> {
        if ptr.is_null() {
            return Err(AbiError::Null);
        }
        if (ptr as usize) & 63 != 0 {
            return Err(AbiError::Misaligned);
        }
        if len < PLUGIN_HEADER_SIZE {
            return Err(AbiError::TooSmall {
                needed: PLUGIN_HEADER_SIZE,
                len,
            });
        }
        let h = ptr as *const PluginHeader;
        // SAFETY: valid for PLUGIN_HEADER_SIZE bytes (checked), aligned;
        // volatile reads of plain fields.
        let (magic, version, params, offsets) = unsafe {
            (
                core::ptr::addr_of!((*h).magic).read_volatile(),
                core::ptr::addr_of!((*h).version).read_volatile(),
                PluginParams {
                    max_probes: core::ptr::addr_of!((*h).max_probes).read_volatile(),
                    max_sites: core::ptr::addr_of!((*h).max_sites).read_volatile(),
                    max_vcpus: core::ptr::addr_of!((*h).max_vcpus).read_volatile(),
                    ring_capacity: core::ptr::addr_of!((*h).ring_capacity).read_volatile(),
                    slot_size: core::ptr::addr_of!((*h).slot_size).read_volatile(),
                },
                [
                    core::ptr::addr_of!((*h).probes_offset).read_volatile(),
                    core::ptr::addr_of!((*h).sites_offset).read_volatile(),
                    core::ptr::addr_of!((*h).vcpus_offset).read_volatile(),
                    core::ptr::addr_of!((*h).vcpu_stride).read_volatile(),
                    core::ptr::addr_of!((*h).total_size).read_volatile(),
                ],
            )
        };
        if magic != PLUGIN_MAGIC {
            return Err(AbiError::BadMagic(magic));
        }
        if version != PLUGIN_VERSION {
            return Err(AbiError::Version {
                found: version,
                expected: PLUGIN_VERSION,
            });
        }
        let layout = PluginLayout::new(params)?;
        if offsets
            != [
                layout.probes_offset as u64,
                layout.sites_offset as u64,
                layout.vcpus_offset as u64,
                layout.vcpu_stride as u64,
                layout.total_size as u64,
            ]
        {
            return Err(AbiError::Inconsistent("offsets differ from the layout"));
        }
        if len < layout.total_size {
            return Err(AbiError::TooSmall {
                needed: layout.total_size,
                len,
            });
        }
        Ok(PluginShm { base: ptr, layout })
    }

    /// The layout.
    pub fn layout(&self) -> &PluginLayout {
        &self.layout
    }

    /// The header.
    pub fn header(&self) -> &PluginHeader {
        // SAFETY: the mapping holds a header at its start (validated).
        unsafe { &*(self.base as *const PluginHeader) }
    }

    /// Probe `i` (`i < max_probes`).
    pub fn probe(&self, i: u32) -> Option<&ProbeDef> {
        if i >= self.layout.params.max_probes {
            return None;
        }
        // SAFETY: inside the probe array (bounds checked), aligned.
        Some(unsafe {
            &*(self
                .base
                .add(self.layout.probes_offset + i as usize * core::mem::size_of::<ProbeDef>())
                as *const ProbeDef)
        })
    }

    /// A raw pointer to probe `i`'s definition, for hotprobe to fill in
    /// before freezing.
    ///
    /// # Safety
    /// Only before `frozen` (the plugin reads definitions once, after), and
    /// `i < max_probes`.
    pub unsafe fn probe_mut(&self, i: u32) -> *mut ProbeDef {
        debug_assert!(i < self.layout.params.max_probes);
        // SAFETY: caller contract.
        unsafe {
            self.base
                .add(self.layout.probes_offset + i as usize * core::mem::size_of::<ProbeDef>())
                as *mut ProbeDef
        }
    }

    /// Site `i` (a copy).
    pub fn site(&self, i: u32) -> Option<SiteDef> {
        if i >= self.layout.params.max_sites {
            return None;
        }
        // SAFETY: inside the site array (bounds checked), aligned.
        Some(unsafe {
            (self
                .base
                .add(self.layout.sites_offset + i as usize * core::mem::size_of::<SiteDef>())
                as *const SiteDef)
                .read_volatile()
        })
    }

    /// Writes site `i` (hotprobe, before freezing).
    pub fn set_site(&self, i: u32, s: SiteDef) -> Result<(), AbiError> {
        if i >= self.layout.params.max_sites {
            return Err(AbiError::SiteTableFull);
        }
        // SAFETY: inside the site array (bounds checked), aligned.
        unsafe {
            (self
                .base
                .add(self.layout.sites_offset + i as usize * core::mem::size_of::<SiteDef>())
                as *mut SiteDef)
                .write_volatile(s)
        };
        Ok(())
    }

    fn vcpu_base(&self, v: u32) -> Option<*mut u8> {
        if v >= self.layout.params.max_vcpus {
            return None;
        }
        // SAFETY: inside the mapping (bounds checked).
        Some(unsafe {
            self.base
                .add(self.layout.vcpus_offset + v as usize * self.layout.vcpu_stride)
        })
    }

    /// vCPU `v`'s control block.
    pub fn vcpu(&self, v: u32) -> Option<&VcpuCtl> {
        // SAFETY: a vCPU block starts with its control block, 4096-aligned.
        self.vcpu_base(v)
            .map(|b| unsafe { &*(b as *const VcpuCtl) })
    }

    /// Probe `p`'s counters on vCPU `v`.
    pub fn counters(&self, v: u32, p: u32) -> Option<&ProbeCounters> {
        if p >= self.layout.params.max_probes {
            return None;
        }
        let b = self.vcpu_base(v)?;
        // SAFETY: inside the vCPU's counter array (bounds checked), 8-aligned.
        Some(unsafe {
            &*(b.add(self.layout.counters_offset + p as usize * 32) as *const ProbeCounters)
        })
    }

    /// Sums probe `p`'s counters over every vCPU: (hits, returns, nmissed,
    /// filtered).
    pub fn totals(&self, p: u32) -> (u64, u64, u64, u64) {
        let mut t = (0, 0, 0, 0);
        for v in 0..self.layout.params.max_vcpus {
            if let Some(c) = self.counters(v, p) {
                t.0 += c.hits.load(Relaxed);
                t.1 += c.returns.load(Relaxed);
                t.2 += c.nmissed.load(Relaxed);
                t.3 += c.filtered.load(Relaxed);
            }
        }
        t
    }

    /// The data bytes a slot holds.
    pub fn data_cap(&self) -> usize {
        self.layout.params.slot_size as usize - EVENT_FIXED
    }

    /// Pointer to vCPU `v`'s mailbox slot.
    pub fn mbox_slot(&self, v: u32) -> Option<*mut u8> {
        // SAFETY: inside the vCPU block.
        self.vcpu_base(v)
            .map(|b| unsafe { b.add(self.layout.mbox_offset) })
    }

    fn ring_slot(&self, v: u32, n: u64) -> Option<*mut u8> {
        let b = self.vcpu_base(v)?;
        let i = (n & (self.layout.params.ring_capacity as u64 - 1)) as usize;
        // SAFETY: inside the vCPU's ring (index masked).
        Some(unsafe { b.add(self.layout.ring_offset + i * self.layout.params.slot_size as usize) })
    }

    /// Writes an event into a slot: the fixed words, then `data` (cut to
    /// what the slot holds).
    ///
    /// # Safety
    /// `slot` must be a slot of this mapping that nobody else reads or
    /// writes meanwhile.
    pub unsafe fn write_slot(&self, slot: *mut u8, ev: &PluginEvent, data: &[u8]) {
        let n = data.len().min(self.data_cap());
        let nv = (ev.nvalues as usize).min(MAX_VALUES);
        let w = slot as *mut u64;
        // SAFETY: caller contract; the slot holds EVENT_FIXED + data_cap bytes.
        unsafe {
            w.write_volatile(ev.tsc);
            w.add(1)
                .write_volatile(pack_event_meta(ev.probe, ev.kind, nv as u8, n as u16));
            w.add(2).write_volatile(ev.cr3);
            w.add(3).write_volatile(ev.pc);
            for (k, v) in ev.values.iter().enumerate().take(nv) {
                w.add(4 + k).write_volatile(*v);
            }
            core::ptr::copy_nonoverlapping(data.as_ptr(), slot.add(EVENT_FIXED), n);
        }
    }

    /// Reads the event in a slot, its data into `data` (returns the event;
    /// `data_len` bytes of `data` are meaningful).
    ///
    /// # Safety
    /// As [`PluginShm::write_slot`].
    pub unsafe fn read_slot(&self, slot: *const u8, vcpu: u32, data: &mut [u8]) -> PluginEvent {
        let w = slot as *const u64;
        // SAFETY: caller contract.
        unsafe {
            let meta = w.add(1).read_volatile();
            let nv = (((meta >> 26) & 7) as usize).min(MAX_VALUES);
            let dl = ((meta >> 32) as u16 as usize)
                .min(self.data_cap())
                .min(data.len());
            let mut values = [0u64; MAX_VALUES];
            for (k, v) in values.iter_mut().enumerate().take(nv) {
                *v = w.add(4 + k).read_volatile();
            }
            core::ptr::copy_nonoverlapping(slot.add(EVENT_FIXED), data.as_mut_ptr(), dl);
            PluginEvent {
                tsc: w.read_volatile(),
                probe: (meta & 0xff_ffff) as u32,
                kind: ((meta >> 24) & 3) as u8,
                nvalues: nv as u8,
                flags: ((meta >> 29) & 7) as u8,
                vcpu,
                cr3: w.add(2).read_volatile(),
                pc: w.add(3).read_volatile(),
                values,
                data_len: dl as u16,
            }
        }
    }

    /// Pushes an event into vCPU `v`'s ring, or counts a drop (false).
    ///
    /// # Safety
    /// Only vCPU `v`'s thread may push to its ring.
    pub unsafe fn push(&self, v: u32, ev: &PluginEvent, data: &[u8]) -> bool {
        let Some(ctl) = self.vcpu(v) else {
            return false;
        };
        // Relaxed: only this producer writes head.
        let head = ctl.head.load(Relaxed);
        // Acquire pairs with the consumer's `tail.store(Release)` in `drain`:
        // its reads of the freed slots happen before we overwrite them.
        let tail = ctl.tail.load(Acquire);
        if head.wrapping_sub(tail) >= self.layout.params.ring_capacity as u64 {
            let d = ctl.dropped.load(Relaxed);
            ctl.dropped.store(d.wrapping_add(1), Relaxed);
            return false;
        }
        let Some(slot) = self.ring_slot(v, head) else {
            return false;
        };
        // SAFETY: the slot is free (head - tail < capacity): the consumer
        // does not read it until head moves.
        unsafe { self.write_slot(slot, ev, data) };
        // Release pairs with the consumer's `head.load(Acquire)`: the slot's
        // words are visible before the new head.
        ctl.head.store(head.wrapping_add(1), Release);
        true
    }

    /// Hands every event published in vCPU `v`'s ring to `f` (with its data),
    /// in order, then frees their slots; returns how many. A head more than
    /// a capacity ahead (corrupt) resynchronises the ring and returns an
    /// error.
    pub fn drain(
        &self,
        v: u32,
        data: &mut [u8],
        mut f: impl FnMut(&PluginEvent, &[u8]),
    ) -> Result<u64, AbiError> {
        let Some(ctl) = self.vcpu(v) else {
            return Ok(0);
        };
        // Relaxed: only the consumer writes tail.
        let tail = ctl.tail.load(Relaxed);
        // Acquire pairs with the producer's `head.store(Release)` in `push`.
        let head = ctl.head.load(Acquire);
        let n = head.wrapping_sub(tail);
        if n > self.layout.params.ring_capacity as u64 {
            // Release pairs with the producer's `tail.load(Acquire)`.
            ctl.tail.store(head, Release);
            return Err(AbiError::RingCorrupt { head, tail });
        }
        let mut i = tail;
        while i != head {
            let Some(slot) = self.ring_slot(v, i) else {
                break;
            };
            // SAFETY: slots in [tail, head) are published and not rewritten
            // until tail moves past them.
            let ev = unsafe { self.read_slot(slot, v, data) };
            f(&ev, &data[..ev.data_len as usize]);
            i = i.wrapping_add(1);
        }
        // Release pairs with the producer's `tail.load(Acquire)` in `push`.
        ctl.tail.store(head, Release);
        Ok(n)
    }

    /// Events waiting in vCPU `v`'s ring.
    pub fn pending(&self, v: u32) -> u64 {
        self.vcpu(v).map_or(0, |c| {
            c.head.load(Acquire).wrapping_sub(c.tail.load(Relaxed))
        })
    }
}

/// Whether an instruction (its first bytes, at `vaddr`) leaves its function
/// as a return does: `ret`, `ret imm16`, `rep ret`, or a `jmp` to the
/// kernel's return thunk `thunk` (0: none; kernels built with
/// `CONFIG_RETHUNK` end functions with `jmp __x86_return_thunk`).
pub fn is_return_insn(bytes: &[u8], vaddr: u64, thunk: u64) -> bool {
    match bytes {
        [0xc3, ..] | [0xc2, _, _, ..] | [0xf3, 0xc3, ..] => true,
        [0xe9, a, b, c, d, ..] if thunk != 0 => {
            let rel = i32::from_le_bytes([*a, *b, *c, *d]) as i64;
            vaddr.wrapping_add(5).wrapping_add(rel as u64) == thunk
        }
        [0xeb, r, ..] if thunk != 0 => {
            vaddr.wrapping_add(2).wrapping_add(*r as i8 as i64 as u64) == thunk
        }
        _ => false,
    }
}

/// Whether two stack pointers are on the same 16 KiB (`THREAD_SIZE`,
/// aligned) x86-64 kernel stack: return instances are matched by stack
/// pointer only against instances of the same task's stack.
pub fn same_kernel_stack(a: u64, b: u64) -> bool {
    a >> 14 == b >> 14
}
