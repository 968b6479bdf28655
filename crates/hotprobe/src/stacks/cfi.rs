//! `.eh_frame` → [`StackRow`]s: the unwind rules of one module compiled
//! into the compact table the agent walks (see [`hotprobe_abi::stacks`]).
//!
//! Every FDE's rows are evaluated with gimli's `UnwindTable`; each becomes a
//! row at its run-time start address (`bias` + link-time address), with
//! [`CFA_STOP`] where the rule is not `rsp`/`rbp` + offset with the return
//! address at `CFA - 8`, [`CFA_END`] where the return address is undefined,
//! and a [`CFA_NONE`] row at each FDE's end (no CFI there: the walk follows
//! frame pointers). The input is untrusted (any file a process maps):
//! errors are returned, never a panic, and the output is bounded.

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, EhFrame, LittleEndian, RegisterRule, UnwindContext,
    UnwindSection, X86_64,
};
use hotprobe_abi::stacks::{
    StackRow, CFA_END, CFA_NONE, CFA_RBP, CFA_RSP, CFA_STOP, RBP_AT, RBP_SAME,
};
use object::{Object, ObjectSection};

/// Rows one module may produce (libc has about 30,000).
pub const MAX_MODULE_ROWS: usize = 1 << 21;

/// Why a module's unwind table could not be compiled.
#[derive(Debug, thiserror::Error)]
pub enum CfiError {
    /// The file is not an object file `object` can read.
    #[error("cannot read the object file: {0}")]
    Object(#[from] object::Error),
    /// `.eh_frame` is malformed.
    #[error("malformed .eh_frame: {0}")]
    EhFrame(#[from] gimli::Error),
    /// More rows than [`MAX_MODULE_ROWS`].
    #[error("more than {MAX_MODULE_ROWS} unwind rows")]
    TooManyRows,
}

/// Compiles the `.eh_frame` of the ELF file `data`, loaded `bias` bytes
/// above its link-time addresses, into rows sorted by address (empty when
/// it has no `.eh_frame`).
pub fn compile_module(data: &[u8], bias: u64) -> Result<Vec<StackRow>, CfiError> {
    let file = object::File::parse(data)?;
    let Some(section) = file.section_by_name(".eh_frame") else {
        return Ok(Vec::new());
    };
    let bytes = section.data()?;
    let mut bases = BaseAddresses::default().set_eh_frame(section.address());
    if let Some(text) = file.section_by_name(".text") {
        bases = bases.set_text(text.address());
    }
    if let Some(got) = file.section_by_name(".got") {
        bases = bases.set_got(got.address());
    }
    let mut eh = EhFrame::new(bytes, LittleEndian);
    eh.set_address_size(8);
    compile_eh_frame(&eh, &bases, bias)
}

/// Compiles an already located `.eh_frame` (see [`compile_module`]).
pub fn compile_eh_frame(
    eh: &EhFrame<gimli::EndianSlice<'_, LittleEndian>>,
    bases: &BaseAddresses,
    bias: u64,
) -> Result<Vec<StackRow>, CfiError> {
    let mut rows: Vec<StackRow> = Vec::new();
    let mut ctx = UnwindContext::new();
    let mut entries = eh.entries(bases);
    while let Some(entry) = entries.next()? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = partial.parse(EhFrame::cie_from_offset)?;
        if fde.len() == 0 {
            continue;
        }
        let mut table = fde.rows(eh, bases, &mut ctx)?;
        while let Some(row) = table.next_row()? {
            if row.start_address() >= row.end_address() {
                continue;
            }
            rows.push(convert(row, bias));
            if rows.len() > MAX_MODULE_ROWS {
                return Err(CfiError::TooManyRows);
            }
        }
        rows.push(StackRow {
            pc: fde
                .initial_address()
                .wrapping_add(fde.len())
                .wrapping_add(bias),
            cfa_reg: CFA_NONE,
            ..StackRow::default()
        });
    }
    Ok(finish(rows))
}

/// One gimli row as a [`StackRow`].
fn convert(row: &gimli::UnwindTableRow<usize, gimli::StoreOnHeap>, bias: u64) -> StackRow {
    let pc = row.start_address().wrapping_add(bias);
    let stop = StackRow {
        pc,
        cfa_reg: CFA_STOP,
        ..StackRow::default()
    };
    let (cfa_reg, cfa_off) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let reg = match *register {
                X86_64::RSP => CFA_RSP,
                X86_64::RBP => CFA_RBP,
                _ => return stop,
            };
            let Ok(off) = i32::try_from(*offset) else {
                return stop;
            };
            (reg, off)
        }
        CfaRule::Expression(_) => return stop,
    };
    match row.register(X86_64::RA) {
        RegisterRule::Offset(-8) => {}
        RegisterRule::Undefined => {
            return StackRow {
                pc,
                cfa_reg: CFA_END,
                ..StackRow::default()
            }
        }
        _ => return stop,
    }
    let (rbp_rule, rbp_off) = match row.register(X86_64::RBP) {
        RegisterRule::Undefined | RegisterRule::SameValue => (RBP_SAME, 0),
        RegisterRule::Offset(k) => match i16::try_from(k) {
            Ok(k) => (RBP_AT, k),
            Err(_) => return stop,
        },
        _ => return stop,
    };
    StackRow {
        pc,
        cfa_off,
        rbp_off,
        cfa_reg,
        rbp_rule,
    }
}

/// Sorts rows by address; where several start at one address, a row with
/// a rule wins over an FDE's end marker (the next function starts where
/// the last one ended), and of two rules the last one (a later FDE).
pub fn finish(mut rows: Vec<StackRow>) -> Vec<StackRow> {
    // Stable: rows of one address stay in input order.
    rows.sort_by_key(|r| r.pc);
    let mut out: Vec<StackRow> = Vec::with_capacity(rows.len());
    for r in rows {
        match out.last_mut() {
            Some(last) if last.pc == r.pc => {
                if r.cfa_reg != CFA_NONE || last.cfa_reg == CFA_NONE {
                    *last = r;
                }
            }
            Some(last) if *last == StackRow { pc: last.pc, ..r } => {}
            _ => out.push(r),
        }
    }
    out
}
