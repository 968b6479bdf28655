//! The definitions the agent's interposers hand on to: the next one of a
//! name after the agent (`dlsym(RTLD_NEXT)`, glibc's), looked up once and
//! kept.

use core::ffi::CStr;
use core::sync::atomic::AtomicUsize;
use core::sync::atomic::Ordering::Relaxed;

/// The address of the next definition of `name` after the agent, from
/// `cache` or looked up now (as the agent's own call: `dlsym` runs code of
/// the program's libraries a probe may be on) and kept there; 0 when there
/// is none.
pub(crate) fn next_symbol(cache: &AtomicUsize, name: &CStr) -> usize {
    let mut f = cache.load(Relaxed);
    if f == 0 {
        // SAFETY: `name` is NUL-terminated; RTLD_NEXT is a valid handle.
        f = crate::threads::as_own_call(|| unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) })
            as usize;
        cache.store(f, Relaxed);
    }
    f
}
