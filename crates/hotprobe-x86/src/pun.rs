//! Instruction punning (E9Patch's idea, Duck et al., PLDI 2020) for a
//! function shorter than a jump with no padding after it to overwrite.
//!
//! The function owns `owned` bytes (its body and any `nop`/`int3` padding
//! after it, 1 to 4). A `jmp rel32`, optionally after `k` redundant `cs`
//! segment prefixes (`2e`, ignored by a near jump in 64-bit mode), is
//! written over them; the bytes of the instruction that lie past the owned
//! ones are the next function's and keep their values. So the high bytes of
//! the displacement are *fixed*, the low ones *free*: the jump can only
//! reach one window of `2^(8 × free)` bytes, and the trampoline must be
//! placed there. With `k` prefixes one more byte is fixed per prefix and
//! the window is a different one: 1 fixed byte gives a 16 MiB window,
//! 2 a 64 KiB one, 3 a 256-byte one and 4 (a 1-byte function) one address.
//!
//! The whole function is displaced: it runs relocated in the trampoline
//! (its `ret` or `jmp` leaves from there), as for a short function before
//! padding ([`crate::plan_jump_padded`]).

use iced_x86::Instruction;

use crate::jump::{short_body, JumpError, JumpPlan};
use crate::JMP_REL32_LEN;

/// The redundant prefix placed before the `e9` to shift the displacement.
pub const PUN_PREFIX: u8 = 0x2e;

/// A short function that can take a punned jump (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PunPlan {
    /// Address of the function (the site).
    pub site: u64,
    /// Bytes the jump may overwrite: the function and its padding (< 5).
    pub owned: usize,
    /// The bytes at `site` from the function's start through the end of
    /// the longest encoding (`owned + 3` bytes at most, 8 at the most): the
    /// owned bytes and then the next function's, which stay.
    pub code: Vec<u8>,
    /// The function's instructions (run relocated in the trampoline).
    pub instructions: Vec<Instruction>,
}

/// One encoding of a punned jump and the addresses it can reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PunWindow {
    /// Redundant prefixes before the `e9`.
    pub prefixes: usize,
    /// Displacement bytes that are the next function's (1 to 4).
    pub fixed: usize,
    /// Lowest reachable target.
    pub start: u64,
    /// Number of reachable targets (`2^(8 × (4 - fixed))`), all
    /// consecutive from `start`.
    pub len: u64,
}

impl PunPlan {
    /// Plans a punned jump over a function of `body_len` bytes at
    /// `func_start`: `code` holds its bytes, then its padding (`owned -
    /// body_len` bytes, `nop`/`int3`), then at least the bytes up to
    /// `func_start + 4 + owned` (what follows, unchanged).
    pub fn new(
        code: &[u8],
        body_len: usize,
        owned: usize,
        func_start: u64,
    ) -> Result<PunPlan, JumpError> {
        let too_short = JumpError::FunctionTooShort {
            len: body_len as u64,
        };
        if body_len == 0 || owned < body_len || owned >= JMP_REL32_LEN {
            return Err(too_short);
        }
        let need = owned + JMP_REL32_LEN - 1;
        let (Some(body), Some(code)) = (code.get(..body_len), code.get(..need)) else {
            return Err(too_short);
        };
        let instructions = short_body(body, func_start)?;
        Ok(PunPlan {
            site: func_start,
            owned,
            code: code.to_vec(),
            instructions,
        })
    }

    /// The encodings, fewest fixed bytes (widest window) first.
    pub fn windows(&self) -> Vec<PunWindow> {
        (0..self.owned)
            .map(|k| {
                let free = self.owned - 1 - k;
                let fixed = 4 - free;
                // The displacement with its free bytes 0.
                let mut rel = [0u8; 4];
                rel[free..].copy_from_slice(&self.code[self.owned..self.owned + fixed]);
                let low = i32::from_le_bytes(rel) as i64 as u64;
                let next = self.site.wrapping_add((JMP_REL32_LEN + k) as u64);
                PunWindow {
                    prefixes: k,
                    fixed,
                    start: next.wrapping_add(low),
                    len: 1u64 << (8 * free),
                }
            })
            .collect()
    }

    /// The whole instruction (`prefixes` + `e9` + displacement, its bytes
    /// past the owned ones equal to those there now) jumping to `target`,
    /// or `None` if that encoding cannot reach it.
    pub fn patch_bytes(&self, prefixes: usize, target: u64) -> Option<Vec<u8>> {
        let w = self
            .windows()
            .into_iter()
            .find(|w| w.prefixes == prefixes)?;
        if target.wrapping_sub(w.start) >= w.len {
            return None;
        }
        let next = self.site.wrapping_add((JMP_REL32_LEN + prefixes) as u64);
        let rel = i32::try_from(target.wrapping_sub(next) as i64).ok()?;
        let mut v = vec![PUN_PREFIX; prefixes];
        v.push(0xe9);
        v.extend_from_slice(&rel.to_le_bytes());
        // The fixed bytes came out as they are (the window says so).
        debug_assert_eq!(v[self.owned..], self.code[self.owned..v.len()]);
        (v[self.owned..] == self.code[self.owned..v.len()]).then_some(v)
    }

    /// Where the jump `bytes` (from [`PunPlan::patch_bytes`]) lands once
    /// the first byte after the owned ones, the next function's first,
    /// holds `first` instead (a probe's `int3`, `jmp` or `call` there):
    /// the free bytes stay as written.
    pub fn target_if_next_starts_with(&self, bytes: &[u8], first: u8) -> Option<u64> {
        let prefixes = bytes.iter().take_while(|&&b| b == PUN_PREFIX).count();
        let mut b = bytes.get(prefixes + 1..prefixes + 5)?.to_vec();
        *b.get_mut(self.owned.checked_sub(prefixes + 1)?)? = first;
        let rel = i32::from_le_bytes(b.try_into().ok()?) as i64 as u64;
        Some(
            self.site
                .wrapping_add((JMP_REL32_LEN + prefixes) as u64)
                .wrapping_add(rel),
        )
    }

    /// The function relocated to run at `at` (as [`JumpPlan::relocate`]).
    pub fn relocate(&self, at: u64) -> Result<Vec<u8>, JumpError> {
        JumpPlan {
            site: self.site,
            covered: self.owned,
            original: self.code[..self.owned].to_vec(),
            instructions: self.instructions.clone(),
        }
        .relocate(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions, Mnemonic};

    #[test]
    fn a_4_byte_function_fixes_one_byte_then_two() {
        // lea eax, [rdi+1]; ret; then `push rbp; mov rbp, rsp ...`
        let code = [0x8d, 0x47, 0x01, 0xc3, 0x55, 0x48, 0x89, 0xe5];
        let site = 0x5555_5555_1000u64;
        let p = PunPlan::new(&code, 4, 4, site).unwrap();
        let w = p.windows();
        assert_eq!(w.len(), 4);
        assert_eq!((w[0].prefixes, w[0].fixed, w[0].len), (0, 1, 1 << 24));
        assert_eq!(w[0].start, site + 5 + 0x5500_0000);
        assert_eq!((w[1].prefixes, w[1].fixed, w[1].len), (1, 2, 1 << 16));
        assert_eq!(w[1].start, site + 6 + 0x4855_0000);
        assert_eq!((w[3].fixed, w[3].len), (4, 1));
        // Any target in the first window: the high byte stays 0x55.
        let t = w[0].start + 0x12_3456;
        let b = p.patch_bytes(0, t).unwrap();
        assert_eq!(b, [0xe9, 0x56, 0x34, 0x12, 0x55]);
        assert!(p.patch_bytes(0, w[0].start + w[0].len).is_none());
        assert!(p.patch_bytes(0, w[0].start - 1).is_none());
        let d = Decoder::with_ip(64, &b, site, DecoderOptions::NONE).decode();
        assert_eq!(d.near_branch_target(), t);
        // An int3 over the next function's first byte: the jump lands
        // 0x55 - 0xcc (sign-extended) times 16 MiB away.
        let mut under_int3 = b.clone();
        under_int3[4] = 0xcc;
        let d = Decoder::with_ip(64, &under_int3, site, DecoderOptions::NONE).decode();
        assert_eq!(
            p.target_if_next_starts_with(&b, 0xcc),
            Some(d.near_branch_target())
        );
        assert_eq!(
            d.near_branch_target(),
            t.wrapping_sub(0x5500_0000).wrapping_sub(0x3400_0000)
        );
        // One prefix: still a near jump, to the target.
        let t = w[1].start + 0x40;
        let b = p.patch_bytes(1, t).unwrap();
        assert_eq!(b[..2], [PUN_PREFIX, 0xe9]);
        assert_eq!(b[4..], [0x55, 0x48]);
        let d = Decoder::with_ip(64, &b, site, DecoderOptions::NONE).decode();
        assert_eq!((d.len(), d.near_branch_target()), (6, t));
        // The trampoline runs the function.
        let r = p.relocate(w[0].start).unwrap();
        let mut d = Decoder::with_ip(64, &r, w[0].start, DecoderOptions::NONE);
        assert_eq!(d.decode().mnemonic(), Mnemonic::Lea);
        assert_eq!(d.decode().mnemonic(), Mnemonic::Ret);
    }

    #[test]
    fn a_1_byte_function_has_one_target_a_negative_one_wraps_below() {
        // ret; then endbr64 (f3 0f 1e fa): displacement 0xfa1e0ff3 < 0.
        let code = [0xc3, 0xf3, 0x0f, 0x1e, 0xfa];
        let p = PunPlan::new(&code, 1, 1, 0x7f00_0000_0000).unwrap();
        let w = p.windows();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].len, 1);
        assert_eq!(
            w[0].start,
            (0x7f00_0000_0005u64 as i64 + 0xfa1e_0ff3u32 as i32 as i64) as u64
        );
        assert_eq!(
            p.patch_bytes(0, w[0].start).unwrap(),
            [0xe9, 0xf3, 0x0f, 0x1e, 0xfa]
        );
    }

    #[test]
    fn padding_owned_and_refusals() {
        // xor eax, eax; ret; int3 (padding, owned); then 0x41 ...
        let code = [0x31, 0xc0, 0xc3, 0xcc, 0x41, 0x57, 0x41, 0x56];
        let p = PunPlan::new(&code, 3, 4, 0x1000).unwrap();
        assert_eq!(p.windows()[0].len, 1 << 24);
        // A branch in the body, a function falling through, too little code.
        assert!(PunPlan::new(&[0x74, 0x00, 0xc3, 0x55, 0x55, 0x55, 0x55], 3, 3, 0x1000).is_err());
        assert!(PunPlan::new(&[0x31, 0xc0, 0x55, 0x55, 0x55, 0x55], 2, 2, 0x1000).is_err());
        assert!(PunPlan::new(&[0xc3, 0x55, 0x55], 1, 1, 0x1000).is_err());
        assert!(PunPlan::new(&[0xc3; 9], 5, 5, 0x1000).is_err());
    }
}
