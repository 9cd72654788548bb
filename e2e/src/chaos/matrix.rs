//! The catch matrix: every negative control under several seeds, each run
//! the ordinary one (same schedule, cluster and order count) with one switch
//! set — and the ordinary run itself under each seed, which must pass.

use std::fmt::Write as _;

use serde::Serialize;

use super::{ChaosConfig, LayerOff, Report};

/// One cell: a switch (or none) under a seed.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Cell {
    /// The seed.
    pub seed: u64,
    /// The switch set (`None`: the ordinary run).
    pub layer_off: Option<LayerOff>,
    /// Switch set: whether the audit showed the effect its layer guards.
    /// Ordinary run: whether it passed.
    pub ok: bool,
    /// The invariants the run broke, with how many problems named each.
    pub broken: Vec<String>,
    /// Switch set: the checks that caught it ([`LayerOff::caught_by`]).
    #[serde(default)]
    pub caught_by: Vec<String>,
    /// Why the run's schedule was not a valid one (empty: valid). A cell
    /// counts only when valid.
    #[serde(default)]
    pub invalid: Vec<String>,
    /// Seconds from the start of the load to the first evidence of the
    /// invariant the switch must break (`None`: not seen, or the ordinary run).
    pub first_seen_s: Option<f64>,
    /// The first problem, as evidence.
    pub evidence: Option<String>,
    /// The run did not complete (its error).
    pub error: Option<String>,
}

impl Cell {
    /// The cell of a finished run.
    pub fn of(report: &Report) -> Self {
        let invariant = report.layer_off.map(|l| l.expected().invariant);
        let first_seen_s = invariant
            .and_then(|i| report.audit.first_seen.get(i))
            .map(|at| (*at - report.started_at).num_milliseconds() as f64 / 1000.0);
        Self {
            seed: report.seed,
            layer_off: report.layer_off,
            ok: report.valid() && report.caught().unwrap_or_else(|| report.passed()),
            caught_by: report
                .layer_off
                .map(|l| l.caught_by(&report.audit).into_iter().map(str::to_owned).collect())
                .unwrap_or_default(),
            invalid: report.invalid.clone(),
            broken: report.broken().iter().map(|(k, n)| format!("{k} ({n})")).collect(),
            first_seen_s,
            evidence: match (invariant, report.layer_off.and_then(LayerOff::ground_truth)) {
                // The line that states the layer's own effect, when it has one.
                (Some(_), Some(marker)) => report.problems.iter().find(|p| p.contains(marker)).cloned(),
                (Some(i), None) => report.problems.iter().find(|p| p.starts_with(i)).cloned(),
                (None, _) => report.problems.first().cloned(),
            },
            error: None,
        }
    }
}

/// Runs the ordinary run and every switch under `seeds`, one after another,
/// each from `base` (its seed and switch replaced); `each` sees every cell
/// as it is done.
pub async fn run(base: &ChaosConfig, seeds: &[u64], mut each: impl FnMut(&Cell)) -> Vec<Cell> {
    let mut cells = Vec::new();
    for &seed in seeds {
        for layer_off in std::iter::once(None).chain(LayerOff::ALL.map(Some)) {
            let mut cfg = base.clone();
            cfg.seed = seed;
            cfg.layer_off = layer_off;
            cfg.report_dir = base
                .report_dir
                .as_ref()
                .map(|d| d.join(format!("seed-{seed}-{}", layer_off.map_or("ordinary", LayerOff::name))));
            let cell = match super::run(&cfg).await {
                Ok(report) => Cell::of(&report),
                Err(e) => Cell {
                    seed,
                    layer_off,
                    ok: false,
                    broken: vec![],
                    caught_by: vec![],
                    invalid: vec![],
                    first_seen_s: None,
                    evidence: None,
                    error: Some(format!("{e:#}")),
                },
            };
            each(&cell);
            cells.push(cell);
        }
    }
    cells
}

/// The matrix as a markdown table: a row per switch, a column per seed.
pub fn markdown(cells: &[Cell]) -> String {
    let mut seeds: Vec<u64> = cells.iter().map(|c| c.seed).collect();
    seeds.dedup();
    let mut s = String::new();
    let _ = write!(s, "| switch |");
    for seed in &seeds {
        let _ = write!(s, " seed {seed} |");
    }
    let _ = writeln!(s, "\n|---|{}", "---|".repeat(seeds.len()));
    for layer_off in std::iter::once(None).chain(LayerOff::ALL.map(Some)) {
        let _ = write!(
            s,
            "| {} |",
            layer_off.map_or("(none: the ordinary run)", LayerOff::name)
        );
        for seed in &seeds {
            let cell = cells.iter().find(|c| c.seed == *seed && c.layer_off == layer_off);
            let text = match cell {
                None => "—".to_owned(),
                Some(c) if c.error.is_some() => "ERROR".to_owned(),
                Some(c) if c.layer_off.is_none() => if c.ok { "passed" } else { "FAILED" }.to_owned(),
                Some(c) if !c.invalid.is_empty() => "INVALID".to_owned(),
                Some(c) if c.ok => format!(
                    "caught: {} ({}){}",
                    c.layer_off.expect("a switch").expected().invariant,
                    c.caught_by.join("; "),
                    c.first_seen_s
                        .map(|t| format!(", first at {t:.0} s"))
                        .unwrap_or_default()
                ),
                Some(_) => "NOT CAUGHT".to_owned(),
            };
            let _ = write!(s, " {text} |");
        }
        let _ = writeln!(s);
    }
    s
}

/// A seed for a test run: `CHAOS_SEED` when set (a replay), else one
/// that changes from run to run. Printed by the caller with its replay line.
pub fn seed_from_env_or_clock() -> u64 {
    std::env::var("CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs() % 1_000_000)
        })
}
