//! Bounds on what one call may ask of the target.

/// The most bytes one `hotprobe_ctx_read` reads (1 MiB): a
/// larger `len` is refused with `HOTPROBE_ERR_INVALID`, nothing read.
pub const HOTPROBE_MAX_READ: usize = 1 << 20;

/// Why a read of `len` bytes into `buf` is refused (a NULL buffer, more
/// than [`HOTPROBE_MAX_READ`]), or `None`.
pub(crate) fn read_refused(buf: *mut std::ffi::c_void, len: usize) -> Option<String> {
    if buf.is_null() {
        return Some("buf is NULL".into());
    }
    (len > HOTPROBE_MAX_READ).then(|| {
        format!("len {len}: at most HOTPROBE_MAX_READ ({HOTPROBE_MAX_READ}) bytes per read")
    })
}
