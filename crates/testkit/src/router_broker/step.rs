//! The step itself: a POST admitted (validated, classified or enqueued), a `wait` held until its
//! mailbox fills, and the fetch, delete and cancel of a queued request, against a real Redis.
//!
//! Data enters as a request's path, headers and body bytes (or a tenant and an id), goes to
//! Redis as the router writes it (see the module above), and leaves as [`Served`] or an
//! [`Answer`], with a [`Queued`] record of the bytes written.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use serde_json::Value;

use super::answer::{answer_of, models, openai_error, pending, plain_error, Answer, StoredResult};
use super::config::{BrokerConfig, ConfigError};
use super::go_json;

/// How long a cancel marker lives (producer v0.9.0: 7 days).
pub const CANCEL_MARKER_TTL_SECONDS: u64 = 7 * 24 * 3600;
/// The `wait` poll without keyspace notifications, and the backup poll under them.
const POLL: Duration = Duration::from_millis(200);
const BACKUP_POLL: Duration = Duration::from_secs(2);

const CANCEL: &str = include_str!("cancel.lua");
const QUOTA_ACQUIRE: &str = include_str!("quota-acquire.lua");
const QUOTA_RELEASE: &str = include_str!("quota-release.lua");

/// Why the emulation could not start.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("config: {0}")]
    Config(#[from] ConfigError),
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

/// A queued mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Enqueue,
    Wait,
}

/// The active marker's TTL as go-redis sends it: `PX` unless the duration is whole seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveTtl {
    Px(i64),
    Ex(i64),
}

/// What one enqueue wrote: the step's record of a queued request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Queued {
    pub mode: Mode,
    /// The client-visible id (the validated `X-Request-Id`, or a minted UUID).
    pub id: String,
    pub tenant: String,
    /// `<tenant>:<id>`: the envelope's id, and the markers' suffix.
    pub envelope_id: String,
    /// `results:req:<tenant>:<id>`
    pub mailbox: String,
    pub queue: String,
    pub tier: String,
    /// `request-active:<env>`'s value: 16 random bytes, hex.
    pub token: String,
    pub created: i64,
    /// Unix seconds; also the member's score.
    pub deadline: i64,
    /// The request's timeout (the hold of `wait` runs this long, or to the cap).
    pub timeout: Duration,
    pub active_ttl: ActiveTtl,
    /// The sorted-set member, Go's bytes.
    pub member: String,
}

/// A reserved quota slot of a passthrough request: [`QuotaSlot::release`] gives it back (the
/// router releases when the request's context ends); dropped unreleased, it is released in the
/// background.
#[derive(Debug)]
pub struct QuotaSlot {
    con: Option<MultiplexedConnection>,
    key: String,
    window: i64,
}

impl QuotaSlot {
    pub async fn release(mut self) -> redis::RedisResult<()> {
        match self.con.take() {
            Some(mut con) => release_slot(&mut con, &self.key, self.window).await,
            None => Ok(()),
        }
    }
}

impl Drop for QuotaSlot {
    fn drop(&mut self) {
        if let (Some(mut con), Ok(handle)) =
            (self.con.take(), tokio::runtime::Handle::try_current())
        {
            let (key, window) = (self.key.clone(), self.window);
            handle.spawn(async move {
                let _ = release_slot(&mut con, &key, window).await;
            });
        }
    }
}

async fn release_slot(
    con: &mut MultiplexedConnection,
    key: &str,
    window: i64,
) -> redis::RedisResult<()> {
    redis::Script::new(QUOTA_RELEASE)
        .key(key)
        .arg(window)
        .invoke_async(con)
        .await
}

/// A passthrough request, classified: the headers to strip and to set before it goes on live.
#[derive(Debug)]
pub struct Passthrough {
    pub tenant: String,
    pub tier: String,
    /// `reserved` or `overflow`.
    pub classification: &'static str,
    /// Client-sent values of these headers are removed (the objective and fairness headers).
    pub strip: Vec<String>,
    /// Then these are set: the tier's objective (when it has one) and the fairness id.
    pub stamp: Vec<(String, String)>,
    /// The reserved slot, for a tenant with a limit.
    pub slot: Option<QuotaSlot>,
}

/// What the step did with a POST.
#[derive(Debug)]
pub enum Served {
    /// No mode header: the step does nothing; the request is served as without the step.
    Untouched,
    /// `passthrough`: served live, with these labels.
    Passthrough(Passthrough),
    /// `enqueue` or `wait`: written to Redis; the answer is the 202, or the `wait`'s outcome.
    Queued { queued: Queued, answer: Answer },
    /// Refused before anything was written (the 400s), or the enqueue failed (503).
    Answered(Answer),
}

impl Served {
    /// The HTTP answer, for the variants that have one.
    pub fn answer(&self) -> Option<&Answer> {
        match self {
            Served::Queued { answer, .. } | Served::Answered(answer) => Some(answer),
            Served::Untouched | Served::Passthrough(_) => None,
        }
    }
}

/// A request id's state, as fetch reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    Ready(StoredResult),
    Pending,
    Unknown,
}

/// `<tenant>:<id>`
pub fn envelope_id(tenant: &str, id: &str) -> String {
    format!("{tenant}:{id}")
}

/// `results:req:<tenant>:<id>`
pub fn mailbox(tenant: &str, id: &str) -> String {
    format!("results:req:{tenant}:{id}")
}

/// The coordinator's check of a client's `X-Request-Id`: letters, digits and `-`, 1 to 128.
pub fn valid_request_id(id: &str) -> bool {
    (1..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

/// A random (version 4) UUID, lower-case and hyphenated, as `uuid.New().String()` prints one.
pub fn mint_uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The first value of header `name` (any case), or "".
fn header<'a>(headers: &[(&str, &'a str)], name: &str) -> &'a str {
    headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
        .map_or("", |(_, v)| v)
}

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128)
}

/// The router's step on a Redis it is given.
#[derive(Debug, Clone)]
pub struct RouterBroker {
    config: BrokerConfig,
    client: redis::Client,
    con: MultiplexedConnection,
    /// Whether `wait` wakes on keyspace notifications (else it polls).
    notify: bool,
    db: i64,
}

impl RouterBroker {
    /// Connects to `redis_url` (the config's `redis_url` is not read: tests start their own
    /// servers) with `config` resolved; `wakeup_mode: auto` probes `notify-keyspace-events`
    /// once, as the router does at start-up.
    pub async fn connect(
        redis_url: &str,
        config: BrokerConfig,
    ) -> Result<RouterBroker, BrokerError> {
        let config = config.resolved()?;
        let client = redis::Client::open(redis_url)?;
        let db = client.get_connection_info().redis_settings().db();
        let mut con = client.get_multiplexed_async_connection().await?;
        let notify = match config.wakeup_mode.as_str() {
            "poll" => false,
            "notify" => true,
            _ => notifications_enabled(&mut con).await,
        };
        Ok(RouterBroker {
            config,
            client,
            con,
            notify,
            db,
        })
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.config
    }

    /// Whether `wait` wakes on keyspace notifications.
    pub fn notify(&self) -> bool {
        self.notify
    }

    /// The coordinator's handling of a POST to `path` (`/v1/chat/completions`, ...): the body
    /// parsed, the id taken or minted, then the step. `wait` holds until its outcome; dropping
    /// the future while it holds is the client going away, and cancels the request.
    pub async fn post(&self, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Served {
        let parsed: Value = match serde_json::from_slice(body) {
            Ok(value @ Value::Object(_)) => value,
            _ => return Served::Answered(plain_error(400, "invalid JSON body")),
        };
        let client_id = header(headers, "x-request-id");
        let id = if valid_request_id(client_id) {
            client_id.to_owned()
        } else {
            mint_uuid()
        };
        let cfg = &self.config;
        let mode_value = header(headers, &cfg.mode_header);
        if mode_value.is_empty() {
            return Served::Untouched;
        }
        let refuse = |message: String| {
            Served::Answered(openai_error(
                400,
                "invalid_request_error",
                "INVALID_REQUEST",
                &message,
            ))
        };
        let mode = match mode_value.to_lowercase().as_str() {
            "passthrough" => None,
            "enqueue" => Some(Mode::Enqueue),
            "wait" => Some(Mode::Wait),
            _ => return refuse(format!("unknown {} value", cfg.mode_header)),
        };
        if parsed.get("stream").and_then(Value::as_bool) == Some(true) && mode.is_some() {
            return refuse("stream is only supported in passthrough mode".to_owned());
        }
        let model = parsed.get("model").and_then(Value::as_str).unwrap_or("");
        if model.is_empty() {
            return refuse("model is required".to_owned());
        }
        let tenant = match header(headers, &cfg.tenant_header) {
            "" => "default",
            tenant => tenant,
        };
        if tenant.contains(':') {
            return refuse(format!("{} must not contain \":\"", cfg.tenant_header));
        }
        let Some(mode) = mode else {
            return Served::Passthrough(self.passthrough(model, tenant).await);
        };
        let mut queued = self.admit(mode, path, headers, &parsed, &id, tenant, model);
        match self.submit(&queued).await {
            Ok(ttl) => queued.active_ttl = ttl,
            Err(error) => {
                let answer = openai_error(
                    503,
                    "api_error",
                    "ENQUEUE_FAILED",
                    &format!("failed to enqueue request: {error}"),
                );
                return Served::Answered(answer.with_header("x-request-id", &id));
            }
        }
        let answer = match mode {
            Mode::Enqueue => pending(&id),
            Mode::Wait => self.hold(&queued).await,
        };
        let answer = answer.with_header("x-request-id", &id);
        Served::Queued { queued, answer }
    }

    /// The envelope of a queued request: deadline, metadata, forwarded headers, the member.
    #[allow(clippy::too_many_arguments)]
    fn admit(
        &self,
        mode: Mode,
        path: &str,
        headers: &[(&str, &str)],
        body: &Value,
        id: &str,
        tenant: &str,
        model: &str,
    ) -> Queued {
        let cfg = &self.config;
        let bounds = cfg.bounds(if mode == Mode::Enqueue {
            "enqueue"
        } else {
            "wait"
        });
        let mut secs = bounds.default_seconds;
        if let Ok(asked) = header(headers, &cfg.timeout_header).parse::<i64>() {
            if asked > 0 {
                secs = asked;
            }
        }
        if bounds.max_seconds > 0 && secs > bounds.max_seconds {
            secs = bounds.max_seconds;
        }
        // Go's `time.Duration(secs) * time.Second`, overflow and all.
        let timeout_ns = secs.wrapping_mul(1_000_000_000);
        let now = now_ns();
        let created = now.div_euclid(1_000_000_000) as i64;
        let deadline = (now + i128::from(timeout_ns)).div_euclid(1_000_000_000) as i64;
        let (queue, tier) = cfg.route(model, tenant);
        let env = envelope_id(tenant, id);
        let mbox = mailbox(tenant, id);
        let token = inferq_client::keys::fresh_token();

        let mut metadata = vec![(cfg.quota.attribute.as_str(), tenant)];
        let traceparent = header(headers, "traceparent");
        if !traceparent.is_empty() {
            metadata.push(("traceparent", traceparent));
        }
        let forwarded: Vec<(&str, &str)> = cfg
            .forward_headers
            .iter()
            .flatten()
            .map(|h| (h.as_str(), header(headers, h)))
            .filter(|(_, v)| !v.is_empty())
            .collect();
        let s = go_json::string;
        let mut data = format!(
            r#"{{"id":{},"created":{created},"deadline":{deadline},"payload":{},"metadata":{}"#,
            s(&env),
            go_json::marshal(body),
            go_json::string_map(metadata)
        );
        if !forwarded.is_empty() {
            data.push_str(&format!(r#","headers":{}"#, go_json::string_map(forwarded)));
        }
        if !path.is_empty() {
            data.push_str(&format!(r#","endpoint":{}"#, s(path)));
        }
        data.push_str(&format!(
            r#","request_queue_name":{},"result_queue_name":{}}}"#,
            s(&queue),
            s(&mbox)
        ));
        let member = format!(
            r#"{{"internal":{{"request_token":{},"request_queue_name":{},"result_queue_name":{}}},"request_kind":"redis","data":{data}}}"#,
            s(&token),
            s(&queue),
            s(&mbox)
        );
        Queued {
            mode,
            id: id.to_owned(),
            tenant: tenant.to_owned(),
            envelope_id: env,
            mailbox: mbox,
            queue,
            tier,
            token,
            created,
            deadline,
            timeout: Duration::from_nanos(u64::try_from(timeout_ns).unwrap_or(0)),
            active_ttl: ActiveTtl::Px(0),
            member,
        }
    }

    /// Producer v0.9.0's `SubmitRequest`: the checks, then one MULTI of `DEL` cancel marker,
    /// `SET` active marker with the TTL to the deadline, `ZADD` member at the deadline; returns
    /// the marker's TTL as sent. `Err` is the producer's error text.
    async fn submit(&self, queued: &Queued) -> Result<ActiveTtl, String> {
        if queued.deadline <= 0 {
            return Err("deadline is required and must be a positive Unix timestamp".to_owned());
        }
        let ttl_ns = i128::from(queued.deadline) * 1_000_000_000 - now_ns();
        if ttl_ns <= 0 {
            return Err("deadline has already expired".to_owned());
        }
        let ttl = if ttl_ns < 1_000_000_000 || ttl_ns % 1_000_000_000 != 0 {
            ActiveTtl::Px((ttl_ns / 1_000_000).max(1) as i64)
        } else {
            ActiveTtl::Ex((ttl_ns / 1_000_000_000) as i64)
        };
        let active = format!("request-active:{}", queued.envelope_id);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("DEL")
            .arg(format!("request-cancel:{}", queued.envelope_id))
            .ignore();
        match ttl {
            ActiveTtl::Px(ms) => pipe
                .cmd("SET")
                .arg(&active)
                .arg(&queued.token)
                .arg("PX")
                .arg(ms),
            ActiveTtl::Ex(s) => pipe
                .cmd("SET")
                .arg(&active)
                .arg(&queued.token)
                .arg("EX")
                .arg(s),
        }
        .ignore();
        pipe.cmd("ZADD")
            .arg(&queued.queue)
            .arg(queued.deadline as f64)
            .arg(&queued.member)
            .ignore();
        let mut con = self.con.clone();
        pipe.query_async::<()>(&mut con)
            .await
            .map_err(|e| format!("failed to add request to queue: {e}"))?;
        Ok(ttl)
    }

    /// Passthrough's labels: the tenant classified against its quota counter (a tenant without
    /// a limit, or a Redis error, is `reserved` with no slot), the tier's objective for that
    /// classification and the fairness id.
    async fn passthrough(&self, model: &str, tenant: &str) -> Passthrough {
        let cfg = &self.config;
        let (classification, slot) = match cfg.quota.limits.get(tenant).filter(|l| **l > 0) {
            None => ("reserved", None),
            Some(limit) => {
                let key = format!("{}{}:{tenant}", cfg.quota.prefix, cfg.quota.attribute);
                let mut con = self.con.clone();
                let taken: redis::RedisResult<i64> = redis::Script::new(QUOTA_ACQUIRE)
                    .key(&key)
                    .arg(*limit)
                    .arg(cfg.quota.window_seconds)
                    .invoke_async(&mut con)
                    .await;
                match taken {
                    Ok(0) => ("overflow", None),
                    Ok(_) => {
                        let slot = QuotaSlot {
                            con: Some(con),
                            key,
                            window: cfg.quota.window_seconds,
                        };
                        ("reserved", Some(slot))
                    }
                    Err(_) => ("reserved", None),
                }
            }
        };
        let (_, tier) = cfg.route(model, tenant);
        let mut stamp = Vec::new();
        if let Some(pair) = cfg.objectives.get(&tier) {
            let objective = if classification == "overflow" {
                &pair.overflow
            } else {
                &pair.reserved
            };
            if !objective.is_empty() {
                stamp.push((cfg.objective_header.clone(), objective.clone()));
            }
        }
        stamp.push((cfg.fairness_header.clone(), tenant.to_owned()));
        Passthrough {
            tenant: tenant.to_owned(),
            tier,
            classification,
            strip: vec![cfg.objective_header.clone(), cfg.fairness_header.clone()],
            stamp,
            slot,
        }
    }

    /// `wait`'s hold: until the mailbox fills (answered, then deleted), the deadline (a last
    /// look, then 504) or the cap (202 pending, still fetchable). Dropped while holding, the
    /// client went away: the request is cancelled.
    async fn hold(&self, queued: &Queued) -> Answer {
        let cap = Duration::from_secs(u64::try_from(self.config.wait_cap_seconds).unwrap_or(0));
        let (limit, at_deadline) = if !cap.is_zero() && cap < queued.timeout {
            (cap, false)
        } else {
            (queued.timeout, true)
        };
        let until = Instant::now() + limit;
        let mut guard = CancelOnDrop {
            con: Some(self.con.clone()),
            envelope_id: queued.envelope_id.clone(),
        };
        // Subscribed before the first look, so a result landing in between still wakes us.
        let mut wake = match self.notify {
            true => self.subscribe(&queued.mailbox).await.ok(),
            false => None,
        };
        let every = if wake.is_some() { BACKUP_POLL } else { POLL };
        loop {
            if let Ok(Lookup::Ready(result)) = self.lookup(&queued.tenant, &queued.id).await {
                guard.disarm();
                return self.deliver_and_delete(&queued.mailbox, &result).await;
            }
            let now = Instant::now();
            if now >= until {
                break;
            }
            let nap = every.min(until - now);
            match wake.as_mut() {
                Some(pubsub) => {
                    let _ = tokio::time::timeout(nap, pubsub.on_message().next()).await;
                }
                None => tokio::time::sleep(nap).await,
            }
        }
        guard.disarm();
        if !at_deadline {
            return pending(&queued.id);
        }
        if let Ok(Lookup::Ready(result)) = self.lookup(&queued.tenant, &queued.id).await {
            return self.deliver_and_delete(&queued.mailbox, &result).await;
        }
        openai_error(
            504,
            "timeout_error",
            "DEADLINE_EXCEEDED",
            "request deadline exceeded before a result was produced",
        )
    }

    async fn deliver_and_delete(&self, mailbox: &str, result: &StoredResult) -> Answer {
        let answer = answer_of(result);
        let mut con = self.con.clone();
        let _: redis::RedisResult<i64> = con.del(mailbox).await;
        answer
    }

    async fn subscribe(&self, mailbox: &str) -> redis::RedisResult<redis::aio::PubSub> {
        let mut pubsub = self.client.get_async_pubsub().await?;
        pubsub
            .subscribe(format!("__keyspace@{}__:{mailbox}", self.db))
            .await?;
        Ok(pubsub)
    }

    /// The step's lookup: `LRANGE <mailbox> 0 0`, else `EXISTS request-active:<env>`. `Err`: a
    /// Redis error or a mailbox entry that is not a result.
    pub async fn lookup(&self, tenant: &str, id: &str) -> Result<Lookup, String> {
        let mut con = self.con.clone();
        let first: Vec<String> = con
            .lrange(mailbox(tenant, id), 0, 0)
            .await
            .map_err(|e| format!("failed to read result: {e}"))?;
        if let Some(text) = first.first() {
            return StoredResult::parse(text)
                .map(Lookup::Ready)
                .map_err(|e| format!("failed to parse stored result: {e}"));
        }
        let active: bool = con
            .exists(format!("request-active:{}", envelope_id(tenant, id)))
            .await
            .map_err(|e| format!("failed to check request state: {e}"))?;
        Ok(if active {
            Lookup::Pending
        } else {
            Lookup::Unknown
        })
    }

    /// `GET /v1/requests/{id}` with `tenant` as the tenant header's value (`None` or empty:
    /// `default`). A delivered result's mailbox then lives `fetch_grace_seconds` more (0:
    /// deleted).
    pub async fn fetch(&self, tenant: Option<&str>, id: &str) -> Answer {
        let tenant = tenant.filter(|t| !t.is_empty()).unwrap_or("default");
        match self.lookup(tenant, id).await {
            Err(message) => openai_error(500, "api_error", "LOOKUP_FAILED", &message),
            Ok(Lookup::Ready(result)) => {
                let answer = answer_of(&result);
                let grace = self.config.fetch_grace();
                let mut con = self.con.clone();
                let key = mailbox(tenant, id);
                let _: redis::RedisResult<i64> = if grace.is_zero() {
                    con.del(key).await
                } else {
                    con.expire(key, grace.as_secs() as i64).await
                };
                answer
            }
            Ok(Lookup::Pending) => pending(id),
            Ok(Lookup::Unknown) => openai_error(
                410,
                "invalid_request_error",
                "UNKNOWN_REQUEST",
                "request id is unknown, expired, or already deleted",
            ),
        }
    }

    /// `DELETE /v1/requests/{id}`: the mailbox deleted, 204 whether or not it was there (the
    /// request itself is not cancelled).
    pub async fn delete(&self, tenant: Option<&str>, id: &str) -> Answer {
        let tenant = tenant.filter(|t| !t.is_empty()).unwrap_or("default");
        let mut con = self.con.clone();
        match con.del::<_, i64>(mailbox(tenant, id)).await {
            Ok(_) => Answer {
                status: 204,
                headers: Vec::new(),
                body: Vec::new(),
            },
            Err(e) => openai_error(500, "api_error", "DELETE_FAILED", &e.to_string()),
        }
    }

    /// Producer v0.9.0's `CancelRequests` for one request: whether a cancel marker was set.
    pub async fn cancel(&self, tenant: &str, id: &str) -> redis::RedisResult<bool> {
        let mut con = self.con.clone();
        cancel_envelope(&mut con, &envelope_id(tenant, id)).await
    }

    /// `GET /v1/models`.
    pub fn models(&self) -> Answer {
        models(self.config.routes.iter().map(|r| r.model.as_str()))
    }
}

async fn cancel_envelope(con: &mut MultiplexedConnection, env: &str) -> redis::RedisResult<bool> {
    let set: i64 = redis::Script::new(CANCEL)
        .key(format!("request-active:{env}"))
        .key(format!("request-cancel:{env}"))
        .arg(CANCEL_MARKER_TTL_SECONDS)
        .invoke_async(con)
        .await?;
    Ok(set == 1)
}

/// Cancels a held `wait` whose future is dropped (its client went away) before an outcome.
struct CancelOnDrop {
    con: Option<MultiplexedConnection>,
    envelope_id: String,
}

impl CancelOnDrop {
    fn disarm(&mut self) {
        self.con = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if let (Some(mut con), Ok(handle)) =
            (self.con.take(), tokio::runtime::Handle::try_current())
        {
            let env = std::mem::take(&mut self.envelope_id);
            handle.spawn(async move {
                let _ = cancel_envelope(&mut con, &env).await;
            });
        }
    }
}

/// Whether the server's `notify-keyspace-events` has `K` and list events (`l`, or `A`).
async fn notifications_enabled(con: &mut MultiplexedConnection) -> bool {
    let reply: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("notify-keyspace-events")
        .query_async(con)
        .await;
    match reply.ok().and_then(|r| r.get(1).cloned()) {
        Some(flags) => flags.contains('K') && (flags.contains('l') || flags.contains('A')),
        None => false,
    }
}
