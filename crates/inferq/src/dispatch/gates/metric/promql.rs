//! The PromQL text the `prometheus-saturation` and `prometheus-budget` gates send, built exactly
//! as the Go processor builds it (go-compat §6.5): label matchers sorted by name, values quoted
//! like Go's `strconv.Quote`, the concurrency rendered like Go's `%g`. Pool name, namespace and
//! concurrency enter; query strings leave.

/// `1 - inference_extension_flow_control_pool_saturation{…}`: the pool's spare capacity.
pub(super) fn saturation(pool: &str, namespace: Option<&str>) -> String {
    format!(
        "1 - {}",
        selector(
            "inference_extension_flow_control_pool_saturation",
            &matchers("inference_pool", pool, namespace)
        )
    )
}

/// The three queries of the `prometheus-budget` cascade, most precise first: the flow-control
/// queue against ready pods, the per-pod queue average, then running vLLM requests against ready
/// pods. Each yields `1 − load / capacity`.
pub(super) fn budget_cascade(
    pool: &str,
    namespace: Option<&str>,
    max_concurrency: f64,
) -> [String; 3] {
    let mc = go_g(max_concurrency);
    let by_pool = matchers("inference_pool", pool, namespace);
    let by_name = matchers("name", pool, namespace);
    let ready = selector("inference_pool_ready_pods", &by_name);
    [
        format!(
            "1 - (sum by(inference_pool)({}) / on() ({ready} * {mc}))",
            selector("inference_extension_flow_control_queue_size", &by_pool)
        ),
        format!(
            "1 - (avg by(name)({}) / {mc})",
            selector("inference_pool_per_pod_queue_size", &by_name)
        ),
        format!(
            "1 - (sum({}) / on() ({ready} * {mc}))",
            selector("vllm:num_requests_running", &by_pool)
        ),
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
        assert_eq!(
            saturation("p1", None),
            r#"1 - inference_extension_flow_control_pool_saturation{inference_pool="p1"}"#
        );
        assert_eq!(
            saturation("p1", Some("ns")),
            r#"1 - inference_extension_flow_control_pool_saturation{inference_pool="p1",namespace="ns"}"#
        );
    }

    #[test]
    fn budget_queries() {
        assert_eq!(
            budget_cascade("p1", None, 100.0),
            [
                r#"1 - (sum by(inference_pool)(inference_extension_flow_control_queue_size{inference_pool="p1"}) / on() (inference_pool_ready_pods{name="p1"} * 100))"#,
                r#"1 - (avg by(name)(inference_pool_per_pod_queue_size{name="p1"}) / 100)"#,
                r#"1 - (sum(vllm:num_requests_running{inference_pool="p1"}) / on() (inference_pool_ready_pods{name="p1"} * 100))"#,
            ]
        );
        assert_eq!(
            budget_cascade("p1", Some("prod"), 2.5e6),
            [
                r#"1 - (sum by(inference_pool)(inference_extension_flow_control_queue_size{inference_pool="p1",namespace="prod"}) / on() (inference_pool_ready_pods{name="p1",namespace="prod"} * 2.5e+06))"#,
                r#"1 - (avg by(name)(inference_pool_per_pod_queue_size{name="p1",namespace="prod"}) / 2.5e+06)"#,
                r#"1 - (sum(vllm:num_requests_running{inference_pool="p1",namespace="prod"}) / on() (inference_pool_ready_pods{name="p1",namespace="prod"} * 2.5e+06))"#,
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
