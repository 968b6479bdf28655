//! The target's `int3`s whose byte is gone (issue 22): a program that
//! maps its text again from the file, or drops its pages with
//! `MADV_DONTNEED`, gets the file's byte back under a breakpoint, and the
//! probe there silently counts nothing from then on. The target knows
//! which `int3`s it holds; [`ProcessTarget::rearm_reverted_breakpoints`]
//! reads their bytes as they are (not through `read_memory`, which shows
//! the original ones) and writes the `int3` again where the byte is the
//! original one again.

use std::os::unix::fs::FileExt;

use crate::{ProcessTarget, INT3};

/// Bytes read at once around the breakpoints.
const WINDOW: u64 = 16 << 10;

/// What [`ProcessTarget::rearm_reverted_breakpoints`] found among the
/// engine's breakpoints (the target's own — the loader's rendezvous, the
/// signal-state sites — are armed again without being listed).
#[derive(Debug, Default, PartialEq, Eq)]
pub struct RevertedBreakpoints {
    /// Held the original byte again: the `int3` is written again.
    pub rearmed: Vec<u64>,
    /// Held the original byte again, and the `int3` could not be written.
    pub lost: Vec<u64>,
}

impl ProcessTarget {
    /// Finds every `int3` of this target whose byte is the original one
    /// again and writes it again (see the module docs). A byte that is
    /// neither (another tool's write) is left alone: the check for
    /// foreign writes names it at detach. Nothing while the process runs
    /// untraced (it has no `int3` of ours then but the rendezvous').
    pub fn rearm_reverted_breakpoints(&mut self) -> RevertedBreakpoints {
        let mut out = RevertedBreakpoints::default();
        if self.released.is_some() || !self.attached {
            return out;
        }
        let mut addrs: Vec<(u64, u8)> = self.breakpoints.iter().map(|(a, o)| (*a, *o)).collect();
        addrs.sort_unstable();
        let rendezvous = self.rendezvous_breakpoint().map(|a| a.0);
        let mut window: (u64, Vec<u8>) = (0, Vec::new());
        for (addr, orig) in addrs {
            let inside = addr >= window.0 && addr < window.0 + window.1.len() as u64;
            if !inside {
                window = (addr, vec![0u8; WINDOW as usize]);
                match self.mem.read_at(&mut window.1, addr) {
                    Ok(n) if n > 0 => window.1.truncate(n),
                    _ => {
                        window.1.clear();
                        continue;
                    }
                }
            }
            let now = window.1[(addr - window.0) as usize];
            if now == INT3 || now != orig {
                continue;
            }
            let written = matches!(self.mem.write_at(&[INT3], addr), Ok(1));
            if Some(addr) == rendezvous || self.is_sig_site(addr) {
                continue;
            }
            if written {
                out.rearmed.push(addr);
            } else {
                out.lost.push(addr);
            }
        }
        out
    }
}
