//! The tracer's clocks: `CLOCK_MONOTONIC` (the trace and heartbeat clock
//! of the QEMU plugin) and the TSC (the fast path's event clock), and the
//! rate between them.

use std::time::{Duration, Instant};

/// `CLOCK_MONOTONIC` now, in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The time stamp counter now.
#[inline]
pub fn rdtsc() -> u64 {
    // SAFETY: rdtsc has no preconditions on x86-64.
    #[allow(unused_unsafe)]
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
}

/// A (TSC, `CLOCK_MONOTONIC` ns) pair taken now, the TSC first.
pub fn tsc_monotonic_pair() -> (u64, u64) {
    let tsc = rdtsc();
    (tsc, monotonic_ns())
}

/// TSC ticks per second, measured over `over` (a sleep: the caller waits
/// that long; 2 ms gives a part in a thousand).
pub fn tsc_per_sec(over: Duration) -> u64 {
    let t0 = Instant::now();
    let c0 = rdtsc();
    std::thread::sleep(over);
    let c1 = rdtsc();
    let dt = t0.elapsed().as_secs_f64();
    (c1.wrapping_sub(c0) as f64 / dt) as u64
}
