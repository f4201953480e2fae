//! The `inferq run` flags, named and defaulted as the Go processor's (go-compat §8.1), so a
//! deployment can swap the binary and keep its command line. clap fills [`RunArgs`]; nothing is
//! interpreted here: [`super::load`] validates the flags and reads the files they name.
//!
//! Durations stay strings until loading so a bad one becomes a `ConfigError` naming the flag.
//! Legacy flags have no clap defaults (their Go defaults are in the help text) so the loader can
//! tell which were given. Values that may carry a password are [`Redacted`]. Boolean flags take
//! Go's spellings ([`go_bool`]) and the zap logging flags Go's values, so a value Go would refuse
//! is refused here too, by clap, with exit code 2 and the flag's name.

use std::fmt;

use clap::ArgAction;

use super::error::redact_in_text;

/// A flag value that may hold a password (a Redis URL, inline transport JSON). `Debug` shows it
/// with every URL password replaced by `***`.
#[derive(Clone, PartialEq, Eq)]
pub struct Redacted(String);

impl Redacted {
    /// The value as given. Use it, never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for Redacted {
    fn from(value: String) -> Self {
        Redacted(value)
    }
}

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&redact_in_text(&self.0), f)
    }
}

/// The `--help` heading of the Go processor's deprecated flags (its legacy single-queue and
/// pub/sub flags, kept so a Go command line runs unchanged), listed apart from the flags to use.
pub const GO_ALIASES: &str =
    "Go's deprecated flags (accepted so a Go command line runs; use the flags above)";

/// Flags of the processor, as the Go binary spells them.
#[derive(clap::Args, Debug, Clone)]
pub struct RunArgs {
    /// Transport: redis-sortedset, or redis-pubsub (Go's default, which must be named here;
    /// inferq admits its messages into durable queues). gcp-pubsub is refused with an error.
    #[arg(long, value_name = "NAME")]
    pub transport: Option<String>,

    /// Transport config as inline JSON (Go's sorted-set or pub/sub config; exactly one of this
    /// and --transport-config-file).
    #[arg(long = "transport-config", value_name = "JSON")]
    pub transport_config: Option<Redacted>,

    /// File holding the transport config JSON.
    #[arg(long = "transport-config-file", value_name = "PATH")]
    pub transport_config_file: Option<String>,

    /// How often the transport config file is read again to apply changes of its `queues`
    /// (0 = off; only with --transport=redis-sortedset and --transport-config-file). SIGHUP
    /// reloads it too, whatever this says.
    #[arg(
        long = "transport-config-watch-interval",
        default_value = "0s",
        value_name = "DURATION"
    )]
    pub transport_config_watch_interval: String,

    /// JSON array of worker pools [{"id","workers","gate_type","gate_params"}]; only together
    /// with a transport config. Without it: one pool "default" with --concurrency workers.
    #[arg(long = "pool-config-file", value_name = "PATH")]
    pub pool_config_file: Option<String>,

    /// Merge policy JSON file {"type":"random-robin","parameters":{...}}; default random-robin.
    #[arg(long = "request-merge-policy-config-file", value_name = "PATH")]
    pub request_merge_policy_config_file: Option<String>,

    /// Deprecated alias of --request-merge-policy-config-file (which wins if both are set).
    #[arg(
        long = "request-merge-policy-config",
        value_name = "PATH",
        help_heading = GO_ALIASES
    )]
    pub request_merge_policy_config: Option<String>,

    /// Workers of the implicit "default" pool.
    #[arg(
        long,
        default_value_t = 64,
        allow_negative_numbers = true,
        value_name = "N"
    )]
    pub concurrency: i64,

    /// Per-attempt timeout of an inference request (Go duration, e.g. 5m, 1m30s, 300s).
    #[arg(
        long = "request-timeout",
        default_value = "5m",
        value_name = "DURATION"
    )]
    pub request_timeout: String,

    /// How long in-flight requests may finish after a shutdown signal.
    #[arg(long = "drain-timeout", default_value = "2m", value_name = "DURATION")]
    pub drain_timeout: String,

    /// How long a request may wait at its pool's gate before it is put back in its queue (not
    /// failed, not a retry); 0 = until its deadline.
    #[arg(
        long = "gate-wait-timeout",
        default_value = "5m",
        value_name = "DURATION"
    )]
    pub gate_wait_timeout: String,

    /// How many times the router's flow control may evict one request (a 429 whose
    /// x-llm-d-request-dropped-reason starts with `evicted`) before it ends with an error; each
    /// eviction puts it back in its queue at once, not as a retry.
    #[arg(
        long = "max-evictions",
        default_value_t = 100,
        allow_negative_numbers = true,
        value_name = "N"
    )]
    pub max_evictions: i64,

    /// Port of /healthz and /readyz.
    #[arg(long = "health-port", default_value_t = 8081, value_name = "PORT")]
    pub health_port: u16,

    /// Port of /metrics.
    #[arg(long = "metrics-port", default_value_t = 9090, value_name = "PORT")]
    pub metrics_port: u16,

    /// The health and metrics listeners close a connection that has not sent a whole request
    /// head this long after it opened or began a request.
    #[arg(
        long = "http-header-read-timeout",
        default_value = "30s",
        value_name = "DURATION"
    )]
    pub http_header_read_timeout: String,

    /// The health and metrics listeners close a keep-alive connection idle this long between
    /// requests (longer than a load balancer's: AWS ALB 60s, GCP 600s).
    #[arg(
        long = "http-idle-timeout",
        default_value = "620s",
        value_name = "DURATION"
    )]
    pub http_idle_timeout: String,

    /// Most connections each of the health and metrics listeners holds open; past it a
    /// connection is answered 503 and closed. Default: from the open-file limit, at most 1024.
    #[arg(long = "http-max-connections", value_name = "N")]
    pub http_max_connections: Option<usize>,
    /// Address the health port listens on: `::` (every IPv6 and IPv4 address, as Go's
    /// `:port`; what a pod's probes need), or one address such as 127.0.0.1.
    #[arg(long = "health-address", default_value = "::", value_name = "IP")]
    pub health_address: std::net::IpAddr,

    /// Address the metrics port listens on (as --health-address).
    #[arg(long = "metrics-address", default_value = "::", value_name = "IP")]
    pub metrics_address: std::net::IpAddr,

    /// Accepted for compatibility and ignored: inferq serves /metrics without Kubernetes
    /// authentication.
    #[arg(
        long = "metrics-endpoint-auth",
        default_value_t = true,
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = go_bool,
        value_name = "BOOL"
    )]
    pub metrics_endpoint_auth: bool,

    /// How often queue backlogs are measured for metrics; 0 disables.
    #[arg(
        long = "metrics-backlog-poll-interval",
        default_value = "15s",
        value_name = "DURATION"
    )]
    pub metrics_backlog_poll_interval: String,

    /// CA bundle (PEM) added to the system roots for calls to the inference gateway.
    #[arg(long = "tls-ca-cert", value_name = "PATH")]
    pub tls_ca_cert: Option<String>,

    /// Client certificate (PEM) for calls to the inference gateway; needs --tls-key.
    #[arg(long = "tls-cert", value_name = "PATH")]
    pub tls_cert: Option<String>,

    /// Client key (PEM); needs --tls-cert.
    #[arg(long = "tls-key", value_name = "PATH")]
    pub tls_key: Option<String>,

    /// Skip verification of the gateway's certificate.
    #[arg(
        long = "tls-insecure-skip-verify",
        default_value_t = false,
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = go_bool,
        value_name = "BOOL"
    )]
    pub tls_insecure_skip_verify: bool,

    /// CA bundle (PEM) trusted for a rediss:// Redis URL instead of the public roots (inferq).
    #[arg(
        long = "redis-tls-ca-cert",
        env = "REDIS_TLS_CA_CERT",
        value_name = "PATH"
    )]
    pub redis_tls_ca_cert: Option<String>,

    /// Client certificate (PEM) for a Redis that requires one; needs --redis-tls-key (inferq).
    #[arg(long = "redis-tls-cert", env = "REDIS_TLS_CERT", value_name = "PATH")]
    pub redis_tls_cert: Option<String>,

    /// Client key (PEM) for --redis-tls-cert (inferq).
    #[arg(long = "redis-tls-key", env = "REDIS_TLS_KEY", value_name = "PATH")]
    pub redis_tls_key: Option<String>,

    /// Log verbosity: 2 default, 3 verbose, 4 debug, 5 trace.
    #[arg(
        short = 'v',
        long = "v",
        default_value_t = 2,
        allow_negative_numbers = true,
        value_name = "LEVEL"
    )]
    pub v: i32,

    /// Go's zap development mode [Go default: true]. As in Go, false writes JSON log lines
    /// (zap's production keys) unless --zap-encoder=console is given.
    #[arg(
        long = "zap-devel",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = go_bool,
        value_name = "BOOL"
    )]
    pub zap_devel: Option<bool>,

    /// Go's zap log encoder: json (one object per line with zap's keys level, ts, logger,
    /// caller, msg) or console (text lines) [default: console, json with --zap-devel=false].
    #[arg(long = "zap-encoder", value_parser = zap_encoder, value_name = "ENCODER")]
    pub zap_encoder: Option<String>,

    /// Go's zap log level, debug, info, error or a whole number above 0; accepted for
    /// compatibility and ignored with a warning: -v sets the level (in Go too, -v always wins).
    #[arg(long = "zap-log-level", value_parser = zap_log_level, value_name = "LEVEL")]
    pub zap_log_level: Option<String>,

    /// Go's zap stack-trace level, info, error or panic; accepted for compatibility and ignored.
    #[arg(
        long = "zap-stacktrace-level",
        value_parser = zap_stacktrace_level,
        value_name = "LEVEL"
    )]
    pub zap_stacktrace_level: Option<String>,

    /// Go's zap time encoding of JSON lines' ts, in UTC: epoch, millis, nanos, iso8601, rfc3339
    /// or rfc3339nano [default: rfc3339, as controller-runtime's]. Text lines keep their own.
    #[arg(
        long = "zap-time-encoding",
        value_parser = zap_time_encoding,
        value_name = "ENCODING"
    )]
    pub zap_time_encoding: Option<String>,

    /// Prometheus base URL, needed by the prometheus-* gates.
    #[arg(long = "prometheus-url", value_name = "URL")]
    pub prometheus_url: Option<Redacted>,

    /// How long Prometheus query results are cached; 0 disables.
    #[arg(
        long = "prometheus-cache-ttl",
        default_value = "5s",
        value_name = "DURATION"
    )]
    pub prometheus_cache_ttl: String,

    /// Request body transforms (JSON: {"requestTransforms":[{"name","type","parameters"}]}).
    #[arg(long = "transform-config-file", value_name = "PATH")]
    pub transform_config_file: Option<String>,

    /// Claim lease (crash-detection window; renewed every third of it), used when the transport
    /// config has no claim_lease_ttl_seconds [default: 30s].
    #[arg(long = "claim-lease-ttl", value_name = "DURATION")]
    pub claim_lease_ttl: Option<String>,

    /// How often expired claims are reclaimed, used when the transport config has no
    /// claim_reclaim_interval_ms [default: 5s, at most the lease].
    #[arg(long = "claim-reclaim-interval", value_name = "DURATION")]
    pub claim_reclaim_interval: Option<String>,

    /// Accepted for compatibility and ignored: inferq moves each request as a single copy, so
    /// no result-dedup marker is needed.
    #[arg(long = "result-dedup-ttl", value_name = "DURATION")]
    pub result_dedup_ttl: Option<String>,

    /// Deprecated: use --transport. redis-sortedset or redis-pubsub [Go default: redis-pubsub,
    /// which inferq asks to be named].
    #[arg(help_heading = GO_ALIASES, long = "message-queue-impl", value_name = "NAME")]
    pub message_queue_impl: Option<String>,

    /// Deprecated: Redis URL for the legacy flags [default: env REDIS_URL].
    #[arg(help_heading = GO_ALIASES, long = "redis.url", value_name = "URL")]
    pub redis_url: Option<Redacted>,

    /// Deprecated: sets enable_tracing of the transport config the legacy flags describe.
    #[arg(
        help_heading = GO_ALIASES,
        long = "redis-tracing",
        action = ArgAction::Set,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = go_bool,
        value_name = "BOOL"
    )]
    pub redis_tracing: Option<bool>,

    /// Deprecated: inference gateway base URL of the legacy single queue.
    #[arg(help_heading = GO_ALIASES, long = "redis.ss.igw-base-url", value_name = "URL")]
    pub redis_ss_igw_base_url: Option<String>,

    /// Deprecated: request path of the legacy single queue [default: /v1/completions].
    #[arg(help_heading = GO_ALIASES, long = "redis.ss.request-path-url", value_name = "PATH")]
    pub redis_ss_request_path_url: Option<String>,

    /// Deprecated: inference objective of the legacy single queue.
    #[arg(help_heading = GO_ALIASES, long = "redis.ss.inference-objective", value_name = "NAME")]
    pub redis_ss_inference_objective: Option<String>,

    /// Deprecated: request sorted set of the legacy single queue [default: request-sortedset].
    #[arg(help_heading = GO_ALIASES, long = "redis.ss.request-queue-name", value_name = "KEY")]
    pub redis_ss_request_queue_name: Option<String>,

    /// Deprecated: result list [default: result-list].
    #[arg(help_heading = GO_ALIASES, long = "redis.ss.result-queue-name", value_name = "KEY")]
    pub redis_ss_result_queue_name: Option<String>,

    /// Deprecated: poll interval in milliseconds [default: 1000].
    #[arg(
        help_heading = GO_ALIASES,
        long = "redis.ss.poll-interval-ms",
        allow_negative_numbers = true,
        value_name = "MS"
    )]
    pub redis_ss_poll_interval_ms: Option<i64>,

    /// Deprecated: requests taken per poll [default: 10].
    #[arg(
        help_heading = GO_ALIASES,
        long = "redis.ss.batch-size",
        allow_negative_numbers = true,
        value_name = "N"
    )]
    pub redis_ss_batch_size: Option<i64>,

    /// Deprecated: queue-level gate type of the legacy single queue.
    #[arg(help_heading = GO_ALIASES, long = "redis.ss.gate-type", value_name = "TYPE")]
    pub redis_ss_gate_type: Option<String>,

    /// Deprecated: queue-level gate parameters as a JSON object [default: {}].
    #[arg(help_heading = GO_ALIASES, long = "redis.ss.gate-params", value_name = "JSON")]
    pub redis_ss_gate_params: Option<String>,

    /// Deprecated: the queues as an inline JSON array of transport-config queues
    /// [{"queue_name","igw_base_url",...}]; wins over --redis.ss.queues-config-file and the
    /// single-queue --redis.ss.* flags.
    #[arg(help_heading = GO_ALIASES, long = "redis.ss.queues-config", value_name = "JSON")]
    pub redis_ss_queues_config: Option<Redacted>,

    /// Deprecated: file holding the queues JSON array (see --redis.ss.queues-config).
    #[arg(help_heading = GO_ALIASES, long = "redis.ss.queues-config-file", value_name = "PATH")]
    pub redis_ss_queues_config_file: Option<String>,

    /// Deprecated redis-pubsub flag: base URL of the
    /// inference gateway.
    #[arg(help_heading = GO_ALIASES, long = "redis.igw-base-url", value_name = "URL")]
    pub redis_igw_base_url: Option<String>,

    /// Deprecated redis-pubsub flag: request path [Go default: /v1/completions].
    #[arg(help_heading = GO_ALIASES, long = "redis.request-path-url", value_name = "PATH")]
    pub redis_request_path_url: Option<String>,

    /// Deprecated redis-pubsub flag: inference objective.
    #[arg(help_heading = GO_ALIASES, long = "redis.inference-objective", value_name = "NAME")]
    pub redis_inference_objective: Option<String>,

    /// Deprecated redis-pubsub flag: request channel [Go default: request-queue].
    #[arg(help_heading = GO_ALIASES, long = "redis.request-queue-name", value_name = "NAME")]
    pub redis_request_queue_name: Option<String>,

    /// Deprecated redis-pubsub flag: retry sorted set [Go default: retry-sortedset].
    #[arg(help_heading = GO_ALIASES, long = "redis.retry-queue-name", value_name = "KEY")]
    pub redis_retry_queue_name: Option<String>,

    /// Deprecated redis-pubsub flag: result channel [Go default: result-queue].
    #[arg(help_heading = GO_ALIASES, long = "redis.result-queue-name", value_name = "NAME")]
    pub redis_result_queue_name: Option<String>,

    /// Deprecated redis-pubsub flag: queues as inline JSON.
    #[arg(help_heading = GO_ALIASES, long = "redis.queues-config", value_name = "JSON")]
    pub redis_queues_config: Option<Redacted>,

    /// Deprecated redis-pubsub flag: queues config file.
    #[arg(help_heading = GO_ALIASES, long = "redis.queues-config-file", value_name = "PATH")]
    pub redis_queues_config_file: Option<String>,

    /// Deprecated gcp-pubsub flag (a transport inferq does not support): base URL of the
    /// inference gateway.
    #[arg(help_heading = GO_ALIASES, long = "pubsub.igw-base-url", value_name = "URL")]
    pub pubsub_igw_base_url: Option<String>,

    /// Deprecated gcp-pubsub flag: GCP project.
    #[arg(help_heading = GO_ALIASES, long = "pubsub.project-id", value_name = "ID")]
    pub pubsub_project_id: Option<String>,

    /// Deprecated gcp-pubsub flag: request path [Go default: /v1/completions].
    #[arg(help_heading = GO_ALIASES, long = "pubsub.request-path-url", value_name = "PATH")]
    pub pubsub_request_path_url: Option<String>,

    /// Deprecated gcp-pubsub flag: inference objective.
    #[arg(help_heading = GO_ALIASES, long = "pubsub.inference-objective", value_name = "NAME")]
    pub pubsub_inference_objective: Option<String>,

    /// Deprecated gcp-pubsub flag: request subscription.
    #[arg(help_heading = GO_ALIASES, long = "pubsub.request-subscriber-id", value_name = "ID")]
    pub pubsub_request_subscriber_id: Option<String>,

    /// Deprecated gcp-pubsub flag: result topic.
    #[arg(help_heading = GO_ALIASES, long = "pubsub.result-topic-id", value_name = "ID")]
    pub pubsub_result_topic_id: Option<String>,

    /// Deprecated gcp-pubsub flag: topics config file.
    #[arg(help_heading = GO_ALIASES, long = "pubsub.topics-config-file", value_name = "PATH")]
    pub pubsub_topics_config_file: Option<String>,

    /// Deprecated gcp-pubsub flag: messages outstanding per subscription [Go default: 10].
    #[arg(
        help_heading = GO_ALIASES,
        long = "pubsub.batch-size",
        allow_negative_numbers = true,
        value_name = "N"
    )]
    pub pubsub_batch_size: Option<i64>,
}

impl RunArgs {
    /// Names of the legacy flags that were given, for the deprecation warnings: those of the
    /// sorted-set transport first, then those of the pub/sub transports.
    pub(crate) fn legacy_flags_set(&self) -> Vec<&'static str> {
        let mut given = self.sorted_set_legacy_flags_set();
        given.extend(self.other_transport_flags_set());
        given
    }

    /// The legacy flags of the sorted-set transport (and the shared ones) that were given.
    pub(crate) fn sorted_set_legacy_flags_set(&self) -> Vec<&'static str> {
        given!(self,
            "--message-queue-impl" => message_queue_impl,
            "--redis-tracing" => redis_tracing,
            "--redis.url" => redis_url,
            "--redis.ss.igw-base-url" => redis_ss_igw_base_url,
            "--redis.ss.request-path-url" => redis_ss_request_path_url,
            "--redis.ss.inference-objective" => redis_ss_inference_objective,
            "--redis.ss.request-queue-name" => redis_ss_request_queue_name,
            "--redis.ss.result-queue-name" => redis_ss_result_queue_name,
            "--redis.ss.poll-interval-ms" => redis_ss_poll_interval_ms,
            "--redis.ss.batch-size" => redis_ss_batch_size,
            "--redis.ss.gate-type" => redis_ss_gate_type,
            "--redis.ss.gate-params" => redis_ss_gate_params,
            "--redis.ss.queues-config" => redis_ss_queues_config,
            "--redis.ss.queues-config-file" => redis_ss_queues_config_file,
        )
    }

    /// The given flags of the redis-pubsub and gcp-pubsub transports.
    pub(crate) fn other_transport_flags_set(&self) -> Vec<&'static str> {
        given!(self,
            "--redis.igw-base-url" => redis_igw_base_url,
            "--redis.request-path-url" => redis_request_path_url,
            "--redis.inference-objective" => redis_inference_objective,
            "--redis.request-queue-name" => redis_request_queue_name,
            "--redis.retry-queue-name" => redis_retry_queue_name,
            "--redis.result-queue-name" => redis_result_queue_name,
            "--redis.queues-config" => redis_queues_config,
            "--redis.queues-config-file" => redis_queues_config_file,
            "--pubsub.igw-base-url" => pubsub_igw_base_url,
            "--pubsub.project-id" => pubsub_project_id,
            "--pubsub.request-path-url" => pubsub_request_path_url,
            "--pubsub.inference-objective" => pubsub_inference_objective,
            "--pubsub.request-subscriber-id" => pubsub_request_subscriber_id,
            "--pubsub.result-topic-id" => pubsub_result_topic_id,
            "--pubsub.topics-config-file" => pubsub_topics_config_file,
            "--pubsub.batch-size" => pubsub_batch_size,
        )
    }

    /// Whether any flag of the new transport surface was given.
    pub(crate) fn new_surface(&self) -> bool {
        self.transport.is_some()
            || self.transport_config.is_some()
            || self.transport_config_file.is_some()
    }
}

/// The names, in order, of the flags whose field is set (`Some`): `given!(self, "--flag" =>
/// field, ...)`.
macro_rules! given {
    ($args:ident, $($name:literal => $field:ident,)*) => {
        [$(($name, $args.$field.is_some())),*]
            .into_iter()
            .filter_map(|(name, set)| set.then_some(name))
            .collect()
    };
}
use given;

/// A boolean flag value as Go's flag packages read it (`strconv.ParseBool`): `1`, `t`, `T`,
/// `TRUE`, `true`, `True` and `0`, `f`, `F`, `FALSE`, `false`, `False`. A bare flag means true.
pub fn go_bool(text: &str) -> Result<bool, String> {
    match text {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(
            "must be true or false (Go also reads 1, t, T, TRUE, True, 0, f, F, FALSE, \
                  False)"
                .to_owned(),
        ),
    }
}

/// `text` if it is one of `allowed`, ignoring case (as Go's zap flags compare).
fn one_of(text: &str, allowed: &[&str]) -> Result<String, String> {
    if allowed.iter().any(|a| a.eq_ignore_ascii_case(text)) {
        Ok(text.to_owned())
    } else {
        Err(format!("must be one of {}", allowed.join(", ")))
    }
}

/// `--zap-encoder`: `json` or `console`.
fn zap_encoder(text: &str) -> Result<String, String> {
    one_of(text, &["json", "console"])
}

/// `--zap-log-level`: `debug`, `info`, `error`, or a whole number above 0.
fn zap_log_level(text: &str) -> Result<String, String> {
    let named = one_of(text, &["debug", "info", "error"]);
    match text.parse::<i64>() {
        Ok(n) if n > 0 => Ok(text.to_owned()),
        _ => named.map_err(|_| "must be debug, info, error or a whole number above 0".to_owned()),
    }
}

/// `--zap-stacktrace-level`: `info`, `error` or `panic`.
fn zap_stacktrace_level(text: &str) -> Result<String, String> {
    one_of(text, &["info", "error", "panic"])
}

/// `--zap-time-encoding`: one of zap's time encoders.
fn zap_time_encoding(text: &str) -> Result<String, String> {
    one_of(
        text,
        &[
            "epoch",
            "millis",
            "nanos",
            "iso8601",
            "rfc3339",
            "rfc3339nano",
        ],
    )
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use clap::Parser;

    /// A parser around [`RunArgs`], as the CLI will flatten it.
    #[derive(Parser, Debug)]
    #[command(name = "inferq")]
    pub(crate) struct Cli {
        #[command(flatten)]
        pub run: RunArgs,
    }

    pub(crate) fn parse(args: &[&str]) -> Result<RunArgs, clap::Error> {
        Cli::try_parse_from(std::iter::once("inferq").chain(args.iter().copied())).map(|c| c.run)
    }

    #[test]
    fn go_defaults() {
        let a = parse(&[]).unwrap();
        assert_eq!(a.transport, None);
        assert_eq!(a.concurrency, 64);
        assert_eq!(a.request_timeout, "5m");
        assert_eq!(a.drain_timeout, "2m");
        assert_eq!(a.gate_wait_timeout, "5m");
        assert_eq!(a.health_port, 8081);
        assert_eq!(a.metrics_port, 9090);
        assert!(a.metrics_endpoint_auth);
        assert_eq!(a.metrics_backlog_poll_interval, "15s");
        assert!(!a.tls_insecure_skip_verify);
        assert_eq!(a.v, 2);
        assert_eq!(a.prometheus_cache_ttl, "5s");
        assert!(a.legacy_flags_set().is_empty());
        assert!(!a.new_surface());
    }

    #[test]
    fn go_spellings_parse() {
        let a = parse(&[
            "--transport=redis-sortedset",
            "--transport-config",
            "{}",
            "--concurrency=8",
            "-v",
            "4",
            "--metrics-endpoint-auth=false",
            "--tls-insecure-skip-verify",
            "--redis.ss.batch-size=-3",
            "--redis.url=redis://:pw@r",
            "--request-merge-policy-config=/m.json",
        ])
        .unwrap();
        assert_eq!(a.transport.as_deref(), Some("redis-sortedset"));
        assert_eq!(
            a.transport_config.as_ref().map(Redacted::expose),
            Some("{}")
        );
        assert_eq!(a.concurrency, 8);
        assert_eq!(a.v, 4);
        assert!(!a.metrics_endpoint_auth);
        assert!(a.tls_insecure_skip_verify);
        assert_eq!(a.redis_ss_batch_size, Some(-3));
        assert_eq!(a.request_merge_policy_config.as_deref(), Some("/m.json"));
        assert_eq!(
            a.legacy_flags_set(),
            vec!["--redis.url", "--redis.ss.batch-size"]
        );
        assert!(a.new_surface());
        assert_eq!(parse(&["--v=5"]).unwrap().v, 5);
        assert_eq!(parse(&["--concurrency", "-1"]).unwrap().concurrency, -1);
    }

    #[test]
    fn debug_hides_passwords() {
        let a = parse(&[
            "--redis.url=redis://u:hunter2@r:6379",
            r#"--transport-config={"url":"rediss://:hunter2@r"}"#,
            "--prometheus-url=http://p:hunter2@prom",
        ])
        .unwrap();
        let shown = format!("{a:?}");
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(shown.contains("redis://u:***@r:6379"), "{shown}");
    }

    #[test]
    fn clap_definition_is_consistent() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }
}
