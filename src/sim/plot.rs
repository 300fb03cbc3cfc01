//! SVG plot of hit rate against capacity: one polyline per policy (Belady drawn last, on top).

use std::fmt::Write;

use crate::sim::replay::SimResult;
use crate::sim::svg;

const W: f64 = 720.0;
const H: f64 = 440.0;
const LEFT: f64 = 60.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 50.0;
const COLORS: [&str; 6] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"];
const BELADY_COLOR: &str = "#d62728";

/// Hit rate (y, 0–100%) against slots (x), one series per (policy, prefetch), with axes, grid
/// and legend.
pub fn plot_svg(results: &[SimResult]) -> String {
    let mut series: Vec<(String, Vec<(usize, f64)>)> = Vec::new();
    for r in results {
        let label =
            if r.prefetch == "none" { r.policy.clone() } else { format!("{}+{} prefetch", r.policy, r.prefetch) };
        match series.iter_mut().find(|(l, _)| *l == label) {
            Some((_, points)) => points.push((r.slots, r.hit_rate)),
            None => series.push((label, vec![(r.slots, r.hit_rate)])),
        }
    }
    series.sort_by_key(|(label, _)| label == "belady");
    for (_, points) in &mut series {
        points.sort_by_key(|p| p.0);
    }
    let max_x = results.iter().map(|r| r.slots).max().unwrap_or(1).max(1) as f64;
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let x = |s: f64| LEFT + pw * s / max_x;
    let y = |r: f64| TOP + ph * (1.0 - r);

    let mut out = svg::open(W, H);
    for i in 0..=5 {
        let r = i as f64 / 5.0;
        svg::line(&mut out, (LEFT, y(r)), (LEFT + pw, y(r)), "#e0e0e0");
        svg::text(&mut out, LEFT - 6.0, y(r) + 4.0, "end", &format!("{:.0}%", r * 100.0));
    }
    let mut xs: Vec<usize> = results.iter().map(|r| r.slots).collect();
    xs.sort_unstable();
    xs.dedup();
    let ticks: Vec<f64> = if xs.len() <= 8 {
        xs.iter().map(|&s| s as f64).collect()
    } else {
        (0..=5).map(|i| (max_x * i as f64 / 5.0).round()).collect()
    };
    for t in ticks {
        svg::line(&mut out, (x(t), TOP + ph), (x(t), TOP + ph + 5.0), "black");
        svg::text(&mut out, x(t), TOP + ph + 18.0, "middle", &format!("{t}"));
    }
    svg::line(&mut out, (LEFT, TOP), (LEFT, TOP + ph), "black");
    svg::line(&mut out, (LEFT, TOP + ph), (LEFT + pw, TOP + ph), "black");
    svg::text(&mut out, LEFT + pw / 2.0, H - 12.0, "middle", "expert slots");
    let _ = writeln!(
        out,
        "<text x=\"16\" y=\"{:.1}\" text-anchor=\"middle\" transform=\"rotate(-90 16 {:.1})\">hit rate</text>",
        TOP + ph / 2.0,
        TOP + ph / 2.0
    );
    for (i, (label, points)) in series.iter().enumerate() {
        let color = if label == "belady" { BELADY_COLOR } else { COLORS[i % COLORS.len()] };
        let coords: Vec<String> = points.iter().map(|&(s, r)| format!("{:.1},{:.1}", x(s as f64), y(r))).collect();
        let _ = writeln!(
            out,
            "<polyline fill=\"none\" stroke=\"{color}\" stroke-width=\"2\" points=\"{}\"/>",
            coords.join(" ")
        );
        for &(s, r) in points {
            let _ = writeln!(out, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{color}\"/>", x(s as f64), y(r));
        }
        let ly = TOP + 10.0 + 20.0 * i as f64;
        let lx = LEFT + pw + 15.0;
        let _ = writeln!(
            out,
            "<line x1=\"{lx:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{color}\" stroke-width=\"2\"/>",
            lx + 20.0
        );
        svg::text(&mut out, lx + 26.0, ly + 4.0, "start", label);
    }
    out.push_str("</svg>\n");
    out
}
