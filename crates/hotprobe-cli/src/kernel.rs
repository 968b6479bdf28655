//! `record --kernel`: the check before the run and the summary's line;
//! the events themselves come from `hotprobe::kernel_source::KernelSource`,
//! an observer registered with the session.

use anyhow::Result;
use hotprobe::kernel_source::KernelRecorded;

/// Fails (saying which permission is missing and how to get it) unless
/// the syscall tracepoints can be opened: checked before the target runs.
pub fn check() -> Result<()> {
    Ok(hotprobe::kernel_source::check_kernel_access()?)
}

/// The summary's line.
pub fn summary(r: &KernelRecorded) -> String {
    let (st, syscalls, off_cpu) = (&r.stats, r.syscalls, r.off_cpu);
    format!(
        "  kernel:   {syscalls} syscalls and {off_cpu} off-CPU intervals (threads followed from \
         the start {}, {} perf events); {} records taken, {} lost by the kernel (full ring), \
         {} unpaired{}",
        st.threads,
        st.fds,
        st.records,
        st.lost,
        st.unpaired + st.unfinished,
        if st.corrupt > 0 {
            format!(", {} ring reads not parsed whole", st.corrupt)
        } else {
            String::new()
        }
    )
}
