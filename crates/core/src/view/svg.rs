//! The SVG pieces the HTML views draw with: the DAG and line charts.

use std::fmt::Write as _;

use super::layout::layered;
use super::{NodeView, Outcome};

/// Text made safe inside HTML and SVG.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// The fill of a node's box.
pub(crate) fn colour(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Ran => "#66bb6a",
        Outcome::Cached => "#90caf9",
        Outcome::Failed => "#e57373",
        Outcome::Skipped => "#e0e0e0",
        Outcome::Frozen => "#fff59d",
    }
}

/// The DAG, boxes coloured by outcome, laid out by [`layered`].
pub(crate) fn dag_svg(nodes: &[NodeView]) -> String {
    let layout = layered(nodes);
    let (w, h, gx, gy, dummy) = (210.0, 44.0, 24.0, 46.0, 14.0);
    let width_of = |i: usize| if i < layout.real { w } else { dummy };
    let layer_width = |l: &Vec<usize>| l.iter().map(|&i| width_of(i) + gx).sum::<f64>();
    let widest = layout.layers.iter().map(layer_width).fold(0.0, f64::max);
    let (width, height) = (widest + 20.0, layout.layers.len() as f64 * (h + gy) + 20.0);
    // Each vertex's box: left x, top y.
    let mut place = vec![(0.0, 0.0); layout.rank.len()];
    for (r, layer) in layout.layers.iter().enumerate() {
        let mut x = 10.0 + (widest - layer_width(layer)) / 2.0;
        for &i in layer {
            place[i] = (x, 10.0 + r as f64 * (h + gy));
            x += width_of(i) + gx;
        }
    }
    let mut svg = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="11">"#
    );
    svg.push_str(r##"<defs><marker id="arrow" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" markerHeight="7" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="#888"/></marker></defs>"##);
    for chain in &layout.chains {
        // Down the middle of each dummy, a curve between ranks.
        let mut d = String::new();
        for (k, pair) in chain.windows(2).enumerate() {
            let (a, b) = (pair[0], pair[1]);
            let (sx, sy) = (place[a].0 + width_of(a) / 2.0, place[a].1 + h);
            let (ex, ey) = (place[b].0 + width_of(b) / 2.0, place[b].1);
            let mid = (sy + ey) / 2.0;
            if k == 0 {
                let _ = write!(d, "M{sx:.1},{sy:.1} ");
            }
            let _ = write!(d, "C{sx:.1},{mid:.1} {ex:.1},{mid:.1} {ex:.1},{ey:.1} ");
            if b >= layout.real {
                let _ = write!(d, "L{ex:.1},{:.1} ", ey + h);
            }
        }
        let _ = write!(
            svg,
            r##"<path d="{}" fill="none" stroke="#888" stroke-width="1" marker-end="url(#arrow)"/>"##,
            d.trim_end()
        );
    }
    for (i, n) in nodes.iter().enumerate() {
        let (x, y) = place[i];
        let key = n.key.as_deref().map_or("--------", |k| &k[..8.min(k.len())]);
        let secs = n.seconds.map_or(String::new(), |s| format!(" · {s:.1}s"));
        let _ = write!(
            svg,
            r##"<g><title>{} ({}) {}</title><rect x="{x}" y="{y}" width="{w}" height="{h}" rx="5" fill="{}" stroke="#555"/><text x="{}" y="{}">{}</text><text x="{}" y="{}" fill="#333">{} {key}{secs}</text></g>"##,
            esc(&n.id),
            esc(&n.op),
            esc(n.outcome.as_str()),
            colour(n.outcome),
            x + 6.0,
            y + 17.0,
            esc(&n.id.chars().take(32).collect::<String>()),
            x + 6.0,
            y + 34.0,
            n.outcome,
        );
    }
    svg.push_str("</svg>");
    svg
}

/// A chart's frame and scales: a `W`×`H` SVG whose plot box starts `M` from
/// the left and ends `M` above the bottom, scaled to the points' bounds.
pub(crate) struct Plot {
    w: f64,
    h: f64,
    m: f64,
    x: (f64, f64),
    y: (f64, f64),
}

impl Plot {
    /// Opens the figure and draws the plot box; `None` (after writing
    /// `undefined` in the box) when there is no point to draw.
    pub(crate) fn open(svg: &mut String, (w, h, m): (f64, f64, f64), xs: &[f64], ys: &[f64]) -> Option<Plot> {
        let _ = write!(
            svg,
            r##"<figure><svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="10"><rect x="{m}" y="8" width="{}" height="{}" fill="none" stroke="#aaa"/>"##,
            w - m - 8.0,
            h - m - 8.0
        );
        if xs.is_empty() || ys.is_empty() {
            let _ = write!(svg, r#"<text x="{}" y="{}">undefined</text>"#, w / 2.0 - 20.0, h / 2.0);
            return None;
        }
        let bounds = |v: &[f64]| v.iter().fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
        let (y0, y1) = bounds(ys);
        let y = if (y1 - y0).abs() < 1e-300 { (y0 - 1.0, y1 + 1.0) } else { (y0, y1) };
        Some(Plot { w, h, m, x: bounds(xs), y })
    }

    pub(crate) fn sx(&self, x: f64) -> f64 {
        self.m + (x - self.x.0) / (self.x.1 - self.x.0).max(1e-300) * (self.w - self.m - 8.0)
    }

    pub(crate) fn sy(&self, y: f64) -> f64 {
        8.0 + (1.0 - (y - self.y.0) / (self.y.1 - self.y.0)) * (self.h - self.m - 8.0)
    }

    /// A line through the defined points, broken at undefined ones; a point
    /// alone between two gaps is a dot (a one-point line draws nothing).
    pub(crate) fn line(&self, svg: &mut String, points: impl IntoIterator<Item = (f64, Option<f64>)>, colour: &str) {
        let mut seg: Vec<String> = Vec::new();
        let flush = |seg: &mut Vec<String>, svg: &mut String| {
            if seg.len() == 1 {
                let (cx, cy) = seg[0].split_once(',').unwrap_or(("0", "0"));
                let _ = write!(svg, r#"<circle cx="{cx}" cy="{cy}" r="2.5" fill="{colour}"/>"#);
            } else if seg.len() > 1 {
                let _ = write!(
                    svg,
                    r#"<polyline class="line" fill="none" stroke="{colour}" stroke-width="1.5" points="{}"/>"#,
                    seg.join(" ")
                );
            }
            seg.clear();
        };
        for (x, y) in points {
            match y.filter(|v| v.is_finite()) {
                Some(v) => seg.push(format!("{:.1},{:.1}", self.sx(x), self.sy(v))),
                None => flush(&mut seg, svg),
            }
        }
        flush(&mut seg, svg);
    }

    /// The axes' end labels.
    pub(crate) fn labels(&self, svg: &mut String) {
        let (w, h, m) = (self.w, self.h, self.m);
        let _ = write!(
            svg,
            r#"<text x="2" y="14">{}</text><text x="2" y="{}">{}</text><text x="{m}" y="{}">{}</text><text x="{}" y="{}" text-anchor="end">{}</text>"#,
            short(self.y.1),
            h - m,
            short(self.y.0),
            h - m + 14.0,
            self.x.0,
            w - 8.0,
            h - m + 14.0,
            self.x.1
        );
    }
}

/// A line chart of one series; `None` points are gaps, listed as undefined.
pub(crate) fn chart(title: &str, curve: &[(f64, Option<f64>)]) -> String {
    let defined: Vec<(f64, f64)> =
        curve.iter().filter_map(|(x, y)| y.filter(|v| v.is_finite()).map(|v| (*x, v))).collect();
    let undefined = curve.len() - defined.len();
    let mut svg = String::new();
    let dx: Vec<f64> = defined.iter().map(|p| p.0).collect();
    let dy: Vec<f64> = defined.iter().map(|p| p.1).collect();
    if let Some(plot) = Plot::open(&mut svg, (320.0, 170.0, 36.0), &dx, &dy) {
        plot.line(&mut svg, curve.iter().copied(), "#1565c0");
        plot.labels(&mut svg);
    }
    svg.push_str("</svg>");
    let note = if undefined > 0 { format!(" ({undefined} undefined)") } else { String::new() };
    let _ = write!(svg, "<figcaption>{}{note}</figcaption></figure>", esc(title));
    svg
}

pub(crate) fn short(v: f64) -> String {
    if v != 0.0 && (v.abs() < 1e-2 || v.abs() >= 1e4) {
        format!("{v:.2e}")
    } else {
        format!("{v:.3}")
    }
}
