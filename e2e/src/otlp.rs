//! An OTLP/HTTP trace receiver inside the test process, so a test can see
//! the spans every service exported — and what one order's trace looks like.
//!
//! The services export protobuf (`POST /v1/traces`, as to Jaeger or a
//! collector); the receiver keeps each request's body and decodes it with
//! `opentelemetry-proto` only when asked — so a benchmark that runs the
//! receiver on the measured machine does not charge decoding to the stack.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::Router;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::common::v1::KeyValue;
use prost::Message as _;

/// One exported span, flattened.
#[derive(Debug, Clone)]
pub struct Span {
    /// `service.name` of the process that exported it.
    pub service: String,
    /// Hex trace id.
    pub trace_id: String,
    /// Hex span id.
    pub span_id: String,
    /// Hex parent span id; empty for a root.
    pub parent_id: String,
    /// Span name.
    pub name: String,
    /// Start, Unix nanoseconds.
    pub start_ns: u64,
    /// End, Unix nanoseconds.
    pub end_ns: u64,
    /// String attributes.
    pub attributes: BTreeMap<String, String>,
    /// Events: name and string attributes.
    pub events: Vec<(String, BTreeMap<String, String>)>,
    /// Links: the hex trace id and span id of each span it names as related.
    pub links: Vec<(String, String)>,
}

/// A running receiver; stops with its task when dropped.
pub struct Receiver {
    /// Where it listens; give `http://{addr}` as `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub addr: SocketAddr,
    bodies: Arc<Mutex<Vec<Bytes>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn strings(attrs: &[KeyValue]) -> BTreeMap<String, String> {
    attrs
        .iter()
        .filter_map(|kv| {
            let v = match kv.value.as_ref()?.value.as_ref()? {
                Value::StringValue(s) => s.clone(),
                Value::IntValue(i) => i.to_string(),
                Value::BoolValue(b) => b.to_string(),
                Value::DoubleValue(d) => d.to_string(),
                _ => return None,
            };
            Some((kv.key.clone(), v))
        })
        .collect()
}

async fn export(State(bodies): State<Arc<Mutex<Vec<Bytes>>>>, body: Bytes) -> StatusCode {
    bodies.lock().expect("bodies").push(body);
    StatusCode::OK
}

fn decode(body: &Bytes, out: &mut Vec<Span>) {
    let Ok(request) = ExportTraceServiceRequest::decode(body.clone()) else {
        return;
    };
    for rs in request.resource_spans {
        let service = rs
            .resource
            .as_ref()
            .map(|r| strings(&r.attributes))
            .and_then(|a| a.get("service.name").cloned())
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                out.push(Span {
                    service: service.clone(),
                    trace_id: hex::encode(&s.trace_id),
                    span_id: hex::encode(&s.span_id),
                    parent_id: hex::encode(&s.parent_span_id),
                    name: s.name,
                    start_ns: s.start_time_unix_nano,
                    end_ns: s.end_time_unix_nano,
                    attributes: strings(&s.attributes),
                    events: s
                        .events
                        .iter()
                        .map(|e| (e.name.clone(), strings(&e.attributes)))
                        .collect(),
                    links: s
                        .links
                        .iter()
                        .map(|l| (hex::encode(&l.trace_id), hex::encode(&l.span_id)))
                        .collect(),
                });
            }
        }
    }
}

impl Receiver {
    /// Starts a receiver on a free local port.
    pub async fn start() -> anyhow::Result<Self> {
        let bodies = Arc::new(Mutex::new(Vec::new()));
        let app = Router::new()
            .route("/v1/traces", post(export))
            .with_state(bodies.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, bodies, task })
    }

    /// The endpoint to configure in the services.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far, decoded now.
    pub fn spans(&self) -> Vec<Span> {
        let bodies = self.bodies.lock().expect("bodies").clone();
        let mut out = Vec::new();
        for body in &bodies {
            decode(body, &mut out);
        }
        out
    }

    /// How many spans arrived so far.
    pub fn span_count(&self) -> usize {
        self.spans().len()
    }

    /// Every span of `trace_id` received so far.
    pub fn trace(&self, trace_id: &str) -> Trace {
        Trace {
            spans: self.spans().into_iter().filter(|s| s.trace_id == trace_id).collect(),
        }
    }
}

/// The spans of one trace.
#[derive(Debug, Clone)]
pub struct Trace {
    /// In arrival order.
    pub spans: Vec<Span>,
}

impl Trace {
    /// The services that exported spans of this trace.
    pub fn services(&self) -> std::collections::BTreeSet<&str> {
        self.spans.iter().map(|s| s.service.as_str()).collect()
    }

    /// The span with this id.
    pub fn get(&self, span_id: &str) -> Option<&Span> {
        self.spans.iter().find(|s| s.span_id == span_id)
    }

    /// The first span that recorded an event `name` with `key = value`.
    pub fn with_event(&self, name: &str, key: &str, value: &str) -> Option<&Span> {
        self.spans.iter().find(|s| {
            s.events
                .iter()
                .any(|(n, a)| n == name && a.get(key).map(String::as_str) == Some(value))
        })
    }

    /// `span` and its ancestors, leaf first, as far as the parents were
    /// received; the error names the first parent that is missing.
    pub fn ancestry<'a>(&'a self, span: &'a Span, root_parent: &str) -> Result<Vec<&'a Span>, String> {
        let mut chain = vec![span];
        let mut current = span;
        while current.parent_id != root_parent {
            let Some(parent) = self.get(&current.parent_id) else {
                return Err(format!(
                    "{} span {:?} ({}) has parent {:?}, which no service exported: the context was dropped there",
                    current.service, current.name, current.span_id, current.parent_id
                ));
            };
            chain.push(parent);
            current = parent;
        }
        Ok(chain)
    }

    /// An SVG timeline: one bar per span, indented by depth, coloured by
    /// service — how one order moved through the system.
    pub fn svg(&self, title: &str) -> String {
        let mut spans: Vec<&Span> = self.spans.iter().collect();
        spans.sort_by_key(|s| s.start_ns);
        let t0 = spans.first().map_or(0, |s| s.start_ns);
        let t1 = spans.iter().map(|s| s.end_ns).max().unwrap_or(t0 + 1).max(t0 + 1);
        let by_id: HashMap<&str, &Span> = spans.iter().map(|s| (s.span_id.as_str(), *s)).collect();
        let depth = |s: &Span| {
            let mut d = 0;
            let mut p = s.parent_id.as_str();
            while let Some(parent) = by_id.get(p) {
                d += 1;
                p = parent.parent_id.as_str();
            }
            d
        };
        let colours = [
            ("order-api", "#4e79a7"),
            ("outbox-relay", "#f28e2b"),
            ("inventory-service", "#59a14f"),
            ("payment-service", "#e15759"),
            ("mock-gateway", "#b07aa1"),
        ];
        let (label_w, bar_w, row_h) = (330.0, 640.0, 18.0);
        let height = 60.0 + row_h * spans.len() as f64 + 30.0;
        let mut out = String::new();
        let _ = writeln!(
            out,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{height}" font-family="monospace" font-size="11">"#,
            w = label_w + bar_w + 20.0
        );
        let _ = writeln!(out, r#"<text x="10" y="20" font-size="14">{}</text>"#, xml(title));
        let total_ms = (t1 - t0) as f64 / 1e6;
        let _ = writeln!(
            out,
            r#"<text x="{label_w}" y="40">0 ms</text><text x="{}" y="40" text-anchor="end">{total_ms:.1} ms</text>"#,
            label_w + bar_w
        );
        for (i, s) in spans.iter().enumerate() {
            let y = 50.0 + row_h * i as f64;
            let x = label_w + bar_w * (s.start_ns - t0) as f64 / (t1 - t0) as f64;
            let w = (bar_w * (s.end_ns.saturating_sub(s.start_ns)) as f64 / (t1 - t0) as f64).max(1.5);
            let colour = colours
                .iter()
                .find(|(svc, _)| *svc == s.service)
                .map_or("#999999", |(_, c)| c);
            let indent = 10.0 + 8.0 * f64::from(depth(s));
            let _ = writeln!(
                out,
                r#"<text x="{indent}" y="{ty}">{}: {}</text><rect x="{x:.1}" y="{y}" width="{w:.1}" height="{h}" fill="{colour}"><title>{} {} ({:.2} ms)</title></rect>"#,
                xml(&s.service),
                xml(&s.name),
                xml(&s.service),
                xml(&s.name),
                (s.end_ns.saturating_sub(s.start_ns)) as f64 / 1e6,
                ty = y + 12.0,
                h = row_h - 4.0,
            );
        }
        let mut x = 10.0;
        let y = 60.0 + row_h * spans.len() as f64 + 10.0;
        for (svc, colour) in colours {
            let _ = writeln!(
                out,
                r#"<rect x="{x}" y="{}" width="10" height="10" fill="{colour}"/><text x="{}" y="{y}">{svc}</text>"#,
                y - 9.0,
                x + 14.0
            );
            x += 150.0;
        }
        out.push_str("</svg>\n");
        out
    }
}

fn xml(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}
