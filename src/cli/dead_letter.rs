//! `inferq dead-letter list|requeue|purge`: an operator's view of a queue's dead-letter list
//! (`<queue>:dead`) and the two things to do about it. Thin over
//! [`crate::queue::dead_letters`]; records enter as the JSON the processor wrote and leave as
//! JSONL (or a table on a terminal).
//!
//! Exit codes: 0 done; 2 bad arguments, an `--id` that matches no record, or a selected record
//! that cannot be requeued (each is named with the reason; the others are still requeued).

use std::io::{IsTerminal, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use serde_json::json;

use super::Failure;
use crate::queue::dead_letters::{DeadLetters, Listed};
use crate::queue::producer::unix_ms;

#[derive(Debug, clap::Args)]
pub struct DeadLetterArgs {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(Debug, Clone, clap::Args)]
pub struct Target {
    /// Redis URL (redis://, rediss://, unix://; user and password allowed).
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379/")]
    pub redis_url: String,
    /// The request sorted set whose dead list (`<queue>:dead`) to use.
    #[arg(long, default_value = "request-sortedset")]
    pub queue: String,
}

#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Print dead records, newest first: JSONL, or a table on a terminal.
    List {
        #[command(flatten)]
        target: Target,
        /// Only records of these request ids.
        #[arg(long)]
        id: Vec<String>,
        /// At most this many records, the newest (without --id, only they are read).
        #[arg(long)]
        limit: Option<usize>,
        /// Write JSONL even on a terminal.
        #[arg(long)]
        json: bool,
        /// Include the stored member in the JSONL.
        #[arg(long)]
        members: bool,
    },
    /// Put dead requests back in pending, each as a new generation (fresh request token).
    #[command(group = clap::ArgGroup::new("which").required(true).args(["id", "all"]))]
    Requeue {
        #[command(flatten)]
        target: Target,
        /// Requeue the records of these request ids.
        #[arg(long)]
        id: Vec<String>,
        /// Requeue every record that can be.
        #[arg(long)]
        all: bool,
    },
    /// Delete dead records and print how many.
    #[command(group = clap::ArgGroup::new("which").required(true).args(["id", "all", "older_than"]))]
    Purge {
        #[command(flatten)]
        target: Target,
        /// Delete the records of these request ids.
        #[arg(long)]
        id: Vec<String>,
        /// Delete every record.
        #[arg(long)]
        all: bool,
        /// Delete records older than this (e.g. 7d, 12h).
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Option<Duration>,
    },
}

async fn open(target: &Target) -> Result<DeadLetters, Failure> {
    let client = redis::Client::open(target.redis_url.as_str())
        .map_err(|e| Failure::bad_input(anyhow::anyhow!("--redis-url: {e}")))?;
    let con = crate::queue::connect::manager(&client)
        .await
        .context("cannot connect to Redis")?;
    Ok(DeadLetters::new(con, &target.queue))
}

fn id_of(listed: &Listed) -> &str {
    listed.record.as_ref().map(|r| r.id.as_str()).unwrap_or("")
}

/// Entries matching `ids`; an id that matches nothing is bad input.
fn select<'a>(entries: &'a [Listed], ids: &[String]) -> Result<Vec<&'a Listed>, Failure> {
    let missing: Vec<&String> = ids
        .iter()
        .filter(|id| !entries.iter().any(|e| id_of(e) == id.as_str()))
        .collect();
    if !missing.is_empty() {
        return Err(Failure::bad_input(anyhow::anyhow!(
            "no dead record with id {}",
            missing
                .iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    Ok(entries
        .iter()
        .filter(|e| ids.iter().any(|id| id == id_of(e)))
        .collect())
}

pub async fn dead_letter(args: DeadLetterArgs) -> Result<(), Failure> {
    match args.action {
        Action::List {
            target,
            id,
            limit,
            json,
            members,
        } => {
            let dead = open(&target).await?;
            let entries = match limit {
                Some(n) if id.is_empty() => dead.newest(n).await?,
                _ => dead.list().await?,
            };
            let chosen: Vec<&Listed> = if id.is_empty() {
                entries.iter().collect()
            } else {
                entries
                    .iter()
                    .filter(|e| id.iter().any(|i| i == id_of(e)))
                    .collect()
            };
            let chosen = &chosen[..limit.unwrap_or(usize::MAX).min(chosen.len())];
            let mut out = std::io::stdout().lock();
            if !json && std::io::stdout().is_terminal() {
                write_table(&mut out, chosen)?;
            } else {
                for e in chosen {
                    writeln!(out, "{}", row(e, members))?;
                }
            }
            out.flush()?;
            Ok(())
        }
        Action::Requeue { target, id, all } => {
            let dead = open(&target).await?;
            let entries = dead.list().await?;
            let chosen: Vec<&Listed> = if all {
                entries.iter().collect()
            } else {
                select(&entries, &id)?
            };
            let mut requeued = 0usize;
            let mut refused = Vec::new();
            let mut out = std::io::stdout().lock();
            for e in chosen {
                match dead.requeue(e, unix_ms()).await? {
                    Ok(r) => {
                        requeued += 1;
                        let line = json!({"id": r.id, "outcome": "requeued", "request_token": r.request_token, "deadline": r.deadline});
                        writeln!(out, "{line}")?;
                    }
                    Err(why) => {
                        let line = json!({"id": id_of(e), "outcome": "refused", "reason": why.to_string()});
                        writeln!(out, "{line}")?;
                        refused.push(format!("{:?}: {why}", id_of(e)));
                    }
                }
            }
            out.flush()?;
            eprintln!(
                "inferq dead-letter requeue: {requeued} requeued, {} refused",
                refused.len()
            );
            if refused.is_empty() {
                return Ok(());
            }
            for r in refused.iter().take(20) {
                eprintln!("  cannot requeue {r}");
            }
            Err(Failure::bad_input(anyhow::anyhow!(
                "{} record(s) cannot be requeued (see above); they stay in the dead list",
                refused.len()
            )))
        }
        Action::Purge {
            target,
            id,
            all,
            older_than,
        } => {
            let dead = open(&target).await?;
            let purged = if all {
                dead.purge_all().await?
            } else {
                let entries = dead.list().await?;
                let mut chosen: Vec<&Listed> = if id.is_empty() {
                    entries.iter().collect()
                } else {
                    select(&entries, &id)?
                };
                if let Some(age) = older_than {
                    let cutoff = unix_ms()
                        .saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX));
                    // Entries that are not records carry no time: only --all removes them.
                    chosen.retain(|e| {
                        e.record
                            .as_ref()
                            .is_ok_and(|r| i64::try_from(r.at_ms).unwrap_or(i64::MAX) < cutoff)
                    });
                }
                let raws: Vec<&str> = chosen.iter().map(|e| e.raw.as_str()).collect();
                dead.purge(&raws).await?
            };
            println!("{}", json!({"purged": purged, "dead_list": dead.key()}));
            Ok(())
        }
    }
}

fn when(at_ms: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(at_ms);
    if t > SystemTime::UNIX_EPOCH {
        humantime::format_rfc3339_millis(t).to_string()
    } else {
        String::new()
    }
}

/// One JSONL row.
fn row(e: &Listed, members: bool) -> serde_json::Value {
    match &e.record {
        Ok(r) => {
            let requeueable = DeadLetters::revive(e, unix_ms())
                .err()
                .map(|w| w.to_string());
            let mut v = json!({
                "id": r.id,
                "request_token": r.request_token,
                "queue": r.queue,
                "reason": r.reason,
                "when": when(r.at_ms),
                "at_ms": r.at_ms,
                "deliveries": r.deliveries,
                "member_bytes": if r.member_bytes > 0 { r.member_bytes } else { r.member.len() },
                "requeueable": requeueable.is_none(),
            });
            if let Some(why) = requeueable {
                v["not_requeueable"] = json!(why);
            }
            if members {
                v["member"] = json!(r.member);
                v["member_truncated"] = json!(r.member_truncated);
                v["member_lossy"] = json!(r.member_lossy);
            }
            v
        }
        Err(why) => json!({"raw": e.raw, "not_a_record": why, "requeueable": false}),
    }
}

fn write_table(out: &mut impl Write, entries: &[&Listed]) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<24} {:<24} {:>5}  {:<9} reason",
        "id", "when", "deliv", "requeue?"
    )?;
    for e in entries {
        match &e.record {
            Ok(r) => {
                let can = DeadLetters::revive(e, unix_ms()).is_ok();
                writeln!(
                    out,
                    "{:<24} {:<24} {:>5}  {:<9} {}",
                    if r.id.is_empty() { "(no id)" } else { &r.id },
                    when(r.at_ms),
                    r.deliveries,
                    if can { "yes" } else { "no" },
                    r.reason
                )?;
            }
            Err(_) => writeln!(out, "(not a dead-letter record) {}", e.raw)?,
        }
    }
    writeln!(out, "{} record(s)", entries.len())
}
