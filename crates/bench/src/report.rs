//! The run's report: every phase's figures, the machine and settings, and the targets
//! judged against them. In come the phases' results; out go a table on standard output
//! ([`Report::print_table`]) and `bench.json` ([`Report::write_json`]).

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::bullmq::BullmqDrain;
use super::ceiling::Ceiling;
use super::census::Census;
use super::cluster::report::ClusterSection;
use super::drain::Drain;
use super::measure::Machine;
use super::open_loop::OpenLoop;
use super::placement::Split;
use super::procs::GatewayKind;
use super::redelivery::Redelivery;
use super::{BenchError, BenchOptions};

/// How the processors and Redis were configured.
#[derive(Debug, Clone, Serialize)]
pub struct Settings {
    /// "quick" or "full".
    pub profile: String,
    /// The command line that produced the report.
    pub command: String,
    pub concurrency: u32,
    pub poll_interval_ms: u64,
    pub batch_size: u32,
    pub redis_appendfsync: &'static str,
    pub open_loop_seconds: f64,
    pub ceiling_seconds: f64,
    pub lease_s: u64,
    pub reclaim_interval_ms: u64,
    pub extra_run_args: Vec<String>,
}

impl Settings {
    pub fn from_options(o: &BenchOptions) -> Settings {
        Settings {
            profile: o.profile.clone(),
            command: o.command.clone(),
            concurrency: o.concurrency,
            poll_interval_ms: o.poll_interval_ms,
            batch_size: o.batch_size,
            redis_appendfsync: "everysec",
            open_loop_seconds: o.open_loop.as_secs_f64(),
            ceiling_seconds: o.ceiling.as_secs_f64(),
            lease_s: o.lease_s,
            reclaim_interval_ms: o.reclaim_interval_ms,
            extra_run_args: o.run_args.clone(),
        }
    }
}

/// One gateway's own ceiling.
#[derive(Debug, Clone, Serialize)]
pub struct Ceilings {
    pub gateway: GatewayKind,
    pub ceiling: Ceiling,
}

/// inferq against BullMQ at one N, both through the node gateway.
#[derive(Debug, Clone, Serialize)]
pub struct Ratio {
    pub n: u64,
    pub inferq_requests_per_s: f64,
    pub bullmq_jobs_per_s: f64,
    pub inferq_over_bullmq: f64,
    /// CPU microseconds per request, worker + redis-server + gateway: inferq's and BullMQ's.
    pub inferq_cpu_us: Option<f64>,
    pub bullmq_cpu_us: Option<f64>,
    /// BullMQ's CPU per job over inferq's per request: how much less of the machine inferq
    /// needs for the same work, whatever the machine's core count.
    pub bullmq_cpu_over_inferq: Option<f64>,
}

/// BullMQ's drains, or why there are none.
#[derive(Debug, Clone, Serialize)]
pub struct BullmqSection {
    pub measured: bool,
    pub skipped_because: Option<String>,
    pub drains: Vec<BullmqDrain>,
    pub ratios: Vec<Ratio>,
}

impl BullmqSection {
    pub fn skipped(reason: String) -> BullmqSection {
        BullmqSection {
            measured: false,
            skipped_because: Some(reason),
            drains: Vec::new(),
            ratios: Vec::new(),
        }
    }

    pub fn measured(drains: Vec<BullmqDrain>, ours: &[Drain]) -> BullmqSection {
        let ratios = drains
            .iter()
            .filter_map(|b| {
                let d = ours
                    .iter()
                    .find(|d| d.gateway == GatewayKind::Node && d.n == b.n)?;
                Some(Ratio {
                    n: b.n,
                    inferq_requests_per_s: d.requests_per_s,
                    bullmq_jobs_per_s: b.jobs_per_s,
                    inferq_over_bullmq: d.requests_per_s / b.jobs_per_s,
                    inferq_cpu_us: d.machine_cpu_us(),
                    bullmq_cpu_us: b.machine_cpu_us(),
                    bullmq_cpu_over_inferq: match (b.machine_cpu_us(), d.machine_cpu_us()) {
                        (Some(theirs), Some(ours)) if ours > 0.0 => Some(theirs / ours),
                        _ => None,
                    },
                })
            })
            .collect();
        BullmqSection {
            measured: true,
            skipped_because: None,
            drains,
            ratios,
        }
    }
}

/// The drains again in the split placement: the gateway on CPUs of its own, redis-server and
/// the worker on the others (see `placement`). Not how the targets are measured: they
/// come from the shared placement above.
#[derive(Debug, Clone, Serialize)]
pub struct SplitSection {
    pub measured: bool,
    pub skipped_because: Option<String>,
    /// The CPUs of redis-server and the worker, and the gateway's (`taskset` lists).
    pub queue_cpus: Option<String>,
    pub gateway_cpus: Option<String>,
    pub drains: Vec<Drain>,
    pub bullmq: BullmqSection,
}

impl SplitSection {
    pub fn skipped(reason: String) -> SplitSection {
        SplitSection {
            measured: false,
            skipped_because: Some(reason.clone()),
            queue_cpus: None,
            gateway_cpus: None,
            drains: Vec::new(),
            bullmq: BullmqSection::skipped(reason),
        }
    }

    pub fn measured(split: &Split, drains: Vec<Drain>, bullmq: BullmqSection) -> SplitSection {
        SplitSection {
            measured: true,
            skipped_because: None,
            queue_cpus: Some(split.queue.clone()),
            gateway_cpus: Some(split.gateway.clone()),
            drains,
            bullmq,
        }
    }
}

/// One drain by fleets of processors sharing the run's workers on one queue, through the
/// simulator: what instances racing for the same requests cost (not one of the issue's
/// targets).
#[derive(Debug, Clone, Serialize)]
pub struct FleetSection {
    pub measured: bool,
    pub skipped_because: Option<String>,
    pub n: u64,
    pub drains: Vec<Drain>,
}

impl FleetSection {
    pub fn skipped(reason: String) -> FleetSection {
        FleetSection {
            measured: false,
            skipped_because: Some(reason),
            n: 0,
            drains: Vec::new(),
        }
    }

    pub fn measured(n: u64, drains: Vec<Drain>) -> FleetSection {
        FleetSection {
            measured: true,
            skipped_because: None,
            n,
            drains,
        }
    }
}

/// One target of the issue and how this run did.
#[derive(Debug, Clone, Serialize)]
pub struct Target {
    pub name: String,
    pub target: String,
    pub measured: String,
    /// `None` when the run could not measure it.
    pub pass: Option<bool>,
}

/// Everything one run measured.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub inferq_version: &'static str,
    pub machine: Machine,
    pub settings: Settings,
    pub gateway_ceilings: Vec<Ceilings>,
    pub drains: Vec<Drain>,
    /// Top-level commands vs commands inside scripts (a small drain under MONITOR).
    pub command_census: Census,
    pub bullmq: BullmqSection,
    pub split: SplitSection,
    pub fleet: FleetSection,
    /// Queues spread over a 3-master cluster against one server (not one of the targets).
    pub cluster: ClusterSection,
    pub open_loop: Vec<OpenLoop>,
    pub redelivery: Redelivery,
    pub targets: Vec<Target>,
    pub seconds_total: f64,
}

impl Report {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        machine: Machine,
        settings: Settings,
        gateway_ceilings: Vec<Ceilings>,
        drains: Vec<Drain>,
        command_census: Census,
        bullmq: BullmqSection,
        split: SplitSection,
        fleet: FleetSection,
        cluster: ClusterSection,
        open_loop: Vec<OpenLoop>,
        redelivery: Redelivery,
        took: Duration,
    ) -> Report {
        let mut report = Report {
            inferq_version: env!("CARGO_PKG_VERSION"),
            machine,
            settings,
            gateway_ceilings,
            drains,
            command_census,
            bullmq,
            split,
            fleet,
            cluster,
            open_loop,
            redelivery,
            targets: Vec::new(),
            seconds_total: took.as_secs_f64(),
        };
        report.targets = report.judge();
        report
    }

    /// The targets against this run's figures.
    fn judge(&self) -> Vec<Target> {
        let mut t = Vec::new();
        let min = |xs: Vec<f64>| xs.into_iter().reduce(f64::min);
        let max = |xs: Vec<f64>| xs.into_iter().reduce(f64::max);

        let vs_bullmq = min(self
            .bullmq
            .ratios
            .iter()
            .map(|r| r.inferq_over_bullmq)
            .collect());
        t.push(Target {
            name: "drain vs BullMQ (node gateway, same Redis)".into(),
            target: ">= 3.0x".into(),
            measured: match vs_bullmq {
                Some(r) => format!("{r:.2}x (lowest over N)"),
                None => format!(
                    "not measured: {}",
                    self.bullmq.skipped_because.as_deref().unwrap_or("no ratio")
                ),
            },
            pass: vs_bullmq.map(|r| r >= 3.0),
        });
        for c in &self.gateway_ceilings {
            let ratio = min(self
                .drains
                .iter()
                .filter(|d| d.gateway == c.gateway)
                .filter_map(|d| d.ratio_to_gateway_ceiling)
                .collect());
            t.push(Target {
                name: format!("drain vs {} gateway's own ceiling", c.gateway.name()),
                target: ">= 60%".into(),
                measured: ratio.map_or("-".into(), |r| {
                    format!(
                        "{:.0}% (lowest over N; ceiling {:.0} req/s)",
                        r * 100.0,
                        c.ceiling.requests_per_s
                    )
                }),
                pass: ratio.map(|r| r >= 0.6),
            });
        }
        let at_1k = self
            .open_loop
            .iter()
            .min_by_key(|o| o.offered_rps.abs_diff(1000));
        let label = at_1k.map_or("-".to_owned(), |o| format!("{}/s", o.offered_rps));
        t.push(Target {
            name: format!("enqueue->dispatch p50 at {label}"),
            target: "<= 5 ms".into(),
            measured: at_1k.map_or("-".into(), |o| {
                format!("{:.2} ms", o.enqueue_to_dispatch.p50_ms)
            }),
            pass: at_1k
                .map(|o| o.enqueue_to_dispatch.samples > 0 && o.enqueue_to_dispatch.p50_ms <= 5.0),
        });
        t.push(Target {
            name: format!("enqueue->dispatch p99 at {label}"),
            target: "<= 50 ms".into(),
            measured: at_1k.map_or("-".into(), |o| {
                format!("{:.2} ms", o.enqueue_to_dispatch.p99_ms)
            }),
            pass: at_1k
                .map(|o| o.enqueue_to_dispatch.samples > 0 && o.enqueue_to_dispatch.p99_ms <= 50.0),
        });
        let calls = max(self.drains.iter().map(|d| d.commands.per_request).collect());
        let scripts = max(self
            .drains
            .iter()
            .map(|d| d.commands.script_calls_per_request)
            .collect());
        let census = &self.command_census;
        t.push(Target {
            name: "Redis commands sent per completed request (top level)".into(),
            target: "<= 3".into(),
            measured: format!(
                "{:.2} (MONITOR census of {} requests)",
                census.top_level_per_request, census.requests
            ),
            pass: Some(census.top_level_per_request <= 3.0),
        });
        t.push(Target {
            name: "Redis calls per completed request (all, incl. inside scripts)".into(),
            target: "<= 3".into(),
            measured: match (calls, scripts) {
                (Some(c), Some(s)) => format!("{c:.2} (highest over drains; {s:.3} script calls)"),
                _ => "-".into(),
            },
            pass: calls.map(|c| c <= 3.0),
        });
        let largest = self.drains.iter().map(|d| d.n).max();
        let rss = max(self
            .drains
            .iter()
            .filter(|d| Some(d.n) == largest)
            .map(|d| d.peak_rss_mib)
            .collect());
        t.push(Target {
            name: format!(
                "processor peak RSS on the {} drain",
                largest.map_or("-".into(), |n| n.to_string())
            ),
            target: "<= 64 MiB".into(),
            measured: rss.map_or("-".into(), |r| format!("{r:.1} MiB")),
            pass: rss.map(|r| r <= 64.0),
        });
        let r = &self.redelivery;
        t.push(Target {
            name: format!("redelivery after kill -9 ({} s lease)", r.lease_s),
            target: "<= 3.5 s".into(),
            measured: format!(
                "max {:.2} s, p50 {:.2} s ({} of {} redelivered)",
                r.max_s, r.p50_s, r.redelivered, r.requests
            ),
            pass: Some(r.redelivered == r.requests && r.max_s <= 3.5),
        });
        let per_1k: Vec<f64> = self
            .drains
            .iter()
            .filter(|d| Some(d.gateway) == self.drains.first().map(|d| d.gateway))
            .map(|d| d.cpu_s_per_1k)
            .collect();
        let spread = match (min(per_1k.clone()), max(per_1k.clone())) {
            (Some(lo), Some(hi)) if lo > 0.0 => Some(hi / lo),
            _ => None,
        };
        t.push(Target {
            name: "cost linear in N (CPU s per 1k requests, each N)".into(),
            target: "highest <= 1.5x lowest".into(),
            measured: per_1k
                .iter()
                .map(|c| format!("{c:.3}"))
                .collect::<Vec<_>>()
                .join(" / "),
            pass: spread.map(|s| s <= 1.5),
        });
        t
    }

    /// Prints the figures and the targets as aligned tables.
    pub fn print_table(&self) {
        let m = &self.machine;
        let s = &self.settings;
        println!();
        println!(
            "inferq-dev bench {} — {} cores, {}, {} MiB; {}; node {}",
            self.inferq_version,
            m.nproc,
            m.cpu_model,
            m.memory_mib,
            m.redis_server,
            m.node.as_deref().unwrap_or("absent")
        );
        println!(
            "{} profile: `{}`; processor: concurrency {}, poll {} ms, batch {}; Redis AOF appendfsync {}",
            s.profile, s.command, s.concurrency, s.poll_interval_ms, s.batch_size, s.redis_appendfsync
        );
        println!();
        println!(
            "gateway ceilings (in-process load generator, keep-alive, concurrency {})",
            s.concurrency
        );
        for c in &self.gateway_ceilings {
            println!(
                "  {:<6} {:>9.0} req/s",
                c.gateway.name(),
                c.ceiling.requests_per_s
            );
        }
        println!();
        println!(
            "drains    {:>7} {:>9} {:>8} {:>8} {:>10} {:>9} {:>11} {:>10} {:>9} {:>12} {:>10} {:>11} {:>9}",
            "N",
            "req/s",
            "seconds",
            "ceiling",
            "calls/req",
            "evals/req",
            "producer/req",
            "CPU s/1k",
            "peak MiB",
            "redis CPU/1k",
            "gw CPU/1k",
            "all µs/req",
            "gw conns"
        );
        for d in &self.drains {
            println!(
                "  {:<7} {:>7} {:>9.0} {:>8.2} {:>7.0}% {:>10.2} {:>9.3} {:>11.2} {:>10.3} {:>9.1} {:>12.3} {:>10.3} {:>11.1} {:>9}",
                d.gateway.name(),
                d.n,
                d.requests_per_s,
                d.seconds,
                d.ratio_to_gateway_ceiling.unwrap_or(0.0) * 100.0,
                d.commands.per_request,
                d.commands.script_calls_per_request,
                d.producer_commands_per_submit,
                d.cpu_s_per_1k,
                d.peak_rss_mib,
                d.redis_cpu_s_per_1k.unwrap_or(f64::NAN),
                d.gateway_cpu_s_per_1k.unwrap_or(f64::NAN),
                d.machine_cpu_us().unwrap_or(f64::NAN),
                count(d.gateway_connections)
            );
        }
        println!(
            "  (gw conns: TCP connections the gateway accepted during the drain; about the concurrency, {}, when connections are kept alive)",
            s.concurrency
        );
        let cores = self.machine.nproc.max(1) as f64;
        for d in self
            .drains
            .iter()
            .filter(|d| d.gateway == GatewayKind::Node)
        {
            if let Some(us) = d.machine_cpu_us() {
                println!(
                    "  node {:>7}: processor + redis-server + gateway use {us:.0} µs of CPU per request: {cores:.0} cores bound the drain at {:.0} req/s",
                    d.n,
                    cores * 1e6 / us
                );
            }
        }
        let c = &self.command_census;
        println!(
            "command census (MONITOR, {} requests): {:.2} top-level commands/request ({}), {:.2} inside scripts",
            c.requests,
            c.top_level_per_request,
            c.top_level_by_command
                .iter()
                .map(|(k, v)| format!("{k} {:.2}", *v as f64 / c.requests.max(1) as f64))
                .collect::<Vec<_>>()
                .join(", "),
            c.inside_scripts_per_request
        );
        println!();
        if self.bullmq.measured {
            println!(
                "BullMQ     {:>7} {:>9} {:>9} {:>9} {:>14} {:>14} {:>10} {:>9}",
                "N",
                "jobs/s",
                "inferq",
                "ratio",
                "BullMQ µs/job",
                "inferq µs/req",
                "CPU ratio",
                "gw conns"
            );
            for r in &self.bullmq.ratios {
                let conns = self
                    .bullmq
                    .drains
                    .iter()
                    .find(|b| b.n == r.n)
                    .and_then(|b| b.gateway_connections);
                println!(
                    "  node     {:>7} {:>9.0} {:>9.0} {:>8.2}x {:>14.1} {:>14.1} {:>9.2}x {:>9}",
                    r.n,
                    r.bullmq_jobs_per_s,
                    r.inferq_requests_per_s,
                    r.inferq_over_bullmq,
                    r.bullmq_cpu_us.unwrap_or(f64::NAN),
                    r.inferq_cpu_us.unwrap_or(f64::NAN),
                    r.bullmq_cpu_over_inferq.unwrap_or(f64::NAN),
                    count(conns)
                );
            }
            println!(
                "  (µs: CPU per request of worker + redis-server + gateway, each over its drain; gw conns: TCP connections the gateway accepted during BullMQ's drain)"
            );
        } else {
            println!(
                "BullMQ: skipped ({})",
                self.bullmq.skipped_because.as_deref().unwrap_or("")
            );
        }
        println!();
        self.print_split();
        println!();
        self.print_fleet();
        println!();
        self.cluster.print();
        println!();
        println!(
            "open loop {:>8} {:>9} {:>9} {:>27} {:>27}",
            "offered",
            "submitted",
            "results/s",
            "enqueue->dispatch p50/p99/max",
            "submit->result p50/p99/max"
        );
        for o in &self.open_loop {
            let e = &o.enqueue_to_dispatch;
            let r = &o.submit_to_result;
            println!(
                "  sim    {:>9}/s {:>8.0}/s {:>9.0} {:>8.2} {:>8.2} {:>8.1} ms {:>8.2} {:>8.2} {:>8.1} ms",
                o.offered_rps, o.achieved_submit_rps, o.throughput_rps, e.p50_ms, e.p99_ms, e.max_ms, r.p50_ms, r.p99_ms, r.max_ms
            );
        }
        println!();
        println!(
            "{:<64} {:<24} {:<52} result",
            "target", "wanted", "measured"
        );
        for t in &self.targets {
            let verdict = match t.pass {
                Some(true) => "pass",
                Some(false) => "MISS",
                None => "n/a",
            };
            println!(
                "{:<64} {:<24} {:<52} {verdict}",
                t.name, t.target, t.measured
            );
        }
        println!();
        println!("total {:.0} s", self.seconds_total);
    }

    /// The split placement's drains, beside BullMQ's in the same placement.
    fn print_split(&self) {
        let split = &self.split;
        if !split.measured {
            println!(
                "split placement: skipped ({})",
                split.skipped_because.as_deref().unwrap_or("")
            );
            return;
        }
        println!(
            "split placement: the gateway on CPU {}, redis-server and the worker on CPU {} (a gateway on machines of its own; the targets above are measured shared)",
            split.gateway_cpus.as_deref().unwrap_or("-"),
            split.queue_cpus.as_deref().unwrap_or("-")
        );
        println!(
            "  {:<8} {:>7} {:>12} {:>14} {:>13} {:>14} {:>8}",
            "", "N", "inferq req/s", "inferq µs/req", "BullMQ jobs/s", "BullMQ µs/job", "ratio"
        );
        for d in &split.drains {
            let r = split.bullmq.ratios.iter().find(|r| r.n == d.n);
            println!(
                "  {:<8} {:>7} {:>12.0} {:>14.1} {:>13} {:>14} {:>8}",
                d.gateway.name(),
                d.n,
                d.requests_per_s,
                d.machine_cpu_us().unwrap_or(f64::NAN),
                r.map_or("-".to_owned(), |r| format!("{:.0}", r.bullmq_jobs_per_s)),
                r.and_then(|r| r.bullmq_cpu_us)
                    .map_or("-".to_owned(), |us| format!("{us:.1}")),
                r.map_or("-".to_owned(), |r| format!("{:.2}x", r.inferq_over_bullmq))
            );
        }
        if !split.bullmq.measured {
            println!(
                "  BullMQ: skipped ({})",
                split.bullmq.skipped_because.as_deref().unwrap_or("")
            );
        }
    }

    /// The fleet drains: one queue, the same workers, more processors sharing them.
    fn print_fleet(&self) {
        let fleet = &self.fleet;
        if !fleet.measured {
            println!(
                "fleet: skipped ({})",
                fleet.skipped_because.as_deref().unwrap_or("")
            );
            return;
        }
        println!(
            "fleet: {} requests through sim, the same workers shared by processors on one queue",
            fleet.n
        );
        println!(
            "  {:>10} {:>12} {:>9} {:>10} {:>10} {:>15} {:>13} {:>11} {:>10} {:>9}",
            "processors",
            "workers each",
            "req/s",
            "calls/req",
            "evals/req",
            "processors µs",
            "redis µs/req",
            "all µs/req",
            "lost/req",
            "peak MiB"
        );
        for d in &fleet.drains {
            println!(
                "  {:>10} {:>12} {:>9.0} {:>10.2} {:>10.3} {:>15.1} {:>13.1} {:>11.1} {:>10} {:>9.1}",
                d.processors,
                d.concurrency / d.processors.max(1),
                d.requests_per_s,
                d.commands.per_request,
                d.commands.script_calls_per_request,
                d.cpu_s_per_1k * 1000.0,
                d.redis_cpu_s_per_1k.map_or(f64::NAN, |s| s * 1000.0),
                d.machine_cpu_us().unwrap_or(f64::NAN),
                d.claims_lost_per_request
                    .map_or("-".to_owned(), |l| format!("{l:.2}")),
                d.peak_rss_mib
            );
        }
        println!(
            "  (processors µs: CPU per request of every processor together; lost/req: requests peeked and claimed for nothing because another processor claimed them first; peak MiB: the largest processor's)"
        );
    }

    /// Writes the report as pretty JSON.
    pub fn write_json(&self, path: &Path) -> Result<(), BenchError> {
        let text = serde_json::to_string_pretty(self)
            .map_err(|e| BenchError::Phase(format!("cannot encode the report: {e}")))?;
        std::fs::write(path, text)
            .map_err(|e| BenchError::setup(format!("cannot write {}", path.display()), e))
    }
}

/// A count for a table cell, `-` when it was not measured.
fn count(value: Option<u64>) -> String {
    value.map_or_else(|| "-".to_owned(), |n| n.to_string())
}
