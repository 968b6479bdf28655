//! What is read at a hit, the bytes it becomes, and how they are printed.
//!
//! Captured bytes, one record per item, in plan order:
//! `0` value (8 bytes LE) · `1` string (flags byte: bit 0 truncated; u16 LE
//! length; bytes) · `2` unreadable memory (8-byte address) · `3` not
//! available (optimised out, unsupported) · `4` null pointer.

use std::fmt::Write as _;

/// Bytes of a string copied at the hit; longer ones are cut and marked.
pub const MAX_STRING: usize = 128;

/// A register of the stopped thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The `n`th integer argument register (rdi, rsi, rdx, rcx, r8, r9).
    IntArg(u8),
    /// The low 64 bits of xmm`n`.
    Xmm(u8),
    /// A DWARF register number (x86-64 numbering).
    Dwarf(u16),
    /// The 8 bytes at `rsp + off` (stack-passed arguments at the entry).
    Stack(u32),
    /// rax (an integer return value).
    Rax,
}

/// How to get one value at a hit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// A register.
    Reg(Source),
    /// `size` bytes (1, 2, 4, 8) at `addr + offset` (a field through a pointer).
    Load {
        /// The address.
        addr: Box<Fetch>,
        /// Added to it.
        offset: u64,
        /// Bytes read (zero-extended).
        size: u8,
    },
    /// The NUL-terminated string `ptr` points to (at most [`MAX_STRING`] bytes).
    Str(Box<Fetch>),
    /// A value known without reading (a clone's constant parameter).
    Const(u64),
    /// A DWARF expression computed at the hit (`DW_OP_breg5 +1;
    /// DW_OP_stack_value`, an entry value, a stack slot).
    Expr(Box<crate::DwarfExpr>),
    /// Nothing to read: the value is not available.
    Missing,
}

/// The stopped thread a plan reads from.
pub trait Machine {
    /// An integer register.
    fn reg(&mut self, s: Source) -> Option<u64>;
    /// Reads `buf.len()` bytes at `addr`; false when unreadable.
    fn read(&mut self, addr: u64, buf: &mut [u8]) -> bool;
}

/// Runs `plan` against `m`, appending one record per item to `out`.
pub fn capture(plan: &[Fetch], m: &mut dyn Machine, out: &mut Vec<u8>) {
    for f in plan {
        match f {
            Fetch::Str(p) => match eval(p, m) {
                Ok(0) => out.push(4),
                Ok(addr) => read_string(m, addr, out),
                Err(Some(a)) => unreadable(out, a),
                Err(None) => out.push(3),
            },
            f => match eval(f, m) {
                Ok(v) => {
                    out.push(0);
                    out.extend_from_slice(&v.to_le_bytes());
                }
                Err(Some(a)) => unreadable(out, a),
                Err(None) => out.push(3),
            },
        }
    }
}

fn unreadable(out: &mut Vec<u8>, addr: u64) {
    out.push(2);
    out.extend_from_slice(&addr.to_le_bytes());
}

/// The value of `f`; `Err(Some(addr))` for unreadable memory, `Err(None)`
/// for a value not available.
fn eval(f: &Fetch, m: &mut dyn Machine) -> Result<u64, Option<u64>> {
    match f {
        Fetch::Reg(s) => m.reg(*s).ok_or(None),
        Fetch::Const(v) => Ok(*v),
        Fetch::Expr(e) => e.value(m),
        Fetch::Load { addr, offset, size } => {
            let a = eval(addr, m)?.wrapping_add(*offset);
            let n = (*size as usize).clamp(1, 8);
            let mut b = [0u8; 8];
            if a == 0 || !m.read(a, &mut b[..n]) {
                return Err(Some(a));
            }
            Ok(u64::from_le_bytes(b))
        }
        Fetch::Str(_) | Fetch::Missing => Err(None),
    }
}

fn read_string(m: &mut dyn Machine, addr: u64, out: &mut Vec<u8>) {
    // One byte past the limit: a string of exactly MAX_STRING bytes (its
    // NUL right after) is whole, not cut.
    const READ: usize = MAX_STRING + 1;
    let mut buf = [0u8; READ];
    let mut len = 0;
    let mut truncated = true;
    while len < READ {
        let a = addr.wrapping_add(len as u64);
        // Never cross into a page that may be unmapped in one read.
        let room = (0x1000 - (a & 0xfff)) as usize;
        let mut n = room.min(READ - len).min(64);
        // A target that refuses a read running past what it has mapped
        // (a guest's page tables, a short mapping) gets shorter ones.
        while !m.read(a, &mut buf[len..len + n]) {
            if n == 1 {
                break;
            }
            n /= 2;
        }
        if n == 1 && !m.read(a, &mut buf[len..len + 1]) {
            if len == 0 {
                return unreadable(out, addr);
            }
            break;
        }
        if let Some(z) = buf[len..len + n].iter().position(|b| *b == 0) {
            len += z;
            truncated = false;
            break;
        }
        len += n;
    }
    let len = len.min(MAX_STRING);
    out.push(1);
    out.push(truncated as u8);
    out.extend_from_slice(&(len as u16).to_le_bytes());
    out.extend_from_slice(&buf[..len]);
}

/// How a captured value is shown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Shape {
    /// A signed integer of 1, 2, 4 or 8 bytes.
    Signed(u8),
    /// An unsigned integer of 1, 2, 4 or 8 bytes.
    Unsigned(u8),
    /// `true` / `false`.
    Bool,
    /// A character: `'a'`.
    Char,
    /// `float`.
    F32,
    /// `double`.
    F64,
    /// A pointer: `0x…` (`(null)` for 0).
    Ptr,
    /// A string: `"…"`.
    Str,
    /// An enum: the enumerator's name, else the number.
    Enum(Vec<(i64, String)>),
    /// Not available at the hit: printed `<REASON>` whatever was captured.
    Missing(String),
}

/// A shape with the label printed before the value (empty: none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShapeItem {
    /// `name=` is printed before the value when not empty.
    pub label: String,
    /// The shape.
    pub shape: Shape,
}

/// Captured bytes that do not match their shapes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ValueError {
    /// The bytes end too early or carry an unknown record.
    #[error("captured values are corrupt at byte {0}")]
    Corrupt(usize),
    /// A shape list that does not parse.
    #[error("bad type description at byte {0}")]
    BadShape(usize),
}

/// One captured value, decoded by its shape ([`decode_values`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A signed integer, a `bool` (0 or 1) or an enum's number.
    Int(i64),
    /// An unsigned integer.
    UInt(u64),
    /// `true` / `false`.
    Bool(bool),
    /// A character's byte.
    Char(u8),
    /// A `float`.
    F32(f32),
    /// A `double`.
    F64(f64),
    /// A pointer (not null).
    Ptr(u64),
    /// An enumerator's name.
    Enum(String),
    /// A string's bytes, and whether they were cut at [`MAX_STRING`].
    Str(Vec<u8>, bool),
    /// A null pointer (a pointer or a string).
    Null,
    /// An address that could not be read.
    Unreadable(u64),
    /// Not available at the hit (`<WHY>`: optimised out, not captured).
    Unavailable(String),
}

/// The values `data` holds, one per shape, with their labels.
pub fn decode_values(
    shapes: &[ShapeItem],
    data: &[u8],
) -> Result<Vec<(String, Value)>, ValueError> {
    let mut pos = 0;
    let mut out = Vec::with_capacity(shapes.len());
    let take = |pos: &mut usize, n: usize| -> Result<&[u8], ValueError> {
        let end = pos.checked_add(n).ok_or(ValueError::Corrupt(*pos))?;
        let s = data.get(*pos..end).ok_or(ValueError::Corrupt(*pos))?;
        *pos = end;
        Ok(s)
    };
    for item in shapes {
        let at = pos;
        let tag = take(&mut pos, 1)?[0];
        let value = match tag {
            0 => {
                let v = u64::from_le_bytes(take(&mut pos, 8)?.try_into().unwrap_or([0; 8]));
                typed(&item.shape, v)
            }
            1 => {
                let flags = take(&mut pos, 1)?[0];
                let len = u16::from_le_bytes(take(&mut pos, 2)?.try_into().unwrap_or([0; 2]));
                if flags > 1 || len as usize > MAX_STRING {
                    return Err(ValueError::Corrupt(at));
                }
                Value::Str(take(&mut pos, len as usize)?.to_vec(), flags == 1)
            }
            2 => Value::Unreadable(u64::from_le_bytes(
                take(&mut pos, 8)?.try_into().unwrap_or([0; 8]),
            )),
            3 => Value::Unavailable("unavailable".into()),
            4 => Value::Null,
            _ => return Err(ValueError::Corrupt(at)),
        };
        let value = match &item.shape {
            Shape::Missing(why) => Value::Unavailable(why.clone()),
            _ => value,
        };
        out.push((item.label.clone(), value));
    }
    if pos != data.len() {
        return Err(ValueError::Corrupt(pos));
    }
    Ok(out)
}

/// Prints the values `data` holds, one string per shape (`label=value`
/// when labelled).
pub fn format_values(shapes: &[ShapeItem], data: &[u8]) -> Result<Vec<String>, ValueError> {
    Ok(decode_values(shapes, data)?
        .into_iter()
        .map(|(label, v)| {
            let text = v.to_string();
            if label.is_empty() {
                text
            } else {
                format!("{label}={text}")
            }
        })
        .collect())
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Value::Int(v) => write!(f, "{v}"),
            Value::UInt(v) => write!(f, "{v}"),
            Value::Bool(b) => write!(f, "{b}"),
            Value::Char(c) => {
                let mut t = String::from("'");
                escape_byte(*c, b'\'', &mut t);
                t.push('\'');
                f.write_str(&t)
            }
            Value::F32(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
            Value::Ptr(v) => write!(f, "{v:#x}"),
            Value::Enum(name) => f.write_str(name),
            Value::Str(s, cut) => {
                f.write_str(&quote(s))?;
                if *cut {
                    f.write_str("...")?;
                }
                Ok(())
            }
            Value::Null => f.write_str("(null)"),
            Value::Unreadable(a) => write!(f, "<unreadable {a:#x}>"),
            Value::Unavailable(why) => write!(f, "<{why}>"),
        }
    }
}

/// A register's or memory's bits as the value `shape` says.
fn typed(shape: &Shape, v: u64) -> Value {
    let sext = |size: u8| -> i64 {
        let bits = u32::from(size.clamp(1, 8)) * 8;
        ((v << (64 - bits)) as i64) >> (64 - bits)
    };
    let zext = |size: u8| -> u64 {
        let bits = u32::from(size.clamp(1, 8)) * 8;
        if bits == 64 {
            v
        } else {
            v & ((1u64 << bits) - 1)
        }
    };
    match shape {
        Shape::Signed(s) => Value::Int(sext(*s)),
        Shape::Unsigned(s) => Value::UInt(zext(*s)),
        Shape::Bool => Value::Bool(v & 0xff != 0),
        Shape::Char => Value::Char((v & 0xff) as u8),
        Shape::F32 => Value::F32(f32::from_bits(v as u32)),
        Shape::F64 => Value::F64(f64::from_bits(v)),
        Shape::Ptr | Shape::Str if v == 0 => Value::Null,
        Shape::Ptr | Shape::Str => Value::Ptr(v),
        Shape::Enum(values) => {
            let n = v as u32 as i32 as i64;
            values
                .iter()
                .find(|(x, _)| *x == n || *x as u64 == v)
                .map_or(Value::Int(n), |(_, name)| Value::Enum(name.clone()))
        }
        Shape::Missing(why) => Value::Unavailable(why.clone()),
    }
}

fn quote(s: &[u8]) -> String {
    let mut t = String::from("\"");
    for &c in s {
        escape_byte(c, b'"', &mut t);
    }
    t.push('"');
    t
}

fn escape_byte(c: u8, q: u8, t: &mut String) {
    match c {
        b'\\' => t.push_str("\\\\"),
        b'\n' => t.push_str("\\n"),
        b'\t' => t.push_str("\\t"),
        b'\r' => t.push_str("\\r"),
        c if c == q => {
            t.push('\\');
            t.push(c as char);
        }
        0x20..=0x7e => t.push(c as char),
        c => {
            let _ = write!(t, "\\x{c:02x}");
        }
    }
}

impl Shape {
    /// The shapes as one line of text (for a trace's metadata):
    /// `label=kind` items separated by `;`, kinds `i1 i2 i4 i8 u1 … u8 bool
    /// char f32 f64 ptr str enum(V:NAME,…) missing(WHY)`.
    pub fn encode_list(items: &[ShapeItem]) -> String {
        let mut t = String::new();
        for (i, it) in items.iter().enumerate() {
            if i > 0 {
                t.push(';');
            }
            t.push_str(&it.label);
            t.push('=');
            match &it.shape {
                Shape::Signed(s) => write!(t, "i{s}").unwrap_or(()),
                Shape::Unsigned(s) => write!(t, "u{s}").unwrap_or(()),
                Shape::Bool => t.push_str("bool"),
                Shape::Char => t.push_str("char"),
                Shape::F32 => t.push_str("f32"),
                Shape::F64 => t.push_str("f64"),
                Shape::Ptr => t.push_str("ptr"),
                Shape::Str => t.push_str("str"),
                Shape::Enum(v) => {
                    t.push_str("enum(");
                    for (j, (n, name)) in v.iter().enumerate() {
                        if j > 0 {
                            t.push(',');
                        }
                        let _ = write!(t, "{n}:{name}");
                    }
                    t.push(')');
                }
                Shape::Missing(why) => {
                    let _ = write!(t, "missing({why})");
                }
            }
        }
        t
    }

    /// Parses [`Shape::encode_list`]'s text. Labels and enumerator names
    /// are C identifiers (labels also `->` and `.`), reasons words and spaces.
    pub fn decode_list(text: &str) -> Result<Vec<ShapeItem>, ValueError> {
        let mut out = Vec::new();
        if text.is_empty() {
            return Ok(out);
        }
        let mut at = 0;
        for part in split_top(text) {
            let bad = || ValueError::BadShape(at);
            let (label, kind) = part.split_once('=').ok_or_else(bad)?;
            if !label
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_->.[]".contains(c))
            {
                return Err(bad());
            }
            let size = |s: &str| -> Result<u8, ValueError> {
                match s {
                    "1" => Ok(1),
                    "2" => Ok(2),
                    "4" => Ok(4),
                    "8" => Ok(8),
                    _ => Err(bad()),
                }
            };
            let shape = match kind {
                "bool" => Shape::Bool,
                "char" => Shape::Char,
                "f32" => Shape::F32,
                "f64" => Shape::F64,
                "ptr" => Shape::Ptr,
                "str" => Shape::Str,
                k if k.starts_with('i') => Shape::Signed(size(&k[1..])?),
                k if k.starts_with('u') => Shape::Unsigned(size(&k[1..])?),
                k if k.starts_with("enum(") && k.ends_with(')') => {
                    let body = &k[5..k.len() - 1];
                    let mut values = Vec::new();
                    for e in body.split(',').filter(|e| !e.is_empty()) {
                        let (n, name) = e.split_once(':').ok_or_else(bad)?;
                        let n: i64 = n.parse().map_err(|_| bad())?;
                        if name.is_empty()
                            || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                        {
                            return Err(bad());
                        }
                        values.push((n, name.to_string()));
                    }
                    Shape::Enum(values)
                }
                k if k.starts_with("missing(") && k.ends_with(')') => {
                    let why = &k[8..k.len() - 1];
                    if !why
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || " _-".contains(c))
                    {
                        return Err(bad());
                    }
                    Shape::Missing(why.to_string())
                }
                _ => return Err(bad()),
            };
            out.push(ShapeItem {
                label: label.to_string(),
                shape,
            });
            at += part.len() + 1;
        }
        Ok(out)
    }
}

/// Splits at `;` outside parentheses.
fn split_top(text: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ';' if depth <= 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&text[start..]);
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fake {
        mem: Vec<(u64, Vec<u8>)>,
    }
    impl Machine for Fake {
        fn reg(&mut self, s: Source) -> Option<u64> {
            match s {
                Source::IntArg(0) => Some(0x1000),
                Source::IntArg(1) => Some((-5i64) as u64),
                Source::Xmm(0) => Some(1.5f64.to_bits()),
                Source::IntArg(2) => Some(0x2000),
                Source::IntArg(3) => Some(0xdead_0000),
                _ => None,
            }
        }
        fn read(&mut self, addr: u64, buf: &mut [u8]) -> bool {
            for (base, bytes) in &self.mem {
                if addr >= *base && addr + buf.len() as u64 <= base + bytes.len() as u64 {
                    let o = (addr - base) as usize;
                    buf.copy_from_slice(&bytes[o..o + buf.len()]);
                    return true;
                }
            }
            false
        }
    }

    #[test]
    fn capture_and_format_every_kind() {
        let mut long = vec![b'x'; 300];
        long.push(0);
        let mut m = Fake {
            mem: vec![
                (0x1000, b"wor\"ld\n\0".to_vec()),
                (0x2000, [7u8, 0, 0, 0, 42, 0, 0, 0].to_vec()),
                (0x3000, long),
            ],
        };
        let plan = vec![
            Fetch::Str(Box::new(Fetch::Reg(Source::IntArg(0)))),
            Fetch::Reg(Source::IntArg(1)),
            Fetch::Reg(Source::Xmm(0)),
            Fetch::Load {
                addr: Box::new(Fetch::Reg(Source::IntArg(2))),
                offset: 4,
                size: 4,
            },
            Fetch::Str(Box::new(Fetch::Reg(Source::IntArg(3)))),
            Fetch::Missing,
            Fetch::Reg(Source::IntArg(1)),
        ];
        let mut data = Vec::new();
        capture(&plan, &mut m, &mut data);
        let shapes: Vec<ShapeItem> = [
            ("", Shape::Str),
            ("", Shape::Signed(4)),
            ("", Shape::F64),
            ("p->len", Shape::Unsigned(4)),
            ("", Shape::Str),
            ("", Shape::Missing("optimised out".into())),
            ("", Shape::Enum(vec![(-5, "NEG".into())])),
        ]
        .into_iter()
        .map(|(l, s)| ShapeItem {
            label: l.into(),
            shape: s,
        })
        .collect();
        let v = format_values(&shapes, &data).unwrap();
        assert_eq!(
            v,
            [
                "\"wor\\\"ld\\n\"",
                "-5",
                "1.5",
                "p->len=42",
                "<unreadable 0xdead0000>",
                "<optimised out>",
                "NEG"
            ]
        );
        let text = Shape::encode_list(&shapes);
        assert_eq!(Shape::decode_list(&text).unwrap(), shapes);
        // A long string is cut and marked; exactly the limit (its NUL
        // right after) is whole, one more is cut.
        let mut data = Vec::new();
        for (n, want) in [
            (300, format!("\"{}\"...", "z".repeat(MAX_STRING))),
            (MAX_STRING, format!("\"{}\"", "z".repeat(MAX_STRING))),
            (MAX_STRING + 1, format!("\"{}\"...", "z".repeat(MAX_STRING))),
        ] {
            let mut m = Fake {
                mem: vec![(0x1000, {
                    let mut l = vec![b'z'; n];
                    l.push(0);
                    l
                })],
            };
            data.clear();
            capture(
                &[Fetch::Str(Box::new(Fetch::Reg(Source::IntArg(0))))],
                &mut m,
                &mut data,
            );
            assert_eq!(format_values(&shapes[..1], &data).unwrap()[0], want);
        }
        // Bytes that do not match are an error, not a panic.
        assert!(format_values(&shapes, &data[..3]).is_err());
        assert!(Shape::decode_list("a=i3").is_err());
    }
}
