//! The operator's moves on a queue's dead-letter list (`<queue>:dead`): read the records,
//! requeue a dead request as a new generation, purge records.
//!
//! Records come in as the JSON the processor pushed (see [`DeadRecord`]); they leave as
//! [`Listed`] entries that keep the exact stored text, because that text is how a record is
//! found again in the list (`LREM` by value) — records have no other key.
//!
//! Requeue is one script ([`super::scripts::Scripts::requeue`]): the record leaves the dead list
//! in the same step the request enters pending, and only if it does. It makes a **new
//! generation** (fresh request token, `retry_count` 0, the producer's `data` bytes untouched):
//! the dead generation already has its one terminal record, so it may never reach done again.
//! A consumer of the result list therefore sees the id twice — the dead generation's
//! `DEAD_LETTERED` / `INVALID_REQUEST` result, then the new generation's result — exactly as
//! when a producer re-submits an id.

use redis::aio::ConnectionManager;
use redis::Value;

use super::dead::DeadRecord;
use super::keys::{active_key, cancel_key, fresh_token, QueueKeys};
use super::moves::QueueError;
use super::scripts::SCRIPTS;
use crate::wire::Envelope;

/// Records read per `LRANGE`.
const PAGE: isize = 1000;

/// One entry of the dead list.
#[derive(Debug, Clone)]
pub struct Listed {
    /// The entry exactly as stored (what requeue and purge remove).
    pub raw: String,
    /// The decoded record, or why the entry is not one (written by something else).
    pub record: Result<DeadRecord, String>,
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
}

/// What a requeue did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Requeued {
    pub id: String,
    /// The new generation's request token.
    pub request_token: String,
    /// Its score in pending (the deadline, Unix seconds).
    pub deadline: i64,
}

/// An entry as stored, with its record decoded (or why it is not one).
fn listed(bytes: Vec<u8>) -> Listed {
    let raw = String::from_utf8_lossy(&bytes).into_owned();
    let record = serde_json::from_str::<DeadRecord>(&raw).map_err(|e| e.to_string());
    Listed { raw, record }
}

/// A reading of a dead list, newest first, one page per [`Pages::next`] (from
/// [`DeadLetters::pages`]).
pub struct Pages {
    key: String,
    con: ConnectionManager,
    /// Entries not read yet: the oldest `left` of the list, whose places counted from the tail
    /// stay put.
    left: isize,
    page: isize,
}

impl Pages {
    /// The next page, newest first; `None` once every entry there was is read.
    pub async fn next(&mut self) -> Result<Option<Vec<Listed>>, QueueError> {
        if self.left <= 0 {
            return Ok(None);
        }
        let n = self.left.min(self.page);
        let start = -self.left;
        let entries: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(&self.key)
            .arg(start)
            .arg(start + n - 1)
            .query_async(&mut self.con)
            .await?;
        // Shorter than asked: older entries were removed meanwhile and the list ends sooner.
        self.left = match entries.len() < usize::try_from(n).unwrap_or(usize::MAX) {
            true => 0,
            false => self.left - n,
        };
        Ok(Some(entries.into_iter().map(listed).collect()))
    }
}

/// One queue's dead list.
#[derive(Clone)]
pub struct DeadLetters {
    keys: QueueKeys,
    con: ConnectionManager,
}

impl DeadLetters {
    pub fn new(con: ConnectionManager, queue_name: &str) -> DeadLetters {
        DeadLetters {
            keys: QueueKeys::new(queue_name),
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

    /// The `n` newest entries, newest first, read in one step (a listing with a limit need not
    /// read the whole list).
    pub async fn newest(&self, n: usize) -> Result<Vec<Listed>, QueueError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let entries: Vec<Vec<u8>> = redis::cmd("LRANGE")
            .arg(&self.keys.dead)
            .arg(0)
            .arg(isize::try_from(n).unwrap_or(isize::MAX) - 1)
            .query_async(&mut self.con.clone())
            .await?;
        Ok(entries.into_iter().map(listed).collect())
    }

    /// The entries there are now, newest first, a page at a time, so a long dead list is never
    /// held whole. Processors push new records at the head while this reads, which moves every
    /// position counted from the head, so a page-by-page read from the head would show some
    /// records twice and new ones too; positions counted from the tail do not move. So the
    /// length is taken first, and each page is the newest of the entries not read yet, counted
    /// from the tail. Removing entries already read (requeue, purge) moves none of the others.
    pub async fn pages(&self) -> Result<Pages, QueueError> {
        self.pages_of(PAGE).await
    }

    async fn pages_of(&self, page: isize) -> Result<Pages, QueueError> {
        let mut con = self.con.clone();
        let left: isize = redis::cmd("LLEN")
            .arg(&self.keys.dead)
            .query_async(&mut con)
            .await?;
        Ok(Pages {
            key: self.keys.dead.clone(),
            con,
            left,
            page: page.max(1),
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
        let keys = [
            self.keys.dead.clone(),
            self.keys.pending.clone(),
            active_key(&id),
            cancel_key(&id),
        ];
        let score = deadline.to_string();
        let args: [&[u8]; 6] = [
            listed.raw.as_bytes(),
            &member,
            score.as_bytes(),
            env.internal.request_token.as_bytes(),
            old_token.as_bytes(),
            ttl_ms.as_bytes(),
        ];
        let cmd = SCRIPTS.requeue.cmd(&keys, &args);
        let reply = SCRIPTS.requeue.run(&mut self.con.clone(), &cmd).await?;
        Ok(match reply {
            Value::Int(1) => Ok(Requeued {
                id,
                request_token: env.internal.request_token,
                deadline,
            }),
            Value::Int(0) => Err(Unrequeueable::Gone),
            Value::Int(-1) => Err(Unrequeueable::NewerGeneration(id)),
            Value::Int(-2) => Err(Unrequeueable::Cancelled),
            other => {
                return Err(QueueError::Reply {
                    script: "requeue",
                    detail: format!("{other:?}"),
                })
            }
        })
    }

    /// Removes these entries (each by its exact text); returns how many were still there.
    pub async fn purge(&self, entries: &[&str]) -> Result<u64, QueueError> {
        let mut removed = 0u64;
        for chunk in entries.chunks(500) {
            let mut pipe = redis::pipe();
            for raw in chunk {
                pipe.cmd("LREM").arg(&self.keys.dead).arg(1).arg(*raw);
            }
            let counts: Vec<u64> = pipe.query_async(&mut self.con.clone()).await?;
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

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use redis::AsyncCommands;

    use super::*;
    use crate::testkit::RedisServer;

    /// A fresh Redis, a connection to it and the dead list of queue `q`.
    async fn dead_list() -> (RedisServer, redis::aio::ConnectionManager, DeadLetters) {
        let server = RedisServer::start().expect("redis-server");
        let client = redis::Client::open(server.url()).unwrap();
        // As the CLI connects (seconds per command, not redis-rs's default 500 ms).
        let con = crate::queue::connect::manager(&client).await.unwrap();
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
        assert_eq!(raws(dead.newest(3).await.unwrap()), all[..3]);
        assert_eq!(raws(dead.newest(100).await.unwrap()), all);
        assert!(dead.newest(0).await.unwrap().is_empty());
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
        let mut pages = dead.pages_of(100).await.unwrap();
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
            let user = crate::queue::connect::manager(&redis::Client::open(url).unwrap())
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
        let mut pages = dead.pages_of(100).await.unwrap();
        let mut read = Vec::new();
        while let Some(page) = pages.next().await.unwrap() {
            let raws: Vec<&str> = page.iter().map(|l| l.raw.as_str()).collect();
            assert_eq!(dead.purge(&raws).await.unwrap(), raws.len() as u64);
            read.extend(page.into_iter().map(|l| l.raw));
        }
        let newest_first: Vec<String> = old.iter().rev().cloned().collect();
        assert_eq!(read, newest_first);
        assert_eq!(con.llen::<_, usize>(dead.key()).await.unwrap(), 0);
    }
}
