//! Log lines that name their trace: the default text or JSON format of
//! `tracing-subscriber`, with the current span's `trace_id` and `span_id`
//! added (a prefix in text, two fields in JSON).

use std::fmt;

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{Format, Full, Json, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// An event format that adds the trace and span id to `inner`'s lines.
pub struct WithTraceIds<F> {
    inner: F,
    json: bool,
}

impl WithTraceIds<Format<Full>> {
    /// Text lines: `trace_id=… span_id=… <the usual line>`.
    pub fn text() -> Self {
        Self {
            inner: Format::default().with_target(false).with_ansi(false),
            json: false,
        }
    }
}

impl WithTraceIds<Format<Json>> {
    /// JSON lines with `trace_id` and `span_id` fields.
    pub fn json() -> Self {
        Self {
            inner: Format::default().json().flatten_event(true).with_target(false),
            json: true,
        }
    }
}

fn ids<S, N>(ctx: &FmtContext<'_, S, N>) -> Option<(String, String)>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    use opentelemetry::trace::TraceContextExt as _;
    let span = ctx.lookup_current()?;
    // No span extensions may be held here: the lookup takes them itself.
    let dispatch = tracing::dispatcher::get_default(Clone::clone);
    let cx = tracing_opentelemetry::get_otel_context(&span.id(), &dispatch)?;
    let span_context = cx.span().span_context().clone();
    span_context
        .is_valid()
        .then(|| (span_context.trace_id().to_string(), span_context.span_id().to_string()))
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(&self, ctx: &FmtContext<'_, S, N>, mut writer: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let Some((trace_id, span_id)) = ids(ctx) else {
            return self.inner.format_event(ctx, writer, event);
        };
        if !self.json {
            write!(writer, "trace_id={trace_id} span_id={span_id} ")?;
            return self.inner.format_event(ctx, writer, event);
        }
        let mut line = String::new();
        self.inner.format_event(ctx, Writer::new(&mut line), event)?;
        match line.strip_prefix('{') {
            Some(rest) => write!(writer, "{{\"trace_id\":\"{trace_id}\",\"span_id\":\"{span_id}\",{rest}"),
            None => writer.write_str(&line),
        }
    }
}
