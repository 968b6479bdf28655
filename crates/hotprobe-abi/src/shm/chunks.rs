//! Thread slots that grow on demand: a two-level table of chunks.
//!
//! Chunk 0 is the [`crate::Params::n_threads`] slots of the main layout
//! (at [`crate::Layout::threads_offset`]). A memory made with
//! [`Shm::create_growable`] has more chunks, each `n_threads` slots of the
//! same stride followed by `n_threads` handler slots (past the trap
//! table's [`HANDLER_SLOTS`]), in the same file after what both sides map at attach
//! ([`SlotDirectory::initial_len`]): chunk `k` (k ≥ 1) lies at file offset
//! `chunk1_offset + (k - 1) × chunk_bytes`. The file is sized for every
//! chunk up to the cap ([`SlotDirectory::max_slots`]) at creation, which
//! costs nothing (a sparse memfd); a chunk is mapped into a process the
//! first time that process looks at one of its slots (a thread of the
//! agent claiming it, the tracer draining it), and never before: a program
//! with 100 threads maps one chunk, one with 3,000 three.
//!
//! Mapping takes no descriptor (the agent keeps none open in the program):
//! the base mapping, when it ends where the chunk starts, is grown in place
//! (`mremap` without moving, when the address range after it is free), or
//! else its last page is mapped again, with the chunk after it, somewhere
//! else (`mremap` of a shared mapping with an old size of 0 makes a new
//! mapping of the same file). Each process keeps its chunk addresses in
//! its own view ([`Shm`]), published with a `Release` compare-exchange
//! and read with an `Acquire` load: a lookup is a compare for chunk 0 and
//! a load for the others; only a process's first look at a chunk makes a
//! system call. Two threads mapping the same chunk at once both map it;
//! the loser unmaps its copy. No lock, no allocation.

use core::mem::size_of;
use core::sync::atomic::AtomicUsize;
use core::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed};

use super::Shm;
use crate::layout::{HandlerSlot, Layout, Params, HANDLER_SLOTS, HEADER_SIZE, PAGE};
use crate::AbiError;

/// Offset of the [`SlotDirectory`] in the mapping: right after the
/// header, in the first page's reserved part.
pub const SLOT_DIRECTORY_OFFSET: usize = HEADER_SIZE;
/// Chunks of thread slots at most, chunk 0 (the main layout's) included.
pub const MAX_SLOT_CHUNKS: usize = 64;
/// Thread slots at most ([`SlotDirectory::max_slots`]).
pub const MAX_SLOTS: u32 = 1 << 16;
/// Slots per chunk the tracer picks by default
/// (`min(cap, DEFAULT_CHUNK_SLOTS)`): the main layout holds this many, so
/// a program with fewer threads maps no chunk.
pub const DEFAULT_CHUNK_SLOTS: u32 = 1024;

/// Where the thread slots past the main layout's go (plain fields written
/// by the tracer at creation, before the magic; read once at attach).
#[repr(C)]
#[derive(Debug)]
pub struct SlotDirectory {
    /// Bytes of the file each side maps at attach (the main layout and
    /// what follows it, the stacks region); 0: the memory does not grow
    /// (its `n_threads` slots are all).
    pub initial_len: u64,
    /// File offset of chunk 1: `initial_len` rounded up to a page.
    pub chunk1_offset: u64,
    /// Bytes per chunk: `n_threads` thread slots of `thread_stride`
    /// bytes, then `n_threads` handler slots ([`HandlerSlot`], after the
    /// trap table's [`HANDLER_SLOTS`]), rounded up to a page.
    pub chunk_bytes: u64,
    /// Thread slots at most, every chunk's (the cap, `--max-threads`):
    /// at least `n_threads`, at most [`MAX_SLOTS`] and
    /// [`MAX_SLOT_CHUNKS`] chunks.
    pub max_slots: u32,
    reserved: u32,
}
const _: () = assert!(core::mem::size_of::<SlotDirectory>() == 32);
const _: () = assert!(SLOT_DIRECTORY_OFFSET + 32 <= PAGE);

/// A process's view of the chunks (in [`Shm`], not shared).
#[derive(Debug)]
pub(crate) struct Chunks {
    /// File offset of chunk 1 (0: no growth).
    chunk1: usize,
    /// Bytes per chunk.
    bytes: usize,
    /// Thread slots at most.
    pub(crate) max_slots: u32,
    /// Address of chunk `k` in this process (0: not mapped here), with
    /// bit 0 set when the mapping starts a page before it (a copy of the
    /// previous mapping's last page, see the module docs).
    at: [AtomicUsize; MAX_SLOT_CHUNKS],
}

/// Bit 0 of [`Chunks::at`]: the mapping holds one more page before the chunk.
const ANCHORED: usize = 1;

impl Chunks {
    /// No chunk past the main layout's `n_threads` slots.
    pub(crate) fn none(n_threads: u32) -> Chunks {
        Chunks {
            chunk1: 0,
            bytes: 0,
            max_slots: n_threads,
            at: [const { AtomicUsize::new(0) }; MAX_SLOT_CHUNKS],
        }
    }
}

/// The file length a growable memory needs: `initial_len` bytes mapped at
/// attach, then the chunks for `max_slots` thread slots (see
/// [`Shm::create_growable`]).
pub fn growable_file_len(
    params: Params,
    initial_len: usize,
    max_slots: u32,
) -> Result<usize, AbiError> {
    let layout = Layout::new(params)?;
    let (chunk1, bytes, chunks) = geometry(&layout, initial_len, max_slots)?;
    (chunks - 1)
        .checked_mul(bytes)
        .and_then(|b| b.checked_add(chunk1))
        .ok_or(AbiError::BadParams("sizes overflow"))
}

/// `(chunk1_offset, chunk_bytes, chunks)` of a growable memory, checked.
fn geometry(
    layout: &Layout,
    initial_len: usize,
    max_slots: u32,
) -> Result<(usize, usize, usize), AbiError> {
    let n = layout.params.n_threads;
    if max_slots < n || max_slots > MAX_SLOTS {
        return Err(AbiError::BadParams(
            "max_slots must be in n_threads..=65536",
        ));
    }
    let chunks = max_slots.div_ceil(n) as usize;
    if chunks > MAX_SLOT_CHUNKS {
        return Err(AbiError::BadParams("max_slots over 64 chunks of n_threads"));
    }
    if initial_len < layout.total_size {
        return Err(AbiError::TooSmall {
            needed: layout.total_size,
            len: initial_len,
        });
    }
    let overflow = AbiError::BadParams("sizes overflow");
    let chunk1 = initial_len.checked_next_multiple_of(PAGE).ok_or(overflow)?;
    let bytes = (layout.thread_stride + size_of::<HandlerSlot>())
        .checked_mul(n as usize)
        .and_then(|b| b.checked_next_multiple_of(PAGE))
        .ok_or(overflow)?;
    (chunks - 1)
        .checked_mul(bytes)
        .and_then(|b| b.checked_add(chunk1))
        .ok_or(overflow)?;
    Ok((chunk1, bytes, chunks))
}

impl Shm {
    /// [`Shm::create`] for a memory whose thread slots grow on demand up
    /// to `max_slots`, in chunks of `params.n_threads` (tracer side). `len`
    /// bytes are mapped at `ptr` (the initial part, which the agent maps
    /// too); the file behind must be [`growable_file_len`] bytes long and
    /// the mapping a shared one of it (chunks are mapped from it).
    ///
    /// # Safety
    /// As for [`Shm::create`].
    pub unsafe fn create_growable(
        ptr: *mut u8,
        len: usize,
        params: Params,
        max_slots: u32,
    ) -> Result<Shm, AbiError> {
        let layout = Layout::new(params)?;
        let (chunk1, bytes, _) = geometry(&layout, len, max_slots)?;
        if len < SLOT_DIRECTORY_OFFSET + core::mem::size_of::<SlotDirectory>() {
            return Err(AbiError::TooSmall { needed: PAGE, len });
        }
        let d = ptr.wrapping_add(SLOT_DIRECTORY_OFFSET) as *mut SlotDirectory;
        // SAFETY: inside the first page of the caller's mapping (checked
        // length), 8-aligned (the mapping is page-aligned); plain fields,
        // written before `create` publishes the magic.
        unsafe {
            core::ptr::addr_of_mut!((*d).initial_len).write(len as u64);
            core::ptr::addr_of_mut!((*d).chunk1_offset).write(chunk1 as u64);
            core::ptr::addr_of_mut!((*d).chunk_bytes).write(bytes as u64);
            core::ptr::addr_of_mut!((*d).max_slots).write(max_slots);
        }
        // SAFETY: the caller's contract.
        let mut shm = unsafe { Shm::create(ptr, len, params) }?;
        shm.chunks = Chunks {
            chunk1,
            bytes,
            max_slots,
            ..Chunks::none(params.n_threads)
        };
        Ok(shm)
    }

    /// Reads the slot directory of a mapping `attach` validated (its
    /// `layout`, `len` bytes): the chunks it describes and the length of
    /// the view (`initial_len`: the chunks after it are mapped apart).
    pub(crate) fn read_chunks(
        base: *const u8,
        layout: &Layout,
        len: usize,
    ) -> Result<(Chunks, usize), AbiError> {
        let d = base.wrapping_add(SLOT_DIRECTORY_OFFSET) as *const SlotDirectory;
        // SAFETY: the layout was validated against `len`, so the first
        // page is mapped; plain fields copied with volatile reads.
        let (initial, chunk1, bytes, max_slots) = unsafe {
            (
                core::ptr::addr_of!((*d).initial_len).read_volatile(),
                core::ptr::addr_of!((*d).chunk1_offset).read_volatile(),
                core::ptr::addr_of!((*d).chunk_bytes).read_volatile(),
                core::ptr::addr_of!((*d).max_slots).read_volatile(),
            )
        };
        if initial == 0 {
            return Ok((Chunks::none(layout.params.n_threads), len));
        }
        let bad = AbiError::Inconsistent("slot directory");
        let initial = usize::try_from(initial).map_err(|_| bad)?;
        if initial > len {
            return Err(AbiError::TooSmall {
                needed: initial,
                len,
            });
        }
        let (c1, b, _) = geometry(layout, initial, max_slots).map_err(|_| bad)?;
        if c1 as u64 != chunk1 || b as u64 != bytes {
            return Err(bad);
        }
        let chunks = Chunks {
            chunk1: c1,
            bytes: b,
            max_slots,
            ..Chunks::none(layout.params.n_threads)
        };
        Ok((chunks, initial))
    }

    /// Lowers the cap so that every chunk lies inside a file of
    /// `file_len` bytes (agent side, from `fstat`: a chunk past the end
    /// would fault when touched).
    pub fn limit_slots_to_file(&mut self, file_len: usize) {
        let n = self.layout.params.n_threads;
        let c = &mut self.chunks;
        if c.chunk1 == 0 {
            return;
        }
        let whole = file_len.saturating_sub(c.chunk1) / c.bytes.max(1);
        let fit = (whole as u64 + 1).saturating_mul(n as u64);
        c.max_slots = c.max_slots.min(u32::try_from(fit).unwrap_or(u32::MAX));
    }

    /// Thread slots at most (the cap: every chunk's).
    #[inline(always)]
    pub fn slot_capacity(&self) -> u32 {
        self.chunks.max_slots
    }

    /// Thread slots per chunk (the main layout's `n_threads`).
    pub fn slot_chunk_size(&self) -> u32 {
        self.layout.params.n_threads
    }

    /// Chunks past the main layout's mapped in this process.
    pub fn chunks_mapped(&self) -> usize {
        self.chunks
            .at
            .iter()
            .filter(|a| a.load(Relaxed) != 0)
            .count()
    }

    /// The address of thread slot `slot` of a chunk past the first
    /// (`slot` ≥ `n_threads`), mapping its chunk here at the first look.
    #[inline]
    pub(crate) fn chunk_slot(&self, slot: u32) -> Option<*mut u8> {
        if slot >= self.chunks.max_slots {
            return None;
        }
        // checked: no panic path (and its vector-register formatting) in
        // the agent's hot path, even for a layout with no thread slot.
        let n = self.layout.params.n_threads;
        let (k, i) = (slot.checked_div(n)?, slot.checked_rem(n)?);
        let at = self.chunk_base(k as usize)?;
        Some((at + i as usize * self.layout.thread_stride) as *mut u8)
    }

    /// The address of chunk `k` ≥ 1 here, mapped at the first look.
    #[inline]
    fn chunk_base(&self, k: usize) -> Option<usize> {
        match self.chunks.at.get(k)?.load(Acquire) {
            0 => self.map_chunk(k),
            a => Some(a & !ANCHORED),
        }
    }

    /// Handler slots at most: the trap table's [`HANDLER_SLOTS`], then
    /// one per thread slot of every chunk past the first (see
    /// [`SlotDirectory::chunk_bytes`]).
    pub fn handler_capacity(&self) -> u32 {
        let n = self.layout.params.n_threads;
        let extra = match (self.chunks.chunk1, n) {
            (0, _) | (_, 0) => 0,
            _ => self.chunks.max_slots.div_ceil(n).saturating_sub(1) * n,
        };
        HANDLER_SLOTS as u32 + extra
    }

    /// Handler slot `index` (below [`Shm::handler_capacity`]): one of the
    /// trap table's, or one of a chunk's, whose chunk is mapped here at
    /// the first look.
    pub fn handler_slot_at(&self, index: u32) -> Option<&HandlerSlot> {
        let Some(j) = (index as usize).checked_sub(HANDLER_SLOTS) else {
            return self.handler_slots().get(index as usize);
        };
        if index >= self.handler_capacity() {
            return None;
        }
        let n = self.layout.params.n_threads as usize;
        let (k, i) = (j.checked_div(n)?, j.checked_rem(n)?);
        let at = self.chunk_base(1 + k)?;
        let p = at + n * self.layout.thread_stride + i * size_of::<HandlerSlot>();
        // SAFETY: inside chunk `1 + j / n` (its handler slots follow its
        // `n` thread slots, see `geometry`), mapped; 64-aligned (a page
        // plus multiples of 64); all atomics.
        Some(unsafe { &*(p as *const HandlerSlot) })
    }

    /// Maps chunk `k` (and the ones before it) into this process; its
    /// address. None when the kernel refused.
    #[cold]
    fn map_chunk(&self, k: usize) -> Option<usize> {
        let c = &self.chunks;
        let mut prev_end = self.base.as_ptr() as usize + c.chunk1;
        let mut prev_in_place = true;
        for j in 1..=k {
            let slot = c.at.get(j)?;
            let at = match slot.load(Acquire) {
                0 => {
                    let (at, anchored) = self.map_one(j, prev_end, prev_in_place)?;
                    let tagged = at | if anchored { ANCHORED } else { 0 };
                    // Release pairs with the Acquire loads above and in
                    // `chunk_slot`: the address is published once mapped.
                    match slot.compare_exchange(0, tagged, AcqRel, Acquire) {
                        Ok(_) => tagged,
                        Err(won) => {
                            // Another thread mapped it first: ours goes.
                            unmap(at, c.bytes, anchored);
                            won
                        }
                    }
                }
                a => a,
            };
            prev_in_place = at & ANCHORED == 0
                && (at & !ANCHORED) == self.base.as_ptr() as usize + c.chunk1 + (j - 1) * c.bytes;
            prev_end = (at & !ANCHORED) + c.bytes;
        }
        c.at.get(k).map(|a| a.load(Acquire) & !ANCHORED)
    }

    /// Maps chunk `j`, which starts in the file right where the mapping
    /// ending at `prev_end` (in place from the base when `in_place`) ends:
    /// its address and whether it was mapped with an anchor page.
    fn map_one(&self, j: usize, prev_end: usize, in_place: bool) -> Option<(usize, bool)> {
        let c = &self.chunks;
        let base = self.base.as_ptr() as usize;
        let offset = c.chunk1 + (j - 1) * c.bytes;
        if in_place {
            // The base mapping, from the base to this chunk, grown by the
            // chunk where the addresses after it are free (it never moves).
            let r = syscall5(MREMAP, base, offset, offset + c.bytes, 0, 0);
            if r == base {
                return Some((base + offset, false));
            }
        }
        // The page before the chunk (the previous mapping's last, the
        // same file page) mapped again with the chunk after it.
        let r = syscall5(
            MREMAP,
            prev_end - PAGE,
            0,
            c.bytes + PAGE,
            MREMAP_MAYMOVE,
            0,
        );
        if r > usize::MAX - 4095 {
            return None;
        }
        Some((r + PAGE, true))
    }

    /// Unmaps every chunk this process mapped (the agent at release; the
    /// view's drop). The slots of those chunks are not used afterwards.
    pub fn unmap_chunks(&self) {
        for a in self.chunks.at.iter().rev() {
            let at = a.swap(0, AcqRel);
            if at != 0 {
                unmap(at & !ANCHORED, self.chunks.bytes, at & ANCHORED != 0);
            }
        }
    }
}

impl Drop for Shm {
    fn drop(&mut self) {
        self.unmap_chunks();
    }
}

/// `mremap` (x86-64).
const MREMAP: usize = 25;
/// `munmap` (x86-64).
const MUNMAP: usize = 11;
/// `MREMAP_MAYMOVE`.
const MREMAP_MAYMOVE: usize = 1;

fn unmap(at: usize, bytes: usize, anchored: bool) {
    let (start, len) = if anchored {
        (at - PAGE, bytes + PAGE)
    } else {
        (at, bytes)
    };
    syscall5(MUNMAP, start, len, 0, 0, 0);
}

/// A system call of up to five arguments, made directly (the agent calls
/// nothing of libc on its hit paths; this crate has no libc). Returns the
/// raw result (-4095..-1 as an error).
fn syscall5(nr: usize, a0: usize, a1: usize, a2: usize, a3: usize, a4: usize) -> usize {
    let r: usize;
    // SAFETY: only `mremap` and `munmap` of this module's own chunk
    // mappings (or of the page before one, which `mremap` with an old
    // size of 0 only reads the description of); `syscall` clobbers rcx
    // and r11 and touches no memory of ours.
    unsafe {
        core::arch::asm!(
            "syscall",
            inlateout("rax") nr => r,
            in("rdi") a0,
            in("rsi") a1,
            in("rdx") a2,
            in("r10") a3,
            in("r8") a4,
            out("rcx") _,
            out("r11") _,
            options(nostack)
        )
    };
    r
}
