//! What `stacks.tsv` and `call_stacks.tsv` share: a header line, then
//! tab-separated lines whose stack fields are
//! `truncated<TAB>function<TAB>caller;caller's caller;…`. One reader and
//! one writer for both; the files are untrusted input: a malformed line
//! is an error naming the file and line, never a panic.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;

use crate::error::{Result, TraceError};
use crate::files::{check_regular, open_regular};

/// A stack as the files hold it: the function, its callers (innermost
/// first), whether the walk stopped before the outermost frame.
pub(crate) type StackFields = (String, Vec<String>, bool);

/// A name as one field: no tab, newline or `;` (the separators).
fn clean(s: &str) -> String {
    s.replace(['\t', '\n', '\r', ';'], " ")
}

/// The three stack fields of a line, tab-separated (no line end).
pub(crate) fn format_stack(function: &str, callers: &[String], truncated: bool) -> String {
    let callers: Vec<String> = callers.iter().map(|c| clean(c)).collect();
    format!(
        "{}\t{}\t{}",
        u8::from(truncated),
        clean(function),
        callers.join(";")
    )
}

/// Parses the three stack fields of a line; `bad` makes the error.
pub(crate) fn parse_stack(
    truncated: &str,
    function: &str,
    callers: &str,
    bad: &dyn Fn(&str) -> TraceError,
) -> Result<StackFields> {
    let truncated = match truncated {
        "0" => false,
        "1" => true,
        _ => return Err(bad("truncated is not 0 or 1")),
    };
    if function.is_empty() {
        return Err(bad("no function"));
    }
    let callers = match callers {
        "" => Vec::new(),
        c => c.split(';').map(str::to_string).collect(),
    };
    Ok((function.to_string(), callers, truncated))
}

/// Parses a number field; `bad` makes the error.
pub(crate) fn parse_number<T: std::str::FromStr>(
    s: &str,
    what: &str,
    bad: &dyn Fn(&str) -> TraceError,
) -> Result<T> {
    s.parse().map_err(|_| bad(what))
}

/// Reads the file at `path`: checks its `header`, then gives `line` each
/// further line's fields and the error maker for that line. `Ok(false)`
/// when the file does not exist.
pub(crate) fn read_tsv(
    path: &Path,
    header: &str,
    mut line: impl FnMut(&[&str], &dyn Fn(&str) -> TraceError) -> Result<()>,
) -> Result<bool> {
    if !check_regular(path)? {
        return Ok(false);
    }
    let f = open_regular(path)?;
    for (i, text) in BufReader::new(f).lines().enumerate() {
        let text = text.map_err(|e| TraceError::io(path, e))?;
        let bad = |what: &str| TraceError::Symbols {
            path: path.to_path_buf(),
            line: i + 1,
            what: what.to_string(),
        };
        if i == 0 {
            if text != header {
                let name = path.file_name().unwrap_or_default().to_string_lossy();
                return Err(bad(&format!("not the header of {name}")));
            }
            continue;
        }
        let fields: Vec<&str> = text.split('\t').collect();
        line(&fields, &bad)?;
    }
    Ok(true)
}

/// Writes `header` and `lines` (each ending with a newline) to `path`,
/// synced.
pub(crate) fn write_tsv(path: &Path, header: &str, lines: &str) -> Result<()> {
    let mut f = std::fs::File::create(path).map_err(|e| TraceError::io(path, e))?;
    f.write_all(header.as_bytes())
        .and_then(|()| f.write_all(b"\n"))
        .and_then(|()| f.write_all(lines.as_bytes()))
        .and_then(|()| f.sync_all())
        .map_err(|e| TraceError::io(path, e))
}
