//! The shape of a signal-state site (issue 22): a `syscall` instruction
//! of libc's making `rt_sigaction` (13) or `rt_sigprocmask` (14), its
//! number loaded by `mov eax, 13|14` just before it, with at most two
//! simple instructions in between that touch neither `rax` nor the flow
//! (glibc's `pthread_create` loads the set's address between the two:
//! `mov eax, 14; lea rsi, [rip+sigall]; syscall`). The tracer puts an
//! `int3` on each (`hotprobe-process`'s `sigtrap.rs`); the agent finds
//! them by the same shape to put them back when the tracer died
//! (`hotprobe-agent`'s `sigsites.rs`). Matched on bytes, not decoded:
//! both sides must agree exactly, and the agent cannot link a decoder.

/// The longest site: the `mov` (5 bytes), two instructions of at most 8
/// bytes, the `syscall` (2).
pub const SIG_SITE_MAX: usize = 5 + 2 * 8 + 2;

/// If `w` starts with a site's `mov eax, 13|14` and its in-between
/// instructions: the offset of the `syscall` instruction's first byte
/// (whatever is there now: `0f`, or the tracer's `int3`) and the number.
/// The caller checks the bytes at that offset.
pub fn sig_site_shape(w: &[u8]) -> Option<(usize, u8)> {
    let nr = match w {
        [0xb8, nr @ (13 | 14), 0, 0, 0, ..] => *nr,
        _ => return None,
    };
    let mut at = 5;
    for _ in 0..2 {
        match w.get(at..).and_then(simple_len) {
            Some(n) => at += n,
            None => break,
        }
    }
    (w.len() >= at + 2).then_some((at, nr))
}

/// The length of the instruction at the start of `b` if it is one of the
/// few that may stand between a site's `mov` and its `syscall`: it writes
/// neither `rax` nor the flags' users, and is no branch.
fn simple_len(b: &[u8]) -> Option<usize> {
    let rex_w = |r: u8| r & 0xf8 == 0x48;
    match b {
        // lea r64, [rip+disp32] | [reg+disp32] (no SIB), not into rax.
        [rex, 0x8d, modrm, ..] if rex_w(*rex) => {
            let (md, reg, rm) = (modrm >> 6, (modrm >> 3) & 7, modrm & 7);
            let into_rax = reg == 0 && rex & 4 == 0;
            let form = (md == 0 && rm == 5) || (md == 2 && rm != 4);
            (form && !into_rax && b.len() >= 7).then_some(7)
        }
        // mov qword [rsp], imm32.
        [0x48, 0xc7, 0x04, 0x24, ..] if b.len() >= 8 => Some(8),
        // sub|add rsp, imm8.
        [0x48, 0x83, 0xec | 0xc4, _, ..] => Some(4),
        // mov r32, imm32 but eax (ecx..edi), and r8d..r15d.
        [0xb9..=0xbf, _, _, _, _, ..] => Some(5),
        [0x41, 0xb8..=0xbf, _, _, _, _, ..] => Some(6),
        // mov r/m64, r64 between registers, not into rax.
        [rex, 0x89, modrm, ..] if rex_w(*rex) => {
            let into_rax = modrm & 7 == 0 && rex & 1 == 0;
            (modrm >> 6 == 3 && !into_rax).then_some(3)
        }
        // xor r32, r32 (zeroing), not eax.
        [0x31, modrm, ..] if modrm >> 6 == 3 && modrm & 7 != 0 => Some(2),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_number_then_simple_instructions_then_the_syscall() {
        // mov eax, 14; syscall
        assert_eq!(
            sig_site_shape(&[0xb8, 14, 0, 0, 0, 0x0f, 0x05]),
            Some((5, 14))
        );
        // mov eax, 14; lea rsi, [rip+0x1178dd]; syscall (pthread_create)
        let w = [
            0xb8, 14, 0, 0, 0, 0x48, 0x8d, 0x35, 0xdd, 0x78, 0x11, 0, 0x0f, 0x05,
        ];
        assert_eq!(sig_site_shape(&w), Some((12, 14)));
        // mov eax, 14; lea rsi, [rbx+0x8f0]; syscall (start_thread)
        let w = [
            0xb8, 14, 0, 0, 0, 0x48, 0x8d, 0xb3, 0xf0, 0x08, 0, 0, 0xcc, 0x05,
        ];
        assert_eq!(sig_site_shape(&w), Some((12, 14)));
        // mov eax, 14; mov qword [rsp], 0x20; syscall
        let w = [
            0xb8, 14, 0, 0, 0, 0x48, 0xc7, 0x04, 0x24, 0x20, 0, 0, 0, 0x0f, 0x05,
        ];
        assert_eq!(sig_site_shape(&w), Some((13, 14)));
        // mov eax, 14; lea rsi, [rip+d]; sub rsp, 8; syscall
        let w = [
            0xb8, 14, 0, 0, 0, 0x48, 0x8d, 0x35, 0x52, 0xd7, 0x0f, 0, 0x48, 0x83, 0xec, 0x08, 0x0f,
            0x05,
        ];
        assert_eq!(sig_site_shape(&w), Some((16, 14)));
        // mov eax, 13; mov r10d, 8; syscall
        let w = [0xb8, 13, 0, 0, 0, 0x41, 0xba, 8, 0, 0, 0, 0x0f, 0x05];
        assert_eq!(sig_site_shape(&w), Some((11, 13)));
    }

    #[test]
    fn other_numbers_and_writes_of_rax_are_no_site() {
        assert_eq!(sig_site_shape(&[0xb8, 39, 0, 0, 0, 0x0f, 0x05]), None);
        // lea rax, [rip+d] in between: the shape stops before it.
        let w = [0xb8, 14, 0, 0, 0, 0x48, 0x8d, 0x05, 1, 2, 3, 4, 0x0f, 0x05];
        assert_eq!(sig_site_shape(&w), Some((5, 14)));
        // mov rax, rdi (48 89 f8) in between: likewise.
        let w = [0xb8, 14, 0, 0, 0, 0x48, 0x89, 0xf8, 0x0f, 0x05];
        assert_eq!(sig_site_shape(&w), Some((5, 14)));
        // xor eax, eax: likewise.
        assert_eq!(
            sig_site_shape(&[0xb8, 14, 0, 0, 0, 0x31, 0xc0, 0x0f, 0x05]),
            Some((5, 14))
        );
        // Too short for the syscall.
        assert_eq!(sig_site_shape(&[0xb8, 14, 0, 0, 0, 0x0f]), None);
        assert_eq!(sig_site_shape(&[]), None);
    }
}
