//! The few SVG text helpers the plots share.

use std::fmt::Write;

/// Opens an SVG document of `width × height` with a white background.
pub(crate) fn open(width: f64, height: f64) -> String {
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width}\" height=\"{height}\" \
         viewBox=\"0 0 {width} {height}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    )
}

/// Appends a text element anchored `anchor` (`start`, `middle`, `end`) at (x, y).
pub(crate) fn text(out: &mut String, x: f64, y: f64, anchor: &str, s: &str) {
    let s = s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    let _ = writeln!(out, "<text x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"{anchor}\">{s}</text>");
}

/// Appends a line.
pub(crate) fn line(out: &mut String, (x1, y1): (f64, f64), (x2, y2): (f64, f64), stroke: &str) {
    let _ = writeln!(out, "<line x1=\"{x1:.1}\" y1=\"{y1:.1}\" x2=\"{x2:.1}\" y2=\"{y2:.1}\" stroke=\"{stroke}\"/>");
}
