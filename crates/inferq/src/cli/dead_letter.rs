//! `inferq dead-letter list|requeue|purge`: an operator's view of a queue's dead-letter list
//! (`<queue>:dead`) and the two things to do about it. Thin over
//! [`crate::queue::dead_letters`]; records enter as the JSON the processor wrote and leave as
//! JSONL (or a table on a terminal), printed a page at a time as the list is read.
//!
//! `requeue` and `purge` stop between records on SIGINT or SIGTERM (a second signal exits at
//! once) and still say what they did: every record is then either moved and reported, or left
//! where it was.
//!
//! Exit codes: 0 done; 2 bad arguments, an `--id` that matches no record, or a selected record
//! that cannot be requeued (each is named with the reason; the others are still requeued); 1
//! Redis failed, or a signal stopped it.

use std::io::{IsTerminal, Write};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::Failure;
use crate::queue::dead_letters::{DeadLetters, Listed};
use inferq_client::producer::unix_ms;

#[derive(Debug, clap::Args)]
pub(super) struct DeadLetterArgs {
    #[command(subcommand)]
    pub action: Action,
}

#[derive(Debug, Clone, clap::Args)]
pub(super) struct Target {
    #[command(flatten)]
    pub redis: super::RedisConn,
    /// The request sorted set whose dead list (`<queue>:dead`) to use.
    #[arg(long, default_value = "request-sortedset")]
    pub queue: String,
}

#[derive(Debug, clap::Subcommand)]
pub(super) enum Action {
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
    let con = target.redis.connect().await?;
    Ok(DeadLetters::new(con, &target.queue))
}

fn id_of(listed: &Listed) -> &str {
    listed.record.as_ref().map(|r| r.id.as_str()).unwrap_or("")
}

/// The entries of the records with these ids (only they are held, the list is read a page at a
/// time); an id that matches nothing is bad input, before anything is changed.
async fn matching(dead: &DeadLetters, ids: &[String]) -> Result<Vec<Listed>, Failure> {
    let mut pages = dead.pages().await?;
    let mut found = Vec::new();
    while let Some(page) = pages.next().await? {
        found.extend(
            page.into_iter()
                .filter(|e| ids.iter().any(|id| id == id_of(e))),
        );
    }
    let missing: Vec<&String> = ids
        .iter()
        .filter(|id| !found.iter().any(|e| id_of(e) == id.as_str()))
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
    Ok(found)
}

/// The Unix millisecond before which a record is older than `age`.
fn cutoff_ms(age: Duration) -> i64 {
    unix_ms().saturating_sub(i64::try_from(age.as_millis()).unwrap_or(i64::MAX))
}

/// Whether a record was written before `cutoff` (Unix ms; entries that are not records carry
/// no time: only `purge --all` removes them).
fn written_before(e: &Listed, cutoff: i64) -> bool {
    e.record
        .as_ref()
        .is_ok_and(|r| i64::try_from(r.at_ms).unwrap_or(i64::MAX) < cutoff)
}

/// Prints the records, newest first, as they are read: at most `limit`, only those of `ids`
/// when there are any.
async fn list(
    dead: &DeadLetters,
    ids: &[String],
    limit: Option<usize>,
    table: bool,
    members: bool,
) -> Result<(), Failure> {
    let budget = limit.unwrap_or(usize::MAX);
    let mut shown = 0usize;
    if table {
        write_header(&mut std::io::stdout().lock())?;
    }
    // Prints what a page holds for the listing; true once the limit is reached.
    let mut show = |page: Vec<Listed>| -> std::io::Result<bool> {
        let mut out = std::io::stdout().lock();
        let wanted = page
            .iter()
            .filter(|e| ids.is_empty() || ids.iter().any(|i| i == id_of(e)));
        for e in wanted {
            if shown == budget {
                break;
            }
            shown += 1;
            match table {
                true => write_row(&mut out, e)?,
                false => writeln!(out, "{}", row(e, members))?,
            }
        }
        out.flush()?;
        Ok(shown == budget)
    };
    let mut pages = match limit {
        // Without --id only the newest are read.
        Some(n) if ids.is_empty() => dead.newest(n).await?,
        _ => dead.pages().await?,
    };
    while let Some(page) = pages.next().await? {
        if show(page)? {
            break;
        }
    }
    if table {
        writeln!(std::io::stdout().lock(), "{shown} record(s)")?;
    }
    Ok(())
}

/// Requeues `entries`, printing a line for each; the refusals are added to `refused`. Stops
/// between two records once `stop` is cancelled.
async fn requeue(
    dead: &DeadLetters,
    entries: &[Listed],
    requeued: &mut usize,
    refused: &mut Vec<String>,
    stop: &CancellationToken,
) -> Result<(), Failure> {
    for e in entries {
        if stop.is_cancelled() {
            return Ok(());
        }
        // A call Redis did not answer may have run: the record is then in pending and no
        // longer dead, so a rerun does not requeue it twice, but it is not reported here.
        let answer = dead.requeue(e, unix_ms()).await.inspect_err(|_| {
            tell!(
                "inferq dead-letter requeue: Redis did not answer the requeue of {:?}; it may or \
                 may not be requeued (`inferq dead-letter list --id` shows whether it is still dead)",
                id_of(e)
            )
        })?;
        let line = match answer {
            Ok(r) => {
                *requeued += 1;
                json!({"id": r.id, "outcome": "requeued", "request_token": r.request_token, "deadline": r.deadline})
            }
            Err(why) => {
                refused.push(format!("{:?}: {why}", id_of(e)));
                json!({"id": id_of(e), "outcome": "refused", "reason": why.to_string()})
            }
        };
        writeln!(std::io::stdout().lock(), "{line}")?;
    }
    Ok(())
}

pub(super) async fn dead_letter(args: DeadLetterArgs) -> Result<(), Failure> {
    match args.action {
        Action::List {
            target,
            id,
            limit,
            json,
            members,
        } => {
            let dead = open(&target).await?;
            let table = !json && std::io::stdout().is_terminal();
            list(&dead, &id, limit, table, members).await
        }
        Action::Requeue { target, id, all } => requeue_records(&target, &id, all).await,
        Action::Purge {
            target,
            id,
            all,
            older_than,
        } => purge_records(&target, &id, all, older_than).await,
    }
}

/// `dead-letter requeue`: the chosen records (or all, a page at a time) back to pending, each
/// as a new generation; a count however it ends, and the records that cannot be requeued.
async fn requeue_records(target: &Target, id: &[String], all: bool) -> Result<(), Failure> {
    let dead = open(target).await?;
    let stop = stop_on_signal();
    let (mut requeued, mut refused) = (0usize, Vec::new());
    let done = async {
        if all {
            let mut pages = dead.pages().await?;
            while let Some(page) = pages.next().await? {
                requeue(&dead, &page, &mut requeued, &mut refused, &stop).await?;
                if stop.is_cancelled() {
                    break;
                }
            }
        } else {
            let chosen = matching(&dead, id).await?;
            requeue(&dead, &chosen, &mut requeued, &mut refused, &stop).await?;
        }
        Ok::<_, Failure>(())
    }
    .await;
    std::io::stdout().lock().flush()?;
    // Said however it ended (a signal, Redis failing part-way): what was requeued is
    // in pending under the tokens printed above, the rest is still in the dead list.
    tell!(
        "inferq dead-letter requeue: {requeued} requeued, {} refused",
        refused.len()
    );
    done?;
    if stop.is_cancelled() {
        return Err(stopped());
    }
    if refused.is_empty() {
        return Ok(());
    }
    for r in refused.iter().take(20) {
        tell!("  cannot requeue {r}");
    }
    Err(Failure::bad_input(anyhow::anyhow!(
        "{} record(s) cannot be requeued (see above); they stay in the dead list",
        refused.len()
    )))
}

/// `dead-letter purge`: removes the chosen records, those older than a cutoff (a page at a
/// time, oldest first), or all; the count is printed however it ends.
async fn purge_records(
    target: &Target,
    id: &[String],
    all: bool,
    age: Option<Duration>,
) -> Result<(), Failure> {
    let dead = open(target).await?;
    let stop = stop_on_signal();
    let mut purged = 0u64;
    let done = async {
        match (all, id.is_empty(), age) {
            (true, _, _) => purged = dead.purge_all().await?,
            (false, false, age) => {
                let chosen = matching(&dead, id).await?;
                let old: Vec<&Listed> = chosen
                    .iter()
                    .filter(|e| age.is_none_or(|age| written_before(e, cutoff_ms(age))))
                    .collect();
                purged = dead.purge(&old).await?;
            }
            // --older-than alone: a page at a time, oldest first, so each old record
            // is removed at the tail, where it is found at once.
            (false, true, Some(age)) => {
                let cutoff = cutoff_ms(age);
                let mut pages = dead.oldest_pages().await?;
                while let Some(page) = pages.next().await? {
                    let old: Vec<&Listed> =
                        page.iter().filter(|e| written_before(e, cutoff)).collect();
                    let removed = dead.purge(&old).await?;
                    purged += removed;
                    pages.removed(usize::try_from(removed).unwrap_or(usize::MAX));
                    if stop.is_cancelled() {
                        break;
                    }
                }
            }
            (false, true, None) => {
                return Err(Failure::bad_input(anyhow::anyhow!(
                    "say which records to purge: --id, --older-than or --all"
                )))
            }
        }
        Ok(())
    }
    .await;
    // Said however it ended, so the count is known after a signal or a Redis failure.
    if !matches!(&done, Err(f) if f.code == super::EXIT_BAD_INPUT) {
        say!("{}", json!({"purged": purged, "dead_list": dead.key()}));
    }
    done?;
    if stop.is_cancelled() {
        return Err(stopped());
    }
    Ok(())
}

/// A token cancelled by the first SIGINT or SIGTERM; a second one exits at once.
fn stop_on_signal() -> CancellationToken {
    let stop = CancellationToken::new();
    tokio::spawn(super::results::watch_signals(stop.clone()));
    stop
}

fn stopped() -> Failure {
    tell!("inferq dead-letter: stopped by a signal; the records not reported above are untouched");
    Failure {
        code: 1,
        error: anyhow::anyhow!("stopped by a signal"),
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
            // A body stored apart (payload keys): where it is, for as long as it lives.
            let payload_ref = r
                .exact_member()
                .and_then(|m| inferq_client::wire::Envelope::decode(m).ok())
                .map(|env| env.internal.payload_ref)
                .filter(|key| !key.is_empty());
            if let Some(key) = payload_ref {
                v["payload_ref"] = json!(key);
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

fn write_header(out: &mut impl Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{:<24} {:<24} {:>5} {:>9}  {:<9} reason",
        "id", "when", "deliv", "bytes", "requeue?"
    )
}

fn write_row(out: &mut impl Write, e: &Listed) -> std::io::Result<()> {
    match &e.record {
        Ok(r) => {
            let can = DeadLetters::revive(e, unix_ms()).is_ok();
            let bytes = if r.member_bytes > 0 {
                r.member_bytes
            } else {
                r.member.len()
            };
            writeln!(
                out,
                "{:<24} {:<24} {:>5} {:>9}  {:<9} {}",
                if r.id.is_empty() { "(no id)" } else { &r.id },
                when(r.at_ms),
                r.deliveries,
                bytes,
                if can { "yes" } else { "no" },
                r.reason
            )
        }
        Err(_) => writeln!(out, "(not a dead-letter record) {}", e.raw),
    }
}
