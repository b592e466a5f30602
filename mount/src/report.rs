//! `ckptfs report PATH --svg FILE`: a picture of what checkpoints cost.
//!
//! For a file, one point per listed revision; for a directory in a mount, one point per
//! entry (a checkpoint step: a file, or a directory of rank files), ordered by commit time.
//! Each point has the bytes the checkpoint holds (logical) and the bytes it added to the
//! space (newly stored: after dedup against everything stored before, and compression).
//! The upper panel draws both as bars; the lower one their ratio per point and
//! cumulatively, which is how many times over the checkpoints would fill a plain
//! directory. The space's dedup and compression ratios as they are now go in the title:
//! the format records newly stored bytes per revision, not how dedup and compression
//! split them.

use crate::error::CliError;
use plotters::prelude::*;
use std::path::Path;

/// One checkpoint (a revision of a file, or a step of a directory).
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub label: String,
    pub committed_unix: f64,
    pub logical: u64,
    pub stored: u64,
}

/// The points of a file: its listed revisions (`list_revisions` JSON), oldest first.
pub fn file_points(revisions: &serde_json::Value) -> Vec<Point> {
    revisions
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let u = |k: &str| r.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
            Point {
                label: format!("rev {}", u("id")),
                committed_unix: r
                    .get("committed_unix")
                    .and_then(|x| x.as_f64())
                    .unwrap_or(0.0),
                logical: u("size"),
                stored: u("new_bytes"),
            }
        })
        .collect()
}

/// Totals of a step: the current revision of every regular file under `path` (or `path`
/// itself). `current` lists a file's revisions.
pub fn step_point(
    path: &Path,
    label: String,
    current: &mut dyn FnMut(&Path) -> Result<serde_json::Value, CliError>,
) -> Result<Point, CliError> {
    let mut p = Point {
        label,
        committed_unix: 0.0,
        logical: 0,
        stored: 0,
    };
    let mut stack = vec![path.to_path_buf()];
    while let Some(at) = stack.pop() {
        let md = std::fs::symlink_metadata(&at)
            .map_err(|e| format!("cannot stat {}: {e}", at.display()))?;
        if md.is_dir() {
            for e in
                std::fs::read_dir(&at).map_err(|e| format!("cannot list {}: {e}", at.display()))?
            {
                stack.push(e.map_err(CliError::from)?.path());
            }
        } else if md.is_file() {
            let revs = current(&at)?;
            if let Some(r) = revs
                .as_array()
                .into_iter()
                .flatten()
                .find(|r| r.get("current").and_then(|c| c.as_bool()) == Some(true))
            {
                let u = |k: &str| r.get(k).and_then(|x| x.as_u64()).unwrap_or(0);
                p.logical += u("size");
                p.stored += u("new_bytes");
                let t = r
                    .get("committed_unix")
                    .and_then(|x| x.as_f64())
                    .unwrap_or(0.0);
                p.committed_unix = p.committed_unix.max(t);
            }
        }
    }
    Ok(p)
}

/// Bytes in the unit that suits the largest value: (divisor, name).
fn unit(max: u64) -> (f64, &'static str) {
    match max {
        m if m >= 10 << 30 => ((1u64 << 30) as f64, "GiB"),
        m if m >= 10 << 20 => ((1u64 << 20) as f64, "MiB"),
        _ => (1024.0, "KiB"),
    }
}

/// logical / stored; None for a checkpoint that stored nothing new (an infinite saving,
/// left out of the line rather than drawn off the scale).
fn factor(logical: u64, stored: u64) -> Option<f64> {
    (stored > 0).then(|| logical as f64 / stored as f64)
}

/// Draws the report into `out` (SVG). `subtitle`: what the title adds (the space's ratios).
pub fn render_svg(
    title: &str,
    subtitle: &str,
    points: &[Point],
    out: &Path,
) -> Result<(), CliError> {
    if points.is_empty() {
        return Err(format!("{title}: no checkpoints to draw").into());
    }
    let err = |e: &dyn std::fmt::Display| format!("cannot draw {}: {e}", out.display());
    let root = SVGBackend::new(out, (960, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let root = root
        .titled(&format!("{title}\n"), ("sans-serif", 20))
        .map_err(|e| err(&e))?;
    let (top, bottom) = root.split_vertically(400);
    let n = points.len() as u32;
    let max = points
        .iter()
        .map(|p| p.logical.max(p.stored))
        .max()
        .unwrap_or(1);
    let (div, name) = unit(max);

    let mut c = ChartBuilder::on(&top)
        .caption(subtitle, ("sans-serif", 14))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0u32..n, 0f64..(max as f64 / div * 1.1).max(1e-9))
        .map_err(|e| err(&e))?;
    let labels: Vec<String> = points.iter().map(|p| p.label.clone()).collect();
    c.configure_mesh()
        .disable_x_mesh()
        .x_labels(points.len().min(16))
        .x_label_formatter(&|x| labels.get(*x as usize).cloned().unwrap_or_default())
        .y_desc(name)
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()
        .map_err(|e| err(&e))?;
    let logical_color = RGBColor(158, 202, 225);
    let stored_color = RGBColor(230, 85, 13);
    // Logical bars full width, newly stored ones narrower in front of them.
    type Bar = (fn(&Point) -> u64, RGBColor, u32, &'static str);
    let bars: [Bar; 2] = [
        (
            |p| p.logical,
            logical_color,
            4,
            "logical bytes (what the checkpoint holds)",
        ),
        (
            |p| p.stored,
            stored_color,
            14,
            "newly stored bytes (what it added to the space)",
        ),
    ];
    for (value, color, inset, label) in bars {
        c.draw_series(points.iter().enumerate().map(|(i, p)| {
            let x = i as u32;
            let mut r = Rectangle::new([(x, 0.0), (x + 1, value(p) as f64 / div)], color.filled());
            r.set_margin(0, 0, inset, inset);
            r
        }))
        .map_err(|e| err(&e))?
        .label(label)
        .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], color.filled()));
    }
    c.configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;

    // Saving factors: per checkpoint, and over all checkpoints so far.
    let mut cum = (0u64, 0u64);
    let per: Vec<(Option<f64>, Option<f64>)> = points
        .iter()
        .map(|p| {
            cum = (cum.0 + p.logical, cum.1 + p.stored);
            (factor(p.logical, p.stored), factor(cum.0, cum.1))
        })
        .collect();
    let top_factor = per
        .iter()
        .flat_map(|(a, b)| [*a, *b])
        .flatten()
        .fold(1.0f64, f64::max);
    let mut c2 = ChartBuilder::on(&bottom)
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(0f64..n as f64, 0f64..top_factor * 1.15)
        .map_err(|e| err(&e))?;
    c2.configure_mesh()
        .disable_x_mesh()
        .x_labels(points.len().min(16))
        .x_label_formatter(&|x| {
            labels
                .get(x.floor() as usize)
                .filter(|_| x.fract() == 0.0)
                .cloned()
                .unwrap_or_default()
        })
        .y_desc("logical / stored")
        .y_label_formatter(&|v| format!("{v:.1}"))
        .draw()
        .map_err(|e| err(&e))?;
    let mid = |i: usize| i as f64 + 0.5;
    let nothing_new = per.iter().filter(|(a, _)| a.is_none()).count();
    c2.draw_series(LineSeries::new(
        per.iter()
            .enumerate()
            .filter_map(|(i, (a, _))| a.map(|a| (mid(i), a))),
        stored_color.stroke_width(2),
    ))
    .map_err(|e| err(&e))?
    .label(if nothing_new > 0 {
        format!("per checkpoint ({nothing_new} stored nothing new: not drawn)")
    } else {
        "per checkpoint".to_string()
    })
    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], stored_color));
    c2.draw_series(LineSeries::new(
        per.iter()
            .enumerate()
            .filter_map(|(i, (_, b))| b.map(|b| (mid(i), b))),
        BLACK.stroke_width(2),
    ))
    .map_err(|e| err(&e))?
    .label("all checkpoints so far")
    .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 14, y)], BLACK));
    c2.configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_is_an_svg_with_a_bar_per_checkpoint() {
        let dir = std::env::temp_dir().join(format!("ckptfs-report-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = dir.join("r.svg");
        let points: Vec<Point> = (0..5)
            .map(|i| Point {
                label: format!("rev {i}"),
                committed_unix: i as f64,
                logical: 64 << 20,
                stored: if i == 0 { 60 << 20 } else { 4 << 20 },
            })
            .collect();
        render_svg("model.pt", "dedup 3.1x, compression 1.0x", &points, &out).unwrap();
        let svg = std::fs::read_to_string(&out).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert!(svg.contains("rev 4") && svg.contains("logical / stored"));
        // Two bars per checkpoint.
        assert!(svg.matches("<rect").count() >= 10, "{svg}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn factors_and_units() {
        assert_eq!(factor(100, 0), None);
        assert_eq!(factor(100, 50), Some(2.0));
        assert_eq!(unit(5 << 20).1, "KiB");
        assert_eq!(unit(50 << 20).1, "MiB");
        assert_eq!(unit(50 << 30).1, "GiB");
    }
}
