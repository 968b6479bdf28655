//! Conditions on a USDT marker's arguments (issue 24): `arg1`..`argN` are
//! its operands with the note's size and signedness, evaluated on the
//! values its capture read at the hit.

use hotprobe::cond::{usdt_cond, usdt_values, CondError};
use hotprobe::symbols::{UsdtArg, UsdtOperand};

fn arg(size: u8, signed: bool) -> UsdtArg {
    UsdtArg {
        size,
        signed,
        operand: UsdtOperand::Register(0),
    }
}

/// Bytes as `hotprobe_dwarf::capture` writes them: tag 0 and a value,
/// tag 2 and an unreadable address, tag 3 for a value not available.
fn captured(values: &[Option<u64>]) -> Vec<u8> {
    let mut out = Vec::new();
    for v in values {
        match v {
            Some(v) => {
                out.push(0);
                out.extend_from_slice(&v.to_le_bytes());
            }
            None => {
                out.push(2);
                out.extend_from_slice(&0x1000u64.to_le_bytes());
            }
        }
    }
    out
}

#[test]
fn arguments_are_one_based_with_their_size_and_sign() {
    // -4@%eax (a signed int in a 64-bit register), 8@..., 1@$42.
    let args = [arg(4, true), arg(8, false), arg(1, false)];
    let c = usdt_cond("arg1 < 0 && arg2 > 5 && arg3 == 42", &args).unwrap();
    // The register's upper half is not the int's: 0xffff_ffff is -1.
    let vals = usdt_values(&captured(&[Some(0x1234_ffff_ffff), Some(6), Some(0x2a)]));
    let vals: Vec<u64> = vals.into_iter().map(Option::unwrap).collect();
    assert!(c.eval(&vals));
    // An unsigned 8-byte value above 2^63 is greater than any constant.
    let c = usdt_cond("arg2 > 9223372036854775807", &args).unwrap();
    assert!(c.eval(&[0, u64::MAX, 0]));
    assert!(!c.eval(&[0, 5, 0]));
    // arg0 and arg4 are none of its arguments.
    for (text, n) in [("arg0 == 1", 0), ("arg4 == 1", 4)] {
        match usdt_cond(text, &args) {
            Err(CondError::NoSuchUsdtArg { n: got, count, .. }) => {
                assert_eq!((got, count), (n, 3));
            }
            other => panic!("{text}: {other:?}"),
        }
    }
    // Parameter names mean nothing on a marker.
    assert!(matches!(
        usdt_cond("len > 1", &args),
        Err(CondError::UnknownName { .. })
    ));
}

#[test]
fn captured_values_decode_and_unreadable_ones_are_none() {
    let data = captured(&[Some(7), None, Some(u64::MAX)]);
    assert_eq!(usdt_values(&data), vec![Some(7), None, Some(u64::MAX)]);
    // A value not available (tag 3), then a value.
    let mut data = vec![3u8, 0];
    data.extend_from_slice(&9u64.to_le_bytes());
    assert_eq!(usdt_values(&data), vec![None, Some(9)]);
    // Truncated or unknown bytes end the values, never a panic.
    assert_eq!(usdt_values(&[0, 1, 2]), vec![]);
    assert_eq!(usdt_values(&[9, 1, 2, 3]), vec![]);
    assert_eq!(usdt_values(&[]), vec![]);
}

/// An argument whose operand the capture does not read (indexed or
/// `%rip`-relative memory, as gcc -O2 emits for an array element) is
/// refused in a condition, naming it: every hit would have gone
/// uncounted in silence (found by review). A plain memory operand is fine.
#[test]
fn an_argument_the_capture_cannot_read_is_refused_in_a_condition() {
    let indexed = UsdtArg {
        size: 8,
        signed: false,
        operand: UsdtOperand::Memory {
            base: Some(7),
            index: Some((9, 8)),
            offset: 16,
            rip_relative: false,
        },
    };
    let based = UsdtArg {
        operand: UsdtOperand::Memory {
            base: Some(7),
            index: None,
            offset: 16,
            rip_relative: false,
        },
        ..indexed.clone()
    };
    let args = [arg(4, true), indexed, based];
    match usdt_cond("arg2 != 0", &args) {
        Err(e @ CondError::BadName { .. }) => {
            assert!(
                e.to_string()
                    .contains("`arg2`: an indexed or %rip-relative"),
                "{e}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(usdt_cond("arg1 > 0 && arg3 != 0", &args).is_ok());
}
