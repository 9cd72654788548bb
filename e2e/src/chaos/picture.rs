//! The run as a picture (`report.svg` beside the report): orders
//! acknowledged per second and orders not yet terminal over time, each on
//! its own scaled axis; below, one lane per fault kind, in its own colour,
//! a mark per fault (filled when it fired, hollow when it did not); and,
//! when an invariant broke, a line where its first evidence was written.

use std::fmt::Write as _;

use super::faults::Fault;
use super::report::Report;

const W: f64 = 1100.0;
const LEFT: f64 = 260.0;
const RIGHT: f64 = 70.0;
const TOP: f64 = 56.0;
const PLOT_H: f64 = 220.0;
const LANE_H: f64 = 17.0;
const ACKED: &str = "#1f77b4";
const OPEN: &str = "#d62728";
const BROKEN: &str = "#9400d3";

/// One colour per fault kind, in [`Fault::FIRST_ROUND`] order.
const PALETTE: [&str; 18] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#17becf",
    "#bcbd22", "#7f7f7f", "#393b79", "#8c564b", "#2ca02c", "#d62728", "#637939", "#e377c2",
];

/// Below this many pixels per fault a lane draws cells, not single faults.
const DENSE_PX: f64 = 6.0;

/// Most points a series draws: one per bucket of this many seconds.
fn bucket_seconds(seconds: f64) -> usize {
    (seconds / 400.0).ceil().max(1.0) as usize
}

/// A tick's label: whole numbers without decimals.
fn tick(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// A round step that cuts `max` into at most `n` intervals.
fn step(max: f64, n: f64) -> f64 {
    let raw = (max / n).max(1e-9);
    let magnitude = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * magnitude)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * magnitude)
        .max(1.0)
}

/// The SVG of `r`.
pub fn svg(r: &Report) -> String {
    let broken: Vec<(&str, f64)> = r
        .audit
        .first_seen
        .iter()
        .map(|(name, at)| {
            (
                name.as_str(),
                (*at - r.started_at).num_milliseconds().max(0) as f64 / 1000.0,
            )
        })
        .collect();
    let seconds = r
        .samples
        .last()
        .map_or(1.0, |s| s.second as f64)
        .max(r.timeline.last().map_or(0.0, |e| e.at_ms as f64 / 1000.0 + 1.0))
        .max(broken.iter().map(|b| b.1 + 1.0).fold(0.0, f64::max))
        .max(1.0);
    let rates: Vec<f64> = r
        .samples
        .windows(2)
        .map(|w| w[1].acknowledged.saturating_sub(w[0].acknowledged) as f64)
        .collect();
    let open_top = r.samples.iter().map(|s| s.in_flight).max().unwrap_or(0).max(1) as f64;
    let rate_top = rates.iter().copied().fold(1.0, f64::max);
    let (rate_step, open_step, x_step) = (step(rate_top, 5.0), step(open_top, 5.0), step(seconds, 12.0));
    let (rate_max, open_max) = (
        (rate_top / rate_step).ceil() * rate_step,
        (open_top / open_step).ceil() * open_step,
    );
    let kinds: Vec<(usize, Fault)> = Fault::FIRST_ROUND
        .iter()
        .copied()
        .enumerate()
        .filter(|(_, k)| r.timeline.iter().any(|e| e.fault == *k))
        .collect();
    let plot_w = W - LEFT - RIGHT;
    let lanes_top = TOP + PLOT_H + 40.0;
    let legend_y = lanes_top + LANE_H * kinds.len() as f64 + 28.0;
    let h = legend_y + 44.0;
    let x = |sec: f64| LEFT + plot_w * sec / seconds;
    let y = |v: f64, max: f64| TOP + PLOT_H * (1.0 - v / max);

    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{h}" viewBox="0 0 {W} {h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = writeln!(out, r#"<rect width="{W}" height="{h}" fill="white"/>"#);
    let verdict = match (r.layer_off, r.passed()) {
        (Some(layer), _) => format!(
            "{} off — {}",
            layer.name(),
            if r.caught() == Some(true) {
                "caught"
            } else {
                "NOT caught"
            }
        ),
        (None, true) => "passed".to_owned(),
        (None, false) => "FAILED".to_owned(),
    };
    let _ = writeln!(
        out,
        r#"<text x="{LEFT}" y="22" font-size="15">Chaos run, seed {} — {} orders, {} of {} faults fired — {verdict}</text>"#,
        r.seed,
        r.orders,
        r.timeline.iter().filter(|e| e.fired).count(),
        r.timeline.len()
    );

    // Axes: time along the bottom (and through the lanes), one scale per series.
    let bottom = TOP + PLOT_H;
    let mut t = 0.0;
    while t <= seconds + 1e-9 {
        let tx = x(t);
        let _ = writeln!(
            out,
            r##"<line x1="{tx:.1}" y1="{TOP}" x2="{tx:.1}" y2="{:.1}" stroke="#eee"/><text x="{tx:.1}" y="{:.1}" text-anchor="middle">{}</text>"##,
            lanes_top + LANE_H * kinds.len() as f64,
            bottom + 14.0,
            tick(t)
        );
        t += x_step;
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">seconds since the load started</text>"#,
        LEFT + plot_w / 2.0,
        bottom + 30.0
    );
    let mut v = 0.0;
    while v <= rate_max + 1e-9 {
        let vy = y(v, rate_max);
        let _ = writeln!(
            out,
            r##"<line x1="{LEFT}" y1="{vy:.1}" x2="{:.1}" y2="{vy:.1}" stroke="#eee"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="{ACKED}">{}</text>"##,
            LEFT + plot_w,
            LEFT - 6.0,
            vy + 4.0,
            tick(v)
        );
        v += rate_step;
    }
    let mut v = 0.0;
    while v <= open_max + 1e-9 {
        let vy = y(v, open_max);
        let _ = writeln!(
            out,
            r#"<text x="{:.1}" y="{:.1}" fill="{OPEN}">{}</text>"#,
            LEFT + plot_w + 6.0,
            vy + 4.0,
            tick(v)
        );
        v += open_step;
    }
    let _ = writeln!(
        out,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" fill="{ACKED}" transform="rotate(-90 {:.1} {:.1})">acknowledged / s</text><text x="{:.1}" y="{:.1}" text-anchor="middle" fill="{OPEN}" transform="rotate(90 {:.1} {:.1})">orders not terminal</text>"#,
        LEFT - 40.0,
        TOP + PLOT_H / 2.0,
        LEFT - 40.0,
        TOP + PLOT_H / 2.0,
        W - 22.0,
        TOP + PLOT_H / 2.0,
        W - 22.0,
        TOP + PLOT_H / 2.0
    );
    let _ = writeln!(
        out,
        r##"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{PLOT_H}" fill="none" stroke="#999"/>"##
    );

    // The two series.
    let line = |points: Vec<(f64, f64)>, colour: &str| {
        let pts: Vec<String> = points.iter().map(|(a, b)| format!("{a:.1},{b:.1}")).collect();
        format!(
            r#"<polyline fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"#,
            pts.join(" ")
        )
    };
    // A long run has more seconds than the plot has pixels: one point per
    // bucket of `per` seconds — the mean rate, the most orders open.
    let per = bucket_seconds(seconds);
    let acked: Vec<(f64, f64)> = rates
        .chunks(per)
        .enumerate()
        .map(|(i, c)| {
            let mean = c.iter().sum::<f64>() / c.len() as f64;
            (x(((i * per + c.len()) as f64).min(seconds)), y(mean, rate_max))
        })
        .collect();
    let open: Vec<(f64, f64)> = r
        .samples
        .chunks(per)
        .map(|c| {
            let last = c.last().expect("chunks are not empty");
            let most = c.iter().map(|s| s.in_flight.max(0)).max().unwrap_or(0);
            (x(last.second as f64), y(most as f64, open_max))
        })
        .collect();
    let _ = writeln!(out, "{}", line(acked, ACKED));
    let _ = writeln!(out, "{}", line(open, OPEN));

    // One lane per fault kind.
    for (lane, (colour_index, kind)) in kinds.iter().enumerate() {
        let colour = PALETTE[*colour_index % PALETTE.len()];
        let ly = lanes_top + LANE_H * lane as f64;
        let events: Vec<_> = r.timeline.iter().filter(|e| e.fault == *kind).collect();
        let fired = events.iter().filter(|e| e.fired).count();
        let _ = writeln!(
            out,
            r##"<rect class="lane" x="{LEFT}" y="{ly:.1}" width="{plot_w}" height="{LANE_H}" fill="{}"/><text x="{:.1}" y="{:.1}" text-anchor="end" fill="{colour}">{kind:?} ({fired}/{})</text>"##,
            if lane % 2 == 0 { "#f7f7f7" } else { "#fff" },
            LEFT - 6.0,
            ly + LANE_H - 5.0,
            events.len()
        );
        if events.len() as f64 <= plot_w / DENSE_PX {
            for e in events {
                let fx = x(e.at_ms as f64 / 1000.0);
                let fill = if e.fired { colour } else { "white" };
                let _ = writeln!(
                    out,
                    r#"<rect class="fault" x="{:.1}" y="{:.1}" width="4" height="{:.1}" fill="{fill}" stroke="{colour}"><title>{:.1} s {kind:?}{} — {}</title></rect>"#,
                    fx - 2.0,
                    ly + 3.0,
                    LANE_H - 6.0,
                    e.at_ms as f64 / 1000.0,
                    if e.fired { "" } else { " (not fired)" },
                    esc(&e.detail)
                );
            }
        } else {
            // Too many to tell apart: one mark per cell of `DENSE_PX`
            // pixels, filled when every fault in it fired, hollow when any
            // did not, with the counts in its tooltip.
            let cells = (plot_w / DENSE_PX).floor() as usize;
            let mut counts = vec![(0u32, 0u32); cells];
            for e in &events {
                let cell = (((x(e.at_ms as f64 / 1000.0) - LEFT) / DENSE_PX) as usize).min(cells - 1);
                if e.fired {
                    counts[cell].0 += 1;
                } else {
                    counts[cell].1 += 1;
                }
            }
            for (cell, (fired, missed)) in counts.iter().enumerate().filter(|(_, c)| c.0 + c.1 > 0) {
                let fill = if *missed == 0 { colour } else { "white" };
                let _ = writeln!(
                    out,
                    r#"<rect class="faults" x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="{fill}" stroke="{colour}"><title>{kind:?}: {fired} fired, {missed} not fired</title></rect>"#,
                    LEFT + DENSE_PX * cell as f64 + 1.0,
                    ly + 3.0,
                    DENSE_PX - 2.0,
                    LANE_H - 6.0,
                );
            }
        }
    }

    // Where each broken invariant was first seen.
    for (i, (name, at)) in broken.iter().enumerate() {
        let bx = x(*at);
        let _ = writeln!(
            out,
            r#"<line x1="{bx:.1}" y1="{TOP}" x2="{bx:.1}" y2="{:.1}" stroke="{BROKEN}" stroke-width="2"/><text x="{:.1}" y="{:.1}" fill="{BROKEN}" font-weight="bold">first seen: {} at {at:.1} s</text>"#,
            lanes_top + LANE_H * kinds.len() as f64,
            (bx + 4.0).min(W - RIGHT - 200.0),
            TOP + 14.0 + 14.0 * i as f64,
            esc(name)
        );
    }

    // Legend: one line per entry, under the lanes.
    let entries = [
        format!(
            r#"<line x1="0" y1="0" x2="20" y2="0" stroke="{ACKED}" stroke-width="2"/><text x="28" y="4">orders acknowledged per second (left scale)</text>"#
        ),
        format!(
            r#"<line x1="0" y1="0" x2="20" y2="0" stroke="{OPEN}" stroke-width="2"/><text x="28" y="4">orders not yet terminal (right scale)</text>"#
        ),
        r##"<rect x="2" y="-6" width="4" height="11" fill="#555" stroke="#555"/><rect x="12" y="-6" width="4" height="11" fill="white" stroke="#555"/><text x="28" y="4">a fault, fired / not fired (each lane: fault kind, fired of scheduled)</text>"##
            .to_owned(),
        format!(
            r#"<line x1="10" y1="-7" x2="10" y2="7" stroke="{BROKEN}" stroke-width="2"/><text x="28" y="4">where a broken invariant's first evidence was written</text>"#
        ),
    ];
    for (i, entry) in entries.iter().enumerate() {
        let (col, row) = (i % 2, i / 2);
        let _ = writeln!(
            out,
            r#"<g transform="translate({:.1} {:.1})">{entry}</g>"#,
            LEFT + 420.0 * col as f64,
            legend_y + 18.0 * row as f64
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::{step, svg};
    use crate::chaos::Report;

    /// The long run on record, five times over (10,006 s, 2,820 faults):
    /// each series draws at most ~400 points, a crowded lane draws cells.
    #[test]
    fn a_long_run_draws_buckets_not_every_second_and_fault() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../docs/results/chaos-kafka-28000-seed-7.json"
        );
        let mut r: Report = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let (samples, timeline) = (r.samples.clone(), r.timeline.clone());
        let span = samples.last().unwrap().second + 1;
        for k in 1..5u64 {
            r.samples.extend(samples.iter().cloned().map(|mut s| {
                s.second += k * span;
                s
            }));
            r.timeline.extend(timeline.iter().cloned().map(|mut e| {
                e.at_ms += k * span * 1000;
                e
            }));
        }
        let picture = svg(&r);
        for series in picture.lines().filter(|l| l.starts_with("<polyline")) {
            let points = series.matches(',').count();
            assert!(points <= 420, "{points} points in a series");
        }
        assert_eq!(
            picture.matches(r#"class="fault""#).count(),
            0,
            "crowded lanes draw cells"
        );
        assert!(picture.matches(r#"class="faults""#).count() > 0);
        // The short run itself still draws every fault.
        let short: Report = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(svg(&short).matches(r#"class="fault""#).count(), short.timeline.len());
    }

    #[test]
    fn steps_are_round_and_cut_the_range_into_at_most_n_parts() {
        for (max, n, want) in [
            (7.0, 5.0, 2.0),
            (100.0, 5.0, 20.0),
            (1_000.0, 12.0, 100.0),
            (0.5, 5.0, 1.0),
        ] {
            assert_eq!(step(max, n), want, "step({max}, {n})");
        }
        assert!(3_000.0 / step(3_000.0, 12.0) <= 12.0);
    }
}
