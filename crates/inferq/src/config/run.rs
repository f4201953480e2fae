//! From flags to settings: [`load`] (or [`load_with_env`], whose environment lookup tests
//! replace) checks the flags, picks the transport surface (new JSON or legacy flags), reads the
//! transport, pool and merge-policy files, cross-checks them and returns one [`RunConfig`]. The
//! first problem found is returned as a [`ConfigError`] naming its flag or JSON path.

use std::path::{Path, PathBuf};
use std::time::Duration;

use inferq_client::connect::RedisTls;
use inferq_client::ClaimSettings;

use super::args::RunArgs;
use super::claim::{resolve_claim, ClaimFields, ClaimFlags};
use super::duration::{parse_duration, DurationError};
use super::json::decode;
use super::merge::{parse_merge_policy, MergePolicy};
use super::pools::{default_pools, parse_pools, PoolConfig};
use super::reload::ReloadSpec;
use super::transport::{
    check_http_url, resolve, resolve_pubsub, QueueConfig, RawSortedSet, SortedSetConfig,
    TransportKind, RAW_SORTED_SET_OBJECTS,
};
use super::{legacy, ConfigError};

/// Go's persisted transport.
const SORTED_SET: &str = TransportKind::SortedSet.name();
/// Go's ephemeral transport (its default), which inferq makes durable.
const PUBSUB: &str = TransportKind::PubSub.name();

/// Everything `inferq run` needs, validated and typed.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Where the transport config came from, for the start-up log.
    pub transport_source: TransportSource,
    /// The sorted-set transport and its queues.
    pub transport: SortedSetConfig,
    /// Lease, reclaim interval and delivery limit of the durable claims.
    pub claim: ClaimSettings,
    /// Worker pools; every queue's `worker_pool_id` names one of them.
    pub pools: Vec<PoolConfig>,
    /// How each pool merges its queues.
    pub merge_policy: MergePolicy,
    /// Per-attempt limit of an inference request (also bounds a pool-gate wait).
    pub request_timeout: Duration,
    /// How long in-flight work may finish after a shutdown signal.
    pub drain_timeout: Duration,
    /// `--gate-wait-timeout`: how long a request may wait at its pool gate before it is put
    /// back in its queue; `None` (the flag's `0`) waits until the deadline.
    pub gate_wait_timeout: Option<Duration>,
    /// `--max-evictions`: how often the router may evict one request before it ends with an
    /// error.
    pub max_evictions: u32,
    /// Port of /healthz and /readyz.
    pub health_port: u16,
    /// Port of /metrics.
    pub metrics_port: u16,
    /// `--http-header-read-timeout`, `--http-idle-timeout`: bounds of the health and metrics
    /// listeners' connections.
    pub http_header_read_timeout: Duration,
    pub http_idle_timeout: Duration,
    /// `--http-max-connections`; `None`: derived from the open-file limit at start-up.
    pub http_max_connections: Option<usize>,
    /// `--health-address`, `--metrics-address`: where those ports listen.
    pub health_address: std::net::IpAddr,
    pub metrics_address: std::net::IpAddr,
    /// How often queue backlogs are measured; `None` when disabled (`0`).
    pub metrics_backlog_poll_interval: Option<Duration>,
    /// TLS for calls to the inference gateway; `None` when no TLS flag was given.
    pub tls: Option<TlsFiles>,
    /// TLS files for a `rediss://` Redis URL (private CA, client certificate).
    pub redis_tls: RedisTls,
    /// Prometheus access for the `prometheus-*` gates.
    pub prometheus: PrometheusSettings,
    /// Request body transforms, in the order they are tried (`--transform-config-file`).
    pub transforms: Vec<super::transform::TransformSpec>,
    /// OpenTelemetry tracing; `None` unless `OTEL_EXPORTER_OTLP_ENDPOINT` is set.
    pub otel: Option<super::otel::OtelSettings>,
    /// Log verbosity (`-v`): 2 default, 3 verbose, 4 debug, 5 trace.
    pub verbosity: i32,
    /// Deprecations and ignored settings, for the caller to log once logging is up.
    pub warnings: Vec<String>,
    /// How the queues of the transport config file may be reloaded while running (SIGHUP,
    /// `--transport-config-watch-interval`); `None` unless the transport is
    /// `redis-sortedset` given by `--transport-config-file`.
    pub reload: Option<ReloadSpec>,
}

impl RunConfig {
    /// Workers across all pools (sizes the HTTP connection pool).
    pub fn total_workers(&self) -> u64 {
        self.pools.iter().map(|p| u64::from(p.workers)).sum()
    }

    /// The pool with this id.
    pub fn pool(&self, id: &str) -> Option<&PoolConfig> {
        self.pools.iter().find(|p| p.id == id)
    }
}

/// Where the transport config came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransportSource {
    /// `--transport-config` (inline JSON).
    Inline,
    /// `--transport-config-file`.
    File(PathBuf),
    /// Synthesised from the deprecated `--message-queue-impl`/`--redis.*` flags.
    LegacyFlags,
}

/// TLS files for the HTTP client; all paths were checked to exist at load time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Extra CA bundle (PEM) added to the system roots.
    pub ca_cert: Option<PathBuf>,
    /// Client certificate and key (always both).
    pub client: Option<ClientCert>,
    /// Skip verification of the server certificate.
    pub insecure_skip_verify: bool,
}

/// A client certificate and its key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientCert {
    /// Certificate chain (PEM).
    pub cert: PathBuf,
    /// Private key (PEM).
    pub key: PathBuf,
}

/// Prometheus settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrometheusSettings {
    /// Base URL (http or https); required by the `prometheus-*` gates.
    pub url: Option<String>,
    /// How long query results are cached; zero disables the cache.
    pub cache_ttl: Duration,
}

/// Loads the configuration with the process environment.
pub fn load(args: &RunArgs) -> Result<RunConfig, ConfigError> {
    load_with_env(args, |key| std::env::var(key).ok())
}

/// Loads the configuration, looking environment variables (`REDIS_URL`) up with `env`.
///
/// The steps run in a fixed order, and the first problem found wins: the flags on their own,
/// then the transport, the OpenTelemetry environment, the pools and the checks across them,
/// then the merge policy, the claim settings and the reload spec.
pub fn load_with_env<F>(args: &RunArgs, env: F) -> Result<RunConfig, ConfigError>
where
    F: Fn(&str) -> Option<String>,
{
    let env: &dyn Fn(&str) -> Option<String> = &env;
    let mut warnings = Vec::new();
    let flags = Flags::check(args, &mut warnings)?;
    let loaded = load_transport(args, env, &mut warnings)?;
    let otel = super::otel::from_env(env)?;
    warnings.extend(tracing_warning(
        loaded.transport.enable_tracing,
        otel.is_some(),
    ));
    let pools = pools(args, &loaded, flags.concurrency, &mut warnings)?;
    let prometheus = flags.prometheus_url.is_some();
    check_queue_pools(&loaded.transport.queues, &pools).map_err(|e| loaded.rename(e))?;
    check_prometheus_gates(&loaded.transport.queues, &pools, prometheus)
        .map_err(|e| loaded.rename(e))?;
    check_redis_tls_url(&flags.redis_tls, &loaded.transport)?;
    let merge_policy = merge_policy(args, &mut warnings)?;
    check_template_queue(&merge_policy, &loaded.transport.queues)?;
    let claim = resolve_claim(loaded.claim_fields, flags.claim)?;
    let reload = super::reload::spec(
        flags.watch,
        &loaded.source,
        loaded.kind,
        loaded.raw_json,
        &pools,
        prometheus,
    )?;

    Ok(RunConfig {
        transport_source: loaded.source,
        transport: loaded.transport,
        claim,
        pools,
        merge_policy,
        request_timeout: flags.request_timeout,
        drain_timeout: flags.drain_timeout,
        gate_wait_timeout: (!flags.gate_wait.is_zero()).then_some(flags.gate_wait),
        max_evictions: flags.max_evictions,
        health_port: args.health_port,
        metrics_port: args.metrics_port,
        http_header_read_timeout: flags.http_header_read,
        http_idle_timeout: flags.http_idle,
        http_max_connections: args.http_max_connections,
        health_address: args.health_address,
        metrics_address: args.metrics_address,
        metrics_backlog_poll_interval: (!flags.backlog.is_zero()).then_some(flags.backlog),
        tls: flags.tls,
        redis_tls: flags.redis_tls,
        prometheus: PrometheusSettings {
            url: flags.prometheus_url,
            cache_ttl: flags.cache_ttl,
        },
        transforms: flags.transforms,
        otel,
        verbosity: args.v,
        warnings,
        reload,
    })
}

/// The flags that are checked on their own, before the transport is read.
struct Flags {
    concurrency: u32,
    request_timeout: Duration,
    drain_timeout: Duration,
    /// `--gate-wait-timeout`; zero waits until the deadline.
    gate_wait: Duration,
    /// `--max-evictions`.
    max_evictions: u32,
    /// `--metrics-backlog-poll-interval`; zero disables the backlog poll.
    backlog: Duration,
    cache_ttl: Duration,
    /// `--transport-config-watch-interval`, for the reload spec.
    watch: Duration,
    transforms: Vec<super::transform::TransformSpec>,
    tls: Option<TlsFiles>,
    redis_tls: RedisTls,
    prometheus_url: Option<String>,
    /// The claim flags, resolved with the transport's claim fields at the end.
    claim: ClaimFlags,
    http_header_read: Duration,
    http_idle: Duration,
}

impl Flags {
    /// Checks the flags in the order their errors are reported, and adds the warnings for
    /// flags inferq ignores.
    fn check(args: &RunArgs, warnings: &mut Vec<String>) -> Result<Flags, ConfigError> {
        let concurrency = concurrency(args)?;
        let request_timeout = positive_duration("--request-timeout", &args.request_timeout)?;
        // Zero is Go's "do not wait": in-flight requests are aborted and released at once.
        let drain_timeout = flag_duration("--drain-timeout", &args.drain_timeout)?;
        let gate_wait = flag_duration("--gate-wait-timeout", &args.gate_wait_timeout)?;
        let max_evictions = max_evictions(args)?;
        let backlog = flag_duration(
            "--metrics-backlog-poll-interval",
            &args.metrics_backlog_poll_interval,
        )?;
        let cache_ttl = flag_duration("--prometheus-cache-ttl", &args.prometheus_cache_ttl)?;
        let watch = flag_duration(
            "--transport-config-watch-interval",
            &args.transport_config_watch_interval,
        )?;
        check_ports(args)?;
        let http_header_read =
            positive_duration("--http-header-read-timeout", &args.http_header_read_timeout)?;
        let http_idle = positive_duration("--http-idle-timeout", &args.http_idle_timeout)?;
        if args.http_max_connections == Some(0) {
            return Err(ConfigError::invalid(
                "--http-max-connections",
                "must be at least 1",
            ));
        }
        let transforms = match non_empty(&args.transform_config_file) {
            Some(path) => {
                super::transform::parse_transforms(&read("--transform-config-file", path)?)
                    .map_err(|e| e.in_file(path))?
            }
            None => Vec::new(),
        };
        let tls = tls_files(args)?;
        let redis_tls = redis_tls(args)?;
        let prometheus_url = prometheus_url(args)?;
        let claim = claim_flags(args)?;
        warnings.extend(ignored_flag_warnings(args)?);
        warnings.extend(logging_warnings(args));
        Ok(Flags {
            concurrency,
            request_timeout,
            drain_timeout,
            gate_wait,
            max_evictions,
            backlog,
            cache_ttl,
            watch,
            transforms,
            tls,
            redis_tls,
            prometheus_url,
            claim,
            http_header_read,
            http_idle,
        })
    }
}

/// `--concurrency`: the workers of the default pool, at least 1.
fn concurrency(args: &RunArgs) -> Result<u32, ConfigError> {
    match args.concurrency {
        n if n < 1 => Err(ConfigError::invalid(
            "--concurrency",
            format!("must be at least 1, got {n}"),
        )),
        n => u32::try_from(n).map_err(|_| {
            ConfigError::invalid(
                "--concurrency",
                format!("must be at most {}, got {n}", u32::MAX),
            )
        }),
    }
}

/// `--max-evictions`: at least 1.
fn max_evictions(args: &RunArgs) -> Result<u32, ConfigError> {
    let n = args.max_evictions;
    if n < 1 {
        return Err(ConfigError::invalid(
            "--max-evictions",
            format!("must be at least 1, got {n}"),
        ));
    }
    u32::try_from(n).map_err(|_| {
        ConfigError::invalid(
            "--max-evictions",
            format!("must be at most {}, got {n}", u32::MAX),
        )
    })
}

/// The health and metrics ports differ (unless both are 0, any free port).
fn check_ports(args: &RunArgs) -> Result<(), ConfigError> {
    if args.health_port == args.metrics_port && args.health_port != 0 {
        return Err(ConfigError::invalid(
            "--metrics-port",
            format!(
                "must differ from --health-port (both are {})",
                args.health_port
            ),
        ));
    }
    Ok(())
}

/// `--prometheus-url`, when set: an http or https URL.
fn prometheus_url(args: &RunArgs) -> Result<Option<String>, ConfigError> {
    match args.prometheus_url.as_ref().map(|u| u.expose()) {
        None | Some("") => Ok(None),
        Some(url) => {
            check_http_url(url)
                .map_err(|reason| ConfigError::invalid("--prometheus-url", reason))?;
            Ok(Some(url.to_owned()))
        }
    }
}

/// The claim flags, each an optional duration.
fn claim_flags(args: &RunArgs) -> Result<ClaimFlags, ConfigError> {
    Ok(ClaimFlags {
        lease: optional_duration("--claim-lease-ttl", &args.claim_lease_ttl)?,
        reclaim_interval: optional_duration(
            "--claim-reclaim-interval",
            &args.claim_reclaim_interval,
        )?,
    })
}

/// Warnings for Go flags inferq accepts but ignores (a bad `--result-dedup-ttl` is still an
/// error, as in Go).
fn ignored_flag_warnings(args: &RunArgs) -> Result<Vec<String>, ConfigError> {
    let mut warnings = Vec::new();
    if optional_duration("--result-dedup-ttl", &args.result_dedup_ttl)?.is_some() {
        warnings.push(
            "--result-dedup-ttl is ignored: inferq moves each request as a single copy, so no \
             result-dedup marker is needed"
                .to_owned(),
        );
    }
    if args.metrics_endpoint_auth {
        warnings.push(
            "--metrics-endpoint-auth is ignored: inferq serves /metrics without Kubernetes \
             authentication; restrict access to the metrics port (e.g. a NetworkPolicy), and pass \
             --metrics-endpoint-auth=false to silence this warning"
                .to_owned(),
        );
    }
    Ok(warnings)
}

/// The transport as resolved, with what the rest of loading needs to know of where it came
/// from.
struct LoadedTransport {
    source: TransportSource,
    kind: TransportKind,
    /// What the running config was read from, for a reload to compare with.
    raw_json: serde_json::Value,
    transport: SortedSetConfig,
    /// The claim fields of the transport config, resolved with the claim flags.
    claim_fields: ClaimFields,
    /// How to name the legacy flags in errors, when the transport was synthesised from them.
    legacy: Option<legacy::Legacy>,
}

impl LoadedTransport {
    fn rename(&self, e: ConfigError) -> ConfigError {
        rename_legacy(self.legacy.as_ref(), e)
    }
}

/// Errors about the config the legacy flags made name those flags.
fn rename_legacy(legacy: Option<&legacy::Legacy>, e: ConfigError) -> ConfigError {
    match legacy {
        Some(legacy) => legacy.rename(e),
        None => e,
    }
}

/// Transport: the new JSON surface, or the legacy flags, resolved into the sorted-set config.
fn load_transport(
    args: &RunArgs,
    env: &dyn Fn(&str) -> Option<String>,
    warnings: &mut Vec<String>,
) -> Result<LoadedTransport, ConfigError> {
    // An error in the file names the file.
    let in_file = |e: ConfigError| match non_empty(&args.transport_config_file) {
        Some(path) if args.transport_config.is_none() => e.in_file(path),
        _ => e,
    };
    let (source, kind, raw, legacy) = select_transport(args, env, warnings).map_err(in_file)?;
    // What the running config was read from, for a reload to compare with.
    let raw_json = serde_json::to_value(&raw).unwrap_or(serde_json::Value::Null);
    let (mut transport, claim_fields) = match kind {
        TransportKind::SortedSet => resolve(raw, env, warnings),
        TransportKind::PubSub => resolve_pubsub(raw, env, warnings),
    }
    .map_err(|e| in_file(rename_legacy(legacy.as_ref(), e)))?;
    if let Some(legacy) = &legacy {
        for q in &mut transport.queues {
            q.gate_params_field = legacy.name(&q.gate_params_field);
        }
    }
    Ok(LoadedTransport {
        source,
        kind,
        raw_json,
        transport,
        claim_fields,
        legacy,
    })
}

/// The worker pools: from `--pool-config-file`, or one default pool of `--concurrency`
/// workers.
fn pools(
    args: &RunArgs,
    loaded: &LoadedTransport,
    concurrency: u32,
    warnings: &mut Vec<String>,
) -> Result<Vec<PoolConfig>, ConfigError> {
    Ok(match non_empty(&args.pool_config_file) {
        Some(_) if loaded.legacy.is_some() && !legacy::has_queues_config(args) => {
            return Err(ConfigError::invalid(
                "--pool-config-file",
                "pool-config-file can only be specified when a transport/queues config is also \
                 specified (--transport-config, --transport-config-file, or the deprecated \
                 --redis.ss.queues-config or --redis.ss.queues-config-file)",
            ))
        }
        Some(path) => {
            // Go ignores it too; a value other than the default says the user expected it.
            if args.concurrency != 64 {
                warnings.push(format!(
                    "--concurrency {concurrency} is ignored: with --pool-config-file each pool's \
                     `workers` sets its size"
                ));
            }
            parse_pools(&read("--pool-config-file", path)?, warnings)
                .map_err(|e| e.in_file(path))?
        }
        None => default_pools(concurrency),
    })
}

/// Redis TLS files ask for a `rediss://` Redis URL.
fn check_redis_tls_url(
    redis_tls: &RedisTls,
    transport: &SortedSetConfig,
) -> Result<(), ConfigError> {
    if redis_tls.is_configured() && !transport.url.is_tls() {
        return Err(ConfigError::invalid(
            "--redis-tls-ca-cert",
            format!(
                "Redis TLS files were given, but the Redis URL {} is not rediss://",
                transport.url.redacted()
            ),
        ));
    }
    Ok(())
}

/// Every queue's `worker_pool_id` names one of `pools`.
pub(crate) fn check_queue_pools(
    queues: &[QueueConfig],
    pools: &[PoolConfig],
) -> Result<(), ConfigError> {
    for (i, q) in queues.iter().enumerate() {
        if !pools.iter().any(|p| p.id == q.worker_pool_id) {
            let defined: Vec<&str> = pools.iter().map(|p| p.id.as_str()).collect();
            return Err(ConfigError::invalid(
                format!("queues[{i}].worker_pool_id"),
                format!(
                    "pool {:?} is not defined (defined pools: {})",
                    q.worker_pool_id,
                    defined.join(", ")
                ),
            ));
        }
    }
    Ok(())
}

/// Without `--prometheus-url`, no queue or pool gate may be one of the `prometheus-*` gates.
pub(crate) fn check_prometheus_gates(
    queues: &[QueueConfig],
    pools: &[PoolConfig],
    prometheus: bool,
) -> Result<(), ConfigError> {
    if prometheus {
        return Ok(());
    }
    let queue_gates = queues
        .iter()
        .enumerate()
        .map(|(i, q)| (format!("queues[{i}]"), &q.gate));
    let pool_gates = pools
        .iter()
        .enumerate()
        .map(|(i, p)| (format!("pools[{i}]"), &p.gate));
    for (at, gate) in queue_gates.chain(pool_gates) {
        if let Some(gate) = gate.as_ref().filter(|g| g.kind.needs_prometheus()) {
            return Err(ConfigError::invalid(
                format!("{at}.gate_type"),
                format!(
                    "{:?} requires --prometheus-url flag to be set",
                    gate.kind.as_str()
                ),
            ));
        }
    }
    Ok(())
}

/// Picks the transport surface and returns the raw transport config it describes (and, for the
/// legacy flags, how to name them in errors).
fn select_transport(
    args: &RunArgs,
    env: &dyn Fn(&str) -> Option<String>,
    warnings: &mut Vec<String>,
) -> Result<
    (
        TransportSource,
        TransportKind,
        RawSortedSet,
        Option<legacy::Legacy>,
    ),
    ConfigError,
> {
    if !args.new_surface() {
        if args.legacy_flags_set().is_empty() {
            return Err(ConfigError::invalid(
                "--transport",
                "no transport configured; pass --transport=redis-sortedset with \
                 --transport-config or --transport-config-file",
            ));
        }
        let (kind, raw, legacy) = legacy::synthesise(args, env, warnings)?;
        return Ok((TransportSource::LegacyFlags, kind, raw, Some(legacy)));
    }
    let kind = transport_kind(args)?;
    let (source, text, name) = transport_config_text(args)?;
    let ignored = args.legacy_flags_set();
    if !ignored.is_empty() {
        warnings.push(format!(
            "ignoring the deprecated flags {} because --transport/--transport-config is set",
            ignored.join(", ")
        ));
    }
    let raw = decode(&text, "", name, &RAW_SORTED_SET_OBJECTS)?;
    Ok((source, kind, raw, None))
}

/// `--transport`: one of the two Redis transports, named explicitly.
fn transport_kind(args: &RunArgs) -> Result<TransportKind, ConfigError> {
    match args.transport.as_deref() {
        Some(SORTED_SET) => Ok(TransportKind::SortedSet),
        Some(PUBSUB) => Ok(TransportKind::PubSub),
        Some(other) => Err(ConfigError::unsupported(
            "--transport",
            format!(
                "{other:?} is not supported; inferq supports {SORTED_SET} and {PUBSUB} \
                 (gcp-pubsub is not supported)"
            ),
        )),
        None => Err(ConfigError::invalid(
            "--transport",
            "not set, so Go would use redis-pubsub; inferq asks for the choice to be \
             explicit: pass --transport=redis-pubsub or --transport=redis-sortedset",
        )),
    }
}

/// The transport config's text from exactly one of `--transport-config` (inline) and
/// `--transport-config-file`, with where it came from and the flag that named it.
fn transport_config_text(
    args: &RunArgs,
) -> Result<(TransportSource, String, &'static str), ConfigError> {
    let inline = args
        .transport_config
        .as_ref()
        .map(|c| c.expose())
        .filter(|c| !c.is_empty());
    let file = non_empty(&args.transport_config_file);
    match (inline, file) {
        (Some(_), Some(_)) => Err(ConfigError::invalid(
            "--transport-config",
            "set only one of --transport-config and --transport-config-file",
        )),
        (None, None) => Err(ConfigError::invalid(
            "--transport-config",
            "required with --transport: set --transport-config or --transport-config-file",
        )),
        (Some(text), None) => Ok((
            TransportSource::Inline,
            text.to_owned(),
            "--transport-config",
        )),
        (None, Some(path)) => Ok((
            TransportSource::File(PathBuf::from(path)),
            read("--transport-config-file", path)?,
            "--transport-config-file",
        )),
    }
}

/// Warnings for Go's zap flags where inferq's logs differ from what they ask of Go's: the level
/// is set by `-v` alone, as in Go. (The format flags are honoured: see `cli::logs`.)
fn logging_warnings(args: &RunArgs) -> Vec<String> {
    let mut warnings = Vec::new();
    if let Some(level) = &args.zap_log_level {
        warnings.push(format!(
            "--zap-log-level={level} is ignored: -v sets the log level (in the Go processor too, \
             -v always wins)"
        ));
    }
    warnings
}

/// The merge policy from `--request-merge-policy-config-file` (or its deprecated alias).
fn merge_policy(args: &RunArgs, warnings: &mut Vec<String>) -> Result<MergePolicy, ConfigError> {
    let canonical = non_empty(&args.request_merge_policy_config_file);
    let alias = non_empty(&args.request_merge_policy_config);
    let (flag, path) = match (canonical, alias) {
        (Some(path), Some(_)) => {
            warnings.push(
                "--request-merge-policy-config is deprecated and ignored because \
                 --request-merge-policy-config-file is also set"
                    .to_owned(),
            );
            ("--request-merge-policy-config-file", path)
        }
        (Some(path), None) => ("--request-merge-policy-config-file", path),
        (None, Some(path)) => {
            warnings.push(
                "--request-merge-policy-config is deprecated; use \
                 --request-merge-policy-config-file"
                    .to_owned(),
            );
            ("--request-merge-policy-config", path)
        }
        (None, None) => return Ok(MergePolicy::default()),
    };
    parse_merge_policy(&read(flag, path)?).map_err(|e| e.in_file(path))
}

/// `fair-share`'s `template_queue`, when given, names a listed queue (the queues it finds take
/// its settings).
fn check_template_queue(
    policy: &MergePolicy,
    queues: &[super::QueueConfig],
) -> Result<(), ConfigError> {
    let super::MergePolicyKind::FairShare(fs) = &policy.kind else {
        return Ok(());
    };
    if fs.template_queue.is_empty() || queues.iter().any(|q| q.id == fs.template_queue) {
        return Ok(());
    }
    Err(ConfigError::invalid(
        "merge_policy.parameters.template_queue",
        format!(
            "no queue with id {:?} in the transport config",
            fs.template_queue
        ),
    ))
}

/// A CA file and a client certificate and key, checked together.
type PemTrio<'a> = (Option<&'a str>, Option<(&'a str, &'a str)>);

/// Checks a trio of CA / client-certificate / client-key flags (each a flag name and its value):
/// every named file exists, and the certificate and the key come together.
fn pem_trio<'a>(
    [ca, cert, key]: [(&'static str, Option<&'a str>); 3],
) -> Result<PemTrio<'a>, ConfigError> {
    for (flag, path) in [ca, cert, key] {
        if let Some(path) = path {
            if !Path::new(path).is_file() {
                return Err(ConfigError::invalid(
                    flag,
                    format!("file {path:?} does not exist or is not a file"),
                ));
            }
        }
    }
    match (cert.1, key.1) {
        (Some(c), Some(k)) => Ok((ca.1, Some((c, k)))),
        (Some(_), None) => Err(ConfigError::invalid(
            key.0,
            format!("required when {} is set", cert.0),
        )),
        (None, Some(_)) => Err(ConfigError::invalid(
            cert.0,
            format!("required when {} is set", key.0),
        )),
        (None, None) => Ok((ca.1, None)),
    }
}

/// The gateway TLS flags: cert and key together, every named file present.
fn tls_files(args: &RunArgs) -> Result<Option<TlsFiles>, ConfigError> {
    let ca = non_empty(&args.tls_ca_cert);
    let cert = non_empty(&args.tls_cert);
    let key = non_empty(&args.tls_key);
    if ca.is_none() && cert.is_none() && key.is_none() && !args.tls_insecure_skip_verify {
        return Ok(None);
    }
    let (ca, client) = pem_trio([
        ("--tls-ca-cert", ca),
        ("--tls-cert", cert),
        ("--tls-key", key),
    ])?;
    Ok(Some(TlsFiles {
        ca_cert: ca.map(PathBuf::from),
        client: client.map(|(cert, key)| ClientCert {
            cert: cert.into(),
            key: key.into(),
        }),
        insecure_skip_verify: args.tls_insecure_skip_verify,
    }))
}

/// The Redis TLS flags: cert and key together, every named file present.
fn redis_tls(args: &RunArgs) -> Result<RedisTls, ConfigError> {
    let (ca, client) = pem_trio([
        ("--redis-tls-ca-cert", non_empty(&args.redis_tls_ca_cert)),
        ("--redis-tls-cert", non_empty(&args.redis_tls_cert)),
        ("--redis-tls-key", non_empty(&args.redis_tls_key)),
    ])?;
    Ok(RedisTls {
        ca_cert: ca.map(PathBuf::from),
        client: client.map(|(cert, key)| (PathBuf::from(cert), PathBuf::from(key))),
    })
}

/// Reads a file named by `flag`.
fn read(flag: &'static str, path: &str) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        flag,
        path: path.into(),
        source,
    })
}

/// `Some(s)` for a non-empty flag value: Go treats `--flag=""` as unset.
fn non_empty(value: &Option<String>) -> Option<&str> {
    value.as_deref().filter(|s| !s.is_empty())
}

/// A duration flag; zero allowed.
fn flag_duration(flag: &str, text: &str) -> Result<Duration, ConfigError> {
    parse_duration(text).map_err(|e| {
        let reason = match e {
            DurationError::Syntax => format!("invalid duration {text:?}"),
            DurationError::Negative => format!("must not be negative, got {text:?}"),
            DurationError::TooLarge => format!("duration {text:?} is too large"),
        };
        ConfigError::invalid(flag, reason)
    })
}

/// A duration flag that must be greater than zero.
fn positive_duration(flag: &str, text: &str) -> Result<Duration, ConfigError> {
    let d = flag_duration(flag, text)?;
    if d.is_zero() {
        return Err(ConfigError::invalid(
            flag,
            format!("must be greater than 0, got {text:?}"),
        ));
    }
    Ok(d)
}

/// An optional duration flag; an empty value counts as unset.
fn optional_duration(flag: &str, text: &Option<String>) -> Result<Option<Duration>, ConfigError> {
    non_empty(text).map(|t| flag_duration(flag, t)).transpose()
}

/// The warning for Go's `enable_tracing` without an OTLP endpoint: it asks for a span per Redis
/// command, and spans go where `OTEL_EXPORTER_OTLP_ENDPOINT` says (Go drops them silently).
fn tracing_warning(enable_tracing: bool, exporting: bool) -> Option<String> {
    (enable_tracing && !exporting).then(|| {
        "enable_tracing is true, but OTEL_EXPORTER_OTLP_ENDPOINT is unset: no spans of Redis \
         commands (nor of requests) are exported"
            .to_owned()
    })
}
