//! The tracepoints' ids and field offsets, from tracefs.

use std::path::{Path, PathBuf};

use crate::error::KernelError;
use crate::records::RawLayout;

/// Where tracefs is looked for, in order.
pub const TRACEFS_DIRS: &[&str] = &["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The command that mounts tracefs (as root).
pub const MOUNT_HINT: &str = "mount -t tracefs nodev /sys/kernel/tracing";

/// The first tracefs directory holding `events/raw_syscalls`.
fn events_dir() -> Result<PathBuf, KernelError> {
    let mut denied = None;
    for d in TRACEFS_DIRS {
        let ev = Path::new(d).join("events/raw_syscalls");
        match std::fs::metadata(&ev) {
            Ok(m) if m.is_dir() => return Ok(ev),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                denied.get_or_insert((ev, e));
            }
            _ => {}
        }
    }
    match denied {
        Some((path, source)) => Err(KernelError::TracefsDenied { path, source }),
        None => Err(KernelError::TracefsMissing),
    }
}

/// Reads the `raw_syscalls` tracepoints' ids and field offsets.
pub fn raw_syscalls_layout() -> Result<RawLayout, KernelError> {
    let ev = events_dir()?;
    let read = |name: &str| -> Result<String, KernelError> {
        let p = ev.join(name);
        std::fs::read_to_string(&p).map_err(|source| {
            if source.kind() == std::io::ErrorKind::PermissionDenied {
                KernelError::TracefsDenied { path: p, source }
            } else {
                KernelError::Tracefs { path: p, source }
            }
        })
    };
    let enter = read("sys_enter/format")?;
    let exit = read("sys_exit/format")?;
    let bad = |file: &str, what: FormatError| KernelError::Format {
        path: ev.join(file),
        what,
    };
    let e = parse_format(&enter).map_err(|w| bad("sys_enter/format", w))?;
    let x = parse_format(&exit).map_err(|w| bad("sys_exit/format", w))?;
    let field = |f: &Format, name: &str, size: usize, file: &str| {
        f.field(name, size).ok_or_else(|| {
            bad(
                file,
                FormatError::NoField {
                    name: name.to_string(),
                    size,
                },
            )
        })
    };
    let layout = RawLayout {
        enter_type: e.id,
        exit_type: x.id,
        common_type: field(&e, "common_type", 2, "sys_enter/format")?,
        nr: field(&e, "id", 8, "sys_enter/format")?,
        ret: field(&x, "ret", 8, "sys_exit/format")?,
    };
    if field(&x, "id", 8, "sys_exit/format")? != layout.nr
        || field(&x, "common_type", 2, "sys_exit/format")? != layout.common_type
    {
        return Err(bad("sys_exit/format", FormatError::UnlikeEnter));
    }
    Ok(layout)
}

/// A tracepoint's `format` file: its id and fields.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Format {
    /// The tracepoint id (`ID:`).
    pub id: u16,
    /// (name, offset, size) of each field.
    pub fields: Vec<(String, usize, usize)>,
}

impl Format {
    /// The offset of field `name` if it has this size.
    pub fn field(&self, name: &str, size: usize) -> Option<usize> {
        self.fields
            .iter()
            .find(|(n, _, s)| n == name && *s == size)
            .map(|(_, o, _)| *o)
    }
}

/// What is wrong in a tracepoint's `format` file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The `ID:` line's value is no 16-bit number.
    #[error("bad ID `{0}`")]
    BadId(String),
    /// No `ID:` line.
    #[error("no ID line")]
    NoId,
    /// A field line lacks `offset:` or `size:`, or a number there.
    #[error("field `{field}`: no {key}")]
    NoNumber {
        /// The field's name.
        field: String,
        /// `offset:` or `size:`.
        key: String,
    },
    /// A field with no name, or whose offset and size run past 4 KiB.
    #[error("field `{0}`: bad name, offset or size")]
    BadField(String),
    /// sys_exit's `id` or `common_type` is not where sys_enter has it.
    #[error("`id` or `common_type` not where sys_enter has it")]
    UnlikeEnter,
    /// A field this crate reads is not there with its size.
    #[error("no {size}-byte field `{name}`")]
    NoField {
        /// The field.
        name: String,
        /// Its size in bytes.
        size: usize,
    },
}

/// Parses a tracepoint's `format` file (untrusted text: an error, never a
/// panic). Lines are `field:TYPE NAME[N];\toffset:O;\tsize:S;\tsigned:X;`.
pub fn parse_format(text: &str) -> Result<Format, FormatError> {
    let mut f = Format::default();
    let mut id = None;
    for line in text.lines() {
        let line = line.trim();
        if let Some(v) = line.strip_prefix("ID:") {
            let v = v.trim();
            id = Some(
                v.parse::<u16>()
                    .map_err(|_| FormatError::BadId(v.to_string()))?,
            );
        } else if let Some(rest) = line.strip_prefix("field:") {
            let mut parts = rest.split(';').map(str::trim);
            let decl = parts.next().unwrap_or("");
            let name = decl
                .rsplit([' ', '*'])
                .next()
                .unwrap_or("")
                .split('[')
                .next()
                .unwrap_or("");
            let mut num = |key: &str| -> Result<usize, FormatError> {
                parts
                    .next()
                    .and_then(|p| p.strip_prefix(key))
                    .and_then(|v| v.parse::<usize>().ok())
                    .ok_or_else(|| FormatError::NoNumber {
                        field: name.to_string(),
                        key: key.to_string(),
                    })
            };
            let offset = num("offset:")?;
            let size = num("size:")?;
            if name.is_empty() || offset.checked_add(size).is_none_or(|e| e > 4096) {
                return Err(FormatError::BadField(decl.to_string()));
            }
            f.fields.push((name.to_string(), offset, size));
        }
    }
    f.id = id.ok_or(FormatError::NoId)?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXIT: &str = "name: sys_exit\nID: 442\nformat:\n\
        \tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
        \tfield:unsigned char common_flags;\toffset:2;\tsize:1;\tsigned:0;\n\
        \tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;\n\n\
        \tfield:long id;\toffset:8;\tsize:8;\tsigned:1;\n\
        \tfield:long ret;\toffset:16;\tsize:8;\tsigned:1;\n\n\
        print fmt: \"NR %ld = %ld\", REC->id, REC->ret\n";

    #[test]
    fn reads_ids_and_offsets_and_refuses_nonsense() {
        let f = parse_format(EXIT).unwrap();
        assert_eq!(f.id, 442);
        assert_eq!(f.field("ret", 8), Some(16));
        assert_eq!(f.field("common_type", 2), Some(0));
        assert_eq!(f.field("ret", 4), None);
        let args = "ID: 1\n\tfield:unsigned long args[6];\toffset:16;\tsize:48;\tsigned:0;\n";
        assert_eq!(parse_format(args).unwrap().field("args", 48), Some(16));
        assert!(parse_format("field:long id;\toffset:8;\tsize:8;").is_err());
        assert!(parse_format("ID: 1\nfield:long id;\toffset:x;\tsize:8;").is_err());
        assert!(
            parse_format("ID: 1\nfield:long id;\toffset:18446744073709551615;\tsize:8;").is_err()
        );
    }

    #[test]
    fn this_hosts_tracepoints_when_tracefs_is_there() {
        match raw_syscalls_layout() {
            Ok(l) => {
                assert_ne!(l.enter_type, l.exit_type);
                assert_eq!((l.common_type, l.nr, l.ret), (0, 8, 16));
            }
            // Without tracefs, the error says how to mount it.
            Err(e @ KernelError::TracefsMissing) => assert!(e.to_string().contains(MOUNT_HINT)),
            Err(e) => panic!("{e}"),
        }
    }
}
