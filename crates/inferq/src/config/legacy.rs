//! The deprecated flag surface (go-compat §8.1): `--message-queue-impl=redis-sortedset` with
//! `--redis.url` and `--redis.ss.*` describes the queues, either one queue named by the
//! single-queue flags or the JSON array of `--redis.ss.queues-config` (inline, wins) or
//! `--redis.ss.queues-config-file`. Like Go's compat shim, this module turns those flags into a
//! transport config ([`RawSortedSet`]) that then goes through the normal loader, and
//! [`Legacy::rename`] renames errors about that config back to the flag the user actually wrote.
//!
//! `--message-queue-impl=redis-pubsub` with `--redis.url` and the `--redis.*` flags (channel,
//! gateway, retry set, result channel, or `--redis.queues-config`) describes Go's redis-pubsub
//! transport the same way. The flags of a transport not selected (and `--pubsub.*`, of
//! gcp-pubsub, which inferq does not implement) parse and are ignored with a warning.

use serde_json::Value;

use super::args::RunArgs;
use super::error::redact_in_text;
use super::json::decode;
use super::transport::{RawQueue, RawSortedSet, TransportKind};
use super::ConfigError;

/// The legacy flags of one transport.
struct Flags {
    /// The transport (its name is `--message-queue-impl`'s value).
    kind: TransportKind,
    result_queue_name: &'static str,
    retry_queue_name: Option<&'static str>,
    poll_interval_ms: Option<&'static str>,
    batch_size: Option<&'static str>,
    queues_config: &'static str,
    queues_config_file: &'static str,
    /// The single-queue flags, which a queues config replaces: request queue (or channel),
    /// gateway, path, objective, then the gate's type and parameters (sorted set only).
    queue_name: &'static str,
    igw_base_url: &'static str,
    request_path_url: &'static str,
    inference_objective: &'static str,
    gate_type: Option<&'static str>,
    gate_params: Option<&'static str>,
    /// Go's default request queue (or channel) of the single-queue flags.
    default_queue: &'static str,
}

const SORTED_SET: Flags = Flags {
    kind: TransportKind::SortedSet,
    result_queue_name: "--redis.ss.result-queue-name",
    retry_queue_name: None,
    poll_interval_ms: Some("--redis.ss.poll-interval-ms"),
    batch_size: Some("--redis.ss.batch-size"),
    queues_config: "--redis.ss.queues-config",
    queues_config_file: "--redis.ss.queues-config-file",
    queue_name: "--redis.ss.request-queue-name",
    igw_base_url: "--redis.ss.igw-base-url",
    request_path_url: "--redis.ss.request-path-url",
    inference_objective: "--redis.ss.inference-objective",
    gate_type: Some("--redis.ss.gate-type"),
    gate_params: Some("--redis.ss.gate-params"),
    default_queue: "request-sortedset",
};

const PUBSUB: Flags = Flags {
    kind: TransportKind::PubSub,
    result_queue_name: "--redis.result-queue-name",
    retry_queue_name: Some("--redis.retry-queue-name"),
    poll_interval_ms: None,
    batch_size: None,
    queues_config: "--redis.queues-config",
    queues_config_file: "--redis.queues-config-file",
    queue_name: "--redis.request-queue-name",
    igw_base_url: "--redis.igw-base-url",
    request_path_url: "--redis.request-path-url",
    inference_objective: "--redis.inference-objective",
    gate_type: None,
    gate_params: None,
    default_queue: "request-queue",
};

impl Flags {
    /// The single-queue flags, which a queues config makes moot.
    fn single_queue(&self) -> Vec<&'static str> {
        let mut flags = vec![
            self.igw_base_url,
            self.request_path_url,
            self.inference_objective,
            self.queue_name,
        ];
        flags.extend(self.gate_type);
        flags.extend(self.gate_params);
        flags
    }

    /// Whether `flag` belongs to this transport (or is shared by both Redis transports).
    fn owns(&self, flag: &str) -> bool {
        match self.kind {
            TransportKind::SortedSet => flag.starts_with("--redis.ss."),
            TransportKind::PubSub => {
                flag.starts_with("--redis.") && !flag.starts_with("--redis.ss.")
            }
        }
    }

    /// The legacy flag behind a field of the synthesised config; the queue's own fields only
    /// when the single-queue flags made it.
    fn flag_for(&self, field: &str, single_queue: bool) -> Option<&'static str> {
        match field {
            "url" => Some("--redis.url"),
            "result_queue_name" => Some(self.result_queue_name),
            "retry_queue_name" => self.retry_queue_name,
            "poll_interval_ms" => self.poll_interval_ms,
            "batch_size" => self.batch_size,
            _ if !single_queue => None,
            "queues[0].queue_name" => Some(self.queue_name),
            "queues[0].igw_base_url" => Some(self.igw_base_url),
            "queues[0].request_path_url" => Some(self.request_path_url),
            "queues[0].inference_objective" => Some(self.inference_objective),
            "queues[0].gate_type" => self.gate_type,
            "queues[0].gate_params" => self.gate_params,
            _ => None,
        }
    }
}

/// Where the queues of the synthesised config came from, to name the right flag in errors.
pub(crate) struct Legacy {
    flags: &'static Flags,
    /// The queues-config flag the queues were read from; `None` for the single-queue flags.
    queues_flag: Option<&'static str>,
}

impl Legacy {
    /// The same error, naming the legacy flag behind the field of the synthesised config (a
    /// queue of a queues config is named by its flag and its index in the array).
    pub(crate) fn rename(&self, e: ConfigError) -> ConfigError {
        match self.flag_of(e.field()) {
            Some(name) => e.with_field(&name),
            None => e,
        }
    }

    /// How the user wrote `field` of the synthesised config (`queues[0].gate_params` →
    /// `--redis.ss.gate-params`); `field` itself when no flag stands behind it.
    pub(crate) fn name(&self, field: &str) -> String {
        self.flag_of(field).unwrap_or_else(|| field.to_owned())
    }

    /// The legacy flag (with the index into a queues config) behind `field`, if any.
    fn flag_of(&self, field: &str) -> Option<String> {
        if let Some(flag) = self.queues_flag {
            if field == "queues" {
                return Some(flag.to_owned());
            }
            if let Some(rest) = field.strip_prefix("queues[") {
                return Some(format!("{flag}: [{rest}"));
            }
        }
        self.flags
            .flag_for(field, self.queues_flag.is_none())
            .map(str::to_owned)
    }
}

/// Whether a legacy queues/topics config flag is set: Go's condition for accepting
/// `--pool-config-file` on the legacy surface (of any transport, as Go checks it).
pub(crate) fn has_queues_config(args: &RunArgs) -> bool {
    let given = |v: Option<&str>| v.is_some_and(|s| !s.is_empty());
    given(args.redis_ss_queues_config.as_ref().map(|c| c.expose()))
        || given(args.redis_ss_queues_config_file.as_deref())
        || given(args.redis_queues_config.as_ref().map(|c| c.expose()))
        || given(args.redis_queues_config_file.as_deref())
        || given(args.pubsub_topics_config_file.as_deref())
}

/// Builds the transport config the legacy flags describe, with a deprecation warning that shows
/// the equivalent `--transport-config` JSON (password redacted).
pub(crate) fn synthesise(
    args: &RunArgs,
    env: &dyn Fn(&str) -> Option<String>,
    warnings: &mut Vec<String>,
) -> Result<(TransportKind, RawSortedSet, Legacy), ConfigError> {
    let flags = selected_flags(args, warnings)?;
    warnings.extend(other_transport_warning(args, flags));
    let url = legacy_url(args, env, flags)?;
    let (queues, queues_flag) = match queues_config(args, flags, warnings)? {
        Some((flag, queues)) => (queues, Some(flag)),
        None => (vec![single_queue(args, flags)?], None),
    };
    let raw = raw_config(args, flags, url, queues);
    warnings.push(deprecation_warning(flags, &raw));
    Ok((flags.kind, raw, Legacy { flags, queues_flag }))
}

/// The flags of the transport `--message-queue-impl` names (Go's default redis-pubsub when it
/// is not set, unless sorted-set flags are).
fn selected_flags(
    args: &RunArgs,
    warnings: &mut Vec<String>,
) -> Result<&'static Flags, ConfigError> {
    match args.message_queue_impl.as_deref() {
        Some(name) if name == SORTED_SET.kind.name() => Ok(&SORTED_SET),
        Some(name) if name == PUBSUB.kind.name() => Ok(&PUBSUB),
        Some(other) => Err(ConfigError::unsupported(
            "--message-queue-impl",
            format!(
                "{other:?} is not supported; inferq supports redis-sortedset and \
                 redis-pubsub (gcp-pubsub is not supported)"
            ),
        )),
        // Go's default is redis-pubsub: a Go deployment of it that never named the transport
        // runs unchanged. Sorted-set flags that Go would then silently ignore are refused.
        None => {
            let sorted_set: Vec<&str> = args
                .legacy_flags_set()
                .into_iter()
                .filter(|f| SORTED_SET.owns(f))
                .collect();
            if !sorted_set.is_empty() {
                return Err(ConfigError::invalid(
                    "--message-queue-impl",
                    format!(
                        "not set, so Go would use redis-pubsub and ignore {}; pass \
                         --message-queue-impl=redis-sortedset to use them, or \
                         --message-queue-impl=redis-pubsub (or, better, --transport with \
                         --transport-config or --transport-config-file)",
                        sorted_set.join(", ")
                    ),
                ));
            }
            warnings.push(
                "--message-queue-impl is not set: running redis-pubsub, Go's default".to_owned(),
            );
            Ok(&PUBSUB)
        }
    }
}

/// The warning naming the legacy flags set for another of Go's transports than `flags`';
/// `None` when there are none.
fn other_transport_warning(args: &RunArgs, flags: &Flags) -> Option<String> {
    let other: Vec<&str> = args
        .legacy_flags_set()
        .into_iter()
        .filter(|f| {
            !flags.owns(f)
                && !matches!(
                    *f,
                    "--message-queue-impl" | "--redis-tracing" | "--redis.url"
                )
        })
        .collect();
    (!other.is_empty()).then(|| {
        format!(
            "ignoring {}: they configure another of Go's transports, and \
             --message-queue-impl={} is selected",
            other.join(", "),
            flags.kind.name()
        )
    })
}

/// `--redis.url`, required unless `REDIS_URL` gives one.
fn legacy_url(
    args: &RunArgs,
    env: &dyn Fn(&str) -> Option<String>,
    flags: &Flags,
) -> Result<Option<String>, ConfigError> {
    // Left unset when only REDIS_URL gives it: the loader falls back to the variable and names
    // it in errors.
    let url = args
        .redis_url
        .as_ref()
        .map(|u| u.expose().to_owned())
        .filter(|u| !u.is_empty());
    if url.is_none() && env("REDIS_URL").is_none_or(|u| u.is_empty()) {
        return Err(ConfigError::invalid(
            "--redis.url",
            format!(
                "required (or the REDIS_URL environment variable) when using {}",
                flags.kind.name()
            ),
        ));
    }
    Ok(url)
}

/// The transport config the flags of `flags`' transport describe, with these queues.
fn raw_config(
    args: &RunArgs,
    flags: &Flags,
    url: Option<String>,
    queues: Vec<RawQueue>,
) -> RawSortedSet {
    match flags.kind {
        TransportKind::SortedSet => RawSortedSet {
            url,
            result_queue_name: args.redis_ss_result_queue_name.clone(),
            poll_interval_ms: args.redis_ss_poll_interval_ms,
            batch_size: args.redis_ss_batch_size,
            enable_tracing: args.redis_tracing,
            queues: Some(queues),
            ..RawSortedSet::default()
        },
        TransportKind::PubSub => RawSortedSet {
            url,
            result_queue_name: args.redis_result_queue_name.clone(),
            retry_queue_name: args.redis_retry_queue_name.clone(),
            enable_tracing: args.redis_tracing,
            queues: Some(queues),
            ..RawSortedSet::default()
        },
    }
}

/// The deprecation warning, showing the `--transport-config` equivalent to `raw` (password
/// redacted).
fn deprecation_warning(flags: &Flags, raw: &RawSortedSet) -> String {
    let equivalent = serde_json::to_string(raw).unwrap_or_default();
    let family = match flags.kind {
        TransportKind::SortedSet => "--redis.ss.*",
        TransportKind::PubSub => "--redis.*",
    };
    format!(
        "--message-queue-impl and the --redis.url/{family} flags are deprecated; use \
         --transport={} --transport-config='{}'",
        flags.kind.name(),
        redact_in_text(&equivalent)
    )
}

/// The queues of the transport's queues-config flag (inline, which wins) or its file, with the
/// flag they came from; `None` when neither is set. Flags this makes moot are named in a
/// warning.
fn queues_config(
    args: &RunArgs,
    flags: &Flags,
    warnings: &mut Vec<String>,
) -> Result<Option<(&'static str, Vec<RawQueue>)>, ConfigError> {
    let (inline, path) = match flags.kind {
        TransportKind::SortedSet => (
            args.redis_ss_queues_config.as_ref(),
            args.redis_ss_queues_config_file.as_deref(),
        ),
        TransportKind::PubSub => (
            args.redis_queues_config.as_ref(),
            args.redis_queues_config_file.as_deref(),
        ),
    };
    let inline = inline.map(|c| c.expose()).filter(|c| !c.is_empty());
    let path = path.filter(|p| !p.is_empty());
    let (flag, text) = match (inline, path) {
        (Some(text), _) => (flags.queues_config, text.to_owned()),
        (None, Some(path)) => (
            flags.queues_config_file,
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                flag: flags.queues_config_file,
                path: path.into(),
                source,
            })?,
        ),
        (None, None) => return Ok(None),
    };
    let single = flags.single_queue();
    let mut moot: Vec<&str> = args
        .legacy_flags_set()
        .into_iter()
        .filter(|f| single.contains(f))
        .collect();
    if inline.is_some() && path.is_some() {
        moot.push(flags.queues_config_file);
    }
    if !moot.is_empty() {
        warnings.push(format!(
            "ignoring {} because {flag} is set",
            moot.join(", ")
        ));
    }
    let queues: Vec<RawQueue> = decode(&text, "", flag, &["[]"]).map_err(|e| {
        let field = e.field().to_owned();
        if field.starts_with('[') {
            e.with_field(&format!("{flag}: {field}"))
        } else {
            e
        }
    })?;
    Ok(Some((flag, queues)))
}

/// The one queue the single-queue flags describe, in pool `default`.
fn single_queue(args: &RunArgs, flags: &Flags) -> Result<RawQueue, ConfigError> {
    let queue = match flags.kind {
        TransportKind::SortedSet => {
            let gate_params = match args.redis_ss_gate_params.as_deref() {
                None | Some("") => None,
                Some(text) => Some(serde_json::from_str::<Value>(text).map_err(|e| {
                    ConfigError::invalid("--redis.ss.gate-params", format!("invalid JSON: {e}"))
                })?),
            };
            RawQueue {
                queue_name: args.redis_ss_request_queue_name.clone(),
                igw_base_url: args.redis_ss_igw_base_url.clone(),
                request_path_url: args.redis_ss_request_path_url.clone(),
                inference_objective: args.redis_ss_inference_objective.clone(),
                gate_type: args.redis_ss_gate_type.clone(),
                gate_params,
                ..RawQueue::default()
            }
        }
        TransportKind::PubSub => RawQueue {
            queue_name: args.redis_request_queue_name.clone(),
            igw_base_url: args.redis_igw_base_url.clone(),
            request_path_url: args.redis_request_path_url.clone(),
            inference_objective: args.redis_inference_objective.clone(),
            ..RawQueue::default()
        },
    };
    Ok(RawQueue {
        queue_name: Some(
            queue
                .queue_name
                .clone()
                .unwrap_or_else(|| flags.default_queue.to_owned()),
        ),
        ..queue
    })
}

#[cfg(test)]
mod tests {
    use super::super::args::tests::parse;
    use super::*;

    fn no_env(_: &str) -> Option<String> {
        None
    }

    #[test]
    fn synthesises_a_single_queue() {
        let args = parse(&[
            "--message-queue-impl=redis-sortedset",
            "--redis.url=redis://:pw@r:6379",
            "--redis.ss.igw-base-url=http://gw",
            "--redis.ss.request-queue-name=rq",
            "--redis.ss.gate-type=redis",
            r#"--redis.ss.gate-params={"address":"g:6379"}"#,
            "--redis.ss.batch-size=20",
        ])
        .unwrap();
        let mut warnings = Vec::new();
        let (_, raw, _) = synthesise(&args, &no_env, &mut warnings).unwrap();
        assert_eq!(raw.url.as_deref(), Some("redis://:pw@r:6379"));
        assert_eq!(raw.batch_size, Some(20));
        let q = &raw.queues.as_ref().unwrap()[0];
        assert_eq!(q.queue_name.as_deref(), Some("rq"));
        assert_eq!(q.igw_base_url.as_deref(), Some("http://gw"));
        assert_eq!(q.gate_type.as_deref(), Some("redis"));
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("deprecated"), "{}", warnings[0]);
        assert!(
            warnings[0].contains(r#""queue_name":"rq""#),
            "{}",
            warnings[0]
        );
        assert!(!warnings[0].contains("pw@"), "{}", warnings[0]);
    }

    #[test]
    fn refusals() {
        let text = |flags: &[&str], env: &dyn Fn(&str) -> Option<String>| {
            let args = parse(flags).unwrap();
            match synthesise(&args, env, &mut Vec::new()) {
                Ok(_) => "ok".to_owned(),
                Err(e) => e.to_string(),
            }
        };
        assert!(
            text(&["--redis.ss.igw-base-url=http://gw"], &no_env).starts_with(
                "invalid config: --message-queue-impl: not set, so Go would use redis-pubsub"
            )
        );
        assert_eq!(
            text(&["--message-queue-impl=gcp-pubsub"], &no_env),
            "invalid config: --message-queue-impl: \"gcp-pubsub\" is not supported; inferq \
             supports redis-sortedset and redis-pubsub (gcp-pubsub is not supported)"
        );
        assert_eq!(
            text(&["--message-queue-impl=redis-sortedset"], &no_env),
            "invalid config: --redis.url: required (or the REDIS_URL environment variable) when \
             using redis-sortedset"
        );
        let env = |k: &str| (k == "REDIS_URL").then(|| "redis://e".to_owned());
        assert_eq!(text(&["--message-queue-impl=redis-sortedset"], &env), "ok");
        assert!(text(
            &[
                "--message-queue-impl=redis-sortedset",
                "--redis.ss.gate-params={"
            ],
            &env
        )
        .starts_with("invalid config: --redis.ss.gate-params: invalid JSON"));
    }
}
