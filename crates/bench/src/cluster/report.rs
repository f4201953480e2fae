//! The cluster section's figures and its table: each drain's requests/s, Redis CPU per request
//! on every master and in all, commands per request, the census (top-level and cross-slot
//! commands per request), the capacity projection, and the cost of a replica wait. In come the
//! readings of [`super::drain`] and [`super::replica`]; out go `cluster` in `bench.json` and the
//! lines [`ClusterSection::print`] writes.

use std::collections::BTreeMap;

use serde::Serialize;

use super::monitor::Tally;

/// Where one queue and its result lists live on the cluster.
#[derive(Debug, Clone, Serialize)]
pub struct Placement {
    pub queue: String,
    pub slot: u16,
    /// The port of the master serving the queue.
    pub master: u16,
    /// The list in the queue's slot (`{queue}:results`).
    pub tagged_list: String,
    /// The list in another slot, served by another master.
    pub apart_list: String,
    pub apart_list_slot: u16,
    pub apart_list_master: u16,
}

/// One master's share of a drain.
#[derive(Debug, Clone, Serialize)]
pub struct MasterCost {
    pub port: u16,
    /// The queues whose slot it serves.
    pub queues: Vec<String>,
    /// Its CPU (INFO cpu: user + sys, its children's included) over the drain, per request
    /// drained in all.
    pub cpu_us_per_request: f64,
    /// The same CPU per request of its own queues: what one request costs the master that
    /// serves it (`None` when it serves none).
    pub cpu_us_per_own_request: Option<f64>,
    /// INFO commandstats calls per request drained (inside scripts included, admin left out).
    pub calls_per_request: f64,
}

/// The census of a drain under MONITOR (not timed).
#[derive(Debug, Clone, Serialize)]
pub struct Census {
    pub requests: u64,
    /// Commands clients sent (a script's EVALSHA one, its insides none), admin left out.
    pub top_level_per_request: f64,
    pub inside_scripts_per_request: f64,
    /// Top-level commands whose key is in another slot than their queue's.
    pub cross_slot_per_request: f64,
    /// The same, by kind of key: `result lists`, `producer markers`, `other`.
    pub cross_slot_by_kind: BTreeMap<String, f64>,
    /// Cross-slot commands served by another master than their queue's.
    pub cross_node_per_request: f64,
    pub top_level_by_command: BTreeMap<String, u64>,
}

impl Census {
    pub fn over(t: Tally, requests: u64) -> Census {
        let per = |n: u64| n as f64 / requests.max(1) as f64;
        let cross: u64 = t.cross_slot.values().sum();
        Census {
            requests,
            top_level_per_request: per(t.top_level.values().sum()),
            inside_scripts_per_request: per(t.inside_scripts),
            cross_slot_per_request: per(cross),
            cross_slot_by_kind: t
                .cross_slot
                .iter()
                .map(|(k, &v)| (k.clone(), per(v)))
                .collect(),
            cross_node_per_request: per(t.cross_node),
            top_level_by_command: t.top_level,
        }
    }

    /// Cross-slot commands per request on one kind of key (0 when there were none).
    pub fn cross_slot(&self, kind: &str) -> f64 {
        self.cross_slot_by_kind.get(kind).copied().unwrap_or(0.0)
    }
}

/// One drain of the section.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterRun {
    /// `standalone`, `cluster, lists tagged` or `cluster, lists apart`.
    pub label: String,
    pub cluster: bool,
    /// Whether each result list carries its queue's tag (the one-script finish).
    pub lists_tagged: bool,
    pub n: u64,
    /// Every result was on its list when the drain ended.
    pub results: u64,
    /// From starting `inferq run` to the last result.
    pub seconds: f64,
    pub requests_per_s: f64,
    /// From starting `inferq run` until its work after the last result was done too (on a
    /// cluster the producer's markers are cleared, and staged results dropped, after the result
    /// is on its list): the rate the drain can keep up. The CPU and calls cover this span.
    pub seconds_settled: f64,
    pub requests_per_s_settled: f64,
    pub masters: Vec<MasterCost>,
    /// Every master's CPU per request, summed: what one request costs Redis.
    pub redis_cpu_us_per_request: f64,
    /// The dearest master's CPU per request of its own queues (see [`MasterCost`]).
    pub max_cpu_us_per_own_request: f64,
    /// INFO commandstats calls per request over every master (inside scripts included; admin
    /// commands and the bench's own LLEN polls left out), and the script calls among them.
    pub calls_per_request: f64,
    pub script_calls_per_request: f64,
    pub census: Census,
}

/// requests/s with k masters, each spending one core.
#[derive(Debug, Clone, Serialize)]
pub struct Projection {
    pub label: String,
    /// The per-master cost it rests on: µs of one master's CPU per request it serves.
    pub us_per_request_per_master: f64,
    /// `(k, requests/s)`.
    pub requests_per_s: Vec<(u32, f64)>,
}

/// One `inferq submit` of N requests.
#[derive(Debug, Clone, Serialize)]
pub struct Submit {
    pub replica_wait: u32,
    pub seconds: f64,
    pub requests_per_s: f64,
    pub us_per_request: f64,
}

/// `inferq submit --replica-wait 1` against a primary with one replica, and without the wait,
/// in the same run.
#[derive(Debug, Clone, Serialize)]
pub struct ReplicaWaitCost {
    pub n: u64,
    /// Requests per pipelined batch (`submit --batch`): one `WAIT` each.
    pub batch: u64,
    pub runs: Vec<Submit>,
    /// What waiting added per request.
    pub extra_us_per_request: f64,
}

/// The cluster section, or why there is none.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterSection {
    pub measured: bool,
    pub skipped_because: Option<String>,
    pub n: u64,
    pub masters: usize,
    pub queues: Vec<Placement>,
    pub runs: Vec<ClusterRun>,
    pub projections: Vec<Projection>,
    pub projection_assumes: String,
    pub replica_wait: Option<ReplicaWaitCost>,
}

/// The masters counts each projection is given for.
pub const PROJECTED_MASTERS: [u32; 3] = [3, 6, 12];

/// What the projection takes for granted.
pub const ASSUMES: &str = "Redis runs one command at a time, so a master saturates at one core; \
    every master gets a core of its own and an even share of the queues (at least one queue per \
    master); the processors and gateways are scaled out on other machines. The dearest master's \
    CPU per request it serves sets the bound. This machine's 2 cores cannot show it.";

impl ClusterSection {
    pub fn skipped(reason: String) -> ClusterSection {
        ClusterSection {
            measured: false,
            skipped_because: Some(reason),
            n: 0,
            masters: 0,
            queues: Vec::new(),
            runs: Vec::new(),
            projections: Vec::new(),
            projection_assumes: ASSUMES.to_owned(),
            replica_wait: None,
        }
    }

    /// The section from its drains: the projections come from each run's dearest master (the
    /// standalone run: its one server, k = 1 only).
    pub fn measured(
        n: u64,
        queues: Vec<Placement>,
        runs: Vec<ClusterRun>,
        replica_wait: Option<ReplicaWaitCost>,
    ) -> ClusterSection {
        let masters = runs
            .iter()
            .filter(|r| r.cluster)
            .map(|r| r.masters.len())
            .max()
            .unwrap_or(0);
        let projections = runs
            .iter()
            .map(|r| {
                let us = r.max_cpu_us_per_own_request;
                let ks: &[u32] = if r.cluster { &PROJECTED_MASTERS } else { &[1] };
                Projection {
                    label: r.label.clone(),
                    us_per_request_per_master: us,
                    requests_per_s: ks
                        .iter()
                        .map(|&k| {
                            (
                                k,
                                if us > 0.0 {
                                    f64::from(k) * 1e6 / us
                                } else {
                                    0.0
                                },
                            )
                        })
                        .collect(),
                }
            })
            .collect();
        ClusterSection {
            measured: true,
            skipped_because: None,
            n,
            masters,
            queues,
            runs,
            projections,
            projection_assumes: ASSUMES.to_owned(),
            replica_wait,
        }
    }

    /// The section's lines of the table.
    pub fn print(&self) {
        if !self.measured {
            println!(
                "cluster: skipped ({})",
                self.skipped_because.as_deref().unwrap_or("")
            );
            return;
        }
        println!(
            "cluster: {} requests through sim by one inferq run, over {} queues on {} masters (AOF everysec, no replicas), beside a standalone Redis",
            self.n,
            self.queues.len(),
            self.masters
        );
        for q in &self.queues {
            println!(
                "  {:<6} slot {:>5} on :{}; tagged list {} (same slot), apart list {} (slot {} on :{})",
                q.queue,
                q.slot,
                q.master,
                q.tagged_list,
                q.apart_list,
                q.apart_list_slot,
                q.apart_list_master
            );
        }
        println!(
            "  {:<22} {:>8} {:>8} {:>26} {:>9} {:>10} {:>9} {:>10} {:>11} {:>10} {:>11}",
            "",
            "req/s",
            "settled",
            "redis µs/req per master",
            "sum µs",
            "calls/req",
            "evals/req",
            "top-level",
            "cross-slot",
            "(lists)",
            "other node"
        );
        for r in &self.runs {
            let per: Vec<String> = r
                .masters
                .iter()
                .map(|m| format!("{:.1}", m.cpu_us_per_request))
                .collect();
            println!(
                "  {:<22} {:>8.0} {:>8.0} {:>26} {:>9.1} {:>10.2} {:>9.3} {:>10.2} {:>11.3} {:>10.3} {:>11.3}",
                r.label,
                r.requests_per_s,
                r.requests_per_s_settled,
                per.join(" / "),
                r.redis_cpu_us_per_request,
                r.calls_per_request,
                r.script_calls_per_request,
                r.census.top_level_per_request,
                r.census.cross_slot_per_request,
                r.census.cross_slot("result lists"),
                r.census.cross_node_per_request
            );
        }
        println!(
            "  (req/s: to the last result; settled: until the processor's work after it is done too; µs: INFO cpu of each master from start to settled, per request drained; calls: INFO commandstats, inside scripts included; top-level and cross-slot: MONITOR census of {} requests, cross-slot = a command whose key is in another slot than its queue's, (lists) = on result lists, the rest are the producer's request-active/request-cancel markers; other node = cross-slot commands served by another master than the queue's)",
            self.runs.first().map_or(0, |r| r.census.requests)
        );
        for p in &self.projections {
            let rates: Vec<String> = p
                .requests_per_s
                .iter()
                .map(|(k, rps)| format!("k={k}: {rps:.0}"))
                .collect();
            println!(
                "  capacity, {:<22} {:.1} µs per request on its master -> req/s ≈ k × 1e6 / {:.1}: {}",
                p.label,
                p.us_per_request_per_master,
                p.us_per_request_per_master,
                rates.join(", ")
            );
        }
        println!("  (assumes: {})", self.projection_assumes);
        if let Some(w) = &self.replica_wait {
            let runs: Vec<String> = w
                .runs
                .iter()
                .map(|s| {
                    format!(
                        "--replica-wait {}: {:.0} req/s ({:.1} µs/req)",
                        s.replica_wait, s.requests_per_s, s.us_per_request
                    )
                })
                .collect();
            println!(
                "  inferq submit of {} requests to a primary with one replica, batches of {}: {}; the wait adds {:.1} µs per request",
                w.n,
                w.batch,
                runs.join(", "),
                w.extra_us_per_request
            );
        }
    }
}
