//! Aggregating the runs of a workload (median, min, max, pass/miss) and printing them as one
//! table or JSON.

use serde::Serialize;

use super::{Check, Measurement, Target};

#[derive(Debug, Clone, Serialize)]
pub struct FigureSummary {
    pub name: String,
    pub unit: String,
    pub values: Vec<f64>,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub target: Option<String>,
    /// Whether the median meets the target; `None` when the figure has no target.
    pub pass: Option<bool>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FailedCheck {
    pub run: usize,
    #[serde(flatten)]
    pub check: Check,
}

#[derive(Debug, Clone, Serialize)]
pub struct WorkloadReport {
    pub workload: String,
    pub backend: String,
    pub runs_requested: usize,
    pub runs_completed: usize,
    /// `ok`, `correctness-failed`, `unsupported` (the product cannot do it yet) or `error`.
    pub status: String,
    /// Every check of every completed run passed, and at least one run completed.
    pub correctness_ok: bool,
    pub checks_passed: usize,
    pub failed_checks: Vec<FailedCheck>,
    pub figures: Vec<FigureSummary>,
    pub notes: Vec<String>,
    pub errors: Vec<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub quick: bool,
    pub backend: String,
    pub redis: bool,
    pub started_at_ms: i64,
    pub cores: usize,
    pub workloads: Vec<WorkloadReport>,
}

fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// Summarises one figure's values across runs.
pub fn summarize(
    name: &str,
    unit: &str,
    values: Vec<f64>,
    target: Option<Target>,
) -> FigureSummary {
    let mut sorted = values.clone();
    sorted.sort_by(f64::total_cmp);
    let med = median(&sorted);
    FigureSummary {
        name: name.into(),
        unit: unit.into(),
        median: med,
        min: sorted.first().copied().unwrap_or(0.0),
        max: sorted.last().copied().unwrap_or(0.0),
        values,
        target: target.map(Target::describe),
        pass: target.map(|t| t.met(med)),
    }
}

/// Folds the runs of one workload into its report.
pub fn aggregate(
    workload: &str,
    backend: &str,
    runs: Vec<anyhow::Result<Measurement>>,
) -> WorkloadReport {
    let runs_requested = runs.len();
    let mut errors = Vec::new();
    let mut completed = Vec::new();
    for (n, run) in runs.into_iter().enumerate() {
        match run {
            Ok(measurement) => completed.push((n + 1, measurement)),
            Err(err) => errors.push(format!("run {}: {err:#}", n + 1)),
        }
    }
    let mut order: Vec<(String, String, Option<Target>)> = Vec::new();
    for (_, m) in &completed {
        for f in &m.figures {
            if !order.iter().any(|(name, _, _)| *name == f.name) {
                order.push((f.name.clone(), f.unit.clone(), f.target));
            }
        }
    }
    let figures = order
        .into_iter()
        .map(|(name, unit, target)| {
            let values = completed
                .iter()
                .flat_map(|(_, m)| m.figures.iter().filter(|f| f.name == name).map(|f| f.value))
                .collect();
            summarize(&name, &unit, values, target)
        })
        .collect();
    let mut failed_checks = Vec::new();
    let mut checks_passed = 0;
    let mut notes = Vec::new();
    let mut unsupported = None;
    for (n, m) in &completed {
        for check in &m.checks {
            if check.ok {
                checks_passed += 1;
            } else {
                failed_checks.push(FailedCheck {
                    run: *n,
                    check: check.clone(),
                });
            }
        }
        for note in &m.notes {
            if !notes.contains(note) {
                notes.push(note.clone());
            }
        }
        if let Some(reason) = &m.unsupported {
            unsupported = Some(reason.clone());
        }
    }
    let correctness_ok = !completed.is_empty() && failed_checks.is_empty() && errors.is_empty();
    let status = if !errors.is_empty() && completed.is_empty() {
        "error"
    } else if let Some(reason) = unsupported {
        notes.push(format!("not yet supported: {reason}"));
        "unsupported"
    } else if !correctness_ok {
        "correctness-failed"
    } else {
        "ok"
    }
    .to_string();
    WorkloadReport {
        workload: workload.into(),
        backend: backend.into(),
        runs_requested,
        runs_completed: completed.len(),
        status,
        correctness_ok,
        checks_passed,
        failed_checks,
        figures,
        notes,
        errors,
    }
}

/// A number printed compactly: integers without decimals, small values with a few.
pub fn number(value: f64) -> String {
    if value.abs() >= 1000.0 || (value.fract() == 0.0 && value.abs() < 1e15) {
        format!("{value:.0}")
    } else if value.abs() >= 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.2}")
    }
}

/// The table: workload, backend, figure, median, min, max, target, result.
pub fn table(reports: &[WorkloadReport]) -> String {
    let mut rows: Vec<[String; 8]> = vec![[
        "workload".into(),
        "backend".into(),
        "figure".into(),
        "median".into(),
        "min".into(),
        "max".into(),
        "target".into(),
        "result".into(),
    ]];
    for report in reports {
        let verdict_of = |pass: Option<bool>| -> String {
            match report.status.as_str() {
                "unsupported" => "unsupported".into(),
                "error" => "error".into(),
                _ if !report.correctness_ok => "INCORRECT".into(),
                _ => match pass {
                    Some(true) => "pass".into(),
                    Some(false) => "MISS".into(),
                    None => "-".into(),
                },
            }
        };
        if report.figures.is_empty() {
            rows.push([
                report.workload.clone(),
                report.backend.clone(),
                "(no figures)".into(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                verdict_of(None),
            ]);
        }
        for figure in &report.figures {
            rows.push([
                report.workload.clone(),
                report.backend.clone(),
                if figure.unit.is_empty() {
                    figure.name.clone()
                } else {
                    format!("{} ({})", figure.name, figure.unit)
                },
                number(figure.median),
                number(figure.min),
                number(figure.max),
                figure.target.clone().unwrap_or_else(|| "-".into()),
                verdict_of(figure.pass),
            ]);
        }
    }
    let mut widths = [0usize; 8];
    for row in &rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for (n, row) in rows.iter().enumerate() {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(i, cell)| format!("{cell:<width$}", width = widths[i]))
            .collect();
        out.push_str(&format!("| {} |\n", cells.join(" | ")));
        if n == 0 {
            let rule: Vec<String> = widths.iter().map(|w| "-".repeat(*w)).collect();
            out.push_str(&format!("|-{}-|\n", rule.join("-|-")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::Figure;

    fn run(value: f64, ok: bool) -> anyhow::Result<Measurement> {
        Ok(Measurement {
            figures: vec![Figure {
                name: "rate".into(),
                unit: "tasks/s".into(),
                value,
                target: Some(Target::AtLeast(10.0)),
            }],
            checks: vec![Check {
                name: "c".into(),
                ok,
                detail: String::new(),
            }],
            ..Measurement::default()
        })
    }

    #[test]
    fn the_median_decides_pass_and_a_failed_check_fails_correctness() {
        let report = aggregate(
            "W1",
            "sqlite",
            vec![run(5.0, true), run(20.0, true), run(12.0, true)],
        );
        assert_eq!(report.figures[0].median, 12.0);
        assert_eq!((report.figures[0].min, report.figures[0].max), (5.0, 20.0));
        assert_eq!(report.figures[0].pass, Some(true));
        assert!(report.correctness_ok);
        assert_eq!(report.status, "ok");

        let report = aggregate("W1", "sqlite", vec![run(50.0, true), run(50.0, false)]);
        assert!(!report.correctness_ok);
        assert_eq!(report.status, "correctness-failed");
        assert!(table(&[report]).contains("INCORRECT"));

        let report = aggregate("W1", "sqlite", vec![Err(anyhow::anyhow!("boom"))]);
        assert_eq!(report.status, "error");
        assert!(!report.correctness_ok);
    }
}
