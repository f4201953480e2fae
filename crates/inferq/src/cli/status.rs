//! `inferq status`: where a queue's requests are right now — pending (and how many of those are
//! overdue), claimed (and how many leases ran out unreclaimed), parked (and how many are due),
//! dead, delivered again, and the results waiting — for each `--queue`, from one census script
//! call per queue ([`crate::queue::census`]). A table on a terminal, JSONL otherwise; `--watch`
//! repeats it and adds how fast the unfinished requests go down. `--payloads` adds a count of
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

pub(super) async fn status(args: StatusArgs) -> Result<(), Failure> {
    let mut con = args.redis.connect().await?;
    let table = !args.json && std::io::stdout().is_terminal();
    let mut last: Vec<Option<Census>> = vec![None; args.queue.len()];
    let mut taken = 0u64;
    loop {
        let mut rows = Vec::with_capacity(args.queue.len());
        for (queue, last) in args.queue.iter().zip(last.iter_mut()) {
            let now = census_on(&mut con, queue, args.result_queue.as_deref())
                .await
                .map_err(|e| refused_hint(e.to_string()))
                .with_context(|| format!("cannot count queue {queue:?}"))?;
            let rate = last.map(|before| drain_rate(&before, &now));
            *last = Some(now);
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
