//! Typed values copied in the target (issue 23 item 5): a function's entry
//! plan ([`Fetch`]es) compiled into the fixed-size capture program the
//! agent runs at each recorded entry ([`hotprobe_abi::capture`]). The
//! agent writes the same records [`hotprobe_dwarf::capture`] writes on the
//! trap path, so the bytes are formatted by the same shapes.

use hotprobe_abi::capture::{
    CaptureItem, CaptureProgram, CapturePrograms, BASE_ARG, BASE_CONST, BASE_MISSING, BASE_RAX,
    BASE_RSP, BASE_XMM, CAPTURE_ITEMS, CAPTURE_STEPS, CAPTURE_STRING_MAX,
};
use hotprobe_dwarf::{Fetch, Source, MAX_STRING};

const _: () = assert!(CAPTURE_STRING_MAX == MAX_STRING);

/// The program reading `entry` in the target, or `None` when something
/// does not fit one: more than [`CAPTURE_ITEMS`] values, more than
/// [`CAPTURE_STEPS`] loads in one, a DWARF expression, a register the
/// agent's trampoline does not save (rbx, rbp, r12–r15) or xmm6–7.
pub fn compile(entry: &[Fetch]) -> Option<CaptureProgram> {
    if entry.len() > CAPTURE_ITEMS {
        return None;
    }
    let mut p = CaptureProgram {
        n_items: entry.len() as u32,
        ..CaptureProgram::default()
    };
    for (slot, f) in p.items.iter_mut().zip(entry) {
        *slot = match f {
            Fetch::Str(ptr) => {
                let mut it = value(ptr)?;
                it.string = 1;
                it
            }
            f => value(f)?,
        };
    }
    Some(p)
}

/// The programs of a function's entry and exit plans: the exit's only when
/// it needs memory (a returned string, a field through the returned
/// pointer), and only on rax there; `None` when either does not fit.
pub fn compile_both(entry: &[Fetch], exit: &[Fetch]) -> Option<CapturePrograms> {
    let entry = compile(entry)?;
    if exit_in_registers(exit) {
        return Some(CapturePrograms { entry, exit: None });
    }
    let x = compile(exit)?;
    // At a return only rax (the returned value) is known.
    x.items()
        .iter()
        .all(|i| matches!(i.base, BASE_RAX | BASE_CONST | BASE_MISSING))
        .then_some(CapturePrograms {
            entry,
            exit: Some(x),
        })
}

/// Whether every exit value is one a recorded exit event holds (rax), a
/// constant or missing: exits of programs are recorded as registers.
pub fn exit_in_registers(exit: &[Fetch]) -> bool {
    exit.iter().all(|f| {
        matches!(
            f,
            Fetch::Missing | Fetch::Const(_) | Fetch::Reg(Source::Rax)
        )
    })
}

/// The item computing `f` (no string).
fn value(f: &Fetch) -> Option<CaptureItem> {
    let mut it = CaptureItem::default();
    match f {
        Fetch::Missing => it.base = BASE_MISSING,
        Fetch::Const(v) => {
            it.base = BASE_CONST;
            it.konst = *v;
        }
        Fetch::Reg(s) => register(s, &mut it)?,
        Fetch::Load { addr, offset, size } => {
            it = value(addr)?;
            step(&mut it, *offset, *size)?;
        }
        Fetch::Str(_) | Fetch::Expr(_) => return None,
    }
    Some(it)
}

fn step(it: &mut CaptureItem, offset: u64, size: u8) -> Option<()> {
    let k = usize::from(it.nsteps);
    if k >= CAPTURE_STEPS {
        return None;
    }
    it.offsets[k] = offset;
    it.sizes[k] = size.clamp(1, 8);
    it.nsteps += 1;
    Some(())
}

fn register(s: &Source, it: &mut CaptureItem) -> Option<()> {
    let (base, reg) = match *s {
        Source::IntArg(i) if i < 6 => (BASE_ARG, i),
        Source::Xmm(i) if i < 6 => (BASE_XMM, i),
        Source::Rax => (BASE_RAX, 0),
        Source::Stack(off) => {
            it.base = BASE_RSP;
            return step(it, u64::from(off), 8);
        }
        // DWARF numbering: rax, rdx, rcx, rsi, rdi, rsp, r8, r9.
        Source::Dwarf(0) => (BASE_RAX, 0),
        Source::Dwarf(1) => (BASE_ARG, 2),
        Source::Dwarf(2) => (BASE_ARG, 3),
        Source::Dwarf(4) => (BASE_ARG, 1),
        Source::Dwarf(5) => (BASE_ARG, 0),
        Source::Dwarf(7) => (BASE_RSP, 0),
        Source::Dwarf(8) => (BASE_ARG, 4),
        Source::Dwarf(9) => (BASE_ARG, 5),
        _ => return None,
    };
    it.base = base;
    it.reg = reg;
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(s: Source) -> Box<Fetch> {
        Box::new(Fetch::Reg(s))
    }

    #[test]
    fn strings_fields_and_stack_arguments_compile() {
        let entry = [
            Fetch::Str(reg(Source::IntArg(0))),
            Fetch::Load {
                addr: reg(Source::IntArg(1)),
                offset: 8,
                size: 4,
            },
            Fetch::Reg(Source::Stack(16)),
            Fetch::Const(7),
            Fetch::Missing,
        ];
        let p = compile(&entry).unwrap();
        assert_eq!(p.n_items, 5);
        let i = p.items();
        assert_eq!(
            (i[0].base, i[0].reg, i[0].string, i[0].nsteps),
            (BASE_ARG, 0, 1, 0)
        );
        assert_eq!((i[1].base, i[1].reg, i[1].nsteps), (BASE_ARG, 1, 1));
        assert_eq!((i[1].offsets[0], i[1].sizes[0]), (8, 4));
        assert_eq!(
            (i[2].base, i[2].nsteps, i[2].offsets[0], i[2].sizes[0]),
            (BASE_RSP, 1, 16, 8)
        );
        assert!(p.reads_stack());
        assert_eq!((i[3].base, i[3].konst), (BASE_CONST, 7));
        assert_eq!(i[4].base, BASE_MISSING);
    }

    #[test]
    fn what_does_not_fit_stays_on_the_trap() {
        // A chain of five loads.
        let mut f = Fetch::Reg(Source::IntArg(0));
        for _ in 0..5 {
            f = Fetch::Load {
                addr: Box::new(f),
                offset: 0,
                size: 8,
            };
        }
        assert!(compile(&[f]).is_none());
        // rbx is not saved by the trampoline; xmm7 neither.
        assert!(compile(&[Fetch::Reg(Source::Dwarf(3))]).is_none());
        assert!(compile(&[Fetch::Reg(Source::Xmm(7))]).is_none());
        // Nine values.
        assert!(compile(&vec![Fetch::Missing; 9]).is_none());
        assert!(exit_in_registers(&[Fetch::Reg(Source::Rax)]));
        assert!(!exit_in_registers(&[Fetch::Str(reg(Source::Rax))]));
        // A returned string gets an exit program; an argument register
        // is not known at the return.
        let entry = [Fetch::Reg(Source::IntArg(0))];
        let p = compile_both(&entry, &[Fetch::Str(reg(Source::Rax))]).unwrap();
        assert_eq!(p.exit.unwrap().items()[0].base, BASE_RAX);
        assert!(compile_both(&entry, &[Fetch::Reg(Source::Rax)])
            .unwrap()
            .exit
            .is_none());
        assert!(compile_both(&entry, &[Fetch::Str(reg(Source::IntArg(0)))]).is_none());
    }
}
