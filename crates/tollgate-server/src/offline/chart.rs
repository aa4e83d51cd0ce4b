//! Charts, SVG or PNG (plotters; the PNG's text uses an embedded Liberation Sans, so
//! no system font is needed):
//!
//! - [`draw`], for `tollgate simulate`: one panel per policy over time — offered,
//!   admitted, rejected and delayed requests per time bucket, the limit line, the
//!   worst window marked, and the mean wait on a second axis;
//! - [`draw_samples`], for `tollgate plot`: measured series over time (the soak
//!   script's memory and open files), one panel per unit.

use std::path::Path;

use anyhow::{bail, Context};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::offline::run::{Fate, Summary};

/// The font for PNG text (SIL OFL 1.1, see assets/LiberationSans-OFL.txt).
static FONT: &[u8] = include_bytes!("../../assets/LiberationSans-Regular.ttf");

/// Draws `paint(root, args...)` on an SVG or PNG backend, chosen by `path`'s
/// extension, `WIDTH` x `height` pixels.
macro_rules! render {
    ($path:expr, $height:expr, $paint:ident ( $($arg:expr),* )) => {{
        let path: &Path = $path;
        // Both backends measure text with it. Registering twice is harmless.
        let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
        match path.extension().and_then(|e| e.to_str()) {
            Some("svg") => {
                let root = SVGBackend::new(path, (WIDTH, $height)).into_drawing_area();
                $paint(&root, $($arg),*)?;
                root.present()
                    .with_context(|| format!("cannot write {}", path.display()))?;
            }
            Some("png") => {
                let root = BitMapBackend::new(path, (WIDTH, $height)).into_drawing_area();
                $paint(&root, $($arg),*)?;
                root.present()
                    .with_context(|| format!("cannot write {}", path.display()))?;
            }
            _ => bail!("--out must end in .svg or .png: {}", path.display()),
        }
        Ok(())
    }};
}

/// Chart width in pixels; each panel is `PANEL_HEIGHT` tall.
pub const WIDTH: u32 = 1200;
/// Height of one policy's panel.
pub const PANEL_HEIGHT: u32 = 300;
/// Height of the title band.
pub const TITLE_HEIGHT: u32 = 50;

/// Draws the chart to `path` (`.svg` or `.png`).
pub fn draw(
    path: &Path,
    title: &str,
    runs: &[(Summary, Vec<Fate>)],
    duration_us: u64,
) -> anyhow::Result<()> {
    let height = TITLE_HEIGHT + PANEL_HEIGHT * runs.len().max(1) as u32;
    render!(path, height, draw_on(title, runs, duration_us))
}

/// A named series of `(x, y)` points.
pub type Series = (String, Vec<(f64, f64)>);

/// One panel of [`draw_samples`]: a y-axis description and its series.
#[derive(Debug)]
pub struct Panel {
    /// What the y axis measures, with its unit.
    pub y_desc: String,
    /// The series drawn in it.
    pub series: Vec<Series>,
}

/// Draws measured series over time to `path` (`.svg` or `.png`), one panel each.
pub fn draw_samples(
    path: &Path,
    title: &str,
    x_desc: &str,
    panels: &[Panel],
) -> anyhow::Result<()> {
    let height = TITLE_HEIGHT + PANEL_HEIGHT * panels.len().max(1) as u32;
    render!(path, height, draw_samples_on(title, x_desc, panels))
}

fn draw_samples_on<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    x_desc: &str,
    panels: &[Panel],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    const COLORS: [RGBColor; 8] = [
        RGBColor(30, 110, 200),
        RGBColor(210, 90, 30),
        RGBColor(30, 150, 60),
        RGBColor(120, 60, 170),
        RGBColor(200, 40, 110),
        RGBColor(110, 110, 110),
        RGBColor(180, 150, 20),
        RGBColor(20, 160, 170),
    ];
    root.fill(&WHITE).map_err(err)?;
    let (head, body) = root.split_vertically(TITLE_HEIGHT);
    head.titled(title, ("sans-serif", 22)).map_err(err)?;
    let areas = body.split_evenly((panels.len().max(1), 1));
    for (area, panel) in areas.iter().zip(panels) {
        let points = panel.series.iter().flat_map(|(_, p)| p.iter());
        let xmax = points.clone().map(|p| p.0).fold(1.0, f64::max);
        // From zero (or below it, for a debt), so that a flat line looks flat, with
        // headroom for the legend.
        let ymin = points.clone().map(|p| p.1).fold(0.0, f64::min) * 1.1;
        let ymax = points.map(|p| p.1).fold(1.0, f64::max) * 1.3;
        let mut chart = ChartBuilder::on(area)
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(70)
            .build_cartesian_2d(0f64..xmax, ymin..ymax)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_desc)
            .y_desc(&panel.y_desc)
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        // Below zero means something (a debt): mark the zero line.
        if ymin < 0.0 {
            chart
                .draw_series(LineSeries::new(
                    [(0.0, 0.0), (xmax, 0.0)],
                    BLACK.mix(0.6).stroke_width(1),
                ))
                .map_err(err)?;
        }
        // A series keeps its colour across panels: it is picked by position, and an
        // empty series (nothing to draw in this panel) keeps its place.
        for ((name, data), color) in panel.series.iter().zip(COLORS.iter().cycle()) {
            if data.is_empty() {
                continue;
            }
            chart
                .draw_series(LineSeries::new(data.iter().copied(), color.stroke_width(2)))
                .map_err(err)?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 15, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 12))
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

fn draw_on<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    runs: &[(Summary, Vec<Fate>)],
    duration_us: u64,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(err)?;
    let (head, body) = root.split_vertically(TITLE_HEIGHT);
    head.titled(title, ("sans-serif", 22)).map_err(err)?;
    let panels = body.split_evenly((runs.len().max(1), 1));
    let seconds = duration_us.max(1) as f64 / 1e6;
    let bucket_us = bucket_for(duration_us);
    for (panel, (summary, fates)) in panels.iter().zip(runs) {
        let Buckets {
            offered,
            admitted,
            rejected,
            delayed,
            waits,
        } = Buckets::count(fates, bucket_us, duration_us);
        // What the policy promises in one bucket's length (its envelope): no bucket
        // of admissions can rise above it.
        let promise = summary
            .policy
            .parse::<tollgate::Policy>()
            .ok()
            .and_then(|p| p.envelope(bucket_us));
        let limit_line = promise.map_or(0.0, |e| e as f64);
        let ymax = (offered.iter().copied().max().unwrap_or(1) as f64).max(limit_line) * 1.15 + 1.0;
        let wmax = waits.iter().copied().fold(0.0, f64::max);
        let x = |b: usize| b as f64 * bucket_us as f64 / 1e6;
        let mut chart = ChartBuilder::on(panel)
            .caption(&summary.policy, ("sans-serif", 17))
            .margin(10)
            .x_label_area_size(35)
            .y_label_area_size(60)
            .right_y_label_area_size(if wmax > 0.0 { 60 } else { 10 })
            .build_cartesian_2d(0f64..seconds, 0f64..ymax)
            .map_err(err)?
            .set_secondary_coord(0f64..seconds, 0f64..(wmax * 1.15).max(1.0));
        chart
            .configure_mesh()
            .x_desc("time (s)")
            .y_desc(format!(
                "requests per {}",
                tollgate::policy::fmt_duration(bucket_us)
            ))
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 14))
            .draw()
            .map_err(err)?;
        if wmax > 0.0 {
            chart
                .configure_secondary_axes()
                .y_desc("mean wait (ms)")
                .label_style(("sans-serif", 13))
                .axis_desc_style(("sans-serif", 14))
                .draw()
                .map_err(err)?;
        }
        // The worst window, shaded.
        let (ws, we) = (
            summary.worst_window_start_us as f64 / 1e6,
            (summary.worst_window_start_us + summary.window_us) as f64 / 1e6,
        );
        // Red only for a broken promise (which never happens); amber for a burst over
        // the headline limit that the policy allows (a fixed window's boundary).
        let broken = summary.envelope_ratio.is_some_and(|r| r > 1.0);
        let shade = if broken {
            RED.mix(0.15)
        } else if summary.over_headline {
            RGBColor(240, 170, 30).mix(0.18)
        } else {
            BLUE.mix(0.08)
        };
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(ws, 0.0), (we.min(seconds), ymax)],
                shade.filled(),
            )))
            .map_err(err)?
            .label(format!(
                "densest {}: {} ({})",
                tollgate::policy::fmt_duration(summary.window_us),
                summary.worst_window,
                super::run::bound(summary)
            ))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 15, y + 5)], shade.filled()));
        let series: [(&str, &Vec<u64>, RGBColor); 4] = [
            ("offered", &offered, RGBColor(140, 140, 140)),
            ("admitted", &admitted, RGBColor(30, 150, 60)),
            ("rejected", &rejected, RGBColor(210, 40, 40)),
            ("delayed", &delayed, RGBColor(230, 140, 20)),
        ];
        for (name, data, color) in series {
            if name == "delayed" && data.iter().all(|&n| n == 0) {
                continue;
            }
            chart
                .draw_series(LineSeries::new(
                    data.iter().enumerate().map(|(b, &n)| (x(b), n as f64)),
                    color.stroke_width(2),
                ))
                .map_err(err)?
                .label(name)
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 15, y)], color.stroke_width(2))
                });
        }
        // A concurrency limit bounds requests in flight, not per time: no line.
        chart
            .draw_series(DashedLineSeries::new(
                if promise.is_some() {
                    vec![(0.0, limit_line), (seconds, limit_line)]
                } else {
                    vec![]
                },
                6,
                4,
                BLUE.stroke_width(1),
            ))
            .map_err(err)?
            .label("promise per bucket (the most it may admit)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], BLUE));
        if wmax > 0.0 {
            chart
                .draw_secondary_series(LineSeries::new(
                    waits.iter().enumerate().map(|(b, &w)| (x(b), w)),
                    RGBColor(120, 60, 170).stroke_width(1),
                ))
                .map_err(err)?
                .label("mean wait (ms, right axis)")
                .legend(|(x, y)| {
                    PathElement::new(vec![(x, y), (x + 15, y)], RGBColor(120, 60, 170))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK.mix(0.3))
            .label_font(("sans-serif", 12))
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

/// A round time bucket for a run of `duration_us`: 1, 2 or 5 times a power of ten, in
/// us, near a 120th of the run (at least 1 ms).
fn bucket_for(duration_us: u64) -> u64 {
    let target = (duration_us / 120).max(1_000);
    (0..12)
        .flat_map(|e| [1u64, 2, 5].map(|m| m * 10u64.pow(e)))
        .find(|&b| b >= target)
        .unwrap_or(target)
}

/// A run's requests counted per time bucket: offered and rejected at arrival,
/// admitted when released (after any wait), delayed with their mean wait (ms).
struct Buckets {
    offered: Vec<u64>,
    admitted: Vec<u64>,
    rejected: Vec<u64>,
    delayed: Vec<u64>,
    waits: Vec<f64>,
}

impl Buckets {
    fn count(fates: &[Fate], bucket_us: u64, duration_us: u64) -> Buckets {
        let n = (duration_us / bucket_us + 1) as usize;
        let at = |t: u64| ((t / bucket_us) as usize).min(n - 1);
        let (mut offered, mut admitted, mut rejected) = (vec![0; n], vec![0; n], vec![0; n]);
        let (mut delayed, mut wait_sum) = (vec![0u64; n], vec![0u64; n]);
        for f in fates {
            let b = at(f.t);
            offered[b] += 1;
            if !f.allowed {
                rejected[b] += 1;
                continue;
            }
            admitted[at(f.t + f.wait)] += 1;
            if f.wait > 0 {
                delayed[b] += 1;
                wait_sum[b] += f.wait;
            }
        }
        let waits = (wait_sum.iter().zip(&delayed))
            .map(|(&w, &k)| {
                if k == 0 {
                    0.0
                } else {
                    w as f64 / k as f64 / 1000.0
                }
            })
            .collect();
        Buckets {
            offered,
            admitted,
            rejected,
            delayed,
            waits,
        }
    }
}

fn err<E: std::error::Error + Send + Sync + 'static>(e: DrawingAreaErrorKind<E>) -> anyhow::Error {
    anyhow::anyhow!("drawing the chart: {e}")
}
