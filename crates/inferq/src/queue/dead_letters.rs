//! The operator's moves on a queue's dead-letter list (`<queue>:dead`): read the records,
//! requeue a dead request as a new generation, purge records.
//!
//! Records come in as the JSON the processor pushed (see [`DeadRecord`]); they leave as
//! [`Listed`] entries that keep the exact stored text, because that text is how a record is
//! found again in the list (`LREM` by value) — records have no other key.
//!
//! Requeue is one script ([`inferq_client::scripts::Scripts::requeue`]): the record leaves the dead list
//! in the same step the request enters pending, and only if it does. It makes a **new
//! generation** (fresh request token, `retry_count` 0, the producer's `data` bytes untouched):
//! the dead generation already has its one terminal record, so it may never reach done again.
//! A consumer of the result list therefore sees the id twice — the dead generation's
//! `DEAD_LETTERED` / `INVALID_REQUEST` result, then the new generation's result — exactly as
//! when a producer re-submits an id.

use inferq_client::target::Link;
use redis::Value;

use super::dead::DeadRecord;
use super::moves::QueueError;
use inferq_client::keys::{active_key, cancel_key, fresh_token, QueueKeys};
use inferq_client::scripts::SCRIPTS;
use inferq_client::wire::{score_of, Envelope};

/// Records read per `LRANGE` at most.
const PAGE: usize = 1000;
/// Bytes a page is sized for: the next page asks for as many entries as fit when each is as big
/// as the biggest of the page before, so one `LRANGE` of 100 KB prompts is 20 entries (2 MB,
/// a few ms of Redis's time) and not 1,000 (100 MB: half a second during which Redis answers
/// nobody, and as much memory in this process).
const PAGE_BYTES: usize = 2 << 20;
/// The first page of a reading, while no entry's size is known; each page may double the one
/// before, up to [`PAGE`] and [`PAGE_BYTES`].
const FIRST_PAGE: usize = 8;
/// Entries removed per pipelined round trip: Redis runs a client's pipelined commands one after
/// the other before it answers anyone else.
const REMOVE_CHUNK: usize = 100;

/// One entry of the dead list.
#[derive(Debug, Clone)]
pub struct Listed {
    /// The entry exactly as stored (what requeue and purge remove).
    pub raw: String,
    /// The decoded record, or why the entry is not one (written by something else).
    pub record: Result<DeadRecord, String>,
    /// How many entries were between it and the list's tail (its oldest end) when it was read.
    /// Records are pushed at the head, so this only shrinks, as entries nearer the tail leave.
    /// A removal scans from the end the entry is nearer: `LREM` looks at the list element by
    /// element, and from the wrong end of a 200,000-record list that is 10 ms or more of
    /// Redis's time per record.
    pub from_tail: usize,
}

/// Why a record cannot be requeued (nothing was changed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unrequeueable {
    #[error("the entry is not a dead-letter record: {0}")]
    NotARecord(String),
    #[error("the record keeps only the first bytes of an oversized member ({0} bytes); it could never be served — purge it and have the producer send a smaller request")]
    Truncated(usize),
    #[error("the member was not valid UTF-8, so the record holds no exact copy of it; purge it and have the producer resubmit")]
    Lossy,
    #[error("the member is not a valid request ({0}); fix the producer and resubmit, then purge this record")]
    Malformed(String),
    #[error(
        "its deadline passed at Unix second {0}; requeueing would only produce DEADLINE_EXCEEDED"
    )]
    Expired(i64),
    #[error("id {0:?} has a newer live generation (request-active names another token); requeueing would make two")]
    NewerGeneration(String),
    #[error("the producer cancelled this generation")]
    Cancelled,
    #[error("the record is no longer in the dead list (requeued or purged meanwhile)")]
    Gone,
    #[error("its body was stored apart at {0:?} and is gone (the key expires ten minutes after the deadline); have the producer resubmit")]
    PayloadGone(String),
}

/// What a requeue did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requeued {
    pub id: String,
    /// The new generation's request token.
    pub request_token: String,
    /// Its deadline (Unix seconds); its score in pending adds its `enqueue_seq` fraction.
    pub deadline: i64,
}

/// An entry as stored, with its record decoded (or why it is not one).
fn listed(bytes: Vec<u8>, from_tail: usize) -> Listed {
    let raw = String::from_utf8_lossy(&bytes).into_owned();
    let record = serde_json::from_str::<DeadRecord>(&raw).map_err(|e| e.to_string());
    Listed {
        raw,
        record,
        from_tail,
    }
}

/// The order a reading goes in (see [`DeadLetters::pages`] and [`DeadLetters::oldest_pages`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    NewestFirst,
    OldestFirst,
}

/// A reading of a dead list, one page per [`Pages::next`], each page sized by the bytes of the
/// one before (see [`PAGE_BYTES`]), so neither Redis nor this process handles more than a few
/// megabytes at a time however long the list and however big its records.
#[derive(Debug)]
pub struct Pages {
    key: String,
    con: Link,
    order: Order,
    /// Entries not read yet, of those there were when the reading started.
    left: usize,
    /// Oldest first: entries read that are still in the list, between the tail and the next
    /// page (the caller says how many it removed, [`Pages::removed`]).
    behind: usize,
    /// The most entries the reading still returns (a listing's `--limit`).
    wanted: usize,
    /// The most entries one `LRANGE` asks for.
    most: usize,
    /// How many entries the next `LRANGE` asks for.
    size: usize,
}

impl Pages {
    /// The next page (newest first, or oldest first as the reading was opened); `None` once
    /// every entry there was is read.
    pub async fn next(&mut self) -> Result<Option<Vec<Listed>>, QueueError> {
        let n = self.left.min(self.size).min(self.wanted);
        if n == 0 {
            return Ok(None);
        }
        let place = |i: usize| -isize::try_from(i).unwrap_or(isize::MAX);
        // Places counted from the tail: records are pushed at the head, which moves every place
        // counted from the head while this reads.
        let (start, stop) = match self.order {
            // The newest of the entries not read yet, which are the oldest `left` of the list.
            Order::NewestFirst => (place(self.left), place(self.left - n + 1)),
            // The oldest entries not read yet: just past those read and kept.
            Order::OldestFirst => (place(self.behind + n), place(self.behind + 1)),
        };
        let entries: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(&self.key)
            .arg(start)
            .arg(stop)
            .query_async(&mut self.con)
            .await?;
        let got = entries.len();
        let biggest = entries.iter().map(Vec::len).max().unwrap_or(0);
        let page: Vec<Listed> = match self.order {
            Order::NewestFirst => entries
                .into_iter()
                .enumerate()
                .map(|(i, e)| listed(e, self.left - 1 - i))
                .collect(),
            // LRANGE answers head first: the last entry is the oldest.
            Order::OldestFirst => entries
                .into_iter()
                .rev()
                .enumerate()
                .map(|(i, e)| listed(e, self.behind + i))
                .collect(),
        };
        // Shorter than asked: entries were removed meanwhile and the list ends sooner.
        self.left = if got < n { 0 } else { self.left - n };
        if self.order == Order::OldestFirst {
            self.behind += got;
        }
        self.wanted = self.wanted.saturating_sub(got);
        self.size = self
            .most
            .min(self.size.saturating_mul(2))
            .min((PAGE_BYTES / biggest.max(1)).max(1));
        Ok(Some(page))
    }

    /// The caller removed `n` of the entries read (oldest first: the next page starts that much
    /// nearer the tail).
    pub fn removed(&mut self, n: usize) {
        self.behind = self.behind.saturating_sub(n);
    }
}

/// `LREM`'s count for removing one copy of `entry`: scanning from the tail (-1) when it is
/// nearer the tail of a list `len` long, from the head (1) otherwise.
fn lrem_count(entry: &Listed, len: usize) -> i64 {
    if entry.from_tail.saturating_mul(2) < len {
        -1
    } else {
        1
    }
}

/// One queue's dead list.
#[derive(Debug, Clone)]
pub struct DeadLetters {
    keys: QueueKeys,
    con: Link,
}

impl DeadLetters {
    pub fn new(con: impl Into<Link>, queue_name: &str) -> DeadLetters {
        let con = con.into();
        DeadLetters {
            keys: QueueKeys::for_layout(queue_name, con.is_cluster()),
            con,
        }
    }

    pub fn key(&self) -> &str {
        &self.keys.dead
    }

    /// Every entry there was when the call started, newest first (see [`DeadLetters::pages`];
    /// this holds them all).
    pub async fn list(&self) -> Result<Vec<Listed>, QueueError> {
        let mut pages = self.pages().await?;
        let mut all = Vec::new();
        while let Some(page) = pages.next().await? {
            all.extend(page);
        }
        Ok(all)
    }

    /// The `n` newest entries, newest first, a page at a time (a listing with a limit reads
    /// no more than that).
    pub async fn newest(&self, n: usize) -> Result<Pages, QueueError> {
        self.reading(Order::NewestFirst, n, PAGE).await
    }

    /// The entries there are now, newest first, a page at a time, so a long dead list is never
    /// held whole. Processors push new records at the head while this reads, which moves every
    /// position counted from the head, so a page-by-page read from the head would show some
    /// records twice and new ones too; positions counted from the tail do not move. So the
    /// length is taken first, and each page is the newest of the entries not read yet, counted
    /// from the tail. Removing entries already read (requeue, purge) moves none of the others.
    pub async fn pages(&self) -> Result<Pages, QueueError> {
        self.reading(Order::NewestFirst, usize::MAX, PAGE).await
    }

    /// The entries there are now, oldest first, a page at a time from the tail: the order in
    /// which to remove old records, since each is then at (or near) the tail, where `LREM`
    /// finds it at once. The caller says after each page how many of its entries it removed
    /// ([`Pages::removed`]); records pushed meanwhile are at the head and not read.
    pub async fn oldest_pages(&self) -> Result<Pages, QueueError> {
        self.reading(Order::OldestFirst, usize::MAX, PAGE).await
    }

    async fn reading(&self, order: Order, wanted: usize, most: usize) -> Result<Pages, QueueError> {
        let mut con = self.con.clone();
        let left: usize = redis::cmd("LLEN")
            .arg(&self.keys.dead)
            .query_async(&mut con)
            .await?;
        let most = most.max(1);
        Ok(Pages {
            key: self.keys.dead.clone(),
            con,
            order,
            left,
            behind: 0,
            wanted,
            most,
            size: FIRST_PAGE.min(most),
        })
    }

    /// The member a requeue would write, or why there is none: the record's exact member
    /// re-tokened as a new generation.
    pub fn revive(listed: &Listed, now_ms: i64) -> Result<(Envelope, Vec<u8>), Unrequeueable> {
        let record = listed
            .record
            .as_ref()
            .map_err(|e| Unrequeueable::NotARecord(e.clone()))?;
        if record.member_truncated {
            return Err(Unrequeueable::Truncated(record.member_bytes));
        }
        let member = record.exact_member().ok_or(Unrequeueable::Lossy)?;
        let mut env =
            Envelope::decode(member).map_err(|e| Unrequeueable::Malformed(e.to_string()))?;
        if env.request.deadline.saturating_mul(1000) <= now_ms {
            return Err(Unrequeueable::Expired(env.request.deadline));
        }
        env.internal.request_token = fresh_token();
        env.internal.retry_count = 0;
        let bytes = env.encode();
        Ok((env, bytes))
    }

    /// dead -> pending as a new generation (see the module comment).
    pub async fn requeue(
        &self,
        listed: &Listed,
        now_ms: i64,
    ) -> Result<Result<Requeued, Unrequeueable>, QueueError> {
        let (env, member) = match Self::revive(listed, now_ms) {
            Ok(revived) => revived,
            Err(why) => return Ok(Err(why)),
        };
        let id = env.request.id.clone();
        let old_token = listed
            .record
            .as_ref()
            .map(|r| r.request_token.clone())
            .unwrap_or_default();
        let deadline = env.request.deadline;
        let ttl_ms = (deadline.saturating_mul(1000) - now_ms).max(1).to_string();
        let cluster = self.con.is_cluster();
        let mut keys = vec![self.keys.dead.clone(), self.keys.pending.clone()];
        if cluster {
            // The markers live in other slots: checked here, the active one written after.
            if let Err(why) = self.check_markers_apart(&env, &old_token).await? {
                return Ok(Err(why));
            }
        } else {
            push_marker_keys(&mut keys, &env);
        }
        let score = score_of(deadline, env.internal.enqueue_seq);
        let from_tail = listed.from_tail.to_string();
        let args: [&[u8]; 7] = [
            listed.raw.as_bytes(),
            &member,
            score.as_bytes(),
            env.internal.request_token.as_bytes(),
            old_token.as_bytes(),
            ttl_ms.as_bytes(),
            from_tail.as_bytes(),
        ];
        let cmd = SCRIPTS.requeue.cmd(&keys, &args);
        let reply = SCRIPTS.requeue.run(&mut self.con.clone(), &cmd).await?;
        if cluster && reply == Value::Int(1) {
            self.mark_active(&id, &env.internal.request_token, &ttl_ms)
                .await?;
        }
        requeued_of(reply, id, env)
    }

    /// On a cluster, where the producer's markers and a stored-apart body live in other slots
    /// than the dead list: whether they still let this generation be requeued, read before the
    /// script runs.
    async fn check_markers_apart(
        &self,
        env: &Envelope,
        old_token: &str,
    ) -> Result<Result<(), Unrequeueable>, QueueError> {
        let id = &env.request.id;
        let mut con = self.con.clone();
        let (active, cancel): (Option<String>, Option<String>) = (
            redis::cmd("GET")
                .arg(active_key(id))
                .query_async(&mut con)
                .await?,
            redis::cmd("GET")
                .arg(cancel_key(id))
                .query_async(&mut con)
                .await?,
        );
        if active.as_ref().is_some_and(|a| *a != old_token) {
            return Ok(Err(Unrequeueable::NewerGeneration(id.clone())));
        }
        if !old_token.is_empty() && cancel.as_deref() == Some(old_token) {
            return Ok(Err(Unrequeueable::Cancelled));
        }
        let payload = &env.internal.payload_ref;
        if !payload.is_empty() {
            // TYPE, not EXISTS: it is in the processor's ACL rule, which the operator's
            // extends.
            let kind: String = redis::cmd("TYPE")
                .arg(payload)
                .query_async(&mut con)
                .await?;
            if kind == "none" {
                return Ok(Err(Unrequeueable::PayloadGone(payload.clone())));
            }
        }
        Ok(Ok(()))
    }

    /// On a cluster, after the script requeued it: the producer's active marker names the new
    /// generation, for as long as its deadline allows.
    async fn mark_active(&self, id: &str, token: &str, ttl_ms: &str) -> Result<(), QueueError> {
        let _: () = redis::cmd("SET")
            .arg(active_key(id))
            .arg(token)
            .arg("PX")
            .arg(ttl_ms)
            .query_async(&mut self.con.clone())
            .await?;
        Ok(())
    }

    /// Removes these entries (each by its exact text, scanning from the end of the list it
    /// was read nearer to: see [`Listed::from_tail`]), in the order given; returns how many were
    /// still there.
    pub async fn purge(&self, entries: &[&Listed]) -> Result<u64, QueueError> {
        let mut removed = 0u64;
        let mut con = self.con.clone();
        for chunk in entries.chunks(REMOVE_CHUNK) {
            let len: usize = redis::cmd("LLEN")
                .arg(&self.keys.dead)
                .query_async(&mut con)
                .await?;
            let mut pipe = redis::pipe();
            for entry in chunk {
                pipe.cmd("LREM")
                    .arg(&self.keys.dead)
                    .arg(lrem_count(entry, len))
                    .arg(&entry.raw);
            }
            let counts: Vec<u64> = pipe.query_async(&mut con).await?;
            removed += counts.iter().sum::<u64>();
        }
        Ok(removed)
    }

    /// Removes every entry at once (one script); returns how many there were.
    pub async fn purge_all(&self) -> Result<u64, QueueError> {
        let cmd = SCRIPTS.purge_dead.cmd(&[&self.keys.dead], &[] as &[&str]);
        match SCRIPTS.purge_dead.run(&mut self.con.clone(), &cmd).await? {
            Value::Int(n) => Ok(u64::try_from(n).unwrap_or(0)),
            other => Err(QueueError::Reply {
                script: "purgeDead",
                detail: format!("{other:?}"),
            }),
        }
    }
}

/// On one server: the producer's markers of the generation (active, then cancel) and its
/// stored-apart body, checked by the script itself.
fn push_marker_keys(keys: &mut Vec<String>, env: &Envelope) {
    keys.push(active_key(&env.request.id));
    keys.push(cancel_key(&env.request.id));
    if !env.internal.payload_ref.is_empty() {
        keys.push(env.internal.payload_ref.clone());
    }
}

/// What the `requeue` script's reply says about the generation of request `id`.
fn requeued_of(
    reply: Value,
    id: String,
    env: Envelope,
) -> Result<Result<Requeued, Unrequeueable>, QueueError> {
    let deadline = env.request.deadline;
    Ok(match reply {
        Value::Int(1) => Ok(Requeued {
            id,
            request_token: env.internal.request_token,
            deadline,
        }),
        Value::Int(0) => Err(Unrequeueable::Gone),
        Value::Int(-1) => Err(Unrequeueable::NewerGeneration(id)),
        Value::Int(-2) => Err(Unrequeueable::Cancelled),
        Value::Int(-3) => Err(Unrequeueable::PayloadGone(env.internal.payload_ref)),
        other => {
            return Err(QueueError::Reply {
                script: "requeue",
                detail: format!("{other:?}"),
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use redis::AsyncCommands;

    use super::*;
    use inferq_client::producer::unix_ms;
    use inferq_testkit::RedisServer;

    /// A fresh Redis, a connection to it and the dead list of queue `q`.
    async fn dead_list() -> (RedisServer, redis::aio::ConnectionManager, DeadLetters) {
        let server = RedisServer::start().expect("redis-server");
        let client = redis::Client::open(server.url()).unwrap();
        // As the CLI connects (seconds per command, not redis-rs's default 500 ms).
        let con = inferq_client::connect::manager(&client).await.unwrap();
        let dead = DeadLetters::new(con.clone(), "q");
        (server, con, dead)
    }

    /// `list --limit N` reads the N newest entries, newest first, as the whole listing would
    /// show them.
    #[tokio::test]
    async fn newest_are_the_head_of_the_listing() {
        let (_server, mut con, dead) = dead_list().await;
        let records: Vec<String> = (0..10).map(|i| format!("r{i}")).collect();
        let _: () = con.lpush(dead.key(), &records).await.unwrap();
        let raws = |entries: Vec<Listed>| entries.into_iter().map(|l| l.raw).collect::<Vec<_>>();
        let all = raws(dead.list().await.unwrap());
        assert_eq!(all[0], "r9");
        assert_eq!(
            raws(read_all(dead.newest(3).await.unwrap()).await),
            all[..3]
        );
        assert_eq!(raws(read_all(dead.newest(100).await.unwrap()).await), all);
        assert!(read_all(dead.newest(0).await.unwrap()).await.is_empty());
    }

    /// Every page of a reading, one after the other.
    async fn read_all(mut pages: Pages) -> Vec<Listed> {
        let mut all = Vec::new();
        while let Some(page) = pages.next().await.unwrap() {
            all.extend(page);
        }
        all
    }

    /// A dead list of 100 KB records is read a few megabytes at a time, whichever way it is
    /// read (all of it, `--limit`, oldest first), and every record once. Before, a page was
    /// 1,000 records whatever their size: 100 MB in one LRANGE, which held Redis for half a
    /// second (3,000 records of 100 KB: 510 ms, and 360 MB in the CLI).
    #[tokio::test]
    async fn pages_of_big_records_are_a_few_megabytes() {
        let (_server, mut con, dead) = dead_list().await;
        let records: Vec<String> = (0..120)
            .map(|i| format!("{i:04}{}", "x".repeat(100_000)))
            .collect();
        let _: () = con.lpush(dead.key(), &records).await.unwrap();
        let newest_first: Vec<&str> = records.iter().rev().map(String::as_str).collect();
        for (how, mut pages, want) in [
            ("all", dead.pages().await.unwrap(), newest_first.clone()),
            (
                "limit",
                dead.newest(100).await.unwrap(),
                newest_first[..100].to_vec(),
            ),
            (
                "oldest",
                dead.oldest_pages().await.unwrap(),
                records.iter().map(String::as_str).collect(),
            ),
        ] {
            let mut read = Vec::new();
            while let Some(page) = pages.next().await.unwrap() {
                let bytes: usize = page.iter().map(|l| l.raw.len()).sum();
                assert!(bytes <= PAGE_BYTES, "{how}: one page of {bytes} bytes");
                read.extend(page.into_iter().map(|l| l.raw));
            }
            assert_eq!(read, want, "{how}");
        }
    }

    /// A removal takes the entry where it was read, scanning from the end of the list it is
    /// nearer to: of two identical entries, one at each end, purging or requeueing the one read
    /// at the tail leaves the head's. (Before, both scanned from the head: a record read at the
    /// tail of a 200,000-record list cost a scan of the whole list, 10 ms or more of Redis's
    /// time each, and `purge --older-than` of 100,000 such records never finished.)
    #[tokio::test]
    async fn an_entry_is_removed_at_the_end_it_was_read_from() {
        let (_server, mut con, dead) = dead_list().await;
        let member = format!(
            r#"{{"internal":{{"request_token":"t1"}},"request_kind":"plain","data":{{"id":"twin","deadline":{},"payload":{{}}}}}}"#,
            unix_ms() / 1000 + 600
        );
        let mut record = DeadRecord::new("q", "poison", member.as_bytes());
        record.id = "twin".to_owned();
        record.request_token = "t1".to_owned();
        for twin in [record.to_json(), "plain twin".to_owned()] {
            let filler: Vec<String> = (0..50).map(|i| format!("filler-{i}")).collect();
            let _: () = con.del(dead.key()).await.unwrap();
            let _: () = con.rpush(dead.key(), &twin).await.unwrap();
            let _: () = con.rpush(dead.key(), &filler).await.unwrap();
            let _: () = con.rpush(dead.key(), &twin).await.unwrap();
            let mut pages = dead.oldest_pages().await.unwrap();
            let page = pages.next().await.unwrap().unwrap();
            let oldest = &page[0];
            assert_eq!((oldest.raw.as_str(), oldest.from_tail), (twin.as_str(), 0));
            if oldest.record.is_ok() {
                let requeued = dead.requeue(oldest, unix_ms()).await.unwrap();
                assert!(requeued.is_ok(), "{requeued:?}");
            } else {
                assert_eq!(dead.purge(&[oldest]).await.unwrap(), 1);
            }
            let left: Vec<String> = con.lrange(dead.key(), 0, -1).await.unwrap();
            assert_eq!(left.len(), 51);
            assert_eq!(left[0], twin, "the head's copy was removed");
            assert_eq!(left[50], "filler-49");
        }
    }

    /// Reading oldest first and purging some of each page (as `purge --older-than` does) reads
    /// every entry that was there once, oldest first, removes exactly the chosen ones, and
    /// reads none pushed meanwhile.
    #[tokio::test]
    async fn oldest_first_pages_survive_the_removal_of_some_of_what_was_read() {
        let (_server, mut con, dead) = dead_list().await;
        let old: Vec<String> = (0..2500).map(|i| format!("e-{i:04}")).collect();
        // e-0000 is the oldest: at the tail.
        let _: () = con.lpush(dead.key(), &old).await.unwrap();
        let mut pages = dead
            .reading(Order::OldestFirst, usize::MAX, 100)
            .await
            .unwrap();
        let mut read = Vec::new();
        while let Some(page) = pages.next().await.unwrap() {
            assert!(page.len() <= 100);
            let _: () = con.lpush(dead.key(), "pushed meanwhile").await.unwrap();
            let chosen: Vec<&Listed> = page
                .iter()
                .filter(|l| l.raw.ends_with(['0', '5']))
                .collect();
            let removed = dead.purge(&chosen).await.unwrap();
            assert_eq!(removed, chosen.len() as u64);
            pages.removed(chosen.len());
            read.extend(page.into_iter().map(|l| l.raw));
        }
        assert_eq!(read, old);
        let left: Vec<String> = con.lrange(dead.key(), 0, -1).await.unwrap();
        let kept: Vec<&String> = left.iter().filter(|r| r.starts_with("e-")).collect();
        let want: Vec<&String> = old
            .iter()
            .rev()
            .filter(|r| !r.ends_with(['0', '5']))
            .collect();
        assert_eq!(kept, want);
    }

    /// A listing taken while processors keep pushing records shows each record that was there
    /// when it started exactly once, newest first, and nothing pushed after it started.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_busy_dead_list_is_listed_without_repeats() {
        let (_server, mut con, dead) = dead_list().await;
        let old: Vec<String> = (0..2000).map(|i| format!("old-{i:04}")).collect();
        // LPUSH one by one: the newest, old-1999, ends at the head.
        let _: () = con.lpush(dead.key(), &old).await.unwrap();

        let pushing = tokio::spawn({
            let mut con = con.clone();
            let key = dead.key().to_owned();
            async move {
                for i in 0.. {
                    let pushed: redis::RedisResult<()> = con.lpush(&key, format!("new-{i}")).await;
                    if pushed.is_err() {
                        break;
                    }
                    tokio::task::yield_now().await;
                }
            }
        });
        // Let the pusher get going, then list in small pages while it pushes.
        while con.llen::<_, usize>(dead.key()).await.unwrap() < 2100 {
            tokio::task::yield_now().await;
        }
        let mut pages = dead
            .reading(Order::NewestFirst, usize::MAX, 100)
            .await
            .unwrap();
        let mut listed = Vec::new();
        while let Some(page) = pages.next().await.unwrap() {
            assert!(page.len() <= 100);
            listed.extend(page);
        }
        let after = con.llen::<_, usize>(dead.key()).await.unwrap();
        pushing.abort();

        let raws: Vec<&str> = listed.iter().map(|l| l.raw.as_str()).collect();
        let distinct: HashSet<&str> = raws.iter().copied().collect();
        assert_eq!(distinct.len(), raws.len(), "records listed twice");
        assert!(
            after > raws.len(),
            "the pusher did not push during the listing"
        );
        let olds: Vec<&str> = raws
            .iter()
            .copied()
            .filter(|r| r.starts_with("old-"))
            .collect();
        let newest_first: Vec<&str> = old.iter().rev().map(String::as_str).collect();
        assert_eq!(olds, newest_first);
        // Whatever was listed besides the old records was there when the listing started.
        assert!(raws[..raws.len() - olds.len()]
            .iter()
            .all(|r| r.starts_with("new-")));
        assert!(listed.iter().all(|l| l.record.is_err()));
    }

    /// `purge --all` is one script: under a user without MULTI (README's operator user) it
    /// removes every record and counts them; under one that may not DEL it removes nothing.
    /// Before, it was a MULTI transaction, which such a user was refused while the LLEN and DEL
    /// queued behind it ran alone: an error, and the dead list gone anyway.
    #[tokio::test]
    async fn purge_all_is_all_or_nothing_whatever_the_user_may_run() {
        let (server, mut con, _) = dead_list().await;
        let as_user = |name: &str, rules: &[&str]| {
            let mut args = vec!["SETUSER", name, "on", ">pw", "~*", "&*", "+@all"];
            args.extend_from_slice(rules);
            let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
            let url = format!("redis://{name}:pw@127.0.0.1:{}/", server.port());
            (args, url)
        };
        for (name, rules, purged) in [
            ("no-del", &["-del", "-unlink"][..], None),
            ("no-unlink", &["-unlink"][..], Some(2)),
            ("no-multi", &["-multi", "-exec"][..], Some(2)),
        ] {
            let _: () = con.lpush("q:dead", &["r1", "r2"]).await.unwrap();
            let (args, url) = as_user(name, rules);
            let _: () = redis::cmd("ACL")
                .arg(&args)
                .query_async(&mut con)
                .await
                .unwrap();
            let user = inferq_client::connect::manager(&redis::Client::open(url).unwrap())
                .await
                .unwrap();
            let got = DeadLetters::new(user, "q").purge_all().await;
            assert_eq!(got.as_ref().ok().copied(), purged, "{name}: {got:?}");
            let left: u64 = con.llen("q:dead").await.unwrap();
            assert_eq!(left, if purged.is_some() { 0 } else { 2 }, "{name}");
            let _: () = con.del("q:dead").await.unwrap();
        }
    }

    /// `purge --all` hands the list to Redis's background thread (UNLINK) instead of freeing it
    /// in the command (DEL): a dead list of 300 MB held Redis 18 ms in DEL, and that grows with
    /// its bytes.
    #[tokio::test]
    async fn purge_all_frees_the_list_in_the_background() {
        let (_server, mut con, dead) = dead_list().await;
        let records: Vec<String> = (0..100)
            .map(|i| format!("{i}{}", "x".repeat(10_000)))
            .collect();
        let _: () = con.rpush(dead.key(), &records).await.unwrap();
        assert_eq!(dead.purge_all().await.unwrap(), 100);
        assert_eq!(con.llen::<_, u64>(dead.key()).await.unwrap(), 0);
        let stats: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut con)
            .await
            .unwrap();
        assert!(stats.contains("cmdstat_unlink:calls=1,"), "{stats}");
        assert!(!stats.contains("cmdstat_del:"), "{stats}");
    }

    /// Purging each page after reading it (as `purge --older-than` and `requeue --all` do) moves
    /// none of the entries still to read: every entry is read once and the list ends empty.
    #[tokio::test]
    async fn pages_survive_the_removal_of_what_was_read() {
        let (_server, mut con, dead) = dead_list().await;
        let old: Vec<String> = (0..2500).map(|i| format!("e-{i:04}")).collect();
        let _: () = con.lpush(dead.key(), &old).await.unwrap();
        let mut pages = dead
            .reading(Order::NewestFirst, usize::MAX, 100)
            .await
            .unwrap();
        let mut read = Vec::new();
        while let Some(page) = pages.next().await.unwrap() {
            let entries: Vec<&Listed> = page.iter().collect();
            assert_eq!(dead.purge(&entries).await.unwrap(), page.len() as u64);
            read.extend(page.into_iter().map(|l| l.raw));
        }
        let newest_first: Vec<String> = old.iter().rev().cloned().collect();
        assert_eq!(read, newest_first);
        assert_eq!(con.llen::<_, usize>(dead.key()).await.unwrap(), 0);
    }
}
