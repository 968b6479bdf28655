//! The x86-64 register file as the engine and handlers see it.

/// General-purpose registers, instruction pointer and flags of one thread,
/// plus the few extras some targets have (`orig_rax` for processes, `cr3`
/// for guests; zero where a target has none).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Registers {
    pub rax: u64,
    pub rbx: u64,
    pub rcx: u64,
    pub rdx: u64,
    pub rsi: u64,
    pub rdi: u64,
    pub rbp: u64,
    pub rsp: u64,
    pub r8: u64,
    pub r9: u64,
    pub r10: u64,
    pub r11: u64,
    pub r12: u64,
    pub r13: u64,
    pub r14: u64,
    pub r15: u64,
    pub rip: u64,
    pub rflags: u64,
    pub cs: u64,
    pub ss: u64,
    pub ds: u64,
    pub es: u64,
    pub fs: u64,
    pub gs: u64,
    pub fs_base: u64,
    pub gs_base: u64,
    /// The syscall number a process thread entered the kernel with.
    pub orig_rax: u64,
    /// A guest vCPU's page-table root.
    pub cr3: u64,
}

impl Registers {
    /// The `n`th integer argument (0-based) under the System V AMD64 calling
    /// convention: rdi, rsi, rdx, rcx, r8, r9; `None` past the sixth.
    pub fn arg(&self, n: usize) -> Option<u64> {
        Some(match n {
            0 => self.rdi,
            1 => self.rsi,
            2 => self.rdx,
            3 => self.rcx,
            4 => self.r8,
            5 => self.r9,
            _ => return None,
        })
    }

    /// Set the `n`th integer argument; returns false past the sixth.
    pub fn set_arg(&mut self, n: usize, value: u64) -> bool {
        let slot = match n {
            0 => &mut self.rdi,
            1 => &mut self.rsi,
            2 => &mut self.rdx,
            3 => &mut self.rcx,
            4 => &mut self.r8,
            5 => &mut self.r9,
            _ => return false,
        };
        *slot = value;
        true
    }

    /// The integer return value (rax).
    pub fn return_value(&self) -> u64 {
        self.rax
    }

    /// Set the integer return value (rax).
    pub fn set_return_value(&mut self, value: u64) {
        self.rax = value;
    }

    /// A register by its lower-case name (`rax`, `rip`, `r12`, `rflags`, ...).
    pub fn by_name(&self, name: &str) -> Option<u64> {
        let mut copy = *self;
        copy.by_name_mut(name).map(|r| *r)
    }

    /// A mutable reference to a register by its lower-case name.
    pub fn by_name_mut(&mut self, name: &str) -> Option<&mut u64> {
        Some(match name {
            "rax" => &mut self.rax,
            "rbx" => &mut self.rbx,
            "rcx" => &mut self.rcx,
            "rdx" => &mut self.rdx,
            "rsi" => &mut self.rsi,
            "rdi" => &mut self.rdi,
            "rbp" => &mut self.rbp,
            "rsp" => &mut self.rsp,
            "r8" => &mut self.r8,
            "r9" => &mut self.r9,
            "r10" => &mut self.r10,
            "r11" => &mut self.r11,
            "r12" => &mut self.r12,
            "r13" => &mut self.r13,
            "r14" => &mut self.r14,
            "r15" => &mut self.r15,
            "rip" => &mut self.rip,
            "rflags" | "eflags" => &mut self.rflags,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysv_arguments() {
        let mut r = Registers::default();
        for n in 0..6 {
            assert!(r.set_arg(n, 100 + n as u64));
        }
        assert!(!r.set_arg(6, 1));
        assert_eq!(r.rdi, 100);
        assert_eq!(r.r9, 105);
        assert_eq!(r.arg(3), Some(103));
        assert_eq!(r.arg(6), None);
        assert_eq!(r.by_name("rcx"), Some(103));
    }
}
