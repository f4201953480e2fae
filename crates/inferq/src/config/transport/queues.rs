//! The request queues of a transport config: each `queues[i]` with its defaults and own checks
//! ([`resolve_queue`]), then the checks across them — unique ids and names, and no key doing two
//! jobs (a request queue, the retry set, a result list, a key inferq derives from a queue name).
//!
//! Raw queues come in; typed [`QueueConfig`]s or the first [`ConfigError`] (naming its field)
//! go out.

use std::collections::HashMap;

use inferq_client::keys::QueueKeys;

use super::super::gate::parse_gate;
use super::super::ConfigError;
use super::{
    check_http_url, non_empty, QueueConfig, RawQueue, DEFAULT_POOL_ID, DEFAULT_REQUEST_PATH,
};

/// Defaults and per-queue checks for `queues[i]`.
pub(super) fn resolve_queue(
    i: usize,
    q: RawQueue,
    warnings: &mut Vec<String>,
) -> Result<QueueConfig, ConfigError> {
    let at = |field: &str| format!("queues[{i}].{field}");
    let queue_name = non_empty(q.queue_name)
        .ok_or_else(|| ConfigError::invalid(at("queue_name"), "required"))?;
    let igw_base_url = non_empty(q.igw_base_url)
        .ok_or_else(|| ConfigError::invalid(at("igw_base_url"), "required"))?;
    check_http_url(&igw_base_url)
        .map_err(|reason| ConfigError::invalid(at("igw_base_url"), reason))?;
    let inference_objective = non_empty(q.inference_objective);
    if let Some(objective) = &inference_objective {
        // Sent as a header on every request: Go's client would refuse each one at send time.
        if reqwest::header::HeaderValue::from_str(objective).is_err() {
            return Err(ConfigError::invalid(
                at("inference_objective"),
                "not a legal HTTP header value (it is sent as x-gateway-inference-objective): \
                 control characters such as a line break are not allowed",
            ));
        }
    }
    let result_ttl_seconds = match q.result_ttl_seconds {
        None => 0,
        Some(ttl) => u64::try_from(ttl).map_err(|_| {
            ConfigError::invalid(
                at("result_ttl_seconds"),
                format!("{ttl} is negative: 0 (or leaving it out) keeps results for good, a positive number of seconds sets the result list's TTL at every push"),
            )
        })?,
    };
    let gate = parse_gate(
        q.gate_type.as_deref(),
        q.gate_params.as_ref(),
        &at("gate_type"),
        &at("gate_params"),
        warnings,
    )?;
    Ok(QueueConfig {
        id: non_empty(q.id).unwrap_or_else(|| queue_name.clone()),
        result_queue_name: non_empty(q.result_queue_name),
        result_ttl_seconds,
        worker_pool_id: non_empty(q.worker_pool_id).unwrap_or_else(|| DEFAULT_POOL_ID.to_owned()),
        inference_objective,
        request_path_url: non_empty(q.request_path_url)
            .unwrap_or_else(|| DEFAULT_REQUEST_PATH.to_owned()),
        igw_base_url,
        gate,
        gate_params_field: at("gate_params"),
        labels: q.labels.unwrap_or_default(),
        allowed_result_lists: q.allowed_result_lists.unwrap_or_default(),
        queue_name,
    })
}

/// Ids unique and queue names unique.
pub(super) fn check_unique(queues: &[QueueConfig]) -> Result<(), ConfigError> {
    let mut ids: HashMap<&str, usize> = HashMap::new();
    let mut names: HashMap<&str, usize> = HashMap::new();
    for (i, q) in queues.iter().enumerate() {
        if let Some(first) = names.insert(&q.queue_name, i) {
            return Err(ConfigError::invalid(
                format!("queues[{i}].queue_name"),
                format!(
                    "duplicate queue name {:?} (queues[{first}] has it too)",
                    q.queue_name
                ),
            ));
        }
        if let Some(first) = ids.insert(&q.id, i) {
            let hint = if q.id == q.queue_name {
                "; an empty id defaults to queue_name"
            } else {
                ""
            };
            return Err(ConfigError::invalid(
                format!("queues[{i}].id"),
                format!("duplicate id {:?} (queues[{first}] has it too{hint})", q.id),
            ));
        }
    }
    Ok(())
}

/// Request queues are sorted sets, result queues lists: one key cannot be both, and the retry set
/// cannot double as a request queue. None of them may be one of the keys inferq derives from a
/// queue's name (`<queue>:dead`, `<queue>:parked`, ...).
pub(super) fn check_key_kinds(
    queues: &[QueueConfig],
    retry: &str,
    default_result: &str,
) -> Result<(), ConfigError> {
    check_derived_keys(queues, retry, default_result)?;
    let queue_with = |name: &str| queues.iter().position(|q| q.queue_name == name);
    if let Some(j) = queue_with(retry) {
        return Err(ConfigError::invalid(
            "retry_queue_name",
            format!("{retry:?} is also queues[{j}].queue_name; the retry set must be its own key"),
        ));
    }
    let mut results: Vec<(String, &str)> = vec![("result_queue_name".to_owned(), default_result)];
    for (i, q) in queues.iter().enumerate() {
        if let Some(name) = &q.result_queue_name {
            results.push((format!("queues[{i}].result_queue_name"), name));
        }
    }
    for (field, name) in results {
        if let Some(j) = queue_with(name) {
            return Err(ConfigError::invalid(
                field,
                format!(
                    "{name:?} is also queues[{j}].queue_name; a result list must be its own key"
                ),
            ));
        }
        if name == retry {
            return Err(ConfigError::invalid(
                field,
                format!("{name:?} is also retry_queue_name; a result list must be its own key"),
            ));
        }
    }
    Ok(())
}

/// No configured key is a key derived from a queue's name: results pushed onto `q:dead` would
/// mix with its dead letters, a queue named `q:parked` would be q's retry set.
fn check_derived_keys(
    queues: &[QueueConfig],
    retry: &str,
    default_result: &str,
) -> Result<(), ConfigError> {
    let mut configured: Vec<(String, &str)> = vec![
        ("retry_queue_name".to_owned(), retry),
        ("result_queue_name".to_owned(), default_result),
    ];
    for (i, q) in queues.iter().enumerate() {
        configured.push((format!("queues[{i}].queue_name"), &q.queue_name));
        if let Some(name) = &q.result_queue_name {
            configured.push((format!("queues[{i}].result_queue_name"), name));
        }
    }
    for (j, q) in queues.iter().enumerate() {
        // Either layout: a config that names no mode may still meet a cluster later.
        let plain = QueueKeys::new(&q.queue_name);
        let tagged = QueueKeys::clustered(&q.queue_name);
        for (field, name) in &configured {
            if plain.all()[1..].contains(name) || tagged.all()[1..].contains(name) {
                return Err(ConfigError::invalid(
                    field.as_str(),
                    format!(
                        "{name:?} is a key inferq keeps for queues[{j}] ({:?}); give it another \
                         name",
                        q.queue_name
                    ),
                ));
            }
        }
    }
    Ok(())
}
