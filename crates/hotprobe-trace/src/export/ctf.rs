//! CTF 1.8 (Common Trace Format) export: a `metadata` TSDL text and one
//! binary stream file per thread, readable by `babeltrace2 DIR`.
//!
//! Every record becomes CTF events one to one, except a call record which
//! becomes a `func_entry` and a `func_exit`: the CTF event count is the
//! trace's function event count plus its lost-events records.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

use crate::analysis::{Progress, Step};
use crate::error::{Result, TraceError};
use crate::event::{Args, Record};
use crate::query::{CompiledQuery, QueryStack};
use crate::reader::TraceReader;
use crate::ValueTypes;

/// What [`export_ctf`] wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CtfStats {
    /// CTF events.
    pub events: u64,
    /// Packets.
    pub packets: u64,
    /// Stream files.
    pub streams: u64,
}

const MAGIC: u32 = 0xC1FC_1FC1;
const PACKET_TARGET: usize = 64 * 1024;
const EV_ENTRY: u32 = 0;
const EV_EXIT: u32 = 1;
const EV_HIT: u32 = 2;
const EV_LOST: u32 = 3;

fn tsdl_string(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if c.is_ascii_graphic() || c == ' ' => o.push(c),
            _ => o.push('?'),
        }
    }
    o.push('"');
    o
}

fn metadata(reader: &TraceReader) -> String {
    let syms = reader.symbols();
    let info = reader.info();
    let mut labels = String::new();
    let mut seen = HashSet::new();
    for s in syms.iter() {
        let mut l = s.name.clone();
        if l.is_empty() || !seen.insert(l.clone()) {
            l = format!("{}#{}", s.name, s.id);
            seen.insert(l.clone());
        }
        labels.push_str(&format!("\t{} = {},\n", tsdl_string(&l), s.id));
    }
    let probe_ty = if labels.is_empty() {
        "uint32_t".to_string()
    } else {
        format!("enum : uint32_t {{\n{labels}}}")
    };
    let costs = tsdl_string(
        &crate::reader::times_line(reader)
            .unwrap_or_else(|| "not calibrated: times as measured".into()),
    );
    format!(
        r#"/* CTF 1.8 */

typealias integer {{ size = 8; align = 8; signed = false; }} := uint8_t;
typealias integer {{ size = 32; align = 8; signed = false; }} := uint32_t;
typealias integer {{ size = 64; align = 8; signed = false; }} := uint64_t;
typealias integer {{ size = 64; align = 8; signed = false; base = 16; }} := uint64_hex_t;

trace {{
	major = 1;
	minor = 8;
	byte_order = le;
	packet.header := struct {{
		uint32_t magic;
		uint32_t stream_id;
	}};
}};

env {{
	tracer_name = "hotprobe";
	target = {target};
	probe_costs = {costs};
	hostname = "";
}};

clock {{
	name = "monotonic";
	description = "CLOCK_MONOTONIC";
	freq = 1000000000;
	precision = 1;
	offset_s = 0;
	offset = 0;
	absolute = FALSE;
}};

typealias integer {{ size = 64; align = 8; signed = false; map = clock.monotonic.value; }} := uint64_clock_monotonic_t;

typealias {probe_ty} := probe_t;

stream {{
	id = 0;
	packet.context := struct {{
		uint64_clock_monotonic_t timestamp_begin;
		uint64_clock_monotonic_t timestamp_end;
		uint64_t content_size;
		uint64_t packet_size;
		uint32_t tid;
	}};
	event.header := struct {{
		uint32_t id;
		uint64_clock_monotonic_t timestamp;
	}};
}};

event {{
	name = "func_entry";
	id = {EV_ENTRY};
	stream_id = 0;
	fields := struct {{
		probe_t func;
		uint8_t nargs;
		uint64_hex_t args[nargs];
	}};
}};

event {{
	name = "func_exit";
	id = {EV_EXIT};
	stream_id = 0;
	fields := struct {{
		probe_t func;
		uint8_t has_retval;
		uint64_hex_t retval;
		uint8_t unwound;
	}};
}};

event {{
	name = "func_hit";
	id = {EV_HIT};
	stream_id = 0;
	fields := struct {{
		probe_t func;
		uint8_t nargs;
		uint64_hex_t args[nargs];
	}};
}};

event {{
	name = "lost_events";
	id = {EV_LOST};
	stream_id = 0;
	fields := struct {{
		uint64_t count;
	}};
}};
"#,
        target = tsdl_string(&info.target),
    )
}

struct Packets<W: Write> {
    out: W,
    tid: u32,
    buf: Vec<u8>,
    begin: u64,
    end: u64,
    events: u64,
    packets: u64,
}

impl<W: Write> Packets<W> {
    fn event(&mut self, id: u32, ts: u64, fields: &[u8]) -> std::io::Result<()> {
        if self.buf.is_empty() {
            self.begin = ts;
        }
        self.end = ts;
        self.buf.extend_from_slice(&id.to_le_bytes());
        self.buf.extend_from_slice(&ts.to_le_bytes());
        self.buf.extend_from_slice(fields);
        self.events += 1;
        if self.buf.len() >= PACKET_TARGET {
            self.flush_packet()?;
        }
        Ok(())
    }

    fn flush_packet(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let head = 8 + 8 * 4 + 4;
        let bits = ((head + self.buf.len()) * 8) as u64;
        let mut h = Vec::with_capacity(head);
        h.extend_from_slice(&MAGIC.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&self.begin.to_le_bytes());
        h.extend_from_slice(&self.end.to_le_bytes());
        h.extend_from_slice(&bits.to_le_bytes());
        h.extend_from_slice(&bits.to_le_bytes());
        h.extend_from_slice(&self.tid.to_le_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(&self.buf)?;
        self.buf.clear();
        self.packets += 1;
        Ok(())
    }
}

/// Typed probes (format version 2) keep record indices, not values: CTF
/// gets no numbers for them.
fn args_fields(f: &mut Vec<u8>, probe: u32, args: &Args, types: &ValueTypes) {
    let args = if types.is_typed(probe) {
        &Args::EMPTY
    } else {
        args
    };
    f.extend_from_slice(&probe.to_le_bytes());
    f.push(args.len() as u8);
    for a in args.as_slice() {
        f.extend_from_slice(&a.to_le_bytes());
    }
}

fn exit_fields(f: &mut Vec<u8>, probe: u32, ret: Option<u64>, unwound: bool, types: &ValueTypes) {
    let ret = ret.filter(|_| !types.is_typed(probe));
    f.extend_from_slice(&probe.to_le_bytes());
    f.push(u8::from(ret.is_some()));
    f.extend_from_slice(&ret.unwrap_or(0).to_le_bytes());
    f.push(u8::from(unwound));
}

/// Writes a CTF 1.8 trace into `out_dir` (created): `metadata` and
/// `stream_<TID>` files.
pub fn export_ctf(
    reader: &TraceReader,
    out_dir: impl AsRef<Path>,
    progress: Progress<'_>,
) -> Result<CtfStats> {
    export_ctf_filtered(reader, &CompiledQuery::all(), out_dir, progress)
}

/// [`export_ctf`] of the calls `query` keeps ([`crate::query`]): each kept
/// call is a `func_entry` and a `func_exit` (a call with nothing kept
/// inside gets both when it ends), hits inside kept calls and lost-event
/// notes are kept; threads the query leaves out have no stream. An exit's
/// `unwound` flag is not carried through the filter (it reads false).
pub fn export_ctf_filtered(
    reader: &TraceReader,
    query: &CompiledQuery,
    out_dir: impl AsRef<Path>,
    mut progress: Progress<'_>,
) -> Result<CtfStats> {
    let dir = out_dir.as_ref();
    std::fs::create_dir_all(dir).map_err(|e| TraceError::io(dir, e))?;
    let mp = dir.join("metadata");
    std::fs::write(&mp, metadata(reader)).map_err(|e| TraceError::io(&mp, e))?;
    let mut stats = CtfStats::default();
    let total = reader.total_bytes();
    let mut done = 0;
    let types = reader.value_types();
    for st in reader.threads()? {
        let tid = st.tid();
        let src = st.path().to_path_buf();
        if !query.keeps_thread(tid) {
            done += std::fs::metadata(&src).map_or(0, |m| m.len());
            continue;
        }
        let p = dir.join(format!("stream_{tid}"));
        let io = |e: std::io::Error| TraceError::io(&p, e);
        let f = File::create(&p).map_err(io)?;
        let mut pk = Packets {
            out: BufWriter::new(f),
            tid,
            buf: Vec::with_capacity(PACKET_TARGET + 256),
            begin: 0,
            end: 0,
            events: 0,
            packets: 0,
        };
        let mut fields = Vec::with_capacity(64);
        if query.keeps_all() {
            for r in st {
                write_record(&mut pk, &mut fields, types, r?).map_err(io)?;
            }
        } else {
            let mut qs = QueryStack::new(query);
            let mut failed: Option<std::io::Error> = None;
            let mut emit = |s: Step| {
                if failed.is_some() {
                    return;
                }
                for r in step_records(s).into_iter().flatten() {
                    if let Err(e) = write_record(&mut pk, &mut fields, types, r) {
                        failed = Some(e);
                        return;
                    }
                }
            };
            for r in st {
                qs.feed(&r?, &mut emit);
            }
            qs.finish(&mut emit);
            if let Some(e) = failed {
                return Err(io(e));
            }
        }
        pk.flush_packet().map_err(io)?;
        pk.out.flush().map_err(io)?;
        stats.events += pk.events;
        stats.packets += pk.packets;
        stats.streams += 1;
        done += std::fs::metadata(&src).map_or(0, |m| m.len());
        if let Some(p) = progress.as_mut() {
            p(done, total);
        }
    }
    Ok(stats)
}

/// The records a step of the filtered tree stands for, in time order.
fn step_records(s: Step) -> [Option<Record>; 2] {
    match s {
        Step::Enter {
            probe, ts, args, ..
        } => [Some(Record::Entry { ts, probe, args }), None],
        Step::Leave {
            probe,
            start,
            end,
            args,
            ret,
            leaf,
            unfinished,
            ..
        } => {
            // A call closed without its exit (the stream ended) has none
            // here either, as in the unfiltered export.
            let exit = (!unfinished).then_some(Record::Exit {
                ts: end,
                probe,
                ret,
                unwound: false,
            });
            if leaf {
                [
                    Some(Record::Entry {
                        ts: start,
                        probe,
                        args,
                    }),
                    exit,
                ]
            } else {
                [exit, None]
            }
        }
        Step::Hit {
            probe, ts, args, ..
        } => [Some(Record::Hit { ts, probe, args }), None],
        Step::Lost { ts, count } => [Some(Record::Lost { ts, count }), None],
        Step::Orphan { .. } => [None, None],
    }
}

/// One record as CTF events.
fn write_record<W: Write>(
    pk: &mut Packets<W>,
    fields: &mut Vec<u8>,
    types: &ValueTypes,
    r: Record,
) -> std::io::Result<()> {
    fields.clear();
    match r {
        Record::Entry { ts, probe, args } => {
            args_fields(fields, probe, &args, types);
            pk.event(EV_ENTRY, ts, fields)?;
        }
        Record::Hit { ts, probe, args } => {
            args_fields(fields, probe, &args, types);
            pk.event(EV_HIT, ts, fields)?;
        }
        Record::Exit {
            ts,
            probe,
            ret,
            unwound,
        } => {
            exit_fields(fields, probe, ret, unwound, types);
            pk.event(EV_EXIT, ts, fields)?;
        }
        Record::Call {
            ts,
            dur,
            probe,
            args,
            ret,
        } => {
            args_fields(fields, probe, &args, types);
            pk.event(EV_ENTRY, ts, fields)?;
            fields.clear();
            exit_fields(fields, probe, ret, false, types);
            pk.event(EV_EXIT, ts.saturating_add(dur), fields)?;
        }
        Record::Lost { ts, count } => {
            pk.event(EV_LOST, ts, &count.to_le_bytes())?;
        }
    }
    Ok(())
}
