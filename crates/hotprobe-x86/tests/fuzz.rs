//! Bounded fuzz passes (hotprobe-fuzzcheck): `data_access` (the instruction
//! a watchpoint trapped after) never panics on arbitrary code, registers
//! and addresses; nor does the jump planner on arbitrary function bytes
//! and padding. The longer run is the cargo-fuzz target `data_access` in
//! `fuzz/` (docs/FUZZING.md).

#[path = "fuzz/exercise.rs"]
mod exercise;

use hotprobe_fuzzcheck::Fuzz;

/// An input: start, base register, watched address, length selector, code.
fn input(start: u64, base: u64, addr: u64, len_sel: u8, code: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    v.extend_from_slice(&start.to_le_bytes());
    v.extend_from_slice(&base.to_le_bytes());
    v.extend_from_slice(&addr.to_le_bytes());
    v.push(len_sel);
    v.extend_from_slice(code);
    v
}

#[test]
fn fuzz_data_access() {
    let start = 0x40_0000u64;
    // nop; mov eax, 7; mov [rip+0x1000], eax
    let store = [0x90, 0xb8, 7, 0, 0, 0, 0x89, 0x05, 0, 0x10, 0, 0];
    // add dword [rip+0x10], 1
    let rmw = [0x83, 0x05, 0x10, 0, 0, 0, 0x01];
    // push rbp; mov rbp, rsp; mov [rbx+8], rax; mov qword [rbx], -1
    let frame = [
        0x55, 0x48, 0x89, 0xe5, 0x48, 0x89, 0x43, 0x08, 0x48, 0xc7, 0x03, 0xff, 0xff, 0xff, 0xff,
    ];
    let report = Fuzz::new("data_access")
        .seed(input(start, 0, start + 12 + 0x1000, 2, &store))
        .seed(input(start, 0, start + 7 + 0x10, 2, &rmw))
        .seed(input(start, 0x5000, 0x5000, 3, &frame))
        .seed(input(u64::MAX - 4, u64::MAX, u64::MAX - 3, 3, &rmw))
        .tokens([
            &[0x48u8][..],
            &[0x89, 0x05],
            &[0xc7, 0x03],
            &[0x0f, 0x05],
            &[0xf3, 0xab],
            &[0xff; 8],
        ])
        .iterations(30_000)
        .run(exercise::data_access_input);
    assert!(report.accepted > 0, "no input found an access: {report:?}");
}

#[test]
fn fuzz_plan_jump() {
    let seed = |len: u8, code: &[u8]| {
        let mut v = vec![len];
        v.extend_from_slice(code);
        v
    };
    let report = Fuzz::new("plan_jump")
        // lea eax, [rdi+1]; ret; nop padding.
        .seed(seed(
            4,
            &[0x8d, 0x47, 0x01, 0xc3, 0x0f, 0x1f, 0x44, 0x00, 0x00],
        ))
        // ret; int3 padding.
        .seed(seed(1, &[0xc3, 0xcc, 0xcc, 0xcc, 0xcc, 0xcc]))
        // push rbp; mov rbp, rsp; call rel32; pop rbp; ret.
        .seed(seed(
            10,
            &[0x55, 0x48, 0x89, 0xe5, 0xe8, 0, 0, 0, 0, 0x5d, 0xc3],
        ))
        // sub rsp, 8; jmp rel8 over padding; ret.
        .seed(seed(8, &[0x48, 0x83, 0xec, 0x08, 0xeb, 0x01, 0x90, 0xc3]))
        .tokens([
            &[0xc3u8][..],
            &[0xcc],
            &[0x90],
            &[0xe8],
            &[0xe9],
            &[0x0f, 0x1f],
        ])
        .iterations(30_000)
        .run(exercise::plan_jump_input);
    assert!(report.accepted > 0, "no input made a plan: {report:?}");
}
