//! The stack walk over compiled unwind rows (`hotprobe_abi::stacks::walk`),
//! on a synthetic stack: CFI frames, a frame-pointer frame, a swapped
//! return address mapped back, the depth limit and unreadable words.

use std::collections::HashMap;

use hotprobe_abi::stacks::*;

fn row(pc: u64, cfa_reg: u8, cfa_off: i32, rbp_rule: u8, rbp_off: i16) -> StackRow {
    StackRow {
        pc,
        cfa_off,
        rbp_off,
        cfa_reg,
        rbp_rule,
    }
}

/// Functions: A [0x1000, 0x1100) CFA rsp+32 past 0x1010; B [0x2000,
/// 0x2100) with rbp frame (CFA rbp+16, rbp at CFA-16) past 0x2008; C
/// (0x3000..) has no CFI (frame pointers); D [0x4000, 0x4100) is the
/// outermost (return address undefined).
fn rows() -> Vec<StackRow> {
    vec![
        row(0x1000, CFA_RSP, 8, RBP_SAME, 0),
        row(0x1010, CFA_RSP, 32, RBP_SAME, 0),
        row(0x1100, CFA_NONE, 0, 0, 0),
        row(0x2000, CFA_RSP, 8, RBP_SAME, 0),
        row(0x2001, CFA_RSP, 16, RBP_AT, -16),
        row(0x2008, CFA_RBP, 16, RBP_AT, -16),
        row(0x2100, CFA_NONE, 0, 0, 0),
        row(0x4000, CFA_END, 0, 0, 0),
        row(0x4100, CFA_NONE, 0, 0, 0),
        row(0x5000, CFA_STOP, 0, 0, 0),
    ]
}

const TRAMP: u64 = 0xdead_0000;

/// The stack (word address → value), from the hit at the first
/// instruction of a leaf called from A+0x20, which B+0x30 called, which C
/// (frame pointers) called from 0x3040, itself called by D at 0x4050.
fn stack() -> (HashMap<u64, u64>, WalkStart) {
    let mut m = HashMap::new();
    // Leaf entry: rsp = 0x7000, [0x7000] = 0x1020 (return into A).
    // A's frame: CFA = 0x7008 + 32 = 0x7028; ra at 0x7020 → B+0x30
    // (swapped for the trampoline; the real one is mapped back).
    m.insert(0x7020, TRAMP);
    // B's frame: CFA = rbp + 16, rbp = 0x7050 → CFA 0x7060, ra at 0x7058
    // → C at 0x3040, caller's rbp at 0x7050 = 0x7080.
    m.insert(0x7050, 0x7080);
    m.insert(0x7058, 0x3040);
    // C (no CFI): [rbp] = 0x70a0 (D's rbp), [rbp+8] = 0x4050.
    m.insert(0x7080, 0x70a0);
    m.insert(0x7088, 0x4050);
    (
        m,
        WalkStart {
            ret: 0x1020,
            rsp: 0x7008,
            rbp: 0x7050,
        },
    )
}

#[test]
fn walks_cfi_frame_pointers_and_trampoline() {
    let (m, start) = stack();
    let mut out = [0u64; 8];
    let end = walk(
        |pc| find_row(&rows(), pc).copied(),
        start,
        |a| m.get(&a).copied(),
        |slot, w| match w {
            TRAMP if slot == 0x7020 => Some(0x2030),
            TRAMP => None,
            w => Some(w),
        },
        &mut out,
    );
    assert_eq!(
        end,
        WalkEnd {
            depth: 4,
            truncated: false
        }
    );
    assert_eq!(&out[..4], &[0x1020, 0x2030, 0x3040, 0x4050]);
}

#[test]
fn depth_limit_and_unreadable_words_truncate() {
    let (m, start) = stack();
    let mut out = [0u64; 2];
    let end = walk(
        |pc| find_row(&rows(), pc).copied(),
        start,
        |a| m.get(&a).copied(),
        |_, w| Some(if w == TRAMP { 0x2030 } else { w }),
        &mut out,
    );
    assert_eq!(
        end,
        WalkEnd {
            depth: 2,
            truncated: true
        }
    );
    // The frame-pointer frame's word is not readable.
    let mut out = [0u64; 8];
    let end = walk(
        |pc| find_row(&rows(), pc).copied(),
        start,
        |a| {
            if a == 0x7080 {
                None
            } else {
                m.get(&a).copied()
            }
        },
        |_, w| Some(if w == TRAMP { 0x2030 } else { w }),
        &mut out,
    );
    assert_eq!(
        end,
        WalkEnd {
            depth: 3,
            truncated: true
        }
    );
    // An unknown trampoline slot stops the walk.
    let end = walk(
        |pc| find_row(&rows(), pc).copied(),
        start,
        |a| m.get(&a).copied(),
        |_, w| (w != TRAMP).then_some(w),
        &mut out,
    );
    assert_eq!(
        end,
        WalkEnd {
            depth: 1,
            truncated: true
        }
    );
    // A stop row stops it.
    let start = WalkStart {
        ret: 0x5010,
        ..start
    };
    let end = walk(
        |pc| find_row(&rows(), pc).copied(),
        start,
        |a| m.get(&a).copied(),
        |_, w| Some(w),
        &mut out,
    );
    assert_eq!(
        end,
        WalkEnd {
            depth: 1,
            truncated: true
        }
    );
}

#[test]
fn a_frame_below_the_stack_pointer_stops() {
    // rbp below rsp in a frame-pointer frame: garbage, not followed.
    let start = WalkStart {
        ret: 0x3040,
        rsp: 0x7000,
        rbp: 0x6000,
    };
    let mut out = [0u64; 8];
    let end = walk(
        |pc| find_row(&rows(), pc).copied(),
        start,
        |_| Some(0x1234),
        |_, w| Some(w),
        &mut out,
    );
    assert_eq!(
        end,
        WalkEnd {
            depth: 1,
            truncated: true
        }
    );
}

/// A zeroed, 64-byte aligned buffer.
fn region(len: usize) -> Vec<u64> {
    vec![0u64; len / 8]
}

#[test]
fn stacks_region_publish_add_and_read_back() {
    let p = StacksParams {
        table_slots: 16,
        rows_capacity: 100,
        regions_capacity: 4,
    };
    let len = stacks_size(p).unwrap();
    let mut buf = region(len + 64);
    let base = buf.as_mut_ptr() as usize;
    let ptr = ((base + 63) & !63) as *mut u8;
    // SAFETY: `len` bytes of `buf` from `ptr`, alive for the test.
    let view = unsafe { StacksView::create(ptr, len, p) }.unwrap();
    // SAFETY: as above.
    assert!(unsafe { StacksView::attach(ptr, len - 1) }.is_err());
    let rows = rows();
    let regions = [ReadableRegion {
        start: 0x7000,
        end: 0x8000,
    }];
    // SAFETY: the only writer.
    assert!(unsafe { view.publish(&rows, &regions) });
    assert_eq!(view.ctl().seq.load(std::sync::atomic::Ordering::Relaxed), 2);
    assert_eq!(view.rows(), &rows[..]);
    assert_eq!(view.regions(), &regions[..]);
    // SAFETY: as above. Too many rows: refused, nothing changed.
    assert!(!unsafe { view.publish(&vec![StackRow::default(); 101], &regions) });
    assert_eq!(view.rows().len(), rows.len());
    for _ in 0..3 {
        assert!(view.add(7, &[1, 2, 3], false));
    }
    assert!(view.add(7, &[1, 2], true));
    assert!(view.add(8, &[1, 2, 3], false));
    let mut seen = Vec::new();
    view.for_each(|probe, frames, truncated, count| {
        seen.push((probe, frames.to_vec(), truncated, count))
    });
    seen.sort();
    assert_eq!(
        seen,
        vec![
            (7, vec![1, 2], true, 1),
            (7, vec![1, 2, 3], false, 3),
            (8, vec![1, 2, 3], false, 1)
        ]
    );
    // A stack's id names it for good: the same stack, the same id.
    let id = view.add_with_id(7, &[1, 2], true).unwrap();
    assert_eq!(view.add_with_id(7, &[1, 2], true), Some(id));
    assert_ne!(view.add_with_id(8, &[1, 2, 3], false), Some(id));
    let mut got = None;
    assert!(view.with_stack(id, |p, f, t| got = Some((p, f.to_vec(), t))));
    assert_eq!(got, Some((7, vec![1, 2], true)));
    assert!(!view.with_stack(0, |_, _, _| ()));
    assert!(!view.with_stack(u32::MAX, |_, _, _| ()));
    // A full table counts what it cannot store.
    for i in 0..40u64 {
        view.add(9, &[i], false);
    }
    assert_eq!(
        view.ctl()
            .table_full
            .load(std::sync::atomic::Ordering::Relaxed),
        40 + 3 - 16
    );
}
