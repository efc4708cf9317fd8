//! SVG plots of a workload's runs, drawn with `plotters`.
//!
//! Per workload: cumulative admitted tokens and their divergence from the
//! ideal, the bucket level, and per policy the rates of a few pods
//! (requested, admitted, ideal); for partition workloads, each hot spot's
//! accepted rate in both modes; for organisation workloads, those of the
//! organisation as a whole and each tenant's rate. Long series are averaged down to at most
//! [`MAX_POINTS`] points so the files stay small.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::engine::Policy;
use crate::organisation::OrganisationRun;
use crate::record::Record;
use crate::{SimError, WorkloadRun};

mod partitions;

pub use partitions::write_partition_plots;

const MAX_POINTS: usize = 1200;
const SIZE: (u32, u32) = (960, 480);
/// Pods drawn per policy chart.
const PODS_DRAWN: usize = 3;

struct Line {
    label: String,
    color: RGBColor,
    dashed: bool,
    points: Vec<(f64, f64)>,
}

fn policy_color(policy: Policy) -> RGBColor {
    match policy {
        Policy::Shares => RGBColor(31, 119, 180),
        Policy::BucketLevelEma => RGBColor(255, 127, 14),
        Policy::Greedy => RGBColor(214, 39, 40),
    }
}

const IDEAL: RGBColor = RGBColor(40, 40, 40);
const POD_COLORS: [RGBColor; PODS_DRAWN] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
];

/// Averages `values` (one per sample, ending at `times`) into at most
/// [`MAX_POINTS`] points.
fn thin(times: &[f64], values: &[f64]) -> Vec<(f64, f64)> {
    let n = times.len().min(values.len());
    let group = n.div_ceil(MAX_POINTS).max(1);
    (0..n)
        .step_by(group)
        .map(|start| {
            let end = (start + group).min(n);
            let mean = values[start..end].iter().sum::<f64>() / (end - start) as f64;
            (times[end - 1], mean)
        })
        .collect()
}

fn cumulative(values: &[f64]) -> Vec<f64> {
    values
        .iter()
        .scan(0.0, |sum, v| {
            *sum += v;
            Some(*sum)
        })
        .collect()
}

/// The server's outages, as `(start, end)` in seconds of virtual time:
/// shaded on the plots of a workload that has them.
fn outage_spans(run: &WorkloadRun) -> Vec<(f64, f64)> {
    run.workload
        .outages
        .iter()
        .map(|o| {
            let start = o.start.as_secs_f64();
            (start, start + o.duration.as_secs_f64())
        })
        .collect()
}

const OUTAGE_SHADE: RGBColor = RGBColor(225, 225, 225);

/// The share of the plot's height the legend takes, with `entries` rows:
/// about 22 px a row of the 400 px a plot area has, and a margin.
fn legend_share(entries: usize) -> f64 {
    (0.055 * entries as f64 + 0.04).min(0.6)
}

fn draw(
    path: &Path,
    title: &str,
    y_desc: &str,
    lines: &[Line],
    outages: &[(f64, f64)],
) -> Result<(), SimError> {
    let fail = |e: &dyn std::fmt::Display| SimError::Plot {
        path: path.to_owned(),
        message: e.to_string(),
    };
    let points = lines.iter().flat_map(|l| l.points.iter());
    let (mut x_max, mut y_min, mut y_max) = (1.0f64, 0.0f64, 1.0f64);
    for &(x, y) in points {
        x_max = x_max.max(x);
        if y.is_finite() {
            y_min = y_min.min(y);
            y_max = y_max.max(y);
        }
    }
    // Room above the data for the legend (upper left), so that it covers
    // none of the lines: the legend's share of the height is left empty.
    let range = (y_max - y_min).max(f64::MIN_POSITIVE);
    let entries = lines.len() + usize::from(!outages.is_empty());
    let share = legend_share(entries);
    let (y_low, y_high) = (y_min - range * 0.05, y_max + range * share / (1.0 - share));
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(|e| fail(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(72)
            .build_cartesian_2d(0.0..x_max, y_low..y_high)
            .map_err(|e| fail(&e))?;
        chart
            .configure_mesh()
            .x_desc("virtual time (s)")
            .y_desc(y_desc)
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(|e| fail(&e))?;
        if !outages.is_empty() {
            chart
                .draw_series(outages.iter().map(|&(start, end)| {
                    Rectangle::new([(start, y_low), (end, y_high)], OUTAGE_SHADE.filled())
                }))
                .map_err(|e| fail(&e))?
                .label("server outage")
                .legend(|(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 20, y + 5)], OUTAGE_SHADE.filled())
                });
        }
        for line in lines {
            let color = line.color;
            let width = if line.dashed { 1 } else { 2 };
            let style = ShapeStyle::from(&color).stroke_width(width);
            // A dash of 6 and a gap of 4, on the plot and in the legend.
            let (dash, gap) = if line.dashed { (6, 4) } else { (10_000, 0) };
            let series = chart
                .draw_series(DashedLineSeries::new(
                    line.points.iter().copied(),
                    dash,
                    gap,
                    style,
                ))
                .map_err(|e| fail(&e))?;
            series.label(line.label.clone()).legend(move |(x, y)| {
                plotters::element::DashedPathElement::new(
                    vec![(x, y), (x + 20, y)],
                    dash,
                    gap,
                    style,
                )
            });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(|e| fail(&e))?;
        root.present().map_err(|e| fail(&e))?;
    }
    std::fs::write(path, svg).map_err(|source| SimError::Write {
        path: path.to_owned(),
        source,
    })
}

/// The pods drawn: the first of each group, then the next ones of the first.
fn pods_to_draw(run: &WorkloadRun) -> Vec<usize> {
    let specs = run.workload.pod_specs();
    let mut pods = Vec::new();
    let mut seen_groups = Vec::new();
    for (p, spec) in specs.iter().enumerate() {
        if !seen_groups.contains(&spec.group) {
            seen_groups.push(spec.group);
            pods.push(p);
        }
    }
    for p in 0..specs.len() {
        if !pods.contains(&p) {
            pods.push(p);
        }
    }
    pods.truncate(PODS_DRAWN);
    pods
}

/// Draws every plot of `run` into `dir`; returns the files' names.
pub fn write_plots(run: &WorkloadRun, dir: &Path) -> Result<Vec<PathBuf>, SimError> {
    let name = &run.workload.name;
    let ideal = &run.ideal;
    let times = &ideal.times;
    let ideal_cumulative = cumulative(&ideal.admitted_total());
    let outages = outage_spans(run);
    let mut files = Vec::new();

    let mut admitted = vec![Line {
        label: "ideal".into(),
        color: IDEAL,
        dashed: true,
        points: thin(times, &ideal_cumulative),
    }];
    let mut divergence = Vec::new();
    let mut level = vec![Line {
        label: "ideal".into(),
        color: IDEAL,
        dashed: true,
        points: thin(times, &ideal.level),
    }];
    for policy_run in &run.runs {
        let label = policy_run.policy.name().to_string();
        let color = policy_color(policy_run.policy);
        let own = cumulative(&policy_run.record.admitted_total());
        let diff: Vec<f64> = own
            .iter()
            .zip(&ideal_cumulative)
            .map(|(a, b)| a - b)
            .collect();
        admitted.push(Line {
            label: label.clone(),
            color,
            dashed: false,
            points: thin(times, &own),
        });
        divergence.push(Line {
            label: label.clone(),
            color,
            dashed: false,
            points: thin(times, &diff),
        });
        level.push(Line {
            label,
            color,
            dashed: false,
            points: thin(times, &policy_run.record.level),
        });
    }
    let mut plot = |file: String, title: String, y: &str, lines: &[Line]| {
        let path = dir.join(&file);
        draw(&path, &title, y, lines, &outages)?;
        files.push(PathBuf::from(file));
        Ok::<(), SimError>(())
    };
    plot(
        format!("{name}-cumulative.svg"),
        format!("{name}: tokens admitted since the start"),
        "tokens",
        &admitted,
    )?;
    plot(
        format!("{name}-divergence.svg"),
        format!("{name}: admitted minus ideal, cumulative"),
        "tokens",
        &divergence,
    )?;
    plot(
        format!("{name}-level.svg"),
        format!("{name}: tokens in the global bucket"),
        "tokens",
        &level,
    )?;
    let pods = pods_to_draw(run);
    let specs = run.workload.pod_specs();
    for policy_run in &run.runs {
        let lines = pod_lines(&policy_run.record, ideal, &pods, &specs);
        plot(
            format!("{name}-pods-{}.svg", policy_run.policy.name()),
            format!(
                "{name}, {}: requested (thin), admitted (thick), ideal (dashed)",
                policy_run.policy.name()
            ),
            "tokens per second",
            &lines,
        )?;
    }
    Ok(files)
}

/// Tenants drawn on an organisation's plot of tenants.
const TENANT_COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
];

/// Draws the plots of an organisation run into `dir`: those of a
/// tenant's run for the organisation as a whole (its pods together, its
/// bucket's level), and each tenant's admitted rate against the ideal's
/// under the checked policy (the first tenants, as many as there are
/// colours); returns the files' names.
pub fn write_organisation_plots(
    run: &OrganisationRun,
    dir: &Path,
) -> Result<Vec<PathBuf>, SimError> {
    let whole = &run.nodes[0];
    let mut files = write_plots(whole, dir)?;
    let name = &run.workload.name;
    let mut lines = Vec::new();
    for (i, t) in run.tree.tenants().take(TENANT_COLORS.len()).enumerate() {
        let node = &run.nodes[t];
        let color = TENANT_COLORS[i];
        let per_second = |r: &Record| -> Vec<f64> {
            r.admitted_total()
                .iter()
                .map(|v| v / r.sample_secs)
                .collect()
        };
        let tenant = &run.tree.nodes[t].name;
        if let Some(p) = node.policy(crate::check::CHECKED_POLICY) {
            lines.push(Line {
                label: format!("{tenant} admitted"),
                color,
                dashed: false,
                points: thin(&p.record.times, &per_second(&p.record)),
            });
        }
        lines.push(Line {
            label: format!("{tenant} ideal"),
            color,
            dashed: true,
            points: thin(&node.ideal.times, &per_second(&node.ideal)),
        });
    }
    let file = format!("{name}-tenants.svg");
    draw(
        &dir.join(&file),
        &format!(
            "{name}, {}: each tenant's admitted rate, ideal (dashed)",
            crate::check::CHECKED_POLICY.name()
        ),
        "tokens per second",
        &lines,
        &outage_spans(whole),
    )?;
    files.push(PathBuf::from(file));
    Ok(files)
}

fn pod_lines(
    record: &Record,
    ideal: &Record,
    pods: &[usize],
    specs: &[crate::workload::PodSpec],
) -> Vec<Line> {
    let per_second =
        |values: &[f64]| -> Vec<f64> { values.iter().map(|v| v / record.sample_secs).collect() };
    let mut lines = Vec::new();
    for (i, &p) in pods.iter().enumerate() {
        let color = POD_COLORS[i % POD_COLORS.len()];
        let name = &specs[p].name;
        lines.push(Line {
            label: format!("{name} requested"),
            color: color.mix(0.45).to_rgba().into_rgb(),
            dashed: false,
            points: thin(&record.times, &per_second(&record.demand[p])),
        });
        lines.push(Line {
            label: format!("{name} admitted"),
            color,
            dashed: false,
            points: thin(&record.times, &per_second(&record.admitted[p])),
        });
        lines.push(Line {
            label: format!("{name} ideal"),
            color,
            dashed: true,
            points: thin(&ideal.times, &per_second(&ideal.admitted[p])),
        });
    }
    lines
}

trait IntoRgb {
    fn into_rgb(self) -> RGBColor;
}

impl IntoRgb for RGBAColor {
    /// Blends onto white, so a light line stays light without transparency.
    fn into_rgb(self) -> RGBColor {
        let RGBAColor(r, g, b, a) = self;
        let blend = |c: u8| (f64::from(c) * a + 255.0 * (1.0 - a)).round() as u8;
        RGBColor(blend(r), blend(g), blend(b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thinning_averages_groups_and_keeps_the_last_time() {
        let times: Vec<f64> = (1..=3000).map(f64::from).collect();
        let values = vec![2.0; 3000];
        let points = thin(&times, &values);
        assert!(points.len() <= MAX_POINTS);
        assert_eq!(points.last(), Some(&(3000.0, 2.0)));
        assert_eq!(thin(&[1.0, 2.0], &[3.0, 5.0]), vec![(1.0, 3.0), (2.0, 5.0)]);
    }
}
