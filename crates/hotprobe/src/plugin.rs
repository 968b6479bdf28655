//! The QEMU plugin mechanism of a guest the session started with
//! hotprobe's plugin (`hotprobe_qemu`): `Count` and `Record` probes whose
//! sites were candidates before the VM ran are counted and recorded in
//! QEMU's translated code, with no stop of the VM; enabling one flips a flag.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use hotprobe_fastpath::RecordedEvent;
use hotprobe_qemu::{Delivery, Fetch, PluginEvent, PluginHost, PluginProbe, Reg, StringFetch};

use crate::handler::ProbeId;
use crate::recorder::{EventSink, SinkError};
use crate::ProbeStats;

/// What a plugin probe carries and how its events travel (see
/// [`crate::Session::add_plugin`]).
#[derive(Clone, Debug)]
pub struct PluginOptions {
    /// Asynchronous rings (the default) or synchronous delivery (the vCPU
    /// waits until hotprobe has the event: nothing is dropped).
    pub delivery: Delivery,
    /// The values an entry event carries; `None`: the first
    /// [`crate::FastPathConfig::record_args`] argument registers.
    pub values: Option<Vec<Fetch>>,
    /// A guest string an entry event carries (handed to
    /// [`EventSink::event_data`]).
    pub string: Option<StringFetch>,
    /// Only hits with this cr3 (a process's page tables).
    pub filter_cr3: Option<u64>,
    /// Only hits whose value `.0` equals `.1`.
    pub filter_value: Option<(u8, u64)>,
    /// Enabled when the guest starts (else enable it with
    /// [`crate::Session::set_enabled`]).
    pub enabled: bool,
}

impl Default for PluginOptions {
    fn default() -> Self {
        PluginOptions {
            delivery: Delivery::Async,
            values: None,
            string: None,
            filter_cr3: None,
            filter_value: None,
            enabled: true,
        }
    }
}

type SyncQueue = Arc<Mutex<Vec<(RecordedEvent, Vec<u8>)>>>;

/// The plugin of one guest, in its session slot.
pub(crate) struct GuestPlugin {
    pub(crate) host: PluginHost,
    /// Session probe id of each plugin probe index (shared with the
    /// synchronous handler).
    ids: Arc<Mutex<Vec<ProbeId>>>,
    index: HashMap<ProbeId, (u32, bool)>,
    /// Candidate sites.
    sites: std::collections::HashSet<u64>,
    /// Events the synchronous handler took, waiting for the drain.
    sync_events: SyncQueue,
    /// The return thunk was looked up.
    pub(crate) thunk_set: bool,
    /// Events handed to the sink.
    pub(crate) events: u64,
    /// Events lost in full rings.
    pub(crate) drops: u64,
}

/// The session's form of a plugin event.
fn recorded(ev: &PluginEvent, id: ProbeId) -> RecordedEvent {
    RecordedEvent {
        tsc: ev.tsc,
        probe_id: id.0,
        tid: ev.vcpu,
        kind: ev.kind,
        nargs: ev.nvalues,
        reserved: 0,
        reserved2: 0,
        args: ev.values,
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl GuestPlugin {
    pub(crate) fn new(host: PluginHost) -> GuestPlugin {
        let sync_events: SyncQueue = Arc::default();
        let ids: Arc<Mutex<Vec<ProbeId>>> = Arc::default();
        let (q, ids2) = (sync_events.clone(), ids.clone());
        // Synchronous events: the vCPU waits until the event is in this
        // queue (the session's drain hands it on), so nothing is lost.
        host.set_sync_handler(Box::new(move |ev, data| {
            let id = lock(&ids2).get(ev.probe as usize).copied();
            if let Some(id) = id {
                lock(&q).push((recorded(ev, id), data.to_vec()));
            }
            0
        }));
        GuestPlugin {
            host,
            ids,
            index: HashMap::new(),
            sites: Default::default(),
            sync_events,
            thunk_set: false,
            events: 0,
            drops: 0,
        }
    }

    /// Whether `addr` is a candidate site.
    pub(crate) fn is_site(&self, addr: u64) -> bool {
        self.sites.contains(&addr)
    }

    /// Adds a probe (before the guest runs): `record` makes it a return
    /// probe with entry and exit events; a `Count` with `is_return` counts
    /// returns.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add(
        &mut self,
        id: ProbeId,
        addr: u64,
        range: Option<(u64, u64)>,
        is_return: bool,
        record: bool,
        nargs: usize,
        maxactive: usize,
        opts: &PluginOptions,
    ) -> Result<(), String> {
        let delivery = if record {
            opts.delivery
        } else {
            Delivery::Count
        };
        let values = opts.values.clone().unwrap_or_else(|| {
            Reg::ARGS
                .iter()
                .take(nargs.min(6))
                .map(|r| Fetch::Reg(*r))
                .collect()
        });
        let p = PluginProbe {
            return_probe: is_return || record,
            delivery,
            values,
            string: opts.string,
            filter_cr3: opts.filter_cr3,
            filter_value: opts.filter_value,
            maxactive: maxactive.clamp(1, 4096) as u32,
            sites: vec![addr],
            range,
            enabled: opts.enabled,
        };
        let k = self.host.add_probe(&p).map_err(|e| e.to_string())?;
        let mut ids = lock(&self.ids);
        debug_assert_eq!(ids.len(), k as usize);
        ids.push(id);
        self.index.insert(id, (k, is_return));
        self.sites.insert(addr);
        Ok(())
    }

    /// Enables or disables a plugin probe (a flag: nothing retranslated).
    pub(crate) fn set_enabled(&self, id: ProbeId, on: bool) -> Result<(), String> {
        let (k, _) = self.index.get(&id).ok_or("not a plugin probe")?;
        self.host.set_enabled(*k, on).map_err(|e| e.to_string())
    }

    /// Probe `id`'s counts.
    pub(crate) fn stats(&self, id: ProbeId) -> Option<ProbeStats> {
        let (k, _) = self.index.get(&id)?;
        let c = self.host.counts(*k);
        Some(ProbeStats {
            hits: c.hits,
            nmissed: c.nmissed,
            returns: c.returns,
            ..ProbeStats::default()
        })
    }

    /// Hands the rings' and the synchronous queue's events to `sink`, with
    /// their data ([`EventSink::event_data`]), and reports drops.
    pub(crate) fn drain(&mut self, sink: &mut dyn EventSink) -> Result<u64, SinkError> {
        let ids = lock(&self.ids).clone();
        let mut err = None;
        let mut n = 0u64;
        let mut last_ts = 0u64;
        let mut lost = Vec::new();
        self.host.drain(
            &mut |ev, data| {
                let Some(id) = ids.get(ev.probe as usize) else {
                    return;
                };
                last_ts = ev.tsc;
                n += 1;
                if err.is_none() {
                    if let Err(e) = sink.event_data(&recorded(ev, *id), data) {
                        err = Some(e);
                    }
                }
            },
            &mut |vcpu, count| lost.push((vcpu, count)),
        );
        if let Some(e) = err {
            return Err(e);
        }
        for (vcpu, count) in lost {
            if count > 0 {
                self.drops += count;
                sink.lost(vcpu, last_ts, count)?;
            }
        }
        let queued = std::mem::take(&mut *lock(&self.sync_events));
        for (ev, data) in &queued {
            sink.event_data(ev, data)?;
        }
        n += queued.len() as u64;
        self.events += n;
        Ok(n)
    }
}
