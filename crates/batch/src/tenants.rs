//! Tenants apart (issue 34): where a tenant's lines wait, the weights `fair-share` processors
//! share the fleet by, and the per-tenant line metrics.
//!
//! - [`queue_of`]: with `--queue-per-tenant` a batch's lines go to its tenant's queue
//!   (`<prefix><tenant>`, a Go-format queue like any other), and [`note_ingested`] records the
//!   queue in the index of queues with work after each round trip of lines (the lines first,
//!   the entry after: a processor that takes an entry off finds the lines, or the entry comes
//!   back). Without it every line goes to the one request queue, as before.
//! - [`weights_of`]: tenant -> weight from the keys ([`crate::auth`]: a key's value is its
//!   tenant, or an object `{"tenant": …, "weight": …}`; weight 1 when not given); [`run`] writes
//!   them to the weights hash at start-up, where the processors read them.
//! - [`run`] also refreshes `inferq_batch_tenant_lines{tenant, state}` every
//!   [`REFRESH_EVERY`] from Redis: `done` from the results filed per tenant, `waiting` and
//!   `running` from each tenant's queue (its pending set and its claims) for the tenants with
//!   lines not yet done; with one shared queue they cannot be told apart, and `waiting` counts
//!   every line submitted and not yet done.
//! - [`run`] also watches that some processor serves the tenants' queues: a `fair-share`
//!   processor whose `queue_prefix` is ours keeps [`served_key`] alive (a TTL of
//!   [`SERVED_TTL`], renewed every discovery pass). While it is missing the replica says so in
//!   `/readyz` (503), in `inferq_batch_fair_share_served` (0) and in its log, rather than let
//!   the tenants' lines wait with nothing said.
//! - [`withdraw`]: a batch cancelled or expired takes its lines still pending out of its
//!   tenant's queue when it is sealed, so no pending line outlives its batch.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::keys;
use crate::model::Fields;
use crate::state::App;

/// How often the per-tenant metrics are read from Redis.
pub const REFRESH_EVERY: Duration = Duration::from_secs(2);

/// How long a `fair-share` processor's word that it serves a prefix lasts (the processor's
/// `dispatch::discovery` writes it with this TTL every pass).
pub const SERVED_TTL: Duration = Duration::from_secs(30);

/// The key a `fair-share` processor serving the queues of `prefix` keeps alive (written by the
/// processor's `dispatch::discovery`, which spells it the same).
pub fn served_key(prefix: &str) -> String {
    format!("inferq-tenants:served:{prefix}")
}

/// Every tenant the keys name, with its weight (a key's `weight`, 1 when not given; see
/// [`crate::auth`]); without keys, the open tenant.
pub fn weights_of(keys: &crate::auth::Keys) -> BTreeMap<String, f64> {
    let mut weights: BTreeMap<String, f64> = keys
        .known_tenants()
        .into_iter()
        .map(|tenant| (tenant, 1.0))
        .collect();
    for (tenant, settings) in keys.tenants() {
        weights.insert(tenant.to_owned(), f64::from(settings.weight));
    }
    weights
}

/// The queue a batch's lines go to: its tenant's, or the one request queue.
pub fn queue_of(app: &App, batch: &Fields) -> String {
    match &app.settings.tenant_queues {
        Some(t) => t.queue(batch.get("tenant").map_or("", String::as_str)),
        None => app.settings.request_queue.clone(),
    }
}

/// Records `n` lines of `tenant` submitted to `queue`: in the tenant's count, and (with a queue
/// per tenant) the queue in the index of queues with work.
pub async fn note_ingested(
    app: &App,
    tenant: &str,
    queue: &str,
    n: u64,
) -> Result<(), redis::RedisError> {
    let mut con = app.redis.clone();
    let _: i64 = redis::cmd("HINCRBY")
        .arg(keys::tenant_ingested())
        .arg(tenant)
        .arg(n)
        .query_async(&mut con)
        .await?;
    if let Some(t) = &app.settings.tenant_queues {
        let _: i64 = redis::cmd("ZADD")
            .arg(&t.index_key)
            .arg(inferq_client::producer::unix_ms())
            .arg(queue)
            .query_async(&mut con)
            .await?;
    }
    Ok(())
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    pub tenant: String,
    pub state: String,
}

/// The states of `inferq_batch_tenant_lines`.
pub const STATES: [&str; 3] = ["waiting", "running", "done"];

/// `inferq_batch_tenant_lines{tenant, state}`.
#[derive(Debug, Clone, Default)]
pub struct TenantMetrics {
    pub lines: Family<TenantLabels, Gauge<i64, std::sync::atomic::AtomicI64>>,
    /// With `--queue-per-tenant`: 1 while a `fair-share` processor serving the prefix has
    /// announced itself, else 0 (and the replica is not ready).
    pub served: Gauge<i64, std::sync::atomic::AtomicI64>,
}

impl TenantMetrics {
    pub fn register(registry: &mut Registry) -> TenantMetrics {
        let m = TenantMetrics::default();
        registry.register(
            "inferq_batch_tenant_lines",
            "Batch lines per tenant: waiting in the queue, running (claimed by a processor), done (results filed, ever); read from Redis",
            m.lines.clone(),
        );
        registry.register(
            "inferq_batch_fair_share_served",
            "With --queue-per-tenant: 1 while a fair-share processor serving the tenants' queues has announced itself in the last 30 s, else 0",
            m.served.clone(),
        );
        m
    }

    /// Every state of every tenant, at 0 (the tenants the keys file names).
    pub fn start_with<'a>(&self, tenants: impl Iterator<Item = &'a String>) {
        for tenant in tenants {
            for state in STATES {
                self.set(tenant, state, 0);
            }
        }
    }

    fn set(&self, tenant: &str, state: &str, value: i64) {
        self.lines
            .get_or_create(&TenantLabels {
                tenant: tenant.to_owned(),
                state: state.to_owned(),
            })
            .set(value);
    }
}

/// Writes the weights (once Redis takes them), then refreshes the metrics until `stop`.
pub async fn run(app: App, stop: CancellationToken) {
    let mut published = app.settings.tenant_queues.is_none();
    let mut failing = false;
    let mut unserved_said = false;
    loop {
        if !published {
            published = publish_weights(&app).await.is_ok();
        }
        if let Some(t) = &app.settings.tenant_queues {
            watch_served(&app, &t.prefix, &mut unserved_said).await;
        }
        match refresh(&app).await {
            Ok(()) => failing = false,
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "cannot read the per-tenant line counts; retrying");
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(REFRESH_EVERY) => {}
        }
    }
}

/// Reads whether a `fair-share` processor serves `prefix` into the gauge `/readyz` reads, and
/// warns once each time none does (an unreadable key counts as none).
async fn watch_served(app: &App, prefix: &str, said: &mut bool) {
    let mut con = app.redis.clone();
    let served: bool = redis::cmd("EXISTS")
        .arg(served_key(prefix))
        .query_async(&mut con)
        .await
        .unwrap_or(false);
    app.metrics.tenants.served.set(i64::from(served));
    if !served && !*said {
        tracing::warn!(prefix, "no processor serving fair share for these tenant queues has announced itself in the last 30 s: batch lines wait in them until one runs (`inferq run` with the fair-share merge policy and this queue_prefix); not ready until then");
    } else if served && *said {
        tracing::info!(
            prefix,
            "a processor serving fair share for the tenant queues announced itself"
        );
    }
    *said = !served;
}

/// Whether this replica may say it is ready as far as tenant queues go: without
/// `--queue-per-tenant`, always; with it, while a `fair-share` processor serves them.
pub fn unserved(app: &App) -> Option<String> {
    let t = app.settings.tenant_queues.as_ref()?;
    (app.metrics.tenants.served.get() == 0).then(|| {
        format!(
            "no fair-share processor serving the tenant queues {:?}* has announced itself (key {})",
            t.prefix,
            served_key(&t.prefix)
        )
    })
}

/// Takes the lines of batch `id` still pending out of its tenant's queue (with
/// `--queue-per-tenant`; the shared queue's are left to the processors, which end them as
/// `CANCELLED` or `DEADLINE_EXCEEDED`). Lines a processor claimed meanwhile are not pending and
/// are not touched. The number taken out.
pub async fn withdraw(app: &App, id: &str, batch: &Fields) -> Result<u64, redis::RedisError> {
    if app.settings.tenant_queues.is_none() {
        return Ok(0);
    }
    let queue = queue_of(app, batch);
    let mut con = app.redis.clone();
    let pending = inferq_client::keys::QueueKeys::for_layout(&queue, con.is_cluster()).pending;
    let ours = format!("{id}:");
    let mut cursor = 0u64;
    let mut members: Vec<Vec<u8>> = Vec::new();
    loop {
        let (next, page): (u64, Vec<Vec<u8>>) = redis::cmd("ZSCAN")
            .arg(&pending)
            .arg(cursor)
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut con)
            .await?;
        // ZSCAN pages alternate member and score.
        for member in page.into_iter().step_by(2) {
            let mine = inferq_client::wire::Envelope::salvage_id(&member)
                .is_some_and(|(request, _)| request.starts_with(&ours));
            if mine {
                members.push(member);
            }
        }
        if next == 0 {
            break;
        }
        cursor = next;
    }
    let mut removed = 0u64;
    for chunk in members.chunks(500) {
        let n: u64 = redis::cmd("ZREM")
            .arg(&pending)
            .arg(chunk)
            .query_async(&mut con)
            .await?;
        removed += n;
    }
    Ok(removed)
}

/// Replaces the weights hash with the keys file's weights (one transaction).
async fn publish_weights(app: &App) -> Result<(), redis::RedisError> {
    let Some(t) = &app.settings.tenant_queues else {
        return Ok(());
    };
    let mut pipe = redis::pipe();
    pipe.atomic().del(&t.weights_key).ignore();
    for (tenant, w) in app.tenant_weights.iter() {
        pipe.hset(&t.weights_key, tenant, w.to_string()).ignore();
    }
    let mut con = app.redis.clone();
    pipe.query_async::<()>(&mut con).await
}

/// Reads the per-tenant counts from Redis into the metrics.
async fn refresh(app: &App) -> Result<(), redis::RedisError> {
    let mut con = app.redis.clone();
    let ingested: HashMap<String, i64> = redis::cmd("HGETALL")
        .arg(keys::tenant_ingested())
        .query_async(&mut con)
        .await?;
    let done: HashMap<String, i64> = redis::cmd("HGETALL")
        .arg(keys::tenant_done())
        .query_async(&mut con)
        .await?;
    let metrics = &app.metrics.tenants;
    let mut tenants: Vec<&String> = app.tenant_weights.keys().collect();
    tenants.extend(
        ingested
            .keys()
            .filter(|t| !app.tenant_weights.contains_key(*t)),
    );
    for tenant in tenants {
        let d = done.get(tenant).copied().unwrap_or(0);
        let open = ingested.get(tenant).copied().unwrap_or(0) - d;
        metrics.set(tenant, "done", d);
        let (waiting, running) = match &app.settings.tenant_queues {
            Some(t) if open > 0 => {
                let queue = t.queue(tenant);
                let qkeys = inferq_client::keys::QueueKeys::for_layout(&queue, con.is_cluster());
                redis::pipe()
                    .zcard(&qkeys.pending)
                    .hlen(&qkeys.claimed)
                    .query_async::<(i64, i64)>(&mut con)
                    .await?
            }
            Some(_) => (0, 0),
            None => (open.max(0), 0),
        };
        metrics.set(tenant, "waiting", waiting);
        metrics.set(tenant, "running", running);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_from_strings_and_objects() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.json");
        std::fs::write(
            &path,
            r#"{"sk-alice-000000000001": "alice",
                "sk-bob-00000000000001": {"tenant": "bob", "weight": 3, "max_enqueued_lines": 10},
                "sk-carol-000000000001": {"tenant": "carol"}}"#,
        )
        .unwrap();
        let w = weights_of(&crate::auth::Keys::load(&path).unwrap());
        assert_eq!(w["alice"], 1.0);
        assert_eq!(w["bob"], 3.0);
        assert_eq!(w["carol"], 1.0);
        assert_eq!(w.len(), 3);
        let open = weights_of(&crate::auth::Keys::default());
        assert_eq!(open["default"], 1.0);
    }

    #[test]
    fn every_tenant_s_series_is_there_at_zero() {
        let mut registry = Registry::default();
        let m = TenantMetrics::register(&mut registry);
        let tenants = ["alice".to_owned(), "bob".to_owned()];
        m.start_with(tenants.iter());
        let mut page = String::new();
        prometheus_client::encoding::text::encode(&mut page, &registry).unwrap();
        for t in &tenants {
            for s in STATES {
                let series = format!("inferq_batch_tenant_lines{{tenant=\"{t}\",state=\"{s}\"}} 0");
                assert!(page.contains(&series), "{series} missing from {page}");
            }
        }
    }
}
