//! Decoding and resolving the sorted-set transport config: Go's defaults, and the field each
//! validation error names.

use super::super::json::decode;
use super::*;

/// The example of go-compat §3.2, verbatim.
pub(crate) const GO_EXAMPLE: &str = r#"{"url":"redis://...","retry_queue_name":"retry-sortedset","result_queue_name":"result-list",
 "poll_interval_ms":1000,"batch_size":10,"enable_tracing":false,
 "queues":[{"id":"q1","queue_name":"request-sortedset","result_queue_name":"","worker_pool_id":"default",
            "inference_objective":"","request_path_url":"/v1/completions","igw_base_url":"http://gw:80",
            "gate_type":"redis","gate_params":{"address":"redis:6379"},"labels":{"tier":"batch"}}]}"#;

fn no_env(_: &str) -> Option<String> {
    None
}

fn load_text(text: &str) -> Result<SortedSetConfig, ConfigError> {
    let raw: RawSortedSet = decode(text, "", "--transport-config", &RAW_SORTED_SET_OBJECTS)?;
    resolve(raw, &no_env, &mut Vec::new()).map(|(c, _)| c)
}

fn err(text: &str) -> String {
    match load_text(text) {
        Ok(c) => format!("loaded {c:?}"),
        Err(e) => e.to_string(),
    }
}

/// A minimal valid config with `extra` spliced into the top level and `queue` into the queue.
fn cfg(extra: &str, queue: &str) -> String {
    format!(
        r#"{{"url":"redis://r:6379"{extra},"queues":[{{"queue_name":"q","igw_base_url":"http://gw"{queue}}}]}}"#
    )
}

#[test]
fn go_example_loads_with_go_defaults() {
    let c = load_text(GO_EXAMPLE).unwrap();
    assert_eq!(c.url.expose(), "redis://...");
    assert_eq!(c.retry_queue_name, "retry-sortedset");
    assert_eq!(c.result_queue_name, "result-list");
    assert_eq!(c.poll_interval, Duration::from_millis(1000));
    assert_eq!(c.batch_size, 10);
    assert!(!c.enable_tracing);
    assert_eq!(c.queues.len(), 1);
    let q = &c.queues[0];
    assert_eq!(q.id, "q1");
    assert_eq!(q.queue_name, "request-sortedset");
    assert_eq!(q.result_queue_name, None);
    assert_eq!(q.worker_pool_id, "default");
    assert_eq!(q.inference_objective, None);
    assert_eq!(q.request_path_url, "/v1/completions");
    assert_eq!(q.igw_base_url, "http://gw:80");
    let gate = q.gate.as_ref().map(|g| (g.kind.as_str(), g.params.clone()));
    let expected = serde_json::json!({"address": "redis:6379"});
    assert_eq!(
        gate,
        Some(("redis", expected.as_object().cloned().unwrap_or_default()))
    );
    assert_eq!(q.labels.get("tier").map(String::as_str), Some("batch"));
}

#[test]
fn defaults_when_fields_are_absent_or_zero() {
    let c = load_text(&cfg(
        r#","poll_interval_ms":0,"batch_size":0,"retry_queue_name":"""#,
        "",
    ));
    let c = match c {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    assert_eq!(c.retry_queue_name, DEFAULT_RETRY_QUEUE);
    assert_eq!(c.result_queue_name, DEFAULT_RESULT_QUEUE);
    assert_eq!(c.poll_interval, Duration::from_millis(1000));
    assert_eq!(c.batch_size, 10);
    let q = &c.queues[0];
    assert_eq!(q.id, "q");
    assert_eq!(q.worker_pool_id, "default");
    assert_eq!(q.request_path_url, "/v1/completions");
    assert_eq!(q.gate, None);
    assert!(q.labels.is_empty());
}

#[test]
fn unknown_fields_are_errors_with_their_path() {
    assert_eq!(
        err(&cfg("", r#","igw_base_ur":"http://x""#))
            .split(" (")
            .next()
            .unwrap_or(""),
        "invalid config: queues[0].igw_base_ur: unknown field"
    );
    assert!(err(&cfg(r#","poll_interval":5"#, ""))
        .starts_with("invalid config: poll_interval: unknown field"));
}

#[test]
fn redis_url_falls_back_to_env_only_when_empty() {
    let env = |k: &str| (k == "REDIS_URL").then(|| "redis://from-env:6379".to_owned());
    let with_url: RawSortedSet = decode(&cfg("", ""), "", "x", &[]).unwrap_or_default();
    let (c, _) = resolve(with_url, &env, &mut Vec::new())
        .map_err(|e| e.to_string())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.url.expose(), "redis://r:6379");

    let empty = cfg("", "").replace("redis://r:6379", "");
    let raw: RawSortedSet = decode(&empty, "", "x", &[]).unwrap_or_default();
    let (c, _) = resolve(raw, &env, &mut Vec::new())
        .map_err(|e| e.to_string())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.url.expose(), "redis://from-env:6379");

    let absent = r#"{"queues":[{"queue_name":"q","igw_base_url":"http://gw"}]}"#;
    let raw: RawSortedSet = decode(absent, "", "x", &[]).unwrap_or_default();
    let (c, _) = resolve(raw, &env, &mut Vec::new())
        .map_err(|e| e.to_string())
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.url.expose(), "redis://from-env:6379");
}

#[test]
fn validation_rules_name_their_field() {
    let no_url = r#"{"queues":[{"queue_name":"q","igw_base_url":"http://gw"}]}"#;
    assert_eq!(
        err(no_url),
        "invalid config: url: required (or set the REDIS_URL environment variable)"
    );
    let bad_scheme = cfg("", "").replace("redis://r:6379", "http://u:pw9@r:6379");
    let text = err(&bad_scheme);
    assert!(
        text.starts_with("invalid config: url: scheme must be redis://, rediss://, or unix://"),
        "{text}"
    );
    assert!(!text.contains("pw9"), "{text}");
    assert!(
        err(&cfg("", "").replace("redis://r:6379", "r:6379")).starts_with("invalid config: url: ")
    );
    assert!(
        err(&cfg("", "").replace("redis://r:6379", "redis://r:6379/x"))
            .starts_with("invalid config: url: ")
    );
    assert!(
        err(&cfg("", "").replace("redis://r:6379", "redis://r:port"))
            .starts_with("invalid config: url: cannot parse")
    );
    assert!(
        err(&cfg("", "").replace("redis://r:6379", "unix://")).starts_with("invalid config: url: ")
    );
    for ok in [
        "rediss://:pw@r:6380/2",
        "unix:///var/run/redis.sock",
        "REDIS://r",
    ] {
        let text = err(&cfg("", "").replace("redis://r:6379", ok));
        assert!(text.starts_with("loaded"), "{ok}: {text}");
    }

    assert_eq!(
        err(r#"{"url":"redis://r","queues":[]}"#),
        "invalid config: queues: at least one queue is required"
    );
    assert_eq!(
        err(r#"{"url":"redis://r"}"#),
        "invalid config: queues: at least one queue is required"
    );
    assert_eq!(
        err(r#"{"url":"redis://r","queues":[{"igw_base_url":"http://gw"}]}"#),
        "invalid config: queues[0].queue_name: required"
    );
    assert_eq!(
        err(
            r#"{"url":"redis://r","queues":[{"queue_name":"a","igw_base_url":"http://gw"},{"queue_name":"b"}]}"#
        ),
        "invalid config: queues[1].igw_base_url: required"
    );
    assert!(err(&cfg("", "").replace("http://gw", "gw:80"))
        .starts_with("invalid config: queues[0].igw_base_url: must be an http(s) URL"));
    assert!(err(&cfg("", "").replace("http://gw", "ftp://gw"))
        .starts_with("invalid config: queues[0].igw_base_url: must be an http(s) URL"));
    assert_eq!(
        err(
            r#"{"url":"redis://r","queues":[{"id":"x","queue_name":"a","igw_base_url":"http://gw"},{"id":"x","queue_name":"b","igw_base_url":"http://gw"}]}"#
        ),
        "invalid config: queues[1].id: duplicate id \"x\" (queues[0] has it too)"
    );
    assert_eq!(
        err(r#"{"url":"redis://r","queues":[{"id":"b","queue_name":"a","igw_base_url":"http://gw"},{"queue_name":"b","igw_base_url":"http://gw"}]}"#),
        "invalid config: queues[1].id: duplicate id \"b\" (queues[0] has it too; an empty id defaults to queue_name)"
    );
    assert_eq!(
        err(
            r#"{"url":"redis://r","queues":[{"id":"1","queue_name":"a","igw_base_url":"http://gw"},{"id":"2","queue_name":"a","igw_base_url":"http://gw"}]}"#
        ),
        "invalid config: queues[1].queue_name: duplicate queue name \"a\" (queues[0] has it too)"
    );
    assert_eq!(
        err(&cfg(r#","batch_size":-1"#, "")),
        "invalid config: batch_size: must be at least 1, got -1"
    );
    assert_eq!(
        err(&cfg(r#","batch_size":10001"#, "")),
        "invalid config: batch_size: must be at most 10000, got 10001"
    );
    assert_eq!(
        err(&cfg(r#","poll_interval_ms":-5"#, "")),
        "invalid config: poll_interval_ms: must be at least 1, got -5"
    );
    assert!(err(&cfg("", r#","gate_type":"reddis""#))
        .starts_with("invalid config: queues[0].gate_type: unknown gate type \"reddis\""));
    assert_eq!(
        err(&cfg("", r#","gate_type":"redis","gate_params":[1]"#)),
        "invalid config: queues[0].gate_params: must be a JSON object, got an array"
    );
    assert_eq!(
        err(&cfg(r#","retry_queue_name":"q""#, "")),
        "invalid config: retry_queue_name: \"q\" is also queues[0].queue_name; the retry set must be its own key"
    );
    assert_eq!(
        err(&cfg("", r#","result_queue_name":"q""#)),
        "invalid config: queues[0].result_queue_name: \"q\" is also queues[0].queue_name; a result list must be its own key"
    );
    assert_eq!(
        err(&cfg(r#","result_queue_name":"retry-sortedset""#, "")),
        "invalid config: result_queue_name: \"retry-sortedset\" is also retry_queue_name; a result list must be its own key"
    );
    assert_eq!(
        err(&cfg("", r#","labels":{"tier":1}"#)),
        "invalid config: queues[0].labels.tier: invalid type: integer `1`, expected a string"
    );
}

/// Before: accepted, and results went onto q's dead-letter list, or a queue was another
/// queue's retry set.
#[test]
fn keys_derived_from_a_queue_name_are_not_configured_names() {
    assert_eq!(
        err(&cfg(r#","result_queue_name":"q:dead""#, "")),
        "invalid config: result_queue_name: \"q:dead\" is a key inferq keeps for queues[0] \
         (\"q\"); give it another name"
    );
    assert_eq!(
        err(&cfg(r#","retry_queue_name":"q:parked""#, "")),
        "invalid config: retry_queue_name: \"q:parked\" is a key inferq keeps for queues[0] \
         (\"q\"); give it another name"
    );
    assert_eq!(
        err(&cfg("", r#","result_queue_name":"q:claimed""#)),
        "invalid config: queues[0].result_queue_name: \"q:claimed\" is a key inferq keeps \
         for queues[0] (\"q\"); give it another name"
    );
    assert_eq!(
        err(
            r#"{"url":"redis://r","queues":[{"queue_name":"a","igw_base_url":"http://gw"},{"queue_name":"a:dead","igw_base_url":"http://gw"}]}"#
        ),
        "invalid config: queues[1].queue_name: \"a:dead\" is a key inferq keeps for \
         queues[0] (\"a\"); give it another name"
    );
    // Names that merely start with a queue's name are fine.
    assert!(err(&cfg(r#","result_queue_name":"q:results""#, "")).starts_with("loaded"));
}

#[test]
fn url_is_redacted_in_debug() {
    let c = load_text(&cfg("", "").replace("redis://r:6379", "redis://u:hunter2@r:6379"));
    let c = match c {
        Ok(c) => c,
        Err(e) => panic!("{e}"),
    };
    let shown = format!("{c:?} {}", c.url);
    assert!(!shown.contains("hunter2"), "{shown}");
    assert!(shown.contains("redis://u:***@r:6379"), "{shown}");
    assert_eq!(c.url.expose(), "redis://u:hunter2@r:6379");
    assert!(!c.url.is_tls());
    assert!(RedisUrl("REDISS://h".into()).is_tls());
    assert!(!RedisUrl("redisé://h".into()).is_tls());
}
