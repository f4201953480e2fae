//! Gates made of other gates. The inner gates are built by the general factory
//! ([`crate::dispatch::gates::build`]), so they may be of any type, metric gates included.
//!
//! - `composite` (`gates`: a list of `{gate_type, gate_params}`): budget is the smallest inner
//!   budget; apply runs the inner gates in order and admits only if all admit. A classification
//!   one inner gate makes is visible to the next ones (as the `classification` label). On the
//!   first error or non-`Continue` the reservations taken so far are given back, so a chain
//!   reserves all or nothing.
//! - `wait-on-refuse` (`gate`): the inner gate, with `Refuse` turned into `Wait`.
//! - `tier-priority-admission` (`saturation_gate`, `saturation_gate_params`, `tier_label`): when
//!   the inner gate admits, so does this one; when it refuses (the pool is saturated), requests
//!   classified `reserved` wait, `interactive` ones classified `overflow` are dropped with a 429
//!   result, and the rest are refused.

use std::borrow::Cow;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::{Map, Value};

use super::{CLASSIFICATION, OVERFLOW, RESERVED};
use crate::config::gate_params::{ParamError, Params};
use crate::config::{GateSpec, GateType};
use crate::dispatch::gates::{Decision, Gate, GateEnv, GateError, GateInput, Verdict};
use inferq_client::wire::ResultMessage;

/// The payload of `tier-priority-admission`'s drop result, byte for byte as Go writes it.
pub(super) const TOO_MANY_REQUESTS: &str = r#"{"error": "Too Many Requests", "code": 429}"#;

/// Builds a `composite` gate.
pub(super) fn composite(p: Params<'_>, env: &GateEnv) -> Result<Arc<dyn Gate>, GateError> {
    let list = p
        .array("gates")?
        .ok_or_else(|| param_error(p.gate, "gates", "required".to_owned()))?;
    let gates = list
        .iter()
        .enumerate()
        .map(|(i, entry)| inner(p.gate, &format!("gates[{i}]"), entry, env))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Arc::new(Composite { gates }))
}

/// Builds a `wait-on-refuse` gate.
pub(super) fn wait_on_refuse(p: Params<'_>, env: &GateEnv) -> Result<Arc<dyn Gate>, GateError> {
    let entry = p
        .object("gate")?
        .ok_or_else(|| param_error(p.gate, "gate", "required".to_owned()))?;
    Ok(Arc::new(WaitOnRefuse {
        inner: inner(p.gate, "gate", &Value::Object(entry), env)?,
    }))
}

/// Builds a `tier-priority-admission` gate.
pub(super) fn tier_priority_admission(
    p: Params<'_>,
    env: &GateEnv,
) -> Result<Arc<dyn Gate>, GateError> {
    let kind = p.required_string("saturation_gate")?;
    let kind = gate_type(p.gate, "saturation_gate", &kind)?;
    let params = p.object("saturation_gate_params")?.unwrap_or_default();
    let inner = crate::dispatch::gates::build(&GateSpec { kind, params }, env)
        .map_err(|e| param_error(p.gate, "saturation_gate", e.to_string()))?;
    Ok(Arc::new(TierAdmission {
        inner,
        tier_label: p.string_or("tier_label", "tier"),
    }))
}

fn param_error(gate: &'static str, param: &str, reason: String) -> GateError {
    GateError::Param {
        gate,
        param: param.to_owned(),
        reason,
    }
}

/// A gate type by name. Unlike Go, which quietly built an always-open gate for a misspelt inner
/// type, an unknown name is an error; an empty one is `constant` (as an empty top-level type
/// means no gate).
fn gate_type(gate: &'static str, param: &str, name: &str) -> Result<GateType, GateError> {
    if name.is_empty() {
        return Ok(GateType::Constant);
    }
    GateType::from_name(name).ok_or_else(|| {
        let known: Vec<&str> = GateType::ALL.iter().map(|(n, _)| *n).collect();
        param_error(
            gate,
            param,
            format!("unknown gate type {name:?} (known: {})", known.join(", ")),
        )
    })
}

/// Builds an inner gate from `{gate_type, gate_params}` (an object, or a JSON string of one;
/// `gate_params` likewise). Errors name the outer gate and where in its parameters it went wrong.
fn inner(
    gate: &'static str,
    at: &str,
    entry: &Value,
    env: &GateEnv,
) -> Result<Arc<dyn Gate>, GateError> {
    let entry: Map<String, Value> = match entry {
        Value::Object(m) => m.clone(),
        Value::String(s) => match serde_json::from_str(s) {
            Ok(Value::Object(m)) => m,
            _ => return Err(param_error(gate, at, "not a JSON object".to_owned())),
        },
        other => return Err(param_error(gate, at, format!("not a JSON object: {other}"))),
    };
    if let Some(unknown) = entry
        .keys()
        .find(|k| !matches!(k.as_str(), "gate_type" | "gate_params"))
    {
        return Err(param_error(
            gate,
            &format!("{at}.{unknown}"),
            "unknown field (known: gate_type, gate_params)".to_owned(),
        ));
    }
    // The entry's own fields, read with the same coercion as top-level parameters; errors are
    // renamed to their place in the outer gate's parameters.
    let fields = Params::new(gate, &entry);
    let rename = |e: ParamError| param_error(gate, &format!("{at}.{}", e.param), e.reason);
    let kind = fields.string("gate_type").unwrap_or_default();
    let kind = gate_type(gate, &format!("{at}.gate_type"), &kind)?;
    let params = fields
        .object("gate_params")
        .map_err(rename)?
        .unwrap_or_default();
    crate::dispatch::gates::build(&GateSpec { kind, params }, env)
        .map_err(|e| param_error(gate, at, e.to_string()))
}

/// The smallest of the gates' budgets (1.0 for none), read concurrently.
async fn min_budget(gates: &[Arc<dyn Gate>]) -> f64 {
    futures::future::join_all(gates.iter().map(|g| g.budget()))
        .await
        .into_iter()
        .fold(1.0, f64::min)
}

struct Composite {
    gates: Vec<Arc<dyn Gate>>,
}

impl Gate for Composite {
    fn budget(&self) -> BoxFuture<'_, f64> {
        Box::pin(min_budget(&self.gates))
    }

    fn apply<'a>(&'a self, input: GateInput<'a>) -> BoxFuture<'a, Result<Decision, GateError>> {
        Box::pin(async move {
            let mut labels = Cow::Borrowed(input.labels);
            let mut classification: Option<String> = None;
            let mut preempt = None;
            let mut held = Vec::new();
            for gate in &self.gates {
                let step = GateInput {
                    metadata: input.metadata,
                    labels: &labels,
                };
                let decision = match gate.apply(step).await {
                    Ok(decision) => decision,
                    Err(e) => {
                        Decision::release_all(held).await;
                        return Err(e);
                    }
                };
                held.extend(decision.releases);
                preempt = preempt.or(decision.preempt);
                if let Some(c) = decision.classification {
                    labels.to_mut().insert(CLASSIFICATION.to_owned(), c.clone());
                    classification = Some(c);
                }
                if !matches!(decision.verdict, Verdict::Continue) {
                    Decision::release_all(held).await;
                    return Ok(Decision {
                        verdict: decision.verdict,
                        classification,
                        releases: Vec::new(),
                        preempt: None,
                    });
                }
            }
            Ok(Decision {
                verdict: Verdict::Continue,
                classification,
                releases: held,
                preempt,
            })
        })
    }
}

struct WaitOnRefuse {
    inner: Arc<dyn Gate>,
}

impl Gate for WaitOnRefuse {
    fn budget(&self) -> BoxFuture<'_, f64> {
        self.inner.budget()
    }

    fn apply<'a>(&'a self, input: GateInput<'a>) -> BoxFuture<'a, Result<Decision, GateError>> {
        Box::pin(async move {
            let mut decision = self.inner.apply(input).await?;
            if matches!(decision.verdict, Verdict::Refuse) {
                decision.verdict = Verdict::Wait;
            }
            Ok(decision)
        })
    }
}

struct TierAdmission {
    /// Refuses when the pool is saturated.
    inner: Arc<dyn Gate>,
    /// The label holding the request's tier.
    tier_label: String,
}

impl Gate for TierAdmission {
    fn budget(&self) -> BoxFuture<'_, f64> {
        self.inner.budget()
    }

    fn apply<'a>(&'a self, input: GateInput<'a>) -> BoxFuture<'a, Result<Decision, GateError>> {
        Box::pin(async move {
            let mut decision = self.inner.apply(input).await?;
            if !matches!(decision.verdict, Verdict::Refuse) {
                decision.verdict = Verdict::Continue;
                return Ok(decision);
            }
            let classification = decision
                .classification
                .as_deref()
                .or_else(|| input.labels.get(CLASSIFICATION).map(String::as_str));
            let interactive =
                input.labels.get(&self.tier_label).map(String::as_str) == Some("interactive");
            decision.verdict = match classification {
                Some(RESERVED) => Verdict::Wait,
                Some(OVERFLOW) if interactive => Verdict::Drop(Some(too_many_requests())),
                _ => Verdict::Refuse,
            };
            Ok(decision)
        })
    }
}

/// The drop result Go sends an interactive overflow request: no status code, no error code.
/// Its `id` is left empty; whoever finishes the request fills it in.
fn too_many_requests() -> ResultMessage {
    ResultMessage {
        id: String::new(),
        request_token: String::new(),
        status_code: 0,
        payload: TOO_MANY_REQUESTS.to_owned(),
        error_code: String::new(),
        error_message: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::testing::*;
    use super::*;

    /// A one-slot local gate as JSON, to fill and saturate.
    fn one_slot() -> Value {
        json!({"gate_type": "local-max-concurrency", "gate_params": {"limit": 1}})
    }

    #[tokio::test]
    async fn composite_is_all_or_nothing() {
        let g = gate(
            "composite",
            json!({"gates": [
                {"gate_type": "local-max-concurrency", "gate_params": {"limit": 2}},
                {"gate_type": "local-max-concurrency", "gate_params": "{\"limit\": 1}"},
            ]}),
        )
        .unwrap();
        assert_eq!(g.budget().await, 1.0);
        let first = apply(g.as_ref(), &[], &[]).await;
        assert_eq!(name(&first.verdict), "continue");
        assert_eq!(first.releases.len(), 2);
        assert_eq!(g.budget().await, 0.0, "min of 0.5 and 0");
        // The second gate refuses: the first gate's slot must be given back at once.
        let second = apply(g.as_ref(), &[], &[]).await;
        assert_eq!(name(&second.verdict), "refuse");
        assert!(second.releases.is_empty());
        Decision::release_all(first.releases).await;
        assert_eq!(g.budget().await, 1.0, "no slot leaked by the refusal");

        let empty = gate("composite", json!({"gates": "[]"})).unwrap();
        assert_eq!(empty.budget().await, 1.0);
        assert_eq!(
            name(&apply(empty.as_ref(), &[], &[]).await.verdict),
            "continue"
        );
    }

    #[tokio::test]
    async fn composite_passes_classification_on() {
        // A saturated admission gate after a gate that classified: the label reaches it.
        let g = gate(
            "composite",
            json!({"gates": [
                {"gate_type": "constant"},
                {"gate_type": "tier-priority-admission",
                 "gate_params": {"saturation_gate": "local-max-concurrency",
                                 "saturation_gate_params": {"limit": 1}}},
            ]}),
        )
        .unwrap();
        let hold = apply(g.as_ref(), &[], &[]).await;
        let d = apply(g.as_ref(), &[], &[("classification", "reserved")]).await;
        assert_eq!(name(&d.verdict), "wait");
        drop(hold);
    }

    #[tokio::test]
    async fn quota_classification_drives_admission() {
        let server = inferq_testkit::RedisServer::start().unwrap();
        let quota = json!({"gate_type": "redis-quota", "gate_params": {
            "address": format!("127.0.0.1:{}", server.port()),
            "mode": "concurrency", "limit": 1, "gating_mode": "classifying"}});
        let admission = json!({"gate_type": "tier-priority-admission", "gate_params": {
            "saturation_gate": "local-max-concurrency", "saturation_gate_params": {"limit": 1}}});
        let g = gate("composite", json!({"gates": [quota, admission]})).unwrap();
        let interactive = [("tier", "interactive")];

        let a = apply(g.as_ref(), &[("userid", "alice")], &interactive).await;
        assert_eq!(name(&a.verdict), "continue");
        assert_eq!(a.classification.as_deref(), Some("reserved"));
        assert_eq!(a.releases.len(), 2, "quota slot and local slot");

        let b = apply(g.as_ref(), &[("userid", "alice")], &interactive).await;
        assert_eq!(name(&b.verdict), "drop", "overflow, saturated, interactive");
        assert_eq!(b.classification.as_deref(), Some("overflow"));

        let c = apply(g.as_ref(), &[("userid", "bob")], &[("tier", "batch")]).await;
        assert_eq!(name(&c.verdict), "wait", "reserved but saturated");
        assert!(c.releases.is_empty());
        let mut con = server.connection().await.unwrap();
        let bob: i64 = redis::AsyncCommands::get(&mut con, "quota:userid:bob")
            .await
            .unwrap();
        assert_eq!(
            bob, 0,
            "bob's quota slot given back when admission said wait"
        );

        Decision::release_all(a.releases).await;
        let alice: i64 = redis::AsyncCommands::get(&mut con, "quota:userid:alice")
            .await
            .unwrap();
        assert_eq!(alice, 0);
    }

    #[tokio::test]
    async fn wait_on_refuse() {
        let g = gate("wait-on-refuse", json!({"gate": one_slot().to_string()})).unwrap();
        let hold = apply(g.as_ref(), &[], &[]).await;
        assert_eq!(name(&hold.verdict), "continue");
        assert_eq!(g.budget().await, 0.0);
        assert_eq!(name(&apply(g.as_ref(), &[], &[]).await.verdict), "wait");
        drop(hold);
        assert_eq!(name(&apply(g.as_ref(), &[], &[]).await.verdict), "continue");
    }

    #[tokio::test]
    async fn tier_priority_admission_verdicts() {
        let g = gate(
            "tier-priority-admission",
            json!({"saturation_gate": "local-max-concurrency",
                   "saturation_gate_params": "{\"limit\": 1}", "tier_label": "lane"}),
        )
        .unwrap();
        let hold = apply(g.as_ref(), &[], &[("classification", "overflow")]).await;
        assert_eq!(name(&hold.verdict), "continue", "not saturated: admitted");
        assert_eq!(hold.releases.len(), 1, "inner reservation kept");

        let cases = [
            ("reserved", "interactive", "wait"),
            ("reserved", "batch", "wait"),
            ("overflow", "interactive", "drop"),
            ("overflow", "batch", "refuse"),
            ("", "interactive", "refuse"),
        ];
        for (class, tier, want) in cases {
            let mut labels = vec![("lane", tier)];
            if !class.is_empty() {
                labels.push(("classification", class));
            }
            let d = apply(g.as_ref(), &[], &labels).await;
            assert_eq!(name(&d.verdict), want, "{class}/{tier}");
            if let Verdict::Drop(result) = d.verdict {
                let json = serde_json::to_string(&result).unwrap();
                assert_eq!(
                    json,
                    r#"{"id":"","payload":"{\"error\": \"Too Many Requests\", \"code\": 429}"}"#
                );
            }
        }
        // The tier is read from `tier_label`, not `tier`.
        let d = apply(
            g.as_ref(),
            &[],
            &[("tier", "interactive"), ("classification", "overflow")],
        )
        .await;
        assert_eq!(name(&d.verdict), "refuse");
        drop(hold);
    }

    /// A misspelt field of an inner gate entry, or of its parameters, is refused (before: it
    /// was ignored, so `gate_parms` built an always-open inner gate).
    #[test]
    fn unknown_inner_fields_and_parameters_are_refused() {
        assert_eq!(
            build_error(
                "composite",
                json!({"gates": [{"gate_type": "local-max-concurrency", "gate_parms": {"limit": 1}}]})
            ),
            "gate composite: parameter gates[0].gate_parms: unknown field (known: gate_type, \
             gate_params)"
        );
        assert_eq!(
            build_error(
                "wait-on-refuse",
                json!({"gate": {"gate_type": "local-max-concurrency", "gate_params": {"limit": 1, "limt": 2}}})
            ),
            "gate wait-on-refuse: parameter gate: gate local-max-concurrency: parameter limt: \
             unknown parameter (known: limit, gating_mode)"
        );
        assert_eq!(
            build_error(
                "tier-priority-admission",
                json!({"saturation_gate": "constant", "saturation_gate_params": "{\"x\":1}"})
            ),
            "gate tier-priority-admission: parameter saturation_gate: gate constant: parameter x: \
             unknown parameter (this gate takes none)"
        );
    }

    #[test]
    fn parameter_errors() {
        assert_eq!(
            build_error("composite", json!({})),
            "gate composite: parameter gates: required"
        );
        assert_eq!(
            build_error("composite", json!({"gates": "{"})),
            "gate composite: parameter gates: not a JSON array"
        );
        assert!(build_error(
            "composite",
            json!({"gates": [{"gate_type": "redis-qouta"}]})
        )
        .starts_with(
            "gate composite: parameter gates[0].gate_type: unknown gate type \"redis-qouta\""
        ));
        assert_eq!(
            build_error(
                "composite",
                json!({"gates": [{"gate_type": "constant"}, 3]})
            ),
            "gate composite: parameter gates[1]: not a JSON object: 3"
        );
        assert_eq!(
            build_error(
                "composite",
                json!({"gates": [{"gate_type": "constant", "gate_params": "x"}]})
            ),
            "gate composite: parameter gates[0].gate_params: not a JSON object"
        );
        assert_eq!(
            build_error(
                "composite",
                json!({"gates": [{"gate_type": "local-max-concurrency"}]})
            ),
            "gate composite: parameter gates[0]: gate local-max-concurrency: parameter limit: required"
        );
        assert_eq!(
            build_error("wait-on-refuse", json!({})),
            "gate wait-on-refuse: parameter gate: required"
        );
        assert_eq!(
            build_error("tier-priority-admission", json!({})),
            "gate tier-priority-admission: parameter saturation_gate: required"
        );
        assert!(build_error(
            "tier-priority-admission",
            json!({"saturation_gate": "nope"})
        )
        .starts_with("gate tier-priority-admission: parameter saturation_gate: unknown"));
        assert_eq!(
            build_error(
                "tier-priority-admission",
                json!({"saturation_gate": "redis"})
            ),
            "gate tier-priority-admission: parameter saturation_gate: gate redis: parameter address: required"
        );
    }
}
