//! `inferq batch-api`: serves the OpenAI Files and Batches API (the `inferq-batch` crate) over
//! the queue a processors' transport config names, and the front door for single requests, the
//! router's `async-broker` contract (`--broker-config`, the step's `params` block). It reads the
//! same `--transport-config-file` as `inferq run`, so Redis, its topology and TLS are configured once; a bad flag or config
//! exits 2 naming it. Without `--api-keys-file` it listens only on loopback unless
//! `--insecure-no-auth` is given.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use tokio_util::sync::CancellationToken;

use super::Failure;
use crate::config::RunArgs;

#[derive(Debug, clap::Args)]
pub(super) struct BatchApiArgs {
    /// The processors' transport config file (Redis and its queues).
    #[arg(long, value_name = "PATH")]
    pub transport_config_file: String,
    /// Address to serve the API on.
    #[arg(long, default_value = "127.0.0.1:8080", value_name = "ADDR")]
    pub listen: SocketAddr,
    /// Folder holding uploaded and result files (every replica must see the same one); this
    /// or --files-url is required.
    #[arg(long, value_name = "DIR", conflicts_with = "files_url")]
    pub files_dir: Option<PathBuf>,
    /// S3-compatible object storage instead of a folder: s3://bucket[/prefix]; credentials,
    /// region and endpoint from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION, AWS_ENDPOINT
    /// (and AWS_ALLOW_HTTP=true for a plain-http endpoint).
    #[arg(long, value_name = "URL")]
    pub files_url: Option<String>,
    /// The `id` of the config's queue that batches feed (default: the first queue).
    #[arg(long, value_name = "ID")]
    pub queue: Option<String>,
    /// JSON object mapping each API key to its tenant; every call then needs
    /// `Authorization: Bearer <key>`, and a tenant sees only its own files and batches.
    #[arg(long, value_name = "PATH")]
    pub api_keys_file: Option<PathBuf>,
    /// Each tenant's lines wait in a queue of their own (`<--tenant-queue-prefix><tenant>`),
    /// listed in the index of queues with work, for processors running the `fair-share` merge
    /// policy with that prefix. Off by default: processors without it would never serve those
    /// queues, so turn it on once they run `fair-share`.
    #[arg(long)]
    pub queue_per_tenant: bool,
    /// With `--queue-per-tenant`: the start of every tenant's queue name.
    #[arg(long, default_value = inferq_batch::settings::DEFAULT_TENANT_QUEUE_PREFIX, value_name = "PREFIX")]
    pub tenant_queue_prefix: String,
    /// Serve without keys on an address other than loopback.
    #[arg(long)]
    pub insecure_no_auth: bool,
    /// Most requests per batch.
    #[arg(long, default_value_t = 50_000)]
    pub max_lines: u64,
    /// Largest upload, in bytes.
    #[arg(long, default_value_t = 200_000_000)]
    pub max_file_bytes: u64,
    /// Longest input line, in bytes.
    #[arg(long, default_value_t = 16 * 1024 * 1024)]
    pub max_line_bytes: usize,
    /// A completion window accepted besides `24h` (e.g. `1h`, `30s`); repeatable.
    #[arg(long = "allow-completion-window", value_name = "DURATION")]
    pub allow_completion_window: Vec<String>,
    /// How long a replica's hold on a batch lasts unrenewed: how soon another replica takes
    /// over the batches of one that died.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub lease: Duration,
    /// How long a cancel waits for the results of requests in flight.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub cancel_grace: Duration,
    /// Front door: the router's `async-broker` step config, its `params` block (or the whole
    /// step entry) as YAML or JSON: headers, routes, objectives, quota, timeouts, wait cap,
    /// fetch grace, wake-up mode, forwarded headers. Without it: the step's defaults, with the
    /// batch queue (`--queue`) as `default_queue`.
    #[arg(long, value_name = "PATH")]
    pub broker_config: Option<PathBuf>,
    /// The transport, as `inferq run` names it: only redis-sortedset is served (a redis-pubsub
    /// processor publishes results nobody collects, so it is refused).
    #[arg(long, default_value = "redis-sortedset", value_name = "TRANSPORT")]
    pub transport: String,
    /// Front door: most clients one replica holds waiting (wait mode, streams, long polls);
    /// past it a wait is answered 429 with Retry-After.
    #[arg(long, default_value_t = 10_000)]
    pub max_waiting_clients: usize,
    /// Most batch lines a tenant may have not yet finished (a key's `max_enqueued_lines`
    /// overrides it); a create past it is answered 429. Unbounded when not given.
    #[arg(long, value_name = "LINES")]
    pub max_enqueued_lines: Option<u64>,
    /// How long a file uploaded without `expires_after` lives, and a batch's output and error
    /// files when it gave no `output_expires_after`.
    #[arg(long, default_value = "30days", value_parser = humantime::parse_duration)]
    pub file_retention: Duration,
    /// How long an ended batch's record is kept.
    #[arg(long, default_value = "30days", value_parser = humantime::parse_duration)]
    pub batch_retention: Duration,
    /// The shortest `expires_after[seconds]` / `output_expires_after[seconds]` taken (OpenAI's
    /// is 1h; tests make it short).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub min_expires_after: Duration,
    /// How often each replica's sweeper removes expired files and ended batches' records.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    pub sweep_interval: Duration,
    /// How old an object no file key names must be before the sweeper removes it as orphaned
    /// (also how often it looks for them).
    #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
    pub orphan_grace: Duration,
    /// A connection that has not sent a whole request head this long after it opened (or
    /// after its first byte of a new request) is closed; a request body stalled this long fails.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub header_read_timeout: Duration,
    /// A keep-alive connection idle between requests this long is closed: keep it longer than
    /// the idle timeout of any load balancer in front (AWS ALB 60 s, GCP 600 s).
    #[arg(long, default_value = "620s", value_parser = humantime::parse_duration)]
    pub idle_timeout: Duration,
    /// Most connections open at once; past it a connection is answered 503 and closed.
    /// Default: nine tenths of the open-file limit, less 64 for Redis and the file store.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
}

#[derive(Debug, Parser)]
struct RunOnly {
    #[command(flatten)]
    run: RunArgs,
}

fn bad(field: &str, reason: impl std::fmt::Display) -> Failure {
    Failure::bad_input(anyhow::anyhow!("{field}: {reason}"))
}

/// The processors' config as `inferq run --transport-config-file <path>` reads it (for the
/// commands that share their transport config: `batch-api`, `status`).
pub(super) fn transport_config(path: &str) -> Result<crate::config::RunConfig, Failure> {
    let run = RunOnly::try_parse_from([
        "inferq",
        "--transport",
        "redis-sortedset",
        "--transport-config-file",
        path,
    ])
    .map_err(|e| bad("--transport-config-file", e))?;
    crate::config::load(&run.run).map_err(Failure::bad_input)
}

/// The batch-api settings these flags and the transport config give.
pub(super) fn settings(args: &BatchApiArgs) -> Result<inferq_batch::Settings, Failure> {
    if args.transport != "redis-sortedset" {
        return Err(bad(
            "--transport",
            format!(
                "{:?} is not served by batch-api: a redis-pubsub processor PUBLISHes each result on a channel, so results would be published and never collected (the front door reads results:req:<tenant>:<id> lists, which only redis-sortedset processors fill); run the processors with --transport redis-sortedset",
                args.transport
            ),
        ));
    }
    let config = transport_config(&args.transport_config_file)?;
    let transport = &config.transport;
    let queue = match &args.queue {
        None => transport.queues.first(),
        Some(id) => transport.queues.iter().find(|q| &q.id == id),
    }
    .ok_or_else(|| {
        bad(
            "--queue",
            format!(
                "no queue with id {:?} in the transport config",
                args.queue.as_deref().unwrap_or("")
            ),
        )
    })?;
    if let Some(list) = &queue.result_queue_name {
        return Err(bad(
            "--queue",
            format!("queue {:?} sends every result to its own list {list:?} (result_queue_name), so batch results would not reach the Batch API: feed batches from a queue without one", queue.id),
        ));
    }
    if queue.result_ttl_seconds > 0 {
        tracing::warn!(
            queue = %queue.id,
            ttl = queue.result_ttl_seconds,
            "the queue's result_ttl_seconds also applies to the batch result list: results are collected at once, but a Batch API stopped for longer than the TTL loses those waiting"
        );
    }
    if !args.listen.ip().is_loopback() && args.api_keys_file.is_none() && !args.insecure_no_auth {
        return Err(bad(
            "--listen",
            format!("{} is not a loopback address and no --api-keys-file was given: anyone who reaches it could read every batch (give --api-keys-file, or --insecure-no-auth to serve it open)", args.listen),
        ));
    }
    for w in &args.allow_completion_window {
        if humantime::parse_duration(w).map_or(true, |d| d.is_zero()) {
            return Err(bad(
                "--allow-completion-window",
                format!("{w:?} is not a duration such as 30s or 2h"),
            ));
        }
    }
    if args.lease < Duration::from_secs(1) {
        return Err(bad("--lease", "must be at least 1s"));
    }
    if args.queue_per_tenant
        && (args.tenant_queue_prefix.is_empty()
            || args
                .tenant_queue_prefix
                .contains(['{', '}', '*', '?', '[', ']']))
    {
        return Err(bad(
            "--tenant-queue-prefix",
            format!(
                "{:?} must be a non-empty name without {{}}, *, ?, [ or ]",
                args.tenant_queue_prefix
            ),
        ));
    }
    if args.max_waiting_clients == 0 {
        return Err(bad("--max-waiting-clients", "must be at least 1"));
    }
    let retention = retention(args)?;
    let front = front_settings(args, &config, &queue.queue_name)?;
    let target = inferq_client::target::Target::new(
        transport.url.expose(),
        &config.redis_tls,
        transport.topology.clone(),
    )
    .map_err(|e| bad("url", e))?;
    let store = match (&args.files_dir, &args.files_url) {
        (_, Some(url)) => inferq_batch::StoreChoice::Url(url.clone()),
        (Some(dir), None) => inferq_batch::StoreChoice::Dir(dir.clone()),
        (None, None) => {
            return Err(bad(
                "--files-dir",
                "required: give --files-dir <DIR> (a folder every replica shares) or --files-url s3://bucket[/prefix] (object storage)",
            ))
        }
    };
    Ok(inferq_batch::Settings {
        target,
        request_queue: queue.queue_name.clone(),
        listen: args.listen,
        store,
        api_keys_file: args.api_keys_file.clone(),
        limits: inferq_batch::Limits {
            max_lines: args.max_lines,
            max_file_bytes: args.max_file_bytes,
            max_line_bytes: args.max_line_bytes,
            max_enqueued_lines: args.max_enqueued_lines,
        },
        retention,
        extra_windows: args.allow_completion_window.clone(),
        lease: args.lease,
        cancel_grace: args.cancel_grace,
        front,
        connections: connections(
            args.header_read_timeout,
            args.idle_timeout,
            args.max_connections,
            (
                "--header-read-timeout",
                "--idle-timeout",
                "--max-connections",
            ),
            crate::ops::fd_limit::BASE_NEED,
        )?,
        tenant_queues: args
            .queue_per_tenant
            .then(|| inferq_batch::TenantQueues::new(&args.tenant_queue_prefix)),
    })
}

/// The front door's settings: the broker config (`--broker-config`, else the step's defaults
/// with `batch_queue` as `default_queue`), checked against the transport config's queues (every
/// queue a request may be routed to must be one of them, without a `result_queue_name`, which
/// would override the mailbox), and each queue's gateway for live requests.
fn front_settings(
    args: &BatchApiArgs,
    config: &crate::config::RunConfig,
    batch_queue: &str,
) -> Result<inferq_batch::front::FrontSettings, Failure> {
    use inferq_batch::front::BrokerConfig;
    let broker = match &args.broker_config {
        Some(path) => BrokerConfig::load(path).map_err(|e| bad(&e.field, e.reason))?,
        None => BrokerConfig {
            default_queue: batch_queue.to_owned(),
            ..BrokerConfig::default()
        },
    };
    let queues = &config.transport.queues;
    for name in broker.queues() {
        match queues.iter().find(|q| q.queue_name == name) {
            None => {
                return Err(bad(
                    "--broker-config",
                    format!(
                        "queue {name:?} (a route's queue or default_queue) is not a queue of the transport config (known: {}): no processor would serve its requests",
                        queues.iter().map(|q| q.queue_name.as_str()).collect::<Vec<_>>().join(", ")
                    ),
                ))
            }
            Some(q) => {
                if let Some(list) = &q.result_queue_name {
                    return Err(bad(
                        "--broker-config",
                        format!("queue {name:?} sends every result to its own list {list:?} (result_queue_name), which overrides each request's mailbox: front-door requests would never be answered; leave result_queue_name unset on the queues the front door feeds"),
                    ));
                }
            }
        }
    }
    if !broker.redis_url.is_empty() {
        tracing::info!("--broker-config: redis_url is not used; Redis is the transport config's");
    }
    let gateways = queues
        .iter()
        .filter(|q| !q.igw_base_url.is_empty())
        .map(|q| (q.queue_name.clone(), q.igw_base_url.clone()))
        .collect();
    Ok(inferq_batch::front::FrontSettings {
        broker,
        gateways,
        max_waiting_clients: args.max_waiting_clients,
        replica_wait: config.claim.replica_wait,
    })
}

/// A listener's connection bounds from its flags (named in `flags`), checked: timeouts of at
/// least 100 ms, and the default bound of open connections from the open-file limit, less
/// `reserve` descriptors.
pub(super) fn connections(
    header_read: Duration,
    idle: Duration,
    max: Option<usize>,
    flags: (&str, &str, &str),
    reserve: u64,
) -> Result<inferq_http::ConnLimits, Failure> {
    let (header_flag, idle_flag, max_flag) = flags;
    if header_read < Duration::from_millis(100) {
        return Err(bad(header_flag, "must be at least 100ms"));
    }
    if idle < Duration::from_millis(100) {
        return Err(bad(idle_flag, "must be at least 100ms"));
    }
    if max == Some(0) {
        return Err(bad(max_flag, "must be at least 1"));
    }
    let soft = crate::ops::fd_limit::raise().soft;
    Ok(inferq_http::ConnLimits {
        header_read_timeout: header_read,
        idle_timeout: idle,
        max_connections: max
            .unwrap_or_else(|| inferq_http::ConnLimits::default_max_connections(soft, reserve)),
    })
}

/// `--max-enqueued-lines` and the retention flags, checked.
fn retention(args: &BatchApiArgs) -> Result<inferq_batch::settings::Retention, Failure> {
    if args.max_enqueued_lines == Some(0) {
        return Err(bad(
            "--max-enqueued-lines",
            "must be at least 1 (leave it out for no bound)",
        ));
    }
    let second = Duration::from_secs(1);
    let most = Duration::from_secs(inferq_batch::settings::MAX_EXPIRES_AFTER);
    for (flag, d) in [
        ("--file-retention", args.file_retention),
        ("--batch-retention", args.batch_retention),
        ("--min-expires-after", args.min_expires_after),
        ("--sweep-interval", args.sweep_interval),
        ("--orphan-grace", args.orphan_grace),
    ] {
        if d < second {
            return Err(bad(flag, "must be at least 1s"));
        }
    }
    if args.min_expires_after > most {
        return Err(bad(
            "--min-expires-after",
            "must be at most 30 days (OpenAI's longest expires_after)",
        ));
    }
    Ok(inferq_batch::settings::Retention {
        files: args.file_retention,
        batches: args.batch_retention,
        min_expires_after: args.min_expires_after,
        sweep_interval: args.sweep_interval,
        orphan_grace: args.orphan_grace,
    })
}

pub(super) async fn batch_api(args: BatchApiArgs) -> Result<(), Failure> {
    let settings = settings(&args)?;
    let stop = CancellationToken::new();
    {
        let stop = stop.clone();
        tokio::spawn(async move {
            super::run::wait_for_signal().await;
            tracing::info!("signal received: stopping the batch API");
            stop.cancel();
        });
    }
    inferq_batch::serve(settings, stop).await.map_err(|e| {
        if e.is_bad_input() {
            Failure::bad_input(e)
        } else {
            Failure::from(e)
        }
    })
}
