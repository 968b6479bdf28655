//! `/proc/PID/maps` parsing.

use std::fmt;
use std::path::PathBuf;

use hotprobe_target::RuntimeAddr;

use crate::error::{cut, SymbolError};

/// The permission bits of a mapping (`r-xp`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Perms {
    /// Readable.
    pub read: bool,
    /// Writable.
    pub write: bool,
    /// Executable.
    pub exec: bool,
    /// Shared (`s`) rather than private (`p`).
    pub shared: bool,
}

impl Perms {
    /// Parse the four-character permission field.
    pub fn parse(s: &str) -> Option<Perms> {
        let b = s.as_bytes();
        if b.len() != 4 {
            return None;
        }
        let flag = |c: u8, yes: u8| match c {
            _ if c == yes => Some(true),
            b'-' => Some(false),
            _ => None,
        };
        Some(Perms {
            read: flag(b[0], b'r')?,
            write: flag(b[1], b'w')?,
            exec: flag(b[2], b'x')?,
            shared: match b[3] {
                b's' => true,
                b'p' => false,
                _ => return None,
            },
        })
    }
}

impl fmt::Display for Perms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = |b: bool, ch: char| if b { ch } else { '-' };
        write!(
            f,
            "{}{}{}{}",
            c(self.read, 'r'),
            c(self.write, 'w'),
            c(self.exec, 'x'),
            if self.shared { 's' } else { 'p' }
        )
    }
}

/// One line of `/proc/PID/maps`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: RuntimeAddr,
    /// One past the last address.
    pub end: RuntimeAddr,
    /// Permissions.
    pub perms: Perms,
    /// Offset into the mapped file.
    pub offset: u64,
    /// Device (major, minor) of the mapped file.
    pub dev: (u32, u32),
    /// Inode of the mapped file (0 for anonymous memory).
    pub inode: u64,
    /// The mapped file, for file-backed mappings (path starting with `/`),
    /// without any ` (deleted)` suffix.
    pub path: Option<PathBuf>,
    /// A pseudo name such as `[vdso]`, `[stack]`, `[heap]`, `[anon:name]`
    /// or `anon_inode:...`; `None` for plain anonymous memory and files.
    pub pseudo: Option<String>,
    /// The file was deleted (or replaced) after it was mapped.
    pub deleted: bool,
}

impl Mapping {
    /// Whether `addr` lies in this mapping.
    pub fn contains(&self, addr: RuntimeAddr) -> bool {
        self.start <= addr && addr < self.end
    }

    /// Size in bytes.
    pub fn len(&self) -> u64 {
        self.end.0.saturating_sub(self.start.0)
    }

    /// Whether the mapping is empty (never, for kernel-produced maps).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Split off the next whitespace-delimited field.
fn field(s: &str) -> Option<(&str, &str)> {
    let s = s.trim_start_matches([' ', '\t']);
    if s.is_empty() {
        return None;
    }
    match s.find([' ', '\t']) {
        Some(i) => Some((&s[..i], &s[i..])),
        None => Some((s, "")),
    }
}

fn parse_line(line: &str) -> Result<Mapping, String> {
    let (range, rest) = field(line).ok_or("empty line")?;
    let (perms, rest) = field(rest).ok_or("missing permissions")?;
    let (offset, rest) = field(rest).ok_or("missing offset")?;
    let (dev, rest) = field(rest).ok_or("missing device")?;
    let (inode, rest) = field(rest).ok_or("missing inode")?;
    let (start, end) = range.split_once('-').ok_or("address range has no '-'")?;
    let hex = |s: &str, what: &str| -> Result<u64, String> {
        if s.is_empty() || s.starts_with('+') {
            return Err(format!("bad {what} {s:?}"));
        }
        u64::from_str_radix(s, 16).map_err(|_| format!("bad {what} {s:?}"))
    };
    let start = hex(start, "start address")?;
    let end = hex(end, "end address")?;
    if end < start {
        return Err("end address below start address".into());
    }
    let perms = Perms::parse(perms).ok_or_else(|| format!("bad permissions {perms:?}"))?;
    let offset = hex(offset, "offset")?;
    let (major, minor) = dev.split_once(':').ok_or("device has no ':'")?;
    let dev_part = |s: &str| -> Result<u32, String> {
        if s.is_empty() || s.starts_with('+') {
            return Err(format!("bad device {dev:?}"));
        }
        u32::from_str_radix(s, 16).map_err(|_| format!("bad device {dev:?}"))
    };
    let dev = (dev_part(major)?, dev_part(minor)?);
    if inode.starts_with('+') {
        return Err(format!("bad inode {inode:?}"));
    }
    let inode: u64 = inode.parse().map_err(|_| format!("bad inode {inode:?}"))?;
    let name = rest.trim_start_matches([' ', '\t']);
    let (name, deleted) = match name.strip_suffix(" (deleted)") {
        Some(n) => (n, true),
        None => (name, false),
    };
    let (path, pseudo) = if name.is_empty() {
        (None, None)
    } else if name.starts_with('/') {
        (Some(PathBuf::from(name)), None)
    } else {
        (None, Some(name.to_string()))
    };
    Ok(Mapping {
        start: RuntimeAddr(start),
        end: RuntimeAddr(end),
        perms,
        offset,
        dev,
        inode,
        path,
        pseudo,
        deleted,
    })
}

/// Parse the text of `/proc/PID/maps`. Blank lines are skipped; any other
/// line that does not parse is an error naming it.
pub fn parse_maps(text: &str) -> Result<Vec<Mapping>, SymbolError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let m = parse_line(line).map_err(|reason| SymbolError::BadMaps {
            line_no: i + 1,
            line: cut(line, 200),
            reason,
        })?;
        out.push(m);
    }
    Ok(out)
}

/// The `/proc` directory that shows process `pid`'s memory, maps and
/// executable: `/proc/PID`, unless its leader exited while other threads
/// run on (`pthread_exit` in `main`): then the leader has no memory left
/// (its `exe` is gone, its `maps` empty) and a live thread's
/// `/proc/PID/task/TID` is taken.
pub fn proc_dir(pid: u32) -> PathBuf {
    let dir = PathBuf::from(format!("/proc/{pid}"));
    if std::fs::read_link(dir.join("exe")).is_ok() {
        return dir;
    }
    let mut tids: Vec<u32> = std::fs::read_dir(dir.join("task"))
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    tids.sort_unstable();
    tids.into_iter()
        .map(|tid| dir.join(format!("task/{tid}")))
        .find(|t| std::fs::read_link(t.join("exe")).is_ok())
        .unwrap_or(dir)
}

/// Read and parse `/proc/PID/maps` (a live thread's, see [`proc_dir`]).
pub fn read_maps(pid: u32) -> Result<Vec<Mapping>, SymbolError> {
    let path = proc_dir(pid).join("maps");
    let text =
        std::fs::read_to_string(&path).map_err(|source| SymbolError::Proc { pid, path, source })?;
    parse_maps(&text)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
55d0c8a00000-55d0c8a01000 r--p 00000000 08:01 1234                       /usr/bin/my prog
55d0c8a01000-55d0c8a02000 r-xp 00001000 08:01 1234                       /usr/bin/my prog
55d0c8c00000-55d0c8c21000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000001000 rw-s 00000000 00:05 99                         /memfd:buf (deleted)
7f0000001000-7f0000002000 rw-p 00000000 00:00 0 
7f0000002000-7f0000003000 r-xp 00002000 fd:00 77 /tmp/lib with  spaces.so (deleted)
7ffd1a5f0000-7ffd1a5f2000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
";

    #[test]
    fn parses_sample() {
        let m = parse_maps(SAMPLE).unwrap();
        assert_eq!(m.len(), 8);
        assert_eq!(
            m[0].path.as_deref(),
            Some(std::path::Path::new("/usr/bin/my prog"))
        );
        assert_eq!(m[1].offset, 0x1000);
        assert!(m[1].perms.exec && m[1].perms.read && !m[1].perms.write);
        assert_eq!(m[1].perms.to_string(), "r-xp");
        assert_eq!(m[1].dev, (8, 1));
        assert_eq!(m[1].inode, 1234);
        assert_eq!(m[2].pseudo.as_deref(), Some("[heap]"));
        assert!(m[2].path.is_none());
        assert!(m[3].deleted && m[3].perms.shared);
        assert_eq!(
            m[3].path.as_deref(),
            Some(std::path::Path::new("/memfd:buf"))
        );
        assert!(m[4].path.is_none() && m[4].pseudo.is_none());
        assert_eq!(
            m[5].path.as_deref(),
            Some(std::path::Path::new("/tmp/lib with  spaces.so"))
        );
        assert!(m[5].deleted);
        assert_eq!(m[5].dev, (0xfd, 0));
        assert_eq!(m[6].pseudo.as_deref(), Some("[vdso]"));
        assert_eq!(m[7].start, RuntimeAddr(0xffffffffff600000));
        assert!(m[6].contains(RuntimeAddr(0x7ffd1a5f0001)));
        assert_eq!(m[6].len(), 0x2000);
    }

    #[test]
    fn rejects_bad_lines() {
        for bad in [
            "zz-10 r-xp 0 00:00 0",
            "10 r-xp 0 00:00 0",
            "10-20 r-x 0 00:00 0",
            "10-20 rwxq 0 00:00 0",
            "10-20 r-xp 0 0000 0",
            "10-20 r-xp 0 00:00",
            "20-10 r-xp 0 00:00 0",
            "10-20 r-xp 0 00:00 -1",
            "10-20 r-xp +0 00:00 0",
            "ffffffffffffffffff-20 r-xp 0 00:00 0",
            "10-20 ré-p 0 00:00 0",
        ] {
            let e = parse_maps(bad).unwrap_err();
            assert!(e.to_string().contains("line 1"), "{bad}: {e}");
        }
        assert!(parse_maps("").unwrap().is_empty());
        assert!(parse_maps("\n\n").unwrap().is_empty());
    }

    #[test]
    fn reads_own_maps() {
        let m = read_maps(std::process::id()).unwrap();
        assert!(m.iter().any(|m| m.perms.exec && m.path.is_some()));
        assert!(read_maps(u32::MAX).is_err());
    }
}
