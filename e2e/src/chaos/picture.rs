//! The run as a picture: orders acknowledged per second and orders not yet
//! terminal over time, with every fault as a marker (a cross when it did
//! not fire). Written beside the report as `report.svg`.

use std::fmt::Write as _;

use super::report::Report;

const W: f64 = 960.0;
const H: f64 = 360.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 110.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// The SVG of `r`.
pub fn svg(r: &Report) -> String {
    let seconds = r
        .samples
        .last()
        .map_or(1, |s| s.second)
        .max(r.timeline.last().map_or(0, |e| e.at_ms / 1000 + 1))
        .max(1) as f64;
    let rates: Vec<f64> = r
        .samples
        .windows(2)
        .map(|w| w[1].acknowledged.saturating_sub(w[0].acknowledged) as f64)
        .collect();
    let open_max = r.samples.iter().map(|s| s.in_flight).max().unwrap_or(0).max(1) as f64;
    let rate_max = rates.iter().copied().fold(1.0, f64::max);
    let plot_w = W - LEFT - RIGHT;
    let plot_h = H - TOP - BOTTOM;
    let x = |sec: f64| LEFT + plot_w * sec / seconds;
    let y = |v: f64, max: f64| TOP + plot_h * (1.0 - v / max);
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="20" font-size="14">Chaos run, seed {} — {} orders, {} faults fired</text>"#,
        r.seed,
        r.orders,
        r.timeline.iter().filter(|e| e.fired).count()
    );
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ccc"/>"##
    );
    let line = |points: Vec<(f64, f64)>, colour: &str| {
        let pts: Vec<String> = points.iter().map(|(a, b)| format!("{a:.1},{b:.1}")).collect();
        format!(
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"#,
            pts.join(" ")
        )
    };
    let acked: Vec<(f64, f64)> = rates
        .iter()
        .enumerate()
        .map(|(i, v)| (x(i as f64 + 1.0), y(*v, rate_max)))
        .collect();
    let open: Vec<(f64, f64)> = r
        .samples
        .iter()
        .map(|s| (x(s.second as f64), y(s.in_flight as f64, open_max)))
        .collect();
    let _ = writeln!(out, "{}", line(acked, "#4e79a7"));
    let _ = writeln!(out, "{}", line(open, "#e15759"));
    for (i, e) in r.timeline.iter().enumerate() {
        let fx = x(e.at_ms as f64 / 1000.0);
        let label = format!("{:?}", e.fault);
        let (mark, colour) = if e.fired { ("▼", "#333") } else { ("✕", "#999") };
        let ly = H - BOTTOM + 16.0 + 12.0 * (i % 6) as f64;
        let _ = writeln!(
            out,
            r##"<line x1="{fx:.1}" y1="{TOP}" x2="{fx:.1}" y2="{}" stroke="{colour}" stroke-dasharray="2,3"/><text x="{fx:.1}" y="{ly}" fill="{colour}">{mark} {}<title>{:.1} s {} — {}</title></text>"##,
            TOP + plot_h,
            esc(&label),
            e.at_ms as f64 / 1000.0,
            esc(&label),
            esc(&e.detail)
        );
    }
    let _ = writeln!(
        out,
        r##"<text x="{LEFT}" y="{}" fill="#4e79a7">— orders acknowledged per second (max {rate_max:.0})</text><text x="{}" y="{}" fill="#e15759">— orders not yet terminal (max {open_max:.0})</text><text x="{}" y="{}" text-anchor="end">{seconds:.0} s</text>"##,
        H - 10.0,
        LEFT + 330.0,
        H - 10.0,
        W - RIGHT,
        TOP + plot_h + 12.0
    );
    out.push_str("</svg>\n");
    out
}
