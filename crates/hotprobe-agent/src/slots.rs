//! The length of the shared memory the agent maps at attach: a memory
//! whose thread slots grow ([`hotprobe_abi::SlotDirectory`]) is a sparse
//! file sized for every chunk up to the tracer's cap, of which the agent
//! maps the first part only; `hotprobe_abi::Shm` maps each further chunk
//! when a thread claims a slot in it (no descriptor kept open).

use hotprobe_abi::{SlotDirectory, MAGIC, SLOT_DIRECTORY_OFFSET, VERSION};

/// The directory's `initial_len` in the file behind `fd` (read with
/// `pread`, at offset 0), when the file holds a memory of this layout
/// version whose slots grow; None otherwise (map the whole file).
pub(crate) fn initial_len(fd: libc::c_int) -> Option<usize> {
    const LEN: usize = SLOT_DIRECTORY_OFFSET + core::mem::size_of::<SlotDirectory>();
    let mut page = [0u8; LEN];
    // SAFETY: `page` is valid for LEN bytes of writes.
    let r = unsafe { libc::pread(fd, page.as_mut_ptr().cast(), LEN, 0) };
    if r != LEN as isize {
        return None;
    }
    let word = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(page.get(at..at + 8)?.try_into().ok()?))
    };
    let version = u32::from_le_bytes(page.get(8..12)?.try_into().ok()?);
    if word(0)? != MAGIC || version != VERSION {
        return None;
    }
    // `initial_len` is the directory's first field.
    match word(SLOT_DIRECTORY_OFFSET)? {
        0 => None,
        n => usize::try_from(n).ok(),
    }
}
