//! The deprecated flag surface (go-compat §8.1): `--message-queue-impl=redis-sortedset` with
//! `--redis.url` and `--redis.ss.*` describes a single queue. Like Go's compat shim, this module
//! turns those flags into a transport config ([`RawSortedSet`]) that then goes through the normal
//! loader, and renames errors about that config back to the flag the user actually wrote.

use serde_json::Value;

use super::args::RunArgs;
use super::error::redact_in_text;
use super::transport::{RawQueue, RawSortedSet};
use super::ConfigError;

/// The only queue implementation inferq has.
const SORTED_SET: &str = "redis-sortedset";

/// Builds the transport config the legacy flags describe, with a deprecation warning that shows
/// the equivalent `--transport-config` JSON (password redacted).
pub(crate) fn synthesise(
    args: &RunArgs,
    env: &dyn Fn(&str) -> Option<String>,
    warnings: &mut Vec<String>,
) -> Result<RawSortedSet, ConfigError> {
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
    let url = args
        .redis_url
        .as_ref()
        .map(|u| u.expose().to_owned())
        .filter(|u| !u.is_empty())
        .or_else(|| env("REDIS_URL").filter(|u| !u.is_empty()))
        .ok_or_else(|| {
            ConfigError::invalid(
                "--redis.url",
                "required (or the REDIS_URL environment variable) when using redis-sortedset",
            )
        })?;
    let gate_params = match args.redis_ss_gate_params.as_deref() {
        None | Some("") => None,
        Some(text) => Some(serde_json::from_str::<Value>(text).map_err(|e| {
            ConfigError::invalid("--redis.ss.gate-params", format!("invalid JSON: {e}"))
        })?),
    };
    let raw = RawSortedSet {
        url: Some(url),
        result_queue_name: args.redis_ss_result_queue_name.clone(),
        poll_interval_ms: args.redis_ss_poll_interval_ms,
        batch_size: args.redis_ss_batch_size,
        queues: Some(vec![RawQueue {
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
        }]),
        ..RawSortedSet::default()
    };
    let equivalent = serde_json::to_string(&raw).unwrap_or_default();
    warnings.push(format!(
        "--message-queue-impl and the --redis.url/--redis.ss.* flags are deprecated; use \
         --transport=redis-sortedset --transport-config='{}'",
        redact_in_text(&equivalent)
    ));
    Ok(raw)
}

/// The legacy flag behind a field of the synthesised config, so errors name what the user typed.
pub(crate) fn flag_for(field: &str) -> Option<&'static str> {
    Some(match field {
        "url" => "--redis.url",
        "result_queue_name" => "--redis.ss.result-queue-name",
        "poll_interval_ms" => "--redis.ss.poll-interval-ms",
        "batch_size" => "--redis.ss.batch-size",
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
        let raw = synthesise(&args, &no_env, &mut warnings).unwrap();
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
