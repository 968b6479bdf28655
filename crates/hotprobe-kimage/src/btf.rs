//! The kernel's BTF (`.BTF` section of the vmlinux, `CONFIG_DEBUG_INFO_BTF`):
//! just enough to find a structure member's offset and a per-cpu variable's
//! offset, which is what tracing a guest's current task needs
//! ([`task_offsets`]).
//!
//! Written by hand: the BTF crates on crates.io (btf-rs, aya-obj) either
//! want the whole file type-checked or pull a BPF loader; this walks the
//! type section once (every kind's trailing record sizes, per the kernel's
//! `Documentation/bpf/btf.rst`) and never panics on malformed bytes.

use object::{Object, ObjectSection};

/// Errors reading BTF.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    /// No `.BTF` section in the vmlinux.
    #[error("the kernel has no .BTF section (built without CONFIG_DEBUG_INFO_BTF)")]
    NoBtf,
    /// The BTF blob is malformed.
    #[error("malformed BTF: {0}")]
    Malformed(&'static str),
    /// A type or member is not there.
    #[error("BTF: no {0}")]
    Missing(String),
}

const BTF_MAGIC: u16 = 0xeb9f;

const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_ENUM64: u32 = 19;

/// One type: its name, kind, `info` word and where its trailing records are.
#[derive(Clone, Copy, Debug)]
struct TypeRec {
    name_off: u32,
    info: u32,
    /// size_or_type.
    size: u32,
    /// Offset of the trailing records in the type section.
    extra: usize,
}

impl TypeRec {
    fn kind(&self) -> u32 {
        (self.info >> 24) & 0x1f
    }
    fn vlen(&self) -> usize {
        (self.info & 0xffff) as usize
    }
    fn kind_flag(&self) -> bool {
        self.info >> 31 != 0
    }
}

/// A parsed BTF blob (type ids start at 1).
#[derive(Debug)]
pub struct Btf<'a> {
    types: Vec<TypeRec>,
    type_sec: &'a [u8],
    strings: &'a [u8],
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(
        b.get(at..at.checked_add(4)?)?.try_into().ok()?,
    ))
}

impl<'a> Btf<'a> {
    /// Parses a raw BTF blob (the `.BTF` section's bytes; little-endian).
    pub fn parse(blob: &'a [u8]) -> Result<Btf<'a>, BtfError> {
        let bad = BtfError::Malformed;
        let magic = u16::from_le_bytes(
            blob.get(0..2)
                .ok_or(bad("short header"))?
                .try_into()
                .map_err(|_| bad("short header"))?,
        );
        if magic != BTF_MAGIC {
            return Err(bad("bad magic (not little-endian BTF)"));
        }
        let hdr_len = u32_at(blob, 4).ok_or(bad("short header"))? as usize;
        let field = |i: usize| u32_at(blob, 8 + 4 * i).ok_or(bad("short header"));
        let (type_off, type_len, str_off, str_len) = (field(0)?, field(1)?, field(2)?, field(3)?);
        let sec = |off: u32, len: u32| {
            let s = hdr_len.checked_add(off as usize)?;
            blob.get(s..s.checked_add(len as usize)?)
        };
        let type_sec = sec(type_off, type_len).ok_or(bad("type section out of bounds"))?;
        let strings = sec(str_off, str_len).ok_or(bad("string section out of bounds"))?;
        let mut types = Vec::new();
        let mut at = 0usize;
        while at < type_sec.len() {
            let name_off = u32_at(type_sec, at).ok_or(bad("truncated type"))?;
            let info = u32_at(type_sec, at + 4).ok_or(bad("truncated type"))?;
            let size = u32_at(type_sec, at + 8).ok_or(bad("truncated type"))?;
            let t = TypeRec {
                name_off,
                info,
                size,
                extra: at + 12,
            };
            let vlen = t.vlen();
            let trailing = match t.kind() {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                0 | 2 | 7..=12 | 16 | 18 => 0,
                _ => return Err(bad("unknown type kind")),
            };
            at = t.extra + trailing;
            if at > type_sec.len() {
                return Err(bad("truncated type records"));
            }
            types.push(t);
        }
        Ok(Btf {
            types,
            type_sec,
            strings,
        })
    }

    fn name(&self, off: u32) -> &'a [u8] {
        let s = self.strings.get(off as usize..).unwrap_or(&[]);
        &s[..s.iter().position(|b| *b == 0).unwrap_or(s.len())]
    }

    fn rec(&self, i: usize, k: usize, size: usize) -> Option<&'a [u8]> {
        let t = self.types.get(i)?;
        let s = t.extra.checked_add(k.checked_mul(size)?)?;
        self.type_sec.get(s..s.checked_add(size)?)
    }

    /// The byte offset of member `member` of `struct name` (a direct
    /// member, or one of an anonymous struct/union member, recursively).
    pub fn member_offset(&self, name: &str, member: &str) -> Result<u64, BtfError> {
        let i = self
            .types
            .iter()
            .position(|t| t.kind() == KIND_STRUCT && self.name(t.name_off) == name.as_bytes())
            .ok_or_else(|| BtfError::Missing(format!("struct {name}")))?;
        self.member_in(i, member, 0, 0)
            .ok_or_else(|| BtfError::Missing(format!("member {member} in struct {name}")))
    }

    fn member_in(&self, i: usize, member: &str, base_bits: u64, depth: u32) -> Option<u64> {
        let t = *self.types.get(i)?;
        if depth > 8 || !matches!(t.kind(), KIND_STRUCT | KIND_UNION) {
            return None;
        }
        for k in 0..t.vlen() {
            let r = self.rec(i, k, 12)?;
            let name_off = u32_at(r, 0)?;
            let ty = u32_at(r, 4)?;
            let off = u32_at(r, 8)?;
            let bits = base_bits
                + if t.kind_flag() {
                    (off & 0xff_ffff) as u64
                } else {
                    off as u64
                };
            if name_off == 0 {
                // An anonymous struct or union: look inside.
                let inner = self.strip(ty)?;
                if let Some(o) = self.member_in(inner, member, bits, depth + 1) {
                    return Some(o);
                }
            } else if self.name(name_off) == member.as_bytes() {
                return Some(bits / 8);
            }
        }
        None
    }

    /// The index of type id `id` after typedefs and qualifiers.
    fn strip(&self, mut id: u32) -> Option<usize> {
        for _ in 0..16 {
            let t = self.types.get((id as usize).checked_sub(1)?)?;
            match t.kind() {
                8..=11 | 18 => id = t.size,
                _ => return Some(id as usize - 1),
            }
        }
        None
    }

    /// The offset of variable `var` in data section `section` (a
    /// `DATASEC`, e.g. `.data..percpu`).
    pub fn var_offset(&self, section: &str, var: &str) -> Result<u64, BtfError> {
        for (i, t) in self.types.iter().enumerate() {
            if t.kind() != KIND_DATASEC || self.name(t.name_off) != section.as_bytes() {
                continue;
            }
            for k in 0..t.vlen() {
                let Some(r) = self.rec(i, k, 12) else { break };
                let (Some(ty), Some(off)) = (u32_at(r, 0), u32_at(r, 4)) else {
                    break;
                };
                let Some(v) = (ty as usize).checked_sub(1).and_then(|j| self.types.get(j)) else {
                    continue;
                };
                if v.kind() == KIND_VAR && self.name(v.name_off) == var.as_bytes() {
                    return Ok(off as u64);
                }
            }
        }
        Err(BtfError::Missing(format!("variable {var} in {section}")))
    }
}

/// The `.BTF` section of an ELF vmlinux.
pub fn btf_section(vmlinux: &[u8]) -> Result<&[u8], BtfError> {
    let file = object::File::parse(vmlinux).map_err(|_| BtfError::NoBtf)?;
    let sec = file.section_by_name(".BTF").ok_or(BtfError::NoBtf)?;
    sec.data()
        .map_err(|_| BtfError::Malformed(".BTF section data"))
}

/// Where a Linux x86-64 kernel keeps its current task, from its BTF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskOffsets {
    /// The `current_task` pointer's offset in the per-cpu area (`gs_base`
    /// in the kernel): the per-cpu variable `current_task` (≤ 6.1) or
    /// `pcpu_hot.current_task` (6.2 on).
    pub current: u64,
    /// `task_struct.pid`.
    pub pid: u64,
    /// `task_struct.tgid`.
    pub tgid: u64,
    /// `task_struct.comm`.
    pub comm: u64,
}

/// The kernel's current-task offsets from its BTF blob.
pub fn task_offsets(btf: &Btf<'_>) -> Result<TaskOffsets, BtfError> {
    let current = match btf.var_offset(".data..percpu", "current_task") {
        Ok(o) => o,
        Err(e) => match btf.var_offset(".data..percpu", "pcpu_hot") {
            Ok(o) => o + btf.member_offset("pcpu_hot", "current_task")?,
            Err(_) => return Err(e),
        },
    };
    Ok(TaskOffsets {
        current,
        pid: btf.member_offset("task_struct", "pid")?,
        tgid: btf.member_offset("task_struct", "tgid")?,
        comm: btf.member_offset("task_struct", "comm")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tiny BTF: int, struct task_struct { int x; int pid; int tgid;
    /// union { char comm; } }, var current_task, datasec .data..percpu.
    fn blob() -> Vec<u8> {
        let strings = b"\0int\0task_struct\0x\0pid\0tgid\0comm\0current_task\0.data..percpu\0";
        let s = |n: &str| {
            let hay = strings;
            let pat = [n.as_bytes(), b"\0"].concat();
            hay.windows(pat.len()).position(|w| w == pat).unwrap() as u32
        };
        let mut t = Vec::new();
        let mut w = |v: u32| t.extend_from_slice(&v.to_le_bytes());
        // 1: int
        w(s("int"));
        w(KIND_INT << 24);
        w(4);
        w(32);
        // 2: struct task_struct, 4 members (kind_flag: bitfield offsets)
        w(s("task_struct"));
        w(KIND_STRUCT << 24 | 1 << 31 | 4);
        w(32);
        for (n, off) in [("x", 0u32), ("pid", 32), ("tgid", 64)] {
            w(s(n));
            w(1);
            w(off);
        }
        w(0);
        w(3);
        w(128);
        // 3: anonymous union { int comm; }
        w(0);
        w(KIND_UNION << 24 | 1);
        w(4);
        w(s("comm"));
        w(1);
        w(0);
        // 4: var current_task
        w(s("current_task"));
        w(KIND_VAR << 24);
        w(1);
        w(1);
        // 5: datasec
        w(s(".data..percpu"));
        w(KIND_DATASEC << 24 | 1);
        w(0x100);
        w(4);
        w(0x40);
        w(8);
        let mut b = Vec::new();
        b.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        b.extend_from_slice(&[1, 0]);
        b.extend_from_slice(&24u32.to_le_bytes());
        for v in [0, t.len() as u32, t.len() as u32, strings.len() as u32] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&t);
        b.extend_from_slice(strings);
        b
    }

    #[test]
    fn offsets_of_a_small_btf() {
        let b = blob();
        let btf = Btf::parse(&b).unwrap();
        let o = task_offsets(&btf).unwrap();
        assert_eq!(
            o,
            TaskOffsets {
                current: 0x40,
                pid: 4,
                tgid: 8,
                comm: 16
            }
        );
        assert!(btf.member_offset("task_struct", "nope").is_err());
        assert!(btf.var_offset(".data..percpu", "nope").is_err());
        for n in 0..b.len() {
            let _ = Btf::parse(&b[..n]).map(|b| task_offsets(&b));
        }
    }
}
