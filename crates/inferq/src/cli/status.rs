//! `inferq status`: where a queue's requests are right now — pending (and how many of those are
//! overdue), claimed (and how many leases ran out unreclaimed), parked (and how many are due),
//! dead, delivered again, and the results waiting — for each `--queue`, from one census script
//! call per queue ([`crate::queue::census`]). A table on a terminal, JSONL otherwise; `--watch`
//! repeats it and adds how fast the unfinished requests go down. With `--transport-config-file`
//! Redis and the queues come from the processors' config; `--tenant-queue-prefix` adds the
//! tenant queues the index of queues with work names. `--payloads` adds a count of
//! the request bodies stored apart ([`crate::queue::payload_census`]).
//!
//! Exit codes: 0 done; 2 bad arguments; 1 Redis unreachable or a key of the wrong type.

use std::io::IsTerminal;
use std::time::Duration;

use anyhow::Context;

use super::{Failure, RedisConn};
use crate::queue::census::{census_on, Census};
use crate::queue::payload_census::payload_census;

#[derive(Debug, clap::Args)]
pub(super) struct StatusArgs {
    #[command(flatten)]
    pub redis: RedisConn,
    /// The request sorted sets to count (repeat the flag for several).
    #[arg(long, default_values_t = ["request-sortedset".to_owned()])]
    pub queue: Vec<String>,
    /// The processors' transport config file: Redis (its URL, topology, TLS) and the queues to
    /// count come from it, instead of --redis-url and --queue.
    #[arg(long, value_name = "PATH", conflicts_with = "queue")]
    pub transport_config_file: Option<String>,
    /// Also count every tenant queue in the index of queues with work whose name starts with
    /// this prefix (fair-share's `queue_prefix`, the Batch API's --tenant-queue-prefix).
    #[arg(long, value_name = "PREFIX", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub tenant_queue_prefix: Option<String>,
    /// Also count the results waiting in this list (e.g. result-list).
    #[arg(long, value_name = "LIST")]
    pub result_queue: Option<String>,
    /// Write JSONL even on a terminal.
    #[arg(long)]
    pub json: bool,
    /// Count again at this interval (e.g. 2s) until interrupted.
    #[arg(long, value_parser = positive_duration)]
    pub watch: Option<Duration>,
    /// Also count the request bodies stored apart (payload keys): how many, their bytes, and
    /// how many belong to ended generations (a SCAN of `request-payload:*`; costs a read of
    /// every such key).
    #[arg(long)]
    pub payloads: bool,
    /// Also show the Batch API's batches: how many in each status, and each batch not yet
    /// ended with its request counts.
    #[arg(long)]
    pub batches: bool,
    /// With --watch: stop after this many counts (at least 1).
    #[arg(long, requires = "watch", value_parser = clap::value_parser!(u64).range(1..))]
    pub samples: Option<u64>,
}

fn positive_duration(text: &str) -> Result<Duration, String> {
    match humantime::parse_duration(text) {
        Ok(d) if d >= Duration::from_millis(100) => Ok(d),
        Ok(_) => Err("must be at least 100ms".to_owned()),
        Err(e) => Err(e.to_string()),
    }
}

/// One JSONL line: the queue, then its counts, then (watching) the drain rate.
#[derive(serde::Serialize)]
struct Line<'a> {
    queue: &'a str,
    #[serde(flatten)]
    census: &'a Census,
    #[serde(skip_serializing_if = "Option::is_none")]
    drained_per_s: Option<f64>,
}

const HEADER: [&str; 10] = [
    "queue",
    "pending",
    "overdue",
    "claimed",
    "lease out",
    "parked",
    "due",
    "dead",
    "redelivered",
    "results",
];

/// Where Redis is and which queues to count: the flags', or the transport config's.
async fn connect(args: &StatusArgs) -> Result<(inferq_client::target::Link, Vec<String>), Failure> {
    let Some(path) = &args.transport_config_file else {
        return Ok((args.redis.connect().await?, args.queue.clone()));
    };
    let config = super::batch_api::transport_config(path)?;
    let t = &config.transport;
    let target =
        inferq_client::target::Target::new(t.url.expose(), &config.redis_tls, t.topology.clone())
            .map_err(|e| Failure::bad_input(anyhow::anyhow!("{path}: url: {e}")))?;
    let con = target.connect().await.context("cannot connect to Redis")?;
    let mut queues: Vec<String> = Vec::new();
    for q in &t.queues {
        if !queues.contains(&q.queue_name) {
            queues.push(q.queue_name.clone());
        }
    }
    Ok((con, queues))
}

/// The tenant queues of `prefix` in the index of queues with work, by name.
async fn tenant_queues(
    con: &mut inferq_client::target::Link,
    prefix: &str,
) -> Result<Vec<String>, Failure> {
    let names: Vec<String> = redis::cmd("ZRANGE")
        .arg(crate::config::fair_share::DEFAULT_INDEX_KEY)
        .arg(0)
        .arg(-1)
        .query_async(con)
        .await
        .context("cannot read the index of queues with work")?;
    let mut found: Vec<String> = names
        .into_iter()
        .filter(|n| n.starts_with(prefix) && n.len() > prefix.len())
        .collect();
    found.sort();
    Ok(found)
}

pub(super) async fn status(args: StatusArgs) -> Result<(), Failure> {
    let (mut con, listed) = connect(&args).await?;
    let table = !args.json && std::io::stdout().is_terminal();
    let mut last: std::collections::HashMap<String, Census> = Default::default();
    let mut taken = 0u64;
    loop {
        let mut queues = listed.clone();
        if let Some(prefix) = &args.tenant_queue_prefix {
            for q in tenant_queues(&mut con, prefix).await? {
                if !queues.contains(&q) {
                    queues.push(q);
                }
            }
        }
        let mut rows = Vec::with_capacity(queues.len());
        for queue in &queues {
            let now = census_on(&mut con, queue, args.result_queue.as_deref())
                .await
                .map_err(|e| refused_hint(e.to_string()))
                .with_context(|| format!("cannot count queue {queue:?}"))?;
            let rate = last.get(queue).map(|before| drain_rate(before, &now));
            last.insert(queue.clone(), now);
            rows.push((queue.as_str(), now, rate));
        }
        let payloads = match args.payloads {
            true => Some(
                payload_census(&mut con)
                    .await
                    .context("cannot count the payload keys")?,
            ),
            false => None,
        };
        let batches = match args.batches {
            true => Some(
                inferq_batch::census::census(&mut con, 50)
                    .await
                    .context("cannot count the batches")?,
            ),
            false => None,
        };
        if table {
            print_table(&rows, args.watch.is_some());
            if let Some(b) = &batches {
                print_batches(b);
            }
            if let Some(p) = payloads {
                say!(
                    "payload keys: {} ({} bytes), {} of ended generations (they expire ten minutes after their deadline)",
                    p.payload_keys,
                    p.payload_bytes,
                    p.payload_keys_ended
                );
            }
        } else {
            if let Some(p) = payloads {
                say!("{}", serde_json::to_string(&p)?);
            }
            if let Some(b) = &batches {
                say!("{}", serde_json::to_string(b)?);
            }
            for (queue, census, rate) in &rows {
                let line = Line {
                    queue,
                    census,
                    drained_per_s: *rate,
                };
                say!("{}", serde_json::to_string(&line)?);
            }
        }
        taken += 1;
        match args.watch {
            Some(every) if args.samples.is_none_or(|n| taken < n) => {
                tokio::time::sleep(every).await
            }
            _ => return Ok(()),
        }
    }
}

fn print_batches(b: &inferq_batch::census::BatchCensus) {
    let counts: Vec<String> = b
        .by_status
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(s, n)| format!("{s} {n}"))
        .collect();
    say!(
        "batches: {}",
        if counts.is_empty() {
            "none".to_owned()
        } else {
            counts.join(", ")
        }
    );
    for l in &b.live {
        say!(
            "  {}  {:<11} {:>6} of {:<6} ingested, {} completed, {} failed",
            l.id,
            l.status,
            l.ingested,
            l.total,
            l.completed,
            l.failed
        );
    }
}

/// Redis's refusal of a command inside the census script names only a line of it: say what the
/// user needs.
fn refused_hint(error: String) -> anyhow::Error {
    if error.contains("NOPERM") || error.contains("can't run this command") {
        anyhow::anyhow!(
            "{error} (NOPERM: the Redis user needs EVALSHA, SCRIPT LOAD, TIME, ZCARD, ZCOUNT, HLEN \
             and LLEN on the queue's keys and the result list; docs/src/security.md)"
        )
    } else {
        anyhow::anyhow!(error)
    }
}

/// How fast the unfinished requests (pending, claimed, parked) went down between two counts,
/// per second of Redis's clock: the drain rate net of what producers added meanwhile.
fn drain_rate(before: &Census, now: &Census) -> f64 {
    let secs = (now.at_ms - before.at_ms) as f64 / 1000.0;
    if secs <= 0.0 {
        return 0.0;
    }
    (before.unfinished() as f64 - now.unfinished() as f64) / secs
}

fn print_table(rows: &[(&str, Census, Option<f64>)], watching: bool) {
    let mut header: Vec<String> = HEADER.map(str::to_owned).to_vec();
    if watching {
        header.push("drained/s".to_owned());
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|(queue, c, rate)| {
            let mut row = vec![queue.to_string()];
            row.extend(
                [
                    c.pending,
                    c.overdue,
                    c.claimed,
                    c.lease_expired,
                    c.parked,
                    c.parked_due,
                    c.dead,
                    c.redelivered,
                ]
                .map(|n| n.to_string()),
            );
            row.push(c.results.map_or_else(|| "-".to_owned(), |n| n.to_string()));
            if watching {
                row.push(rate.map_or_else(|| "-".to_owned(), |r| format!("{r:.1}")));
            }
            row
        })
        .collect();
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            cells
                .iter()
                .map(|row| row[i].len())
                .chain([header[i].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let line = |row: &[String]| {
        row.iter()
            .zip(&widths)
            .enumerate()
            .map(|(i, (cell, &w))| {
                if i == 0 {
                    format!("{cell:<w$}")
                } else {
                    format!("{cell:>w$}")
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    if watching {
        if let Some((_, c, _)) = rows.first() {
            let at = humantime::format_rfc3339_seconds(
                std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(c.at_ms).unwrap_or(0)),
            );
            say!("{at}");
        }
    }
    say!("{}", line(&header));
    for row in &cells {
        say!("{}", line(row));
    }
}
