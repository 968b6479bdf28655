//! What goes into a trace ([`TraceEvent`]) and what comes out ([`Record`]).

use serde::{Deserialize, Serialize};

/// Most argument values an event carries (the six x86-64 argument registers).
pub const MAX_ARGS: usize = 6;

/// Up to [`MAX_ARGS`] argument values, stored inline (no allocation).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Args {
    len: u8,
    vals: [u64; MAX_ARGS],
}

impl Args {
    /// No arguments.
    pub const EMPTY: Args = Args {
        len: 0,
        vals: [0; MAX_ARGS],
    };

    /// The first `MAX_ARGS` values of `vals`.
    pub fn from_slice(vals: &[u64]) -> Args {
        let mut a = Args::EMPTY;
        let n = vals.len().min(MAX_ARGS);
        a.vals[..n].copy_from_slice(&vals[..n]);
        a.len = n as u8;
        a
    }

    /// The values.
    pub fn as_slice(&self) -> &[u64] {
        &self.vals[..self.len as usize]
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.len as usize
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps the first `n` values.
    #[inline]
    pub fn truncated(mut self, n: usize) -> Args {
        if n == 0 {
            // The common case of `record` without --args.
            return Args::EMPTY;
        }
        if n < self.len as usize {
            self.len = n as u8;
            // Masks over the fixed array rather than a fill of `vals[n..]`
            // (a call to memset per event on the writer's hot path).
            for (k, v) in self.vals.iter_mut().enumerate() {
                *v &= 0u64.wrapping_sub((k < n) as u64);
            }
        }
        self
    }

    /// The first `n` (at most [`MAX_ARGS`]) values of a full array.
    #[inline]
    pub fn from_array(vals: [u64; MAX_ARGS], n: usize) -> Args {
        let n = n.min(MAX_ARGS);
        let mut a = Args { len: n as u8, vals };
        for (k, v) in a.vals.iter_mut().enumerate() {
            *v &= 0u64.wrapping_sub((k < n) as u64);
        }
        a
    }

    /// Appends a value (ignored when full).
    pub fn push(&mut self, v: u64) {
        if (self.len as usize) < MAX_ARGS {
            self.vals[self.len as usize] = v;
            self.len += 1;
        }
    }
}

impl std::fmt::Debug for Args {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

/// Kind of a [`TraceEvent`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// A function was entered.
    Entry,
    /// A function returned (or was left by unwinding, see [`TraceEvent::unwound`]).
    Exit,
    /// A mid-function probe was hit.
    Hit,
}

/// One event as the tracer drains it from the agent, input of
/// [`TraceWriter::write_event`](crate::TraceWriter::write_event).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEvent {
    /// Timestamp in the trace's [`TimeBase`] unit (TSC ticks or ns).
    pub ts: u64,
    /// Probe id (index into the symbol table).
    pub probe: u32,
    /// Linux thread id.
    pub tid: u32,
    /// Entry, exit or hit.
    pub kind: EventKind,
    /// Argument registers (entry, hit); the writer keeps as many as the
    /// probe's symbol asks for ([`Symbol::nargs`](crate::Symbol::nargs)).
    pub args: Args,
    /// Return value (exit); kept when the symbol asks for it.
    pub ret: Option<u64>,
    /// Exit without return (longjmp, exception).
    pub unwound: bool,
}

impl TraceEvent {
    /// A function entry.
    pub fn entry(ts: u64, tid: u32, probe: u32) -> TraceEvent {
        TraceEvent {
            ts,
            probe,
            tid,
            kind: EventKind::Entry,
            args: Args::EMPTY,
            ret: None,
            unwound: false,
        }
    }
    /// A function exit.
    pub fn exit(ts: u64, tid: u32, probe: u32) -> TraceEvent {
        TraceEvent {
            kind: EventKind::Exit,
            ..TraceEvent::entry(ts, tid, probe)
        }
    }
    /// A mid-function hit.
    pub fn hit(ts: u64, tid: u32, probe: u32) -> TraceEvent {
        TraceEvent {
            kind: EventKind::Hit,
            ..TraceEvent::entry(ts, tid, probe)
        }
    }
    /// With these arguments.
    pub fn with_args(self, args: &[u64]) -> TraceEvent {
        TraceEvent {
            args: Args::from_slice(args),
            ..self
        }
    }
    /// With this return value.
    pub fn with_ret(self, ret: u64) -> TraceEvent {
        TraceEvent {
            ret: Some(ret),
            ..self
        }
    }

    /// Converts an event the agent wrote into shared memory (timestamp in
    /// raw TSC ticks: record with [`TimeBase::Tsc`]). `None` for an unknown kind.
    #[inline]
    pub fn from_abi(e: &hotprobe_abi::Event) -> Option<TraceEvent> {
        let n = e.nargs as usize;
        // Branch-light: the whole argument array is copied and masked (no
        // copy of a variable-length slice), the event built in registers.
        let (kind, args, ret, unwound) = match e.kind {
            hotprobe_abi::KIND_ENTRY => {
                (EventKind::Entry, Args::from_array(e.args, n), None, false)
            }
            hotprobe_abi::KIND_HIT => (EventKind::Hit, Args::from_array(e.args, n), None, false),
            hotprobe_abi::KIND_EXIT => {
                let unwound = e.reserved & hotprobe_abi::EXIT_UNWOUND != 0;
                let ret = if unwound || n == 0 {
                    None
                } else {
                    Some(e.args[0])
                };
                (EventKind::Exit, Args::EMPTY, ret, unwound)
            }
            _ => return None,
        };
        Some(TraceEvent {
            ts: e.tsc,
            probe: e.probe_id,
            tid: e.tid,
            kind,
            args,
            ret,
            unwound,
        })
    }
}

/// Unit of the timestamps in the streams.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "unit", rename_all = "lowercase")]
pub enum TimeBase {
    /// Nanoseconds (`CLOCK_MONOTONIC`).
    Ns,
    /// Raw TSC ticks, converted through two (tsc, ns) pairs by linear
    /// interpolation (as `hotprobe_abi::TscCalibration`).
    Tsc {
        /// First pair: TSC.
        tsc0: u64,
        /// First pair: ns.
        ns0: u64,
        /// Second pair: TSC (≠ `tsc0`).
        tsc1: u64,
        /// Second pair: ns.
        ns1: u64,
    },
}

impl TimeBase {
    /// From the ABI's calibration.
    pub fn from_calibration(c: &hotprobe_abi::TscCalibration) -> TimeBase {
        TimeBase::Tsc {
            tsc0: c.tsc0,
            ns0: c.ns0,
            tsc1: c.tsc1,
            ns1: c.ns1,
        }
    }

    /// A TSC time base running at `hz` ticks per second with tick 0 at ns 0.
    pub fn tsc_hz(hz: u64) -> TimeBase {
        TimeBase::Tsc {
            tsc0: 0,
            ns0: 0,
            tsc1: hz,
            ns1: 1_000_000_000,
        }
    }

    /// Ticks per second (1e9 for ns).
    pub fn hz(&self) -> Option<u64> {
        match *self {
            TimeBase::Ns => Some(1_000_000_000),
            TimeBase::Tsc {
                tsc0,
                ns0,
                tsc1,
                ns1,
            } => {
                let dn = ns1.checked_sub(ns0).filter(|&d| d > 0)?;
                let dt = tsc1.checked_sub(tsc0)? as u128;
                u64::try_from(dt * 1_000_000_000 / dn as u128).ok()
            }
        }
    }

    /// True when the two calibration pairs can convert (always for ns):
    /// both clocks advance from the first pair to the second, at a rate of
    /// 1 kHz to 1 THz ticks per second (anything else is not a clock this
    /// recorder reads: a corrupt `info.json`).
    pub fn is_valid(&self) -> bool {
        match *self {
            TimeBase::Ns => true,
            TimeBase::Tsc {
                tsc0,
                tsc1,
                ns0,
                ns1,
                ..
            } => {
                tsc1 > tsc0
                    && ns1 > ns0
                    && self
                        .hz()
                        .is_some_and(|hz| (1_000..=1_000_000_000_000).contains(&hz))
            }
        }
    }

    /// Nanoseconds of a timestamp; `None` when the result is outside
    /// `u64` (before ns 0 or past its end: the timestamp does not belong
    /// to this time base).
    pub fn to_ns_checked(&self, t: u64) -> Option<u64> {
        match *self {
            TimeBase::Ns => Some(t),
            TimeBase::Tsc {
                tsc0,
                ns0,
                tsc1,
                ns1,
            } => {
                let dt = tsc1 as i128 - tsc0 as i128;
                if dt == 0 {
                    return None;
                }
                let dn = ns1 as i128 - ns0 as i128;
                let v = ns0 as i128 + (t as i128 - tsc0 as i128) * dn / dt;
                u64::try_from(v).ok()
            }
        }
    }

    /// Nanoseconds of a timestamp (saturating at the ends of `u64`).
    pub fn to_ns(&self, t: u64) -> u64 {
        match *self {
            TimeBase::Ns => t,
            TimeBase::Tsc {
                tsc0,
                ns0,
                tsc1,
                ns1,
            } => {
                let dt = tsc1 as i128 - tsc0 as i128;
                if dt == 0 {
                    return t;
                }
                let dn = ns1 as i128 - ns0 as i128;
                let v = ns0 as i128 + (t as i128 - tsc0 as i128) * dn / dt;
                v.clamp(0, u64::MAX as i128) as u64
            }
        }
    }

    /// The timestamp (in this base's ticks) of a `CLOCK_MONOTONIC` ns
    /// time: the inverse of [`TimeBase::to_ns`] through the calibration
    /// pairs (saturating at the ends of `u64`), for events of another
    /// source on the ns clock (the host kernel's).
    pub fn ticks_at_ns(&self, ns: u64) -> u64 {
        match *self {
            TimeBase::Ns => ns,
            TimeBase::Tsc {
                tsc0,
                ns0,
                tsc1,
                ns1,
            } => {
                let dn = ns1 as i128 - ns0 as i128;
                if dn == 0 {
                    return ns;
                }
                let dt = tsc1 as i128 - tsc0 as i128;
                let v = tsc0 as i128 + (ns as i128 - ns0 as i128) * dt / dn;
                v.clamp(0, u64::MAX as i128) as u64
            }
        }
    }

    /// Ticks of a duration in nanoseconds (rounded up).
    pub fn ticks_of_ns(&self, ns: u64) -> u64 {
        match *self {
            TimeBase::Ns => ns,
            TimeBase::Tsc {
                tsc0,
                ns0,
                tsc1,
                ns1,
            } => {
                let dn = (ns1 as u128).saturating_sub(ns0 as u128).max(1);
                let dt = (tsc1 as u128).saturating_sub(tsc0 as u128);
                let v = (ns as u128 * dt).div_ceil(dn);
                v.min(u64::MAX as u128) as u64
            }
        }
    }
}

/// One decoded record of a thread stream: what the reader returns and what
/// the source filter emits to the encoder.
///
/// Timestamps are absolute: nanoseconds when read through
/// [`TraceReader`](crate::TraceReader) (ticks of the time base inside the writer
/// and with [`ThreadStream::raw`](crate::ThreadStream)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Record {
    /// A function entered whose exit comes as a later [`Record::Exit`].
    Entry {
        /// Entry time.
        ts: u64,
        /// Probe id.
        probe: u32,
        /// Recorded arguments.
        args: Args,
    },
    /// A function left.
    Exit {
        /// Exit time.
        ts: u64,
        /// Probe id.
        probe: u32,
        /// Recorded return value.
        ret: Option<u64>,
        /// Left by unwinding.
        unwound: bool,
    },
    /// An entry and its exit with nothing recorded between (aggregated).
    Call {
        /// Entry time.
        ts: u64,
        /// Exit time − entry time.
        dur: u64,
        /// Probe id.
        probe: u32,
        /// Recorded arguments.
        args: Args,
        /// Recorded return value.
        ret: Option<u64>,
    },
    /// A mid-function probe hit.
    Hit {
        /// Time.
        ts: u64,
        /// Probe id.
        probe: u32,
        /// Recorded arguments.
        args: Args,
    },
    /// The agent lost `count` events here (full ring).
    Lost {
        /// Time of the previous record.
        ts: u64,
        /// Events lost.
        count: u64,
    },
}

impl Record {
    /// The record's (start) timestamp.
    pub fn ts(&self) -> u64 {
        match *self {
            Record::Entry { ts, .. }
            | Record::Exit { ts, .. }
            | Record::Call { ts, .. }
            | Record::Hit { ts, .. }
            | Record::Lost { ts, .. } => ts,
        }
    }

    /// The probe id (`None` for [`Record::Lost`]).
    pub fn probe(&self) -> Option<u32> {
        match *self {
            Record::Entry { probe, .. }
            | Record::Exit { probe, .. }
            | Record::Call { probe, .. }
            | Record::Hit { probe, .. } => Some(probe),
            Record::Lost { .. } => None,
        }
    }

    /// Function events this record stands for (a call is an entry and an exit).
    pub fn event_count(&self) -> u64 {
        match self {
            Record::Call { .. } => 2,
            Record::Lost { .. } => 0,
            _ => 1,
        }
    }
}
