//! `tollgate-sim`: runs workloads through the real algorithms in virtual
//! time, measures them against the ideal bucket, writes a report, and with
//! `--check` fails when a measure misses its threshold.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Context;
use clap::{Parser, Subcommand};
use tollgate_sim::engine::Policy;
use tollgate_sim::partitions::{self, Mode};
use tollgate_sim::workload::{Tree, Workload};
use tollgate_sim::{check, fuzz, organisation, plot, report, run_workload};

#[derive(Debug, Parser)]
#[command(name = "tollgate-sim", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run one workload under every policy (and both partition modes) and
    /// write its report.
    Run {
        /// The workload file (YAML).
        workload: PathBuf,
        #[command(flatten)]
        options: Options,
    },
    /// Run every workload of a directory into one report.
    Suite {
        /// Directory of workload files (*.yaml).
        #[arg(long, default_value = "sim/workloads")]
        workloads: PathBuf,
        #[command(flatten)]
        options: Options,
    },
    /// Draw workloads from seeds, run each under every policy, and sum the
    /// measures up (worst, p99 and median, with the seed of the worst).
    Fuzz(FuzzOptions),
}

#[derive(Debug, clap::Args)]
struct FuzzOptions {
    /// How many workloads: seeds `seed` to `seed + count - 1`.
    #[arg(long, default_value_t = 100)]
    count: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Write the summary here (`fuzz.md`) besides printing it, and every
    /// workload's measures (`fuzz.csv`).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write the worst workloads of each measure (and every one that breaks
    /// the stated bound) as YAML files into this directory, for `run`.
    #[arg(long)]
    emit: Option<PathBuf>,
    /// Exit with an error when a workload admits more than the stated
    /// bound of its faults over some 60 s window (`check::stated_bound`:
    /// without faults, with lost messages, around outages).
    #[arg(long)]
    check: bool,
    /// Threads [default: the machine's cores].
    #[arg(long)]
    threads: Option<usize>,
    /// Run only these policies (repeatable) [default: every one].
    #[arg(long = "policy", value_parser = parse_policy)]
    policies: Vec<Policy>,
    /// One seed in this many also draws an organisation workload, run
    /// under the checked policy and held (with `--check`) to the
    /// organisation's stated bound and its tenants' ceilings (0: none).
    #[arg(long, default_value_t = 5)]
    organisation_every: u64,
    /// Run only the organisation workloads.
    #[arg(long)]
    organisations_only: bool,
}

fn parse_policy(name: &str) -> Result<Policy, String> {
    Policy::ALL
        .into_iter()
        .find(|p| p.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = Policy::ALL.iter().map(|p| p.name()).collect();
            format!("unknown policy {name:?}; one of {}", names.join(", "))
        })
}

#[derive(Debug, clap::Args)]
struct Options {
    /// Directory for the report (summary.md and the plots); created if missing.
    #[arg(long)]
    out: PathBuf,
    /// Exit with an error when a measure misses its threshold.
    #[arg(long)]
    check: bool,
    /// Replace each workload's seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Cut each workload to at most this much virtual time (e.g. `2m`).
    #[arg(long, value_parser = humantime::parse_duration)]
    max_duration: Option<std::time::Duration>,
    /// Skip the plots (the summary only).
    #[arg(long)]
    no_plots: bool,
    /// Also write each workload's series as CSV (`NAME-series.csv`).
    #[arg(long)]
    csv: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

/// Returns false when `--check` found a miss.
fn run(cli: Cli) -> anyhow::Result<bool> {
    let (files, options, title) = match cli.command {
        Command::Fuzz(options) => return fuzz(&options),
        Command::Run { workload, options } => {
            let title = format!("Simulation of {}", workload.display());
            (vec![workload], options, title)
        }
        Command::Suite { workloads, options } => (
            workload_files(&workloads)?,
            options,
            "Simulation suite".to_string(),
        ),
    };
    let mut loaded = Vec::new();
    for file in &files {
        let mut workload = Workload::load(file)?;
        if let Some(seed) = options.seed {
            workload.seed = seed;
        }
        if let Some(max) = options.max_duration {
            workload.duration = workload.duration.min(max);
            workload.validate()?;
        }
        loaded.push(workload);
    }
    std::fs::create_dir_all(&options.out)
        .with_context(|| format!("create {}", options.out.display()))?;

    let mut sections = Vec::new();
    let mut failures = Vec::new();
    let mut organisations = false;
    for workload in loaded {
        let name = workload.name.clone();
        let pods = match &workload.organisation {
            Some(org) => Tree::new(org).nodes[0].pods.len(),
            None => workload.pod_specs().len(),
        };
        let duration = tollgate_sim::humantime_short(workload.duration);
        let mut section = String::new();
        let note = |checks: &[check::Check], failures: &mut Vec<String>| {
            for c in checks {
                let line = c.describe(&name);
                if c.failed() {
                    failures.push(line.clone());
                }
                if options.check {
                    eprintln!("{line}");
                }
            }
        };
        if workload.limits.is_some() {
            let started = Instant::now();
            let run = run_workload(workload.clone(), &Policy::ALL)?;
            let elapsed = started.elapsed();
            let plots = if options.no_plots {
                Vec::new()
            } else {
                plot::write_plots(&run, &options.out)?
            };
            if options.csv {
                let path = options.out.join(format!("{name}-series.csv"));
                std::fs::write(&path, report::series_csv(&run))
                    .with_context(|| format!("write {}", path.display()))?;
            }
            let checks = check::check(&run);
            note(&checks, &mut failures);
            eprintln!(
                "{name}: {pods} pods, {duration} virtual, {} policies + ideal in {:.2} s",
                run.runs.len(),
                elapsed.as_secs_f64()
            );
            section.push_str(&report::workload_section(&run, &plots, &checks));
        }
        if workload.organisation.is_some() {
            organisations = true;
            let started = Instant::now();
            let run = organisation::run(workload.clone(), &Policy::ALL)?;
            let elapsed = started.elapsed();
            let plots = if options.no_plots {
                Vec::new()
            } else {
                plot::write_organisation_plots(&run, &options.out)?
            };
            if options.csv {
                let path = options.out.join(format!("{name}-series.csv"));
                std::fs::write(&path, report::series_csv(&run.nodes[0]))
                    .with_context(|| format!("write {}", path.display()))?;
            }
            let checks = check::check_organisation(&run);
            note(&checks, &mut failures);
            eprintln!(
                "{name}: {} tenants, {pods} pods, {duration} virtual, {} policies + ideal in {:.2} s",
                run.tree.tenants().count(),
                run.runs.len(),
                elapsed.as_secs_f64()
            );
            section.push_str(&report::organisation_section(&run, &plots, &checks));
        }
        if let Some(spec) = &workload.partitions {
            let started = Instant::now();
            let run = partitions::run(&workload, &Mode::ALL)?;
            let elapsed = started.elapsed();
            let plots = if options.no_plots {
                Vec::new()
            } else {
                plot::write_partition_plots(&name, spec.limit, &run, &options.out)?
            };
            if options.csv {
                let path = options.out.join(format!("{name}-partitions.csv"));
                std::fs::write(&path, report::partition_series_csv(&run))
                    .with_context(|| format!("write {}", path.display()))?;
            }
            let checks = check::check_partitions(&workload, &run);
            note(&checks, &mut failures);
            eprintln!(
                "{name}: {pods} pods, {duration} virtual, partitions in {} modes in {:.2} s",
                run.runs.len(),
                elapsed.as_secs_f64()
            );
            section.push_str(&report::partition_section(
                &workload,
                &run,
                &plots,
                &checks,
                workload.limits.is_none(),
            ));
        }
        sections.push(section);
    }
    let summary = report::document_with(&title, &sections, &failures, organisations);
    let path = options.out.join("summary.md");
    std::fs::write(&path, summary).with_context(|| format!("write {}", path.display()))?;
    eprintln!("report: {}", path.display());
    if options.check && !failures.is_empty() {
        eprintln!("{} check(s) failed:", failures.len());
        for f in &failures {
            eprintln!("  {f}");
        }
        return Ok(false);
    }
    Ok(true)
}

/// Returns false when `--check` found a workload over the stated bound.
fn fuzz(options: &FuzzOptions) -> anyhow::Result<bool> {
    let seeds: Vec<u64> = (options.seed..options.seed.saturating_add(options.count)).collect();
    let threads = options.threads.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let started = Instant::now();
    let policies = if options.policies.is_empty() {
        Policy::ALL.to_vec()
    } else {
        options.policies.clone()
    };
    let outcomes = if options.organisations_only {
        Vec::new()
    } else {
        fuzz::run_corpus(&seeds, &policies, threads)?
    };
    let org_seeds = fuzz::organisation::seeds(&seeds, options.organisation_every);
    let org_outcomes = fuzz::organisation::run_corpus(&org_seeds, threads)?;
    let elapsed = started.elapsed();
    let mut summary = String::new();
    let mut over = Vec::new();
    if !outcomes.is_empty() {
        summary.push_str(&fuzz::summary(&outcomes, options.seed));
        over = fuzz::over_bound(&outcomes);
        summary.push_str(&fuzz::bound_section(&outcomes, &over));
    }
    let org_over = fuzz::organisation::over_held(&org_outcomes);
    if !org_outcomes.is_empty() {
        if !summary.is_empty() {
            summary.push_str("\n## Organisations\n\n");
        }
        summary.push_str(&fuzz::organisation::summary(&org_outcomes));
    }
    println!("{summary}");
    eprintln!(
        "{} workloads under {} policies and {} organisation workloads in {:.1} s on {threads} threads",
        outcomes.len(),
        policies.len(),
        org_outcomes.len(),
        elapsed.as_secs_f64()
    );
    if let Some(out) = &options.out {
        std::fs::create_dir_all(out).with_context(|| format!("create {}", out.display()))?;
        let path = out.join("fuzz.md");
        std::fs::write(&path, &summary).with_context(|| format!("write {}", path.display()))?;
        eprintln!("summary: {}", path.display());
        if !outcomes.is_empty() {
            let path = out.join("fuzz.csv");
            std::fs::write(&path, fuzz::csv(&outcomes))
                .with_context(|| format!("write {}", path.display()))?;
            eprintln!("per workload: {}", path.display());
        }
        if !org_outcomes.is_empty() {
            let path = out.join("fuzz-organisations.csv");
            std::fs::write(&path, fuzz::organisation::csv(&org_outcomes))
                .with_context(|| format!("write {}", path.display()))?;
            eprintln!("per organisation workload: {}", path.display());
        }
    }
    if let Some(dir) = &options.emit {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        let mut seeds = fuzz::worst_seeds(&outcomes);
        seeds.extend(over.iter().map(|o| o.seed));
        seeds.sort_unstable();
        seeds.dedup();
        for seed in &seeds {
            let generated = fuzz::generate(*seed)?;
            let path = dir.join(format!("fuzz-{seed}.yaml"));
            std::fs::write(&path, generated.workload.to_yaml()?)
                .with_context(|| format!("write {}", path.display()))?;
        }
        let mut org_seeds = fuzz::organisation::worst_seeds(&org_outcomes);
        org_seeds.extend(org_over.iter().map(|o| o.seed));
        org_seeds.sort_unstable();
        org_seeds.dedup();
        for seed in &org_seeds {
            let generated = fuzz::organisation::generate(*seed)?;
            let path = dir.join(format!("fuzz-org-{seed}.yaml"));
            std::fs::write(&path, generated.workload.to_yaml()?)
                .with_context(|| format!("write {}", path.display()))?;
        }
        eprintln!(
            "{} workloads written to {}",
            seeds.len() + org_seeds.len(),
            dir.display()
        );
    }
    let mut passed = true;
    if options.check && !over.is_empty() {
        eprintln!(
            "{} workload(s) admitted more than the stated bound: seeds {}",
            over.len(),
            over.iter()
                .map(|o| o.seed.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        passed = false;
    }
    if options.check && !org_over.is_empty() {
        eprintln!(
            "{} organisation workload(s) missed what is held of them (the organisation's stated bound, or a tenant's ceiling): seeds {}",
            org_over.len(),
            org_over
                .iter()
                .map(|o| o.seed.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        );
        passed = false;
    }
    Ok(passed)
}

fn workload_files(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("read workload directory {}", dir.display()))?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "yaml" || e == "yml"))
        .collect();
    files.sort();
    if files.is_empty() {
        anyhow::bail!("no workload files (*.yaml) in {}", dir.display());
    }
    Ok(files)
}
