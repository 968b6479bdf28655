//! Fuzz target: `plan_probe`, and everything a plan leads to, never panics
//! and keeps its invariants on arbitrary bytes and addresses.
#![no_main]

use hotprobe_x86::{
    emulate, fixup_after_step, instruction_starts, plan_probe, slot_to_original, Execution,
    Registers, X86Error, MAX_INSN_LEN, SLOT_SIZE,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 16 {
        return;
    }
    let probe = u64::from_le_bytes(data[0..8].try_into().unwrap());
    let slot_word = u64::from_le_bytes(data[8..16].try_into().unwrap());
    // Mostly slots near the probe, sometimes anywhere.
    let slot = if slot_word & 1 == 0 {
        probe.wrapping_add((slot_word as i64 >> 33) as u64)
    } else {
        slot_word
    };
    let code = &data[16..];
    let _ = instruction_starts(code, probe);
    let code = &code[..code.len().min(MAX_INSN_LEN)];
    let Ok(plan) = plan_probe(code, probe, slot) else {
        return;
    };
    assert!(plan.len >= 1 && plan.len <= code.len());
    let mut regs = Registers {
        rip: probe,
        rsp: slot_word,
        rbp: probe,
        rcx: slot_word.rotate_left(7),
        rflags: slot_word & 0x8d5,
        ..Registers::default()
    };
    match plan.execution {
        Execution::Emulate(e) => {
            assert!(plan.slot.is_none());
            let mut read = |addr: u64| -> Result<u64, X86Error> {
                if addr & 7 == 0 {
                    Ok(addr ^ probe)
                } else {
                    Err(X86Error::StackRead {
                        addr,
                        reason: "odd".into(),
                    })
                }
            };
            let _ = emulate(&e, probe, plan.len, &mut regs, &mut read);
        }
        Execution::Boost | Execution::Step(_) => {
            let image = plan.slot.as_ref().expect("slot for out-of-line execution");
            assert_eq!(image.bytes.len(), SLOT_SIZE);
            assert!(image.insn_len_in_slot <= MAX_INSN_LEN);
            let back = hotprobe_x86::decode(&image.bytes, slot).expect("slot decodes");
            assert_eq!(back, plan.instruction);
            regs.rip = slot.wrapping_add(image.insn_len_in_slot as u64);
            let _ = fixup_after_step(&plan, probe, slot, &mut regs);
            assert_eq!(regs.rip, probe.wrapping_add(plan.len as u64));
            let _ = slot_to_original(&plan, probe, slot, slot_word);
        }
    }
});
