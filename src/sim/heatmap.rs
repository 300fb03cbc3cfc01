//! SVG heatmap of expert activations: MoE layers (rows) × experts (columns).

use std::fmt::Write;

use crate::sim::stats::TraceStats;
use crate::sim::svg;

const LEFT: f64 = 60.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 50.0;
const MAX_WIDTH: f64 = 960.0;

/// White (0) to dark blue (the largest count), on a square-root scale so sparse use shows.
fn color(count: u64, max: u64) -> String {
    let t = if max == 0 { 0.0 } else { (count as f64 / max as f64).sqrt() };
    let mix = |a: f64, b: f64| (a + (b - a) * t).round() as u8;
    format!("#{:02x}{:02x}{:02x}", mix(255.0, 8.0), mix(255.0, 48.0), mix(255.0, 107.0))
}

/// The activation counts of `stats` as a heatmap, with axis labels and a scale.
pub fn heatmap_svg(stats: &TraceStats) -> String {
    let rows = stats.activations.len().max(1) as f64;
    let cols = stats.experts.max(1) as f64;
    let cell = (MAX_WIDTH / cols).clamp(2.0, 16.0);
    let row_h = cell.max(4.0);
    let (pw, ph) = (cell * cols, row_h * rows);
    let max = stats.activations.iter().flat_map(|(_, r)| r.iter().copied()).max().unwrap_or(0);
    let mut out = svg::open(LEFT + pw + 20.0, TOP + ph + BOTTOM);
    svg::text(&mut out, LEFT, TOP - 10.0, "start", &format!("expert activations (token count; darkest = {max})"));
    let label_every = (rows / 16.0).ceil().max(1.0) as usize;
    for (r, (layer, counts)) in stats.activations.iter().enumerate() {
        let y = TOP + r as f64 * row_h;
        for (e, &c) in counts.iter().enumerate() {
            let _ = writeln!(
                out,
                "<rect x=\"{:.1}\" y=\"{y:.1}\" width=\"{cell:.1}\" height=\"{row_h:.1}\" fill=\"{}\"/>",
                LEFT + e as f64 * cell,
                color(c, max)
            );
        }
        if r % label_every == 0 {
            svg::text(&mut out, LEFT - 6.0, y + row_h / 2.0 + 4.0, "end", &layer.to_string());
        }
    }
    let _ = writeln!(
        out,
        "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{pw:.1}\" height=\"{ph:.1}\" fill=\"none\" stroke=\"black\"/>"
    );
    svg::text(&mut out, LEFT + pw / 2.0, TOP + ph + 20.0, "middle", "expert");
    svg::text(&mut out, LEFT, TOP + ph + 20.0, "start", "0");
    svg::text(&mut out, LEFT + pw, TOP + ph + 20.0, "end", &(stats.experts.saturating_sub(1)).to_string());
    svg::text(&mut out, 14.0, TOP - 10.0, "start", "layer");
    out.push_str("</svg>\n");
    out
}
