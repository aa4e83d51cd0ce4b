//! Charts, SVG or PNG (plotters; the PNG's text uses an embedded Liberation Sans, so
//! no system font is needed):
//!
//! - [`draw`], for `tollgate simulate`: one panel per policy over time, on one scale —
//!   offered, admitted (when released) and rejected requests in a window sliding over
//!   the run, against the policy's promise for that window (its envelope) and its
//!   long-run rate, the densest window of the policy's own length marked, the mean
//!   wait on a second axis, and the legend beside the plot;
//! - [`draw_samples`], for `tollgate plot`: measured series over time (the soak
//!   script's memory and open files), one panel per unit.

use std::path::Path;

use anyhow::{bail, Context};
use plotters::chart::DualCoordChartContext;
use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::run::{Fate, Summary};

/// The font for PNG text (SIL OFL 1.1, see assets/LiberationSans-OFL.txt).
static FONT: &[u8] = include_bytes!("../assets/LiberationSans-Regular.ttf");

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

/// Draws the chart as an SVG document in memory (the console's try page).
pub fn draw_svg(
    title: &str,
    runs: &[(Summary, Vec<Fate>)],
    duration_us: u64,
) -> anyhow::Result<String> {
    let height = TITLE_HEIGHT + PANEL_HEIGHT * runs.len().max(1) as u32;
    let _ = plotters::style::register_font("sans-serif", FontStyle::Normal, FONT);
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, height)).into_drawing_area();
        draw_on(&root, title, runs, duration_us)?;
        root.present().map_err(err)?;
    }
    Ok(out)
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

/// What every panel of [`draw`] shares: one unit and one scale, so that policies
/// compare at a glance.
struct Plan {
    seconds: f64,
    /// "requests", or "units" when some request costs more than one.
    unit: &'static str,
    /// The distinct keys of the run (a promise is per key; the panels count them all).
    keys: usize,
    ymax: f64,
}

/// One policy's panel: its window, sampling step, counts and promise lines.
struct PanelData<'a> {
    summary: &'a Summary,
    /// The policy's own window (at least 1 ms, at most half the run).
    window: u64,
    /// Samples at most half a window apart, at least 600 and at most 20,000 per run.
    step: u64,
    count: Sliding,
    promise: Option<(f64, f64)>,
}

impl PanelData<'_> {
    /// `n` counted in the window, per second.
    fn rate(&self, n: u64) -> f64 {
        n as f64 * 1e6 / self.window as f64
    }

    /// The time of the `i`th sample, in seconds.
    fn x(&self, i: usize) -> f64 {
        (i as u64 * self.step) as f64 / 1e6
    }
}

/// Counts each run in a window of its policy's own length sliding over the run,
/// sampled finely enough that a burst keeps its height.
fn plan(runs: &[(Summary, Vec<Fate>)], duration_us: u64) -> (Plan, Vec<PanelData<'_>>) {
    let unit = if runs.iter().flat_map(|(_, f)| f).any(|f| f.cost > 1) {
        "units"
    } else {
        "requests"
    };
    let keys = runs.first().map_or(1, |(_, fates)| {
        let keys: std::collections::BTreeSet<_> = fates.iter().map(|f| f.key).collect();
        keys.len().max(1)
    });
    let panels: Vec<PanelData> = runs
        .iter()
        .map(|(summary, fates)| {
            let window = summary.window_us.min(duration_us / 2).max(1_000);
            // A short window's bursts would alias between samples further apart.
            let step = (duration_us / 600)
                .min(window / 2)
                .max(duration_us / 20_000)
                .max(1);
            PanelData {
                summary,
                window,
                step,
                count: Sliding::count(fates, window, step, duration_us),
                promise: promise_lines(&summary.policy, window, keys as f64),
            }
        })
        .collect();
    let ymax = panels
        .iter()
        .map(|p| p.rate(p.count.offered.iter().copied().max().unwrap_or(0)))
        .chain(panels.iter().filter_map(|p| p.promise.map(|p| p.0)))
        .fold(1.0, f64::max)
        * 1.1;
    let seconds = duration_us.max(1) as f64 / 1e6;
    (
        Plan {
            seconds,
            unit,
            keys,
            ymax,
        },
        panels,
    )
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
    let areas = body.split_evenly((runs.len().max(1), 1));
    let (plan, panels) = plan(runs, duration_us);
    for (area, data) in areas.iter().zip(&panels) {
        // The legend stands beside the plot, never over the data.
        let (plot, legend_area) = area.split_horizontally(WIDTH - LEGEND_WIDTH);
        let legend = draw_panel(&plot, &plan, data)?;
        draw_legend(&legend_area, &legend)?;
    }
    Ok(())
}

/// A panel's primary axes: seconds by rate.
type Axes<'a, DB> = ChartContext<'a, DB, Seconds>;
/// A panel with its secondary axis (the mean wait).
type DualAxes<'a, DB> = DualCoordChartContext<'a, DB, Seconds, Seconds>;
/// Seconds along, a figure up.
type Seconds = Cartesian2d<RangedCoordf64, RangedCoordf64>;

/// Draws one policy's panel; returns its legend.
fn draw_panel<DB: DrawingBackend>(
    plot: &DrawingArea<DB, Shift>,
    plan: &Plan,
    data: &PanelData,
) -> anyhow::Result<Vec<(String, Swatch)>>
where
    DB::ErrorType: 'static,
{
    let (seconds, ymax) = (plan.seconds, plan.ymax);
    let count = &data.count;
    let wmax = count.waits.iter().copied().fold(0.0, f64::max);
    let mut chart = ChartBuilder::on(plot)
        .caption(&data.summary.policy, ("sans-serif", 17))
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
            "{}/s over {}",
            plan.unit,
            super::run::human_duration(data.window)
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
    let summary = data.summary;
    let (shade, text) = densest(summary);
    let start = summary.worst_window_start_us as f64 / 1e6;
    let end = (summary.worst_window_start_us + summary.window_us) as f64 / 1e6;
    chart
        .draw_series(std::iter::once(Rectangle::new(
            [(start, 0.0), (end.min(seconds), ymax)],
            shade.filled(),
        )))
        .map_err(err)?;
    let mut legend = vec![(text, Swatch::Area(shade))];
    if let Some(promise) = data.promise {
        draw_promise(&mut chart, plan, promise, &mut legend)?;
    }
    draw_counts(&mut chart, data, wmax, &mut legend)?;
    Ok(legend)
}

/// Draws what the policy promises: its envelope (dashed) and its long-run rate.
fn draw_promise<DB: DrawingBackend>(
    chart: &mut Axes<'_, DB>,
    plan: &Plan,
    (envelope, rate): (f64, f64),
    legend: &mut Vec<(String, Swatch)>,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let seconds = plan.seconds;
    // What the policy promises in the window (its envelope: no window of admissions
    // rises above it), and its rate over the long run: drawn first, so that the
    // admitted line stays visible where it meets them.
    let navy = RGBColor(30, 60, 180);
    for (y, dashed, name) in [
        (envelope, true, "promise: the most it may admit in a window"),
        (rate, false, "its rate over the long run"),
    ] {
        let line = vec![(0.0, y), (seconds, y)];
        if dashed {
            chart
                .draw_series(DashedLineSeries::new(line, 8, 5, navy.stroke_width(2)))
                .map_err(err)?;
        } else {
            chart
                .draw_series(LineSeries::new(line, navy.stroke_width(1)))
                .map_err(err)?;
        }
        let name = match plan.keys {
            1 => name.to_string(),
            n => format!("{name} ({n} keys)"),
        };
        legend.push((name, Swatch::Line(navy, dashed)));
    }
    Ok(())
}

/// Draws the counts: rejected (an area), offered and admitted (lines) and, when
/// any request waited, the mean wait on the right axis.
fn draw_counts<DB: DrawingBackend>(
    chart: &mut DualAxes<'_, DB>,
    data: &PanelData,
    wmax: f64,
    legend: &mut Vec<(String, Swatch)>,
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let count = &data.count;
    let rejected_color = RGBColor(210, 40, 40);
    chart
        .draw_series(AreaSeries::new(
            (count.rejected.iter().enumerate()).map(|(i, &n)| (data.x(i), data.rate(n))),
            0.0,
            rejected_color.mix(0.25),
        ))
        .map_err(err)?;
    legend.push((
        "rejected (by arrival)".into(),
        Swatch::Area(rejected_color.mix(0.25)),
    ));
    let lines: [(&str, &Vec<u64>, RGBColor); 2] = [
        ("offered", &count.offered, RGBColor(140, 140, 140)),
        (
            "admitted (when released)",
            &count.admitted,
            RGBColor(30, 150, 60),
        ),
    ];
    for (name, series, color) in lines {
        chart
            .draw_series(LineSeries::new(
                (series.iter().enumerate()).map(|(i, &n)| (data.x(i), data.rate(n))),
                color.stroke_width(2),
            ))
            .map_err(err)?;
        legend.push((name.into(), Swatch::Line(color, false)));
    }
    if wmax > 0.0 {
        let purple = RGBColor(120, 60, 170);
        chart
            .draw_secondary_series(LineSeries::new(
                (count.waits.iter().enumerate()).map(|(i, &w)| (data.x(i), w)),
                purple.stroke_width(1),
            ))
            .map_err(err)?;
        legend.push((
            "mean wait (ms, right axis)".into(),
            Swatch::Line(purple, false),
        ));
    }
    Ok(())
}

/// How the densest window of the policy's own length is shaded, and its legend:
/// amber for a window algorithm over its limit as it allows (a fixed window's
/// boundary), red only for a broken promise (which the tests say never happens).
fn densest(summary: &Summary) -> (RGBAColor, String) {
    let broken = summary.envelope_ratio.is_some_and(|r| r > 1.0);
    let shade = if broken {
        RED.mix(0.15)
    } else if summary.over_headline {
        RGBColor(240, 170, 30).mix(0.2)
    } else {
        BLUE.mix(0.08)
    };
    let text = format!(
        "densest {} of one key: {}\n({}){}",
        super::run::human_duration(summary.window_us),
        summary.worst_window,
        super::run::bound(summary),
        if broken {
            ": a broken promise"
        } else if summary.over_headline {
            ": over its limit, as it allows"
        } else {
            ""
        }
    );
    (shade, text)
}

/// Width of the legend column beside each panel.
const LEGEND_WIDTH: u32 = 300;

/// How a legend entry is drawn.
enum Swatch {
    Area(RGBAColor),
    /// A line's colour, and whether it is dashed.
    Line(RGBColor, bool),
}

/// The legend, a column of entries beside the plot.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[(String, Swatch)],
) -> anyhow::Result<()>
where
    DB::ErrorType: 'static,
{
    let font = ("sans-serif", 12).into_font().color(&BLACK);
    // An entry's text may run over several lines (split at '\n').
    let mut y = 40;
    for (text, swatch) in entries {
        match swatch {
            Swatch::Area(c) => area
                .draw(&Rectangle::new([(4, y - 6), (22, y + 6)], c.filled()))
                .map_err(err)?,
            Swatch::Line(c, dashed) => {
                let segments: Vec<(i32, i32)> = if *dashed {
                    vec![(4, 10), (14, 22)]
                } else {
                    vec![(4, 22)]
                };
                for (a, b) in segments {
                    area.draw(&PathElement::new(vec![(a, y), (b, y)], c.stroke_width(2)))
                        .map_err(err)?;
                }
            }
        }
        for (i, line) in text.lines().enumerate() {
            area.draw(&Text::new(line, (28, y - 7 + 15 * i as i32), font.clone()))
                .map_err(err)?;
        }
        y += 20 + 15 * (text.lines().count() as i32 - 1);
    }
    Ok(())
}

/// The promise lines of `spec` for a window of `window` us, per second, for `keys`
/// keys: its envelope there, and its long-run rate (the envelope over a thousand
/// windows); `None` when it promises no rate (`concurrency`).
fn promise_lines(spec: &str, window: u64, keys: f64) -> Option<(f64, f64)> {
    let policy = spec.parse::<tollgate::Policy>().ok()?;
    let seconds = window as f64 / 1e6 / keys;
    let envelope = policy.envelope(window)?;
    let long = policy.envelope(window.saturating_mul(1000))?;
    Some((envelope as f64 / seconds, long as f64 / 1000.0 / seconds))
}

/// A run's requests counted in a window sliding over the run, sampled every `step`:
/// offered and rejected at arrival, admitted when released (after any wait), and the
/// mean wait (ms) of the delayed requests in the window.
struct Sliding {
    offered: Vec<u64>,
    admitted: Vec<u64>,
    rejected: Vec<u64>,
    waits: Vec<f64>,
}

/// Running sums over the arrivals in a sliding window.
#[derive(Default)]
struct ArrivalSums {
    offered: u64,
    rejected: u64,
    delayed: u64,
    wait_sum: u64,
}

impl ArrivalSums {
    /// Adds `f` (`sign` 1) as it enters the window, or takes it away (-1) as it
    /// leaves.
    fn account(&mut self, f: &Fate, sign: i64) {
        let add = |sum: &mut u64, n: u64| *sum = sum.wrapping_add_signed(sign * n as i64);
        add(&mut self.offered, f.cost);
        if !f.allowed {
            add(&mut self.rejected, f.cost);
        } else if f.wait > 0 {
            add(&mut self.delayed, 1);
            add(&mut self.wait_sum, f.wait);
        }
    }
}

impl Sliding {
    /// Counts `fates` (their costs) in a window of `window` us ending at every
    /// multiple of `step` up to `duration_us`.
    fn count(fates: &[Fate], window: u64, step: u64, duration_us: u64) -> Sliding {
        let mut arrivals: Vec<&Fate> = fates.iter().collect();
        arrivals.sort_unstable_by_key(|f| f.t);
        let mut released: Vec<(u64, u64)> = fates
            .iter()
            .filter(|f| f.allowed)
            .map(|f| (f.t + f.wait, f.cost))
            .collect();
        released.sort_unstable();
        let samples = (duration_us / step + 1) as usize;
        let mut out = Sliding {
            offered: Vec::with_capacity(samples),
            admitted: Vec::with_capacity(samples),
            rejected: Vec::with_capacity(samples),
            waits: Vec::with_capacity(samples),
        };
        // Two cursors per series: the window is (x - window, x]; running sums of what
        // entered less what left.
        let (mut a_lo, mut a_hi, mut r_lo, mut r_hi) = (0, 0, 0, 0);
        let mut admitted = 0u64;
        let mut sums = ArrivalSums::default();
        for i in 0..samples {
            let x = i as u64 * step;
            while a_hi < arrivals.len() && arrivals[a_hi].t <= x {
                sums.account(arrivals[a_hi], 1);
                a_hi += 1;
            }
            while a_lo < a_hi && arrivals[a_lo].t + window <= x {
                sums.account(arrivals[a_lo], -1);
                a_lo += 1;
            }
            while r_hi < released.len() && released[r_hi].0 <= x {
                admitted += released[r_hi].1;
                r_hi += 1;
            }
            while r_lo < r_hi && released[r_lo].0 + window <= x {
                admitted -= released[r_lo].1;
                r_lo += 1;
            }
            out.offered.push(sums.offered);
            out.rejected.push(sums.rejected);
            out.admitted.push(admitted);
            out.waits.push(if sums.delayed == 0 {
                0.0
            } else {
                sums.wait_sum as f64 / sums.delayed as f64 / 1000.0
            });
        }
        out
    }
}

fn err<E: std::error::Error + Send + Sync + 'static>(e: DrawingAreaErrorKind<E>) -> anyhow::Error {
    anyhow::anyhow!("drawing the chart: {e}")
}
