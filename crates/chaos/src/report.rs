//! The chaos report: everything a run found, as JSON (for CI and for keeping) and as a
//! summary table on standard output. [`Report::failures`] lists every failed check; the run
//! passes when it is empty.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::history::Findings;
use super::inject::FaultRecord;
use super::races::RaceReport;
use super::ChaosSettings;

/// How one processor fared.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessorSummary {
    pub index: usize,
    /// Times it was started (1 + restarts after kills).
    pub starts: u32,
    /// Exits nobody asked for.
    pub unexpected_exits: Vec<String>,
    /// How the final SIGTERM went.
    pub final_stop: String,
}

/// A whole chaos run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub passed: bool,
    pub failures: Vec<String>,
    pub seed: u64,
    pub settings: ChaosSettings,
    /// Wall time of the whole run, start-up to verdict.
    pub wall_ms: u64,
    /// From the start of the workload to the last submit.
    pub submit_ms: u64,
    /// From the start of the workload to the end of the last fault.
    pub faults_ms: u64,
    /// From the end of faults to quiescence (`None`: not within the limit).
    pub quiesced_after_ms: Option<u64>,
    /// What could not be brought back after the last fault.
    pub restore_problems: Vec<String>,
    pub history: Findings,
    /// The simulator's counters: executions that ended in an injected 5xx, reset or hang
    /// explain part of the duplicate executions (the rest are redeliveries after lost leases).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gateway: Option<inferq_sim::SimStats>,
    pub faults: Vec<FaultRecord>,
    /// Faults carried out, by kind ([`super::schedule::Fault::kind`]); one that could not be
    /// carried out (its `outcome` is not `ok`) counts under `<kind>/failed`.
    pub faults_by_kind: BTreeMap<String, u64>,
    /// Entries of each result list at the end (cluster and Sentinel runs, which use two: one
    /// in the queue's slot, one in another).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub results_by_list: BTreeMap<String, u64>,
    pub processors: Vec<ProcessorSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub races: Option<RaceReport>,
    /// Redis AOF and processor logs (kept when the run fails or when asked).
    pub data_dir: String,
}

impl Report {
    /// Every failed check, from the history, the processors and the races.
    pub fn collect_failures(&mut self) {
        self.faults_by_kind = BTreeMap::new();
        for f in &self.faults {
            let kind = if f.outcome == "ok" {
                f.fault.kind().to_owned()
            } else {
                format!("{}/failed", f.fault.kind())
            };
            *self.faults_by_kind.entry(kind).or_default() += 1;
        }
        let mut out = self.history.failures();
        if self.quiesced_after_ms.is_none() && self.history.submitted > 0 {
            out.push("the system did not quiesce within the limit".to_owned());
        }
        out.extend(
            self.restore_problems
                .iter()
                .map(|p| format!("restore: {p}")),
        );
        for p in &self.processors {
            if !p.unexpected_exits.is_empty() {
                out.push(format!(
                    "processor {} exited by itself: {:?}",
                    p.index, p.unexpected_exits
                ));
            }
            if !p.final_stop.starts_with("exit 0") {
                out.push(format!(
                    "processor {} did not stop cleanly: {}",
                    p.index, p.final_stop
                ));
            }
        }
        if let Some(r) = &self.races {
            out.extend(r.failures());
        }
        self.passed = out.is_empty();
        self.failures = out;
    }

    /// The summary table.
    pub fn table(&self) -> String {
        let mut t = String::new();
        let s = |ms: u64| format!("{:.1} s", ms as f64 / 1000.0);
        let mut row = |label: &str, value: String| {
            let _ = writeln!(t, "  {label:<30}{value}");
        };
        let h = &self.history;
        if h.submitted > 0 {
            row("seed", self.seed.to_string());
            row("wall time", s(self.wall_ms));
            row(
                "phases",
                format!(
                    "submit {}, faults {}, quiescence {}",
                    s(self.submit_ms),
                    s(self.faults_ms),
                    self.quiesced_after_ms
                        .map_or_else(|| "NOT REACHED".to_owned(), s)
                ),
            );
            row(
                "submitted",
                format!(
                    "{} ({} accepted, {} uncertain of which {} have a result)",
                    h.submitted, h.accepted, h.uncertain, h.uncertain_with_result
                ),
            );
            if h.unreplicated > 0 || self.settings.redis != super::ChaosRedis::Standalone {
                row(
                    "not confirmed by a replica",
                    format!(
                        "{} (queued, replica wait timed out; {} have a result, {} lost: allowed)",
                        h.unreplicated, h.unreplicated_with_result, h.unreplicated_lost
                    ),
                );
            }
            if !self.results_by_list.is_empty() {
                let lists: Vec<String> = self
                    .results_by_list
                    .iter()
                    .map(|(k, n)| format!("{k}: {n}"))
                    .collect();
                row("results by list", lists.join(", "));
            }
            row("cancelled by the producer", h.cancelled.to_string());
            row("lost", h.lost.to_string());
            row(
                "duplicate terminal records",
                h.duplicate_terminal.to_string(),
            );
            row(
                "stranded",
                if h.stranded.is_empty() {
                    "0".to_owned()
                } else {
                    format!("{:?}", h.stranded)
                },
            );
            row(
                "stranded claims / staged",
                format!("{} / {}", h.stranded_claims, h.stranded_staged),
            );
            row("strays", h.strays.to_string());
            row(
                "dead letters",
                format!(
                    "{} ({} without result)",
                    h.dead_letters, h.dead_without_result
                ),
            );
            for (reason, n) in &h.dead_reasons {
                row("  dead letter reason", format!("{n} × {reason}"));
            }
            let outcomes: Vec<String> = h
                .outcomes
                .iter()
                .map(|(k, n)| format!("{k}: {n}"))
                .collect();
            row("outcomes", outcomes.join(", "));
            row(
                "gateway executions",
                format!(
                    "{} ({} ids more than once, {} duplicate executions, max {} of one id)",
                    h.executions,
                    h.ids_executed_more_than_once,
                    h.duplicate_executions,
                    h.max_executions_of_one_id
                ),
            );
            if let Some(g) = &self.gateway {
                row(
                    "gateway answers",
                    format!(
                        "{} 200, {} 5xx, {} resets, {} hangs, {} 429 (injected faults included)",
                        g.ok, g.server_error, g.resets, g.hangs, g.too_many_requests
                    ),
                );
            }
            let r = &h.redelivery;
            row(
                "redelivery after kill/stop",
                format!(
                    "{} orphaned, {} re-executed, {} not; p50 {}, p99 {}, slowest {}",
                    r.orphaned,
                    r.re_executed,
                    r.not_re_executed,
                    r.p50_ms.map_or_else(|| "-".to_owned(), s),
                    r.p99_ms.map_or_else(|| "-".to_owned(), s),
                    r.slowest.as_ref().map_or_else(
                        || "-".to_owned(),
                        |w| format!("{} ({} after fault #{})", s(w.ms), w.id, w.fault)
                    )
                ),
            );
            for p in &self.processors {
                row(
                    &format!("processor {}", p.index),
                    format!(
                        "{} starts, {} unexpected exits, final stop: {}",
                        p.starts,
                        p.unexpected_exits.len(),
                        p.final_stop
                    ),
                );
            }
            let kinds: Vec<String> = self
                .faults_by_kind
                .iter()
                .map(|(k, n)| format!("{k}: {n}"))
                .collect();
            row(
                "faults",
                format!("{} ({})", self.faults.len(), kinds.join(", ")),
            );
        }
        if let Some(r) = &self.races {
            row(
                "stale-owner races",
                format!(
                    "{} in {}: {} taken over, {} stale moves accepted, {} stale results, {} missing, {} duplicated",
                    r.races,
                    s(r.wall_ms),
                    r.taken_over,
                    r.stale_moves_accepted,
                    r.results_by_stale_owner,
                    r.missing,
                    r.duplicates
                ),
            );
        }
        if h.submitted > 0 {
            let _ = writeln!(t, "\nfault log");
            for f in &self.faults {
                let _ = writeln!(
                    t,
                    "  #{:<3} {:>7}  {}{}{}",
                    f.index,
                    s(f.at_ms),
                    f.label,
                    f.held.map(|n| format!(" [held {n}]")).unwrap_or_default(),
                    if f.outcome == "ok" {
                        String::new()
                    } else {
                        format!(" -> {}", f.outcome)
                    }
                );
            }
        }
        let _ = writeln!(t);
        if self.passed {
            let _ = writeln!(t, "PASS");
        } else {
            let _ = writeln!(t, "FAIL");
            for f in &self.failures {
                let _ = writeln!(t, "  {f}");
            }
        }
        t
    }
}
