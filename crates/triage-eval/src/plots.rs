//! The report's figures, each as PNG and SVG (plotters, with an embedded Noto Sans so text
//! renders without system fonts): accuracy vs tokens over the τ sweep, entropy histograms by
//! correctness, hallucination rate by entropy bin with Wilson intervals and Pearson r (the
//! EDAR paper's Figure 2), and accuracy by needle depth.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::{EvalError, Result};
use crate::report::{Report, MIN_BIN};

const SIZE: (u32, u32) = (900, 560);
const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

type DrawResult = std::result::Result<(), String>;

/// Give plotters its one font, once per process.
fn register_font() -> Result<()> {
    static LOADED: OnceLock<bool> = OnceLock::new();
    let loaded = *LOADED.get_or_init(|| {
        plotters::style::register_font("sans-serif", FontStyle::Normal, ttf_noto_sans::REGULAR)
            .is_ok()
    });
    if loaded {
        Ok(())
    } else {
        Err(EvalError::Plot {
            path: String::new(),
            message: "the embedded font did not load".into(),
        })
    }
}

/// Draw one figure to `<dir>/<name>.png` and `<dir>/<name>.svg`.
fn both(
    dir: &Path,
    name: &str,
    draw_png: impl Fn(DrawingArea<BitMapBackend<'_>, Shift>) -> DrawResult,
    draw_svg: impl Fn(DrawingArea<SVGBackend<'_>, Shift>) -> DrawResult,
) -> Result<Vec<PathBuf>> {
    let png = dir.join(format!("{name}.png"));
    let svg = dir.join(format!("{name}.svg"));
    let fail = |path: &Path| {
        let path = path.display().to_string();
        move |message| EvalError::Plot { path, message }
    };
    draw_png(BitMapBackend::new(&png, SIZE).into_drawing_area()).map_err(fail(&png))?;
    draw_svg(SVGBackend::new(&svg, SIZE).into_drawing_area()).map_err(fail(&svg))?;
    Ok(vec![png, svg])
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

fn sweep_figure<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, r: &Report) -> DrawResult {
    root.fill(&WHITE).map_err(err)?;
    let x_max = r
        .sweep
        .iter()
        .map(|p| p.mean_tokens)
        .chain(r.systems.iter().map(|s| s.tokens.value))
        .fold(1.0, f64::max)
        * 1.05;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: accuracy vs tokens over the τ sweep", r.suite),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..x_max, 0f64..1.02f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("mean tokens per query (all stages)")
        .y_desc("accuracy")
        .draw()
        .map_err(err)?;
    let line: Vec<(f64, f64)> = r
        .sweep
        .iter()
        .map(|p| (p.mean_tokens, p.accuracy))
        .collect();
    chart
        .draw_series(LineSeries::new(line.clone(), COLORS[0].stroke_width(2)))
        .map_err(err)?
        .label("RAG → LC above τ (offline sweep)")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], COLORS[0]));
    chart
        .draw_series(line.iter().map(|&p| Circle::new(p, 2, COLORS[0].filled())))
        .map_err(err)?;
    for (i, s) in r.systems.iter().enumerate() {
        let c = COLORS[(i + 1) % COLORS.len()];
        let at = (s.tokens.value, s.accuracy.value);
        chart
            .draw_series([Circle::new(at, 6, c.filled())])
            .map_err(err)?
            .label(s.system.clone())
            .legend(move |(x, y)| Circle::new((x + 9, y), 5, c.filled()));
        chart
            .draw_series([PathElement::new(
                vec![(at.0, s.accuracy.lo), (at.0, s.accuracy.hi)],
                c.stroke_width(2),
            )])
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

fn histogram_figure<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, r: &Report) -> DrawResult {
    let Some(sig) = &r.signals else {
        return Ok(());
    };
    root.fill(&WHITE).map_err(err)?;
    let lo = sig.bins.first().map_or(0.0, |b| b.lo);
    let hi = sig.bins.last().map_or(1.0, |b| b.hi);
    let width = (hi - lo) / 20.0;
    let count = |wrong: bool| {
        let mut c = [0usize; 20];
        for &(s, w) in &sig.values {
            if w == wrong {
                c[(((s - lo) / width.max(1e-9)) as usize).min(19)] += 1;
            }
        }
        c
    };
    let (right, wrong) = (count(false), count(true));
    let top = right.iter().chain(&wrong).copied().max().unwrap_or(1) as f64 * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: RAG answer entropy by correctness", r.suite),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(56)
        .build_cartesian_2d(lo..hi.max(lo + 1e-6), 0f64..top.max(1.0))
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("monitor statistic (mean entropy of the answer span, nats)")
        .y_desc("answers")
        .draw()
        .map_err(err)?;
    for (counts, color, label) in [(right, COLORS[2], "correct"), (wrong, COLORS[3], "wrong")] {
        chart
            .draw_series(counts.iter().enumerate().map(|(i, &n)| {
                let x0 = lo + i as f64 * width;
                Rectangle::new(
                    [(x0, 0.0), (x0 + width, n as f64)],
                    color.mix(0.45).filled(),
                )
            }))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

fn hallucination_figure<DB: DrawingBackend>(
    root: DrawingArea<DB, Shift>,
    r: &Report,
) -> DrawResult {
    let Some(sig) = &r.signals else {
        return Ok(());
    };
    root.fill(&WHITE).map_err(err)?;
    let lo = sig.bins.first().map_or(0.0, |b| b.lo);
    let hi = sig.bins.last().map_or(1.0, |b| b.hi);
    let r_text = sig.pearson_r.map_or("n/a".into(), |v| format!("{v:.2}"));
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{}: hallucination rate by entropy (Pearson r = {r_text})",
                r.suite
            ),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(56)
        .build_cartesian_2d(lo..hi.max(lo + 1e-6), 0f64..1.02f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("monitor statistic bin (nats)")
        .y_desc("wrong RAG answers (95% Wilson)")
        .draw()
        .map_err(err)?;
    let shown: Vec<_> = sig.bins.iter().filter(|b| b.n > 0).collect();
    chart
        .draw_series(shown.iter().map(|b| {
            let x = (b.lo + b.hi) / 2.0;
            ErrorBar::new_vertical(
                x,
                b.rate_lo,
                b.rate,
                b.rate_hi,
                COLORS[3].stroke_width(2),
                10,
            )
        }))
        .map_err(err)?;
    chart
        .draw_series(shown.iter().map(|b| {
            let style = if b.n >= MIN_BIN {
                COLORS[3].filled()
            } else {
                COLORS[7].filled()
            };
            Circle::new(((b.lo + b.hi) / 2.0, b.rate), 5, style)
        }))
        .map_err(err)?;
    root.present().map_err(err)
}

fn depth_figure<DB: DrawingBackend>(root: DrawingArea<DB, Shift>, r: &Report) -> DrawResult {
    root.fill(&WHITE).map_err(err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{}: accuracy by needle depth", r.suite),
            ("sans-serif", 22),
        )
        .margin(12)
        .x_label_area_size(42)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..1f64, 0f64..1.02f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("depth of the evidence in the corpus (0 = start)")
        .y_desc("accuracy")
        .draw()
        .map_err(err)?;
    for (i, s) in r.systems.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let points: Vec<(f64, f64)> = r
            .depth
            .iter()
            .filter_map(|d| {
                d.accuracy
                    .get(&s.system)
                    .map(|a| ((d.lo + d.hi) / 2.0, a.1))
            })
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), c.stroke_width(2)))
            .map_err(err)?
            .label(s.system.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c));
        chart
            .draw_series(points.into_iter().map(|p| Circle::new(p, 4, c.filled())))
            .map_err(err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)
}

/// Write every figure the report has data for into `dir`; returns the files written.
pub fn write_all(r: &Report, dir: &Path) -> Result<Vec<PathBuf>> {
    register_font()?;
    let mut out = Vec::new();
    if !r.sweep.is_empty() {
        out.extend(both(
            dir,
            "tau_sweep",
            |a| sweep_figure(a, r),
            |a| sweep_figure(a, r),
        )?);
    }
    if r.signals.is_some() {
        out.extend(both(
            dir,
            "entropy_histogram",
            |a| histogram_figure(a, r),
            |a| histogram_figure(a, r),
        )?);
        out.extend(both(
            dir,
            "hallucination_by_entropy",
            |a| hallucination_figure(a, r),
            |a| hallucination_figure(a, r),
        )?);
    }
    if !r.depth.is_empty() {
        out.extend(both(
            dir,
            "accuracy_by_depth",
            |a| depth_figure(a, r),
            |a| depth_figure(a, r),
        )?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_figure_is_written_as_png_and_svg() {
        let mut rows = crate::report::tests::rows();
        for (i, r) in rows.iter_mut().enumerate() {
            r.depth = Some((i % 10) as f64 / 9.0);
        }
        let report = crate::report::build(&rows, 1);
        let dir = tempfile::tempdir().unwrap();
        let files = write_all(&report, dir.path()).unwrap();
        assert_eq!(files.len(), 8);
        for f in &files {
            let bytes = std::fs::read(f).unwrap();
            if f.extension().is_some_and(|e| e == "png") {
                assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{}", f.display());
            } else {
                let text = String::from_utf8(bytes).unwrap();
                assert!(text.starts_with("<svg"), "{}", f.display());
                assert!(text.contains("kv-retrieval"), "{}", f.display());
            }
        }
        let sweep = std::fs::read_to_string(dir.path().join("tau_sweep.svg")).unwrap();
        assert!(sweep.contains("edar") && sweep.contains("accuracy"));
    }
}
