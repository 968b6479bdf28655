//! Emulation and step-fixup tests; `jcc` conditions are checked against the
//! CPU this test runs on.

use hotprobe_x86::{
    emulate, fixup_after_step, plan_probe, slot_to_original, Condition, Emulation, Execution,
    MemWrite, ProbePlan, Registers, X86Error,
};

const PROBE: u64 = 0x5555_5555_4000;
const SLOT: u64 = PROBE + 0x1000;
const STACK: u64 = 0x7ffd_0000_1000;

const CF: u64 = 1 << 0;
const PF: u64 = 1 << 2;
const ZF: u64 = 1 << 6;
const SF: u64 = 1 << 7;
const OF: u64 = 1 << 11;
const STATUS: [u64; 5] = [CF, PF, ZF, SF, OF];

fn plan(bytes: &[u8]) -> ProbePlan {
    plan_probe(bytes, PROBE, SLOT).unwrap()
}

fn emulation(p: &ProbePlan) -> Emulation {
    match p.execution {
        Execution::Emulate(e) => e,
        other => panic!("not emulated: {other:?}"),
    }
}

fn regs() -> Registers {
    Registers {
        rip: PROBE,
        rsp: STACK,
        rbp: STACK + 0x40,
        rflags: 0x202,
        ..Registers::default()
    }
}

fn no_stack(addr: u64) -> Result<u64, X86Error> {
    panic!("unexpected stack read at {addr:#x}")
}

/// Runs a plan's emulation with a one-entry stack `{addr: value}`.
fn run(p: &ProbePlan, r: &mut Registers, stack: Option<(u64, u64)>) -> Option<MemWrite> {
    let mut read = |addr: u64| match stack {
        Some((a, v)) if a == addr => Ok(v),
        _ => Err(X86Error::StackRead {
            addr,
            reason: "unmapped".into(),
        }),
    };
    emulate(&emulation(p), PROBE, p.len, r, &mut read).unwrap()
}

/// Evaluates condition `nibble` on `flags` with a real `setcc`.
#[cfg(target_arch = "x86_64")]
fn hardware_condition(nibble: u8, flags: u64) -> bool {
    macro_rules! setcc {
        ($insn:literal) => {{
            let out: u8;
            // SAFETY: pushes `flags` and pops it into RFLAGS (only the status
            // flags differ from the current value; IF/IOPL changes are ignored
            // at CPL 3), then reads the condition with setcc. The stack is
            // balanced and nothing else is touched.
            unsafe {
                core::arch::asm!(
                    "push {f}",
                    "popfq",
                    concat!($insn, " {o}"),
                    f = in(reg) flags,
                    o = out(reg_byte) out,
                );
            }
            out != 0
        }};
    }
    match nibble {
        0x0 => setcc!("seto"),
        0x1 => setcc!("setno"),
        0x2 => setcc!("setb"),
        0x3 => setcc!("setae"),
        0x4 => setcc!("sete"),
        0x5 => setcc!("setne"),
        0x6 => setcc!("setbe"),
        0x7 => setcc!("seta"),
        0x8 => setcc!("sets"),
        0x9 => setcc!("setns"),
        0xa => setcc!("setp"),
        0xb => setcc!("setnp"),
        0xc => setcc!("setl"),
        0xd => setcc!("setge"),
        0xe => setcc!("setle"),
        _ => setcc!("setg"),
    }
}

fn flag_combos() -> impl Iterator<Item = u64> {
    (0u32..32).map(|m| {
        STATUS
            .iter()
            .enumerate()
            .filter(|(i, _)| m & (1 << i) != 0)
            .fold(0x202u64, |acc, (_, f)| acc | f)
    })
}

#[test]
#[cfg(target_arch = "x86_64")]
fn jcc_conditions_match_the_cpu() {
    for nibble in 0u8..16 {
        let short = [0x70 | nibble, 0x10];
        let near = [0x0f, 0x80 | nibble, 0x00, 0x01, 0x00, 0x00];
        for bytes in [&short[..], &near[..]] {
            let p = plan(bytes);
            let Emulation::Jcc {
                cond,
                target,
                fallthrough,
            } = emulation(&p)
            else {
                panic!("{bytes:02x?} is not a jcc");
            };
            assert_eq!(cond, Condition::from_nibble(nibble));
            assert_eq!(fallthrough, PROBE + bytes.len() as u64);
            assert_eq!(
                target,
                fallthrough + if bytes.len() == 2 { 0x10 } else { 0x100 }
            );
            for flags in flag_combos() {
                let taken = hardware_condition(nibble, flags);
                assert_eq!(cond.holds(flags), taken, "{cond:?} flags {flags:#x}");
                let mut r = regs();
                r.rflags = flags;
                let before = r;
                assert_eq!(
                    emulate(&emulation(&p), PROBE, p.len, &mut r, &mut no_stack),
                    Ok(None)
                );
                assert_eq!(r.rip, if taken { target } else { fallthrough });
                assert_eq!(
                    Registers {
                        rip: before.rip,
                        ..r
                    },
                    before,
                    "only rip changes"
                );
            }
        }
    }
}

#[test]
fn jne_with_flags_set_and_clear() {
    let p = plan(&[0x75, 0x07]);
    let mut r = regs();
    r.rflags = 0x202 | ZF;
    run(&p, &mut r, None);
    assert_eq!(r.rip, PROBE + 2);
    let mut r = regs();
    run(&p, &mut r, None);
    assert_eq!(r.rip, PROBE + 9);
}

#[test]
fn loops() {
    let lp = plan(&[0xe2, 0x10]); // loop +0x10
    let taken = PROBE + 0x12;
    let next = PROBE + 2;
    let mut r = regs();
    r.rcx = 1;
    run(&lp, &mut r, None);
    assert_eq!((r.rcx, r.rip), (0, next));
    let mut r = regs();
    r.rcx = 0;
    run(&lp, &mut r, None);
    assert_eq!((r.rcx, r.rip), (u64::MAX, taken));

    let loope = plan(&[0xe1, 0x10]);
    let loopne = plan(&[0xe0, 0x10]);
    for (zf, e_taken) in [(true, true), (false, false)] {
        let mut r = regs();
        r.rcx = 5;
        if zf {
            r.rflags |= ZF;
        }
        run(&loope, &mut r, None);
        assert_eq!((r.rcx, r.rip), (4, if e_taken { taken } else { next }));
        let mut r = regs();
        r.rcx = 5;
        if zf {
            r.rflags |= ZF;
        }
        run(&loopne, &mut r, None);
        assert_eq!((r.rcx, r.rip), (4, if e_taken { next } else { taken }));
    }

    let jrcxz = plan(&[0xe3, 0x10]);
    let jecxz = plan(&[0x67, 0xe3, 0x10]);
    for (rcx, rcx_zero, ecx_zero) in [(0, true, true), (1 << 32, false, true), (1, false, false)] {
        let mut r = regs();
        r.rcx = rcx;
        run(&jrcxz, &mut r, None);
        assert_eq!(r.rip, if rcx_zero { taken } else { next });
        assert_eq!(r.rcx, rcx);
        let mut r = regs();
        r.rcx = rcx;
        run(&jecxz, &mut r, None);
        assert_eq!(r.rip, if ecx_zero { PROBE + 0x13 } else { PROBE + 3 });
    }
}

#[test]
fn calls_jumps_returns() {
    let call = plan(&[0xe8, 0x00, 0x10, 0x00, 0x00]);
    let mut r = regs();
    let w = run(&call, &mut r, None).unwrap();
    assert_eq!(r.rip, PROBE + 5 + 0x1000);
    assert_eq!(r.rsp, STACK - 8);
    assert_eq!(
        w,
        MemWrite {
            addr: STACK - 8,
            bytes: (PROBE + 5).to_le_bytes().to_vec()
        }
    );

    let jmp = plan(&[0xeb, 0xfe]);
    let mut r = regs();
    assert!(run(&jmp, &mut r, None).is_none());
    assert_eq!((r.rip, r.rsp), (PROBE, STACK));

    let ret = plan(&[0xc3]);
    let mut r = regs();
    assert!(run(&ret, &mut r, Some((STACK, 0x40_1234))).is_none());
    assert_eq!((r.rip, r.rsp), (0x40_1234, STACK + 8));

    let ret8 = plan(&[0xc2, 0x08, 0x00]);
    let mut r = regs();
    run(&ret8, &mut r, Some((STACK, 0x40_1234)));
    assert_eq!((r.rip, r.rsp), (0x40_1234, STACK + 16));
}

#[test]
fn failed_stack_read_leaves_registers_alone() {
    for bytes in [&[0xc3u8][..], &[0xc9]] {
        let p = plan(bytes);
        let mut r = regs();
        let before = r;
        let mut read = |addr| {
            Err(X86Error::StackRead {
                addr,
                reason: "EFAULT".into(),
            })
        };
        let err = emulate(&emulation(&p), PROBE, p.len, &mut r, &mut read).unwrap_err();
        assert!(matches!(err, X86Error::StackRead { .. }));
        assert_eq!(r, before);
    }
}

#[test]
fn prologue_and_stack_emulations() {
    // push rbp
    let mut r = regs();
    let w = run(&plan(&[0x55]), &mut r, None).unwrap();
    assert_eq!(
        w,
        MemWrite {
            addr: STACK - 8,
            bytes: (STACK + 0x40).to_le_bytes().to_vec()
        }
    );
    assert_eq!((r.rsp, r.rip), (STACK - 8, PROBE + 1));

    // push rsp pushes the value before the decrement.
    let mut r = regs();
    let w = run(&plan(&[0x54]), &mut r, None).unwrap();
    assert_eq!(w.bytes, STACK.to_le_bytes());

    // mov rbp, rsp
    let mut r = regs();
    assert!(run(&plan(&[0x48, 0x89, 0xe5]), &mut r, None).is_none());
    assert_eq!((r.rbp, r.rsp, r.rip), (STACK, STACK, PROBE + 3));

    // endbr64, nop
    let mut r = regs();
    run(&plan(&[0xf3, 0x0f, 0x1e, 0xfa]), &mut r, None);
    assert_eq!(r.rip, PROBE + 4);
    let mut r = regs();
    run(&plan(&[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00]), &mut r, None);
    assert_eq!(r.rip, PROBE + 6);

    // pushfq clears RF and VM in the pushed image.
    let mut r = regs();
    r.rflags = 0x202 | CF | (1 << 16);
    let w = run(&plan(&[0x9c]), &mut r, None).unwrap();
    assert_eq!(w.bytes, (0x202 | CF).to_le_bytes());
    assert_eq!((r.rsp, r.rip), (STACK - 8, PROBE + 1));

    // leave
    let mut r = regs();
    run(
        &plan(&[0xc9]),
        &mut r,
        Some((STACK + 0x40, 0x7ffd_0000_2000)),
    );
    assert_eq!(
        (r.rsp, r.rbp, r.rip),
        (STACK + 0x48, 0x7ffd_0000_2000, PROBE + 1)
    );
}

#[test]
fn step_fixups() {
    // Boosted instruction stepped (post handler): rip back to original space.
    let sub = plan(&[0x48, 0x83, 0xec, 0x18]);
    let mut r = regs();
    r.rip = SLOT + 4;
    assert_eq!(fixup_after_step(&sub, PROBE, SLOT, &mut r), None);
    assert_eq!(r.rip, PROBE + 4);
    // Not completed (rip still at the slot): unchanged.
    let mut r = regs();
    r.rip = SLOT;
    assert_eq!(fixup_after_step(&sub, PROBE, SLOT, &mut r), None);
    assert_eq!(r.rip, SLOT);

    // call rax: rip at the target stays, the return address is fixed.
    let call = plan(&[0xff, 0xd0]);
    assert!(matches!(call.execution, Execution::Step(_)));
    let mut r = regs();
    r.rip = 0x40_1000;
    r.rsp = STACK - 8;
    let w = fixup_after_step(&call, PROBE, SLOT, &mut r).unwrap();
    assert_eq!(
        w,
        MemWrite {
            addr: STACK - 8,
            bytes: (PROBE + 2).to_le_bytes().to_vec()
        }
    );
    assert_eq!(r.rip, 0x40_1000);

    // call [rip+x] relocated: the same.
    let call = plan(&[0xff, 0x15, 0x10, 0x00, 0x00, 0x00]);
    let mut r = regs();
    r.rip = 0x40_1000;
    r.rsp = STACK - 8;
    let w = fixup_after_step(&call, PROBE, SLOT, &mut r).unwrap();
    assert_eq!(w.bytes, (PROBE + 6).to_le_bytes());

    // jmp rax stepped: rip at the target stays.
    let jmp = plan(&[0xff, 0xe0]);
    let mut r = regs();
    r.rip = 0x40_2000;
    assert_eq!(fixup_after_step(&jmp, PROBE, SLOT, &mut r), None);
    assert_eq!(r.rip, 0x40_2000);

    // Emulated plans have no slot: nothing happens.
    let nop = plan(&[0x90]);
    let mut r = regs();
    r.rip = SLOT + 1;
    assert_eq!(fixup_after_step(&nop, PROBE, SLOT, &mut r), None);
    assert_eq!(r.rip, SLOT + 1);
}

#[test]
fn slot_addresses_map_back() {
    let p = plan(&[0x8b, 0x05, 0xe5, 0x2e, 0x00, 0x00]);
    let n = p.slot.as_ref().unwrap().insn_len_in_slot as u64;
    assert_eq!(slot_to_original(&p, PROBE, SLOT, SLOT), Some(PROBE));
    assert_eq!(slot_to_original(&p, PROBE, SLOT, SLOT + 1), None);
    assert_eq!(slot_to_original(&p, PROBE, SLOT, SLOT + n), Some(PROBE + 6));
    assert_eq!(slot_to_original(&p, PROBE, SLOT, SLOT + 0x100), None);
    assert_eq!(slot_to_original(&plan(&[0x90]), PROBE, SLOT, SLOT), None);
}
