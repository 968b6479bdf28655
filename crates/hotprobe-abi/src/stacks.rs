//! Stack capture: the compiled unwind table the tracer publishes and the
//! walk both sides run over it (the agent at a fast-path hit, the tracer
//! with `process_vm_readv` at a trap).
//!
//! The tracer compiles each mapped module's `.eh_frame` into [`StackRow`]s
//! (one sorted array over every module, absolute addresses): a row holds
//! from its `pc` up to the next row's. Each row says where the canonical
//! frame address (CFA) is — `rsp + off` or `rbp + off` — and where the
//! caller's `rbp` was saved (`CFA + off`, or not at all); the return
//! address is at `CFA - 8` (x86-64: what `call` pushed). A row whose rule
//! cannot be expressed that way is [`CFA_STOP`]; the gaps between
//! functions with CFI are [`CFA_NONE`] rows, where the walk follows the
//! frame-pointer chain (`rbp`) instead; a row whose return address is
//! undefined (`_start`, a thread's first frame) is [`CFA_END`], the
//! stack's clean end.
//!
//! [`walk`] never dereferences anything itself: it asks a reader for each
//! word, and the reader decides what may be read (the agent: only its
//! thread's stack, between the hit's `rsp` and the end of the published
//! region holding it).

/// [`StackRow::cfa_reg`]: CFA = `rsp + cfa_off`.
pub const CFA_RSP: u8 = 0;
/// [`StackRow::cfa_reg`]: CFA = `rbp + cfa_off`.
pub const CFA_RBP: u8 = 1;
/// [`StackRow::cfa_reg`]: no CFI covers this address; follow the frame
/// pointer (`[rbp]` the caller's `rbp`, `[rbp+8]` the return address).
pub const CFA_NONE: u8 = 2;
/// [`StackRow::cfa_reg`]: CFI covers this address with a rule the table
/// cannot express (a CFA expression, another base register, a return
/// address elsewhere than `CFA - 8`): the walk stops here, truncated.
pub const CFA_STOP: u8 = 3;
/// [`StackRow::cfa_reg`]: the return address is undefined here (the
/// outermost frame): the walk ends, complete.
pub const CFA_END: u8 = 4;

/// [`StackRow::rbp_rule`]: the caller's `rbp` is this frame's (not saved).
pub const RBP_SAME: u8 = 0;
/// [`StackRow::rbp_rule`]: the caller's `rbp` is saved at `CFA + rbp_off`.
pub const RBP_AT: u8 = 1;

/// One row of the compiled unwind table (16 bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackRow {
    /// First address (run time) the row covers; it holds up to the next row.
    pub pc: u64,
    /// Offset added to the CFA's base register.
    pub cfa_off: i32,
    /// With [`RBP_AT`]: the caller's `rbp` is at `CFA + rbp_off`.
    pub rbp_off: i16,
    /// `CFA_*`.
    pub cfa_reg: u8,
    /// `RBP_*`.
    pub rbp_rule: u8,
}
const _: () = assert!(core::mem::size_of::<StackRow>() == 16);

/// The row covering `pc` in `rows` (sorted by `pc`), if any.
#[inline]
pub fn find_row(rows: &[StackRow], pc: u64) -> Option<&StackRow> {
    let i = rows.partition_point(|r| r.pc <= pc);
    rows.get(i.checked_sub(1)?)
}

/// Registers at the frame a walk starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkStart {
    /// The first return address (the caller of the probed function: the
    /// word at `rsp` at a function's first instruction).
    pub ret: u64,
    /// `rsp` right after that return address was popped (the caller's
    /// stack pointer after its `call` returns).
    pub rsp: u64,
    /// `rbp` at the hit (unchanged at a function's first instruction).
    pub rbp: u64,
}

/// How a walk ended.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WalkEnd {
    /// Frames written into the output.
    pub depth: usize,
    /// True when the stack goes on past the last frame written: the depth
    /// limit was reached, a word could not be read, a rule could not be
    /// followed ([`CFA_STOP`]) or the stack pointer did not move up.
    pub truncated: bool,
}

/// Walks the stack from `start`, writing return addresses into `out`
/// (`out[0]` = `start.ret`) until the outermost frame, the end of `out`,
/// or a frame it cannot unwind (then `truncated`).
///
/// `read(addr)` returns the 8-byte word at `addr`, or `None` where it may
/// not be read. `fix(slot, word)` maps a return address read at `slot`
/// back to the real one when the agent swapped it for its return
/// trampoline (identity otherwise; `None`: unknown, the walk stops
/// truncated). No allocation, no panic, no recursion.
pub fn walk(
    rows: &[StackRow],
    start: WalkStart,
    mut read: impl FnMut(u64) -> Option<u64>,
    mut fix: impl FnMut(u64, u64) -> Option<u64>,
    out: &mut [u64],
) -> WalkEnd {
    let mut pc = start.ret;
    let mut rsp = start.rsp;
    let mut rbp = start.rbp;
    let mut depth = 0;
    loop {
        if pc == 0 {
            return WalkEnd {
                depth,
                truncated: false,
            };
        }
        let Some(slot) = out.get_mut(depth) else {
            return WalkEnd {
                depth,
                truncated: true,
            };
        };
        *slot = pc;
        depth += 1;
        // A return address points after its call: the call's own row is
        // the one covering pc - 1.
        let row = find_row(rows, pc.wrapping_sub(1))
            .copied()
            .unwrap_or(StackRow {
                cfa_reg: CFA_NONE,
                ..StackRow::default()
            });
        let (cfa, caller_rbp) = match row.cfa_reg {
            CFA_RSP | CFA_RBP => {
                let base = if row.cfa_reg == CFA_RSP { rsp } else { rbp };
                let cfa = base.wrapping_add(row.cfa_off as i64 as u64);
                let caller_rbp = if row.rbp_rule == RBP_AT {
                    match read(cfa.wrapping_add(row.rbp_off as i64 as u64)) {
                        Some(v) => v,
                        None => {
                            return WalkEnd {
                                depth,
                                truncated: true,
                            }
                        }
                    }
                } else {
                    rbp
                };
                (cfa, caller_rbp)
            }
            CFA_NONE => {
                // Frame pointers: [rbp] = caller's rbp, [rbp+8] = return
                // address; the frame must lie above the stack pointer.
                if rbp < rsp {
                    return WalkEnd {
                        depth,
                        truncated: true,
                    };
                }
                match read(rbp) {
                    Some(v) => (rbp.wrapping_add(16), v),
                    None => {
                        return WalkEnd {
                            depth,
                            truncated: true,
                        }
                    }
                }
            }
            CFA_END => {
                return WalkEnd {
                    depth,
                    truncated: false,
                }
            }
            _ => {
                return WalkEnd {
                    depth,
                    truncated: true,
                }
            }
        };
        // The stack grows down: a caller's frame is above its callee's.
        if cfa <= rsp {
            return WalkEnd {
                depth,
                truncated: true,
            };
        }
        let ra_slot = cfa.wrapping_sub(8);
        let Some(word) = read(ra_slot) else {
            return WalkEnd {
                depth,
                truncated: true,
            };
        };
        let Some(ret) = fix(ra_slot, word) else {
            return WalkEnd {
                depth,
                truncated: true,
            };
        };
        pc = ret;
        rsp = cfa;
        rbp = caller_rbp;
    }
}
