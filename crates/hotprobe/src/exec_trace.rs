//! A trace writer's sink for `record -f` across exec: the functions probed
//! in each program a followed process executes become symbols of the trace
//! (under ids of their own, after those given at its creation), and the
//! process (pid, command name, program) is listed in its `info.json`.

use crate::recorder::{EventSink, SinkError};
use crate::{ExecImage, RecordedEvent};
use hotprobe_trace::{ProbeKind, ProcessInfo, Symbol, TraceEvent, TraceWriter};
use std::collections::HashMap;

/// Hands events to a [`TraceWriter`], giving the probes of each program a
/// followed process executes trace ids from `first_id` on.
pub struct ExecTraceSink<'w> {
    writer: &'w mut TraceWriter,
    /// Session probe id → trace id, for the probes of executed programs.
    ids: HashMap<u32, u32>,
    next: u32,
    /// `nargs` and `retval` of the functions added.
    nargs: u8,
    retval: bool,
}

impl<'w> ExecTraceSink<'w> {
    /// A sink into `writer`, whose symbols so far have ids below
    /// `first_id`; the functions added record `nargs` arguments and
    /// (`retval`) their return values.
    pub fn new(writer: &'w mut TraceWriter, first_id: u32, nargs: u8, retval: bool) -> Self {
        ExecTraceSink {
            writer,
            ids: HashMap::new(),
            next: first_id,
            nargs,
            retval,
        }
    }

    fn mapped(&self, ev: &RecordedEvent) -> RecordedEvent {
        let mut ev = *ev;
        if let Some(id) = self.ids.get(&ev.probe_id) {
            ev.probe_id = *id;
        }
        ev
    }
}

fn failed(e: hotprobe_trace::TraceError) -> SinkError {
    SinkError(Box::new(e))
}

impl EventSink for ExecTraceSink<'_> {
    fn event(&mut self, ev: &RecordedEvent) -> Result<(), SinkError> {
        let ev = self.mapped(ev);
        match TraceEvent::from_abi(&ev) {
            Some(te) => self.writer.write_event(&te).map_err(failed),
            None => Ok(()),
        }
    }

    fn event_data(&mut self, ev: &RecordedEvent, data: &[u8]) -> Result<(), SinkError> {
        let ev = self.mapped(ev);
        match TraceEvent::from_abi(&ev) {
            Some(te) => self.writer.write_event_values(&te, data).map_err(failed),
            None => Ok(()),
        }
    }

    fn lost(&mut self, tid: u32, ts: u64, count: u64) -> Result<(), SinkError> {
        self.writer.note_lost(tid, ts, count).map_err(failed)
    }

    fn idle(&mut self) {
        self.writer.idle();
    }

    fn exec_image(&mut self, image: &ExecImage) -> Result<(), SinkError> {
        let program = image.path.display().to_string();
        let mut symbols = Vec::new();
        let mut probes = Vec::new();
        for p in &image.placements {
            let id = self.next;
            self.next += 1;
            self.ids.insert(p.id.0, id);
            probes.push(id);
            symbols.push(Symbol {
                id,
                // A probe still pending (its library not loaded yet) is
                // named by its spec's function, as the writer's include
                // patterns name it (`libc:malloc`: `malloc`).
                name: p.function.clone().unwrap_or_else(|| {
                    match p.label.parse::<hotprobe_symbols::ProbeSpec>() {
                        Ok(hotprobe_symbols::ProbeSpec::Function { name, .. }) => name,
                        _ => p.label.clone(),
                    }
                }),
                module: if p.module.is_empty() {
                    program.clone()
                } else {
                    p.module.clone()
                },
                addr: p.addr.0,
                kind: ProbeKind::Function,
                nargs: self.nargs,
                retval: self.retval,
            });
        }
        self.writer.add_symbols(symbols).map_err(failed)?;
        self.writer
            .note_process(ProcessInfo {
                pid: image.pid as u32,
                comm: image.comm.clone(),
                program,
                probes,
            })
            .map_err(failed)
    }
}
