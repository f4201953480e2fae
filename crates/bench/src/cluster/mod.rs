//! The cluster section of `inferq-dev bench`: what spreading queues over the masters of a Redis
//! Cluster costs Redis, against one server in the same run. A 3-master cluster (no replicas,
//! AOF everysec like the bench's own Redis) is started; one queue is named for each master
//! (`q-<i>` whose slot that master serves); N requests spread over them are drained by one
//! `inferq run` through the simulator three times: on the bench's standalone Redis (the
//! reference), on the cluster with each result list in its queue's slot (`{q}:results`: the
//! one-script finish), and on the cluster with each list in a slot another master serves (the
//! staged three-step finish). Each drain runs twice: timed (requests/s, every master's INFO cpu
//! and commandstats deltas), then, smaller, under MONITOR for the census (top-level and
//! cross-slot commands per request; see `monitor`). Last, the cost of `submit --replica-wait 1`
//! on a primary with one replica.
//!
//! In: the bench's [`Ctx`] (its standalone Redis, options, scratch folder) and the simulator;
//! out: a [`report::ClusterSection`].

mod drain;
mod monitor;
mod replica;
pub mod report;

use drain::{Reading, Servers};
use inferq::config::hash_slot;
use inferq_testkit::{ClusterOptions, RedisCluster};
use monitor::Lane;
use report::{Census, ClusterRun, ClusterSection, MasterCost, Placement};

use super::procs::Gateway;
use super::{say, BenchError, Ctx};

/// The census drains are no larger than this (MONITOR slows Redis; its figures are per request).
const CENSUS_MAX: u64 = 5000;

/// How many names `q-<i>` are tried to find one on each master.
const NAMES_TRIED: u32 = 100_000;

/// Starts the cluster and runs the section through `sim`.
pub async fn run(ctx: &mut Ctx, sim: &Gateway) -> Result<ClusterSection, BenchError> {
    let n = ctx.opts.cluster_n;
    let cluster = tokio::task::spawn_blocking(|| {
        RedisCluster::start_opts(ClusterOptions {
            masters: 3,
            replicas: 0,
            extra_args: vec!["--appendfsync".to_owned(), "everysec".to_owned()],
            ..ClusterOptions::default()
        })
    })
    .await
    .map_err(|e| BenchError::Phase(format!("starting the cluster: {e}")))??;
    let masters: Vec<(u16, Vec<(u16, u16)>)> = cluster
        .masters()?
        .into_iter()
        .map(|m| (m.port, m.slots))
        .collect();
    let addrs = masters
        .iter()
        .map(|(port, _)| format!("127.0.0.1:{port}"))
        .collect();
    let mut on_cluster = Servers::connect(true, addrs, &masters).await?;
    say(format!(
        "cluster of {} masters on ports {}",
        masters.len(),
        masters
            .iter()
            .map(|(p, _)| p.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ));
    let placements = place(&on_cluster)?;
    let standalone_master = [(ctx.redis_port, Vec::new())];
    let mut alone = Servers::connect(
        false,
        vec![format!("127.0.0.1:{}", ctx.redis_port)],
        &standalone_master,
    )
    .await?;

    let census_n = n.min(CENSUS_MAX);
    let mut runs = Vec::new();
    for (label, tagged) in [
        ("standalone", true),
        ("cluster, lists tagged", true),
        ("cluster, lists apart", false),
    ] {
        let servers = if label == "standalone" {
            &mut alone
        } else {
            &mut on_cluster
        };
        let short = label.split(' ').next_back().unwrap_or(label);
        let lanes = |run: &str, servers: &Servers| -> Vec<Lane> {
            placements
                .iter()
                .map(|p| Lane {
                    queue: p.queue.clone(),
                    results: if tagged {
                        p.tagged_list.clone()
                    } else {
                        p.apart_list.clone()
                    },
                    id_prefix: format!("{run}-{}", p.queue),
                    slot: p.slot,
                    node: servers.node_of_slot(p.slot),
                })
                .collect()
        };
        let timed_lanes = lanes(short, servers);
        let timed = drain::run(ctx, servers, &timed_lanes, sim, n, false)
            .await
            .map_err(|e| e.during(format!("cluster section: drain {n}, {label}")))?;
        let census_lanes = lanes(&format!("census-{short}"), servers);
        let census = drain::run(ctx, servers, &census_lanes, sim, census_n, true)
            .await
            .map_err(|e| e.during(format!("cluster section: census {census_n}, {label}")))?;
        let r = figures(label, servers, &timed_lanes, n, timed, census, census_n);
        say(format!(
            "cluster section, {label}: {:.0} req/s ({:.0} settled), Redis {:.1} µs/request ({}), {:.2} calls/request, {:.2} top-level, {:.3} cross-slot ({:.3} on result lists)",
            r.requests_per_s,
            r.requests_per_s_settled,
            r.redis_cpu_us_per_request,
            r.masters
                .iter()
                .map(|m| format!(":{} {:.1}", m.port, m.cpu_us_per_request))
                .collect::<Vec<_>>()
                .join(", "),
            r.calls_per_request,
            r.census.top_level_per_request,
            r.census.cross_slot_per_request,
            r.census.cross_slot("result lists")
        ));
        runs.push(r);
    }
    drop(on_cluster);
    drop(cluster);

    let wait = replica::run(&ctx.dir, n)
        .await
        .map_err(|e| e.during("cluster section: replica wait"))?;
    say(format!(
        "submit of {n} to a primary with one replica: {}; the wait adds {:.1} µs/request",
        wait.runs
            .iter()
            .map(|s| format!(
                "--replica-wait {} {:.0} req/s",
                s.replica_wait, s.requests_per_s
            ))
            .collect::<Vec<_>>()
            .join(", "),
        wait.extra_us_per_request
    ));
    Ok(ClusterSection::measured(n, placements, runs, Some(wait)))
}

/// One queue per master: the first `q-<i>` whose slot it serves, with its tagged list and a list
/// `results-<j>` of its own in a slot the next master serves (each master then holds one queue
/// and one other queue's list).
fn place(servers: &Servers) -> Result<Vec<Placement>, BenchError> {
    let mut out = Vec::new();
    for node in 0..servers.nodes.len() {
        let queue = (0..NAMES_TRIED)
            .map(|i| format!("q-{i}"))
            .find(|q| servers.node_of(q) == node)
            .ok_or_else(|| BenchError::Phase(format!("no queue name lands on master {node}")))?;
        // On the next master round the ring: every master holds one queue and one apart list.
        let next = (node + 1) % servers.nodes.len();
        let apart = (0..NAMES_TRIED)
            .map(|j| format!("results-{j}"))
            .find(|l| servers.node_of(l) == next && next != node)
            .ok_or_else(|| BenchError::Phase("no result list lands on another master".into()))?;
        let apart_node = servers.node_of(&apart);
        out.push(Placement {
            slot: hash_slot(&queue),
            master: servers.nodes[node].port,
            tagged_list: format!("{{{queue}}}:results"),
            apart_list_slot: hash_slot(&apart),
            apart_list_master: servers.nodes[apart_node].port,
            apart_list: apart,
            queue,
        });
    }
    Ok(out)
}

/// One run's figures from its timed drain and its census.
fn figures(
    label: &str,
    servers: &Servers,
    lanes: &[Lane],
    n: u64,
    timed: Reading,
    census: Reading,
    census_n: u64,
) -> ClusterRun {
    let per = |x: f64| x / n.max(1) as f64;
    let masters: Vec<MasterCost> = servers
        .nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let own: Vec<(usize, &Lane)> = lanes
                .iter()
                .enumerate()
                .filter(|(_, l)| l.node == i)
                .collect();
            let own_n: u64 = own
                .iter()
                .map(|(j, _)| drain::share(n, lanes.len(), *j))
                .sum();
            let cpu_us = timed.cpu_s[i] * 1e6;
            MasterCost {
                port: node.port,
                queues: own.iter().map(|(_, l)| l.queue.clone()).collect(),
                cpu_us_per_request: per(cpu_us),
                cpu_us_per_own_request: (own_n > 0).then(|| cpu_us / own_n as f64),
                calls_per_request: per(timed.calls[i].values().sum::<u64>() as f64),
            }
        })
        .collect();
    let all_calls: u64 = timed.calls.iter().flat_map(|c| c.values()).sum();
    let scripts: u64 = timed.calls.iter().map(crate::measure::script_calls).sum();
    ClusterRun {
        label: label.to_owned(),
        cluster: servers.cluster,
        lists_tagged: lanes.iter().all(|l| hash_slot(&l.results) == l.slot),
        n,
        results: timed.results,
        seconds: timed.seconds,
        requests_per_s: if timed.seconds > 0.0 {
            n as f64 / timed.seconds
        } else {
            0.0
        },
        seconds_settled: timed.seconds_settled,
        requests_per_s_settled: if timed.seconds_settled > 0.0 {
            n as f64 / timed.seconds_settled
        } else {
            0.0
        },
        redis_cpu_us_per_request: masters.iter().map(|m| m.cpu_us_per_request).sum(),
        max_cpu_us_per_own_request: masters
            .iter()
            .filter_map(|m| m.cpu_us_per_own_request)
            .fold(0.0, f64::max),
        masters,
        calls_per_request: per(all_calls as f64),
        script_calls_per_request: per(scripts as f64),
        census: Census::over(census.tally.unwrap_or_default(), census_n),
    }
}
