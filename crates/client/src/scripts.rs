//! The Lua scripts of the durability contract, loaded from `lua/*.lua` at compile time with
//! their shared fragments from `lua/includes/`, and the machinery to run them.
//!
//! Scripts run by `EVALSHA`. When Redis answers `NOSCRIPT` (after `SCRIPT FLUSH`, a restart or a
//! fail-over) the script is loaded and the call repeated (a call that hit `NOSCRIPT` did not run).

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

/// One script: its name (for errors and metrics), its source and its SHA1.
#[derive(Debug)]
pub struct Script {
    pub name: &'static str,
    source: String,
    sha: String,
}

impl Script {
    /// A script named `name` (for errors), its `includes` put before its `body`.
    pub fn new(name: &'static str, includes: &[&str], body: &str) -> Script {
        let mut source = String::new();
        for include in includes {
            source.push_str(include);
            source.push('\n');
        }
        source.push_str(body);
        let sha = sha1_smol::Sha1::from(source.as_bytes())
            .digest()
            .to_string();
        Script { name, source, sha }
    }

    /// The SHA1 of the source, which `EVALSHA` names it by.
    pub fn sha(&self) -> &str {
        &self.sha
    }

    /// An `EVALSHA` command for these keys and arguments.
    pub fn cmd<K: redis::ToRedisArgs, A: redis::ToRedisArgs>(&self, keys: &[K], args: &[A]) -> Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(&self.sha).arg(keys.len());
        for k in keys {
            cmd.arg(k);
        }
        for a in args {
            cmd.arg(a);
        }
        cmd
    }

    /// `SCRIPT LOAD`s this script.
    pub async fn load<C: ConnectionLike>(&self, con: &mut C) -> RedisResult<()> {
        let _: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(&self.source)
            .query_async(con)
            .await?;
        Ok(())
    }

    /// Runs one call, loading the script first if Redis has lost it.
    pub async fn run<C: ConnectionLike>(&self, con: &mut C, cmd: &Cmd) -> RedisResult<Value> {
        match cmd.query_async::<Value>(con).await {
            Err(e) if is_noscript(&e) => {
                self.load(con).await?;
                cmd.query_async(con).await
            }
            other => other,
        }
    }
}

fn is_noscript(e: &RedisError) -> bool {
    e.kind() == ErrorKind::Server(ServerErrorKind::NoScript)
}

macro_rules! lua {
    ($name:literal) => {
        include_str!(concat!("lua/", $name, ".lua"))
    };
}

const NOW_MS: &str = lua!("includes/nowMs");
const DROP_CLAIM: &str = lua!("includes/dropClaim");
const DEADLINE_OF: &str = lua!("includes/deadlineOf");
const WRITABLE: &str = lua!("includes/writable");
const DELIVER: &str = lua!("includes/deliver");
const STAMP_SEQ: &str = lua!("includes/stampSeq");

/// Every script inferq runs.
pub struct Scripts {
    pub take: Script,
    pub renew: Script,
    pub finish: Script,
    pub promote: Script,
    pub release: Script,
    pub reclaim: Script,
    pub dead_letter: Script,
    pub cancel: Script,
    pub hand_back: Script,
    pub requeue: Script,
    pub purge_dead: Script,
    pub hold_name: Script,
    pub drop_name: Script,
    pub admit: Script,
    pub census: Script,
    pub adopt_counts: Script,
    pub deliver_once: Script,
    pub unstage: Script,
    pub forget: Script,
    pub stale_staged: Script,
    pub submit: Script,
    pub enqueue: Script,
    pub result_receive: Script,
    pub result_renew: Script,
    pub result_ack: Script,
    pub forget_idle: Script,
}

/// The scripts, built once.
pub static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    take: Script::new("take", &[NOW_MS, WRITABLE], lua!("take-5")),
    renew: Script::new("renew", &[NOW_MS], lua!("renew-2")),
    finish: Script::new(
        "finish",
        &[NOW_MS, DEADLINE_OF, WRITABLE, DELIVER],
        lua!("finish-11"),
    ),
    promote: Script::new(
        "promote",
        &[NOW_MS, DEADLINE_OF, WRITABLE],
        lua!("promote-3"),
    ),
    release: Script::new(
        "release",
        &[DROP_CLAIM, DEADLINE_OF, WRITABLE],
        lua!("release-5"),
    ),
    reclaim: Script::new(
        "reclaim",
        &[NOW_MS, DROP_CLAIM, DEADLINE_OF, WRITABLE],
        lua!("reclaim-7"),
    ),
    dead_letter: Script::new(
        "deadLetter",
        &[NOW_MS, WRITABLE, DELIVER],
        lua!("deadLetter-5"),
    ),
    cancel: Script::new("cancel", &[], lua!("cancel-2")),
    hand_back: Script::new("handBack", &[], lua!("handBack-2")),
    requeue: Script::new("requeue", &[WRITABLE], lua!("requeue-4")),
    purge_dead: Script::new("purgeDead", &[], lua!("purgeDead-1")),
    hold_name: Script::new("holdName", &[], lua!("holdName-1")),
    drop_name: Script::new("dropName", &[], lua!("dropName-1")),
    admit: Script::new("admit", &[NOW_MS, DEADLINE_OF, WRITABLE], lua!("admit-1")),
    // No includes: its first line must be its `#!lua` flags.
    census: Script::new("census", &[], lua!("census-7")),
    adopt_counts: Script::new(
        "adoptCounts",
        &[NOW_MS, DEADLINE_OF, WRITABLE],
        lua!("adoptCounts-3"),
    ),
    deliver_once: Script::new("deliverOnce", &[NOW_MS, WRITABLE], lua!("deliverOnce-2")),
    unstage: Script::new("unstage", &[], lua!("unstage-3")),
    forget: Script::new("forget", &[], lua!("forget-1")),
    stale_staged: Script::new("staleStaged", &[NOW_MS], lua!("staleStaged-2")),
    submit: Script::new(
        "submit",
        &[DEADLINE_OF, WRITABLE, STAMP_SEQ],
        lua!("submit-5"),
    ),
    enqueue: Script::new(
        "enqueue",
        &[DEADLINE_OF, WRITABLE, STAMP_SEQ],
        lua!("enqueue-2"),
    ),
    // Durable result consumers (`crate::durable_results`); loaded at their first call.
    result_receive: Script::new("resultReceive", &[NOW_MS], lua!("resultReceive-5")),
    result_renew: Script::new("resultRenew", &[NOW_MS], lua!("resultRenew-2")),
    result_ack: Script::new("resultAck", &[NOW_MS], lua!("resultAck-4")),
    // `fair-share` discovery (`inferq::dispatch::discovery`); loaded at its first call.
    forget_idle: Script::new("forgetIdle", &[], lua!("forgetIdle-1")),
});

impl Scripts {
    /// The processor's scripts (loaded at its start). The census is left out: only
    /// `inferq status` runs it, and its `#!lua` flags line needs Redis 7.
    pub fn all(&self) -> [&Script; 19] {
        [
            &self.take,
            &self.renew,
            &self.finish,
            &self.promote,
            &self.release,
            &self.reclaim,
            &self.dead_letter,
            &self.cancel,
            &self.hand_back,
            &self.requeue,
            &self.purge_dead,
            &self.hold_name,
            &self.drop_name,
            &self.admit,
            &self.adopt_counts,
            &self.deliver_once,
            &self.unstage,
            &self.forget,
            &self.stale_staged,
        ]
    }

    /// Loads every script (at start-up, so the first real call does not pay for it).
    pub async fn load_all<C: ConnectionLike>(&self, con: &mut C) -> RedisResult<()> {
        for script in self.all() {
            script.load(con).await?;
        }
        Ok(())
    }
}
