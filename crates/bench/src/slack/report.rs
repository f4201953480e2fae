//! The slack benchmark's figures: per scenario, flow-control setting and phase (idle, burst:
//! the warm-up left out), batch completions and tokens per second, harvest (batch throughput as
//! a share of the ungated run's), interactive TTFT and ITL p50/p99 and their ratio to
//! interactive alone; the table, and the targets judged on it.

use std::fmt::Write as _;

use inferq_sim::interactive::{Outcome, Sample};
use serde::Serialize;

use super::scenario::{phase_spans, Run};
use super::SlackOptions;

/// One scenario in one phase.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub scenario: String,
    pub router: super::Router,
    /// `idle`, `burst`, or `all` (every phase but the warm-up).
    pub phase: String,
    pub batch_per_s: f64,
    pub batch_tokens_per_s: f64,
    /// Batch throughput over the ungated run's (same setting, same phase).
    pub harvest: Option<f64>,
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub itl_p50_ms: Option<f64>,
    pub itl_p99_ms: Option<f64>,
    /// p99 TTFT over interactive alone's (same setting, same phase).
    pub ttft_p99_ratio: Option<f64>,
    pub itl_p99_ratio: Option<f64>,
    /// Interactive requests that failed (non-2xx or broken).
    pub interactive_failed: usize,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct SlackReport {
    pub settings: String,
    /// Output tokens of each batch request.
    pub batch_tokens: u64,
    pub rows: Vec<Row>,
    pub runs: Vec<Run>,
    /// `(phase name, start s, end s)` of the profile.
    pub phases: Vec<(String, f64, f64)>,
}

fn percentile(mut v: Vec<f64>, p: f64) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    Some(v[rank - 1])
}

/// The phase name of a sample's label (`burst#2` → `burst`).
fn phase_name(label: &str) -> &str {
    label.split('#').next().unwrap_or(label)
}

/// Batch results in `[from, to)` seconds, read off the timeline.
fn completions(run: &Run, from: f64, to: f64) -> f64 {
    let at = |t: f64| {
        run.timeline
            .iter()
            .take_while(|(s, _, _)| *s <= t)
            .last()
            .map_or(0, |(_, n, _)| *n) as f64
    };
    (at(to) - at(from)).max(0.0)
}

impl SlackReport {
    pub fn new(opts: &SlackOptions, runs: Vec<Run>) -> SlackReport {
        let phases = phase_spans(&opts.profile);
        let mut names: Vec<String> = phases
            .iter()
            .map(|(n, _, _)| n.clone())
            .filter(|n| n != "warmup")
            .collect();
        names.dedup();
        names.sort();
        names.dedup();
        names.push("all".into());
        let mut rows = Vec::new();
        for run in &runs {
            for name in &names {
                rows.push(row(opts, run, name, &phases));
            }
        }
        // Ratios against the references of the same setting and phase.
        let reference = |rows: &[Row], scenario: &str, fc: super::Router, phase: &str| {
            rows.iter()
                .find(|r| r.scenario == scenario && r.router == fc && r.phase == phase)
                .cloned()
        };
        let snapshot = rows.clone();
        for r in &mut rows {
            if let Some(alone) = reference(&snapshot, "interactive-alone", r.router, &r.phase) {
                r.ttft_p99_ratio = r.ttft_p99_ms.zip(alone.ttft_p99_ms).map(|(a, b)| a / b);
                r.itl_p99_ratio = r.itl_p99_ms.zip(alone.itl_p99_ms).map(|(a, b)| a / b);
            }
            if let Some(ungated) = reference(&snapshot, "ungated", r.router, &r.phase) {
                if ungated.batch_per_s > 0.0 && r.scenario != "interactive-alone" {
                    r.harvest = Some(r.batch_per_s / ungated.batch_per_s);
                }
            }
        }
        let settings = format!(
            "{} engines × {} sequences, ITL {} ms, time factor under load {}, prefill {} ms + {} ms/token; \
             interactive {} tokens, batch {} tokens, {} workers; phases: {}",
            opts.engine.pods,
            opts.engine.max_num_seqs,
            opts.engine.inter_token_latency_ms,
            opts.engine.time_factor_under_load,
            opts.engine.prefill_overhead_ms,
            opts.engine.prefill_time_per_token_ms,
            opts.interactive_tokens,
            opts.batch_tokens,
            opts.workers,
            opts.profile
                .phases
                .iter()
                .map(|p| format!("{} {:.0} s at {}/s", p.name, p.duration.as_secs_f64(), p.rate_per_s))
                .collect::<Vec<_>>()
                .join(", ")
        );
        SlackReport {
            settings,
            batch_tokens: opts.batch_tokens,
            rows,
            runs,
            phases,
        }
    }

    /// The table, then the targets.
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "bench-slack: {}", self.settings);
        let f = |v: Option<f64>, d: usize| v.map_or("-".to_owned(), |v| format!("{v:.d$}"));
        for fc in super::Router::ALL {
            let rows: Vec<&Row> = self.rows.iter().filter(|r| r.router == fc).collect();
            if rows.is_empty() {
                continue;
            }
            let _ = writeln!(
                out,
                "\n{}\n{:<36} {:<6} {:>8} {:>9} {:>8} {:>9} {:>9} {:>7} {:>8} {:>8} {:>7} {:>5}",
                fc.label(),
                "scenario",
                "phase",
                "batch/s",
                "tokens/s",
                "harvest",
                "TTFT p50",
                "TTFT p99",
                "×alone",
                "ITL p50",
                "ITL p99",
                "×alone",
                "fail"
            );
            for r in rows {
                let _ = writeln!(
                    out,
                    "{:<36} {:<6} {:>8.2} {:>9.0} {:>8} {:>9} {:>9} {:>7} {:>8} {:>8} {:>7} {:>5}",
                    r.scenario,
                    r.phase,
                    r.batch_per_s,
                    r.batch_tokens_per_s,
                    f(r.harvest, 2),
                    f(r.ttft_p50_ms, 0),
                    f(r.ttft_p99_ms, 0),
                    f(r.ttft_p99_ratio, 2),
                    f(r.itl_p50_ms, 1),
                    f(r.itl_p99_ms, 1),
                    f(r.itl_p99_ratio, 2),
                    r.interactive_failed
                );
            }
        }
        out.push_str(&self.evictions());
        out.push_str(&self.targets());
        out
    }

    /// Per scenario under eviction: evictions per second and the batch tokens they threw away
    /// (made before the eviction, made again later), as a share of the batch tokens completed.
    fn evictions(&self) -> String {
        let runs: Vec<&Run> = self
            .runs
            .iter()
            .filter(|r| r.router == super::Router::Evict && r.scenario != "interactive-alone")
            .collect();
        if runs.is_empty() {
            return String::new();
        }
        let mut out = String::from(
            "
evictions (router eviction on, whole run):
",
        );
        for run in runs {
            let done = run.timeline.last().map_or(0, |(_, n, _)| *n);
            let made = done as f64 * self.batch_tokens as f64;
            let share = if made > 0.0 {
                format!("{:.1} %", 100.0 * run.tokens_redone as f64 / made)
            } else {
                "-".to_owned()
            };
            let _ = writeln!(
                out,
                "  {:<36} {:>6} evictions, {:>5.2}/s, {:>8} batch tokens redone ({share} of those completed)",
                run.scenario,
                run.evictions,
                run.evictions as f64 / run.seconds.max(1e-9),
                run.tokens_redone
            );
        }
        out
    }

    /// The issues' targets, judged per router setting: `slack` with `signal_url` harvest ≥ 0.9
    /// within 2× p99 TTFT in every phase (1.5× with eviction); `slack` alone ≥ 0.8 within 3×.
    fn targets(&self) -> String {
        let mut out = String::from(
            "\ntargets (harvest over every phase; worst p99 TTFT ratio of idle and burst):\n",
        );
        let points = super::tradeoff::points(&self.rows);
        for fc in super::Router::ALL {
            for (scenario, harvest, ratio) in [
                ("slack + signal_url", 0.9, fc.slack_target_ratio()),
                ("slack alone", 0.8, 3.0),
                ("static (endpoint-scrape)", f64::NAN, f64::NAN),
                ("aimd", f64::NAN, f64::NAN),
            ] {
                let Some(point) = points
                    .iter()
                    .find(|p| p.scenario == scenario && p.router == fc)
                else {
                    continue;
                };
                let (h, worst) = (point.harvest, point.worst_ttft_p99_ratio);
                let verdict = if harvest.is_nan() {
                    String::new()
                } else if h >= harvest && worst <= ratio {
                    format!("  target harvest ≥ {harvest} within {ratio}×: met")
                } else {
                    format!("  target harvest ≥ {harvest} within {ratio}×: MISSED")
                };
                let _ = writeln!(
                    out,
                    "  {:<22} {:<26} harvest {:.2}, worst p99 TTFT ×{:.2}{verdict}",
                    fc.label(),
                    scenario,
                    h,
                    worst
                );
            }
        }
        out
    }
}

/// One scenario's figures in the phases named `name` (`all`: every phase but the warm-up).
fn row(opts: &SlackOptions, run: &Run, name: &str, phases: &[(String, f64, f64)]) -> Row {
    let in_phase = |phase: &str| {
        let p = phase_name(phase);
        p != "warmup" && (name == "all" || p == name)
    };
    let spans: Vec<&(String, f64, f64)> = phases.iter().filter(|(n, _, _)| in_phase(n)).collect();
    let seconds: f64 = spans.iter().map(|(_, a, b)| b - a).sum();
    let done: f64 = spans.iter().map(|(_, a, b)| completions(run, *a, *b)).sum();
    let batch_per_s = if seconds > 0.0 { done / seconds } else { 0.0 };
    let samples: Vec<&Sample> = run.samples.iter().filter(|s| in_phase(&s.phase)).collect();
    let ok = |s: &&&Sample| s.outcome == Outcome::Ok;
    let ttft: Vec<f64> = samples
        .iter()
        .filter(ok)
        .filter_map(|s| s.ttft_ms)
        .collect();
    let itl: Vec<f64> = samples
        .iter()
        .filter(ok)
        .filter_map(|s| s.mean_itl_ms)
        .collect();
    Row {
        scenario: run.scenario.clone(),
        router: run.router,
        phase: name.to_owned(),
        batch_per_s,
        batch_tokens_per_s: batch_per_s * opts.batch_tokens as f64,
        harvest: None,
        ttft_p50_ms: percentile(ttft.clone(), 0.5),
        ttft_p99_ms: percentile(ttft, 0.99),
        itl_p50_ms: percentile(itl.clone(), 0.5),
        itl_p99_ms: percentile(itl, 0.99),
        ttft_p99_ratio: None,
        itl_p99_ratio: None,
        interactive_failed: samples.iter().filter(|s| s.outcome != Outcome::Ok).count(),
    }
}
