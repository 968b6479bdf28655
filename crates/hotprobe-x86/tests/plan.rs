//! Classification, relocation and never-panic tests for `plan_probe`.

use hotprobe_x86::iced_x86::{Code, Decoder, DecoderOptions, Instruction, Register};
use hotprobe_x86::{
    decode, instruction_starts, is_instruction_boundary, plan_probe, Condition, Emulation,
    Execution, Gpr, LoopKind, ProbePlan, StepFixup, X86Error, MAX_INSN_LEN, SLOT_SIZE,
};

/// A PIE-like probe address.
const PROBE: u64 = 0x5555_5555_4000;
const NEAR_SLOT: u64 = PROBE + 0x1000;
const GIB: u64 = 1 << 30;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Want {
    Emu(Emulation),
    Boost,
    Step(StepFixup),
    Refused,
    Truncated,
    Invalid,
}

fn plan(bytes: &[u8]) -> Result<ProbePlan, X86Error> {
    plan_probe(bytes, PROBE, NEAR_SLOT)
}

fn rel(len: u64, disp: i64) -> u64 {
    (PROBE + len).wrapping_add(disp as u64)
}

#[test]
fn classification_table() {
    use Want::*;
    let table: Vec<(&str, Vec<u8>, Want)> = vec![
        (
            "push rbp",
            vec![0x55],
            Emu(Emulation::Push { reg: Gpr::Rbp }),
        ),
        (
            "push r12",
            vec![0x41, 0x54],
            Emu(Emulation::Push { reg: Gpr::R12 }),
        ),
        (
            "push rbp (ff /6)",
            vec![0xff, 0xf5],
            Emu(Emulation::Push { reg: Gpr::Rbp }),
        ),
        ("push qword [rdi]", vec![0xff, 0x37], Boost),
        (
            "mov rbp, rsp",
            vec![0x48, 0x89, 0xe5],
            Emu(Emulation::MovReg {
                dst: Gpr::Rbp,
                src: Gpr::Rsp,
            }),
        ),
        (
            "mov r12, rdi",
            vec![0x49, 0x89, 0xfc],
            Emu(Emulation::MovReg {
                dst: Gpr::R12,
                src: Gpr::Rdi,
            }),
        ),
        (
            "mov rbp, rsp (8b form)",
            vec![0x48, 0x8b, 0xec],
            Emu(Emulation::MovReg {
                dst: Gpr::Rbp,
                src: Gpr::Rsp,
            }),
        ),
        ("mov ebp, esp (32-bit)", vec![0x89, 0xe5], Boost),
        ("mov rax, [rdi]", vec![0x48, 0x8b, 0x07], Boost),
        ("endbr64", vec![0xf3, 0x0f, 0x1e, 0xfa], Emu(Emulation::Nop)),
        ("endbr32", vec![0xf3, 0x0f, 0x1e, 0xfb], Emu(Emulation::Nop)),
        ("nop", vec![0x90], Emu(Emulation::Nop)),
        ("xchg ax, ax", vec![0x66, 0x90], Emu(Emulation::Nop)),
        (
            "nop dword [rax]",
            vec![0x0f, 0x1f, 0x00],
            Emu(Emulation::Nop),
        ),
        (
            "nop dword [rax+0]",
            vec![0x0f, 0x1f, 0x40, 0x00],
            Emu(Emulation::Nop),
        ),
        (
            "nop dword [rax+rax+0]",
            vec![0x0f, 0x1f, 0x44, 0x00, 0x00],
            Emu(Emulation::Nop),
        ),
        (
            "nop word [rax+rax+0]",
            vec![0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00],
            Emu(Emulation::Nop),
        ),
        (
            "nop dword [rax+0x0] d32",
            vec![0x0f, 0x1f, 0x80, 0, 0, 0, 0],
            Emu(Emulation::Nop),
        ),
        (
            "nop dword [rax+rax+0x0] d32",
            vec![0x0f, 0x1f, 0x84, 0x00, 0, 0, 0, 0],
            Emu(Emulation::Nop),
        ),
        (
            "cs nop word [rax+rax+0x0]",
            vec![0x66, 0x2e, 0x0f, 0x1f, 0x84, 0x00, 0, 0, 0, 0],
            Emu(Emulation::Nop),
        ),
        ("xchg r8d, eax (not a nop)", vec![0x41, 0x90], Boost),
        ("pause", vec![0xf3, 0x90], Boost),
        ("sub rsp, 0x18", vec![0x48, 0x83, 0xec, 0x18], Boost),
        (
            "sub rsp, 0x1000",
            vec![0x48, 0x81, 0xec, 0x00, 0x10, 0x00, 0x00],
            Boost,
        ),
        (
            "mov eax, [rip+0x2ee5]",
            vec![0x8b, 0x05, 0xe5, 0x2e, 0, 0],
            Boost,
        ),
        (
            "lea rdi, [rip+0x1234]",
            vec![0x48, 0x8d, 0x3d, 0x34, 0x12, 0, 0],
            Boost,
        ),
        (
            "cmp byte [rip+0x10], 0",
            vec![0x80, 0x3d, 0x10, 0, 0, 0, 0x00],
            Boost,
        ),
        (
            "call rel32",
            vec![0xe8, 0x10, 0x20, 0x00, 0x00],
            Emu(Emulation::CallRel {
                target: rel(5, 0x2010),
                return_addr: PROBE + 5,
            }),
        ),
        (
            "call rel32 backwards",
            vec![0xe8, 0xfb, 0xff, 0xff, 0xff],
            Emu(Emulation::CallRel {
                target: PROBE,
                return_addr: PROBE + 5,
            }),
        ),
        (
            "jmp rel8",
            vec![0xeb, 0x10],
            Emu(Emulation::JmpRel {
                target: rel(2, 0x10),
            }),
        ),
        (
            "jmp rel8 back",
            vec![0xeb, 0xfe],
            Emu(Emulation::JmpRel { target: PROBE }),
        ),
        (
            "jmp rel32",
            vec![0xe9, 0x00, 0x01, 0x00, 0x00],
            Emu(Emulation::JmpRel {
                target: rel(5, 0x100),
            }),
        ),
        (
            "jne rel8",
            vec![0x75, 0x07],
            Emu(Emulation::Jcc {
                cond: Condition::Ne,
                target: rel(2, 7),
                fallthrough: PROBE + 2,
            }),
        ),
        (
            "jle rel32",
            vec![0x0f, 0x8e, 0x00, 0xff, 0xff, 0xff],
            Emu(Emulation::Jcc {
                cond: Condition::Le,
                target: rel(6, -0x100),
                fallthrough: PROBE + 6,
            }),
        ),
        (
            "loop",
            vec![0xe2, 0xfe],
            Emu(Emulation::Loop {
                kind: LoopKind::Loop,
                target: PROBE,
                fallthrough: PROBE + 2,
            }),
        ),
        (
            "loopne",
            vec![0xe0, 0x05],
            Emu(Emulation::Loop {
                kind: LoopKind::Loopne,
                target: rel(2, 5),
                fallthrough: PROBE + 2,
            }),
        ),
        (
            "jrcxz",
            vec![0xe3, 0x05],
            Emu(Emulation::Loop {
                kind: LoopKind::Jrcxz,
                target: rel(2, 5),
                fallthrough: PROBE + 2,
            }),
        ),
        (
            "jecxz",
            vec![0x67, 0xe3, 0x05],
            Emu(Emulation::Loop {
                kind: LoopKind::Jecxz,
                target: rel(3, 5),
                fallthrough: PROBE + 3,
            }),
        ),
        ("loop ecx", vec![0x67, 0xe2, 0x05], Refused),
        (
            "call rax",
            vec![0xff, 0xd0],
            Step(StepFixup::CallReturnAddr),
        ),
        (
            "call [rip+0x2fe2]",
            vec![0xff, 0x15, 0xe2, 0x2f, 0, 0],
            Step(StepFixup::CallReturnAddr),
        ),
        (
            "call [rax+8]",
            vec![0xff, 0x50, 0x08],
            Step(StepFixup::CallReturnAddr),
        ),
        ("jmp rax", vec![0xff, 0xe0], Boost),
        ("notrack jmp rax", vec![0x3e, 0xff, 0xe0], Boost),
        (
            "jmp [rip+0x2fe2]",
            vec![0xff, 0x25, 0xe2, 0x2f, 0, 0],
            Boost,
        ),
        ("ret", vec![0xc3], Emu(Emulation::Ret { pop_extra: 0 })),
        (
            "ret 8",
            vec![0xc2, 0x08, 0x00],
            Emu(Emulation::Ret { pop_extra: 8 }),
        ),
        (
            "bnd ret",
            vec![0xf2, 0xc3],
            Emu(Emulation::Ret { pop_extra: 0 }),
        ),
        ("leave", vec![0xc9], Emu(Emulation::Leave)),
        ("pushfq", vec![0x9c], Emu(Emulation::Pushf)),
        ("popfq", vec![0x9d], Boost),
        ("syscall", vec![0x0f, 0x05], Boost),
        ("int 0x80", vec![0xcd, 0x80], Boost),
        ("cpuid", vec![0x0f, 0xa2], Boost),
        ("rdtsc", vec![0x0f, 0x31], Boost),
        ("enter 0x10, 0", vec![0xc8, 0x10, 0x00, 0x00], Boost),
        (
            "lock cmpxchg [rdi], rsi",
            vec![0xf0, 0x48, 0x0f, 0xb1, 0x37],
            Boost,
        ),
        ("rep movsb", vec![0xf3, 0xa4], Boost),
        (
            "vpaddd ymm0, ymm1, ymm2 (vex)",
            vec![0xc5, 0xf5, 0xfe, 0xc2],
            Boost,
        ),
        (
            "vmovdqu ymm0, [rip+0x100] (vex)",
            vec![0xc5, 0xfe, 0x6f, 0x05, 0x00, 0x01, 0x00, 0x00],
            Boost,
        ),
        (
            "vpaddd zmm0, zmm1, zmm2 (evex)",
            vec![0x62, 0xf1, 0x75, 0x48, 0xfe, 0xc2],
            Boost,
        ),
        (
            "15-byte mov rax, imm64 with 5 segment prefixes",
            vec![
                0x2e, 0x3e, 0x26, 0x64, 0x65, 0x48, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8,
            ],
            Boost,
        ),
        ("int3", vec![0xcc], Refused),
        ("int 3", vec![0xcd, 0x03], Refused),
        ("int 0x21", vec![0xcd, 0x21], Refused),
        ("int1", vec![0xf1], Refused),
        ("ud2", vec![0x0f, 0x0b], Refused),
        ("ud1", vec![0x0f, 0xb9, 0xc0], Refused),
        ("ud0", vec![0x0f, 0xff, 0xc0], Refused),
        ("hlt", vec![0xf4], Refused),
        ("cli", vec![0xfa], Refused),
        ("in al, dx", vec![0xec], Refused),
        ("wrmsr", vec![0x0f, 0x30], Refused),
        ("xbegin", vec![0xc7, 0xf8, 0x10, 0, 0, 0], Refused),
        ("xend", vec![0x0f, 0x01, 0xd5], Refused),
        ("xabort 1", vec![0xc6, 0xf8, 0x01], Refused),
        ("retf", vec![0xcb], Refused),
        ("iretq", vec![0x48, 0xcf], Refused),
        ("jmp far [rax]", vec![0xff, 0x28], Refused),
        ("call far [rax]", vec![0xff, 0x18], Refused),
        ("sysenter", vec![0x0f, 0x34], Refused),
        ("truncated call", vec![0xe8, 0x01, 0x02], Truncated),
        (
            "truncated rip-rel mov",
            vec![0x48, 0x8b, 0x05, 0x00],
            Truncated,
        ),
        ("lone prefix", vec![0x66], Truncated),
        ("invalid (06 push es)", vec![0x06], Invalid),
        (
            "16 bytes: 6 segment prefixes + mov rax, imm64",
            vec![
                0x2e, 0x2e, 0x3e, 0x26, 0x64, 0x65, 0x48, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8,
            ],
            Invalid,
        ),
    ];
    let mut failures = Vec::new();
    for (name, bytes, want) in &table {
        let got = match plan(bytes) {
            Ok(p) => {
                assert!(p.len <= bytes.len(), "{name}: len {} > input", p.len);
                match p.execution {
                    Execution::Emulate(e) => {
                        assert!(p.slot.is_none(), "{name}: emulated but has a slot");
                        Want::Emu(e)
                    }
                    Execution::Boost => {
                        assert!(p.boostable && p.slot.is_some(), "{name}");
                        Want::Boost
                    }
                    Execution::Step(f) => {
                        assert!(!p.boostable && p.slot.is_some(), "{name}");
                        Want::Step(f)
                    }
                }
            }
            Err(X86Error::Unsupported { addr, .. }) => {
                assert_eq!(addr, PROBE);
                Want::Refused
            }
            Err(X86Error::Truncated { .. }) => Want::Truncated,
            Err(X86Error::Invalid { .. }) => Want::Invalid,
            Err(e) => panic!("{name}: unexpected error {e}"),
        };
        if got != *want {
            failures.push(format!("{name} ({bytes:02x?}): want {want:?}, got {got:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn full_length_and_empty() {
    let bytes = [
        0x2e, 0x3e, 0x26, 0x64, 0x65, 0x48, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8,
    ];
    assert_eq!(plan(&bytes).unwrap().len, MAX_INSN_LEN);
    assert!(matches!(plan(&[]), Err(X86Error::Empty { addr: PROBE })));
    // Trailing bytes after the instruction are ignored.
    let p = plan(&[0x55, 0xcc, 0xcc]).unwrap();
    assert_eq!(p.len, 1);
}

#[test]
fn mnemonic_text() {
    let p = plan(&[0x48, 0x8b, 0x05, 0xe5, 0x2e, 0x00, 0x00]).unwrap();
    assert_eq!(p.mnemonic, "mov rax, [rip+0x2ee5]");
    let e = plan(&[0xcc]).unwrap_err().to_string();
    assert!(e.contains("int3") && e.contains("0x555555554000"), "{e}");
}

fn decode_all(bytes: &[u8], ip: u64) -> Vec<Instruction> {
    let mut d = Decoder::with_ip(64, bytes, ip, DecoderOptions::NONE);
    let mut out = Vec::new();
    while d.can_decode() {
        out.push(d.decode());
    }
    out
}

/// Checks the jump back at `slot + insn_len` targets `PROBE + len`, in
/// either form; returns true for the rel32 form.
fn check_jump_back(p: &ProbePlan, slot_addr: u64) -> bool {
    let slot = p.slot.as_ref().unwrap();
    assert_eq!(slot.bytes.len(), SLOT_SIZE);
    let at = slot.insn_len_in_slot;
    let jmp = decode(&slot.bytes[at..], slot_addr + at as u64).unwrap();
    let back = PROBE + p.len as u64;
    let near = match jmp.code() {
        Code::Jmp_rel32_64 => {
            assert_eq!(jmp.near_branch_target(), back);
            true
        }
        Code::Jmp_rm64 => {
            assert!(jmp.is_ip_rel_memory_operand());
            let q = (jmp.ip_rel_memory_address() - slot_addr) as usize;
            let target = u64::from_le_bytes(slot.bytes[q..q + 8].try_into().unwrap());
            assert_eq!(target, back);
            false
        }
        other => panic!("unexpected jump back {other:?}"),
    };
    let end = at + jmp.len() + if near { 0 } else { 8 };
    assert!(slot.bytes[end..].iter().all(|&b| b == 0xcc), "padding");
    near
}

#[test]
fn rip_relative_relocation() {
    let cases: &[&[u8]] = &[
        &[0x8b, 0x05, 0xe5, 0x2e, 0x00, 0x00], // mov eax, [rip+0x2ee5]
        &[0x48, 0x8d, 0x3d, 0x34, 0x12, 0x00, 0x00], // lea rdi, [rip+0x1234]
        &[0x80, 0x3d, 0x10, 0x00, 0x00, 0x00, 0x00], // cmp byte [rip+0x10], 0
        &[0xc7, 0x05, 0xf0, 0xff, 0xff, 0xff, 1, 2, 3, 4], // mov dword [rip-0x10], imm32
        &[0xff, 0x15, 0xe2, 0x2f, 0x00, 0x00], // call [rip+0x2fe2]
        &[0xff, 0x25, 0xe2, 0x2f, 0x00, 0x00], // jmp [rip+0x2fe2]
        &[0xc5, 0xfe, 0x6f, 0x05, 0x00, 0x01, 0x00, 0x00], // vmovdqu ymm0, [rip+0x100]
        &[0x64, 0x48, 0x8b, 0x05, 0x10, 0x00, 0x00, 0x00], // mov rax, fs:[rip+0x10]
        &[0xf0, 0x48, 0x0f, 0xb1, 0x35, 0x10, 0x00, 0x00, 0x00], // lock cmpxchg [rip+0x10], rsi
    ];
    for bytes in cases {
        let orig = decode(bytes, PROBE).unwrap();
        let target = orig.ip_rel_memory_address();
        for slot_addr in [
            PROBE + 0x1000,
            PROBE - 0x1000,
            PROBE + GIB + GIB / 2,
            PROBE - GIB - GIB / 2,
        ] {
            let p = plan_probe(bytes, PROBE, slot_addr).unwrap();
            assert_eq!(p.rip_relative_target, Some(target));
            let slot = p.slot.as_ref().unwrap();
            let insns = decode_all(&slot.bytes[..slot.insn_len_in_slot], slot_addr);
            assert_eq!(insns.len(), 1, "{bytes:02x?}");
            let r = insns[0];
            assert_eq!(r.code(), orig.code());
            assert_eq!(r.memory_base(), Register::RIP);
            assert_eq!(
                r.ip_rel_memory_address(),
                target,
                "{bytes:02x?} at {slot_addr:#x}"
            );
            assert_eq!(r.memory_displacement64(), target);
            assert_eq!(r.segment_prefix(), orig.segment_prefix());
            assert_eq!(r.has_lock_prefix(), orig.has_lock_prefix());
            assert!(check_jump_back(&p, slot_addr), "jump back should be rel32");
        }
        // Out of reach: +3 GiB and -3 GiB.
        for slot_addr in [PROBE + 3 * GIB, PROBE - 3 * GIB] {
            match plan_probe(bytes, PROBE, slot_addr) {
                Err(X86Error::OutOfReach {
                    addr,
                    target: t,
                    slot,
                    ..
                }) => {
                    assert_eq!((addr, t, slot), (PROBE, target, slot_addr));
                }
                other => panic!("{bytes:02x?}: expected OutOfReach, got {other:?}"),
            }
        }
    }
}

#[test]
fn position_independent_slots() {
    // Non-RIP-relative instructions are copied verbatim, at any distance;
    // the jump back switches to the absolute form out of rel32 reach.
    let cases: &[&[u8]] = &[
        &[0x48, 0x83, 0xec, 0x18],
        &[0xff, 0xd0],
        &[0x0f, 0x05],
        &[
            0x2e, 0x3e, 0x26, 0x64, 0x65, 0x48, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8,
        ],
    ];
    for bytes in cases {
        for (slot_addr, near) in [
            (PROBE + 0x1000, true),
            (PROBE + GIB + GIB / 2, true),
            (PROBE + 3 * GIB, false),
            (PROBE - 3 * GIB, false),
            (0x10_0000, false),
        ] {
            let p = plan_probe(bytes, PROBE, slot_addr).unwrap();
            let slot = p.slot.as_ref().unwrap();
            assert_eq!(slot.insn_len_in_slot, bytes.len());
            assert_eq!(&slot.bytes[..bytes.len()], *bytes);
            assert_eq!(
                check_jump_back(&p, slot_addr),
                near,
                "{bytes:02x?} {slot_addr:#x}"
            );
        }
    }
}

#[test]
fn emulated_plans_ignore_slot_distance() {
    let p = plan_probe(&[0xe8, 0, 0, 0, 0], PROBE, PROBE + 5 * GIB).unwrap();
    assert!(matches!(
        p.execution,
        Execution::Emulate(Emulation::CallRel { .. })
    ));
}

#[test]
fn boundaries() {
    // push rbp; mov rbp, rsp; sub rsp, 0x10; mov eax, [rip+0x10]; leave; ret
    let code = [
        0x55, 0x48, 0x89, 0xe5, 0x48, 0x83, 0xec, 0x10, 0x8b, 0x05, 0x10, 0, 0, 0, 0xc9, 0xc3,
    ];
    let base = 0x401000;
    let starts = instruction_starts(&code, base);
    let want: Vec<u64> = [0, 1, 4, 8, 14, 15].iter().map(|o| base + o).collect();
    assert_eq!(starts, want);
    for off in 0..code.len() as u64 + 3 {
        assert_eq!(
            is_instruction_boundary(&code, base, base + off),
            want.contains(&(base + off)),
            "offset {off}"
        );
    }
    assert!(!is_instruction_boundary(&code, base, base - 1));
    // Stops at undecodable bytes and at a truncated tail.
    assert_eq!(instruction_starts(&[0x90, 0x06, 0x90], 0), vec![0]);
    assert_eq!(instruction_starts(&[0x90, 0xe8, 0x00], 0), vec![0]);
    assert!(instruction_starts(&[], 0).is_empty());
}

/// Deterministic xorshift64* generator.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

#[test]
fn random_bytes_never_panic() {
    // Prefixes and opcode bytes that lead to interesting decoder paths.
    const LEADS: &[u8] = &[
        0x0f, 0x66, 0x67, 0xf2, 0xf3, 0xf0, 0x2e, 0x3e, 0x64, 0x65, 0x48, 0x41, 0x4c, 0xc4, 0xc5,
        0x62, 0x8f, 0xff, 0xe8, 0xe9, 0xeb, 0x70, 0xe2, 0xe3, 0xc2, 0xc3, 0xcd, 0x8b, 0x8d,
    ];
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut ok = 0u32;
    for i in 0..200_000u32 {
        let r = rng.next();
        let len = (r % 17) as usize;
        let mut bytes = [0u8; 16];
        for chunk in bytes.chunks_mut(8) {
            let v = rng.next().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
        if r & 0x100 != 0 {
            bytes[0] = LEADS[(r >> 16) as usize % LEADS.len()];
        }
        if r & 0x200 != 0 {
            // Force a ModRM byte with RIP-relative addressing after the lead.
            bytes[2] = 0x05 | ((r >> 24) as u8 & 0x38);
        }
        let probe = match i % 4 {
            0 => PROBE,
            1 => 0x40_1000,
            2 => u64::MAX - (r % 32),
            _ => rng.next(),
        };
        let slot = match (r >> 40) % 4 {
            0 => probe.wrapping_add(0x1000),
            1 => probe.wrapping_sub(GIB + GIB / 2),
            2 => probe.wrapping_add(3 * GIB),
            _ => rng.next(),
        };
        let input = &bytes[..len];
        if let Ok(p) = plan_probe(input, probe, slot) {
            ok += 1;
            assert!(p.len >= 1 && p.len <= len.min(MAX_INSN_LEN));
            if let Some(s) = &p.slot {
                assert_eq!(s.bytes.len(), SLOT_SIZE);
                assert!(s.insn_len_in_slot <= MAX_INSN_LEN);
                let r = decode(&s.bytes, slot).expect("slot instruction decodes");
                assert_eq!(r, p.instruction, "{input:02x?}");
                assert_eq!(r.len(), s.insn_len_in_slot);
                if let Some(t) = p.rip_relative_target {
                    assert_eq!(r.ip_rel_memory_address(), t);
                }
            }
        }
        let _ = instruction_starts(input, probe);
        let _ = is_instruction_boundary(input, probe, probe.wrapping_add(r % 20));
    }
    assert!(ok > 10_000, "only {ok} plans succeeded");
}
