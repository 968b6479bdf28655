//! Hardware watchpoints (x86 data breakpoints): DR0–DR3 hold the watched
//! addresses, DR7 enables them with their access kind and length, DR6 says
//! which fired. Linux keeps them per thread and lets a tracer write them
//! with `PTRACE_POKEUSER` at `offsetof(struct user, u_debugreg)`; a new
//! thread starts with none, so the target sets them on every thread it
//! follows, those created later included.

use crate::os::Sys;
use crate::sys::SysError;

/// How many watchpoints the CPU has (DR0–DR3).
pub const WATCH_SLOTS: usize = 4;

/// Which accesses a watchpoint traps on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WatchKind {
    /// Writes (DR7 R/W = 01).
    Write,
    /// Reads and writes (DR7 R/W = 11; the CPU has no read-only kind).
    ReadWrite,
    /// Executing the instruction at the address (DR7 R/W = 00, length 1):
    /// the trap comes *before* it runs (the kernel sets RF so that it
    /// runs once the thread resumes).
    Execute,
}

impl std::fmt::Display for WatchKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WatchKind::Write => "write",
            WatchKind::ReadWrite => "read/write",
            WatchKind::Execute => "execute",
        })
    }
}

/// One hardware watchpoint: `len` bytes (1, 2, 4 or 8, aligned) at `addr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HwWatch {
    /// First byte watched (a multiple of `len`).
    pub addr: u64,
    /// 1, 2, 4 or 8.
    pub len: u8,
    /// Which accesses trap.
    pub kind: WatchKind,
}

impl HwWatch {
    /// `Err(reason)` unless the CPU can watch this: a length of 1, 2, 4 or
    /// 8 and an address aligned to it, in user space.
    pub fn check(&self) -> Result<(), String> {
        if !matches!(self.len, 1 | 2 | 4 | 8) {
            return Err(format!(
                "a watchpoint covers 1, 2, 4 or 8 bytes, not {}",
                self.len
            ));
        }
        if self.kind == WatchKind::Execute && self.len != 1 {
            return Err(format!(
                "an execute watchpoint covers 1 byte (the instruction's first), not {}",
                self.len
            ));
        }
        if self.addr & (self.len as u64 - 1) != 0 {
            return Err(format!(
                "{:#x} is not aligned to {} bytes (the debug registers need an aligned address)",
                self.addr, self.len
            ));
        }
        if self.addr >= 0x0000_8000_0000_0000 {
            return Err(format!("{:#x} is not a user-space address", self.addr));
        }
        Ok(())
    }

    /// This watchpoint's bits in DR7 for slot `i`: local enable, R/W, LEN.
    fn dr7_bits(&self, i: usize) -> u64 {
        let rw: u64 = match self.kind {
            WatchKind::Write => 0b01,
            WatchKind::ReadWrite => 0b11,
            WatchKind::Execute => 0b00,
        };
        let len: u64 = match self.len {
            1 => 0b00,
            2 => 0b01,
            8 => 0b10,
            _ => 0b11,
        };
        (1 << (2 * i)) | (rw << (16 + 4 * i)) | (len << (18 + 4 * i))
    }
}

/// DR7 for these slots.
pub fn dr7(slots: &[Option<HwWatch>; WATCH_SLOTS]) -> u64 {
    slots
        .iter()
        .enumerate()
        .filter_map(|(i, w)| w.map(|w| w.dr7_bits(i)))
        .fold(0, |a, b| a | b)
}

/// Write `slots` into a stopped thread's debug registers: DR7 off first
/// (no half-written watchpoint is ever enabled), the addresses, then DR7.
pub(crate) fn apply(
    sys: &Sys,
    tid: i32,
    slots: &[Option<HwWatch>; WATCH_SLOTS],
) -> Result<(), SysError> {
    sys.set_debugreg(tid, 7, 0)?;
    for (i, w) in slots.iter().enumerate() {
        sys.set_debugreg(tid, i, w.map_or(0, |w| w.addr))?;
    }
    let v = dr7(slots);
    if v != 0 {
        sys.set_debugreg(tid, 7, v)?;
    }
    Ok(())
}

/// Which slots fired (DR6 B0–B3) on a stopped thread, clearing DR6 so
/// that a later trap (an `int3`, a step) does not read them again.
pub(crate) fn take_hits(sys: &Sys, tid: i32) -> Result<u8, SysError> {
    let dr6 = sys.get_debugreg(tid, 6)?;
    let hits = (dr6 & 0xf) as u8;
    if hits != 0 {
        sys.set_debugreg(tid, 6, 0)?;
    }
    Ok(hits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dr7_encodes_kind_and_length_per_slot() {
        let mut s = [None; WATCH_SLOTS];
        s[0] = Some(HwWatch {
            addr: 0x1000,
            len: 4,
            kind: WatchKind::Write,
        });
        // L0, R/W0 = 01, LEN0 = 11.
        assert_eq!(dr7(&s), 0b1 | (0b01 << 16) | (0b11 << 18));
        s[2] = Some(HwWatch {
            addr: 0x2000,
            len: 8,
            kind: WatchKind::ReadWrite,
        });
        assert_eq!(
            dr7(&s),
            0b1 | (0b01 << 16) | (0b11 << 18) | (1 << 4) | (0b11 << 24) | (0b10 << 26)
        );
    }

    #[test]
    fn check_refuses_bad_lengths_and_misalignment() {
        let w = |addr, len| HwWatch {
            addr,
            len,
            kind: WatchKind::Write,
        };
        assert!(w(0x1000, 8).check().is_ok());
        assert!(w(0x1001, 1).check().is_ok());
        assert!(w(0x1002, 4).check().unwrap_err().contains("aligned"));
        assert!(w(0x1000, 3).check().unwrap_err().contains("1, 2, 4 or 8"));
        assert!(w(0xffff_8000_0000_0000, 8).check().is_err());
    }
}
