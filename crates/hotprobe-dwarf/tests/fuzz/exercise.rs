//! What each fuzz pass does with one input, shared by the bounded passes of
//! `tests/fuzz.rs` and the cargo-fuzz targets of `fuzz/` (included there by
//! path): returns whether the parser accepted the input, panics on a broken
//! invariant. Depends on hotprobe-dwarf and std only.
#![allow(dead_code)]

use hotprobe_dwarf::*;

/// A stopped thread for the fuzz passes: every register holds its
/// number times 0x1000, memory below 0x10000 reads as its address' low
/// byte, the rest is unreadable.
struct Regs;

impl Machine for Regs {
    fn reg(&mut self, s: Source) -> Option<u64> {
        Some(match s {
            Source::IntArg(i) => u64::from(i) * 0x1000,
            Source::Xmm(i) => u64::from(i) * 0x1000,
            Source::Dwarf(n) => u64::from(n) * 0x1000,
            Source::Stack(o) => u64::from(o),
            Source::Rax => 0,
        })
    }

    fn read(&mut self, addr: u64, buf: &mut [u8]) -> bool {
        if addr.saturating_add(buf.len() as u64) > 0x10000 {
            return false;
        }
        for (i, b) in buf.iter_mut().enumerate() {
            *b = (addr as usize + i) as u8;
        }
        true
    }
}

/// `DebugTypes::from_bytes`, then every function's signature, its `-a`
/// plan, and a plan naming each parameter (and each member of a struct it
/// points to).
pub fn dwarf_types(data: &[u8]) -> bool {
    let Ok(d) = DebugTypes::from_bytes(data) else {
        return false;
    };
    for pc in d.functions().into_iter().take(200) {
        let Ok(Some(sig)) = d.signature(pc) else {
            continue;
        };
        for symbol in [sig.name.as_str(), "f.constprop.0"] {
            let p = plan_auto(&sig, symbol);
            assert_eq!(p.entry.len(), sig.params.len());
            assert_eq!(p.entry.len(), p.entry_shapes.len());
            assert_eq!(p.exit.len(), p.exit_shapes.len());
            assert!(p.exit.len() <= 1);
            // The plan runs (DWARF expressions evaluated at the "hit"
            // included) and its bytes print with its shapes.
            let mut data = Vec::new();
            capture(&p.entry, &mut Regs, &mut data);
            assert_eq!(
                format_values(&p.entry_shapes, &data).map(|v| v.len()),
                Ok(p.entry.len())
            );
        }
        for param in sig.params.iter().take(8) {
            let mut exprs = vec![param.name.clone(), format!("{}:string", param.name)];
            if let Type::Pointer(to) = &param.ty {
                if let Type::Struct { fields, .. } = &**to {
                    for f in fields.iter().take(8) {
                        exprs.push(format!("{}->{}", param.name, f.name));
                    }
                }
            }
            for e in exprs {
                if let Ok(e) = e.parse::<ArgExpr>() {
                    if let Ok(p) = plan_args(&sig, &sig.name, &[e]) {
                        assert_eq!(p.entry.len(), 1);
                    }
                }
            }
        }
        let _ = sig.ret.describe();
    }
    true
}

/// The first line: a shape list (`Shape::decode_list`, which must
/// round-trip through `encode_list`); the rest: captured bytes printed with
/// it. Then the whole input as an argument expression.
pub fn typed_values(data: &[u8]) -> bool {
    let text = String::from_utf8_lossy(data);
    let (first, _) = text.split_once('\n').unwrap_or((&text, ""));
    let rest = match data.iter().position(|b| *b == b'\n') {
        Some(i) => &data[i + 1..],
        None => &[][..],
    };
    let _ = first.parse::<ArgExpr>();
    let Ok(shapes) = Shape::decode_list(first) else {
        return false;
    };
    assert_eq!(
        Shape::decode_list(&Shape::encode_list(&shapes)).as_ref(),
        Ok(&shapes)
    );
    match format_values(&shapes, rest) {
        Ok(v) => {
            assert_eq!(v.len(), shapes.len());
            true
        }
        Err(_) => false,
    }
}
