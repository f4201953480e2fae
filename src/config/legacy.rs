//! The deprecated flag surface (go-compat §8.1): `--message-queue-impl=redis-sortedset` with
//! `--redis.url` and `--redis.ss.*` describes the queues, either one queue named by the
//! single-queue flags or the JSON array of `--redis.ss.queues-config` (inline, wins) or
//! `--redis.ss.queues-config-file`. Like Go's compat shim, this module turns those flags into a
//! transport config ([`RawSortedSet`]) that then goes through the normal loader, and
//! [`Legacy::rename`] renames errors about that config back to the flag the user actually wrote.
//!
//! The flags of Go's other transports (`--redis.*` for redis-pubsub, `--pubsub.*`) parse; they
//! are refused with the transport itself when it is selected, and ignored with a warning when
//! it is not.

use serde_json::Value;

use super::args::RunArgs;
use super::error::redact_in_text;
use super::json::decode;
use super::transport::{RawQueue, RawSortedSet};
use super::ConfigError;

/// The only queue implementation inferq has.
const SORTED_SET: &str = "redis-sortedset";

/// The single-queue flags, which a queues config replaces.
const SINGLE_QUEUE_FLAGS: [&str; 6] = [
    "--redis.ss.igw-base-url",
    "--redis.ss.request-path-url",
    "--redis.ss.inference-objective",
    "--redis.ss.request-queue-name",
    "--redis.ss.gate-type",
    "--redis.ss.gate-params",
];

/// Where the queues of the synthesised config came from, to name the right flag in errors.
pub(crate) struct Legacy {
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
        flag_for(field, self.queues_flag.is_none()).map(str::to_owned)
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
) -> Result<(RawSortedSet, Legacy), ConfigError> {
    match args.message_queue_impl.as_deref() {
        Some(SORTED_SET) => {}
        Some(other) => {
            return Err(ConfigError::unsupported(
                "--message-queue-impl",
                format!("{other:?} is not supported; inferq supports only {SORTED_SET}"),
            ))
        }
        None => {
            return Err(ConfigError::invalid(
                "--message-queue-impl",
                "not set, so Go would use redis-pubsub, which inferq does not support; pass \
                 --transport=redis-sortedset with --transport-config or --transport-config-file \
                 (or the deprecated --message-queue-impl=redis-sortedset)",
            ))
        }
    }
    let other = args.other_transport_flags_set();
    if !other.is_empty() {
        warnings.push(format!(
            "ignoring {}: they configure Go's redis-pubsub or gcp-pubsub transport, and \
             --message-queue-impl=redis-sortedset is selected",
            other.join(", ")
        ));
    }
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
            "required (or the REDIS_URL environment variable) when using redis-sortedset",
        ));
    }
    let (queues, queues_flag) = match queues_config(args, warnings)? {
        Some((flag, queues)) => (queues, Some(flag)),
        None => (vec![single_queue(args)?], None),
    };
    let raw = RawSortedSet {
        url,
        result_queue_name: args.redis_ss_result_queue_name.clone(),
        poll_interval_ms: args.redis_ss_poll_interval_ms,
        batch_size: args.redis_ss_batch_size,
        enable_tracing: args.redis_tracing,
        queues: Some(queues),
        ..RawSortedSet::default()
    };
    let equivalent = serde_json::to_string(&raw).unwrap_or_default();
    warnings.push(format!(
        "--message-queue-impl and the --redis.url/--redis.ss.* flags are deprecated; use \
         --transport=redis-sortedset --transport-config='{}'",
        redact_in_text(&equivalent)
    ));
    Ok((raw, Legacy { queues_flag }))
}

/// The queues of `--redis.ss.queues-config` (which wins) or `--redis.ss.queues-config-file`,
/// with the flag they came from; `None` when neither is set. Flags this makes moot are named in
/// a warning.
fn queues_config(
    args: &RunArgs,
    warnings: &mut Vec<String>,
) -> Result<Option<(&'static str, Vec<RawQueue>)>, ConfigError> {
    let inline = args
        .redis_ss_queues_config
        .as_ref()
        .map(|c| c.expose())
        .filter(|c| !c.is_empty());
    let path = args
        .redis_ss_queues_config_file
        .as_deref()
        .filter(|p| !p.is_empty());
    let (flag, text) = match (inline, path) {
        (Some(text), _) => ("--redis.ss.queues-config", text.to_owned()),
        (None, Some(path)) => (
            "--redis.ss.queues-config-file",
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                flag: "--redis.ss.queues-config-file",
                path: path.into(),
                source,
            })?,
        ),
        (None, None) => return Ok(None),
    };
    let mut moot: Vec<&str> = args
        .sorted_set_legacy_flags_set()
        .into_iter()
        .filter(|f| SINGLE_QUEUE_FLAGS.contains(f))
        .collect();
    if inline.is_some() && path.is_some() {
        moot.push("--redis.ss.queues-config-file");
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

/// The one queue the single-queue `--redis.ss.*` flags describe, in pool `default`.
fn single_queue(args: &RunArgs) -> Result<RawQueue, ConfigError> {
    let gate_params = match args.redis_ss_gate_params.as_deref() {
        None | Some("") => None,
        Some(text) => Some(serde_json::from_str::<Value>(text).map_err(|e| {
            ConfigError::invalid("--redis.ss.gate-params", format!("invalid JSON: {e}"))
        })?),
    };
    Ok(RawQueue {
        queue_name: Some(
            args.redis_ss_request_queue_name
                .clone()
                .unwrap_or_else(|| "request-sortedset".to_owned()),
        ),
        igw_base_url: args.redis_ss_igw_base_url.clone(),
        request_path_url: args.redis_ss_request_path_url.clone(),
        inference_objective: args.redis_ss_inference_objective.clone(),
        gate_type: args.redis_ss_gate_type.clone(),
        gate_params,
        ..RawQueue::default()
    })
}

/// The legacy flag behind a field of the synthesised config; the queue's own fields only when
/// the single-queue flags made it.
fn flag_for(field: &str, single_queue: bool) -> Option<&'static str> {
    Some(match field {
        "url" => "--redis.url",
        "result_queue_name" => "--redis.ss.result-queue-name",
        "poll_interval_ms" => "--redis.ss.poll-interval-ms",
        "batch_size" => "--redis.ss.batch-size",
        _ if !single_queue => return None,
        "queues[0].queue_name" => "--redis.ss.request-queue-name",
        "queues[0].igw_base_url" => "--redis.ss.igw-base-url",
        "queues[0].request_path_url" => "--redis.ss.request-path-url",
        "queues[0].inference_objective" => "--redis.ss.inference-objective",
        "queues[0].gate_type" => "--redis.ss.gate-type",
        "queues[0].gate_params" => "--redis.ss.gate-params",
        _ => return None,
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
        let (raw, _) = synthesise(&args, &no_env, &mut warnings).unwrap();
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
             supports only redis-sortedset"
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
