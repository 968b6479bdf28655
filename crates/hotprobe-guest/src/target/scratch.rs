//! Scratch areas in kernel text: found, proven unused, claimed, listed and restored.

use super::*;

impl GuestTarget {
    /// Finds unused executable bytes in kernel text for out-of-line slots:
    /// first the fill between `_etext` and the end of its page (the page is
    /// proven mapped and executable by a page-table walk, the bytes proven to
    /// be 0x00/0xcc fill), then runs of int3 padding between functions.
    pub(super) fn find_scratch(&mut self, near: u64, len: u64) -> Result<ScratchArea, String> {
        let Some((stext, etext)) = self.config.kernel_text else {
            return Err(
                "the kernel text bounds are unknown (give _stext/_etext from kallsyms)".into(),
            );
        };
        if len == 0 || len > 4096 {
            return Err(format!(
                "{len} bytes asked; at most 4096 can be found in text padding"
            ));
        }
        let within = |a: u64| a.abs_diff(near) < (1u64 << 31) - 4096;
        let mut reasons = Vec::new();
        // 1. the tail of the last text page
        let end = (etext + 4095) & !4095;
        let taken = |s: &Self, a: u64, l: u64| {
            s.scratch
                .iter()
                .any(|x| a < x.start + x.len && x.start < a + l)
        };
        if end > etext && within(etext) {
            match self.prove_unused(etext, end - etext) {
                Ok(()) => {
                    let start = (etext + 15) & !15;
                    if end - start >= len && !taken(self, start, end - start) {
                        return self.claim(
                            start,
                            end - start,
                            format!("fill after _etext ({etext:#x}..{end:#x})"),
                        );
                    }
                    reasons.push(format!(
                        "fill after _etext: {} bytes only or taken",
                        end - start
                    ));
                }
                Err(why) => reasons.push(format!("fill after _etext: {why}")),
            }
        }
        // 2. int3 padding between functions, scanned around `near`
        let win = 256 * 1024;
        let lo = near.saturating_sub(win).max(stext);
        let hi = (near + win).min(etext);
        let mut at = lo;
        let mut run_start = None;
        while at < hi {
            let n = (hi - at).min(16384) as usize;
            let mut buf = vec![0u8; n];
            if let Err(e) = self.read_memory(RuntimeAddr(at), &mut buf) {
                reasons.push(format!("scanning text at {at:#x}: {e}"));
                break;
            }
            for (i, b) in buf.iter().enumerate() {
                let a = at + i as u64;
                if *b == 0xcc {
                    let s = *run_start.get_or_insert(a);
                    // keep one int3 before and after the slot
                    let slot = (s + 1 + 15) & !15;
                    if a >= slot + len && !taken(self, slot, len) && within(slot) {
                        if let Ok(()) = self.prove_unused(slot, len) {
                            return self.claim(slot, len, format!("int3 padding at {s:#x}"));
                        }
                    }
                } else {
                    run_start = None;
                }
            }
            at += n as u64;
        }
        reasons.push(format!(
            "no run of {} int3 bytes within {lo:#x}..{hi:#x}",
            len + 2
        ));
        Err(reasons.join("; "))
    }

    pub(super) fn prove_unused(&mut self, start: u64, len: u64) -> Result<(), String> {
        let mut page = start & !4095;
        while page < start + len {
            let t = self.translate(GuestVirt(page)).map_err(|e| e.to_string())?;
            if !t.executable {
                return Err(format!("page {page:#x} is not executable"));
            }
            page += 4096;
        }
        let mut buf = vec![0u8; len as usize];
        self.read_memory(RuntimeAddr(start), &mut buf)
            .map_err(|e| e.to_string())?;
        if let Some(i) = buf.iter().position(|b| *b != 0xcc && *b != 0) {
            return Err(format!(
                "byte {:#x} at {:#x} is not fill",
                buf[i],
                start + i as u64
            ));
        }
        Ok(())
    }

    pub(super) fn claim(
        &mut self,
        start: u64,
        len: u64,
        how: String,
    ) -> Result<ScratchArea, String> {
        let mut original = vec![0u8; len as usize];
        self.read_memory(RuntimeAddr(start), &mut original)
            .map_err(|e| e.to_string())?;
        Ok(ScratchArea {
            start,
            len,
            used: 0,
            dirty: false,
            original,
            how,
        })
    }

    /// Where the scratch areas lie and how each was found.
    pub fn scratch_areas(&self) -> Vec<(ScratchRegion, String)> {
        self.scratch
            .iter()
            .map(|a| {
                (
                    ScratchRegion {
                        start: RuntimeAddr(a.start),
                        len: a.len,
                    },
                    a.how.clone(),
                )
            })
            .collect()
    }

    pub(super) fn restore_scratch(&mut self) -> Result<(), TargetError> {
        let areas = std::mem::take(&mut self.scratch);
        for a in &areas {
            if a.dirty {
                self.client
                    .write_memory(a.start, &a.original)
                    .map_err(|e| self.fail(e))?;
            }
        }
        Ok(())
    }
}
