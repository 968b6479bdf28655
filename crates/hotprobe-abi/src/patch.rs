//! Byte sequences the patch mechanism writes, shared by the tracer (which
//! writes them into the target) and the agent (which builds its near page).
//!
//! A patched site is `call rel32` (5 bytes) whose target must lie within
//! ±2 GiB. The agent is usually mapped far from the executable, so the call
//! goes to a *near stub*, an absolute indirect jump ([`abs_jmp_stub`]) placed
//! within reach; the agent maps one near page beside the main executable
//! ([`crate::Header::near_page`]) with its three stubs at
//! [`NEAR_STUB_ENTRY`], [`NEAR_STUB_EXIT`], [`NEAR_STUB_MID`], and leaves the
//! rest of the page, from [`NEAR_SCRATCH`], to the tracer.

/// Offset in the near page of the stub jumping to the entry trampoline.
pub const NEAR_STUB_ENTRY: u64 = 0;
/// Offset in the near page of the stub jumping to the exit trampoline.
pub const NEAR_STUB_EXIT: u64 = 16;
/// Offset in the near page of the stub jumping to the mid trampoline.
pub const NEAR_STUB_MID: u64 = 32;
/// First byte of the near page left to the tracer (per-site stubs).
pub const NEAR_SCRATCH: u64 = 64;

/// The 5-byte NOP (`nop dword [rax+rax*1+0]`) ColdPatch writes.
pub const NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];
/// The 6-byte NOP (`nop word [rax+rax*1+0]`), for `call [rip+disp32]`.
pub const NOP6: [u8; 6] = [0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00];

fn rel32(from_end: u64, to: u64) -> Option<i32> {
    i32::try_from(to.wrapping_sub(from_end) as i64).ok()
}

/// `call rel32` placed at `from` that calls `to`; `None` if out of ±2 GiB.
/// The return address it pushes — the site key — is `from + 5`.
pub fn call_rel32(from: u64, to: u64) -> Option<[u8; 5]> {
    let d = rel32(from.wrapping_add(5), to)?.to_le_bytes();
    Some([0xe8, d[0], d[1], d[2], d[3]])
}

/// `jmp rel32` placed at `from` that jumps to `to`; `None` if out of ±2 GiB.
pub fn jmp_rel32(from: u64, to: u64) -> Option<[u8; 5]> {
    let d = rel32(from.wrapping_add(5), to)?.to_le_bytes();
    Some([0xe9, d[0], d[1], d[2], d[3]])
}

/// `jmp qword [rip+0]` followed by the absolute `target` and two `int3`
/// bytes: a 16-byte position-independent stub reaching any address.
pub fn abs_jmp_stub(target: u64) -> [u8; 16] {
    let mut s = [0xcc; 16];
    s[..6].copy_from_slice(&[0xff, 0x25, 0, 0, 0, 0]);
    s[6..14].copy_from_slice(&target.to_le_bytes());
    s
}

/// Per-site stub for a ColdPatched *tail* exit (`jmp hook` that ColdPatch
/// turned into `ret; nop4`): the site becomes `jmp stub` ([`jmp_rel32`]) and
/// the stub is `call qword [rip+2]; ret; int3; .quad target` (16 bytes).
/// Its site key is `stub + TAIL_STUB_KEY_OFFSET`.
pub fn tail_exit_stub(target: u64) -> [u8; 16] {
    let mut s = [0xcc; 16];
    s[..8].copy_from_slice(&[0xff, 0x15, 0x02, 0, 0, 0, 0xc3, 0xcc]);
    s[8..].copy_from_slice(&target.to_le_bytes());
    s
}

/// Offset of the return address pushed by [`tail_exit_stub`]'s call.
pub const TAIL_STUB_KEY_OFFSET: u64 = 6;

/// The bytes ColdPatch leaves at a tail exit site: `ret` + 4-byte NOP.
pub const RET_NOP4: [u8; 5] = [0xc3, 0x0f, 0x1f, 0x40, 0x00];
