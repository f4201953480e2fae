//! Worker pools (go-compat §7.5): the `--pool-config-file` JSON array
//! `[{"id","workers","gate_type","gate_params"}]`, or, without the file, one pool `default` with
//! `--concurrency` workers. Out come validated [`PoolConfig`]s; errors name `pools[i].field`.

use serde::Deserialize;
use serde_json::Value;

use super::gate::{parse_gate, GateSpec, GateType};
use super::json::decode;
use super::transport::DEFAULT_POOL_ID;
use super::ConfigError;
use crate::config::gate_params::Params;

/// One worker pool.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolConfig {
    /// Named by queues' `worker_pool_id`.
    pub id: String,
    /// How many requests the pool works on at once.
    pub workers: u32,
    /// Pool-level gate, evaluated by a worker before it sends a request.
    pub gate: Option<GateSpec>,
}

/// One pool exactly as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPool {
    id: Option<String>,
    workers: Option<i64>,
    gate_type: Option<String>,
    gate_params: Option<Value>,
}

/// The implicit pool used when no pool file is given.
pub(crate) fn default_pools(concurrency: u32) -> Vec<PoolConfig> {
    vec![PoolConfig {
        id: DEFAULT_POOL_ID.to_owned(),
        workers: concurrency,
        gate: None,
    }]
}

/// Decodes and validates the pool file's text.
pub(crate) fn parse_pools(
    text: &str,
    warnings: &mut Vec<String>,
) -> Result<Vec<PoolConfig>, ConfigError> {
    let raw: Vec<RawPool> = decode(text, "pools", "--pool-config-file", &["[]"])?;
    if raw.is_empty() {
        return Err(ConfigError::invalid(
            "pools",
            "at least one pool is required",
        ));
    }
    let mut pools: Vec<PoolConfig> = Vec::with_capacity(raw.len());
    for (i, p) in raw.into_iter().enumerate() {
        let at = |field: &str| format!("pools[{i}].{field}");
        let id =
            p.id.filter(|s| !s.is_empty())
                .ok_or_else(|| ConfigError::invalid(at("id"), "required"))?;
        if let Some(j) = pools.iter().position(|q| q.id == id) {
            return Err(ConfigError::invalid(
                at("id"),
                format!("duplicate pool id {id:?} (pools[{j}] has it too)"),
            ));
        }
        let workers = match p.workers.unwrap_or(0) {
            n if n < 1 => {
                return Err(ConfigError::invalid(
                    at("workers"),
                    format!("must be at least 1, got {n}"),
                ))
            }
            n => u32::try_from(n).map_err(|_| {
                ConfigError::invalid(
                    at("workers"),
                    format!("must be at most {}, got {n}", u32::MAX),
                )
            })?,
        };
        let gate = parse_gate(
            p.gate_type.as_deref(),
            p.gate_params.as_ref(),
            &at("gate_type"),
            &at("gate_params"),
            warnings,
        )?;
        if let Some(limit) = gate.as_ref().and_then(refusing_limit) {
            if limit < u64::from(workers) {
                warnings.push(format!(
                    "{}: local-max-concurrency in classifying mode with limit {limit} below the \
                     pool's {workers} workers: while every permit is held, each request a spare \
                     worker takes is refused, goes back to its queue and is claimed again about \
                     every 50 ms (counted anew in llm_d_async_async_request_total each time, as in \
                     Go); \"gating_mode\":\"blocking\" makes it wait for a permit instead",
                    at("gate_params")
                ));
            }
        }
        pools.push(PoolConfig { id, workers, gate });
    }
    Ok(pools)
}

/// The `limit` of a `local-max-concurrency` gate that refuses when full (classifying mode, the
/// default), read with the gate's own parameter coercion (the gate factory validates it).
fn refusing_limit(gate: &GateSpec) -> Option<u64> {
    if gate.kind != GateType::LocalMaxConcurrency {
        return None;
    }
    let p = Params::new("local-max-concurrency", &gate.params);
    if p.string_or("gating_mode", "classifying") != "classifying" {
        return None;
    }
    p.int("limit")
        .ok()
        .flatten()
        .and_then(|n| u64::try_from(n).ok())
}

#[cfg(test)]
mod tests {
    use super::super::gate::GateType;
    use super::*;

    fn err(text: &str) -> String {
        match parse_pools(text, &mut Vec::new()) {
            Ok(p) => format!("ok {p:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn parses_pools_with_gates() {
        let text = r#"[{"id":"a","workers":4},
            {"id":"b","workers":2,"gate_type":"local-max-concurrency","gate_params":{"limit":2}}]"#;
        let pools = parse_pools(text, &mut Vec::new()).unwrap();
        assert_eq!(pools.len(), 2);
        assert_eq!((pools[0].id.as_str(), pools[0].workers), ("a", 4));
        assert_eq!(pools[0].gate, None);
        assert_eq!(
            pools[1].gate.as_ref().map(|g| g.kind),
            Some(GateType::LocalMaxConcurrency)
        );
    }

    /// A classifying local-max-concurrency gate that will refuse the pool's own workers is
    /// named with what it costs; one that blocks, or that has a permit per worker, is not.
    #[test]
    fn a_refusing_gate_narrower_than_its_pool_is_warned_about() {
        let warned = |gate: &str, workers: u32| {
            let text = format!(
                r#"[{{"id":"p","workers":{workers},"gate_type":"local-max-concurrency","gate_params":{gate}}}]"#
            );
            let mut warnings = Vec::new();
            parse_pools(&text, &mut warnings).unwrap();
            warnings
        };
        let w = warned(r#"{"limit":8}"#, 16);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].starts_with("pools[0].gate_params: local-max-concurrency in classifying mode with limit 8 below the pool's 16 workers"),
            "{w:?}"
        );
        assert!(w[0].contains(r#""gating_mode":"blocking""#), "{w:?}");
        assert_eq!(
            warned(r#"{"limit":"8","gating_mode":"classifying"}"#, 16).len(),
            1
        );
        assert!(warned(r#"{"limit":8,"gating_mode":"blocking"}"#, 16).is_empty());
        assert!(warned(r#"{"limit":16}"#, 16).is_empty());
        // The gate reads 8.0 as 8, so the warning does too.
        assert_eq!(warned(r#"{"limit":8.0}"#, 16).len(), 1);
    }

    #[test]
    fn default_pool() {
        let pools = default_pools(64);
        assert_eq!(
            pools,
            vec![PoolConfig {
                id: "default".into(),
                workers: 64,
                gate: None
            }]
        );
    }

    #[test]
    fn rules_name_their_field() {
        assert_eq!(
            err("[]"),
            "invalid config: pools: at least one pool is required"
        );
        assert_eq!(
            err(r#"[{"workers":1}]"#),
            "invalid config: pools[0].id: required"
        );
        assert_eq!(
            err(r#"[{"id":"","workers":1}]"#),
            "invalid config: pools[0].id: required"
        );
        assert_eq!(
            err(r#"[{"id":"a","workers":1},{"id":"a","workers":2}]"#),
            "invalid config: pools[1].id: duplicate pool id \"a\" (pools[0] has it too)"
        );
        assert_eq!(
            err(r#"[{"id":"a"}]"#),
            "invalid config: pools[0].workers: must be at least 1, got 0"
        );
        assert_eq!(
            err(r#"[{"id":"a","workers":-2}]"#),
            "invalid config: pools[0].workers: must be at least 1, got -2"
        );
        assert!(err(r#"[{"id":"a","workers":1,"gate":"x"}]"#)
            .starts_with("invalid config: pools[0].gate: unknown field"));
        assert!(err(r#"[{"id":"a","workers":1,"gate_type":"nope"}]"#)
            .starts_with("invalid config: pools[0].gate_type: unknown gate type \"nope\""));
        assert!(err(r#"{"id":"a"}"#).starts_with("invalid config: pools: invalid type: map"));
        assert!(err("[").starts_with("invalid config: --pool-config-file: invalid JSON"));
    }
}
