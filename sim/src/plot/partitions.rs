//! The partition plot: per hot spot, the accepted rate of each second in
//! both modes, over the limit, with the offered rate.

use std::path::{Path, PathBuf};

use plotters::prelude::RGBColor;

use super::{Line, draw, thin};
use crate::SimError;
use crate::partitions::{Mode, PartitionRun};

/// Hot spots drawn per workload.
const SPOTS_DRAWN: usize = 3;

fn mode_color(mode: Mode) -> RGBColor {
    match mode {
        Mode::Local => RGBColor(255, 127, 14),
        Mode::Coordinated => RGBColor(31, 119, 180),
    }
}

/// Draws one plot per hot spot of `run` (at most [`SPOTS_DRAWN`]) into
/// `dir`; returns the files' names.
pub fn write_partition_plots(
    name: &str,
    limit: f64,
    run: &PartitionRun,
    dir: &Path,
) -> Result<Vec<PathBuf>, SimError> {
    let mut files = Vec::new();
    let Some(first) = run.runs.first() else {
        return Ok(files);
    };
    let per_second = (1.0 / first.record.bin_secs).round() as usize;
    let seconds = |values: &[u32]| -> (Vec<f64>, Vec<f64>) {
        values
            .chunks(per_second)
            .enumerate()
            .map(|(k, c)| {
                let sum: f64 = c.iter().map(|&v| f64::from(v)).sum();
                (
                    ((k + 1) * per_second) as f64 * first.record.bin_secs,
                    sum / (c.len() as f64 * first.record.bin_secs) / limit,
                )
            })
            .unzip()
    };
    for (s, spot) in run.spots.iter().enumerate().take(SPOTS_DRAWN) {
        let (times, offered) = seconds(&first.record.spots[s].offered);
        let mut lines = vec![
            Line {
                label: "offered".into(),
                color: RGBColor(150, 150, 150),
                dashed: false,
                points: thin(&times, &offered),
            },
            Line {
                label: "limit".into(),
                color: RGBColor(40, 40, 40),
                dashed: true,
                points: vec![(0.0, 1.0), (times.last().copied().unwrap_or(1.0), 1.0)],
            },
        ];
        for r in &run.runs {
            let (times, accepted) = seconds(&r.record.spots[s].accepted);
            lines.push(Line {
                label: format!("{} accepted", r.mode.name()),
                color: mode_color(r.mode),
                dashed: false,
                points: thin(&times, &accepted),
            });
        }
        let file = format!("{name}-partition-{s}.svg");
        draw(
            &dir.join(&file),
            &format!("{name}: {}, per second", spot.describe()),
            "operations / limit",
            &lines,
            &[],
        )?;
        files.push(PathBuf::from(file));
    }
    Ok(files)
}
