//! The SVG chart of docs/benchmarks.md: throughput and server CPU per request, per
//! store and scenario (medians over rounds, whiskers from min to max).

use std::collections::BTreeMap;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::BoxError;
use crate::load::Scenario;
use crate::report::{Cell, Figure, StoreKind};

const COLORS: [RGBColor; 5] = [
    RGBColor(120, 120, 120), // bare
    RGBColor(66, 133, 244),  // no-key
    RGBColor(244, 160, 0),   // new-key
    RGBColor(15, 157, 88),   // replay
    RGBColor(219, 68, 55),   // contended
];

/// Renders the chart as an SVG document; `ceilings` (store, operations/s) are
/// drawn as dashed lines over their store's throughput bars.
pub(crate) fn render(
    cells: &BTreeMap<(StoreKind, Scenario), Cell>,
    ceilings: &[(StoreKind, f64)],
) -> Result<String, BoxError> {
    let stores: Vec<StoreKind> = StoreKind::ALL
        .into_iter()
        .filter(|store| cells.keys().any(|(s, _)| s == store))
        .collect();
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (960, 760)).into_drawing_area();
        root.fill(&WHITE)?;
        let (top, bottom) = root.split_vertically(400);
        panel(
            &top,
            cells,
            &stores,
            "Throughput: expected answers per second (log scale; dashed: the store's ceiling)",
            "req/s",
            |c| c.rps,
            ceilings,
        )?;
        panel(
            &bottom,
            cells,
            &stores,
            "Server CPU time per request, µs (log scale)",
            "µs/req",
            |c| c.cpu_us,
            &[],
        )?;
        root.present()?;
    }
    Ok(svg)
}

fn panel(
    area: &DrawingArea<SVGBackend<'_>, Shift>,
    cells: &BTreeMap<(StoreKind, Scenario), Cell>,
    stores: &[StoreKind],
    title: &str,
    unit: &str,
    metric: impl Fn(&Cell) -> Figure,
    ceilings: &[(StoreKind, f64)],
) -> Result<(), BoxError> {
    let values: Vec<f64> = cells
        .values()
        .flat_map(|c| {
            let f = metric(c);
            [f.min, f.max, f.median]
        })
        .chain(ceilings.iter().map(|(_, c)| *c))
        .filter(|v| v.is_finite() && *v > 0.0)
        .collect();
    let low = values.iter().copied().fold(f64::INFINITY, f64::min);
    let high = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let (low, high) = if low.is_finite() && high.is_finite() {
        let low = 10f64.powf(low.log10().floor());
        // Leave the top third of the panel to the legend.
        let (l, h) = (low.log10(), high.max(low * 10.0).log10());
        (low, 10f64.powf((h - 0.34 * l) / 0.66))
    } else {
        (1.0, 10.0)
    };
    let groups = stores.len().max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(28)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..groups, (low..high).log_scale())?;
    let names: Vec<&str> = stores.iter().map(|s| s.name()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(stores.len() * 2 + 1)
        .x_label_formatter(&|x| {
            let centered = x - 0.5;
            if (centered - centered.round()).abs() < 1e-6 && centered >= 0.0 {
                names
                    .get(centered.round() as usize)
                    .map(|s| (*s).to_owned())
                    .unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc(unit)
        .y_label_formatter(&|y| {
            if *y >= 1000.0 {
                format!("{:.0}k", y / 1000.0)
            } else {
                format!("{y:.0}")
            }
        })
        .draw()?;
    let width = 0.8 / Scenario::ALL.len() as f64;
    for (index, scenario) in Scenario::ALL.into_iter().enumerate() {
        let color = COLORS[index];
        let mut bars = Vec::new();
        let mut whiskers = Vec::new();
        for (group, store) in stores.iter().enumerate() {
            let Some(cell) = cells.get(&(*store, scenario)) else {
                continue;
            };
            let f = metric(cell);
            if !(f.median.is_finite() && f.median > 0.0) {
                continue;
            }
            let x0 = group as f64 + 0.1 + index as f64 * width;
            let x1 = x0 + width * 0.85;
            bars.push(Rectangle::new([(x0, low), (x1, f.median)], color.filled()));
            let mid = (x0 + x1) / 2.0;
            if f.max > f.min {
                whiskers.push(PathElement::new(
                    vec![(mid, f.min.max(low)), (mid, f.max)],
                    BLACK.stroke_width(1),
                ));
                for y in [f.min.max(low), f.max] {
                    whiskers.push(PathElement::new(
                        vec![(mid - width * 0.2, y), (mid + width * 0.2, y)],
                        BLACK.stroke_width(1),
                    ));
                }
            }
        }
        chart
            .draw_series(bars)?
            .label(scenario.name())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        chart.draw_series(whiskers)?;
    }
    for (store, ceiling) in ceilings {
        if let Some(group) = stores.iter().position(|s| s == store) {
            let x0 = group as f64 + 0.05;
            chart.draw_series(DashedLineSeries::new(
                [(x0, *ceiling), (x0 + 0.9, *ceiling)],
                6,
                4,
                BLACK.stroke_width(2),
            ))?;
        }
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
