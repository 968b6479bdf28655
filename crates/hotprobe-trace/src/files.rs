//! Opening the files of a trace directory: regular files only. A FIFO
//! named `info.json` would block every reader forever, a device could be
//! read without end or have effects on open; they are refused, with an
//! error naming the file, before anything is read.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use crate::error::{Result, TraceError};

/// What a file type is, said in an error (`None` for a regular file).
fn not_regular(ft: std::fs::FileType) -> Option<&'static str> {
    if ft.is_file() {
        None
    } else if ft.is_fifo() {
        Some("a FIFO")
    } else if ft.is_char_device() {
        Some("a character device")
    } else if ft.is_block_device() {
        Some("a block device")
    } else if ft.is_socket() {
        Some("a socket")
    } else if ft.is_dir() {
        Some("a directory")
    } else {
        Some("not a file")
    }
}

/// Refuses `path` unless it is a regular file (symbolic links followed);
/// `Ok(false)` when it does not exist.
pub(crate) fn check_regular(path: &Path) -> Result<bool> {
    match std::fs::metadata(path) {
        Ok(m) => match not_regular(m.file_type()) {
            None => Ok(true),
            Some(kind) => Err(TraceError::NotAFile {
                path: path.to_path_buf(),
                kind,
            }),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(TraceError::io(path, e)),
    }
}

/// Opens a regular file for reading: its type is checked first, then
/// again on the open file (opened with `O_NONBLOCK`, so that a FIFO put
/// there in between cannot block the open).
pub(crate) fn open_regular(path: &Path) -> Result<File> {
    if !check_regular(path)? {
        return Err(TraceError::io(
            path,
            std::io::Error::from(std::io::ErrorKind::NotFound),
        ));
    }
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| TraceError::io(path, e))?;
    let m = f.metadata().map_err(|e| TraceError::io(path, e))?;
    match not_regular(m.file_type()) {
        None => Ok(f),
        Some(kind) => Err(TraceError::NotAFile {
            path: path.to_path_buf(),
            kind,
        }),
    }
}

/// [`open_regular`], read whole as UTF-8; `Ok(None)` when it does not exist.
pub(crate) fn read_text(path: &Path) -> Result<Option<String>> {
    use std::io::Read;
    if !check_regular(path)? {
        return Ok(None);
    }
    let mut s = String::new();
    open_regular(path)?
        .read_to_string(&mut s)
        .map_err(|e| TraceError::io(path, e))?;
    Ok(Some(s))
}

/// [`open_regular`], read whole; `Ok(None)` when it does not exist.
pub(crate) fn read_bytes(path: &Path) -> Result<Option<Vec<u8>>> {
    use std::io::Read;
    if !check_regular(path)? {
        return Ok(None);
    }
    let mut v = Vec::new();
    open_regular(path)?
        .read_to_end(&mut v)
        .map_err(|e| TraceError::io(path, e))?;
    Ok(Some(v))
}
