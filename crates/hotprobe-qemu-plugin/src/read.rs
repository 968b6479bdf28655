//! Reading the guest in a callback: registers, virtual memory, strings, the
//! current task and its fields.

use super::*;

impl Plugin {
    /// Register `r`, read once per callback (`cache`).
    pub(super) fn reg(&self, st: &Vcpu, cache: &mut [Option<u64>; N_REGS], r: Reg) -> u64 {
        *cache[r as usize].get_or_insert_with(|| self.read_reg(st, r))
    }

    pub(super) fn read_reg(&self, st: &Vcpu, r: Reg) -> u64 {
        let Some(regs) = self.regs.get() else {
            return 0;
        };
        let h = regs[r as usize];
        if h == 0 {
            return 0;
        }
        // SAFETY: our GByteArray; the handle is QEMU's; called from a
        // callback registered with QEMU_PLUGIN_CB_R_REGS.
        unsafe {
            g_byte_array_set_size(st.buf, 0);
            let n = qemu_plugin_read_register(h as *mut qemu_plugin_register, st.buf);
            let b = &*st.buf;
            match n {
                8.. if b.len >= 8 => (b.data as *const u64).read_unaligned(),
                4..=7 if b.len >= 4 => (b.data as *const u32).read_unaligned() as u64,
                _ => 0,
            }
        }
    }

    /// `len` bytes of guest virtual memory at `addr` into `out`.
    pub(super) fn read_mem(&self, st: &Vcpu, addr: u64, out: &mut [u8]) -> bool {
        if out.is_empty() {
            return true;
        }
        // SAFETY: our GByteArray; QEMU sizes it to `len` on success.
        unsafe {
            if !qemu_plugin_read_memory_vaddr(addr, st.buf, out.len()) {
                return false;
            }
            let b = &*st.buf;
            if (b.len as usize) < out.len() {
                return false;
            }
            std::ptr::copy_nonoverlapping(b.data, out.as_mut_ptr(), out.len());
        }
        true
    }

    pub(super) fn load(&self, st: &Vcpu, addr: u64, size: u8) -> u64 {
        let mut b = [0u8; 8];
        let n = (size as usize).clamp(1, 8);
        if !self.read_mem(st, addr, &mut b[..n]) {
            self.shm.header().read_errors.fetch_add(1, Relaxed);
            return 0;
        }
        u64::from_le_bytes(b)
    }

    /// A NUL-terminated guest string at `addr`, at most `max` bytes, read
    /// page by page (a read crossing into an unmapped page fails whole).
    pub(super) fn read_string(&self, st: &mut Vcpu, addr: u64, max: usize) -> usize {
        let max = max.min(st.data.len());
        let mut data = std::mem::take(&mut st.data);
        let mut got = 0;
        while got < max {
            let a = addr.wrapping_add(got as u64);
            let chunk = (4096 - (a & 4095) as usize).min(max - got);
            if !self.read_mem(st, a, &mut data[got..got + chunk]) {
                if got == 0 {
                    self.shm.header().read_errors.fetch_add(1, Relaxed);
                }
                break;
            }
            if let Some(z) = data[got..got + chunk].iter().position(|b| *b == 0) {
                got += z;
                st.data = data;
                return got;
            }
            got += chunk;
        }
        st.data = data;
        got
    }

    /// The guest's current `task_struct *` (`*(gs_base + layout.current)`),
    /// read once per callback (`cache`); 0 without a layout.
    pub(super) fn current_task(
        &self,
        st: &Vcpu,
        regs: &mut [Option<u64>; N_REGS],
        cache: &mut Option<u64>,
    ) -> u64 {
        if let Some(t) = *cache {
            return t;
        }
        let l = self.task_layout();
        let t = if l.is_known() {
            let gs = self.reg(st, regs, Reg::GsBase);
            self.load(st, gs.wrapping_add(l.current), 8)
        } else {
            0
        };
        *cache = Some(t);
        t
    }

    pub(super) fn task_layout(&self) -> TaskLayout {
        self.tables.get().map(|t| t.task).unwrap_or_default()
    }

    /// A field of the current task ([`Fetch::Task`]); 0 without a layout.
    pub(super) fn task_field(
        &self,
        st: &Vcpu,
        regs: &mut [Option<u64>; N_REGS],
        cache: &mut Option<u64>,
        f: TaskField,
    ) -> u64 {
        let t = self.current_task(st, regs, cache);
        if t == 0 {
            return 0;
        }
        let l = self.task_layout();
        match f {
            TaskField::Pointer => t,
            TaskField::Pid => self.load(st, t.wrapping_add(l.pid as u64), 4),
            TaskField::Tgid => self.load(st, t.wrapping_add(l.tgid as u64), 4),
            TaskField::Comm => self.load(st, t.wrapping_add(l.comm as u64), 8),
        }
    }
}
