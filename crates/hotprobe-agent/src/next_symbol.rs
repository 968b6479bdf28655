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

/// As [`next_symbol`]; where the global scope after the agent has none
/// (the program loaded, with `dlopen`, a library that brought the only
/// definition, as a C++ library brings `libgcc_s`: that library's own
/// lookup would have found it had the agent not come first), the first
/// definition in a loaded object other than the agent's. That one is
/// looked up at each call, not kept: the library that brought it may be
/// unloaded. 0 when no loaded object has one.
pub(crate) fn next_or_loaded_symbol(cache: &AtomicUsize, name: &CStr) -> usize {
    let f = next_symbol(cache, name);
    if f != 0 {
        return f;
    }
    crate::threads::as_own_call(|| loaded_symbol(name))
}

/// The base address of the object holding `addr` (0 if none).
fn object_base(addr: usize) -> usize {
    // SAFETY: an all-zero Dl_info is valid (null pointers).
    let mut info: libc::Dl_info = unsafe { core::mem::zeroed() };
    // SAFETY: dladdr only reads the loader's tables; `info` is written.
    if unsafe { libc::dladdr(addr as *const libc::c_void, &mut info) } == 0 {
        return 0;
    }
    info.dli_fbase as usize
}

/// `name` in the loaded objects other than the agent's (each opened with
/// `RTLD_NOLOAD`, so nothing is loaded), in load order.
fn loaded_symbol(name: &CStr) -> usize {
    unsafe extern "C" fn collect(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: `data` is the Vec passed below, alive and not otherwise
        // borrowed during the iteration.
        let names = unsafe { &mut *(data as *mut Vec<std::ffi::CString>) };
        // SAFETY: `info` is the loader's, valid for this call.
        let n = unsafe { (*info).dlpi_name };
        if !n.is_null() {
            // SAFETY: a non-null name is NUL-terminated, and valid while
            // the loader's lock is held (this call): copied here, since
            // a `dlclose` after the iteration may free it.
            let n = unsafe { CStr::from_ptr(n) };
            if !n.is_empty() {
                names.push(n.to_owned());
            }
        }
        0
    }
    let mut names: Vec<std::ffi::CString> = Vec::new();
    // SAFETY: `collect` only pushes into `names`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(collect), &mut names as *mut _ as *mut libc::c_void) };
    let agent = object_base(loaded_symbol as *const () as usize);
    for n in names {
        // SAFETY: `n` is NUL-terminated; RTLD_NOLOAD loads nothing, it only
        // takes a reference to an object still loaded, given back below.
        let h = unsafe { libc::dlopen(n.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) };
        if h.is_null() {
            continue;
        }
        // SAFETY: `h` is a live handle; `name` is NUL-terminated.
        let f = unsafe { libc::dlsym(h, name.as_ptr()) } as usize;
        // SAFETY: the reference RTLD_NOLOAD took.
        unsafe { libc::dlclose(h) };
        if f != 0 && object_base(f) != agent {
            return f;
        }
    }
    0
}
