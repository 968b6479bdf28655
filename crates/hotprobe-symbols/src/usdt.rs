//! USDT (SystemTap SDT) markers: the `.note.stapsdt` notes that
//! `<sys/sdt.h>` compiles into a binary (python3, libstdc++, PostgreSQL,
//! Node, …). Each note names a provider and a probe, the address of the
//! marker's instruction (usually a 1-byte `nop`), an optional semaphore (a
//! 16-bit counter the program checks before it computes the arguments:
//! incremented while a tracer is attached) and the arguments as operand
//! specs in AT&T syntax: `-4@%edi`, `8@-8(%rbp)`, `4@$5`,
//! `8@8(%rax,%rdx,4)`.
//!
//! The note's addresses are link-time addresses as the linker placed them
//! relative to `.stapsdt.base`; when prelink or a later link moved that
//! section, the difference is added (as `sdt.h` documents).
//!
//! Notes come from the file, so they are untrusted input: anything
//! malformed is an error ([`UsdtError`]) or a skipped note, never a panic.

use object::{Object, ObjectSection};

/// The note type of a SystemTap SDT v3 note (`NT_STAPSDT`).
const NT_STAPSDT: u32 = 3;

/// At most this many arguments per marker (sdt.h allows 12).
pub const MAX_USDT_ARGS: usize = 12;

/// One USDT marker of an ELF file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsdtMarker {
    /// The provider (`python`, `libstdcxx`).
    pub provider: String,
    /// The probe's name (`gc__start`, `throw`).
    pub name: String,
    /// The marker instruction's link-time address.
    pub addr: u64,
    /// The semaphore's link-time address, when the marker has one.
    pub semaphore: Option<u64>,
    /// The arguments, in order.
    pub args: Vec<UsdtArg>,
    /// The arguments as the note writes them (`-4@%edi 8@-8(%rbp)`).
    pub args_text: String,
}

/// One argument of a USDT marker: its size and signedness, and where it is
/// at the marker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UsdtArg {
    /// Its size in bytes (1, 2, 4 or 8).
    pub size: u8,
    /// Whether it is signed (a negative size in the spec).
    pub signed: bool,
    /// Where it is.
    pub operand: UsdtOperand,
}

/// Where a USDT argument is at the marker.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UsdtOperand {
    /// In a register (its DWARF number, x86-64).
    Register(u16),
    /// In memory at `base + index * scale + offset` (registers as DWARF
    /// numbers; `base` absent for an absolute or `%rip`-less address).
    Memory {
        /// The base register.
        base: Option<u16>,
        /// The index register and its scale.
        index: Option<(u16, u8)>,
        /// The displacement.
        offset: i64,
        /// Whether the base is `%rip` (the offset is then relative to the
        /// next instruction: not supported by the readers yet, said so).
        rip_relative: bool,
    },
    /// A constant.
    Constant(i64),
}

/// Why USDT notes could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum UsdtError {
    /// The file is not an ELF file `object` reads.
    #[error("not an ELF file: {0}")]
    NotElf(String),
    /// A note is cut short.
    #[error("a stapsdt note is cut short ({0} bytes)")]
    Truncated(usize),
    /// An argument spec is not `SIZE@OPERAND` as sdt.h writes it.
    #[error("bad USDT argument spec {0:?}")]
    BadArgument(String),
}

/// Every USDT marker in the ELF file `bytes` (none when it has no
/// `.note.stapsdt`). A note that is cut short is an error; one whose
/// argument string cannot be parsed is kept with the arguments it could
/// read up to there dropped and [`UsdtError::BadArgument`] returned only
/// when every note failed.
pub fn usdt_markers(bytes: &[u8]) -> Result<Vec<UsdtMarker>, UsdtError> {
    let file = object::File::parse(bytes).map_err(|e| UsdtError::NotElf(e.to_string()))?;
    let Some(section) = file.section_by_name(".note.stapsdt") else {
        return Ok(Vec::new());
    };
    let data = section
        .data()
        .map_err(|e| UsdtError::NotElf(e.to_string()))?;
    let base_now = file.section_by_name(".stapsdt.base").map(|s| s.address());
    let mut out = Vec::new();
    let mut first_error = None;
    let mut at = 0usize;
    while at + 12 <= data.len() {
        let u32_at = |o: usize| u32::from_le_bytes(data[o..o + 4].try_into().unwrap_or([0; 4]));
        let (namesz, descsz, kind) = (u32_at(at) as usize, u32_at(at + 4) as usize, u32_at(at + 8));
        let name_start = at + 12;
        let desc_start = name_start
            .checked_add(align4(namesz))
            .ok_or(UsdtError::Truncated(data.len()))?;
        let end = desc_start
            .checked_add(align4(descsz))
            .ok_or(UsdtError::Truncated(data.len()))?;
        if end > data.len() || desc_start + descsz > data.len() {
            return Err(UsdtError::Truncated(data.len()));
        }
        let owner = &data[name_start..name_start + namesz];
        if kind == NT_STAPSDT && owner.strip_suffix(b"\0").unwrap_or(owner) == b"stapsdt" {
            match marker(&data[desc_start..desc_start + descsz], base_now) {
                Ok(m) => out.push(m),
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        at = end;
    }
    match first_error {
        Some(e) if out.is_empty() => Err(e),
        _ => Ok(out),
    }
}

fn align4(n: usize) -> usize {
    n.saturating_add(3) & !3
}

/// One note's descriptor: pc, base, semaphore, then three strings.
fn marker(desc: &[u8], base_now: Option<u64>) -> Result<UsdtMarker, UsdtError> {
    if desc.len() < 24 {
        return Err(UsdtError::Truncated(desc.len()));
    }
    let word = |o: usize| u64::from_le_bytes(desc[o..o + 8].try_into().unwrap_or([0; 8]));
    let (pc, base, sem) = (word(0), word(8), word(16));
    let mut strings = desc[24..].split(|&b| b == 0);
    let mut next = || {
        strings
            .next()
            .map(|s| String::from_utf8_lossy(s).into_owned())
            .ok_or(UsdtError::Truncated(desc.len()))
    };
    let (provider, name, args) = (next()?, next()?, next().unwrap_or_default());
    // Where the linker put .stapsdt.base against where the note says it
    // was: the same shift applies to the pc and the semaphore.
    let shift = base_now.map_or(0, |now| now.wrapping_sub(base));
    let parsed = parse_args(&args)?;
    Ok(UsdtMarker {
        provider,
        name,
        addr: pc.wrapping_add(shift),
        semaphore: (sem != 0).then(|| sem.wrapping_add(shift)),
        args: parsed,
        args_text: args,
    })
}

/// The arguments of a marker: `SIZE@OPERAND` separated by spaces.
pub fn parse_args(text: &str) -> Result<Vec<UsdtArg>, UsdtError> {
    let specs: Vec<&str> = text.split_whitespace().collect();
    if specs.len() > MAX_USDT_ARGS {
        return Err(UsdtError::BadArgument(text.to_string()));
    }
    specs.into_iter().map(parse_arg).collect()
}

fn parse_arg(spec: &str) -> Result<UsdtArg, UsdtError> {
    let bad = || UsdtError::BadArgument(spec.to_string());
    // Old notes may lack the size: `%edi` is taken as 8 bytes unsigned.
    let (size, operand) = match spec.split_once('@') {
        Some((s, o)) => (s.parse::<i8>().map_err(|_| bad())?, o),
        None => (8, spec),
    };
    let signed = size < 0;
    let size = size.unsigned_abs();
    if !matches!(size, 1 | 2 | 4 | 8) {
        return Err(bad());
    }
    let operand = if let Some(c) = operand.strip_prefix('$') {
        UsdtOperand::Constant(parse_int(c).ok_or_else(bad)?)
    } else if let Some(r) = operand.strip_prefix('%') {
        UsdtOperand::Register(register(r).ok_or_else(bad)?)
    } else {
        memory(operand).ok_or_else(bad)?
    };
    Ok(UsdtArg {
        size,
        signed,
        operand,
    })
}

/// `OFFSET(%BASE,%INDEX,SCALE)`, any part optional but the parentheses'
/// content, or a bare absolute `OFFSET`.
fn memory(text: &str) -> Option<UsdtOperand> {
    let (offset_text, inner) = match text.split_once('(') {
        Some((o, rest)) => (o, Some(rest.strip_suffix(')')?)),
        None => (text, None),
    };
    let offset = if offset_text.is_empty() {
        0
    } else {
        parse_int(offset_text)?
    };
    let Some(inner) = inner else {
        return Some(UsdtOperand::Memory {
            base: None,
            index: None,
            offset,
            rip_relative: false,
        });
    };
    let parts: Vec<&str> = inner.split(',').map(str::trim).collect();
    if parts.len() > 3 {
        return None;
    }
    let base_name = match parts[0] {
        "" => None,
        p => Some(p.strip_prefix('%')?),
    };
    let rip_relative = matches!(base_name, Some("rip" | "eip"));
    let base = match base_name {
        Some(_) if rip_relative => None,
        Some(b) => Some(register(b)?),
        None => None,
    };
    let index = match parts.get(1) {
        Some(p) if !p.is_empty() => {
            let r = register(p.strip_prefix('%')?)?;
            let scale: u8 = parts.get(2).map_or(Some(1), |s| s.parse().ok())?;
            if !matches!(scale, 1 | 2 | 4 | 8) {
                return None;
            }
            Some((r, scale))
        }
        _ => None,
    };
    Some(UsdtOperand::Memory {
        base,
        index,
        offset,
        rip_relative,
    })
}

fn parse_int(t: &str) -> Option<i64> {
    let (neg, t) = match t.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, t.strip_prefix('+').unwrap_or(t)),
    };
    let v = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok()? as i64,
        None => t.parse::<u64>().ok()? as i64,
    };
    Some(if neg { v.wrapping_neg() } else { v })
}

/// The DWARF number of an x86-64 general register under any of its names
/// (`rax`, `eax`, `ax`, `al`, `r8d`, `r8w`, `r8b`, …).
fn register(name: &str) -> Option<u16> {
    const LEGACY: [(&str, [&str; 4], u16); 8] = [
        ("rax", ["eax", "ax", "al", "ah"], 0),
        ("rdx", ["edx", "dx", "dl", "dh"], 1),
        ("rcx", ["ecx", "cx", "cl", "ch"], 2),
        ("rbx", ["ebx", "bx", "bl", "bh"], 3),
        ("rsi", ["esi", "si", "sil", ""], 4),
        ("rdi", ["edi", "di", "dil", ""], 5),
        ("rbp", ["ebp", "bp", "bpl", ""], 6),
        ("rsp", ["esp", "sp", "spl", ""], 7),
    ];
    for (full, others, n) in LEGACY {
        if name == full || (!name.is_empty() && others.contains(&name)) {
            return Some(n);
        }
    }
    let rest = name.strip_prefix('r')?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    let suffix = &rest[digits.len()..];
    let n: u16 = digits.parse().ok()?;
    ((8..=15).contains(&n) && matches!(suffix, "" | "d" | "w" | "b")).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operands_as_gcc_writes_them() {
        let a = parse_args("-4@%edi 8@-8(%rbp) 4@$5 8@8(%rax,%rdx,4) 2@%r9w -8@$-3 8@16(%rip)")
            .unwrap();
        assert_eq!(a.len(), 7);
        assert_eq!(
            a[0],
            UsdtArg {
                size: 4,
                signed: true,
                operand: UsdtOperand::Register(5)
            }
        );
        assert_eq!(
            a[1].operand,
            UsdtOperand::Memory {
                base: Some(6),
                index: None,
                offset: -8,
                rip_relative: false
            }
        );
        assert_eq!(a[2].operand, UsdtOperand::Constant(5));
        assert_eq!(
            a[3].operand,
            UsdtOperand::Memory {
                base: Some(0),
                index: Some((1, 4)),
                offset: 8,
                rip_relative: false
            }
        );
        assert_eq!(a[4].operand, UsdtOperand::Register(9));
        assert_eq!(
            (a[5].signed, &a[5].operand),
            (true, &UsdtOperand::Constant(-3))
        );
        // A symbol displacement is not a number: refused, not guessed.
        assert!(parse_args("1@foo(%rip)").is_err());
        assert_eq!(
            a[6].operand,
            UsdtOperand::Memory {
                base: None,
                index: None,
                offset: 16,
                rip_relative: true
            }
        );
    }

    #[test]
    fn bad_specs_are_errors() {
        for s in [
            "3@%eax",
            "4@%xyz",
            "4@(%rax,%rbx,3)",
            "x@%eax",
            "4@$",
            "4@1(%rax",
        ] {
            assert!(parse_args(s).is_err(), "{s}");
        }
        assert_eq!(parse_args("").unwrap(), vec![]);
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        assert!(usdt_markers(b"\x7fELF garbage").is_err());
        for n in 0..64u8 {
            let mut d = vec![n; 40];
            d[0] = 8;
            let _ = marker(&d, Some(1));
        }
    }
}
