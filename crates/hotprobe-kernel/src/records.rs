//! The records of a perf ring, parsed by hand (no crate parses the ring's
//! byte layout for a given `sample_type`; perf-event-open-sys gives only
//! the constants).
//!
//! The ring's content is untrusted input (a kernel of another version, a
//! corrupt ring): every read is bounds-checked and a record that does not
//! fit is an error, never a panic (fuzzed: `tests/fuzz.rs`).
//!
//! The events are opened with `sample_type` = IDENTIFIER | TID | TIME |
//! RAW and `sample_id_all`, so that
//! * a sample (`PERF_RECORD_SAMPLE`) is: header, identifier (u64), pid and
//!   tid (u32 each), time (u64), the raw size (u32) and the tracepoint's
//!   raw bytes;
//! * every other record ends with the `sample_id` block: pid, tid, time,
//!   identifier (24 bytes).

use perf_event_open_sys::bindings as sys;

/// The sample fields the events are opened with (see the module doc).
pub const SAMPLE_TYPE: u64 = (sys::PERF_SAMPLE_IDENTIFIER
    | sys::PERF_SAMPLE_TID
    | sys::PERF_SAMPLE_TIME
    | sys::PERF_SAMPLE_RAW) as u64;

/// Size of the `sample_id` block that ends each non-sample record.
const SAMPLE_ID_LEN: usize = 24;
/// Size of a record header (type u32, misc u16, size u16).
const HEADER_LEN: usize = 8;

/// Where the fields of the two `raw_syscalls` tracepoints are in their raw
/// bytes (from tracefs `events/raw_syscalls/*/format`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawLayout {
    /// Tracepoint id of `raw_syscalls:sys_enter` (its `common_type`).
    pub enter_type: u16,
    /// Tracepoint id of `raw_syscalls:sys_exit`.
    pub exit_type: u16,
    /// Offset of `common_type` (u16).
    pub common_type: usize,
    /// Offset of `id` (the syscall number, i64) in both.
    pub nr: usize,
    /// Offset of `ret` (i64) in `sys_exit`.
    pub ret: usize,
}

impl RawLayout {
    /// The layout of Linux 4.x–6.x on x86-64 (`common_type` at 0, `id` at
    /// 8, `ret` at 16) with these tracepoint ids.
    pub fn standard(enter_type: u16, exit_type: u16) -> RawLayout {
        RawLayout {
            enter_type,
            exit_type,
            common_type: 0,
            nr: 8,
            ret: 16,
        }
    }
}

/// Who and when, common to every record kept.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// Process id.
    pub pid: u32,
    /// Thread id.
    pub tid: u32,
    /// CLOCK_MONOTONIC ns (the events use `use_clockid`).
    pub time: u64,
}

/// One record of the ring that matters here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelRecord {
    /// `raw_syscalls:sys_enter`.
    Enter {
        /// Thread and time.
        at: Stamp,
        /// Syscall number.
        nr: i64,
    },
    /// `raw_syscalls:sys_exit`.
    Exit {
        /// Thread and time.
        at: Stamp,
        /// Syscall number.
        nr: i64,
        /// Return value (negative errno on failure).
        ret: i64,
    },
    /// The thread left the CPU (`PERF_RECORD_SWITCH` with SWITCH_OUT).
    SwitchOut {
        /// Thread and time.
        at: Stamp,
        /// Preempted (still runnable) rather than blocked.
        preempted: bool,
    },
    /// The thread came back on a CPU.
    SwitchIn {
        /// Thread and time.
        at: Stamp,
    },
    /// The kernel lost `count` records (full ring).
    Lost {
        /// Records lost.
        count: u64,
    },
}

/// Why a ring's bytes could not be parsed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// A record's size is below its header or past the bytes left.
    #[error("record at byte {offset}: size {size} with {left} bytes left")]
    BadSize {
        /// Offset of the record.
        offset: usize,
        /// Its stated size.
        size: usize,
        /// Bytes left from it.
        left: usize,
    },
    /// A record too short for the fields its type holds.
    #[error("record at byte {offset} (type {kind}): {size} bytes, too short for its fields")]
    Short {
        /// Offset of the record.
        offset: usize,
        /// Record type.
        kind: u32,
        /// Its size.
        size: usize,
    },
}

/// What [`parse_records`] counted besides the records it handed on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParseCounts {
    /// Records handed on.
    pub kept: u64,
    /// Samples of another tracepoint or records of another type, skipped.
    pub skipped: u64,
}

fn u16_at(b: &[u8], off: usize) -> Option<u16> {
    Some(u16::from_le_bytes(
        b.get(off..off.checked_add(2)?)?.try_into().ok()?,
    ))
}

fn u32_at(b: &[u8], off: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(off..off.checked_add(4)?)?.try_into().ok()?,
    ))
}

fn u64_at(b: &[u8], off: usize) -> Option<u64> {
    Some(u64::from_le_bytes(
        b.get(off..off.checked_add(8)?)?.try_into().ok()?,
    ))
}

/// Parses the records in `buf` (whole records, as copied out of the ring)
/// and hands each one that matters to `out`. Stops at the first record
/// that does not fit (an error: what came before it was handed on).
pub fn parse_records(
    buf: &[u8],
    layout: &RawLayout,
    out: &mut dyn FnMut(KernelRecord),
) -> Result<ParseCounts, RecordError> {
    let mut counts = ParseCounts::default();
    let mut off = 0;
    while off < buf.len() {
        let left = buf.len() - off;
        let (kind, misc, size) =
            match (u32_at(buf, off), u16_at(buf, off + 4), u16_at(buf, off + 6)) {
                (Some(k), Some(m), Some(s)) => (k, m, s as usize),
                _ => {
                    return Err(RecordError::BadSize {
                        offset: off,
                        size: 0,
                        left,
                    })
                }
            };
        if size < HEADER_LEN || size > left {
            return Err(RecordError::BadSize {
                offset: off,
                size,
                left,
            });
        }
        let rec = &buf[off..off + size];
        let short = || RecordError::Short {
            offset: off,
            kind,
            size,
        };
        let parsed = match kind {
            sys::PERF_RECORD_SAMPLE => parse_sample(rec, layout).ok_or_else(short)?,
            sys::PERF_RECORD_SWITCH => {
                let at = sample_id(rec).ok_or_else(short)?;
                let misc = u32::from(misc);
                Some(if misc & sys::PERF_RECORD_MISC_SWITCH_OUT != 0 {
                    KernelRecord::SwitchOut {
                        at,
                        preempted: misc & sys::PERF_RECORD_MISC_SWITCH_OUT_PREEMPT != 0,
                    }
                } else {
                    KernelRecord::SwitchIn { at }
                })
            }
            sys::PERF_RECORD_LOST => Some(KernelRecord::Lost {
                count: u64_at(rec, HEADER_LEN + 8).ok_or_else(short)?,
            }),
            _ => None,
        };
        match parsed {
            Some(r) => {
                counts.kept += 1;
                out(r);
            }
            None => counts.skipped += 1,
        }
        off += size;
    }
    Ok(counts)
}

/// The `sample_id` block at the end of a non-sample record.
fn sample_id(rec: &[u8]) -> Option<Stamp> {
    let at = rec.len().checked_sub(SAMPLE_ID_LEN)?;
    if at < HEADER_LEN {
        return None;
    }
    Some(Stamp {
        pid: u32_at(rec, at)?,
        tid: u32_at(rec, at + 4)?,
        time: u64_at(rec, at + 8)?,
    })
}

/// A sample: `None` inside when it is of another tracepoint; `None`
/// outside when it is too short for its fields.
fn parse_sample(rec: &[u8], layout: &RawLayout) -> Option<Option<KernelRecord>> {
    // header, identifier, pid/tid, time, raw size, raw.
    let at = Stamp {
        pid: u32_at(rec, 16)?,
        tid: u32_at(rec, 20)?,
        time: u64_at(rec, 24)?,
    };
    let raw_len = u32_at(rec, 32)? as usize;
    let raw = rec.get(36..36usize.checked_add(raw_len)?)?;
    let ty = u16_at(raw, layout.common_type)?;
    let nr = u64_at(raw, layout.nr).map(|v| v as i64);
    Some(if ty == layout.enter_type {
        Some(KernelRecord::Enter { at, nr: nr? })
    } else if ty == layout.exit_type {
        Some(KernelRecord::Exit {
            at,
            nr: nr?,
            ret: u64_at(raw, layout.ret)? as i64,
        })
    } else {
        None
    })
}

/// Encodes records as the kernel writes them (for the tests and the fuzz
/// seeds): the inverse of [`parse_records`] for what it keeps.
pub fn encode_record(r: &KernelRecord, layout: &RawLayout) -> Vec<u8> {
    let mut b = Vec::new();
    let header = |b: &mut Vec<u8>, kind: u32, misc: u16| {
        b.extend_from_slice(&kind.to_le_bytes());
        b.extend_from_slice(&misc.to_le_bytes());
        b.extend_from_slice(&0u16.to_le_bytes());
    };
    let id_block = |b: &mut Vec<u8>, at: &Stamp| {
        b.extend_from_slice(&at.pid.to_le_bytes());
        b.extend_from_slice(&at.tid.to_le_bytes());
        b.extend_from_slice(&at.time.to_le_bytes());
        b.extend_from_slice(&7u64.to_le_bytes());
    };
    match r {
        KernelRecord::Enter { at, nr } | KernelRecord::Exit { at, nr, .. } => {
            let (ty, ret, len) = match r {
                KernelRecord::Exit { ret, .. } => (layout.exit_type, *ret, layout.ret + 8),
                _ => (layout.enter_type, 0, layout.nr + 56),
            };
            header(&mut b, sys::PERF_RECORD_SAMPLE, 0);
            b.extend_from_slice(&7u64.to_le_bytes());
            b.extend_from_slice(&at.pid.to_le_bytes());
            b.extend_from_slice(&at.tid.to_le_bytes());
            b.extend_from_slice(&at.time.to_le_bytes());
            let mut raw = vec![0u8; len.max(layout.nr + 8).max(layout.common_type + 2)];
            raw[layout.common_type..layout.common_type + 2].copy_from_slice(&ty.to_le_bytes());
            raw[layout.nr..layout.nr + 8].copy_from_slice(&nr.to_le_bytes());
            if matches!(r, KernelRecord::Exit { .. }) {
                raw[layout.ret..layout.ret + 8].copy_from_slice(&ret.to_le_bytes());
            }
            // The kernel pads the raw part so that the record is 8-aligned.
            let pad = (8 - (36 + raw.len()) % 8) % 8;
            raw.resize(raw.len() + pad, 0);
            b.extend_from_slice(&(raw.len() as u32).to_le_bytes());
            b.extend_from_slice(&raw);
        }
        KernelRecord::SwitchOut { at, preempted } => {
            let mut misc = sys::PERF_RECORD_MISC_SWITCH_OUT;
            if *preempted {
                misc |= sys::PERF_RECORD_MISC_SWITCH_OUT_PREEMPT;
            }
            header(&mut b, sys::PERF_RECORD_SWITCH, misc as u16);
            id_block(&mut b, at);
        }
        KernelRecord::SwitchIn { at } => {
            header(&mut b, sys::PERF_RECORD_SWITCH, 0);
            id_block(&mut b, at);
        }
        KernelRecord::Lost { count } => {
            header(&mut b, sys::PERF_RECORD_LOST, 0);
            b.extend_from_slice(&7u64.to_le_bytes());
            b.extend_from_slice(&count.to_le_bytes());
            id_block(
                &mut b,
                &Stamp {
                    pid: 0,
                    tid: 0,
                    time: 0,
                },
            );
        }
    }
    let len = b.len() as u16;
    b[6..8].copy_from_slice(&len.to_le_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(tid: u32, time: u64) -> Stamp {
        Stamp {
            pid: 100,
            tid,
            time,
        }
    }

    #[test]
    fn every_kind_round_trips_and_a_cut_record_is_an_error() {
        let l = RawLayout::standard(443, 442);
        let recs = [
            KernelRecord::Enter {
                at: at(101, 5),
                nr: 0,
            },
            KernelRecord::SwitchOut {
                at: at(101, 6),
                preempted: false,
            },
            KernelRecord::SwitchIn { at: at(101, 9) },
            KernelRecord::Exit {
                at: at(101, 10),
                nr: 0,
                ret: -11,
            },
            KernelRecord::Lost { count: 3 },
        ];
        let mut buf = Vec::new();
        for r in &recs {
            let e = encode_record(r, &l);
            assert_eq!(e.len() % 8, 0, "{r:?}");
            buf.extend(e);
        }
        let mut got = Vec::new();
        let counts = parse_records(&buf, &l, &mut |r| got.push(r)).unwrap();
        assert_eq!(got, recs);
        assert_eq!(counts.kept, 5);
        // Another tracepoint's sample is skipped, not misread.
        let other = encode_record(
            &KernelRecord::Enter {
                at: at(1, 1),
                nr: 1,
            },
            &RawLayout::standard(7, 8),
        );
        let counts = parse_records(&other, &l, &mut |_| panic!("kept")).unwrap();
        assert_eq!(counts.skipped, 1);
        // Cut in the middle of the last record: the ones before it are kept.
        got.clear();
        let err = parse_records(&buf[..buf.len() - 4], &l, &mut |r| got.push(r)).unwrap_err();
        assert!(matches!(err, RecordError::BadSize { .. }), "{err}");
        assert_eq!(got.len(), 4);
    }
}
