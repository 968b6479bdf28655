//! Host-kernel events of a trace (format version 3): per thread, its
//! syscalls (number, return value, start, end) and off-CPU intervals, in
//! `kernel-TID.hpk` (docs/TRACE_FORMAT.md), listed in `info.json`'s
//! `kernel` with the counts of what was taken and lost.
//!
//! File: magic `HPKE`, version u16 (1), reserved u16, tid u32, pid u32,
//! count u64 (little-endian, 24 bytes), then `count` records by start
//! time: a tag byte (0 syscall, 1 off-CPU blocked, 2 off-CPU preempted),
//! the start as a uvarint delta from the previous start, the duration
//! (uvarint), and for a syscall its number (uvarint) and return value
//! (zigzag uvarint). Times are in ticks of the trace's time base, as the
//! streams' are: the recorder's CLOCK_MONOTONIC ns converted through the
//! calibration pairs ([`TimeBase::ticks_at_ns`]); the reader gives ns.

use std::borrow::Cow;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::{Result, TraceError};
use crate::event::TimeBase;
use crate::varint::{get_uvarint, put_uvarint, unzigzag, zigzag};

/// Magic of a kernel events file.
const MAGIC: &[u8; 4] = b"HPKE";
/// Version of the kernel events file.
const FILE_VERSION: u16 = 1;
/// Header size.
const HEADER_LEN: usize = 24;

/// The kernel events file of a thread.
pub fn kernel_file_name(tid: u32) -> String {
    format!("kernel-{tid}.hpk")
}

/// What a [`KernelEvent`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelKind {
    /// A system call.
    Syscall {
        /// Its x86-64 number.
        nr: u32,
        /// Its return value (negative errno on failure).
        ret: i64,
    },
    /// The thread was off the CPU.
    OffCpu {
        /// Preempted while runnable rather than blocked.
        preempted: bool,
    },
}

/// A thread's interval in the host kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelEvent {
    /// Start (ns when read; time-base ticks in the file).
    pub start: u64,
    /// End (≥ start).
    pub end: u64,
    /// Syscall or off-CPU.
    pub kind: KernelKind,
}

impl KernelEvent {
    /// Its duration.
    pub fn dur(&self) -> u64 {
        self.end - self.start
    }

    /// The syscall's name (`syscall_N` for a number the table does not
    /// know), or `off-cpu`.
    pub fn name(&self) -> Cow<'static, str> {
        match self.kind {
            KernelKind::Syscall { nr, .. } => match hotprobe_target::syscalls::syscall_name(nr) {
                Some(n) => Cow::Borrowed(n),
                None => Cow::Owned(format!("syscall_{nr}")),
            },
            KernelKind::OffCpu { .. } => Cow::Borrowed("off-cpu"),
        }
    }

    /// The return value as text: a number, or `-1 ENAME` for an error.
    pub fn ret_text(&self) -> String {
        match self.kind {
            KernelKind::Syscall { ret, .. } if (-4095..0).contains(&ret) => {
                match hotprobe_target::syscalls::errno_name((-ret) as u32) {
                    Some(e) => format!("-1 {e}"),
                    None => format!("-1 errno {}", -ret),
                }
            }
            KernelKind::Syscall { ret, .. } if !(-1_000_000..1_000_000).contains(&ret) => {
                format!("{ret:#x}")
            }
            KernelKind::Syscall { ret, .. } => ret.to_string(),
            KernelKind::OffCpu { .. } => String::new(),
        }
    }

    /// True for a syscall.
    pub fn is_syscall(&self) -> bool {
        matches!(self.kind, KernelKind::Syscall { .. })
    }
}

/// One thread's kernel events file, as listed in `info.json`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelThreadInfo {
    /// Thread id.
    pub tid: u32,
    /// Its process id.
    pub pid: u32,
    /// File name (`kernel-TID.hpk`).
    pub file: String,
    /// Syscalls.
    pub syscalls: u64,
    /// Off-CPU intervals.
    pub off_cpu: u64,
    /// File size.
    pub bytes: u64,
}

/// `info.json`'s `kernel`: what the host kernel's events gave.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelInfo {
    /// Records read from the kernel (syscall enters and exits, switches).
    pub taken: u64,
    /// Records the kernel lost (its ring was full).
    pub lost: u64,
    /// Records that did not pair (an exit without its enter: a call
    /// begun before recording, or an enter lost), and calls still open at
    /// the end (`exit_group`, or the end of the recording).
    pub unpaired: u64,
    /// Ring reads that could not be parsed whole.
    #[serde(default)]
    pub corrupt: u64,
    /// The threads' files, by tid.
    pub threads: Vec<KernelThreadInfo>,
}

impl KernelInfo {
    /// Syscalls of all threads.
    pub fn syscalls(&self) -> u64 {
        self.threads.iter().map(|t| t.syscalls).sum()
    }

    /// Off-CPU intervals of all threads.
    pub fn off_cpu(&self) -> u64 {
        self.threads.iter().map(|t| t.off_cpu).sum()
    }
}

/// Encodes a thread's events (times in ticks), sorted by start.
pub(crate) fn encode(tid: u32, pid: u32, events: &mut [KernelEvent]) -> Vec<u8> {
    events.sort_by_key(|e| (e.start, e.end));
    let mut b = Vec::with_capacity(HEADER_LEN + events.len() * 8);
    b.extend_from_slice(MAGIC);
    b.extend_from_slice(&FILE_VERSION.to_le_bytes());
    b.extend_from_slice(&0u16.to_le_bytes());
    b.extend_from_slice(&tid.to_le_bytes());
    b.extend_from_slice(&pid.to_le_bytes());
    b.extend_from_slice(&(events.len() as u64).to_le_bytes());
    let mut prev = 0;
    for e in events.iter() {
        let tag = match e.kind {
            KernelKind::Syscall { .. } => 0,
            KernelKind::OffCpu { preempted: false } => 1,
            KernelKind::OffCpu { preempted: true } => 2,
        };
        b.push(tag);
        put_uvarint(&mut b, e.start - prev);
        put_uvarint(&mut b, e.end.saturating_sub(e.start));
        if let KernelKind::Syscall { nr, ret } = e.kind {
            put_uvarint(&mut b, u64::from(nr));
            put_uvarint(&mut b, zigzag(ret));
        }
        prev = e.start;
    }
    b
}

/// Decodes a kernel events file of thread `tid` (untrusted bytes: an
/// error naming the file and offset, never a panic); times converted to
/// ns through `time`.
pub fn decode(bytes: &[u8], path: &Path, tid: u32, time: &TimeBase) -> Result<Vec<KernelEvent>> {
    let corrupt = |offset: usize, what: &str| TraceError::Corrupt {
        path: path.to_path_buf(),
        offset: offset as u64,
        what: what.to_string(),
    };
    let truncated = |offset: usize, what: &str| TraceError::Truncated {
        path: path.to_path_buf(),
        offset: offset as u64,
        what: what.to_string(),
    };
    if bytes.len() < HEADER_LEN {
        return Err(truncated(bytes.len(), "header"));
    }
    if &bytes[..4] != MAGIC {
        return Err(corrupt(0, "not a kernel events file (magic)"));
    }
    let word =
        |at: usize| u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]]);
    let version = u16::from_le_bytes([bytes[4], bytes[5]]);
    if version != FILE_VERSION {
        return Err(corrupt(
            4,
            &format!("version {version}, this reader knows {FILE_VERSION}"),
        ));
    }
    if word(8) != tid {
        return Err(corrupt(8, &format!("holds thread {}, not {tid}", word(8))));
    }
    let count = u64::from(word(16)) | (u64::from(word(20)) << 32);
    // Each record takes 3 bytes at least.
    if count > (bytes.len() / 3) as u64 {
        return Err(corrupt(
            16,
            &format!("{count} records cannot fit in the file"),
        ));
    }
    let mut off = HEADER_LEN;
    let next = |off: &mut usize, what: &str| -> Result<u64> {
        let (v, n) = get_uvarint(&bytes[*off..]).map_err(|_| truncated(*off, what))?;
        *off += n;
        Ok(v)
    };
    let mut events = Vec::with_capacity(count as usize);
    let mut start = 0u64;
    for _ in 0..count {
        let at = off;
        let tag = *bytes.get(off).ok_or_else(|| truncated(off, "record tag"))?;
        off += 1;
        start = start
            .checked_add(next(&mut off, "start")?)
            .ok_or_else(|| corrupt(at, "start past the end of time"))?;
        let end = start
            .checked_add(next(&mut off, "duration")?)
            .ok_or_else(|| corrupt(at, "end past the end of time"))?;
        let kind = match tag {
            0 => {
                let nr = next(&mut off, "syscall number")?;
                let nr = u32::try_from(nr).map_err(|_| corrupt(at, "syscall number"))?;
                KernelKind::Syscall {
                    nr,
                    ret: unzigzag(next(&mut off, "return value")?),
                }
            }
            1 | 2 => KernelKind::OffCpu {
                preempted: tag == 2,
            },
            t => return Err(corrupt(at, &format!("unknown record tag {t}"))),
        };
        let (s, e) = (time.to_ns(start), time.to_ns(end));
        events.push(KernelEvent {
            start: s,
            end: e.max(s),
            kind,
        });
    }
    if off != bytes.len() {
        return Err(corrupt(off, "bytes after the last record"));
    }
    Ok(events)
}

/// A thread's kernel events for the analyses: syscalls and off-CPU
/// intervals apart, each by start.
#[derive(Clone, Debug, Default)]
pub struct ThreadKernel {
    /// Syscalls by start.
    pub syscalls: Vec<KernelEvent>,
    /// Off-CPU intervals by start.
    pub off_cpu: Vec<KernelEvent>,
}

impl ThreadKernel {
    /// Splits a thread's events.
    pub fn new(events: Vec<KernelEvent>) -> ThreadKernel {
        let (syscalls, off_cpu) = events.into_iter().partition(KernelEvent::is_syscall);
        ThreadKernel { syscalls, off_cpu }
    }

    /// Time of `list` inside [start, end] (the intervals of one kind do
    /// not overlap: a thread is in one syscall, off the CPU once, at a time).
    pub fn overlap(list: &[KernelEvent], start: u64, end: u64) -> u64 {
        // Intervals by start: those starting before `end`, from the
        // first whose end is past `start` (ends are ordered as starts are).
        let first = list.partition_point(|e| e.end <= start);
        list[first..]
            .iter()
            .take_while(|e| e.start < end)
            .map(|e| e.end.min(end).saturating_sub(e.start.max(start)))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_a_tsc_time_base_and_refuses_damage() {
        let tb = TimeBase::Tsc {
            tsc0: 1_000,
            ns0: 5_000_000,
            tsc1: 3_001_000,
            ns1: 6_000_000,
        };
        let ns = [
            (
                5_100_000u64,
                5_300_000u64,
                KernelKind::Syscall { nr: 0, ret: 5 },
            ),
            (
                5_120_000,
                5_290_000,
                KernelKind::OffCpu { preempted: false },
            ),
            (
                5_400_000,
                5_400_900,
                KernelKind::Syscall { nr: 1, ret: -11 },
            ),
        ];
        let mut ev: Vec<KernelEvent> = ns
            .iter()
            .map(|&(s, e, kind)| KernelEvent {
                start: tb.ticks_at_ns(s),
                end: tb.ticks_at_ns(e),
                kind,
            })
            .collect();
        let bytes = encode(7, 6, &mut ev);
        let p = Path::new("kernel-7.hpk");
        let back = decode(&bytes, p, 7, &tb).unwrap();
        for (b, &(s, e, kind)) in back.iter().zip(&ns) {
            assert!(b.start.abs_diff(s) <= 1 && b.end.abs_diff(e) <= 1, "{b:?}");
            assert_eq!(b.kind, kind);
        }
        assert_eq!(back[2].ret_text(), "-1 EAGAIN");
        assert_eq!(back[0].name(), "read");
        assert!(decode(&bytes, p, 8, &tb).is_err());
        for cut in 0..bytes.len() {
            assert!(decode(&bytes[..cut], p, 7, &tb).is_err(), "cut at {cut}");
        }
        let split = ThreadKernel::new(back);
        assert_eq!(split.syscalls.len(), 2);
        assert_eq!(
            ThreadKernel::overlap(&split.off_cpu, 5_000_000, 5_200_000),
            80_000
        );
    }
}
