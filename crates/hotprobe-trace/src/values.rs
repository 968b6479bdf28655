//! Typed values (format version 2): what `record -a` captured at each hit
//! of a typed probe (strings copied at the hit, floats, fields through
//! pointers), beside the thread streams.
//!
//! - `types.tsv`: header `#id`, `entry`, `exit` (tab-separated), then per typed probe its id and
//!   the shapes of its entry and exit values
//!   ([`hotprobe_dwarf::Shape::encode_list`]).
//! - `values-<TID>.hpv`: magic `HPVS`, u16 version 1, then one record per
//!   captured event: a varint length and that many bytes (at most
//!   [`MAX_VALUES_LEN`]). A typed probe's entry keeps, as its one argument,
//!   the index of its record in its thread's file, and its exit keeps its
//!   record's index as the return value; the stream format is unchanged.

use crate::error::{Result, TraceError};
use crate::varint;
use hotprobe_dwarf::{format_values, Shape, ShapeItem};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// The types file of a trace directory.
pub const TYPES_FILE: &str = "types.tsv";
const TYPES_HEADER: &str = "#id\tentry\texit";
const MAGIC: &[u8; 4] = b"HPVS";
/// Bytes of one captured record, at most.
pub const MAX_VALUES_LEN: usize = 1 << 16;

/// The values file of thread `tid`.
pub fn values_file_name(tid: u32) -> String {
    format!("values-{tid}.hpv")
}

/// The shapes of the typed probes of a trace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ValueTypes {
    by_probe: HashMap<u32, (Vec<ShapeItem>, Vec<ShapeItem>)>,
}

impl ValueTypes {
    /// Adds a probe's entry and exit shapes.
    pub fn insert(&mut self, probe: u32, entry: Vec<ShapeItem>, exit: Vec<ShapeItem>) {
        self.by_probe.insert(probe, (entry, exit));
    }

    /// Whether probe `id` is typed.
    pub fn is_typed(&self, id: u32) -> bool {
        self.by_probe.contains_key(&id)
    }

    /// Number of typed probes.
    pub fn len(&self) -> usize {
        self.by_probe.len()
    }

    /// True when no probe is typed.
    pub fn is_empty(&self) -> bool {
        self.by_probe.is_empty()
    }

    /// The values of record `data` of probe `id`'s entry (or exit), as text.
    pub fn format(&self, id: u32, exit: bool, data: &[u8]) -> Option<Vec<String>> {
        let (entry, exit_shapes) = self.by_probe.get(&id)?;
        let shapes = if exit { exit_shapes } else { entry };
        Some(match format_values(shapes, data) {
            Ok(v) => v,
            Err(e) => vec![format!("<{e}>")],
        })
    }

    /// The values of record `data` of probe `id`'s entry (or exit),
    /// decoded, with their labels (`None` for a probe that is not typed).
    pub fn decode(
        &self,
        id: u32,
        exit: bool,
        data: &[u8],
    ) -> Option<Result<Vec<(String, hotprobe_dwarf::Value)>, hotprobe_dwarf::ValueError>> {
        let (entry, exit_shapes) = self.by_probe.get(&id)?;
        Some(hotprobe_dwarf::decode_values(
            if exit { exit_shapes } else { entry },
            data,
        ))
    }

    /// Writes `types.tsv`.
    pub fn write(&self, path: &Path) -> Result<()> {
        let mut ids: Vec<&u32> = self.by_probe.keys().collect();
        ids.sort();
        let mut text = format!("{TYPES_HEADER}\n");
        for id in ids {
            let (e, x) = &self.by_probe[id];
            text.push_str(&format!(
                "{id}\t{}\t{}\n",
                Shape::encode_list(e),
                Shape::encode_list(x)
            ));
        }
        std::fs::write(path, text).map_err(|e| TraceError::io(path, e))
    }

    /// Parses `types.tsv` (`path` names the file in errors).
    pub fn parse(text: &str, path: &Path) -> Result<ValueTypes> {
        let err = |line: usize, what: String| TraceError::Symbols {
            path: path.to_path_buf(),
            line,
            what,
        };
        if !text.ends_with('\n') {
            return Err(err(text.lines().count(), "last line not terminated".into()));
        }
        let mut t = ValueTypes::default();
        for (i, line) in text.lines().enumerate() {
            if i == 0 {
                if line != TYPES_HEADER {
                    return Err(err(1, format!("expected header {TYPES_HEADER:?}")));
                }
                continue;
            }
            let f: Vec<&str> = line.split('\t').collect();
            let [id, e, x] = f[..] else {
                return Err(err(i + 1, format!("{} fields, expected 3", f.len())));
            };
            let id: u32 = id
                .parse()
                .map_err(|_| err(i + 1, format!("bad probe id {id:?}")))?;
            let shapes = |s: &str| Shape::decode_list(s).map_err(|e| err(i + 1, e.to_string()));
            t.insert(id, shapes(e)?, shapes(x)?);
        }
        Ok(t)
    }
}

/// Appends records to a thread's values file.
pub(crate) struct ValuesWriter {
    out: std::io::BufWriter<std::fs::File>,
    next: u64,
}

impl ValuesWriter {
    pub(crate) fn create(path: &Path) -> std::io::Result<ValuesWriter> {
        let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
        out.write_all(MAGIC)?;
        out.write_all(&1u16.to_le_bytes())?;
        Ok(ValuesWriter { out, next: 0 })
    }

    /// Appends `data` (cut to [`MAX_VALUES_LEN`]); its index.
    pub(crate) fn push(&mut self, data: &[u8]) -> std::io::Result<u64> {
        let data = &data[..data.len().min(MAX_VALUES_LEN)];
        let mut len = Vec::with_capacity(10);
        varint::put_uvarint(&mut len, data.len() as u64);
        self.out.write_all(&len)?;
        self.out.write_all(data)?;
        self.next += 1;
        Ok(self.next - 1)
    }

    /// Writes out the whole records buffered.
    pub(crate) fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }

    pub(crate) fn finish(mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}

/// A thread's captured records, read whole.
#[derive(Clone, Debug, Default)]
pub struct ThreadValues {
    data: Vec<u8>,
    /// Start and end of each record in `data`.
    spans: Vec<(usize, usize)>,
}

impl ThreadValues {
    /// Parses a values file (`path` names it in errors); a record cut short
    /// is an error.
    pub fn parse(bytes: Vec<u8>, path: &Path) -> Result<ThreadValues> {
        ThreadValues::parse_as(bytes, path, false)
    }

    /// Parses the values file of an unfinished trace (its writer was
    /// killed): a file cut inside its header or its last record keeps the
    /// records before the cut (the events of the others print `<…>`).
    pub fn parse_unfinished(bytes: Vec<u8>, path: &Path) -> Result<ThreadValues> {
        ThreadValues::parse_as(bytes, path, true)
    }

    fn parse_as(mut bytes: Vec<u8>, path: &Path, unfinished: bool) -> Result<ThreadValues> {
        if unfinished && bytes.len() < 6 && MAGIC.starts_with(&bytes[..bytes.len().min(4)]) {
            return Ok(ThreadValues::default());
        }
        let corrupt = |offset: usize, what: &str| TraceError::Corrupt {
            path: path.to_path_buf(),
            offset: offset as u64,
            what: what.to_string(),
        };
        if bytes.len() < 6 || &bytes[..4] != MAGIC {
            return Err(corrupt(0, "not a values file (magic HPVS)"));
        }
        if bytes[4..6] != 1u16.to_le_bytes() {
            return Err(corrupt(4, "unknown values file version"));
        }
        let mut pos = 6;
        let mut spans = Vec::new();
        while pos < bytes.len() {
            let (len, n) = match varint::get_uvarint(&bytes[pos..]) {
                Ok(v) => v,
                // A length cut short by the end of the file.
                Err(_) if unfinished && bytes.len() - pos < 10 => break,
                Err(_) => return Err(corrupt(pos, "bad length")),
            };
            let start = pos + n;
            let end = usize::try_from(len)
                .ok()
                .filter(|l| *l <= MAX_VALUES_LEN)
                .and_then(|l| start.checked_add(l));
            match end {
                Some(e) if e <= bytes.len() => {
                    spans.push((start, e));
                    pos = e;
                }
                Some(_) if unfinished => break,
                _ => return Err(corrupt(pos, "record longer than the file")),
            }
        }
        bytes.truncate(pos);
        Ok(ThreadValues { data: bytes, spans })
    }

    /// Record `i`.
    pub fn get(&self, i: u64) -> Option<&[u8]> {
        let &(s, e) = self.spans.get(usize::try_from(i).ok()?)?;
        self.data.get(s..e)
    }

    /// Number of records.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }
}
