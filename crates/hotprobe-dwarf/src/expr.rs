//! DWARF location expressions whose value is computed at the hit
//! ([`DwarfExpr`], [`crate::Fetch::Expr`]), and the same evaluation at
//! planning time for the expressions that need nothing from the target
//! (`DW_OP_lit1; DW_OP_stack_value`, `DW_OP_implicit_value`): both with
//! gimli's `Evaluation`.
//!
//! At a function's entry (the only place hotprobe evaluates these), an
//! entry value (`DW_OP_entry_value(DW_OP_reg5)`) is the register's value
//! now, and the call frame address is `rsp + 8`.

use crate::value::{Machine, Source};

/// Operations evaluated at most per expression (a `DW_OP_skip` loop in
/// hostile DWARF ends there).
#[cfg(feature = "dwarf")]
const MAX_STEPS: u32 = 1000;

/// A DWARF expression (its bytes and how its unit encodes them) computed
/// against the stopped thread: its value, or `size` bytes at the address
/// it yields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DwarfExpr {
    /// The expression's bytes.
    pub bytes: Vec<u8>,
    /// The unit's address size.
    pub address_size: u8,
    /// The unit's DWARF version.
    pub version: u16,
    /// 64-bit DWARF.
    pub format64: bool,
    /// Bytes read when the expression yields a memory location (1, 2, 4, 8).
    pub size: u8,
}

/// What evaluating an expression without a thread gave.
#[cfg(feature = "dwarf")]
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Folded {
    /// A value known now (`DW_OP_stack_value` of constants,
    /// `DW_OP_implicit_value`), as raw little-endian bits.
    Const(u64),
    /// Needs the thread (a register, memory).
    Runtime,
    /// Cannot be evaluated by hotprobe (an error, pieces, an implicit
    /// pointer, a relocated address, a parameter of the caller).
    No,
}

/// Raw bits of a gimli value (floats as their bit pattern).
#[cfg(feature = "dwarf")]
fn bits(v: gimli::Value) -> u64 {
    match v {
        gimli::Value::Generic(x) | gimli::Value::U64(x) => x,
        gimli::Value::I8(x) => x as u64,
        gimli::Value::U8(x) => u64::from(x),
        gimli::Value::I16(x) => x as u64,
        gimli::Value::U16(x) => u64::from(x),
        gimli::Value::I32(x) => x as u64,
        gimli::Value::U32(x) => u64::from(x),
        gimli::Value::I64(x) => x as u64,
        gimli::Value::F32(x) => u64::from(x.to_bits()),
        gimli::Value::F64(x) => x.to_bits(),
    }
}

/// Little-endian bytes (at most 8) as a u64; `None` when longer.
#[cfg(feature = "dwarf")]
pub(crate) fn le_bits(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 8 {
        return None;
    }
    let mut w = [0u8; 8];
    w[..b.len()].copy_from_slice(b);
    Some(u64::from_le_bytes(w))
}

/// A register's value for the evaluation: general registers by DWARF
/// number, xmm0–15 (17–32) by their low 64 bits.
fn register(m: &mut dyn Machine, n: u16) -> Option<u64> {
    match n {
        0..=15 => m.reg(Source::Dwarf(n)),
        17..=32 => m.reg(Source::Xmm((n - 17) as u8)),
        _ => None,
    }
}

#[cfg(feature = "dwarf")]
impl DwarfExpr {
    fn encoding(&self) -> gimli::Encoding {
        gimli::Encoding {
            address_size: self.address_size,
            format: if self.format64 {
                gimli::Format::Dwarf64
            } else {
                gimli::Format::Dwarf32
            },
            version: self.version,
        }
    }

    /// Evaluates without a thread: a constant, or whether the thread is
    /// needed.
    pub(crate) fn fold(&self) -> Folded {
        let r = gimli::EndianSlice::new(&self.bytes, gimli::LittleEndian);
        let mut e = gimli::Evaluation::new(r, self.encoding());
        e.set_max_iterations(MAX_STEPS);
        match e.evaluate() {
            Ok(gimli::EvaluationResult::Complete) => {}
            Ok(
                gimli::EvaluationResult::RequiresRegister { .. }
                | gimli::EvaluationResult::RequiresMemory { .. }
                | gimli::EvaluationResult::RequiresEntryValue(_)
                | gimli::EvaluationResult::RequiresCallFrameCfa,
            ) => return Folded::Runtime,
            _ => return Folded::No,
        }
        match single(e.result()) {
            Some(gimli::Location::Value { value }) => Folded::Const(bits(value)),
            Some(gimli::Location::Bytes { value }) => {
                le_bits(value.slice()).map_or(Folded::No, Folded::Const)
            }
            // A register or memory location the evaluation needed nothing
            // for (cannot happen without a register): computed at the hit.
            Some(gimli::Location::Register { .. } | gimli::Location::Address { .. }) => {
                Folded::Runtime
            }
            _ => Folded::No,
        }
    }

    /// The value at the hit; `Err(Some(addr))` for unreadable memory,
    /// `Err(None)` when it cannot be computed.
    pub(crate) fn value(&self, m: &mut dyn Machine) -> Result<u64, Option<u64>> {
        self.value_depth(m, 0)
    }

    fn value_depth(&self, m: &mut dyn Machine, depth: u32) -> Result<u64, Option<u64>> {
        let r = gimli::EndianSlice::new(&self.bytes, gimli::LittleEndian);
        let mut e = gimli::Evaluation::new(r, self.encoding());
        e.set_max_iterations(MAX_STEPS);
        let mut step = e.evaluate();
        loop {
            use gimli::EvaluationResult as E;
            step = match step.map_err(|_| None)? {
                E::Complete => break,
                E::RequiresRegister { register: reg, .. } => {
                    let v = register(m, reg.0).ok_or(None)?;
                    e.resume_with_register(gimli::Value::Generic(v))
                }
                E::RequiresMemory { address, size, .. } => {
                    let n = usize::from(size).clamp(1, 8);
                    let mut b = [0u8; 8];
                    if !m.read(address, &mut b[..n]) {
                        return Err(Some(address));
                    }
                    e.resume_with_memory(gimli::Value::Generic(u64::from_le_bytes(b)))
                }
                E::RequiresCallFrameCfa => {
                    let rsp = register(m, 7).ok_or(None)?;
                    e.resume_with_call_frame_cfa(rsp.wrapping_add(8))
                }
                // At the entry, a value at the entry is the value now.
                E::RequiresEntryValue(inner) if depth == 0 => {
                    let sub = DwarfExpr {
                        bytes: inner.0.slice().to_vec(),
                        size: 8,
                        ..self.clone()
                    };
                    let v = sub.value_depth(m, depth + 1)?;
                    e.resume_with_entry_value(gimli::Value::Generic(v))
                }
                _ => return Err(None),
            };
        }
        match single(e.result()).ok_or(None)? {
            gimli::Location::Value { value } => Ok(bits(value)),
            gimli::Location::Bytes { value } => le_bits(value.slice()).ok_or(None),
            gimli::Location::Register { register: reg } => register(m, reg.0).ok_or(None),
            gimli::Location::Address { address } => {
                let n = usize::from(self.size).clamp(1, 8);
                let mut b = [0u8; 8];
                if !m.read(address, &mut b[..n]) {
                    return Err(Some(address));
                }
                Ok(u64::from_le_bytes(b))
            }
            _ => Err(None),
        }
    }
}

#[cfg(not(feature = "dwarf"))]
impl DwarfExpr {
    /// Without DWARF support nothing is computed.
    pub(crate) fn value(&self, m: &mut dyn Machine) -> Result<u64, Option<u64>> {
        let _ = (m, register);
        Err(None)
    }
}

/// The one location of a result that is not split into pieces.
#[cfg(feature = "dwarf")]
fn single<R: gimli::Reader>(pieces: Vec<gimli::Piece<R>>) -> Option<gimli::Location<R>> {
    let mut it = pieces.into_iter();
    let p = it.next()?;
    if it.next().is_some() || p.bit_offset.is_some_and(|o| o != 0) {
        return None;
    }
    Some(p.location)
}

#[cfg(all(test, feature = "dwarf"))]
mod tests {
    use super::*;

    fn expr(bytes: &[u8]) -> DwarfExpr {
        DwarfExpr {
            bytes: bytes.to_vec(),
            address_size: 8,
            version: 5,
            format64: false,
            size: 4,
        }
    }

    struct Regs;
    impl Machine for Regs {
        fn reg(&mut self, s: Source) -> Option<u64> {
            match s {
                Source::Dwarf(4) => Some(0xffff_ffff_0000_0001),
                Source::Dwarf(5) => Some(40),
                Source::Dwarf(7) => Some(0x1000),
                Source::Xmm(0) => Some(2.5f64.to_bits()),
                _ => None,
            }
        }
        fn read(&mut self, addr: u64, buf: &mut [u8]) -> bool {
            if addr != 0x1008 {
                return false;
            }
            buf.copy_from_slice(&7u64.to_le_bytes()[..buf.len()]);
            true
        }
    }

    #[test]
    fn constants_fold_and_registers_wait_for_the_hit() {
        use gimli::constants::*;
        // DW_OP_lit1; DW_OP_stack_value
        assert_eq!(
            expr(&[DW_OP_lit1.0, DW_OP_stack_value.0]).fold(),
            Folded::Const(1)
        );
        // DW_OP_constu 300; DW_OP_stack_value
        assert_eq!(
            expr(&[DW_OP_constu.0, 0xac, 0x02, DW_OP_stack_value.0]).fold(),
            Folded::Const(300)
        );
        // DW_OP_implicit_value 8 bytes of 2.5
        let mut iv = vec![DW_OP_implicit_value.0, 8];
        iv.extend(2.5f64.to_bits().to_le_bytes());
        assert_eq!(expr(&iv).fold(), Folded::Const(2.5f64.to_bits()));
        // DW_OP_breg4 0; DW_OP_constu 0xffffffff; DW_OP_and; DW_OP_lit1;
        // DW_OP_and; DW_OP_stack_value (rustc's bool in rsi)
        let b = [
            DW_OP_breg4.0,
            0,
            DW_OP_constu.0,
            0xff,
            0xff,
            0xff,
            0xff,
            0x0f,
            DW_OP_and.0,
            DW_OP_lit1.0,
            DW_OP_and.0,
            DW_OP_stack_value.0,
        ];
        assert_eq!(expr(&b).fold(), Folded::Runtime);
        assert_eq!(expr(&b).value(&mut Regs), Ok(1));
        // DW_OP_breg5 +2; DW_OP_stack_value: rdi + 2.
        let e = expr(&[DW_OP_breg5.0, 2, DW_OP_stack_value.0]);
        assert_eq!(e.value(&mut Regs), Ok(42));
        // DW_OP_entry_value(DW_OP_reg5); DW_OP_stack_value: rdi at the entry.
        let e = expr(&[DW_OP_entry_value.0, 1, DW_OP_reg5.0, DW_OP_stack_value.0]);
        assert_eq!(e.value(&mut Regs), Ok(40));
        // DW_OP_breg7 +8: memory at rsp + 8 (4 bytes).
        let e = expr(&[DW_OP_breg7.0, 8]);
        assert_eq!(e.value(&mut Regs), Ok(7));
        let e = expr(&[DW_OP_breg7.0, 16]);
        assert_eq!(e.value(&mut Regs), Err(Some(0x1010)));
        // A register it has no value for, garbage, an endless loop.
        assert_eq!(
            expr(&[DW_OP_breg3.0, 0, DW_OP_stack_value.0]).value(&mut Regs),
            Err(None)
        );
        assert_eq!(expr(&[0xff, 0xff]).fold(), Folded::No);
        assert_eq!(expr(&[DW_OP_skip.0, 0xfd, 0xff]).fold(), Folded::No);
        assert_eq!(
            expr(&[DW_OP_skip.0, 0xfd, 0xff]).value(&mut Regs),
            Err(None)
        );
    }
}
