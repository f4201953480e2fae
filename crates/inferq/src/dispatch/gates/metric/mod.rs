//! The metric-driven gates (go-compat §6.2, §6.5): `prometheus-saturation`, `prometheus-budget`,
//! `prometheus-query` and `endpoint-scrape`. Each reads one number from a [`source`] (a
//! Prometheus instant query, a cascade of them, or a scraped `/metrics` page, behind a TTL cache
//! of `--prometheus-cache-ttl`) and turns it into a budget; `apply` only asks whether the budget
//! is above zero.
//!
//! ```text
//!   GateSpec params ──build──▶ MetricGate { source, threshold, fallback }
//!   budget(): source ──v──▶ v ≤ threshold ? 0 : min(1, v − threshold)
//!             (error, no sample, NaN, ±Inf) ──▶ fallback
//!   apply():  budget ≤ 0 ? Refuse : Continue
//! ```
//!
//! Every reading is recorded in Go's `gate_metric_*` gauges under the gate's owner (the queue or
//! pool whose gate it is, or wraps it), and the last one is kept ([`MetricGate::last_reading`]).
//!
//! `endpoint-scrape` with `admission: counted` is no budget gate: [`counted`] admits a counted
//! number of requests per reading instead.
//!
//! - [`counted`]: `endpoint-scrape`'s counted admission.
//! - [`promql`]: the PromQL text of the saturation and budget gates, on the router's current
//!   metric names first and its old ones (Go's text) second.
//! - [`source`]: HTTP reads, the cascade, the scrape arithmetic, the cache.
//! - [`text`]: the Prometheus text-format parser.

mod counted;
mod promql;
mod source;
pub use source::SetupError;
#[cfg(test)]
mod tests;
mod text;

use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;

pub(super) use self::source::scrape_series;
use self::source::{Cached, Prometheus, Scrape, Source, Target};
use super::{Decision, Gate, GateEnv, GateError, GateInput, GateOwner, Verdict};
use crate::config::gate_params::Params;
use crate::config::{GateSpec, GateType};

/// What a metric gate saw last time it computed its budget.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// The source's value, or `None` when the source was unavailable (error, no sample, NaN or
    /// infinite) and the fallback was answered.
    pub value: Option<f64>,
    /// The value at or below which the budget is zero.
    pub threshold: f64,
    /// The budget answered.
    pub budget: f64,
}

impl Reading {
    /// Whether the source answered a usable value (Go's `async_gate_metric_source_available`).
    pub fn source_available(&self) -> bool {
        self.value.is_some()
    }
}

/// A budget-only gate driven by one metric.
#[derive(Debug)]
pub struct MetricGate {
    kind: GateType,
    /// The pool the gate watches, for metric labels (none for `endpoint-scrape`, as in Go).
    pool: Option<String>,
    source: Cached,
    threshold: f64,
    /// The budget when the source is unavailable, already clamped to [0, 1].
    fallback: f64,
    last: Mutex<Option<Reading>>,
    /// Where each reading is recorded (none in tests of the gate alone).
    owner: Option<GateOwner>,
}

impl MetricGate {
    /// The gate type.
    pub fn kind(&self) -> GateType {
        self.kind
    }

    /// The pool the gate watches, when it names one.
    pub fn pool(&self) -> Option<&str> {
        self.pool.as_deref()
    }

    /// The reading behind the last budget, if a budget was computed yet.
    pub fn last_reading(&self) -> Option<Reading> {
        *self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads the source and computes the budget (see the module comment).
    pub async fn read_budget(&self) -> f64 {
        let value = match self.source.read().await {
            Ok(values) => match values.first() {
                Some(&v) if v.is_finite() => Ok(v),
                Some(&v) => Err(format!("the sample is {v}")),
                None => Err("no samples".to_owned()),
            },
            Err(e) => Err(e),
        };
        let reading = match &value {
            Ok(v) => Reading {
                value: Some(*v),
                threshold: self.threshold,
                budget: if *v <= self.threshold {
                    0.0
                } else {
                    (v - self.threshold).min(1.0)
                },
            },
            Err(_) => Reading {
                value: None,
                threshold: self.threshold,
                budget: self.fallback,
            },
        };
        let previous = self
            .last
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .replace(reading);
        if let Some(owner) = &self.owner {
            owner.metrics.record_gate_reading(
                &owner.labels,
                self.pool().unwrap_or(""),
                reading.value,
                reading.threshold,
            );
        }
        let was_available = previous.map(|r| r.source_available());
        match value {
            Err(reason) if was_available != Some(false) => tracing::warn!(
                gate = self.kind.as_str(),
                pool = self.pool(),
                fallback = self.fallback,
                "metric source unavailable, answering the fallback budget: {reason}"
            ),
            Ok(v) if was_available == Some(false) => tracing::info!(
                gate = self.kind.as_str(),
                pool = self.pool(),
                value = v,
                "metric source available again"
            ),
            _ => {}
        }
        reading.budget
    }
}

impl Gate for MetricGate {
    fn budget(&self) -> BoxFuture<'_, f64> {
        Box::pin(self.read_budget())
    }

    fn apply<'a>(&'a self, _input: GateInput<'a>) -> BoxFuture<'a, Result<Decision, GateError>> {
        Box::pin(async move {
            let verdict = if self.read_budget().await <= 0.0 {
                Verdict::Refuse
            } else {
                Verdict::Continue
            };
            Ok(Decision::verdict(verdict))
        })
    }
}

/// Builds a gate of this family (called by [`super::build`]).
pub fn build(spec: &GateSpec, env: &GateEnv) -> Result<Arc<dyn Gate>, GateError> {
    if spec.kind == GateType::EndpointScrape {
        let p = Params::new(spec.kind.as_str(), &spec.params);
        let setup = |source| GateError::Setup {
            gate: p.gate,
            source: Arc::new(source),
        };
        let parsed = scrape_params(&p, source::client().map_err(setup)?)?;
        if parsed.counted {
            log_scrape(&p, &parsed.scrape, "counted");
            let gate = counted::CountedGate::new(
                parsed.scrape,
                env.prometheus_cache_ttl,
                env.owner.clone(),
            );
            return Ok(Arc::new(gate));
        }
        let gate: Arc<dyn Gate> = metric_gate(spec.kind, scrape_parts(&p, parsed), env);
        return Ok(gate);
    }
    let gate: Arc<dyn Gate> = build_metric(spec, env)?;
    Ok(gate)
}

/// Builds a metric gate, keeping its concrete type so its readings can be exported.
pub fn build_metric(spec: &GateSpec, env: &GateEnv) -> Result<Arc<MetricGate>, GateError> {
    let gate = spec.kind.as_str();
    let p = Params::new(gate, &spec.params);
    let failed = |reason: String| GateError::Failed { gate, reason };
    let setup = |source| GateError::Setup {
        gate,
        source: Arc::new(source),
    };
    let prometheus = || match env.prometheus_url.as_deref().filter(|u| !u.is_empty()) {
        None => Err(failed(format!(
            "{gate:?} requires --prometheus-url flag to be set"
        ))),
        Some(url) => {
            let client = source::client().map_err(setup)?;
            Prometheus::new(client, url).map_err(setup)
        }
    };
    let parts = match spec.kind {
        GateType::PrometheusSaturation => saturation(&p, prometheus()?)?,
        GateType::PrometheusBudget => budget(&p, prometheus()?)?,
        GateType::PrometheusQuery => query(&p, prometheus()?)?,
        GateType::EndpointScrape => scrape(&p, source::client().map_err(setup)?)?,
        other => return Err(failed(format!("{:?} is not a metric gate", other.as_str()))),
    };
    Ok(metric_gate(spec.kind, parts, env))
}

fn metric_gate(kind: GateType, parts: Parts, env: &GateEnv) -> Arc<MetricGate> {
    Arc::new(MetricGate {
        kind,
        pool: parts.pool,
        source: Cached::new(parts.source, env.prometheus_cache_ttl),
        threshold: parts.threshold,
        fallback: parts.fallback.clamp(0.0, 1.0),
        last: Mutex::new(None),
        owner: env.owner.clone(),
    })
}

/// What a gate type's parameters resolve to.
struct Parts {
    source: Source,
    threshold: f64,
    /// Unclamped.
    fallback: f64,
    pool: Option<String>,
}

fn saturation(p: &Params, prometheus: Prometheus) -> Result<Parts, GateError> {
    let pool = p.required_string("pool")?;
    let namespace = p.string("namespace");
    // A saturation fraction: outside [0, 1] (say 80, meant as percent) the gate never closes.
    let threshold = number(
        p,
        "threshold",
        0.8,
        |v| (0.0..=1.0).contains(&v),
        "in [0, 1]",
    )?;
    // Go takes the fallback in saturation space: the default 0 means "not saturated", budget 1.
    let fallback = 1.0 - number(p, "fallback", 0.0, |_| true, "")?;
    let queries = promql::saturation(&pool, namespace.as_deref());
    for (i, query) in queries.iter().enumerate() {
        tracing::info!(gate = p.gate, %pool, source = i, query = %query.promql, threshold, "metric gate cascade query");
    }
    if fallback > 0.0 {
        tracing::warn!(
            gate = p.gate,
            %pool,
            "prometheus-saturation fails open: while Prometheus cannot answer, the budget is {} \
             (the fallback parameter is a saturation; set \"fallback\": 1 to stop dispatching \
             instead)",
            fallback.clamp(0.0, 1.0)
        );
    }
    Ok(Parts {
        source: Source::cascade(prometheus, p.gate, queries.into()),
        threshold: 1.0 - threshold,
        fallback,
        pool: Some(pool),
    })
}

fn budget(p: &Params, prometheus: Prometheus) -> Result<Parts, GateError> {
    let pool = p.required_string("pool")?;
    let namespace = p.string("namespace");
    let max_concurrency = number(p, "max_concurrency", 100.0, |v| v > 0.0, "> 0")?;
    let baseline = number(
        p,
        "baseline",
        0.05,
        |v| (0.0..1.0).contains(&v),
        "in [0, 1)",
    )?;
    let fallback = number(p, "fallback", 0.0, |_| true, "")?;
    let queries = promql::budget_cascade(&pool, namespace.as_deref(), max_concurrency);
    for (i, query) in queries.iter().enumerate() {
        tracing::info!(gate = p.gate, %pool, source = i, query = %query.promql, "metric gate cascade query");
    }
    tracing::info!(
        gate = p.gate,
        %pool,
        max_concurrency,
        baseline,
        "closes at a load per ready pod of {}",
        max_concurrency * (1.0 - baseline)
    );
    Ok(Parts {
        source: Source::cascade(prometheus, p.gate, queries.into()),
        threshold: baseline,
        fallback,
        pool: Some(pool),
    })
}

fn query(p: &Params, prometheus: Prometheus) -> Result<Parts, GateError> {
    let query = p.required_string("query")?;
    let fallback = number(p, "fallback", 0.0, |_| true, "")?;
    let pool = p.string("pool");
    tracing::info!(gate = p.gate, pool = pool.as_deref(), %query, "metric gate query");
    Ok(Parts {
        source: Source::Query { prometheus, query },
        threshold: 0.0,
        fallback,
        pool,
    })
}

fn scrape(p: &Params, client: reqwest::Client) -> Result<Parts, GateError> {
    let parsed = scrape_params(p, client)?;
    if parsed.counted {
        return Err(param(
            p,
            "admission",
            "counted admission is not a budget gate".to_owned(),
        ));
    }
    Ok(scrape_parts(p, parsed))
}

/// A budget-admission scrape gate's parts (logged).
fn scrape_parts(p: &Params, parsed: ScrapeParams) -> Parts {
    log_scrape(p, &parsed.scrape, "budget");
    Parts {
        source: Source::Scrape(parsed.scrape),
        threshold: parsed.baseline,
        fallback: parsed.fallback,
        pool: None,
    }
}

/// An `endpoint-scrape` gate's parameters.
struct ScrapeParams {
    scrape: Scrape,
    baseline: f64,
    fallback: f64,
    /// `admission: counted` (else `budget`).
    counted: bool,
}

fn scrape_params(p: &Params, client: reqwest::Client) -> Result<ScrapeParams, GateError> {
    let target = scrape_target(p)?;
    let max_count_per_pod = number(p, "max_count_per_pod", 0.0, |v| v >= 0.0, ">= 0")?;
    // Compared with 1 − saturation, which is in [0, 1]: from 1 up the gate never opens, below
    // 0 it never closes (as prometheus-budget's baseline).
    let baseline = number(p, "baseline", 0.0, |v| (0.0..1.0).contains(&v), "in [0, 1)")?;
    let fallback = number(p, "fallback", 0.0, |_| true, "")?;
    let direct_budget = direct_budget(p)?;
    let absent_value = absent_value(p)?;
    let counted = counted_admission(p)?;
    if counted {
        check_counted(p, max_count_per_pod, direct_budget, baseline, fallback)?;
    }
    let pods = pods_target(p)?;
    Ok(ScrapeParams {
        scrape: Scrape {
            client,
            target,
            max_count_per_pod,
            pods,
            absent_value,
            direct_budget,
        },
        baseline,
        fallback,
        counted,
    })
}

/// The scraped page (`url`), the metric read from it and the labels that pick its series.
fn scrape_target(p: &Params) -> Result<Target, GateError> {
    Ok(Target {
        url: http_url(p, "url")?.ok_or_else(|| param(p, "url", "required".to_owned()))?,
        metric: p.required_string("metric")?,
        labels: sorted(p.string_map("labels")?),
    })
}

/// `value_type`: whether the metric is a budget itself (`budget`) rather than a saturation.
fn direct_budget(p: &Params) -> Result<bool, GateError> {
    match p.string_or("value_type", "saturation").as_str() {
        "saturation" => Ok(false),
        "budget" => Ok(true),
        other => Err(param(
            p,
            "value_type",
            format!("must be saturation or budget, got {other:?}"),
        )),
    }
}

/// `absent_value`: the value taken when the page has no matching series, if any.
fn absent_value(p: &Params) -> Result<Option<f64>, GateError> {
    match p.float("absent_value")? {
        Some(v) if !v.is_finite() => Err(param(
            p,
            "absent_value",
            format!("must be a finite number, got {v}"),
        )),
        v => Ok(v),
    }
}

/// `admission`: whether it is `counted` (else `budget`).
fn counted_admission(p: &Params) -> Result<bool, GateError> {
    match p.string_or("admission", "budget").as_str() {
        "budget" => Ok(false),
        "counted" => Ok(true),
        other => Err(param(
            p,
            "admission",
            format!("must be budget or counted, got {other:?}"),
        )),
    }
}

/// Counted admission needs a count and its capacity, and has no budget to fall back to.
fn check_counted(
    p: &Params,
    max_count_per_pod: f64,
    direct_budget: bool,
    baseline: f64,
    fallback: f64,
) -> Result<(), GateError> {
    if max_count_per_pod <= 0.0 {
        return Err(param(
            p,
            "max_count_per_pod",
            "must be > 0 with admission counted (the capacity slots are counted against)"
                .to_owned(),
        ));
    }
    if direct_budget {
        return Err(param(
            p,
            "value_type",
            "must be saturation with admission counted (a count of used slots)".to_owned(),
        ));
    }
    for (name, value) in [("baseline", baseline), ("fallback", fallback)] {
        if value != 0.0 {
            return Err(param(
                p,
                name,
                "not taken with admission counted (size the headroom with \
                 max_count_per_pod; a failed reading admits nothing)"
                    .to_owned(),
            ));
        }
    }
    Ok(())
}

/// The ready-pod count's page and metric (`pods_url`, `pods_metric`, `pods_labels`), when both
/// are set; one without the other is warned about and ignored.
fn pods_target(p: &Params) -> Result<Option<Target>, GateError> {
    let pods_url = http_url(p, "pods_url")?;
    let pods_metric = p.string("pods_metric");
    let pods_labels = sorted(p.string_map("pods_labels")?);
    Ok(match (pods_url, pods_metric) {
        (Some(url), Some(metric)) => Some(Target {
            url,
            metric,
            labels: pods_labels,
        }),
        (None, None) => None,
        (url, _) => {
            let (set, unset) = if url.is_some() {
                ("pods_url", "pods_metric")
            } else {
                ("pods_metric", "pods_url")
            };
            tracing::warn!(
                gate = p.gate,
                "{set} is set but {unset} is not; the ready-pod count is not read and \
                 max_count_per_pod is the whole capacity"
            );
            None
        }
    })
}

fn log_scrape(p: &Params, scrape: &Scrape, admission: &str) {
    let pods = scrape.pods.as_ref();
    tracing::info!(
        gate = p.gate,
        url = %crate::config::redact_url(scrape.target.url.as_str()),
        metric = %scrape.target.metric,
        labels = ?scrape.target.labels,
        max_count_per_pod = scrape.max_count_per_pod,
        pods_url = pods.map(|t| crate::config::redact_url(t.url.as_str())),
        pods_metric = pods.map(|t| t.metric.as_str()),
        value_type = if scrape.direct_budget { "budget" } else { "saturation" },
        absent_value = scrape.absent_value,
        admission,
        "metric gate scrape"
    );
}

fn param(p: &Params, name: &str, reason: String) -> GateError {
    GateError::Param {
        gate: p.gate,
        param: name.to_owned(),
        reason,
    }
}

/// A finite number parameter that satisfies `ok` (described by `rule`).
fn number(
    p: &Params,
    name: &str,
    default: f64,
    ok: impl Fn(f64) -> bool,
    rule: &str,
) -> Result<f64, GateError> {
    let v = p.float_or(name, default)?;
    if !v.is_finite() {
        return Err(param(p, name, format!("must be a finite number, got {v}")));
    }
    if !ok(v) {
        return Err(param(p, name, format!("must be {rule}, got {v}")));
    }
    Ok(v)
}

/// An optional `http://` or `https://` URL parameter.
fn http_url(p: &Params, name: &str) -> Result<Option<reqwest::Url>, GateError> {
    let Some(raw) = p.string(name) else {
        return Ok(None);
    };
    let shown = crate::config::redact_url(&raw);
    match reqwest::Url::parse(&raw) {
        Ok(url) if matches!(url.scheme(), "http" | "https") => Ok(Some(url)),
        Ok(url) => Err(param(
            p,
            name,
            format!(
                "{shown:?} is not an http(s) URL (scheme {:?})",
                url.scheme()
            ),
        )),
        Err(e) => Err(param(p, name, format!("{shown:?} is not a URL: {e}"))),
    }
}

fn sorted(mut labels: Vec<(String, String)>) -> Vec<(String, String)> {
    labels.sort();
    labels
}
