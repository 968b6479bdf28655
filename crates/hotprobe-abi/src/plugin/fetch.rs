//! What an event carries: the guest registers and the fetches (task fields,
//! guest strings) a probe names.

/// Guest registers a [`Fetch`] can name (the plugin reads them through
/// QEMU's register API, by their gdb names).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reg {
    /// rax
    Rax = 0,
    /// rbx
    Rbx,
    /// rcx
    Rcx,
    /// rdx
    Rdx,
    /// rsi
    Rsi,
    /// rdi
    Rdi,
    /// rbp
    Rbp,
    /// rsp
    Rsp,
    /// r8
    R8,
    /// r9
    R9,
    /// r10
    R10,
    /// r11
    R11,
    /// r12
    R12,
    /// r13
    R13,
    /// r14
    R14,
    /// r15
    R15,
    /// rip
    Rip,
    /// eflags
    Eflags,
    /// cr3
    Cr3,
    /// gs_base (in the kernel: this CPU's per-cpu area)
    GsBase,
}

/// Number of [`Reg`]s.
pub const N_REGS: usize = 20;

impl Reg {
    /// Every register, in number order.
    pub const ALL: [Reg; N_REGS] = [
        Reg::Rax,
        Reg::Rbx,
        Reg::Rcx,
        Reg::Rdx,
        Reg::Rsi,
        Reg::Rdi,
        Reg::Rbp,
        Reg::Rsp,
        Reg::R8,
        Reg::R9,
        Reg::R10,
        Reg::R11,
        Reg::R12,
        Reg::R13,
        Reg::R14,
        Reg::R15,
        Reg::Rip,
        Reg::Eflags,
        Reg::Cr3,
        Reg::GsBase,
    ];

    /// The System V argument registers, in order (a kernel function's
    /// arguments; `__x64_sys_*` take a `struct pt_regs *` in rdi).
    pub const ARGS: [Reg; 6] = [Reg::Rdi, Reg::Rsi, Reg::Rdx, Reg::Rcx, Reg::R8, Reg::R9];

    /// Its gdb name (QEMU's x86-64 register description).
    pub const fn name(self) -> &'static str {
        [
            "rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp", "r8", "r9", "r10", "r11",
            "r12", "r13", "r14", "r15", "rip", "eflags", "cr3", "gs_base",
        ][self as usize]
    }

    /// The register numbered `n`.
    pub const fn from_index(n: usize) -> Option<Reg> {
        if n < N_REGS {
            Some(Reg::ALL[n])
        } else {
            None
        }
    }

    /// The register named `name` (gdb names).
    pub fn from_name(name: &str) -> Option<Reg> {
        Reg::ALL.iter().copied().find(|r| r.name() == name)
    }
}

/// How one value of an event is obtained in the plugin's callback.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fetch {
    /// A register.
    Reg(Reg),
    /// `size` bytes (1, 2, 4 or 8, zero-extended) of guest memory at
    /// `reg + offset` (a guest virtual address).
    Load {
        /// Base register.
        reg: Reg,
        /// Byte offset.
        offset: i32,
        /// 1, 2, 4 or 8.
        size: u8,
    },
    /// `size` bytes at `value[index] + offset`, `index` an earlier value
    /// of the same event (a field of a structure pointed to by a field).
    LoadValue {
        /// The earlier value.
        index: u8,
        /// Byte offset.
        offset: i32,
        /// 1, 2, 4 or 8.
        size: u8,
    },
    /// A field of the guest's current task (Linux): read through the
    /// per-cpu `current_task` pointer at `gs_base` + the header's
    /// [`TaskLayout`] (0 when hotprobe gave no layout).
    Task(TaskField),
}

/// A field of the current task a [`Fetch::Task`] reads.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskField {
    /// `task_struct.pid` (the thread id).
    Pid = 0,
    /// `task_struct.tgid` (the process id).
    Tgid = 1,
    /// The first 8 bytes of `task_struct.comm`, little-endian.
    Comm = 2,
    /// The `task_struct *` itself.
    Pointer = 3,
}

/// Where Linux keeps the current task and its fields, for [`Fetch::Task`]:
/// byte offsets (from the kernel's BTF), written by hotprobe before the
/// freeze. All zero: unknown.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskLayout {
    /// Offset of the `current_task` pointer in the per-cpu area (gs_base).
    pub current: u64,
    /// `task_struct.pid`.
    pub pid: u32,
    /// `task_struct.tgid`.
    pub tgid: u32,
    /// `task_struct.comm`.
    pub comm: u32,
    /// Reserved.
    pub _pad: u32,
}

impl TaskLayout {
    /// Whether hotprobe gave one.
    pub const fn is_known(&self) -> bool {
        self.pid != 0 && self.comm != 0
    }
}

const FETCH_REG: u64 = 1;
const FETCH_LOAD: u64 = 2;
const FETCH_LOAD_VALUE: u64 = 3;
const FETCH_TASK: u64 = 4;

impl Fetch {
    /// `struct pt_regs` field `index` (0 = r15 … 14 = di, 15 = orig_ax, 16
    /// = ip …) as a load through `rdi`: the `pt_regs *` a `__x64_sys_*`
    /// wrapper gets.
    pub const fn pt_regs_field(index: u32) -> Fetch {
        Fetch::Load {
            reg: Reg::Rdi,
            offset: (index * 8) as i32,
            size: 8,
        }
    }

    /// The packed form stored in [`ProbeDef::fetch`](super::ProbeDef::fetch): `op | reg << 4 |
    /// size_log2 << 9 | index << 12 | offset << 32`.
    pub const fn encode(self) -> u64 {
        const fn log2(s: u8) -> u64 {
            match s {
                1 => 0,
                2 => 1,
                4 => 2,
                _ => 3,
            }
        }
        match self {
            Fetch::Reg(r) => FETCH_REG | (r as u64) << 4,
            Fetch::Load { reg, offset, size } => {
                FETCH_LOAD | (reg as u64) << 4 | log2(size) << 9 | (offset as u32 as u64) << 32
            }
            Fetch::LoadValue {
                index,
                offset,
                size,
            } => {
                FETCH_LOAD_VALUE
                    | log2(size) << 9
                    | ((index & 7) as u64) << 12
                    | (offset as u32 as u64) << 32
            }
            Fetch::Task(f) => FETCH_TASK | (f as u64) << 4,
        }
    }

    /// The fetch packed in `w` (`None` for 0 or garbage).
    pub const fn decode(w: u64) -> Option<Fetch> {
        let size = 1u8 << ((w >> 9) & 3);
        let offset = (w >> 32) as u32 as i32;
        let reg = match Reg::from_index(((w >> 4) & 31) as usize) {
            Some(r) => r,
            None => return None,
        };
        match w & 15 {
            FETCH_REG => Some(Fetch::Reg(reg)),
            FETCH_LOAD => Some(Fetch::Load { reg, offset, size }),
            FETCH_LOAD_VALUE => Some(Fetch::LoadValue {
                index: ((w >> 12) & 7) as u8,
                offset,
                size,
            }),
            FETCH_TASK => match (w >> 4) & 31 {
                0 => Some(Fetch::Task(TaskField::Pid)),
                1 => Some(Fetch::Task(TaskField::Tgid)),
                2 => Some(Fetch::Task(TaskField::Comm)),
                3 => Some(Fetch::Task(TaskField::Pointer)),
                _ => None,
            },
            _ => None,
        }
    }
}

/// A guest string an event carries: the NUL-terminated bytes at
/// `value[index]`, at most `max_len` (and what the slot holds).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StringFetch {
    /// The value holding the string's guest address.
    pub index: u8,
    /// Bytes at most.
    pub max_len: u16,
}

impl StringFetch {
    /// Packed: `1 | index << 8 | max_len << 16` (0: none).
    pub const fn encode(s: Option<StringFetch>) -> u64 {
        match s {
            None => 0,
            Some(s) => 1 | (s.index as u64) << 8 | (s.max_len as u64) << 16,
        }
    }

    /// See [`StringFetch::encode`].
    pub const fn decode(w: u64) -> Option<StringFetch> {
        if w & 1 == 0 {
            return None;
        }
        Some(StringFetch {
            index: ((w >> 8) & 7) as u8,
            max_len: (w >> 16) as u16,
        })
    }
}
