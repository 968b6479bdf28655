//! Stack capture: the compiled unwind table the tracer publishes and the
//! walk both sides run over it (the agent at a fast-path hit, the tracer
//! with `process_vm_readv` at a trap).
//!
//! The tracer compiles each mapped module's `.eh_frame` into [`StackRow`]s
//! (one sorted array over every module, absolute addresses): a row holds
//! from its `pc` up to the next row's. Each row says where the canonical
//! frame address (CFA) is — `rsp + off` or `rbp + off` — and where the
//! caller's `rbp` was saved (`CFA + off`, or not at all); the return
//! address is at `CFA - 8` (x86-64: what `call` pushed). A row whose rule
//! cannot be expressed that way is [`CFA_STOP`]; the gaps between
//! functions with CFI are [`CFA_NONE`] rows, where the walk follows the
//! frame-pointer chain (`rbp`) instead; a row whose return address is
//! undefined (`_start`, a thread's first frame) is [`CFA_END`], the
//! stack's clean end.
//!
//! [`walk`] never dereferences anything itself: it asks a reader for each
//! word, and the reader decides what may be read (the agent: only its
//! thread's stack, between the hit's `rsp` and the end of the published
//! region holding it).

use core::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use crate::{AbiError, Shm, PAGE};

/// [`StackRow::cfa_reg`]: CFA = `rsp + cfa_off`.
pub const CFA_RSP: u8 = 0;
/// [`StackRow::cfa_reg`]: CFA = `rbp + cfa_off`.
pub const CFA_RBP: u8 = 1;
/// [`StackRow::cfa_reg`]: no CFI covers this address; follow the frame
/// pointer (`[rbp]` the caller's `rbp`, `[rbp+8]` the return address).
pub const CFA_NONE: u8 = 2;
/// [`StackRow::cfa_reg`]: CFI covers this address with a rule the table
/// cannot express (a CFA expression, another base register, a return
/// address elsewhere than `CFA - 8`): the walk stops here, truncated.
pub const CFA_STOP: u8 = 3;
/// [`StackRow::cfa_reg`]: the return address is undefined here (the
/// outermost frame): the walk ends, complete.
pub const CFA_END: u8 = 4;

/// [`StackRow::rbp_rule`]: the caller's `rbp` is this frame's (not saved).
pub const RBP_SAME: u8 = 0;
/// [`StackRow::rbp_rule`]: the caller's `rbp` is saved at `CFA + rbp_off`.
pub const RBP_AT: u8 = 1;

/// One row of the compiled unwind table (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackRow {
    /// First address (run time) the row covers; it holds up to the next row.
    pub pc: u64,
    /// Offset added to the CFA's base register.
    pub cfa_off: i32,
    /// With [`RBP_AT`]: the caller's `rbp` is at `CFA + rbp_off`.
    pub rbp_off: i16,
    /// `CFA_*`.
    pub cfa_reg: u8,
    /// `RBP_*`.
    pub rbp_rule: u8,
}
const _: () = assert!(core::mem::size_of::<StackRow>() == 16);

/// The row covering `pc` in `rows` (sorted by `pc`), if any.
#[inline]
pub fn find_row(rows: &[StackRow], pc: u64) -> Option<&StackRow> {
    let i = rows.partition_point(|r| r.pc <= pc);
    rows.get(i.checked_sub(1)?)
}

/// Registers at the frame a walk starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkStart {
    /// The first return address (the caller of the probed function: the
    /// word at `rsp` at a function's first instruction).
    pub ret: u64,
    /// `rsp` right after that return address was popped (the caller's
    /// stack pointer after its `call` returns).
    pub rsp: u64,
    /// `rbp` at the hit (unchanged at a function's first instruction).
    pub rbp: u64,
}

/// How a walk ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkEnd {
    /// Frames written into the output.
    pub depth: usize,
    /// True when the stack goes on past the last frame written: the depth
    /// limit was reached, a word could not be read, a rule could not be
    /// followed ([`CFA_STOP`]) or the stack pointer did not move up.
    pub truncated: bool,
}

/// Walks the stack from `start`, writing return addresses into `out`
/// (`out[0]` = `start.ret`) until the outermost frame, the end of `out`,
/// or a frame it cannot unwind (then `truncated`).
///
/// `lookup(pc)` gives the row covering `pc` ([`find_row`] over the
/// table, or a cache in front of it).
/// `read(addr)` returns the 8-byte word at `addr`, or `None` where it may
/// not be read. `fix(slot, word)` maps a return address read at `slot`
/// back to the real one when the agent swapped it for its return
/// trampoline (identity otherwise; `None`: unknown, the walk stops
/// truncated). No allocation, no panic, no recursion.
pub fn walk(
    mut lookup: impl FnMut(u64) -> Option<StackRow>,
    start: WalkStart,
    mut read: impl FnMut(u64) -> Option<u64>,
    mut fix: impl FnMut(u64, u64) -> Option<u64>,
    out: &mut [u64],
) -> WalkEnd {
    let mut pc = start.ret;
    let mut rsp = start.rsp;
    let mut rbp = start.rbp;
    let mut depth = 0;
    loop {
        if pc == 0 {
            return WalkEnd {
                depth,
                truncated: false,
            };
        }
        let Some(slot) = out.get_mut(depth) else {
            return WalkEnd {
                depth,
                truncated: true,
            };
        };
        *slot = pc;
        depth += 1;
        // A return address points after its call: the call's own row is
        // the one covering pc - 1.
        let row = lookup(pc.wrapping_sub(1)).unwrap_or(StackRow {
            cfa_reg: CFA_NONE,
            ..StackRow::default()
        });
        let (cfa, caller_rbp) = match row.cfa_reg {
            CFA_RSP | CFA_RBP => {
                let base = if row.cfa_reg == CFA_RSP { rsp } else { rbp };
                let cfa = base.wrapping_add(row.cfa_off as i64 as u64);
                let caller_rbp = if row.rbp_rule == RBP_AT {
                    match read(cfa.wrapping_add(row.rbp_off as i64 as u64)) {
                        Some(v) => v,
                        None => {
                            return WalkEnd {
                                depth,
                                truncated: true,
                            }
                        }
                    }
                } else {
                    rbp
                };
                (cfa, caller_rbp)
            }
            CFA_NONE => {
                // Frame pointers: [rbp] = caller's rbp, [rbp+8] = return
                // address; the frame must lie above the stack pointer.
                if rbp < rsp {
                    return WalkEnd {
                        depth,
                        truncated: true,
                    };
                }
                match read(rbp) {
                    Some(v) => (rbp.wrapping_add(16), v),
                    None => {
                        return WalkEnd {
                            depth,
                            truncated: true,
                        }
                    }
                }
            }
            CFA_END => {
                return WalkEnd {
                    depth,
                    truncated: false,
                }
            }
            _ => {
                return WalkEnd {
                    depth,
                    truncated: true,
                }
            }
        };
        // The stack grows down: a caller's frame is above its callee's.
        if cfa <= rsp {
            return WalkEnd {
                depth,
                truncated: true,
            };
        }
        let ra_slot = cfa.wrapping_sub(8);
        let Some(word) = read(ra_slot) else {
            return WalkEnd {
                depth,
                truncated: true,
            };
        };
        let Some(ret) = fix(ra_slot, word) else {
            return WalkEnd {
                depth,
                truncated: true,
            };
        };
        pc = ret;
        rsp = cfa;
        rbp = caller_rbp;
    }
}

// ---------------------------------------------------------------------
// The stacks region: after the main layout, in the same memfd.
// ---------------------------------------------------------------------

/// `b"HPSTACKS"` as a little-endian `u64`: first word of the stacks region.
pub const STACKS_MAGIC: u64 = u64::from_le_bytes(*b"HPSTACKS");
/// Version of the stacks region's layout.
pub const STACKS_VERSION: u32 = 1;
/// Frames kept per stack (the walk's depth limit).
pub const MAX_FRAMES: usize = 32;
/// [`StackSlot::depth`] bit: the stack was truncated.
pub const DEPTH_TRUNCATED: u32 = 1 << 31;

/// The control block at the start of the stacks region.
#[repr(C)]
#[derive(Debug)]
pub struct StacksCtl {
    /// [`STACKS_MAGIC`].
    pub magic: u64,
    /// [`STACKS_VERSION`].
    pub version: u32,
    /// Slots of the stack table (a power of two).
    pub table_slots: u32,
    /// Bytes of the region.
    pub size: u64,
    /// Rows the row array can hold.
    pub rows_capacity: u64,
    /// Readable regions the region array can hold.
    pub regions_capacity: u64,
    /// Byte offset (from the region's start) of the stack table.
    pub table_offset: u64,
    /// Byte offset of the row array.
    pub rows_offset: u64,
    /// Byte offset of the readable-region array.
    pub regions_offset: u64,
    /// Sequence (tracer): odd while the tracer rewrites rows or regions;
    /// a walk that saw it odd, or changed, is thrown away (counted torn).
    pub seq: AtomicU64,
    /// Rows in use (tracer).
    pub n_rows: AtomicU64,
    /// Readable regions in use (tracer).
    pub n_regions: AtomicU64,
    /// Stacks captured (agent).
    pub captured: AtomicU64,
    /// Of them, truncated (agent).
    pub truncated: AtomicU64,
    /// Hits whose walk was thrown away: the tables changed under it
    /// (agent). Counted, not stored.
    pub torn: AtomicU64,
    /// Hits whose stack found the table full (agent). Counted, not stored.
    pub table_full: AtomicU64,
    /// Hits whose stack pointer lay in no readable region (agent): a
    /// thread started since the tracer last published them. Walked with
    /// fault-safe reads (a system call a word), or, in seccomp strict
    /// mode, not at all.
    pub no_region: AtomicU64,
}

/// A readable region (`[start, end)`): a stack mapping the tracer saw in
/// the target's maps.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadableRegion {
    /// First byte.
    pub start: u64,
    /// One past the last byte.
    pub end: u64,
}

/// One stack of the stack table: identified by a 64-bit hash of the probe
/// id, the depth and the frames (two different stacks with one hash are
/// counted as one: odds of 2^-64 per pair).
#[repr(C)]
#[derive(Debug)]
pub struct StackSlot {
    /// The stack's hash; 0 = empty (claimed by CAS).
    pub hash: AtomicU64,
    /// Hits with this stack.
    pub count: AtomicU64,
    /// Probe id.
    pub probe: AtomicU32,
    /// Frames, with [`DEPTH_TRUNCATED`].
    pub depth: AtomicU32,
    /// 1 once `probe`, `depth` and `frames` are written (Release).
    pub ready: AtomicU32,
    /// Reserved.
    pub reserved: u32,
    /// Return addresses, innermost first.
    pub frames: [AtomicU64; MAX_FRAMES],
}

/// Sizes of a stacks region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StacksParams {
    /// Slots of the stack table (rounded up to a power of two).
    pub table_slots: u32,
    /// Rows of the unwind table.
    pub rows_capacity: u64,
    /// Readable regions.
    pub regions_capacity: u64,
}

impl Default for StacksParams {
    fn default() -> Self {
        StacksParams {
            table_slots: 8192,
            rows_capacity: 1 << 20,
            regions_capacity: 1024,
        }
    }
}

/// Offsets of a stacks region of `p` (table, rows, regions, total size).
fn stacks_layout(p: StacksParams) -> Option<(u64, u64, u64, u64)> {
    layout_of(p.table_slots, p.rows_capacity, p.regions_capacity)
}

/// [`stacks_layout`] from scalars, inlined (the agent's fast path
/// validates a region at each hit: no struct copies, see
/// [`StacksView::of`]).
#[inline(always)]
fn layout_of(
    table_slots: u32,
    rows_capacity: u64,
    regions_capacity: u64,
) -> Option<(u64, u64, u64, u64)> {
    let align = |x: u64| {
        x.checked_add(PAGE as u64 - 1)
            .map(|v| v & !(PAGE as u64 - 1))
    };
    let slots = (table_slots.max(2) as u64).checked_next_power_of_two()?;
    let table = PAGE as u64;
    let rows =
        align(table.checked_add(slots.checked_mul(core::mem::size_of::<StackSlot>() as u64)?)?)?;
    let regions = align(rows.checked_add(rows_capacity.checked_mul(16)?)?)?;
    let size = align(regions.checked_add(regions_capacity.checked_mul(16)?)?)?;
    Some((table, rows, regions, size))
}

/// Bytes a stacks region of `p` takes.
pub fn stacks_size(p: StacksParams) -> Option<usize> {
    stacks_layout(p).and_then(|l| usize::try_from(l.3).ok())
}

/// A validated view of a stacks region.
#[derive(Clone, Copy, Debug)]
pub struct StacksView {
    base: *mut u8,
    table_slots: usize,
    rows_capacity: usize,
    regions_capacity: usize,
    table_offset: usize,
    rows_offset: usize,
    regions_offset: usize,
}

// SAFETY: the view only hands out atomics and copies of plain data from a
// shared mapping; the tracer and every agent thread use it concurrently.
unsafe impl Send for StacksView {}
// SAFETY: as above.
unsafe impl Sync for StacksView {}

impl StacksView {
    /// Writes a fresh control block at `ptr` (`len` zero-filled bytes,
    /// page-aligned), for the tracer.
    ///
    /// # Safety
    /// `ptr` is valid for writes of `len` bytes for the view's life.
    pub unsafe fn create(
        ptr: *mut u8,
        len: usize,
        p: StacksParams,
    ) -> Result<StacksView, AbiError> {
        let (table, rows, regions, size) =
            stacks_layout(p).ok_or(AbiError::BadParams("stacks region too large"))?;
        if ptr.is_null() {
            return Err(AbiError::Null);
        }
        if !(ptr as usize).is_multiple_of(64) {
            return Err(AbiError::Misaligned);
        }
        if size > len as u64 {
            return Err(AbiError::TooSmall {
                needed: size as usize,
                len,
            });
        }
        let ctl = ptr as *mut StacksCtl;
        // SAFETY: `len` ≥ size ≥ one page ≥ the control block, per the caller.
        unsafe {
            core::ptr::addr_of_mut!((*ctl).version).write(STACKS_VERSION);
            core::ptr::addr_of_mut!((*ctl).table_slots)
                .write((p.table_slots.max(2)).next_power_of_two());
            core::ptr::addr_of_mut!((*ctl).size).write(size);
            core::ptr::addr_of_mut!((*ctl).rows_capacity).write(p.rows_capacity);
            core::ptr::addr_of_mut!((*ctl).regions_capacity).write(p.regions_capacity);
            core::ptr::addr_of_mut!((*ctl).table_offset).write(table);
            core::ptr::addr_of_mut!((*ctl).rows_offset).write(rows);
            core::ptr::addr_of_mut!((*ctl).regions_offset).write(regions);
            core::ptr::addr_of_mut!((*ctl).magic).write(STACKS_MAGIC);
            StacksView::attach(ptr, len)
        }
    }

    /// Validates the control block at `ptr` (`len` bytes).
    ///
    /// # Safety
    /// `ptr` is valid for reads and writes of `len` bytes for the view's
    /// life.
    #[inline(always)]
    pub unsafe fn attach(ptr: *mut u8, len: usize) -> Result<StacksView, AbiError> {
        if ptr.is_null() {
            return Err(AbiError::Null);
        }
        if !(ptr as usize).is_multiple_of(64) {
            return Err(AbiError::Misaligned);
        }
        if len < PAGE {
            return Err(AbiError::TooSmall { needed: PAGE, len });
        }
        // SAFETY: len ≥ one page, which holds the control block.
        let c = unsafe { &*(ptr as *const StacksCtl) };
        if c.magic != STACKS_MAGIC {
            return Err(AbiError::BadMagic(c.magic));
        }
        if c.version != STACKS_VERSION {
            return Err(AbiError::Version {
                found: c.version,
                expected: STACKS_VERSION,
            });
        }
        let Some((table, rows, regions, size)) =
            layout_of(c.table_slots, c.rows_capacity, c.regions_capacity)
        else {
            return Err(AbiError::Inconsistent("stacks sizes overflow"));
        };
        if !c.table_slots.is_power_of_two()
            || c.table_offset != table
            || c.rows_offset != rows
            || c.regions_offset != regions
            || c.size != size
        {
            return Err(AbiError::Inconsistent("stacks offsets"));
        }
        if size > len as u64 {
            return Err(AbiError::TooSmall {
                needed: size as usize,
                len,
            });
        }
        Ok(StacksView {
            base: ptr,
            table_slots: c.table_slots as usize,
            rows_capacity: c.rows_capacity as usize,
            regions_capacity: c.regions_capacity as usize,
            table_offset: table as usize,
            rows_offset: rows as usize,
            regions_offset: regions as usize,
        })
    }

    /// The stacks region of `shm`: the bytes of its mapping past the main
    /// layout, when they hold one. Inlined: the agent's fast path may not
    /// copy the view (a struct copy compiles to vector moves).
    #[inline(always)]
    pub fn of(shm: &Shm) -> Option<StacksView> {
        let off = shm.layout().total_size;
        let len = shm.len().checked_sub(off)?;
        // SAFETY: `off..len` lies inside the shared mapping `shm` views,
        // which stays mapped while the Shm is used.
        unsafe { StacksView::attach(shm.as_ptr().add(off), len) }.ok()
    }

    /// The control block.
    pub fn ctl(&self) -> &StacksCtl {
        // SAFETY: validated at attach.
        unsafe { &*(self.base as *const StacksCtl) }
    }

    /// The stack table.
    pub fn table(&self) -> &[StackSlot] {
        // SAFETY: validated at attach: table_slots slots at table_offset.
        unsafe {
            core::slice::from_raw_parts(
                self.base.add(self.table_offset) as *const StackSlot,
                self.table_slots,
            )
        }
    }

    /// The rows in use. The tracer may rewrite them (see
    /// [`StacksCtl::seq`]): a walk checks the sequence around its use.
    pub fn rows(&self) -> &[StackRow] {
        let n = (self.ctl().n_rows.load(Ordering::Acquire) as usize).min(self.rows_capacity);
        // SAFETY: n ≤ rows_capacity rows at rows_offset (validated); rows
        // are plain data, any bit pattern is a valid row.
        unsafe {
            core::slice::from_raw_parts(self.base.add(self.rows_offset) as *const StackRow, n)
        }
    }

    /// The readable regions in use (see [`StacksView::rows`] on changes).
    pub fn regions(&self) -> &[ReadableRegion] {
        let n = (self.ctl().n_regions.load(Ordering::Acquire) as usize).min(self.regions_capacity);
        // SAFETY: as for rows.
        unsafe {
            core::slice::from_raw_parts(
                self.base.add(self.regions_offset) as *const ReadableRegion,
                n,
            )
        }
    }

    /// Replaces rows and regions (tracer): sequence odd, write, sequence
    /// even. Returns false (nothing changed) when either does not fit.
    ///
    /// # Safety
    /// Only one writer (the tracer) at a time.
    pub unsafe fn publish(&self, rows: &[StackRow], regions: &[ReadableRegion]) -> bool {
        if rows.len() > self.rows_capacity || regions.len() > self.regions_capacity {
            return false;
        }
        let c = self.ctl();
        c.seq.fetch_add(1, Ordering::AcqRel);
        core::sync::atomic::fence(Ordering::Release);
        // SAFETY: in bounds (checked above); the agent's readers detect
        // the change through `seq` and discard what they read meanwhile.
        unsafe {
            core::ptr::copy_nonoverlapping(
                rows.as_ptr(),
                self.base.add(self.rows_offset) as *mut StackRow,
                rows.len(),
            );
            core::ptr::copy_nonoverlapping(
                regions.as_ptr(),
                self.base.add(self.regions_offset) as *mut ReadableRegion,
                regions.len(),
            );
        }
        c.n_rows.store(rows.len() as u64, Ordering::Release);
        c.n_regions.store(regions.len() as u64, Ordering::Release);
        // Pairs with the agent's Acquire load of `seq` after its walk.
        c.seq.fetch_add(1, Ordering::Release);
        true
    }

    /// Replaces the readable regions alone (tracer; a thread started, its
    /// stack mapped): as [`StacksView::publish`], rows untouched.
    ///
    /// # Safety
    /// Only one writer (the tracer) at a time.
    pub unsafe fn publish_regions(&self, regions: &[ReadableRegion]) -> bool {
        if regions.len() > self.regions_capacity {
            return false;
        }
        let c = self.ctl();
        c.seq.fetch_add(1, Ordering::AcqRel);
        core::sync::atomic::fence(Ordering::Release);
        // SAFETY: in bounds (checked above); readers check `seq`.
        unsafe {
            core::ptr::copy_nonoverlapping(
                regions.as_ptr(),
                self.base.add(self.regions_offset) as *mut ReadableRegion,
                regions.len(),
            );
        }
        c.n_regions.store(regions.len() as u64, Ordering::Release);
        // Pairs with the agent's Acquire load of `seq` after its walk.
        c.seq.fetch_add(1, Ordering::Release);
        true
    }

    /// Adds one hit of `probe` with `frames` to the table (agent): no
    /// lock, no allocation; false when the table is full (counted).
    pub fn add(&self, probe: u32, frames: &[u64], truncated: bool) -> bool {
        self.add_with_id(probe, frames, truncated).is_some()
    }

    /// [`StacksView::add`], giving the stack's id: 1 + the slot that
    /// holds it (a slot keeps its stack for the region's life), `None`
    /// when the table is full (counted). [`StacksView::with_stack`] reads it.
    pub fn add_with_id(&self, probe: u32, frames: &[u64], truncated: bool) -> Option<u32> {
        let frames = frames.get(..frames.len().min(MAX_FRAMES)).unwrap_or(&[]);
        let depth = frames.len() as u32 | if truncated { DEPTH_TRUNCATED } else { 0 };
        let hash = stack_hash(probe, depth, frames);
        let table = self.table();
        let mask = table.len() - 1;
        let mut i = hash as usize & mask;
        for _ in 0..table.len().min(256) {
            let Some(s) = table.get(i) else { break };
            let k = s.hash.load(Ordering::Acquire);
            if k == 0 {
                if s.hash
                    .compare_exchange(0, hash, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    s.probe.store(probe, Ordering::Relaxed);
                    s.depth.store(depth, Ordering::Relaxed);
                    for (d, f) in s.frames.iter().zip(frames) {
                        d.store(*f, Ordering::Relaxed);
                    }
                    // Pairs with the reader's Acquire load of `ready`.
                    s.ready.store(1, Ordering::Release);
                    s.count.fetch_add(1, Ordering::Relaxed);
                    return Some(i as u32 + 1);
                }
                if s.hash.load(Ordering::Acquire) == hash {
                    s.count.fetch_add(1, Ordering::Relaxed);
                    return Some(i as u32 + 1);
                }
            } else if k == hash {
                s.count.fetch_add(1, Ordering::Relaxed);
                return Some(i as u32 + 1);
            }
            i = (i + 1) & mask;
        }
        self.ctl().table_full.fetch_add(1, Ordering::Relaxed);
        None
    }

    /// Calls `f(probe, frames, truncated)` with the stack of id `id`
    /// ([`StacksView::add_with_id`]), frames innermost first; false for
    /// an id no stack has (yet).
    pub fn with_stack(&self, id: u32, f: impl FnOnce(u32, &[u64], bool)) -> bool {
        let Some(s) = (id as usize)
            .checked_sub(1)
            .and_then(|i| self.table().get(i))
        else {
            return false;
        };
        if s.hash.load(Ordering::Acquire) == 0 || s.ready.load(Ordering::Acquire) == 0 {
            return false;
        }
        let depth = s.depth.load(Ordering::Relaxed);
        let n = ((depth & !DEPTH_TRUNCATED) as usize).min(MAX_FRAMES);
        let mut buf = [0u64; MAX_FRAMES];
        for (b, w) in buf.iter_mut().zip(&s.frames) {
            *b = w.load(Ordering::Relaxed);
        }
        f(
            s.probe.load(Ordering::Relaxed),
            buf.get(..n).unwrap_or(&[]),
            depth & DEPTH_TRUNCATED != 0,
        );
        true
    }

    /// Calls `f(probe, frames, truncated, count)` for every stack stored
    /// (tracer; a stack still being written is skipped).
    pub fn for_each(&self, mut f: impl FnMut(u32, &[u64], bool, u64)) {
        let mut buf = [0u64; MAX_FRAMES];
        for s in self.table() {
            if s.hash.load(Ordering::Acquire) == 0 || s.ready.load(Ordering::Acquire) == 0 {
                continue;
            }
            let depth = s.depth.load(Ordering::Relaxed);
            let n = ((depth & !DEPTH_TRUNCATED) as usize).min(MAX_FRAMES);
            for (b, f) in buf.iter_mut().zip(&s.frames) {
                *b = f.load(Ordering::Relaxed);
            }
            f(
                s.probe.load(Ordering::Relaxed),
                buf.get(..n).unwrap_or(&[]),
                depth & DEPTH_TRUNCATED != 0,
                s.count.load(Ordering::Relaxed),
            );
        }
    }
}

/// A 64-bit hash of the probe id, depth word and frames (a multiply
/// and a rotate per word, then a final mix); never 0.
pub fn stack_hash(probe: u32, depth: u32, frames: &[u64]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = (((depth as u64) << 32) | probe as u64).wrapping_mul(K);
    for f in frames {
        h = (h.rotate_left(23) ^ f).wrapping_mul(K);
    }
    // splitmix64's finaliser.
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    if h == 0 {
        1
    } else {
        h
    }
}
