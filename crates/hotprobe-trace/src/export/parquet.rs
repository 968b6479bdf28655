//! Parquet: one row per call (the calls a query keeps), for DuckDB,
//! pandas, Spark and friends.
//!
//! Columns: `pid` (int32), `tid` (int32), `function` (string), `module`
//! (string), `start_ns` (int64, trace clock: CLOCK_MONOTONIC ns),
//! `duration_ns`, `self_ns` (int64), `depth` (int32, 0 = outermost),
//! `arg0` … `argN-1` (int64, null when the call's probe kept fewer
//! arguments; N = the most any probe keeps, no column when none does),
//! `retval` (int64, null when not kept), `unfinished` (boolean: still
//! running at the end of the trace). Register values are the 64 bits as a
//! signed integer. Rows are grouped by thread, in the order calls end.
//! Written with the `parquet` crate's column writers (no Arrow),
//! uncompressed, dictionary-encoded strings. For a trace with calibrated
//! probe costs the file's key-value metadata has `hotprobe.probe_costs`
//! (what the times are, and the functions on a trap) and
//! `hotprobe.on_traps` (a JSON array of `{"function", "mechanism"}`).

use std::io::Write;
use std::sync::Arc;

use parquet::data_type::{BoolType, ByteArray, ByteArrayType, Int32Type, Int64Type};
use parquet::file::properties::WriterProperties;
use parquet::file::writer::SerializedFileWriter;
use parquet::schema::parser::parse_message_type;

use crate::analysis::{visit_threads, Progress, Step};
use crate::error::{Result, TraceError};
use crate::query::CompiledQuery;
use crate::reader::TraceReader;

/// What [`export_parquet`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ParquetStats {
    /// Rows (calls).
    pub rows: u64,
    /// Row groups.
    pub row_groups: u64,
    /// `arg` columns.
    pub arg_columns: usize,
}

/// Rows per row group.
const GROUP_ROWS: usize = 1 << 20;

#[derive(Default)]
struct Columns {
    tid: Vec<i32>,
    function: Vec<ByteArray>,
    module: Vec<ByteArray>,
    start: Vec<i64>,
    dur: Vec<i64>,
    self_ns: Vec<i64>,
    depth: Vec<i32>,
    /// Per arg column: the values present and a definition level per row.
    args: Vec<(Vec<i64>, Vec<i16>)>,
    ret: (Vec<i64>, Vec<i16>),
    unfinished: Vec<bool>,
}

impl Columns {
    fn len(&self) -> usize {
        self.tid.len()
    }
}

fn perr(e: parquet::errors::ParquetError) -> TraceError {
    TraceError::io("<parquet output>", std::io::Error::other(e.to_string()))
}

/// Writes the calls `query` keeps as a Parquet file into `out`.
pub fn export_parquet<W: Write + Send>(
    reader: &TraceReader,
    query: &CompiledQuery,
    out: W,
    progress: Progress<'_>,
) -> Result<ParquetStats> {
    let syms = reader.symbols();
    let nargs = syms.iter().map(|s| s.nargs as usize).max().unwrap_or(0);
    let mut schema = String::from(
        "message hotprobe_call {
  REQUIRED INT32 pid;
  REQUIRED INT32 tid;
  REQUIRED BYTE_ARRAY function (UTF8);
  REQUIRED BYTE_ARRAY module (UTF8);
  REQUIRED INT64 start_ns;
  REQUIRED INT64 duration_ns;
  REQUIRED INT64 self_ns;
  REQUIRED INT32 depth;
",
    );
    for i in 0..nargs {
        schema.push_str(&format!("  OPTIONAL INT64 arg{i};\n"));
    }
    schema.push_str("  OPTIONAL INT64 retval;\n  REQUIRED BOOLEAN unfinished;\n}\n");
    let schema = Arc::new(parse_message_type(&schema).map_err(perr)?);
    let metadata = crate::reader::times_line(reader).map(|t| {
        let traps: Vec<serde_json::Value> = reader
            .trap_functions()
            .into_iter()
            .map(|(f, m)| serde_json::json!({"function": f, "mechanism": m}))
            .collect();
        vec![
            parquet::file::metadata::KeyValue::new("hotprobe.probe_costs".into(), t),
            parquet::file::metadata::KeyValue::new(
                "hotprobe.on_traps".into(),
                serde_json::Value::from(traps).to_string(),
            ),
        ]
    });
    let props = Arc::new(
        WriterProperties::builder()
            .set_key_value_metadata(metadata)
            .build(),
    );
    let mut w = SerializedFileWriter::new(out, schema, props).map_err(perr)?;
    let pid = reader.info().pid.unwrap_or(0) as i32;
    let names: Vec<ByteArray> = (0..syms.id_bound())
        .map(|id| ByteArray::from(syms.name(id).as_bytes().to_vec()))
        .collect();
    let modules: Vec<ByteArray> = (0..syms.id_bound())
        .map(|id| {
            ByteArray::from(
                syms.get(id)
                    .map_or(&[][..], |s| s.module.as_bytes())
                    .to_vec(),
            )
        })
        .collect();
    let empty = || Columns {
        args: vec![Default::default(); nargs],
        ..Columns::default()
    };
    let mut cols = empty();
    let mut stats = ParquetStats {
        arg_columns: nargs,
        ..ParquetStats::default()
    };
    let mut err: Option<TraceError> = None;
    visit_threads(reader, query, progress, |tid, s| {
        let Step::Leave {
            probe,
            start,
            end,
            depth,
            self_ns,
            args,
            ret,
            unfinished,
            ..
        } = s
        else {
            return;
        };
        if err.is_some() {
            return;
        }
        let p = probe as usize;
        cols.tid.push(tid as i32);
        cols.function.push(
            names
                .get(p)
                .cloned()
                .unwrap_or_else(|| ByteArray::from(syms.name(probe).as_bytes().to_vec())),
        );
        cols.module.push(
            modules
                .get(p)
                .cloned()
                .unwrap_or_else(|| ByteArray::from(&[][..])),
        );
        cols.start.push(start as i64);
        cols.dur.push(end.saturating_sub(start) as i64);
        cols.self_ns.push(self_ns as i64);
        cols.depth.push(depth.min(i32::MAX as usize) as i32);
        // Typed probes keep record indices, not values: no numbers.
        let typed = reader.value_types().is_typed(probe);
        let a = if typed { &[][..] } else { args.as_slice() };
        let ret = ret.filter(|_| !typed);
        for (i, (vals, defs)) in cols.args.iter_mut().enumerate() {
            match a.get(i) {
                Some(&v) => {
                    vals.push(v as i64);
                    defs.push(1);
                }
                None => defs.push(0),
            }
        }
        match ret {
            Some(r) => {
                cols.ret.0.push(r as i64);
                cols.ret.1.push(1);
            }
            None => cols.ret.1.push(0),
        }
        cols.unfinished.push(unfinished);
        if cols.len() >= GROUP_ROWS {
            let full = std::mem::replace(&mut cols, empty());
            match write_group(&mut w, pid, &full) {
                Ok(()) => {
                    stats.rows += full.len() as u64;
                    stats.row_groups += 1;
                }
                Err(e) => err = Some(e),
            }
        }
    })?;
    if let Some(e) = err {
        return Err(e);
    }
    if cols.len() > 0 || stats.row_groups == 0 {
        write_group(&mut w, pid, &cols)?;
        stats.rows += cols.len() as u64;
        stats.row_groups += 1;
    }
    w.close().map_err(perr)?;
    Ok(stats)
}

fn write_group<W: Write + Send>(
    w: &mut SerializedFileWriter<W>,
    pid: i32,
    c: &Columns,
) -> Result<()> {
    let mut rg = w.next_row_group().map_err(perr)?;
    let pids = vec![pid; c.len()];
    let mut i = 0usize;
    while let Some(mut col) = rg.next_column().map_err(perr)? {
        let nargs = c.args.len();
        let r = match i {
            0 => col.typed::<Int32Type>().write_batch(&pids, None, None),
            1 => col.typed::<Int32Type>().write_batch(&c.tid, None, None),
            2 => col
                .typed::<ByteArrayType>()
                .write_batch(&c.function, None, None),
            3 => col
                .typed::<ByteArrayType>()
                .write_batch(&c.module, None, None),
            4 => col.typed::<Int64Type>().write_batch(&c.start, None, None),
            5 => col.typed::<Int64Type>().write_batch(&c.dur, None, None),
            6 => col.typed::<Int64Type>().write_batch(&c.self_ns, None, None),
            7 => col.typed::<Int32Type>().write_batch(&c.depth, None, None),
            k if k < 8 + nargs => {
                let (vals, defs) = &c.args[k - 8];
                col.typed::<Int64Type>().write_batch(vals, Some(defs), None)
            }
            k if k == 8 + nargs => {
                col.typed::<Int64Type>()
                    .write_batch(&c.ret.0, Some(&c.ret.1), None)
            }
            _ => col
                .typed::<BoolType>()
                .write_batch(&c.unfinished, None, None),
        };
        r.map_err(perr)?;
        col.close().map_err(perr)?;
        i += 1;
    }
    rg.close().map_err(perr)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use parquet::file::reader::{FileReader, SerializedFileReader};

    #[test]
    fn one_row_per_call() {
        let dir = tempfile::tempdir().unwrap();
        let r = crate::query::tests::trace(dir.path());
        let path = dir.path().join("calls.parquet");
        let f = std::fs::File::create(&path).unwrap();
        let st = export_parquet(&r, &CompiledQuery::all(), f, None).unwrap();
        assert_eq!((st.rows, st.row_groups, st.arg_columns), (7, 1, 1));
        let rd = SerializedFileReader::new(std::fs::File::open(&path).unwrap()).unwrap();
        assert_eq!(rd.metadata().file_metadata().num_rows(), 7);
        let cols: Vec<String> = rd
            .metadata()
            .file_metadata()
            .schema_descr()
            .columns()
            .iter()
            .map(|c| c.name().to_string())
            .collect();
        assert_eq!(
            cols,
            [
                "pid",
                "tid",
                "function",
                "module",
                "start_ns",
                "duration_ns",
                "self_ns",
                "depth",
                "arg0",
                "retval",
                "unfinished"
            ]
        );
    }
}
