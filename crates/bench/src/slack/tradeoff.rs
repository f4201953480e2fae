//! The trade-off between harvest and interactive latency: each scenario becomes one point
//! (harvest over every phase, the worst phase's p99 TTFT ratio to interactive alone), grouped
//! into families (static sizes, static occupancy thresholds, `slack` tunings), so a sweep reads
//! as a curve. Out: a table with, for each `slack` point, the best harvest a static point
//! reaches at no worse latency, and `slack-tradeoff.png` (one panel per flow-control setting).

use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde::Serialize;

use super::plot::err;
use super::report::Row;
use crate::BenchError;

/// One scenario on the trade-off plane.
#[derive(Debug, Clone, Serialize)]
pub struct Point {
    pub scenario: String,
    pub router: super::Router,
    /// The curve it belongs to.
    pub family: &'static str,
    pub harvest: f64,
    /// The worst of the phases' p99 TTFT ratios to interactive alone.
    pub worst_ttft_p99_ratio: f64,
}

/// The family of a scenario, by its name.
fn family(scenario: &str) -> &'static str {
    if scenario.starts_with("static size") {
        "static size"
    } else if scenario.starts_with("static occupancy") {
        "static occupancy"
    } else if scenario.starts_with("slack + signal_url") {
        "slack + signal_url"
    } else if scenario.starts_with("static") {
        "static (endpoint-scrape)"
    } else {
        match scenario {
            "aimd" => "aimd",
            "slack alone" => "slack alone",
            "ungated" => "ungated",
            _ => "other",
        }
    }
}

/// Every scenario with batch work, as a point.
pub fn points(rows: &[Row]) -> Vec<Point> {
    let mut out = Vec::new();
    for all in rows.iter().filter(|r| r.phase == "all") {
        let Some(harvest) = all.harvest else { continue };
        let worst = rows
            .iter()
            .filter(|r| r.scenario == all.scenario && r.router == all.router)
            .filter(|r| r.phase != "all")
            .filter_map(|r| r.ttft_p99_ratio)
            .fold(0.0, f64::max);
        out.push(Point {
            scenario: all.scenario.clone(),
            router: all.router,
            family: family(&all.scenario),
            harvest,
            worst_ttft_p99_ratio: worst,
        });
    }
    out
}

/// The best harvest of a static point (size or occupancy) whose worst ratio is at most `ratio`.
fn best_static_within(points: &[Point], fc: super::Router, ratio: f64) -> Option<&Point> {
    points
        .iter()
        .filter(|p| p.router == fc)
        .filter(|p| matches!(p.family, "static size" | "static occupancy"))
        .filter(|p| p.worst_ttft_p99_ratio <= ratio)
        .max_by(|a, b| a.harvest.total_cmp(&b.harvest))
}

/// The table: every point, then each adaptive point against the static curve.
pub fn table(points: &[Point]) -> String {
    let mut out =
        String::from("\ntrade-off (harvest over every phase; worst phase's p99 TTFT ×alone):\n");
    for fc in super::Router::ALL {
        let here: Vec<&Point> = points.iter().filter(|p| p.router == fc).collect();
        if here.is_empty() {
            continue;
        }
        let _ = writeln!(out, "  flow control {}", fc.label());
        for p in &here {
            let _ = writeln!(
                out,
                "    {:<40} harvest {:.2}  p99 TTFT ×{:.2}",
                p.scenario, p.harvest, p.worst_ttft_p99_ratio
            );
        }
        for p in here
            .iter()
            .filter(|p| matches!(p.family, "slack + signal_url" | "slack alone"))
        {
            let verdict = match best_static_within(points, fc, p.worst_ttft_p99_ratio) {
                Some(s) => format!(
                    "best static at no worse latency: {} (harvest {:.2}, ×{:.2}) → slack {:+.2}",
                    s.scenario,
                    s.harvest,
                    s.worst_ttft_p99_ratio,
                    p.harvest - s.harvest
                ),
                None => "no static point in the sweep is that gentle".to_owned(),
            };
            let _ = writeln!(out, "    {:<40} {verdict}", p.scenario);
        }
    }
    out
}

const FAMILIES: [(&str, RGBColor); 7] = [
    ("static size", RGBColor(127, 127, 127)),
    ("static occupancy", RGBColor(140, 86, 75)),
    ("static (endpoint-scrape)", RGBColor(255, 127, 14)),
    ("aimd", RGBColor(148, 103, 189)),
    ("slack + signal_url", RGBColor(31, 119, 180)),
    ("slack alone", RGBColor(44, 160, 44)),
    ("ungated", RGBColor(214, 39, 40)),
];

/// Draws harvest against the worst p99 TTFT ratio (log), a curve per family, the targets'
/// corners marked.
pub fn draw(points: &[Point], path: &Path) -> Result<(), BenchError> {
    let text = crate::plot::font_ready();
    let settings: Vec<super::Router> = super::Router::ALL
        .into_iter()
        .filter(|fc| points.iter().any(|p| p.router == *fc))
        .collect();
    let root =
        BitMapBackend::new(path, (900 * settings.len().max(1) as u32, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((1, settings.len().max(1)));
    let right = points
        .iter()
        .map(|p| p.worst_ttft_p99_ratio)
        .fold(4.0, f64::max)
        * 1.3;
    for (area, fc) in panels.iter().zip(&settings) {
        let mut builder = ChartBuilder::on(area);
        builder
            .margin(14)
            .x_label_area_size(40)
            .y_label_area_size(50);
        if text {
            builder.caption(
                format!("harvest vs worst-phase p99 TTFT, {}", fc.label(),),
                ("sans-serif", 17),
            );
        }
        let mut chart = builder
            .build_cartesian_2d((0.8..right).log_scale(), 0.0..1.1)
            .map_err(err)?;
        let mut mesh = chart.configure_mesh();
        if text {
            mesh.x_desc("interactive p99 TTFT, × alone (log)")
                .y_desc("harvest (batch throughput / ungated)");
        } else {
            mesh.disable_axes().disable_mesh();
        }
        mesh.draw().map_err(err)?;
        // The targets: harvest 0.9 within 2× (with a signal; 1.5× with eviction), 0.8 within
        // 3× (alone).
        for (x, y) in [(fc.slack_target_ratio(), 0.9), (3.0, 0.8)] {
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(0.8, y), (x, 1.1)],
                    RGBColor(200, 235, 200).mix(0.35).filled(),
                )))
                .map_err(err)?;
        }
        for (family, color) in FAMILIES {
            let mut mine: Vec<&Point> = points
                .iter()
                .filter(|p| p.router == *fc && p.family == family)
                .collect();
            if mine.is_empty() {
                continue;
            }
            mine.sort_by(|a, b| a.worst_ttft_p99_ratio.total_cmp(&b.worst_ttft_p99_ratio));
            let xy: Vec<(f64, f64)> = mine
                .iter()
                .map(|p| (p.worst_ttft_p99_ratio.max(0.8), p.harvest))
                .collect();
            chart
                .draw_series(LineSeries::new(xy.clone(), color.stroke_width(2)))
                .map_err(err)?;
            let dots = chart
                .draw_series(
                    xy.iter()
                        .map(|&(x, y)| Circle::new((x, y), 5, color.filled())),
                )
                .map_err(err)?;
            if text {
                dots.label(family)
                    .legend(move |(x, y)| Circle::new((x + 8, y), 5, color.filled()));
                for (p, (x, y)) in mine.iter().zip(&xy) {
                    if !SWEPT.contains(&p.family) {
                        continue;
                    }
                    let tag = match p.scenario[p.family.len()..].trim_start_matches([',', ' ']) {
                        "" => "default".to_owned(),
                        rest => rest.to_owned(),
                    };
                    chart
                        .draw_series(std::iter::once(Text::new(
                            tag,
                            (*x * 1.04, *y + 0.02),
                            ("sans-serif", 11),
                        )))
                        .map_err(err)?;
                }
            }
        }
        if text {
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .label_font(("sans-serif", 12))
                .draw()
                .map_err(err)?;
        }
    }
    root.present().map_err(err)
}

/// Families whose points are labelled with the swept value.
const SWEPT: [&str; 3] = ["static size", "static occupancy", "slack + signal_url"];
