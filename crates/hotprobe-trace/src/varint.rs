//! LEB128 varints and zigzag (the stream's integer encodings).

/// Appends `v` as an unsigned LEB128 varint (1–10 bytes).
#[inline]
pub fn put_uvarint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Number of bytes [`put_uvarint`] writes for `v`.
#[inline]
pub fn uvarint_len(v: u64) -> usize {
    let bits = 64 - (v | 1).leading_zeros() as usize;
    bits.div_ceil(7)
}

/// Zigzag-maps a signed value so that small magnitudes give small varints.
#[inline]
pub fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

/// Inverse of [`zigzag`].
#[inline]
pub fn unzigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

/// Why a varint could not be decoded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VarintError {
    /// Input ended inside the varint.
    Truncated,
    /// More than 64 bits (or more than 10 bytes).
    Overflow,
}

/// Decodes an unsigned LEB128 varint from the front of `buf`: the value and
/// the number of bytes used.
#[inline]
pub fn get_uvarint(buf: &[u8]) -> Result<(u64, usize), VarintError> {
    let mut v = 0u64;
    for (i, &b) in buf.iter().enumerate() {
        if i == 9 && b > 1 {
            return Err(VarintError::Overflow);
        }
        v |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Ok((v, i + 1));
        }
        if i == 9 {
            return Err(VarintError::Overflow);
        }
    }
    Err(VarintError::Truncated)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        for &v in &[
            0u64,
            1,
            127,
            128,
            300,
            16383,
            16384,
            u32::MAX as u64,
            u64::MAX,
        ] {
            let mut b = Vec::new();
            put_uvarint(&mut b, v);
            assert_eq!(b.len(), uvarint_len(v));
            assert_eq!(get_uvarint(&b), Ok((v, b.len())));
            assert_eq!(get_uvarint(&b[..b.len() - 1]), Err(VarintError::Truncated));
        }
        for &v in &[0i64, -1, 1, i64::MIN, i64::MAX, -64, 63] {
            assert_eq!(unzigzag(zigzag(v)), v);
        }
        assert_eq!(zigzag(-1), 1);
        assert_eq!(get_uvarint(&[0xff; 11]), Err(VarintError::Overflow));
        assert_eq!(
            get_uvarint(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02]),
            Err(VarintError::Overflow)
        );
    }
}
