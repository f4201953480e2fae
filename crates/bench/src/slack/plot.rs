//! The slack benchmark's picture: for each flow-control setting a row of three panels over the
//! run's time (the six scenarios; a sweep's points are on the trade-off picture) — interactive p99 TTFT (log scale, per 5 s of sends), batch throughput (results
//! per second, per 5 s), and the gate's window — one line per scenario, the phases shaded.
//! In: a [`SlackReport`]; out: a PNG.

use std::path::Path;

use plotters::coord::ranged1d::ValueFormatter;
use plotters::prelude::*;

use super::report::SlackReport;
use super::scenario::Run;
use crate::BenchError;

/// Seconds of one point of the curves.
const BUCKET: f64 = 5.0;

const COLORS: [RGBColor; 8] = [
    RGBColor(0, 0, 0),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(140, 86, 75),
    RGBColor(127, 127, 127),
];

pub(super) fn err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Plot(e.to_string())
}

/// p99 TTFT of the interactive requests sent in each bucket.
fn ttft_curve(run: &Run) -> Vec<(f64, f64)> {
    let end = run
        .samples
        .iter()
        .map(|s| s.sent_at_ms / 1000.0)
        .fold(0.0, f64::max);
    let mut points = Vec::new();
    let mut t = 0.0;
    while t < end {
        let mut v: Vec<f64> = run
            .samples
            .iter()
            .filter(|s| (t..t + BUCKET).contains(&(s.sent_at_ms / 1000.0)))
            .filter_map(|s| s.ttft_ms)
            .collect();
        if !v.is_empty() {
            v.sort_by(f64::total_cmp);
            let rank = ((0.99 * v.len() as f64).ceil() as usize).clamp(1, v.len());
            points.push((t + BUCKET / 2.0, v[rank - 1].max(1.0)));
        }
        t += BUCKET;
    }
    points
}

/// Batch results per second in each bucket.
fn throughput_curve(run: &Run) -> Vec<(f64, f64)> {
    let mut points = Vec::new();
    let mut start = 0usize;
    for (i, (t, n, _)) in run.timeline.iter().enumerate() {
        let (t0, n0, _) = run.timeline[start];
        if t - t0 >= BUCKET {
            points.push(((t + t0) / 2.0, (n - n0) as f64 / (t - t0)));
            start = i;
        }
    }
    points
}

fn window_curve(run: &Run) -> Vec<(f64, f64)> {
    run.timeline
        .iter()
        .filter_map(|(t, _, w)| w.map(|w| (*t, w)))
        .collect()
}

/// A panel: its title, the curve of one run, and whether its y axis is logarithmic.
type Panel = (&'static str, fn(&Run) -> Vec<(f64, f64)>, bool);

/// Draws the report into a PNG at `path`.
pub(super) fn draw(report: &SlackReport, path: &Path) -> Result<(), BenchError> {
    let text = crate::plot::font_ready();
    let settings: Vec<super::Router> = super::Router::ALL
        .into_iter()
        .filter(|fc| report.runs.iter().any(|r| r.router == *fc))
        .collect();
    let root =
        BitMapBackend::new(path, (1800, 480 * settings.len().max(1) as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let rows = root.split_evenly((settings.len().max(1), 3));
    let end = report.phases.last().map_or(60.0, |p| p.2);
    for (row, fc) in settings.iter().enumerate() {
        let runs: Vec<&Run> = report
            .runs
            .iter()
            .filter(|r| r.router == *fc && super::Gate::in_set(&r.scenario))
            .collect();
        let fc_name = fc.label();
        let panels: [Panel; 3] = [
            ("interactive p99 TTFT (ms, log)", ttft_curve, true),
            ("batch results per second", throughput_curve, false),
            ("gate window (requests)", window_curve, false),
        ];
        for (col, (title, curve, log)) in panels.into_iter().enumerate() {
            let area = &rows[row * 3 + col];
            let curves: Vec<(String, Vec<(f64, f64)>)> = runs
                .iter()
                .map(|r| (r.scenario.clone(), curve(r)))
                .collect();
            let top = curves
                .iter()
                .flat_map(|(_, p)| p.iter().map(|(_, y)| *y))
                .fold(1.0, f64::max)
                * 1.15;
            let mut builder = ChartBuilder::on(area);
            builder
                .margin(12)
                .x_label_area_size(30)
                .y_label_area_size(55);
            if text {
                builder.caption(format!("{title}, {fc_name}"), ("sans-serif", 17));
            }
            if log {
                let mut chart = builder
                    .build_cartesian_2d(0.0..end, (1.0..top).log_scale())
                    .map_err(err)?;
                shade_and_draw(&mut chart, report, &curves, text, 1.0, top)?;
            } else {
                let mut chart = builder
                    .build_cartesian_2d(0.0..end, 0.0..top)
                    .map_err(err)?;
                shade_and_draw(&mut chart, report, &curves, text, 0.0, top)?;
            }
        }
    }
    root.present().map_err(err)
}

/// Shades the burst phases, draws each curve, and the legend.
fn shade_and_draw<'a, X, Y>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, Cartesian2d<X, Y>>,
    report: &SlackReport,
    curves: &[(String, Vec<(f64, f64)>)],
    text: bool,
    bottom: f64,
    top: f64,
) -> Result<(), BenchError>
where
    X: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let mut mesh = chart.configure_mesh();
    if !text {
        mesh.disable_axes().disable_mesh();
    }
    mesh.draw().map_err(err)?;
    for (name, a, b) in &report.phases {
        if name.starts_with("burst") || name == "warmup" {
            let shade = if name == "warmup" {
                RGBColor(235, 235, 235)
            } else {
                RGBColor(255, 236, 214)
            };
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(*a, bottom), (*b, top)],
                    shade.filled(),
                )))
                .map_err(err)?;
        }
    }
    for (i, (name, points)) in curves.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let series = chart
            .draw_series(LineSeries::new(
                points.iter().copied(),
                color.stroke_width(2),
            ))
            .map_err(err)?;
        if text {
            series.label(name.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
        }
    }
    if text {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .label_font(("sans-serif", 12))
            .draw()
            .map_err(err)?;
    }
    Ok(())
}
