//! One drain of the cluster section: N requests spread over the section's queues, submitted
//! through the library producer, then one `inferq run` serving every queue drains them through
//! the simulator until every result is on its list. The same code drains a standalone Redis
//! (the reference) and the cluster. In: the [`Servers`], the queues ([`Lane`]s) and N; out: a
//! [`Reading`] with the time, each master's CPU and INFO commandstats deltas, and, when the
//! drain runs under MONITOR (the census, not timed), the [`Tally`] of its commands.

use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;

use super::monitor::{is_admin, parse_line, Lane, Tally};
use crate::load::{preload, settle_aof};
use crate::measure::{commandstats, delta, CommandCounts};
use crate::procs::{Gateway, Processor};
use crate::{BenchError, Ctx, FLUSH_LIMIT};
use inferq::config::hash_slot;
use inferq_client::connect::RedisTls;
use inferq_client::producer::Producer;
use inferq_client::target::{Target, Topology};

/// One master (or the standalone server) and the bench's connection to it.
pub(super) struct Node {
    pub port: u16,
    pub con: MultiplexedConnection,
    /// The connection's `ip:port` as the server sees it (left out of the census).
    pub addr: String,
}

/// A deployment the section drains: one server, or the masters of a cluster and their slots.
pub(super) struct Servers {
    pub cluster: bool,
    /// The seed nodes, `127.0.0.1:<port>`: the URL's host first.
    pub addrs: Vec<String>,
    pub nodes: Vec<Node>,
    /// `(first slot, last slot, index into nodes)`; empty for one server.
    pub slots: Vec<(u16, u16, usize)>,
}

impl Servers {
    /// Connects to every master on `ports` (`slots`: theirs, by port; empty for one server).
    pub(super) async fn connect(
        cluster: bool,
        addrs: Vec<String>,
        masters: &[(u16, Vec<(u16, u16)>)],
    ) -> Result<Servers, BenchError> {
        let mut nodes = Vec::new();
        let mut slots = Vec::new();
        for (i, (port, ranges)) in masters.iter().enumerate() {
            let mut con = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?
                .get_multiplexed_async_connection()
                .await?;
            con.set_response_timeout(FLUSH_LIMIT);
            let info: String = redis::cmd("CLIENT")
                .arg("INFO")
                .query_async(&mut con)
                .await?;
            let addr = info
                .split_whitespace()
                .find_map(|f| f.strip_prefix("addr="))
                .map(str::to_owned)
                .ok_or_else(|| BenchError::Phase("CLIENT INFO has no addr".into()))?;
            nodes.push(Node {
                port: *port,
                con,
                addr,
            });
            slots.extend(ranges.iter().map(|&(a, b)| (a, b, i)));
        }
        Ok(Servers {
            cluster,
            addrs,
            nodes,
            slots,
        })
    }

    /// The index of the node serving `slot` (0 for one server).
    pub(super) fn node_of_slot(&self, slot: u16) -> usize {
        self.slots
            .iter()
            .find(|&&(a, b, _)| (a..=b).contains(&slot))
            .map_or(0, |&(_, _, i)| i)
    }

    pub(super) fn node_of(&self, key: &str) -> usize {
        self.node_of_slot(hash_slot(key))
    }

    fn url(&self) -> String {
        format!("redis://{}/", self.addrs.first().map_or("", String::as_str))
    }

    fn target(&self) -> Result<Target, BenchError> {
        let topology = if self.cluster {
            Topology::Cluster {
                addrs: self.addrs[1..].to_vec(),
            }
        } else {
            Topology::Standalone
        };
        Target::new(&self.url(), &RedisTls::default(), topology)
            .map_err(|e| BenchError::Phase(format!("cannot reach Redis: {e}")))
    }

    /// The transport config of one `inferq run` serving every lane through `gateway`.
    pub(super) fn transport(
        &self,
        ctx: &Ctx,
        lanes: &[Lane],
        gateway: &Gateway,
    ) -> serde_json::Value {
        let queues: Vec<serde_json::Value> = lanes
            .iter()
            .map(|l| {
                serde_json::json!({
                    "queue_name": l.queue,
                    "result_queue_name": l.results,
                    "igw_base_url": gateway.base_url(),
                    "request_path_url": "/v1/chat/completions",
                })
            })
            .collect();
        let mut t = serde_json::json!({
            "url": self.url(),
            "poll_interval_ms": ctx.opts.poll_interval_ms,
            "batch_size": ctx.opts.batch_size,
            "queues": queues,
        });
        if self.cluster {
            t["mode"] = "cluster".into();
            t["addrs"] = self.addrs[1..].to_vec().into();
        }
        t
    }
}

/// What one drain read.
pub(super) struct Reading {
    pub results: u64,
    /// From starting `inferq run` to the last result on its list.
    pub seconds: f64,
    /// From starting `inferq run` until the processor's work is done (see [`settle`]).
    pub seconds_settled: f64,
    /// Per node: CPU seconds spent, and INFO commandstats calls (admin and own polls left out).
    pub cpu_s: Vec<f64>,
    pub calls: Vec<CommandCounts>,
    /// The census, for a drain under MONITOR.
    pub tally: Option<Tally>,
}

/// used_cpu_user + used_cpu_sys, the children's included (AOF rewrites), from `INFO cpu`.
async fn cpu_s(con: &mut MultiplexedConnection) -> Result<f64, BenchError> {
    let text: String = redis::cmd("INFO").arg("cpu").query_async(con).await?;
    Ok(text
        .lines()
        .filter_map(|l| l.trim().split_once(':'))
        .filter(|(k, _)| {
            matches!(
                *k,
                "used_cpu_sys"
                    | "used_cpu_user"
                    | "used_cpu_sys_children"
                    | "used_cpu_user_children"
            )
        })
        .filter_map(|(_, v)| v.parse::<f64>().ok())
        .sum())
}

/// Requests of lane `i` when `n` are spread over `lanes` lanes.
pub(super) fn share(n: u64, lanes: usize, i: usize) -> u64 {
    let lanes = lanes.max(1) as u64;
    n / lanes + u64::from((i as u64) < n % lanes)
}

/// MONITOR on one node in a task of its own, until told to stop; returns its [`Tally`].
async fn monitor(
    servers: &Servers,
    index: usize,
    lanes: &[Lane],
) -> Result<
    (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<Tally>,
    ),
    BenchError,
> {
    let mut lines = crate::census::monitor(servers.nodes[index].port).await?;
    let own: Vec<String> = servers.nodes.iter().map(|n| n.addr.clone()).collect();
    let lanes = lanes.to_vec();
    let cluster = servers.cluster;
    let slots = servers.slots.clone();
    let node_of = move |slot: u16| {
        slots
            .iter()
            .find(|&&(a, b, _)| (a..=b).contains(&slot))
            .map_or(0, |&(_, _, i)| i)
    };
    let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut tally = Tally::default();
        loop {
            tokio::select! {
                biased;
                line = lines.next_line() => match line {
                    Ok(Some(line)) => {
                        if let Some(l) = parse_line(&line) {
                            tally.count(cluster, &l, &lanes, &node_of, &own);
                        }
                    }
                    _ => break,
                },
                _ = &mut stop_rx => break,
            }
        }
        // Told to stop: what Redis already wrote is still read, until the stream is quiet.
        while let Ok(Ok(Some(line))) = tokio::time::timeout(QUIET, lines.next_line()).await {
            if let Some(l) = parse_line(&line) {
                tally.count(cluster, &l, &lanes, &node_of, &own);
            }
        }
        tally
    });
    Ok((stop_tx, task))
}

/// How long the keys of every node must stay as many for the drain to count as settled.
const QUIET: Duration = Duration::from_millis(250);

/// Waits, after the last result, until the processor has done the work that follows it (on a
/// cluster: the staged results dropped and the producer's markers cleared, steps that run after
/// the result is on its list): until the number of keys on every node stays the same for
/// [`QUIET`]. Returns when the count last changed.
async fn settle(
    servers: &mut Servers,
    polls: &mut [u64],
    processor: &mut Processor,
) -> Result<Instant, BenchError> {
    let started = Instant::now();
    let mut last_change = Instant::now();
    let mut last = Vec::new();
    loop {
        let mut sizes = Vec::new();
        for (i, node) in servers.nodes.iter_mut().enumerate() {
            let size: u64 = redis::cmd("DBSIZE").query_async(&mut node.con).await?;
            polls[i] += 1;
            sizes.push(size);
        }
        let now = Instant::now();
        if sizes != last {
            last = sizes;
            last_change = now;
        } else if now.duration_since(last_change) >= QUIET {
            return Ok(last_change);
        }
        if started.elapsed() > Duration::from_secs(120) {
            return Err(BenchError::Phase(
                "the keys kept changing for 120 s after the last result".into(),
            ));
        }
        processor.check_alive()?;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Drains `n` requests over `lanes`, under MONITOR when `census`.
pub(super) async fn run(
    ctx: &Ctx,
    servers: &mut Servers,
    lanes: &[Lane],
    gateway: &Gateway,
    n: u64,
    census: bool,
) -> Result<Reading, BenchError> {
    for node in &mut servers.nodes {
        let () = redis::cmd("FLUSHALL").query_async(&mut node.con).await?;
    }
    let target = servers.target()?;
    for (i, lane) in lanes.iter().enumerate() {
        let producer = Producer::connect_target(&target, &lane.queue, &lane.results).await?;
        preload(&producer, &lane.id_prefix, share(n, lanes.len(), i)).await?;
    }
    for node in &mut servers.nodes {
        settle_aof(&mut node.con, Duration::from_secs(120)).await?;
    }
    let mut cpu_before = Vec::new();
    let mut calls_before = Vec::new();
    for node in &mut servers.nodes {
        cpu_before.push(cpu_s(&mut node.con).await?);
        calls_before.push(commandstats(&mut node.con).await?);
    }
    let mut monitors = Vec::new();
    if census {
        for i in 0..servers.nodes.len() {
            monitors.push(monitor(servers, i, lanes).await?);
        }
    }
    let mut spec = ctx.spec(&gateway.base_url(), "cluster");
    spec.transport_json = Some(servers.transport(ctx, lanes, gateway));
    let (mut processor, _) = Processor::spawn(&spec, &ctx.dir)?;
    // Each list once, even if queues shared one.
    let mut lists: Vec<(&str, usize)> = lanes
        .iter()
        .map(|l| (l.results.as_str(), servers.node_of(&l.results)))
        .collect();
    lists.sort_unstable();
    lists.dedup();
    let mut polls = vec![0u64; servers.nodes.len()];
    let mut dbsize_polls = vec![0u64; servers.nodes.len()];
    let limit = Duration::from_secs(120 + n / 200);
    let watched = async {
        loop {
            let mut have = 0u64;
            for &(list, node) in &lists {
                let len: u64 = redis::cmd("LLEN")
                    .arg(list)
                    .query_async(&mut servers.nodes[node].con)
                    .await?;
                polls[node] += 1;
                have += len;
            }
            if have >= n {
                return Ok((have, Instant::now()));
            }
            if processor.started.elapsed() > limit {
                return Err(BenchError::Phase(format!(
                    "only {have} of {n} results after {} s",
                    limit.as_secs()
                )));
            }
            processor.check_alive()?;
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    .await;
    let (results, last) = match watched {
        Ok(w) => w,
        Err(e) => {
            return Err(BenchError::Phase(format!(
                "{e}\nprocessor log:\n{}",
                processor.log_tail()
            )))
        }
    };
    let seconds = last.duration_since(processor.started).as_secs_f64();
    let settled = settle(servers, &mut dbsize_polls, &mut processor).await?;
    let seconds_settled = settled.duration_since(processor.started).as_secs_f64();
    let mut cpu = Vec::new();
    let mut calls = Vec::new();
    for (i, node) in servers.nodes.iter_mut().enumerate() {
        cpu.push(cpu_s(&mut node.con).await? - cpu_before[i]);
        let after = commandstats(&mut node.con).await?;
        let own = CommandCounts::from([
            ("llen".to_owned(), polls[i]),
            ("dbsize".to_owned(), dbsize_polls[i]),
        ]);
        let mut d = delta(&calls_before[i], &after, &own);
        d.retain(|name, _| !is_admin(name));
        calls.push(d);
    }
    processor.kill9();
    let mut tally = None;
    if census {
        let mut all = Tally::default();
        for (stop, task) in monitors {
            let _ = stop.send(());
            let t = task
                .await
                .map_err(|e| BenchError::Phase(format!("a MONITOR reader failed: {e}")))?;
            all.add(t);
        }
        tally = Some(all);
    }
    Ok(Reading {
        results,
        seconds,
        seconds_settled,
        cpu_s: cpu,
        calls,
        tally,
    })
}
