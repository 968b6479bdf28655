//! The few QEMU plugin API functions the plugin uses, declared by hand.
//!
//! Debian ships no `qemu-plugin.h`; these follow QEMU 10.0's
//! `include/qemu/qemu-plugin.h`, API version 4 (`QEMU_PLUGIN_VERSION 4`:
//! conditional callbacks and scoreboards since 9.0, `qemu_plugin_insn_data`
//! copying into a buffer since version 3, `qemu_plugin_read_memory_vaddr`
//! since version 4). Only what is called is declared. The symbols are
//! resolved when QEMU `dlopen`s the plugin: QEMU exports them, and GLib
//! (for the `GByteArray`/`GArray` the register and memory API takes) is
//! already loaded in QEMU's global scope.

#![allow(non_camel_case_types, dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// `qemu_plugin_id_t`.
pub type qemu_plugin_id_t = u64;

/// `qemu_info_t` (system-emulation view).
#[repr(C)]
pub struct qemu_info_t {
    pub target_name: *const c_char,
    pub version_min: c_int,
    pub version_cur: c_int,
    pub system_emulation: bool,
    pub smp_vcpus: c_int,
    pub max_vcpus: c_int,
}

/// Opaque handles.
#[repr(C)]
pub struct qemu_plugin_tb {
    _p: [u8; 0],
}
#[repr(C)]
pub struct qemu_plugin_insn {
    _p: [u8; 0],
}
#[repr(C)]
pub struct qemu_plugin_scoreboard {
    _p: [u8; 0],
}
#[repr(C)]
pub struct qemu_plugin_register {
    _p: [u8; 0],
}

/// `qemu_plugin_u64`: a u64 member of a scoreboard entry.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct qemu_plugin_u64 {
    pub score: *mut qemu_plugin_scoreboard,
    pub offset: usize,
}

/// `qemu_plugin_reg_descriptor`.
#[repr(C)]
pub struct qemu_plugin_reg_descriptor {
    pub handle: *mut qemu_plugin_register,
    pub name: *const c_char,
    pub feature: *const c_char,
}

/// `enum qemu_plugin_cb_flags`.
pub const QEMU_PLUGIN_CB_NO_REGS: c_uint = 0;
pub const QEMU_PLUGIN_CB_R_REGS: c_uint = 1;

/// `enum qemu_plugin_cond`.
pub const QEMU_PLUGIN_COND_NE: c_uint = 3;
pub const QEMU_PLUGIN_COND_GT: c_uint = 6;

/// GLib's `GByteArray` / `GArray` public parts.
#[repr(C)]
pub struct GByteArray {
    pub data: *mut u8,
    pub len: c_uint,
}
#[repr(C)]
pub struct GArray {
    pub data: *mut c_char,
    pub len: c_uint,
}

pub type qemu_plugin_simple_cb_t = extern "C" fn(id: qemu_plugin_id_t);
pub type qemu_plugin_udata_cb_t = extern "C" fn(id: qemu_plugin_id_t, userdata: *mut c_void);
pub type qemu_plugin_vcpu_simple_cb_t = extern "C" fn(id: qemu_plugin_id_t, vcpu_index: c_uint);
pub type qemu_plugin_vcpu_udata_cb_t = extern "C" fn(vcpu_index: c_uint, userdata: *mut c_void);
pub type qemu_plugin_vcpu_tb_trans_cb_t =
    extern "C" fn(id: qemu_plugin_id_t, tb: *mut qemu_plugin_tb);

extern "C" {
    pub fn qemu_plugin_register_vcpu_init_cb(
        id: qemu_plugin_id_t,
        cb: qemu_plugin_vcpu_simple_cb_t,
    );
    pub fn qemu_plugin_register_vcpu_tb_trans_cb(
        id: qemu_plugin_id_t,
        cb: qemu_plugin_vcpu_tb_trans_cb_t,
    );
    pub fn qemu_plugin_register_atexit_cb(
        id: qemu_plugin_id_t,
        cb: qemu_plugin_udata_cb_t,
        userdata: *mut c_void,
    );
    pub fn qemu_plugin_register_vcpu_insn_exec_cond_cb(
        insn: *mut qemu_plugin_insn,
        cb: qemu_plugin_vcpu_udata_cb_t,
        flags: c_uint,
        cond: c_uint,
        entry: qemu_plugin_u64,
        imm: u64,
        userdata: *mut c_void,
    );
    pub fn qemu_plugin_tb_n_insns(tb: *const qemu_plugin_tb) -> usize;
    pub fn qemu_plugin_tb_get_insn(tb: *const qemu_plugin_tb, idx: usize) -> *mut qemu_plugin_insn;
    pub fn qemu_plugin_insn_vaddr(insn: *const qemu_plugin_insn) -> u64;
    pub fn qemu_plugin_insn_size(insn: *const qemu_plugin_insn) -> usize;
    pub fn qemu_plugin_insn_data(
        insn: *const qemu_plugin_insn,
        dest: *mut c_void,
        len: usize,
    ) -> usize;
    pub fn qemu_plugin_scoreboard_new(element_size: usize) -> *mut qemu_plugin_scoreboard;
    pub fn qemu_plugin_scoreboard_find(
        score: *mut qemu_plugin_scoreboard,
        vcpu_index: c_uint,
    ) -> *mut c_void;
    pub fn qemu_plugin_num_vcpus() -> c_int;
    pub fn qemu_plugin_get_registers() -> *mut GArray;
    pub fn qemu_plugin_read_register(
        handle: *mut qemu_plugin_register,
        buf: *mut GByteArray,
    ) -> c_int;
    pub fn qemu_plugin_read_memory_vaddr(addr: u64, data: *mut GByteArray, len: usize) -> bool;
    pub fn qemu_plugin_outs(s: *const c_char);
    pub fn qemu_plugin_request_time_control() -> *const c_void;

    pub fn g_byte_array_new() -> *mut GByteArray;
    pub fn g_byte_array_set_size(array: *mut GByteArray, length: c_uint) -> *mut GByteArray;
    pub fn g_array_free(array: *mut GArray, free_segment: c_int) -> *mut c_char;
}
