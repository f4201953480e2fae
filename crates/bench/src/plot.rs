//! The PNG of a run: three panels — drain throughput against N (inferq per gateway, BullMQ,
//! the gateways' own ceilings, and both systems in the split placement), open-loop throughput against offered load, and open-loop
//! latency (p50 and p99, log scale) against offered load. In: a [`Report`]; out: a PNG file.
//! Text is drawn with DejaVu Sans read at run time from the system's fonts folder (no font
//! library at build time); without that font the panels are drawn without text.

use std::path::Path;

use plotters::prelude::*;

use super::procs::GatewayKind;
use super::report::Report;
use super::BenchError;

/// Where Debian's fonts-dejavu-core puts its sans font.
const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Registers the font once; `true` when text can be drawn.
pub(crate) fn font_ready() -> bool {
    static READY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READY.get_or_init(|| match std::fs::read(FONT) {
        // Registered fonts live for the whole process.
        Ok(bytes) => plotters::style::register_font(
            "sans-serif",
            FontStyle::Normal,
            Box::leak(bytes.into_boxed_slice()),
        )
        .is_ok(),
        Err(_) => false,
    })
}

/// An axis number: whole above 10, one decimal below.
fn number(v: &f64) -> String {
    if v.abs() >= 10.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Plot(e.to_string())
}

/// A named series of points in one color.
struct Series {
    name: String,
    color: RGBColor,
    points: Vec<(f64, f64)>,
}

/// Draws `report` into a 1500×520 PNG at `path`.
pub(crate) fn draw(report: &Report, path: &Path) -> Result<(), BenchError> {
    let text = font_ready();
    let root = BitMapBackend::new(path, (1500, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let panels = root.split_evenly((1, 3));

    let mut drains = Vec::new();
    for (kind, color) in [(GatewayKind::Node, BLUE), (GatewayKind::Sim, GREEN)] {
        let points: Vec<(f64, f64)> = report
            .drains
            .iter()
            .filter(|d| d.gateway == kind)
            .map(|d| (d.n as f64, d.requests_per_s))
            .collect();
        if !points.is_empty() {
            drains.push(Series {
                name: format!("inferq via {}", kind.name()),
                color,
                points,
            });
        }
        if let Some(c) = report.gateway_ceilings.iter().find(|c| c.gateway == kind) {
            let ns = report.drains.iter().map(|d| d.n as f64);
            let (lo, hi) = ns.fold((f64::MAX, 0.0f64), |(lo, hi), n| (lo.min(n), hi.max(n)));
            if hi > 0.0 {
                drains.push(Series {
                    name: format!("{} gateway ceiling", kind.name()),
                    color: RGBColor(color.0 / 2 + 120, color.1 / 2 + 120, color.2 / 2 + 120),
                    points: vec![
                        (lo, c.ceiling.requests_per_s),
                        (hi, c.ceiling.requests_per_s),
                    ],
                });
            }
        }
    }
    if !report.bullmq.drains.is_empty() {
        drains.push(Series {
            name: "BullMQ via node".into(),
            color: RED,
            points: report
                .bullmq
                .drains
                .iter()
                .map(|b| (b.n as f64, b.jobs_per_s))
                .collect(),
        });
    }
    // The split placement (the gateway on a core of its own), where it ran.
    let split = &report.split;
    if !split.drains.is_empty() {
        drains.push(Series {
            name: "inferq via node, split".into(),
            color: RGBColor(0, 0, 120),
            points: split
                .drains
                .iter()
                .map(|d| (d.n as f64, d.requests_per_s))
                .collect(),
        });
    }
    if !split.bullmq.drains.is_empty() {
        drains.push(Series {
            name: "BullMQ via node, split".into(),
            color: RGBColor(230, 140, 0),
            points: split
                .bullmq
                .drains
                .iter()
                .map(|b| (b.n as f64, b.jobs_per_s))
                .collect(),
        });
    }
    panel(
        &panels[0],
        text,
        "Drain throughput vs N (concurrency 64)",
        ("requests drained (N)", "requests / s"),
        &drains,
        false,
    )?;

    let offered: Vec<f64> = report
        .open_loop
        .iter()
        .map(|o| o.offered_rps as f64)
        .collect();
    let throughput = vec![
        Series {
            name: "offered".into(),
            color: RGBColor(160, 160, 160),
            points: offered.iter().map(|&r| (r, r)).collect(),
        },
        Series {
            name: "results / s".into(),
            color: BLUE,
            points: report
                .open_loop
                .iter()
                .map(|o| (o.offered_rps as f64, o.throughput_rps))
                .collect(),
        },
    ];
    panel(
        &panels[1],
        text,
        "Open loop: throughput vs offered load",
        ("offered requests / s", "results / s"),
        &throughput,
        false,
    )?;

    let lat = |f: fn(&super::open_loop::OpenLoop) -> f64| -> Vec<(f64, f64)> {
        report
            .open_loop
            .iter()
            .map(|o| (o.offered_rps as f64, f(o)))
            .collect()
    };
    let latency = vec![
        Series {
            name: "enqueue->dispatch p50".into(),
            color: BLUE,
            points: lat(|o| o.enqueue_to_dispatch.p50_ms),
        },
        Series {
            name: "enqueue->dispatch p99".into(),
            color: RGBColor(100, 150, 255),
            points: lat(|o| o.enqueue_to_dispatch.p99_ms),
        },
        Series {
            name: "submit->result p50".into(),
            color: RED,
            points: lat(|o| o.submit_to_result.p50_ms),
        },
        Series {
            name: "submit->result p99".into(),
            color: RGBColor(255, 150, 100),
            points: lat(|o| o.submit_to_result.p99_ms),
        },
    ];
    panel(
        &panels[2],
        text,
        "Open loop: latency vs offered load",
        ("offered requests / s", "milliseconds (log)"),
        &latency,
        true,
    )?;
    root.present().map_err(err)?;
    Ok(())
}

/// One chart of line-and-point series; `log_y` for latencies.
fn panel(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    text: bool,
    title: &str,
    (x_desc, y_desc): (&str, &str),
    series: &[Series],
    log_y: bool,
) -> Result<(), BenchError> {
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let ys = series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let x_max = xs.fold(1.0f64, f64::max) * 1.08;
    let y_max = ys.clone().fold(1.0f64, f64::max) * 1.25;
    let y_min = ys.filter(|&y| y > 0.0).fold(f64::MAX, f64::min).min(1.0) / 2.0;

    let mut builder = ChartBuilder::on(area);
    builder.margin(12);
    if text {
        builder
            .caption(title, ("sans-serif", 18))
            .x_label_area_size(40)
            .y_label_area_size(60);
    }
    let style = |s: &Series| ShapeStyle::from(&s.color).stroke_width(2);
    macro_rules! draw_on {
        ($chart:expr) => {{
            let mut chart = $chart;
            let mut mesh = chart.configure_mesh();
            if text {
                mesh.x_desc(x_desc)
                    .y_desc(y_desc)
                    .label_style(("sans-serif", 13))
                    .x_labels(6)
                    .x_label_formatter(&number)
                    .y_label_formatter(&number);
            } else {
                mesh.x_labels(0).y_labels(0);
            }
            mesh.draw().map_err(err)?;
            for s in series {
                let points: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .map(|&(x, y)| (x, if log_y { y.max(y_min) } else { y }))
                    .collect();
                let drawn = chart
                    .draw_series(LineSeries::new(points.clone(), style(s)))
                    .map_err(err)?;
                if text {
                    let color = s.color;
                    drawn.label(s.name.clone()).legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                }
                chart
                    .draw_series(points.iter().map(|&p| Circle::new(p, 4, s.color.filled())))
                    .map_err(err)?;
            }
            if text {
                chart
                    .configure_series_labels()
                    .position(SeriesLabelPosition::UpperLeft)
                    .label_font(("sans-serif", 13))
                    .background_style(WHITE.mix(0.85))
                    .border_style(BLACK)
                    .draw()
                    .map_err(err)?;
            }
        }};
    }
    if log_y {
        draw_on!(builder
            .build_cartesian_2d(0f64..x_max, (y_min..y_max * 4.0).log_scale())
            .map_err(err)?);
    } else {
        draw_on!(builder
            .build_cartesian_2d(0f64..x_max, 0f64..y_max)
            .map_err(err)?);
    }
    Ok(())
}
