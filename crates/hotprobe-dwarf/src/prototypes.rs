//! Prototypes of common C library functions, for a libc without DWARF (no
//! debug package installed), as ltrace's prototype file gives them: a
//! `const char *` is shown as a string, a `size_t` as an unsigned size, a
//! file descriptor as an int. Parameters sit where the System V AMD64 ABI
//! puts them (integer registers in order), which is where the plan looks
//! for a signature whose locations are unknown.
//!
//! Only functions whose C prototype is fixed by POSIX or ISO C are listed;
//! variadic ones give their fixed parameters.

use crate::types::{EntryLoc, Param, Signature, Type};

/// A parameter or return type in the table.
#[derive(Clone, Copy)]
enum T {
    Void,
    /// `int`, `pid_t`, a file descriptor, flags.
    Int,
    /// `unsigned int`, `mode_t`.
    UInt,
    /// `long`, `off_t`, `ssize_t`.
    Long,
    /// `size_t`, `unsigned long`.
    Size,
    /// `const char *`: a NUL-terminated string.
    Str,
    /// Any other pointer (`void *`, `FILE *`, a struct).
    Ptr,
    /// `double`.
    Double,
}

/// (names, return, parameters): the names are aliases of one prototype.
type Row = (&'static [&'static str], T, &'static [(&'static str, T)]);

use T::*;

const TABLE: &[Row] = &[
    (
        &["open", "open64", "__open64", "__open"],
        Int,
        &[("path", Str), ("flags", Int), ("mode", UInt)],
    ),
    (
        &["openat", "openat64"],
        Int,
        &[
            ("dirfd", Int),
            ("path", Str),
            ("flags", Int),
            ("mode", UInt),
        ],
    ),
    (&["creat", "creat64"], Int, &[("path", Str), ("mode", UInt)]),
    (&["close"], Int, &[("fd", Int)]),
    (
        &["read", "__read"],
        Long,
        &[("fd", Int), ("buf", Ptr), ("nbytes", Size)],
    ),
    (
        &["write", "__write"],
        Long,
        &[("fd", Int), ("buf", Ptr), ("nbytes", Size)],
    ),
    (
        &["pread", "pread64"],
        Long,
        &[
            ("fd", Int),
            ("buf", Ptr),
            ("nbytes", Size),
            ("offset", Long),
        ],
    ),
    (
        &["pwrite", "pwrite64"],
        Long,
        &[
            ("fd", Int),
            ("buf", Ptr),
            ("nbytes", Size),
            ("offset", Long),
        ],
    ),
    (
        &["lseek", "lseek64"],
        Long,
        &[("fd", Int), ("offset", Long), ("whence", Int)],
    ),
    (&["fsync", "fdatasync"], Int, &[("fd", Int)]),
    (
        &["ftruncate", "ftruncate64"],
        Int,
        &[("fd", Int), ("length", Long)],
    ),
    (
        &["truncate", "truncate64"],
        Int,
        &[("path", Str), ("length", Long)],
    ),
    (&["dup"], Int, &[("fd", Int)]),
    (&["dup2"], Int, &[("fd", Int), ("fd2", Int)]),
    (&["pipe", "pipe2"], Int, &[("fds", Ptr), ("flags", Int)]),
    (&["fcntl", "fcntl64"], Int, &[("fd", Int), ("cmd", Int)]),
    (&["ioctl"], Int, &[("fd", Int), ("request", Size)]),
    (
        &["fopen", "fopen64", "_IO_new_fopen"],
        Ptr,
        &[("path", Str), ("mode", Str)],
    ),
    (
        &["freopen", "freopen64"],
        Ptr,
        &[("path", Str), ("mode", Str), ("stream", Ptr)],
    ),
    (&["fdopen"], Ptr, &[("fd", Int), ("mode", Str)]),
    (&["fclose"], Int, &[("stream", Ptr)]),
    (&["fflush"], Int, &[("stream", Ptr)]),
    (
        &["fread", "fread_unlocked"],
        Size,
        &[("ptr", Ptr), ("size", Size), ("n", Size), ("stream", Ptr)],
    ),
    (
        &["fwrite", "fwrite_unlocked"],
        Size,
        &[("ptr", Ptr), ("size", Size), ("n", Size), ("stream", Ptr)],
    ),
    (
        &["fputs", "fputs_unlocked"],
        Int,
        &[("s", Str), ("stream", Ptr)],
    ),
    (&["fgets"], Ptr, &[("s", Ptr), ("n", Int), ("stream", Ptr)]),
    (&["puts"], Int, &[("s", Str)]),
    (
        &["fputc", "putc", "fputc_unlocked"],
        Int,
        &[("c", Int), ("stream", Ptr)],
    ),
    (&["putchar"], Int, &[("c", Int)]),
    (&["printf"], Int, &[("format", Str)]),
    (
        &["fprintf", "dprintf"],
        Int,
        &[("stream", Ptr), ("format", Str)],
    ),
    (&["sprintf"], Int, &[("s", Ptr), ("format", Str)]),
    (
        &["snprintf"],
        Int,
        &[("s", Ptr), ("maxlen", Size), ("format", Str)],
    ),
    (&["perror"], Void, &[("s", Str)]),
    (&["malloc"], Ptr, &[("size", Size)]),
    (&["calloc"], Ptr, &[("nmemb", Size), ("size", Size)]),
    (&["realloc"], Ptr, &[("ptr", Ptr), ("size", Size)]),
    (
        &["reallocarray"],
        Ptr,
        &[("ptr", Ptr), ("nmemb", Size), ("size", Size)],
    ),
    (&["free", "cfree"], Void, &[("ptr", Ptr)]),
    (
        &["posix_memalign"],
        Int,
        &[("memptr", Ptr), ("alignment", Size), ("size", Size)],
    ),
    (
        &["aligned_alloc", "memalign"],
        Ptr,
        &[("alignment", Size), ("size", Size)],
    ),
    (&["strlen"], Size, &[("s", Str)]),
    (&["strnlen"], Size, &[("s", Str), ("maxlen", Size)]),
    (&["strcmp", "strcoll"], Int, &[("s1", Str), ("s2", Str)]),
    (&["strcasecmp"], Int, &[("s1", Str), ("s2", Str)]),
    (
        &["strncmp", "strncasecmp"],
        Int,
        &[("s1", Str), ("s2", Str), ("n", Size)],
    ),
    (&["strcpy", "stpcpy"], Ptr, &[("dest", Ptr), ("src", Str)]),
    (
        &["strncpy", "stpncpy"],
        Ptr,
        &[("dest", Ptr), ("src", Str), ("n", Size)],
    ),
    (&["strcat"], Ptr, &[("dest", Ptr), ("src", Str)]),
    (
        &["strncat"],
        Ptr,
        &[("dest", Ptr), ("src", Str), ("n", Size)],
    ),
    (&["strdup", "__strdup"], Ptr, &[("s", Str)]),
    (&["strndup"], Ptr, &[("s", Str), ("n", Size)]),
    (
        &["strchr", "strrchr", "index", "rindex"],
        Ptr,
        &[("s", Str), ("c", Int)],
    ),
    (
        &["strstr", "strcasestr"],
        Ptr,
        &[("haystack", Str), ("needle", Str)],
    ),
    (
        &["strtol", "strtoul", "strtoll", "strtoull"],
        Long,
        &[("nptr", Str), ("endptr", Ptr), ("base", Int)],
    ),
    (&["strtod"], Double, &[("nptr", Str), ("endptr", Ptr)]),
    (&["atoi"], Int, &[("nptr", Str)]),
    (&["atol", "atoll"], Long, &[("nptr", Str)]),
    (
        &["memcpy", "memmove", "mempcpy"],
        Ptr,
        &[("dest", Ptr), ("src", Ptr), ("n", Size)],
    ),
    (&["memset"], Ptr, &[("s", Ptr), ("c", Int), ("n", Size)]),
    (
        &["memcmp", "bcmp"],
        Int,
        &[("s1", Ptr), ("s2", Ptr), ("n", Size)],
    ),
    (&["memchr"], Ptr, &[("s", Ptr), ("c", Int), ("n", Size)]),
    (&["getenv", "secure_getenv"], Str, &[("name", Str)]),
    (
        &["setenv"],
        Int,
        &[("name", Str), ("value", Str), ("overwrite", Int)],
    ),
    (&["unsetenv"], Int, &[("name", Str)]),
    (&["putenv"], Int, &[("string", Str)]),
    (
        &["unlink", "rmdir", "chdir", "chroot"],
        Int,
        &[("path", Str)],
    ),
    (
        &["unlinkat"],
        Int,
        &[("dirfd", Int), ("path", Str), ("flags", Int)],
    ),
    (&["mkdir"], Int, &[("path", Str), ("mode", UInt)]),
    (&["rename"], Int, &[("old", Str), ("new", Str)]),
    (&["link", "symlink"], Int, &[("from", Str), ("to", Str)]),
    (
        &["readlink"],
        Long,
        &[("path", Str), ("buf", Ptr), ("len", Size)],
    ),
    (
        &["access", "euidaccess"],
        Int,
        &[("path", Str), ("mode", Int)],
    ),
    (&["chmod"], Int, &[("path", Str), ("mode", UInt)]),
    (
        &["chown", "lchown"],
        Int,
        &[("path", Str), ("owner", UInt), ("group", UInt)],
    ),
    (
        &["stat", "stat64", "lstat", "lstat64"],
        Int,
        &[("path", Str), ("buf", Ptr)],
    ),
    (&["fstat", "fstat64"], Int, &[("fd", Int), ("buf", Ptr)]),
    (&["opendir"], Ptr, &[("name", Str)]),
    (&["closedir"], Int, &[("dirp", Ptr)]),
    (&["readdir", "readdir64"], Ptr, &[("dirp", Ptr)]),
    (&["realpath"], Ptr, &[("path", Str), ("resolved", Ptr)]),
    (&["getcwd"], Ptr, &[("buf", Ptr), ("size", Size)]),
    (&["execv", "execvp"], Int, &[("path", Str), ("argv", Ptr)]),
    (
        &["execve", "execvpe"],
        Int,
        &[("path", Str), ("argv", Ptr), ("envp", Ptr)],
    ),
    (&["execl", "execlp"], Int, &[("path", Str), ("arg", Str)]),
    (&["system"], Int, &[("command", Str)]),
    (&["popen"], Ptr, &[("command", Str), ("type", Str)]),
    (&["pclose"], Int, &[("stream", Ptr)]),
    (
        &[
            "fork", "vfork", "getpid", "getppid", "getuid", "geteuid", "getgid",
        ],
        Int,
        &[],
    ),
    (&["kill"], Int, &[("pid", Int), ("sig", Int)]),
    (&["raise"], Int, &[("sig", Int)]),
    (
        &["waitpid"],
        Int,
        &[("pid", Int), ("status", Ptr), ("options", Int)],
    ),
    (&["exit", "_exit", "_Exit"], Void, &[("status", Int)]),
    (&["sleep"], UInt, &[("seconds", UInt)]),
    (&["usleep"], Int, &[("usec", UInt)]),
    (&["nanosleep"], Int, &[("req", Ptr), ("rem", Ptr)]),
    (
        &["mmap", "mmap64"],
        Ptr,
        &[
            ("addr", Ptr),
            ("len", Size),
            ("prot", Int),
            ("flags", Int),
            ("fd", Int),
            ("offset", Long),
        ],
    ),
    (&["munmap"], Int, &[("addr", Ptr), ("len", Size)]),
    (
        &["mprotect"],
        Int,
        &[("addr", Ptr), ("len", Size), ("prot", Int)],
    ),
    (
        &["socket"],
        Int,
        &[("domain", Int), ("type", Int), ("protocol", Int)],
    ),
    (
        &["connect", "bind"],
        Int,
        &[("fd", Int), ("addr", Ptr), ("len", UInt)],
    ),
    (&["listen"], Int, &[("fd", Int), ("backlog", Int)]),
    (
        &["accept", "accept4"],
        Int,
        &[("fd", Int), ("addr", Ptr), ("len", Ptr), ("flags", Int)],
    ),
    (
        &["send", "recv"],
        Long,
        &[("fd", Int), ("buf", Ptr), ("n", Size), ("flags", Int)],
    ),
    (&["shutdown"], Int, &[("fd", Int), ("how", Int)]),
    (
        &["getaddrinfo"],
        Int,
        &[
            ("node", Str),
            ("service", Str),
            ("hints", Ptr),
            ("res", Ptr),
        ],
    ),
    (&["dlopen"], Ptr, &[("file", Str), ("mode", Int)]),
    (&["dlsym"], Ptr, &[("handle", Ptr), ("name", Str)]),
    (&["dlclose"], Int, &[("handle", Ptr)]),
    (&["setlocale"], Str, &[("category", Int), ("locale", Str)]),
    (
        &["qsort"],
        Void,
        &[
            ("base", Ptr),
            ("nmemb", Size),
            ("size", Size),
            ("compar", Ptr),
        ],
    ),
    (
        &["pthread_create"],
        Int,
        &[("thread", Ptr), ("attr", Ptr), ("start", Ptr), ("arg", Ptr)],
    ),
    (&["pthread_join"], Int, &[("thread", Size), ("retval", Ptr)]),
    (
        &[
            "pthread_mutex_lock",
            "pthread_mutex_unlock",
            "pthread_mutex_trylock",
        ],
        Int,
        &[("mutex", Ptr)],
    ),
];

/// The prototype of libc's `name` (an alias or a versioned name such as
/// `fopen@@GLIBC_2.2.5` is found too), with every parameter where the
/// System V ABI puts it; `None` when the table has no such function.
/// `low_pc` is 0: the caller knows the address.
pub fn libc_prototype(name: &str) -> Option<Signature> {
    let base = name.split('@').next().unwrap_or(name);
    let (_, ret, params) = TABLE.iter().find(|(names, _, _)| names.contains(&base))?;
    Some(Signature {
        name: base.to_string(),
        low_pc: 0,
        params: params
            .iter()
            .map(|(n, t)| Param {
                name: (*n).to_string(),
                ty: ty(*t),
                entry: EntryLoc::Unknown,
            })
            .collect(),
        ret: ty(*ret),
        abi_changed: false,
    })
}

fn ty(t: T) -> Type {
    match t {
        Void => Type::Void,
        Int => Type::Int {
            size: 4,
            signed: true,
        },
        UInt => Type::Int {
            size: 4,
            signed: false,
        },
        Long => Type::Int {
            size: 8,
            signed: true,
        },
        Size => Type::Int {
            size: 8,
            signed: false,
        },
        Str => Type::Pointer(Box::new(Type::Char { signed: true })),
        Ptr => Type::Pointer(Box::new(Type::Void)),
        Double => Type::Float { size: 8 },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::plan_auto;

    #[test]
    fn fopen64_takes_two_strings_in_rdi_and_rsi() {
        let sig = libc_prototype("fopen64@@GLIBC_2.2.5").unwrap();
        assert_eq!(sig.params.len(), 2);
        assert!(sig.params.iter().all(|p| p.ty.is_string()));
        let p = plan_auto(&sig, "fopen64");
        assert_eq!(p.entry.len(), 2);
        assert!(p.entry.iter().all(|f| !matches!(f, crate::Fetch::Missing)));
    }

    #[test]
    fn write_has_an_fd_and_a_size() {
        let sig = libc_prototype("write").unwrap();
        let names: Vec<&str> = sig.params.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["fd", "buf", "nbytes"]);
        assert_eq!(
            sig.params[2].ty,
            Type::Int {
                size: 8,
                signed: false
            }
        );
        assert_eq!(
            sig.ret,
            Type::Int {
                size: 8,
                signed: true
            }
        );
    }

    #[test]
    fn no_name_is_listed_twice() {
        let mut all: Vec<&str> = TABLE
            .iter()
            .flat_map(|(n, _, _)| n.iter().copied())
            .collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n);
        assert_eq!(libc_prototype("no_such_function"), None);
    }
}
