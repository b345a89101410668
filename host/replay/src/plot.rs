//! PNG charts for the replay report: cumulative cost per strategy, the distribution of time from
//! Pod creation to Running, and the market trace (prices and free capacity).
//!
//! Drawing only. Callers hand in series already computed from the ledgers and the trace; this
//! module does not read ledgers, compute costs or decide what the report contains. Text renders
//! through `ab_glyph` from a TrueType font read at runtime (DejaVu Sans, or the file named by
//! `NEOCLOUD_REPLAY_FONT`), so no fontconfig or freetype is needed. Output is deterministic: a
//! fixed palette, and colours follow the order of the series handed in.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context as _, bail};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

/// Environment variable naming a TrueType font file to use instead of [`DEFAULT_FONT`].
const FONT_ENV: &str = "NEOCLOUD_REPLAY_FONT";

/// The font used when [`FONT_ENV`] is unset.
const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// The Debian package that installs [`DEFAULT_FONT`].
const FONT_PACKAGE: &str = "fonts-dejavu-core";

/// The font family every label asks for; [`ensure_font`] registers it.
const FAMILY: &str = "sans-serif";

/// Size of the cost and time-to-Running charts, in pixels.
const SIZE: (u32, u32) = (1200, 700);

/// Size of the two-panel market chart, in pixels.
const MARKET_SIZE: (u32, u32) = (1200, 900);

/// Series colours, in order (Tableau 10 and two more); reused cyclically past twelve series.
const PALETTE: [RGBColor; 12] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
    RGBColor(0, 0, 128),
    RGBColor(128, 0, 0),
];

/// A labelled line, already in data coordinates.
type Line = (String, Vec<(f64, f64)>);

/// Draws one line per strategy of cumulative USD billed against the hour index, to a 1200x700
/// PNG at `path` (which must end in `.png`).
///
/// `series` pairs a strategy's name with its cumulative cost at hours 0, 1, 2, ...; non-finite
/// values are skipped. An empty list, or empty series, draws empty axes.
pub fn cumulative_cost(path: &Path, series: &[(String, Vec<f64>)]) -> anyhow::Result<()> {
    let lines: Vec<Line> = series
        .iter()
        .map(|(name, costs)| (name.clone(), finite(costs.iter().enumerate().map(to_point))))
        .collect();
    let x = padded(0.0, max_of(lines.iter().flat_map(|(_, p)| p).map(|p| p.0)));
    let y = padded(0.0, max_of(lines.iter().flat_map(|(_, p)| p).map(|p| p.1)));
    let chart = Chart {
        title: "Cumulative cost by strategy",
        x_desc: "hours from the start of the trace",
        y_desc: "USD billed",
        legend: SeriesLabelPosition::UpperLeft,
        legend_size: 15,
    };
    draw_single(path, &chart, x, y, &lines)
}

/// Draws each strategy's empirical CDF of minutes from Pod creation to Running, to a 1200x700
/// PNG at `path` (which must end in `.png`).
///
/// `series` pairs a strategy's name with its jobs' minutes, in any order; negative and
/// non-finite values are skipped, and a strategy with no jobs appears only in the legend. The x
/// axis ends at the largest 99th percentile across strategies, and at no less than one minute.
pub fn time_to_running(path: &Path, series: &[(String, Vec<f64>)]) -> anyhow::Result<()> {
    let sorted: Vec<(String, Vec<f64>)> = series
        .iter()
        .map(|(name, minutes)| (name.clone(), sorted_minutes(minutes)))
        .collect();
    let x_max = sorted
        .iter()
        .filter_map(|(_, minutes)| percentile(minutes, 0.99))
        .fold(1.0, f64::max);
    let lines: Vec<Line> = sorted
        .iter()
        .map(|(name, minutes)| (cdf_label(name, minutes.len()), ecdf(minutes, x_max)))
        .collect();
    let chart = Chart {
        title: "Time from Pod creation to Running",
        x_desc: "minutes from Pod creation",
        y_desc: "share of jobs Running",
        legend: SeriesLabelPosition::LowerRight,
        legend_size: 15,
    };
    // A little room above 1 keeps the finished lines off the frame.
    draw_single(path, &chart, 0.0..x_max, 0.0..1.02, &lines)
}

/// Draws the market trace to a 1200x900 PNG at `path` (which must end in `.png`): price lines
/// (USD per hour) in the top panel, free capacity as step lines (units free) in the bottom
/// panel, both against hours on a shared x axis.
///
/// Points are `(hour, value)`, sorted here by hour; non-finite points are skipped and series
/// with no points are left out, legend included. A label that appears in both lists gets the
/// same colour in both panels.
pub fn market(
    path: &Path,
    lines: &[(String, Vec<(f64, f64)>)],
    capacity: &[(String, Vec<(f64, f64)>)],
) -> anyhow::Result<()> {
    let prices = cleaned(lines, false);
    let free = cleaned(capacity, true);
    let all = || prices.iter().chain(&free).flat_map(|(_, p)| p);
    let x = padded(
        min_of(all().map(|p| p.0)).unwrap_or(0.0),
        max_of(all().map(|p| p.0)),
    );
    let names: Vec<&str> = prices
        .iter()
        .chain(&free)
        .map(|(n, _)| n.as_str())
        .collect();
    ensure_font()?;
    let root = backend(path, MARKET_SIZE)?;
    draw_market(&root, x, &names, &prices, &free)
        .and_then(|()| root.present().map_err(anyhow::Error::from))
        .with_context(|| format!("failed to draw the market chart to {}", path.display()))
}

/// What differs between the single-panel charts.
struct Chart {
    title: &'static str,
    x_desc: &'static str,
    y_desc: &'static str,
    legend: SeriesLabelPosition,
    legend_size: u32,
}

/// Registers the font once per process; later calls return at once.
///
/// Reads [`FONT_ENV`] (or [`DEFAULT_FONT`]) on the first successful call only; a failed call is
/// retried on the next one, so fixing the path does not need a restart.
fn ensure_font() -> anyhow::Result<()> {
    static BYTES: OnceLock<Vec<u8>> = OnceLock::new();
    static REGISTERED: OnceLock<()> = OnceLock::new();
    if REGISTERED.get().is_some() {
        return Ok(());
    }
    let path =
        std::env::var_os(FONT_ENV).map_or_else(|| PathBuf::from(DEFAULT_FONT), PathBuf::from);
    let bytes: &'static [u8] = match BYTES.get() {
        Some(bytes) => bytes,
        None => {
            let loaded = load_font(&path)?;
            BYTES.get_or_init(|| loaded)
        }
    };
    // Two threads racing here both register the same bytes, which is harmless.
    register_font(FAMILY, FontStyle::Normal, bytes).map_err(|_| {
        anyhow::anyhow!(
            "font file {} is not a TrueType or OpenType font",
            path.display()
        )
    })?;
    let _ = REGISTERED.set(());
    Ok(())
}

/// Reads a font file, with an error that names the path and the package that provides the
/// default font.
fn load_font(path: &Path) -> anyhow::Result<Vec<u8>> {
    std::fs::read(path).with_context(|| {
        format!(
            "failed to read chart font {}: install the Debian package {FONT_PACKAGE} or set \
             {FONT_ENV} to a TrueType font file",
            path.display()
        )
    })
}

/// A bitmap backend on `path`, after checking the extension the PNG encoder needs.
fn backend(path: &Path, size: (u32, u32)) -> anyhow::Result<DrawingArea<BitMapBackend<'_>, Shift>> {
    let is_png = path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("png"));
    if !is_png {
        bail!("chart path {} must end in .png", path.display());
    }
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE)?;
    Ok(root)
}

/// Draws a single-panel line chart and writes it.
fn draw_single(
    path: &Path,
    chart: &Chart,
    x: Range<f64>,
    y: Range<f64>,
    lines: &[Line],
) -> anyhow::Result<()> {
    ensure_font()?;
    let root = backend(path, SIZE)?;
    let names: Vec<&str> = lines.iter().map(|(n, _)| n.as_str()).collect();
    draw_panel(&root, chart, x, y, &names, lines)
        .and_then(|()| root.present().map_err(anyhow::Error::from))
        .with_context(|| {
            format!(
                "failed to draw chart {:?} to {}",
                chart.title,
                path.display()
            )
        })
}

/// Draws the two market panels under the title.
fn draw_market(
    root: &DrawingArea<BitMapBackend<'_>, Shift>,
    x: Range<f64>,
    names: &[&str],
    prices: &[Line],
    free: &[Line],
) -> anyhow::Result<()> {
    let body = root.titled(
        "Market trace: prices and free capacity",
        (FAMILY, 28).into_font(),
    )?;
    let (top, bottom) = body.split_vertically(body.dim_in_pixel().1 / 2);
    let price_panel = Chart {
        title: "Prices",
        x_desc: "hours from the start of the trace",
        y_desc: "USD per hour",
        legend: SeriesLabelPosition::UpperRight,
        legend_size: 12,
    };
    let y = value_range(prices, false);
    draw_panel(&top, &price_panel, x.clone(), y, names, prices)?;
    let capacity_panel = Chart {
        title: "Free capacity",
        y_desc: "units free",
        ..price_panel
    };
    let y = value_range(free, true);
    draw_panel(&bottom, &capacity_panel, x, y, names, free)
}

/// Draws axes, one line per series (coloured by its label's place in `names`) and, when there
/// is at least one series, a legend.
fn draw_panel(
    area: &DrawingArea<BitMapBackend<'_>, Shift>,
    chart: &Chart,
    x: Range<f64>,
    y: Range<f64>,
    names: &[&str],
    lines: &[Line],
) -> anyhow::Result<()> {
    let mut ctx = ChartBuilder::on(area)
        .caption(chart.title, (FAMILY, 24))
        .margin(12)
        .x_label_area_size(50)
        .y_label_area_size(80)
        .build_cartesian_2d(x, y)?;
    // Major grid lines only: the fine ones made each PNG several times larger.
    ctx.configure_mesh()
        .light_line_style(TRANSPARENT)
        .x_desc(chart.x_desc)
        .y_desc(chart.y_desc)
        .label_style((FAMILY, 14))
        .axis_desc_style((FAMILY, 16))
        .draw()?;
    for (name, points) in lines {
        let index = names.iter().position(|n| n == name).unwrap_or(0);
        let colour = PALETTE[index % PALETTE.len()];
        ctx.draw_series(LineSeries::new(
            points.iter().copied(),
            colour.stroke_width(2),
        ))?
        .label(name.as_str())
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], colour.stroke_width(2)));
    }
    if !lines.is_empty() {
        ctx.configure_series_labels()
            .position(chart.legend.clone())
            .label_font((FAMILY, chart.legend_size))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()?;
    }
    Ok(())
}

/// `(index, value)` as a point on an hour axis.
fn to_point((index, value): (usize, &f64)) -> (f64, f64) {
    (index as f64, *value)
}

/// The points whose coordinates are both finite.
fn finite(points: impl Iterator<Item = (f64, f64)>) -> Vec<(f64, f64)> {
    points
        .filter(|(x, y)| x.is_finite() && y.is_finite())
        .collect()
}

/// The non-empty series with finite points sorted by x, as step lines when `steps` is set.
fn cleaned(series: &[(String, Vec<(f64, f64)>)], steps: bool) -> Vec<Line> {
    series
        .iter()
        .filter_map(|(name, points)| {
            let mut points = finite(points.iter().copied());
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            let points = if steps { step(&points) } else { points };
            (!points.is_empty()).then(|| (name.clone(), points))
        })
        .collect()
}

/// A step line through sorted points: each value holds until the next point's x.
fn step(points: &[(f64, f64)]) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(points.len() * 2);
    for (i, &(x, y)) in points.iter().enumerate() {
        if i > 0 {
            out.push((x, points[i - 1].1));
        }
        out.push((x, y));
    }
    out
}

/// Finite, non-negative minutes, ascending.
fn sorted_minutes(minutes: &[f64]) -> Vec<f64> {
    let mut sorted: Vec<f64> = minutes
        .iter()
        .copied()
        .filter(|m| m.is_finite() && *m >= 0.0)
        .collect();
    sorted.sort_by(f64::total_cmp);
    sorted
}

/// The nearest-rank `q` quantile of ascending values; `None` when there are none.
fn percentile(sorted: &[f64], q: f64) -> Option<f64> {
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted.get(rank.clamp(1, sorted.len().max(1)) - 1).copied()
}

/// The empirical CDF of ascending values as a step line from (0, 0), cut at `x_max`.
fn ecdf(sorted: &[f64], x_max: f64) -> Vec<(f64, f64)> {
    let n = sorted.len() as f64;
    let mut out = vec![(0.0, 0.0)];
    for (i, &x) in sorted.iter().enumerate() {
        let before = i as f64 / n;
        if x > x_max {
            out.push((x_max, before));
            return out;
        }
        out.push((x, before));
        out.push((x, (i + 1) as f64 / n));
    }
    if !sorted.is_empty() {
        out.push((x_max, 1.0));
    }
    out
}

/// A CDF's legend entry: the strategy and how many jobs it covers.
fn cdf_label(name: &str, jobs: usize) -> String {
    match jobs {
        0 => format!("{name} (no jobs)"),
        n => format!("{name} ({n} jobs)"),
    }
}

/// The y range covering every point of `lines` (and zero, with `from_zero`), with 5% room
/// below as well as above when it does not start at zero; 0..1 when there are no points.
fn value_range(lines: &[Line], from_zero: bool) -> Range<f64> {
    let values = || lines.iter().flat_map(|(_, p)| p).map(|p| p.1);
    let (lo, hi) = (min_of(values()).unwrap_or(0.0), max_of(values()));
    let lo = if from_zero {
        lo.min(0.0)
    } else if hi > lo {
        lo - (hi - lo) * 0.05
    } else {
        lo
    };
    padded(lo, hi)
}

/// The smallest value, if any.
fn min_of(values: impl Iterator<Item = f64>) -> Option<f64> {
    values.reduce(f64::min)
}

/// The largest value, or `f64::NEG_INFINITY` when there are none (so [`padded`] widens it).
fn max_of(values: impl Iterator<Item = f64>) -> f64 {
    values.fold(f64::NEG_INFINITY, f64::max)
}

/// `lo..hi` with 5% headroom above, or `lo..lo + 1` when the range is empty or a single value.
fn padded(lo: f64, hi: f64) -> Range<f64> {
    if hi > lo {
        lo..hi + (hi - lo) * 0.05
    } else {
        lo..lo + 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PNG_SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a];

    /// Checks the file is a PNG of the given size, and returns its length in bytes.
    fn assert_png(path: &Path, size: (u32, u32)) -> usize {
        let bytes = std::fs::read(path).expect("chart file exists");
        assert!(
            bytes.len() > 24,
            "{} is too short: {} bytes",
            path.display(),
            bytes.len()
        );
        assert_eq!(bytes[..8], PNG_SIGNATURE, "{} is not a PNG", path.display());
        assert_eq!(&bytes[12..16], b"IHDR");
        let width = u32::from_be_bytes(bytes[16..20].try_into().expect("four bytes"));
        let height = u32::from_be_bytes(bytes[20..24].try_into().expect("four bytes"));
        assert_eq!(
            (width, height),
            size,
            "{} has the wrong size",
            path.display()
        );
        bytes.len()
    }

    fn strategies() -> Vec<(String, Vec<f64>)> {
        let cheapest = (0..168).map(|h| f64::from(h) * 2.5).collect();
        let broker = (0..168).map(|h| f64::from(h) * 1.8 + 4.0).collect();
        vec![
            ("cheapest".to_owned(), cheapest),
            ("broker".to_owned(), broker),
        ]
    }

    fn waits() -> Vec<(String, Vec<f64>)> {
        let broker = (0..200).map(|i| f64::from((i * 37) % 200) / 20.0).collect();
        let cheapest = (0..150).map(|i| f64::from((i * 13) % 150) / 5.0).collect();
        vec![
            ("broker".to_owned(), broker),
            ("cheapest".to_owned(), cheapest),
        ]
    }

    fn market_trace() -> (Vec<Line>, Vec<Line>) {
        let price =
            |base: f64| (0..168).map(move |h| (f64::from(h), base + f64::from(h % 24) / 10.0));
        let free = |base: u32| (0..168).map(move |h| (f64::from(h), f64::from(base + h % 7)));
        let lines = vec![
            ("vast H100 SXM x1 spot".to_owned(), price(1.9).collect()),
            ("runpod H100 SXM x1".to_owned(), price(2.7).collect()),
            ("lambda H100 SXM x8".to_owned(), vec![]),
        ];
        let capacity = vec![
            ("vast H100 SXM x1 spot".to_owned(), free(3).collect()),
            ("runpod H100 SXM x1".to_owned(), free(10).collect()),
        ];
        (lines, capacity)
    }

    #[test]
    fn cumulative_cost_writes_a_1200_by_700_png() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("cost.png");
        cumulative_cost(&path, &strategies()).expect("chart draws");
        assert_png(&path, (1200, 700));
    }

    #[test]
    fn time_to_running_writes_a_1200_by_700_png() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ttr.png");
        let mut series = waits();
        series.push(("idle".to_owned(), vec![]));
        time_to_running(&path, &series).expect("chart draws");
        assert_png(&path, (1200, 700));
    }

    #[test]
    fn market_writes_a_1200_by_900_png() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("market.png");
        let (lines, capacity) = market_trace();
        market(&path, &lines, &capacity).expect("chart draws");
        assert_png(&path, (1200, 900));
    }

    #[test]
    fn empty_inputs_still_write_valid_pngs() {
        let dir = tempfile::tempdir().expect("temp dir");
        let all_empty = vec![("a".to_owned(), vec![]), ("b".to_owned(), vec![])];
        let no_points: Vec<Line> = vec![("a".to_owned(), vec![])];
        for (name, series) in [("none", vec![]), ("all-empty", all_empty)] {
            let cost = dir.path().join(format!("cost-{name}.png"));
            cumulative_cost(&cost, &series).expect("empty cost chart draws");
            assert_png(&cost, (1200, 700));
            let ttr = dir.path().join(format!("ttr-{name}.png"));
            time_to_running(&ttr, &series).expect("empty time chart draws");
            assert_png(&ttr, (1200, 700));
        }
        let path = dir.path().join("market-empty.png");
        market(&path, &[], &no_points).expect("empty market chart draws");
        assert_png(&path, (1200, 900));
    }

    #[test]
    fn constant_series_get_a_non_degenerate_range() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("flat.png");
        let flat = vec![("flat".to_owned(), vec![(0.0, 2.5), (5.0, 2.5)])];
        let single = vec![("one".to_owned(), vec![(3.0, 4.0)])];
        market(&path, &flat, &single).expect("flat market chart draws");
        assert_png(&path, (1200, 900));
        assert_eq!(padded(2.5, 2.5), 2.5..3.5);
        assert_eq!(padded(0.0, f64::NEG_INFINITY), 0.0..1.0);
    }

    #[test]
    fn missing_font_error_names_the_path_and_the_debian_package() {
        let path = Path::new("/nonexistent/fonts/NoSuchFont.ttf");
        let message = format!("{:#}", load_font(path).expect_err("font is missing"));
        assert!(
            message.contains("/nonexistent/fonts/NoSuchFont.ttf"),
            "{message}"
        );
        assert!(message.contains("fonts-dejavu-core"), "{message}");
    }

    #[test]
    fn a_path_without_the_png_extension_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("cost.svg");
        let message = format!(
            "{:#}",
            cumulative_cost(&path, &strategies()).expect_err("svg")
        );
        assert!(message.contains("cost.svg"), "{message}");
        assert!(!path.exists());
    }

    #[test]
    fn ecdf_is_a_step_line_cut_at_the_axis_end() {
        let sorted = sorted_minutes(&[3.0, f64::NAN, 1.0, -2.0, 2.0, 10.0]);
        assert_eq!(sorted, [1.0, 2.0, 3.0, 10.0]);
        assert_eq!(percentile(&sorted, 0.99), Some(10.0));
        assert_eq!(percentile(&sorted, 0.5), Some(2.0));
        assert_eq!(percentile(&[], 0.99), None);
        let line = ecdf(&sorted, 5.0);
        assert_eq!(line.first(), Some(&(0.0, 0.0)));
        assert_eq!(line.last(), Some(&(5.0, 0.75)));
        assert_eq!(ecdf(&[1.0], 4.0).last(), Some(&(4.0, 1.0)));
    }

    #[test]
    fn capacity_steps_hold_each_value_until_the_next_point() {
        let steps = step(&[(0.0, 3.0), (2.0, 1.0), (5.0, 4.0)]);
        assert_eq!(
            steps,
            [(0.0, 3.0), (2.0, 3.0), (2.0, 1.0), (5.0, 1.0), (5.0, 4.0)]
        );
    }
}
