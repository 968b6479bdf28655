//! Registers as `target.xml` describes them, and the `g` block they lay out.

use super::*;

/// One register as `target.xml` describes it, with its place in the `g` block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegInfo {
    /// Its name (`rax`, `eflags`, `cr3`, `xmm0`...).
    pub name: String,
    /// Its number for `p`/`P`.
    pub regnum: u32,
    /// Its size in bits.
    pub bitsize: u32,
    /// Its byte offset in the `g` block.
    pub offset: usize,
}

/// The registers of a target, in `g`-block order.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RegisterMap {
    /// The registers in order.
    pub regs: Vec<RegInfo>,
}

pub(super) fn strip_xml_comments(xml: &str) -> String {
    let mut out = String::with_capacity(xml.len());
    let mut rest = xml;
    while let Some(start) = rest.find("<!--") {
        out.push_str(&rest[..start]);
        match rest[start + 4..].find("-->") {
            Some(end) => rest = &rest[start + 4 + end + 3..],
            None => return out,
        }
    }
    out.push_str(rest);
    out
}

pub(super) fn xml_attr(tag: &str, name: &str) -> Option<String> {
    let mut search = tag;
    let pat = format!("{name}=");
    loop {
        let i = search.find(&pat)?;
        // The attribute name must start after whitespace.
        let before_ok = i == 0 || search[..i].ends_with(|c: char| c.is_whitespace());
        let after = &search[i + pat.len()..];
        if before_ok {
            let quote = after.chars().next()?;
            if quote != '"' && quote != '\'' {
                return None;
            }
            let body = &after[1..];
            let end = body.find(quote)?;
            return Some(body[..end].to_string());
        }
        search = after;
    }
}

/// The tags named `tag` in `xml` (comments removed), as their text between
/// `<tag` and `>`.
fn xml_tags<'a>(xml: &'a str, tag: &str) -> Vec<&'a str> {
    let open = format!("<{tag}");
    let mut out = Vec::new();
    let mut rest = xml;
    while let Some(i) = rest.find(&open) {
        let after = &rest[i + open.len()..];
        if !after.starts_with(|c: char| c.is_whitespace() || c == '/' || c == '>') {
            rest = after;
            continue;
        }
        match after.find('>') {
            Some(end) => {
                out.push(&after[..end]);
                rest = &after[end..];
            }
            None => break,
        }
    }
    out
}

/// What one target-description document holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetDoc {
    /// `<architecture>` text, if any.
    pub architecture: Option<String>,
    /// `<xi:include href=...>` documents, in order.
    pub includes: Vec<String>,
    /// `<reg>` elements in order: name, explicit regnum, bitsize.
    pub regs: Vec<(String, Option<u32>, u32)>,
}

/// Parses one target-description XML document (comments skipped).
pub fn parse_target_doc(xml: &str) -> TargetDoc {
    let xml = strip_xml_comments(xml);
    let architecture = xml.find("<architecture>").and_then(|i| {
        let rest = &xml[i + "<architecture>".len()..];
        rest.find("</architecture>")
            .map(|e| rest[..e].trim().to_string())
    });
    let includes = xml_tags(&xml, "xi:include")
        .into_iter()
        .filter_map(|t| xml_attr(t, "href"))
        .collect();
    let regs = xml_tags(&xml, "reg")
        .into_iter()
        .filter_map(|t| {
            let name = xml_attr(t, "name")?;
            let bits = xml_attr(t, "bitsize")?.parse().ok()?;
            let regnum = xml_attr(t, "regnum").and_then(|r| r.parse().ok());
            Some((name, regnum, bits))
        })
        .collect();
    TargetDoc {
        architecture,
        includes,
        regs,
    }
}

impl RegisterMap {
    /// Builds the map from the `<reg>` elements of every document in
    /// include order (regnums continue from the previous one unless given).
    pub fn from_regs(regs: impl IntoIterator<Item = (String, Option<u32>, u32)>) -> Self {
        let mut out = Vec::new();
        let mut next_num = 0u32;
        let mut offset = 0usize;
        for (name, regnum, bitsize) in regs {
            let regnum = regnum.unwrap_or(next_num);
            next_num = regnum.saturating_add(1);
            out.push(RegInfo {
                name,
                regnum,
                bitsize,
                offset,
            });
            offset += (bitsize as usize).div_ceil(8);
        }
        RegisterMap { regs: out }
    }

    /// The layout QEMU 10 describes for x86-64 system emulation
    /// (`i386-64bit.xml`): a 608-byte `g` block with cr3 at offset 204.
    pub fn qemu_x86_64() -> Self {
        let mut regs: Vec<(String, Option<u32>, u32)> = Vec::new();
        let mut add = |n: &str, b: u32| regs.push((n.to_string(), None, b));
        for n in [
            "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11",
            "r12", "r13", "r14", "r15", "rip",
        ] {
            add(n, 64);
        }
        for n in ["eflags", "cs", "ss", "ds", "es", "fs", "gs"] {
            add(n, 32);
        }
        for n in [
            "fs_base",
            "gs_base",
            "k_gs_base",
            "cr0",
            "cr2",
            "cr3",
            "cr4",
            "cr8",
            "efer",
        ] {
            add(n, 64);
        }
        for i in 0..8 {
            add(&format!("st{i}"), 80);
        }
        for n in [
            "fctrl", "fstat", "ftag", "fiseg", "fioff", "foseg", "fooff", "fop",
        ] {
            add(n, 32);
        }
        for i in 0..16 {
            add(&format!("xmm{i}"), 128);
        }
        add("mxcsr", 32);
        Self::from_regs(regs)
    }

    /// The register called `name`.
    pub fn get(&self, name: &str) -> Option<&RegInfo> {
        self.regs.iter().find(|r| r.name == name)
    }

    /// The size of the whole `g` block in bytes.
    pub fn g_len(&self) -> usize {
        self.regs
            .last()
            .map_or(0, |r| r.offset + (r.bitsize as usize).div_ceil(8))
    }

    /// Reads register `name` (up to 64 bits, little-endian) from a `g` block.
    pub fn read(&self, g: &[u8], name: &str) -> Option<u64> {
        let r = self.get(name)?;
        let len = (r.bitsize as usize).div_ceil(8).min(8);
        let bytes = g.get(r.offset..r.offset + len)?;
        let mut v = [0u8; 8];
        v[..len].copy_from_slice(bytes);
        Some(u64::from_le_bytes(v))
    }

    /// Writes register `name` (up to 64 bits, little-endian) into a `g` block.
    pub fn write(&self, g: &mut [u8], name: &str, value: u64) -> bool {
        let Some(r) = self.get(name) else {
            return false;
        };
        let len = (r.bitsize as usize).div_ceil(8).min(8);
        match g.get_mut(r.offset..r.offset + len) {
            Some(slot) => {
                slot.copy_from_slice(&value.to_le_bytes()[..len]);
                true
            }
            None => false,
        }
    }

    /// The [`Registers`] held in a `g` block (fields the map lacks are 0).
    pub fn registers(&self, g: &[u8]) -> Registers {
        let mut regs = Registers::default();
        for (name, slot) in Self::fields(&mut regs) {
            *slot = self.read(g, name).unwrap_or(0);
        }
        regs
    }

    /// Writes every [`Registers`] field the map knows into a `g` block.
    pub fn store(&self, g: &mut [u8], regs: &Registers) {
        let mut copy = *regs;
        for (name, slot) in Self::fields(&mut copy) {
            self.write(g, name, *slot);
        }
    }

    /// The map's name for each [`Registers`] field, with the field.
    pub fn fields(regs: &mut Registers) -> [(&'static str, &mut u64); 27] {
        let Registers {
            rax,
            rbx,
            rcx,
            rdx,
            rsi,
            rdi,
            rbp,
            rsp,
            r8,
            r9,
            r10,
            r11,
            r12,
            r13,
            r14,
            r15,
            rip,
            rflags,
            cs,
            ss,
            ds,
            es,
            fs,
            gs,
            fs_base,
            gs_base,
            orig_rax: _,
            cr3,
        } = regs;
        [
            ("rax", rax),
            ("rbx", rbx),
            ("rcx", rcx),
            ("rdx", rdx),
            ("rsi", rsi),
            ("rdi", rdi),
            ("rbp", rbp),
            ("rsp", rsp),
            ("r8", r8),
            ("r9", r9),
            ("r10", r10),
            ("r11", r11),
            ("r12", r12),
            ("r13", r13),
            ("r14", r14),
            ("r15", r15),
            ("rip", rip),
            ("eflags", rflags),
            ("cs", cs),
            ("ss", ss),
            ("ds", ds),
            ("es", es),
            ("fs", fs),
            ("gs", gs),
            ("fs_base", fs_base),
            ("gs_base", gs_base),
            ("cr3", cr3),
        ]
    }
}
