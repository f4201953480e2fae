//! The PromQL text the `prometheus-saturation` and `prometheus-budget` gates send. Pool name,
//! namespace and concurrency enter; queries leave, each with the metric names it reads (for the
//! log line of a gate that finds none of them).
//!
//! The llm-d router (its EPP) renamed its metrics to the `llm_d_epp_` prefix and stopped emitting
//! the old names, so every query comes twice: on the current names first, then on the old ones
//! (the Go processor's text, go-compat §6.5), which an older router still exports. The first
//! with a series wins. Label matchers are sorted by name, values quoted like Go's
//! `strconv.Quote`, the concurrency rendered like Go's `%g`.

/// The router's metric names this file queries: the current ones, confirmed in the llm-d
/// router's metric catalogue (`docs/metrics.md` of llm-d/llm-d-router, whose deprecated-series
/// table maps each old `inference_extension_*` name to its `llm_d_epp_*` one), and the old ones.
/// The pool metrics were renamed with "pod" become "endpoint" (`inference_pool_ready_pods` →
/// `llm_d_epp_ready_endpoints`), not by the plain prefix swap; their `name` label stayed.
pub(super) mod names {
    /// Pool saturation, labels `inference_pool` and `stage` (`prefill`, `decode`, and
    /// `effective`, the larger of the two); 1.0 is the router's set point.
    pub(crate) const POOL_SATURATION: &str = "llm_d_epp_flow_control_pool_saturation";
    pub(crate) const OLD_POOL_SATURATION: &str = "inference_extension_flow_control_pool_saturation";
    /// Requests held by the router's flow control, per router replica (label `inference_pool`).
    pub(crate) const QUEUE_SIZE: &str = "llm_d_epp_flow_control_queue_size";
    pub(crate) const OLD_QUEUE_SIZE: &str = "inference_extension_flow_control_queue_size";
    /// Ready endpoints of the pool, as each router replica sees them (label `name`).
    pub(crate) const READY_ENDPOINTS: &str = "llm_d_epp_ready_endpoints";
    pub(crate) const OLD_READY_PODS: &str = "inference_pool_ready_pods";
    /// Each endpoint's queue depth (labels `name`, `model_server_endpoint`).
    pub(crate) const PER_ENDPOINT_QUEUE_SIZE: &str = "llm_d_epp_per_endpoint_queue_size";
    pub(crate) const OLD_PER_POD_QUEUE_SIZE: &str = "inference_pool_per_pod_queue_size";
    /// vLLM's running requests (not the router's; never renamed).
    pub(crate) const VLLM_RUNNING: &str = "vllm:num_requests_running";
}

/// One PromQL query and the metric names it reads.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Query {
    pub promql: String,
    pub metrics: [&'static str; 2],
}

/// The spare capacity `1 − saturation`: on the current name the largest of its series (the
/// `effective` stage is the largest of the stages; with several router replicas, the most
/// saturated view), then Go's query on the old name.
pub(super) fn saturation(pool: &str, namespace: Option<&str>) -> [Query; 2] {
    let by_pool = matchers("inference_pool", pool, namespace);
    [
        Query {
            promql: format!("1 - max({})", selector(names::POOL_SATURATION, &by_pool)),
            metrics: [names::POOL_SATURATION, names::POOL_SATURATION],
        },
        Query {
            promql: format!("1 - {}", selector(names::OLD_POOL_SATURATION, &by_pool)),
            metrics: [names::OLD_POOL_SATURATION, names::OLD_POOL_SATURATION],
        },
    ]
}

/// The `prometheus-budget` cascade, most precise first, each on the current names then the old
/// ones: the flow-control queue against ready endpoints, the per-endpoint queue average, then
/// running vLLM requests against ready endpoints. Each yields `1 − load / capacity`. Queue sizes
/// and ready-endpoint counts are summed over every series, so several router replicas scraped
/// by one Prometheus add up instead of failing the `on()` match (as Go's #489).
pub(super) fn budget_cascade(
    pool: &str,
    namespace: Option<&str>,
    max_concurrency: f64,
) -> [Query; 6] {
    let mc = go_g(max_concurrency);
    let by_pool = matchers("inference_pool", pool, namespace);
    let by_name = matchers("name", pool, namespace);
    let against_ready = |load: &'static str, ready: &'static str| Query {
        promql: format!(
            "1 - (sum({}) / on() (sum({}) * {mc}))",
            selector(load, &by_pool),
            selector(ready, &by_name)
        ),
        metrics: [load, ready],
    };
    let per_endpoint = |queue: &'static str| Query {
        promql: format!("1 - (avg by(name)({}) / {mc})", selector(queue, &by_name)),
        metrics: [queue, queue],
    };
    [
        against_ready(names::QUEUE_SIZE, names::READY_ENDPOINTS),
        against_ready(names::OLD_QUEUE_SIZE, names::OLD_READY_PODS),
        per_endpoint(names::PER_ENDPOINT_QUEUE_SIZE),
        per_endpoint(names::OLD_PER_POD_QUEUE_SIZE),
        against_ready(names::VLLM_RUNNING, names::READY_ENDPOINTS),
        against_ready(names::VLLM_RUNNING, names::OLD_READY_PODS),
    ]
}

/// The pool matcher under `pool_label`, plus `namespace` when given.
fn matchers<'a>(
    pool_label: &'a str,
    pool: &'a str,
    namespace: Option<&'a str>,
) -> Vec<(&'a str, &'a str)> {
    let mut labels = vec![(pool_label, pool)];
    if let Some(ns) = namespace {
        labels.push(("namespace", ns));
    }
    labels
}

/// `metric{a="x",b="y"}` with the matchers sorted by label name; the bare name without matchers.
fn selector(metric: &str, labels: &[(&str, &str)]) -> String {
    if labels.is_empty() {
        return metric.to_owned();
    }
    let mut sorted = labels.to_vec();
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    let parts: Vec<String> = sorted
        .iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect();
    format!("{metric}{{{}}}", parts.join(","))
}

/// A double-quoted string with Go's `strconv.Quote` escapes for the characters that can occur in
/// a label value: backslash, quote, the C escapes, and `\x`/`\u`/`\U` for other control and
/// non-space whitespace characters (PromQL reads the same escapes).
pub(super) fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if c.is_control() || (c.is_whitespace() && c != ' ') => {
                let n = u32::from(c);
                if n < 0x80 {
                    out.push_str(&format!("\\x{n:02x}"));
                } else if n < 0x10000 {
                    out.push_str(&format!("\\u{n:04x}"));
                } else {
                    out.push_str(&format!("\\U{n:08x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A float as Go's `%g` renders it: the shortest digits that round-trip, in exponent form
/// (`1e+06`, `2.5e-05`) when the decimal exponent is below −4 or at least 6.
pub(super) fn go_g(x: f64) -> String {
    if x.is_nan() {
        return "NaN".to_owned();
    }
    if x.is_infinite() {
        return if x > 0.0 { "+Inf" } else { "-Inf" }.to_owned();
    }
    if x == 0.0 {
        return if x.is_sign_negative() { "-0" } else { "0" }.to_owned();
    }
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    if (-4..6).contains(&exp) {
        format!("{x}")
    } else {
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{mantissa}e{sign}{:02}", exp.unsigned_abs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn saturation_queries() {
        let promql = |q: [Query; 2]| q.map(|q| q.promql);
        assert_eq!(
            promql(saturation("p1", None)),
            [
                r#"1 - max(llm_d_epp_flow_control_pool_saturation{inference_pool="p1"})"#,
                r#"1 - inference_extension_flow_control_pool_saturation{inference_pool="p1"}"#,
            ]
        );
        assert_eq!(
            promql(saturation("p1", Some("ns"))),
            [
                r#"1 - max(llm_d_epp_flow_control_pool_saturation{inference_pool="p1",namespace="ns"})"#,
                r#"1 - inference_extension_flow_control_pool_saturation{inference_pool="p1",namespace="ns"}"#,
            ]
        );
    }

    #[test]
    fn budget_queries() {
        let promql = |q: [Query; 6]| q.map(|q| q.promql);
        assert_eq!(
            promql(budget_cascade("p1", None, 100.0)),
            [
                r#"1 - (sum(llm_d_epp_flow_control_queue_size{inference_pool="p1"}) / on() (sum(llm_d_epp_ready_endpoints{name="p1"}) * 100))"#,
                r#"1 - (sum(inference_extension_flow_control_queue_size{inference_pool="p1"}) / on() (sum(inference_pool_ready_pods{name="p1"}) * 100))"#,
                r#"1 - (avg by(name)(llm_d_epp_per_endpoint_queue_size{name="p1"}) / 100)"#,
                r#"1 - (avg by(name)(inference_pool_per_pod_queue_size{name="p1"}) / 100)"#,
                r#"1 - (sum(vllm:num_requests_running{inference_pool="p1"}) / on() (sum(llm_d_epp_ready_endpoints{name="p1"}) * 100))"#,
                r#"1 - (sum(vllm:num_requests_running{inference_pool="p1"}) / on() (sum(inference_pool_ready_pods{name="p1"}) * 100))"#,
            ]
        );
        let with_ns = budget_cascade("p1", Some("prod"), 2.5e6);
        assert_eq!(
            with_ns[0].promql,
            r#"1 - (sum(llm_d_epp_flow_control_queue_size{inference_pool="p1",namespace="prod"}) / on() (sum(llm_d_epp_ready_endpoints{name="p1",namespace="prod"}) * 2.5e+06))"#
        );
        assert_eq!(
            with_ns[3].promql,
            r#"1 - (avg by(name)(inference_pool_per_pod_queue_size{name="p1",namespace="prod"}) / 2.5e+06)"#
        );
        // Each query says what it reads: new names before old at every step.
        let metrics: Vec<[&str; 2]> = with_ns.iter().map(|q| q.metrics).collect();
        assert_eq!(
            metrics,
            [
                [names::QUEUE_SIZE, names::READY_ENDPOINTS],
                [names::OLD_QUEUE_SIZE, names::OLD_READY_PODS],
                [names::PER_ENDPOINT_QUEUE_SIZE; 2],
                [names::OLD_PER_POD_QUEUE_SIZE; 2],
                [names::VLLM_RUNNING, names::READY_ENDPOINTS],
                [names::VLLM_RUNNING, names::OLD_READY_PODS],
            ]
        );
    }

    #[test]
    fn selector_sorts_and_quotes() {
        assert_eq!(selector("m", &[]), "m");
        assert_eq!(
            selector("m", &[("z", "1"), ("a", "x\"y\\z\n")]),
            r#"m{a="x\"y\\z\n",z="1"}"#
        );
        assert_eq!(
            go_quote("tab\there\u{1}é\u{a0}"),
            r#""tab\there\x01é\u00a0""#
        );
    }

    #[test]
    fn formats_like_go_g() {
        for (x, want) in [
            (100.0, "100"),
            (2.5, "2.5"),
            (0.1, "0.1"),
            (123456.0, "123456"),
            (1e6, "1e+06"),
            (1234567.0, "1.234567e+06"),
            (1e21, "1e+21"),
            (0.0001, "0.0001"),
            (0.00001, "1e-05"),
            (1.5e-300, "1.5e-300"),
            (-7.0, "-7"),
            (0.0, "0"),
        ] {
            assert_eq!(go_g(x), want, "{x}");
        }
    }
}
