//! Decoding Linux x86-64 system calls for `hotprobe guest syscalls`: each
//! `__x64_sys_NAME` wrapper gets a `struct pt_regs *` in rdi, whose fields
//! hold the user's arguments ([`arg_fetches`]); [`format_call`] and
//! [`format_return`] print them as strace does (numbers, the path read in
//! the plugin, flags by name, negative errno by name).
//!
//! The argument kinds of the common calls are a hand-written table, as
//! strace's is (no crate describes Linux's system calls this way); a call
//! not in it is printed with its arguments in hex.

use hotprobe_qemu::{Fetch, StringFetch, TaskField};

/// How one argument is printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arg {
    /// A signed int.
    Int,
    /// A file descriptor.
    Fd,
    /// A directory fd (`AT_FDCWD`).
    DirFd,
    /// A size or count (unsigned decimal).
    Size,
    /// A user pointer (hex, `NULL`).
    Ptr,
    /// A NUL-terminated path (read in the plugin).
    Path,
    /// `open` flags.
    OpenFlags,
    /// A mode (octal).
    Mode,
    /// `mmap`/`mprotect` protection.
    Prot,
    /// `mmap` flags.
    MapFlags,
    /// `lseek` whence.
    Whence,
    /// `AT_*` flags.
    AtFlags,
    /// Anything else (hex).
    Hex,
}

use Arg::*;

/// The common calls' arguments, by name (without `__x64_sys_`).
static TABLE: &[(&str, &[Arg])] = &[
    ("read", &[Fd, Ptr, Size]),
    ("write", &[Fd, Ptr, Size]),
    ("pread64", &[Fd, Ptr, Size, Int]),
    ("pwrite64", &[Fd, Ptr, Size, Int]),
    ("readv", &[Fd, Ptr, Int]),
    ("writev", &[Fd, Ptr, Int]),
    ("open", &[Path, OpenFlags, Mode]),
    ("openat", &[DirFd, Path, OpenFlags, Mode]),
    ("creat", &[Path, Mode]),
    ("close", &[Fd]),
    ("lseek", &[Fd, Int, Whence]),
    ("mmap", &[Ptr, Size, Prot, MapFlags, Fd, Hex]),
    ("mprotect", &[Ptr, Size, Prot]),
    ("munmap", &[Ptr, Size]),
    ("brk", &[Ptr]),
    ("stat", &[Path, Ptr]),
    ("lstat", &[Path, Ptr]),
    ("newstat", &[Path, Ptr]),
    ("newlstat", &[Path, Ptr]),
    ("fstat", &[Fd, Ptr]),
    ("newfstat", &[Fd, Ptr]),
    ("newfstatat", &[DirFd, Path, Ptr, AtFlags]),
    ("statx", &[DirFd, Path, AtFlags, Hex, Ptr]),
    ("access", &[Path, Int]),
    ("faccessat", &[DirFd, Path, Int]),
    ("faccessat2", &[DirFd, Path, Int, AtFlags]),
    ("readlink", &[Path, Ptr, Size]),
    ("readlinkat", &[DirFd, Path, Ptr, Size]),
    ("unlink", &[Path]),
    ("unlinkat", &[DirFd, Path, AtFlags]),
    ("mkdir", &[Path, Mode]),
    ("mkdirat", &[DirFd, Path, Mode]),
    ("rmdir", &[Path]),
    ("chdir", &[Path]),
    ("fchdir", &[Fd]),
    ("chmod", &[Path, Mode]),
    ("execve", &[Path, Ptr, Ptr]),
    ("dup", &[Fd]),
    ("dup2", &[Fd, Fd]),
    ("dup3", &[Fd, Fd, Hex]),
    ("pipe", &[Ptr]),
    ("pipe2", &[Ptr, OpenFlags]),
    ("fcntl", &[Fd, Int, Hex]),
    ("ioctl", &[Fd, Hex, Hex]),
    ("getdents64", &[Fd, Ptr, Size]),
    ("exit", &[Int]),
    ("exit_group", &[Int]),
    ("getpid", &[]),
    ("getppid", &[]),
    ("gettid", &[]),
    ("getuid", &[]),
    ("geteuid", &[]),
    ("getgid", &[]),
    ("getegid", &[]),
    ("sync", &[]),
    ("sched_yield", &[]),
    ("kill", &[Int, Int]),
    ("wait4", &[Int, Ptr, Hex, Ptr]),
    ("nanosleep", &[Ptr, Ptr]),
    ("clock_nanosleep", &[Int, Hex, Ptr, Ptr]),
    ("mount", &[Path, Path, Ptr, Hex, Ptr]),
    ("umask", &[Mode]),
    ("uname", &[Ptr]),
    ("reboot", &[Hex, Hex, Hex, Ptr]),
    // What a libc's start and a shell make besides (issue 24: a call
    // missing here printed four fetched registers it does not have).
    ("set_tid_address", &[Ptr]),
    ("set_robust_list", &[Ptr, Size]),
    ("rseq", &[Ptr, Size, Hex, Hex]),
    ("arch_prctl", &[Hex, Hex]),
    ("prlimit64", &[Int, Int, Ptr, Ptr]),
    ("getrandom", &[Ptr, Size, Hex]),
    ("futex", &[Ptr, Int, Int, Ptr, Ptr, Int]),
    ("rt_sigaction", &[Int, Ptr, Ptr, Size]),
    ("rt_sigprocmask", &[Int, Ptr, Ptr, Size]),
    ("rt_sigreturn", &[]),
    ("sigaltstack", &[Ptr, Ptr]),
    ("clone3", &[Ptr, Size]),
    ("fork", &[]),
    ("vfork", &[]),
    ("setpgid", &[Int, Int]),
    ("getpgid", &[Int]),
    ("setsid", &[]),
    ("getcwd", &[Ptr, Size]),
    ("poll", &[Ptr, Size, Int]),
    ("ppoll", &[Ptr, Size, Ptr, Ptr, Size]),
    ("select", &[Int, Ptr, Ptr, Ptr, Ptr]),
    ("pselect6", &[Int, Ptr, Ptr, Ptr, Ptr, Ptr]),
    ("socket", &[Int, Int, Int]),
    ("connect", &[Fd, Ptr, Size]),
    ("sendto", &[Fd, Ptr, Size, Hex, Ptr, Size]),
    ("recvfrom", &[Fd, Ptr, Size, Hex, Ptr, Ptr]),
    ("madvise", &[Ptr, Size, Int]),
    ("mremap", &[Ptr, Size, Size, Hex, Ptr]),
    ("sysinfo", &[Ptr]),
    ("times", &[Ptr]),
    ("gettimeofday", &[Ptr, Ptr]),
    ("clock_gettime", &[Int, Ptr]),
    ("getrusage", &[Int, Ptr]),
    ("prctl", &[Int, Hex, Hex, Hex, Hex]),
    ("fchmod", &[Fd, Mode]),
    ("fchown", &[Fd, Int, Int]),
    ("chown", &[Path, Int, Int]),
    ("rename", &[Path, Path]),
    ("renameat2", &[DirFd, Path, DirFd, Path, Hex]),
    ("symlink", &[Path, Path]),
    ("link", &[Path, Path]),
    ("truncate", &[Path, Size]),
    ("ftruncate", &[Fd, Size]),
    ("fsync", &[Fd]),
    ("fdatasync", &[Fd]),
    ("getdents", &[Fd, Ptr, Size]),
    ("statfs", &[Path, Ptr]),
    ("fstatfs", &[Fd, Ptr]),
    ("sendfile64", &[Fd, Fd, Ptr, Size]),
    ("epoll_create1", &[Hex]),
    ("epoll_ctl", &[Fd, Int, Fd, Ptr]),
    ("epoll_wait", &[Fd, Ptr, Int, Int]),
    ("eventfd2", &[Int, Hex]),
    ("memfd_create", &[Path, Hex]),
];

/// The argument kinds of call `name` (without `__x64_sys_`), if known.
pub fn args_of(name: &str) -> Option<&'static [Arg]> {
    TABLE.iter().find(|(n, _)| *n == name).map(|(_, a)| *a)
}

/// `struct pt_regs` field index of the user's argument `i` (di, si, dx,
/// r10, r8, r9).
const PT_REGS_ARGS: [u32; 6] = [14, 13, 12, 7, 9, 8];

/// Arguments an event carries besides the task fields.
pub const MAX_ARGS: usize = 4;

/// The values a syscall probe's entry event carries: the first
/// [`MAX_ARGS`] arguments (fewer if the call has fewer), then the task's
/// pid, then, if `comm`, the first 8 bytes of its name; and the string to
/// read (the first `Path` argument among them).
pub fn arg_fetches(name: &str, comm: bool) -> (Vec<Fetch>, Option<StringFetch>) {
    let n = args_of(name).map_or(MAX_ARGS, |a| a.len().min(MAX_ARGS));
    let mut v: Vec<Fetch> = PT_REGS_ARGS[..n]
        .iter()
        .map(|&i| Fetch::pt_regs_field(i))
        .collect();
    v.push(Fetch::Task(TaskField::Pid));
    if comm {
        v.push(Fetch::Task(TaskField::Comm));
    }
    let string = args_of(name)
        .and_then(|a| a.iter().take(n).position(|k| *k == Path))
        .map(|i| StringFetch {
            index: i as u8,
            max_len: 160,
        });
    (v, string)
}

/// The first 8 bytes of a task name as [`TaskField::Comm`] reads them.
pub fn comm_word(name: &str) -> u64 {
    let mut b = [0u8; 8];
    let n = name.len().min(8);
    b[..n].copy_from_slice(&name.as_bytes()[..n]);
    u64::from_le_bytes(b)
}

/// `name(args)` as strace prints it; `args` are the values fetched (the
/// call's first ones), `path` the string read.
pub fn format_call(name: &str, args: &[u64], path: Option<&[u8]>) -> String {
    let kinds = args_of(name);
    let mut out = format!("{name}(");
    // open/openat: the mode only with O_CREAT or O_TMPFILE, as strace.
    let mut n = kinds.map_or(args.len(), |k| k.len().min(args.len()));
    let mut total = kinds.map_or(n, |k| k.len());
    if let Some(k) = kinds {
        if let Some(f) = k.iter().position(|a| *a == OpenFlags) {
            if k.get(f + 1) == Some(&Mode) && f < n && args[f] & 0o20100100 == 0 {
                n = n.min(f + 1);
                total = f + 1;
            }
        }
    }
    let first_path = kinds.and_then(|k| k.iter().position(|a| *a == Path));
    for (i, &v) in args[..n].iter().enumerate() {
        if i > 0 {
            out.push_str(", ");
        }
        let k = kinds.map_or(Hex, |k| k[i]);
        // The plugin reads one string: the first path.
        let p = if Some(i) == first_path { path } else { None };
        out.push_str(&format_arg(k, v, p));
    }
    if total > n || kinds.is_none() {
        out.push_str(if n > 0 { ", ..." } else { "..." });
    }
    out.push(')');
    out
}

fn format_arg(k: Arg, v: u64, path: Option<&[u8]>) -> String {
    match k {
        Int => (v as i64 as i32).to_string(),
        Fd => (v as i32).to_string(),
        DirFd if v as i32 == -100 => "AT_FDCWD".into(),
        DirFd => (v as i32).to_string(),
        Size => v.to_string(),
        Ptr if v == 0 => "NULL".into(),
        Ptr | Hex => format!("{v:#x}"),
        Path => match path {
            Some(p) => quote(p),
            None => format!("{v:#x}"),
        },
        OpenFlags => open_flags(v),
        Mode if v & 0o7777 == 0 => "0".into(),
        Mode => format!("0{:o}", v & 0o7777),
        Prot => prot(v),
        MapFlags => map_flags(v),
        Whence => match v {
            0 => "SEEK_SET".into(),
            1 => "SEEK_CUR".into(),
            2 => "SEEK_END".into(),
            _ => v.to_string(),
        },
        AtFlags => flags(
            v,
            &[
                (0x100, "AT_SYMLINK_NOFOLLOW"),
                (0x200, "AT_REMOVEDIR"),
                (0x400, "AT_SYMLINK_FOLLOW"),
                (0x800, "AT_NO_AUTOMOUNT"),
                (0x1000, "AT_EMPTY_PATH"),
            ],
            "0",
        ),
    }
}

/// A C string literal, as strace quotes it.
pub fn quote(b: &[u8]) -> String {
    let mut s = String::from("\"");
    for &c in b {
        match c {
            b'"' => s.push_str("\\\""),
            b'\\' => s.push_str("\\\\"),
            b'\n' => s.push_str("\\n"),
            b'\t' => s.push_str("\\t"),
            0x20..=0x7e => s.push(c as char),
            _ => s.push_str(&format!("\\x{c:02x}")),
        }
    }
    s.push('"');
    s
}

fn flags(v: u64, names: &[(u64, &str)], zero: &str) -> String {
    let mut parts = Vec::new();
    let mut rest = v;
    for &(bit, n) in names {
        if rest & bit == bit && bit != 0 {
            parts.push(n.to_string());
            rest &= !bit;
        }
    }
    if rest != 0 {
        parts.push(format!("{rest:#x}"));
    }
    if parts.is_empty() {
        zero.into()
    } else {
        parts.join("|")
    }
}

/// `open` flags: the access mode, then the flags set.
pub fn open_flags(v: u64) -> String {
    let acc = match v & 3 {
        0 => "O_RDONLY",
        1 => "O_WRONLY",
        2 => "O_RDWR",
        _ => "O_ACCMODE",
    };
    let rest = flags(
        v & !3,
        &[
            (0o20200000, "O_TMPFILE"),
            (0o4010000, "O_SYNC"),
            (0o100, "O_CREAT"),
            (0o200, "O_EXCL"),
            (0o400, "O_NOCTTY"),
            (0o1000, "O_TRUNC"),
            (0o2000, "O_APPEND"),
            (0o4000, "O_NONBLOCK"),
            (0o10000, "O_DSYNC"),
            (0o20000, "O_ASYNC"),
            (0o40000, "O_DIRECT"),
            (0o100000, "O_LARGEFILE"),
            (0o200000, "O_DIRECTORY"),
            (0o400000, "O_NOFOLLOW"),
            (0o1000000, "O_NOATIME"),
            (0o2000000, "O_CLOEXEC"),
            (0o10000000, "O_PATH"),
        ],
        "",
    );
    if rest.is_empty() {
        acc.into()
    } else {
        format!("{acc}|{rest}")
    }
}

/// `PROT_*`.
pub fn prot(v: u64) -> String {
    flags(
        v,
        &[(1, "PROT_READ"), (2, "PROT_WRITE"), (4, "PROT_EXEC")],
        "PROT_NONE",
    )
}

/// `MAP_*`.
pub fn map_flags(v: u64) -> String {
    flags(
        v,
        &[
            (0x01, "MAP_SHARED"),
            (0x02, "MAP_PRIVATE"),
            (0x03, "MAP_SHARED_VALIDATE"),
            (0x10, "MAP_FIXED"),
            (0x20, "MAP_ANONYMOUS"),
            (0x100, "MAP_GROWSDOWN"),
            (0x800, "MAP_DENYWRITE"),
            (0x1000, "MAP_EXECUTABLE"),
            (0x2000, "MAP_LOCKED"),
            (0x4000, "MAP_NORESERVE"),
            (0x8000, "MAP_POPULATE"),
            (0x10000, "MAP_NONBLOCK"),
            (0x20000, "MAP_STACK"),
            (0x40000, "MAP_HUGETLB"),
            (0x100000, "MAP_FIXED_NOREPLACE"),
        ],
        "0",
    )
}

/// The name of errno `n` (the table is shared with the host kernel's
/// events: hotprobe-target).
pub use hotprobe_target::syscalls::errno_name;

/// ` = RET` as strace prints it: `-1 ENOENT` for an error, hex for
/// `mmap`/`brk` addresses.
pub fn format_return(name: &str, ret: u64) -> String {
    let r = ret as i64;
    if (-4095..0).contains(&r) {
        let e = (-r) as u32;
        return match errno_name(e) {
            Some(n) => format!("-1 {n}"),
            None => format!("-1 errno {e}"),
        };
    }
    match name {
        "mmap" | "brk" => format!("{ret:#x}"),
        _ => r.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_libc_start_prints_each_call_with_its_own_arity() {
        assert_eq!(
            format_call("set_tid_address", &[0x4ac2b0, 2, 3, 4], None),
            "set_tid_address(0x4ac2b0)"
        );
        assert_eq!(
            format_call("set_robust_list", &[0x1000, 24, 3, 4], None),
            "set_robust_list(0x1000, 24)"
        );
        assert_eq!(
            format_call("rt_sigreturn", &[1, 2, 3, 4], None),
            "rt_sigreturn()"
        );
        // Known arity above what an event carries: the rest is elided.
        assert_eq!(
            format_call("futex", &[0x10, 0, 1, 0], None),
            "futex(0x10, 0, 1, NULL, ...)"
        );
        for (name, _) in TABLE {
            let n = TABLE.iter().filter(|(m, _)| m == name).count();
            assert_eq!(n, 1, "{name} twice in the table");
        }
    }

    #[test]
    fn decodes_like_strace() {
        assert_eq!(
            format_call(
                "openat",
                &[(-100i64) as u64, 0x1000, 0o2000000, 0],
                Some(b"/etc/x")
            ),
            "openat(AT_FDCWD, \"/etc/x\", O_RDONLY|O_CLOEXEC)"
        );
        assert_eq!(
            format_call("openat", &[3, 0x1000, 0o101, 0o644], Some(b"x")),
            "openat(3, \"x\", O_WRONLY|O_CREAT, 0644)"
        );
        assert_eq!(
            format_call("mount", &[1, 2, 3, 4], Some(b"proc")),
            "mount(\"proc\", 0x2, 0x3, 0x4, ...)"
        );
        assert_eq!(
            format_call("read", &[3, 0x7ffd0000, 100], None),
            "read(3, 0x7ffd0000, 100)"
        );
        assert_eq!(format_call("close", &[3, 9, 9, 9], None), "close(3)");
        assert_eq!(format_call("getppid", &[1, 2, 3, 4], None), "getppid()");
        assert_eq!(
            format_call("mmap", &[0, 4096, 3, 0x22], None),
            "mmap(NULL, 4096, PROT_READ|PROT_WRITE, MAP_PRIVATE|MAP_ANONYMOUS, ...)"
        );
        assert_eq!(format_call("frob", &[1, 2], None), "frob(0x1, 0x2, ...)");
        assert_eq!(format_return("openat", (-2i64) as u64), "-1 ENOENT");
        assert_eq!(format_return("read", 12), "12");
        assert_eq!(format_return("read", (-512i64) as u64), "-1 ERESTARTSYS");
        assert_eq!(format_return("mmap", 0x7f00_0000), "0x7f000000");
        assert_eq!(open_flags(0o101 | 0o1000), "O_WRONLY|O_CREAT|O_TRUNC");
        assert_eq!(prot(0), "PROT_NONE");
        assert_eq!(quote(b"a\"b\n"), "\"a\\\"b\\n\"");
        assert_eq!(comm_word("workload"), u64::from_le_bytes(*b"workload"));
        let (f, s) = arg_fetches("openat", true);
        assert_eq!(f.len(), 6);
        assert_eq!(s.map(|s| s.index), Some(1));
        let (f, s) = arg_fetches("getppid", false);
        assert_eq!(f, vec![Fetch::Task(TaskField::Pid)]);
        assert!(s.is_none());
    }
}
