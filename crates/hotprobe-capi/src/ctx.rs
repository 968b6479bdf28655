//! What a handler can do with its context: which probe and hit, the
//! thread's registers and arguments, target memory, stopping the run.

use crate::args::{ctx_arg, put};
use crate::error::{guard, invalid};
use crate::regs::{from_c_regs, reg_mut, to_c_regs};
use crate::{
    hotprobe_ctx, hotprobe_regs, limits, HOTPROBE_ERR_INVALID, HOTPROBE_KIND_ENTRY,
    HOTPROBE_KIND_POST, HOTPROBE_KIND_PRE, HOTPROBE_KIND_RET, HOTPROBE_KIND_WATCH, HOTPROBE_OK,
};
#[cfg(doc)]
use crate::{hotprobe_run, HOTPROBE_MAX_READ};
use hotprobe::HitKind;
use std::ffi::{c_int, c_void};

/// The probe whose handler is running (negative on a NULL context).
///
/// # Safety
/// `ctx` is the context of the running handler.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_ctx_probe(ctx: *mut hotprobe_ctx) -> i64 {
    // SAFETY: per this function's contract.
    match unsafe { ctx_arg(ctx) } {
        Ok(c) => c.probe().0 as i64,
        Err(_) => HOTPROBE_ERR_INVALID as i64,
    }
}

/// Which handler is running: `HOTPROBE_KIND_*`.
///
/// # Safety
/// `ctx` is the context of the running handler.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_ctx_kind(ctx: *mut hotprobe_ctx) -> c_int {
    // SAFETY: per this function's contract.
    match unsafe { ctx_arg(ctx) } {
        Ok(c) => match c.kind() {
            HitKind::Pre => HOTPROBE_KIND_PRE,
            HitKind::Post => HOTPROBE_KIND_POST,
            HitKind::Entry => HOTPROBE_KIND_ENTRY,
            HitKind::Return => HOTPROBE_KIND_RET,
            HitKind::Watch => HOTPROBE_KIND_WATCH,
        },
        Err(_) => HOTPROBE_ERR_INVALID,
    }
}

/// The probed address.
///
/// # Safety
/// `ctx` is the context of the running handler.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_ctx_addr(ctx: *mut hotprobe_ctx) -> u64 {
    // SAFETY: per this function's contract.
    unsafe { ctx_arg(ctx) }.map_or(0, |c| c.addr().0)
}

/// The thread that hit the probe (its kernel thread id for a process).
///
/// # Safety
/// `ctx` is the context of the running handler.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_ctx_thread(ctx: *mut hotprobe_ctx) -> i64 {
    // SAFETY: per this function's contract.
    unsafe { ctx_arg(ctx) }.map_or(HOTPROBE_ERR_INVALID as i64, |c| c.thread().0 as i64)
}

/// Reads register `reg` (`HOTPROBE_REG_*`) of the hit thread into `out`.
///
/// # Safety
/// `ctx` is the context of the running handler; `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_ctx_reg(
    ctx: *mut hotprobe_ctx,
    reg: u32,
    out: *mut u64,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let c = unsafe { ctx_arg(ctx) }?;
        let mut r = *c.regs();
        let v = *reg_mut(&mut r, reg).ok_or_else(|| invalid(format!("unknown register {reg}")))?;
        // SAFETY: per this function's contract.
        unsafe { put(out, v) };
        Ok(HOTPROBE_OK)
    })
}

/// Sets register `reg` of the hit thread (applied when it resumes).
///
/// # Safety
/// `ctx` is the context of the running handler.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_ctx_set_reg(
    ctx: *mut hotprobe_ctx,
    reg: u32,
    value: u64,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let c = unsafe { ctx_arg(ctx) }?;
        let r = c.regs_mut();
        *reg_mut(r, reg).ok_or_else(|| invalid(format!("unknown register {reg}")))? = value;
        Ok(HOTPROBE_OK)
    })
}

/// Reads every general register of the hit thread into `out`.
///
/// # Safety
/// `ctx` is the context of the running handler; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_ctx_regs(
    ctx: *mut hotprobe_ctx,
    out: *mut hotprobe_regs,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let c = unsafe { ctx_arg(ctx) }?;
        if out.is_null() {
            return Err(invalid("out is NULL"));
        }
        // SAFETY: non-null and writable per the contract.
        unsafe { out.write(to_c_regs(c.regs())) };
        Ok(HOTPROBE_OK)
    })
}

/// Sets every general register of the hit thread from `regs` (applied
/// when it resumes).
///
/// # Safety
/// `ctx` is the context of the running handler; `regs` readable.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_ctx_set_regs(
    ctx: *mut hotprobe_ctx,
    regs: *const hotprobe_regs,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let c = unsafe { ctx_arg(ctx) }?;
        // SAFETY: null or readable per the contract.
        let v = unsafe { regs.as_ref() }.ok_or_else(|| invalid("regs is NULL"))?;
        from_c_regs(v, c.regs_mut());
        Ok(HOTPROBE_OK)
    })
}

/// The `n`th integer argument at function entry (System V: rdi, rsi, rdx,
/// rcx, r8, r9; in a return handler, those the call was made with) into
/// `out`.
///
/// # Safety
/// `ctx` is the context of the running handler; `out` null or writable.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_ctx_arg(ctx: *mut hotprobe_ctx, n: u32, out: *mut u64) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let c = unsafe { ctx_arg(ctx) }?;
        let v = c
            .arg(n as usize)
            .ok_or_else(|| invalid(format!("argument {n}: only the first 6 are in registers")))?;
        // SAFETY: per this function's contract.
        unsafe { put(out, v) };
        Ok(HOTPROBE_OK)
    })
}

/// Reads `len` bytes of target memory at `addr` into `buf`; at most
/// [`HOTPROBE_MAX_READ`] per call.
///
/// # Safety
/// `ctx` is the context of the running handler; `buf` valid for `len`
/// writes.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_ctx_read(
    ctx: *mut hotprobe_ctx,
    addr: u64,
    buf: *mut c_void,
    len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let c = unsafe { ctx_arg(ctx) }?;
        if len == 0 {
            return Ok(HOTPROBE_OK);
        }
        if let Some(why) = limits::read_refused(buf, len) {
            return Err(invalid(why));
        }
        // SAFETY: non-null, valid for `len` writes per the contract.
        let b = unsafe { std::slice::from_raw_parts_mut(buf as *mut u8, len) };
        c.read_memory(addr, b)?;
        Ok(HOTPROBE_OK)
    })
}

/// Writes `len` bytes from `data` to target memory at `addr`.
///
/// # Safety
/// `ctx` is the context of the running handler; `data` valid for `len`
/// reads.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_ctx_write(
    ctx: *mut hotprobe_ctx,
    addr: u64,
    data: *const c_void,
    len: usize,
) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let c = unsafe { ctx_arg(ctx) }?;
        if len == 0 {
            return Ok(HOTPROBE_OK);
        }
        if data.is_null() {
            return Err(invalid("data is NULL"));
        }
        // SAFETY: non-null, valid for `len` reads per the contract.
        let b = unsafe { std::slice::from_raw_parts(data as *const u8, len) };
        c.write_memory(addr, b)?;
        Ok(HOTPROBE_OK)
    })
}

/// Stops [`hotprobe_run`] once this hit is handled (it returns
/// `HOTPROBE_END_STOPPED`; the targets stay stopped until the next run or
/// detach).
///
/// # Safety
/// `ctx` is the context of the running handler.
#[no_mangle]
pub unsafe extern "C" fn hotprobe_ctx_stop(ctx: *mut hotprobe_ctx) -> c_int {
    guard(|| {
        // SAFETY: per this function's contract.
        let c = unsafe { ctx_arg(ctx) }?;
        c.stop();
        Ok(HOTPROBE_OK)
    })
}
