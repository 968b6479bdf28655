//! OpenTelemetry (OTLP) protobuf bodies: the calls as spans, the counts as
//! metrics, ready to POST to an OTLP/HTTP receiver (`/v1/traces`,
//! `/v1/metrics`, `Content-Type: application/x-protobuf`). This module
//! only encodes; [`OtlpEndpoint`](super::OtlpEndpoint) sends.
//!
//! * **Spans**: one per call; a thread's calls form one trace (trace id
//!   from pid, tid and start time), each call's parent span is its
//!   caller's, its outermost calls are root spans. Times are Unix ns: the
//!   trace clock shifted by the recording's wall-clock start
//!   (`start_unix_ns` ↔ the time base's second calibration pair, or the
//!   first record for an ns time base). Attributes: `thread.id`,
//!   `code.function.name`, `hotprobe.module`, `hotprobe.depth`,
//!   `hotprobe.args` (array of int), `hotprobe.retval` (int),
//!   `hotprobe.unfinished` (only when true). Spans are sent in batches.
//! * **Metrics**: monotonic cumulative int sums `hotprobe.calls` (`{call}`)
//!   and `hotprobe.self_time` (`ns`), one data point per function and
//!   thread (attributes `code.function.name`, `hotprobe.module`,
//!   `thread.id`).
//! * **Resource** (both): `service.name` (the program's file name),
//!   `process.pid`, `process.executable.path`, `process.command_line`,
//!   and for a trace with calibrated probe costs `hotprobe.probe_costs`
//!   (what the times are, and the functions on a trap). A span of a
//!   function probed through a trap has `hotprobe.on_trap` (its
//!   mechanism).
//!
//! The messages are a hand-written subset of opentelemetry-proto (field
//! numbers as in its `.proto` files), encoded with prost.

use std::collections::BTreeMap;

use prost::Message;

use crate::analysis::{visit_threads, Progress, Step};
use crate::error::{Result, TraceError};
use crate::event::TimeBase;
use crate::query::{trace_start, CompiledQuery};
use crate::reader::TraceReader;

/// The two OTLP signals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OtlpSignal {
    /// Spans (`ExportTraceServiceRequest`).
    Traces,
    /// Metrics (`ExportMetricsServiceRequest`).
    Metrics,
}

impl OtlpSignal {
    /// The OTLP/HTTP path: `/v1/traces` or `/v1/metrics`.
    pub fn path(self) -> &'static str {
        match self {
            OtlpSignal::Traces => "/v1/traces",
            OtlpSignal::Metrics => "/v1/metrics",
        }
    }
}

/// Options of [`export_otlp`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpOptions {
    /// Spans per request.
    pub batch_spans: usize,
    /// `service.name` (default: the target's file name).
    pub service_name: Option<String>,
}

impl Default for OtlpOptions {
    fn default() -> Self {
        OtlpOptions {
            batch_spans: 4096,
            service_name: None,
        }
    }
}

/// What [`export_otlp`] produced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OtlpStats {
    /// Spans (calls).
    pub spans: u64,
    /// Metric data points.
    pub points: u64,
    /// Request bodies handed to the sender.
    pub requests: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// Encodes the calls `query` keeps as OTLP requests and hands each body
/// to `send` (traces in batches of `opts.batch_spans`, then one metrics
/// request). An error of `send` stops the export and is returned.
pub fn export_otlp(
    reader: &TraceReader,
    query: &CompiledQuery,
    opts: &OtlpOptions,
    mut send: impl FnMut(OtlpSignal, Vec<u8>) -> std::io::Result<()>,
    progress: Progress<'_>,
) -> Result<OtlpStats> {
    let info = reader.info();
    let syms = reader.symbols();
    let costs = reader.probe_costs();
    let pid = info.pid.unwrap_or(0);
    // Unix ns of a trace time.
    let reference = match info.time_base {
        TimeBase::Tsc { ns1, .. } => ns1,
        TimeBase::Ns => trace_start(reader)?.unwrap_or(0),
    };
    let unix = |t: u64| -> u64 {
        (info.start_unix_ns as i128 + t as i128 - reference as i128).clamp(0, u64::MAX as i128)
            as u64
    };
    let resource = proto::Resource {
        attributes: {
            let service = opts.service_name.clone().unwrap_or_else(|| {
                std::path::Path::new(&info.target)
                    .file_name()
                    .map_or_else(|| info.target.clone(), |n| n.to_string_lossy().into())
            });
            let mut a = vec![
                kv_str("service.name", &service),
                kv_int("process.pid", pid as i64),
                kv_str("process.executable.path", &info.target),
            ];
            if !info.command.is_empty() {
                a.push(kv_str("process.command_line", &info.command.join(" ")));
            }
            if let Some(t) = crate::reader::times_line(reader) {
                a.push(kv_str("hotprobe.probe_costs", &t));
            }
            a
        },
    };
    let scope = proto::InstrumentationScope {
        name: "hotprobe".into(),
        version: env!("CARGO_PKG_VERSION").into(),
    };
    let mut stats = OtlpStats::default();
    let mut err: Option<TraceError> = None;
    let mut batch: Vec<proto::Span> = Vec::new();
    let mut flush = |batch: &mut Vec<proto::Span>, stats: &mut OtlpStats| -> Result<()> {
        if batch.is_empty() {
            return Ok(());
        }
        let req = proto::ExportTraceServiceRequest {
            resource_spans: vec![proto::ResourceSpans {
                resource: Some(resource.clone()),
                scope_spans: vec![proto::ScopeSpans {
                    scope: Some(scope.clone()),
                    spans: std::mem::take(batch),
                }],
            }],
        };
        let body = req.encode_to_vec();
        stats.requests += 1;
        stats.bytes += body.len() as u64;
        send(OtlpSignal::Traces, body).map_err(|e| TraceError::io("<OTLP traces>", e))
    };
    // Per (probe, tid): calls, self ns.
    let mut counts: BTreeMap<(u32, u32), (u64, u64)> = BTreeMap::new();
    let (mut first, mut last) = (u64::MAX, 0u64);
    let mut open: Vec<[u8; 8]> = Vec::new();
    let mut cur_tid: Option<u32> = None;
    let typed = crate::analysis::TypedText::new(reader)?;
    let mut next_id: u64 = 0;
    let mut trace_id = [0u8; 16];
    visit_threads(reader, query, progress, |tid, s| {
        if err.is_some() {
            return;
        }
        if cur_tid != Some(tid) {
            cur_tid = Some(tid);
            open.clear();
            trace_id[..4].copy_from_slice(&pid.to_be_bytes());
            trace_id[4..8].copy_from_slice(&tid.to_be_bytes());
            trace_id[8..].copy_from_slice(&info.start_unix_ns.to_be_bytes());
            if trace_id == [0; 16] {
                trace_id[15] = 1;
            }
        }
        let mut new_id = || {
            next_id += 1;
            next_id.to_be_bytes()
        };
        match s {
            Step::Enter { .. } => open.push(new_id()),
            Step::Leave {
                probe,
                start,
                end,
                depth,
                self_ns,
                args,
                ret,
                leaf,
                unfinished,
                ..
            } => {
                let id = if leaf {
                    new_id()
                } else {
                    open.pop().unwrap_or_else(&mut new_id)
                };
                let parent = open.last().map_or_else(Vec::new, |p| p.to_vec());
                first = first.min(start);
                last = last.max(end);
                let c = counts.entry((probe, tid)).or_default();
                c.0 += 1;
                c.1 += self_ns;
                let module = syms.get(probe).map_or("", |s| s.module.as_str());
                let mut attributes = vec![
                    kv_int("thread.id", tid as i64),
                    kv_str("code.function.name", &syms.name(probe)),
                    kv_str("hotprobe.module", module),
                    kv_int("hotprobe.depth", depth as i64),
                ];
                if let Some((label, _)) = costs.and_then(|c| c.label_of(probe)) {
                    if label.contains("trap") {
                        attributes.push(kv_str("hotprobe.on_trap", label));
                    }
                }
                let texts = typed.typed_args(tid, probe, &args);
                let ret_text = ret.and_then(|r| typed.typed_ret(tid, probe, r));
                let is_typed = typed.is_typed(probe);
                if let Some(t) = texts {
                    // Typed probes (format version 2): the values as text.
                    attributes.push(proto::KeyValue {
                        key: "hotprobe.args".into(),
                        value: Some(proto::AnyValue {
                            value: Some(proto::any_value::Value::ArrayValue(proto::ArrayValue {
                                values: t
                                    .into_iter()
                                    .map(|a| proto::AnyValue {
                                        value: Some(proto::any_value::Value::StringValue(a)),
                                    })
                                    .collect(),
                            })),
                        }),
                    });
                } else if !args.is_empty() && !is_typed {
                    attributes.push(proto::KeyValue {
                        key: "hotprobe.args".into(),
                        value: Some(proto::AnyValue {
                            value: Some(proto::any_value::Value::ArrayValue(proto::ArrayValue {
                                values: args
                                    .as_slice()
                                    .iter()
                                    .map(|&a| proto::AnyValue {
                                        value: Some(proto::any_value::Value::IntValue(a as i64)),
                                    })
                                    .collect(),
                            })),
                        }),
                    });
                }
                match (ret_text, ret) {
                    (Some(t), _) => attributes.push(kv_str("hotprobe.retval", &t)),
                    (None, Some(r)) if !is_typed => {
                        attributes.push(kv_int("hotprobe.retval", r as i64))
                    }
                    _ => {}
                }
                if unfinished {
                    attributes.push(proto::KeyValue {
                        key: "hotprobe.unfinished".into(),
                        value: Some(proto::AnyValue {
                            value: Some(proto::any_value::Value::BoolValue(true)),
                        }),
                    });
                }
                batch.push(proto::Span {
                    trace_id: trace_id.to_vec(),
                    span_id: id.to_vec(),
                    parent_span_id: parent,
                    name: syms.name(probe).into_owned(),
                    kind: 1, // SPAN_KIND_INTERNAL
                    start_time_unix_nano: unix(start),
                    end_time_unix_nano: unix(end),
                    attributes,
                });
                stats.spans += 1;
                if batch.len() >= opts.batch_spans.max(1) {
                    if let Err(e) = flush(&mut batch, &mut stats) {
                        err = Some(e);
                    }
                }
            }
            _ => {}
        }
    })?;
    if let Some(e) = err {
        return Err(e);
    }
    flush(&mut batch, &mut stats)?;
    // Metrics.
    if counts.is_empty() {
        return Ok(stats);
    }
    let (t0, t1) = (unix(first), unix(last));
    let point = |probe: u32, tid: u32, v: u64| proto::NumberDataPoint {
        attributes: vec![
            kv_str("code.function.name", &syms.name(probe)),
            kv_str(
                "hotprobe.module",
                syms.get(probe).map_or("", |s| s.module.as_str()),
            ),
            kv_int("thread.id", tid as i64),
        ],
        start_time_unix_nano: t0,
        time_unix_nano: t1,
        value: Some(proto::number_data_point::Value::AsInt(v as i64)),
    };
    let sum = |name: &str, unit: &str, description: &str, points: Vec<proto::NumberDataPoint>| {
        proto::Metric {
            name: name.into(),
            description: description.into(),
            unit: unit.into(),
            data: Some(proto::metric::Data::Sum(proto::Sum {
                data_points: points,
                aggregation_temporality: 2, // CUMULATIVE
                is_monotonic: true,
            })),
        }
    };
    let calls: Vec<_> = counts
        .iter()
        .map(|(&(p, t), &(n, _))| point(p, t, n))
        .collect();
    let selfs: Vec<_> = counts
        .iter()
        .map(|(&(p, t), &(_, ns))| point(p, t, ns))
        .collect();
    stats.points += (calls.len() + selfs.len()) as u64;
    let req = proto::ExportMetricsServiceRequest {
        resource_metrics: vec![proto::ResourceMetrics {
            resource: Some(resource.clone()),
            scope_metrics: vec![proto::ScopeMetrics {
                scope: Some(scope.clone()),
                metrics: vec![
                    sum(
                        "hotprobe.calls",
                        "{call}",
                        "Calls per function and thread",
                        calls,
                    ),
                    sum(
                        "hotprobe.self_time",
                        "ns",
                        "Time spent in the function itself, not in recorded callees",
                        selfs,
                    ),
                ],
            }],
        }],
    };
    let body = req.encode_to_vec();
    stats.requests += 1;
    stats.bytes += body.len() as u64;
    send(OtlpSignal::Metrics, body).map_err(|e| TraceError::io("<OTLP metrics>", e))?;
    Ok(stats)
}

fn kv_str(key: &str, v: &str) -> proto::KeyValue {
    proto::KeyValue {
        key: key.into(),
        value: Some(proto::AnyValue {
            value: Some(proto::any_value::Value::StringValue(v.into())),
        }),
    }
}

fn kv_int(key: &str, v: i64) -> proto::KeyValue {
    proto::KeyValue {
        key: key.into(),
        value: Some(proto::AnyValue {
            value: Some(proto::any_value::Value::IntValue(v)),
        }),
    }
}

/// The subset of opentelemetry-proto this exporter writes (and its tests
/// read back).
pub(crate) mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExportTraceServiceRequest {
        #[prost(message, repeated, tag = "1")]
        pub resource_spans: Vec<ResourceSpans>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResourceSpans {
        #[prost(message, optional, tag = "1")]
        pub resource: Option<Resource>,
        #[prost(message, repeated, tag = "2")]
        pub scope_spans: Vec<ScopeSpans>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ScopeSpans {
        #[prost(message, optional, tag = "1")]
        pub scope: Option<InstrumentationScope>,
        #[prost(message, repeated, tag = "2")]
        pub spans: Vec<Span>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Resource {
        #[prost(message, repeated, tag = "1")]
        pub attributes: Vec<KeyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct InstrumentationScope {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub version: String,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Span {
        #[prost(bytes = "vec", tag = "1")]
        pub trace_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub span_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "4")]
        pub parent_span_id: Vec<u8>,
        #[prost(string, tag = "5")]
        pub name: String,
        #[prost(int32, tag = "6")]
        pub kind: i32,
        #[prost(fixed64, tag = "7")]
        pub start_time_unix_nano: u64,
        #[prost(fixed64, tag = "8")]
        pub end_time_unix_nano: u64,
        #[prost(message, repeated, tag = "9")]
        pub attributes: Vec<KeyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct KeyValue {
        #[prost(string, tag = "1")]
        pub key: String,
        #[prost(message, optional, tag = "2")]
        pub value: Option<AnyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct AnyValue {
        #[prost(oneof = "any_value::Value", tags = "1, 2, 3, 5")]
        pub value: Option<any_value::Value>,
    }

    pub mod any_value {
        // The names of opentelemetry-proto.
        #[allow(clippy::enum_variant_names)]
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Value {
            #[prost(string, tag = "1")]
            StringValue(String),
            #[prost(bool, tag = "2")]
            BoolValue(bool),
            #[prost(int64, tag = "3")]
            IntValue(i64),
            #[prost(message, tag = "5")]
            ArrayValue(super::ArrayValue),
        }
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ArrayValue {
        #[prost(message, repeated, tag = "1")]
        pub values: Vec<AnyValue>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ExportMetricsServiceRequest {
        #[prost(message, repeated, tag = "1")]
        pub resource_metrics: Vec<ResourceMetrics>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ResourceMetrics {
        #[prost(message, optional, tag = "1")]
        pub resource: Option<Resource>,
        #[prost(message, repeated, tag = "2")]
        pub scope_metrics: Vec<ScopeMetrics>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ScopeMetrics {
        #[prost(message, optional, tag = "1")]
        pub scope: Option<InstrumentationScope>,
        #[prost(message, repeated, tag = "2")]
        pub metrics: Vec<Metric>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Metric {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(string, tag = "2")]
        pub description: String,
        #[prost(string, tag = "3")]
        pub unit: String,
        #[prost(oneof = "metric::Data", tags = "7")]
        pub data: Option<metric::Data>,
    }

    pub mod metric {
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Data {
            #[prost(message, tag = "7")]
            Sum(super::Sum),
        }
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sum {
        #[prost(message, repeated, tag = "1")]
        pub data_points: Vec<NumberDataPoint>,
        #[prost(int32, tag = "2")]
        pub aggregation_temporality: i32,
        #[prost(bool, tag = "3")]
        pub is_monotonic: bool,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub struct NumberDataPoint {
        #[prost(message, repeated, tag = "7")]
        pub attributes: Vec<KeyValue>,
        #[prost(fixed64, tag = "2")]
        pub start_time_unix_nano: u64,
        #[prost(fixed64, tag = "3")]
        pub time_unix_nano: u64,
        #[prost(oneof = "number_data_point::Value", tags = "6")]
        pub value: Option<number_data_point::Value>,
    }

    pub mod number_data_point {
        #[derive(Clone, PartialEq, prost::Oneof)]
        pub enum Value {
            #[prost(sfixed64, tag = "6")]
            AsInt(i64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::query::Query;

    #[test]
    fn one_span_per_call_parented_by_its_caller() {
        let dir = tempfile::tempdir().unwrap();
        let r = crate::query::tests::trace(dir.path());
        let mut bodies = Vec::new();
        let opts = OtlpOptions {
            batch_spans: 3,
            service_name: None,
        };
        let st = export_otlp(
            &r,
            &CompiledQuery::all(),
            &opts,
            |sig, b| {
                bodies.push((sig, b));
                Ok(())
            },
            None,
        )
        .unwrap();
        assert_eq!(st.spans, 7);
        assert_eq!(st.requests, 4, "3 span batches and the metrics");
        let mut spans = Vec::new();
        for (sig, b) in &bodies[..3] {
            assert_eq!(*sig, OtlpSignal::Traces);
            let req = proto::ExportTraceServiceRequest::decode(&b[..]).unwrap();
            let rs = &req.resource_spans[0];
            let res = rs.resource.as_ref().unwrap();
            assert!(res.attributes.iter().any(|kv| kv.key == "service.name"));
            spans.extend(rs.scope_spans[0].spans.iter().cloned());
        }
        let by_id: std::collections::HashMap<Vec<u8>, &proto::Span> =
            spans.iter().map(|s| (s.span_id.clone(), s)).collect();
        let parent = |s: &proto::Span| by_id.get(&s.parent_span_id).map(|p| p.name.as_str());
        let mut edges: Vec<(String, Option<&str>)> =
            spans.iter().map(|s| (s.name.clone(), parent(s))).collect();
        edges.sort();
        assert_eq!(
            edges,
            [
                ("a".to_string(), Some("main")),
                ("b".into(), Some("main")),
                ("leaf".into(), Some("a")),
                ("leaf".into(), Some("b")),
                ("leaf".into(), Some("b")),
                ("leaf".into(), Some("main")),
                ("main".into(), None),
            ]
        );
        let main = spans.iter().find(|s| s.name == "main").unwrap();
        assert_eq!(main.end_time_unix_nano - main.start_time_unix_nano, 300);
        // The leaf with an argument: -1 as an int, its return value.
        let l = spans
            .iter()
            .find(|s| s.attributes.iter().any(|kv| kv.key == "hotprobe.args"))
            .unwrap();
        let attr = |k: &str| {
            l.attributes
                .iter()
                .find(|kv| kv.key == k)
                .unwrap()
                .value
                .clone()
        };
        assert_eq!(
            attr("hotprobe.retval").unwrap().value,
            Some(proto::any_value::Value::IntValue(7))
        );
        let m = proto::ExportMetricsServiceRequest::decode(&bodies[3].1[..]).unwrap();
        let metrics = &m.resource_metrics[0].scope_metrics[0].metrics;
        assert_eq!(metrics[0].name, "hotprobe.calls");
        let Some(proto::metric::Data::Sum(sum)) = &metrics[0].data else {
            panic!("not a sum")
        };
        let total: i64 = sum
            .data_points
            .iter()
            .map(|p| match p.value {
                Some(proto::number_data_point::Value::AsInt(v)) => v,
                None => 0,
            })
            .sum();
        assert_eq!(total, 7);
        // A query: only b's subtree.
        let q = Query {
            filter: vec!["b".into()],
            ..Query::all()
        }
        .compile(&r)
        .unwrap();
        let st = export_otlp(&r, &q, &OtlpOptions::default(), |_, _| Ok(()), None).unwrap();
        assert_eq!(st.spans, 3);
    }
}
