//! A small parser for the Prometheus text exposition format (version 0.0.4), enough for the
//! `endpoint-scrape` gate: a `/metrics` page enters as text; the values of one family's samples
//! whose labels match the gate's filters leave.
//!
//! Understood: `# TYPE` lines (other `#` lines, `# HELP` included, are comments), blank lines,
//! and sample lines `name{label="value",…} value [timestamp]`, with `\\`, `\"` and `\n` escapes
//! in label values, a quoted metric name inside the braces (`{"my.metric",a="b"}`), and the
//! special values `+Inf`, `-Inf` and `NaN`. A malformed line fails the whole page, as the Go
//! parser does.

use std::collections::HashMap;

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// A parsed page.
#[derive(Debug, Default)]
pub(super) struct Page {
    samples: Vec<Sample>,
    /// Family name → declared type (`counter`, `gauge`, `histogram`, …).
    types: HashMap<String, String>,
}

const TYPES: [&str; 6] = [
    "counter",
    "gauge",
    "histogram",
    "gaugehistogram",
    "summary",
    "untyped",
];

impl Page {
    /// The values, in page order, of the samples of family `metric` whose labels equal every
    /// filter (an absent label counts as empty, as in Go). Only counter, gauge and untyped
    /// families have values; histogram and summary series (`_bucket`, `_sum`, `_count`, …) are
    /// part of their family and never match.
    pub(super) fn values(&self, metric: &str, filters: &[(String, String)]) -> Vec<f64> {
        if !self.is_simple_family(metric) {
            return Vec::new();
        }
        self.samples
            .iter()
            .filter(|s| s.name == metric)
            .filter(|s| {
                filters.iter().all(|(k, v)| {
                    let actual = s.labels.iter().find(|(n, _)| n == k).map(|(_, x)| x);
                    actual.map_or("", String::as_str) == v
                })
            })
            .map(|s| s.value)
            .collect()
    }

    fn is_simple_family(&self, metric: &str) -> bool {
        if let Some(t) = self.types.get(metric) {
            return matches!(t.as_str(), "counter" | "gauge" | "untyped");
        }
        let complex = |base: &str| {
            self.types
                .get(base)
                .is_some_and(|t| matches!(t.as_str(), "histogram" | "gaugehistogram" | "summary"))
        };
        !["_bucket", "_sum", "_count", "_gcount", "_gsum", "_created"]
            .iter()
            .filter_map(|suffix| metric.strip_suffix(suffix))
            .any(complex)
    }
}

/// Parses a page; the error names the offending line.
pub(super) fn parse(text: &str) -> Result<Page, String> {
    let mut page = Page::default();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_start_matches([' ', '\t']);
        let at = |e: String| format!("line {}: {e}", i + 1);
        if line.trim_end().is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let mut words = comment.split_ascii_whitespace();
            if words.next() == Some("TYPE") {
                let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                    return Err(at("TYPE line needs a name and a type".to_owned()));
                };
                if !TYPES.contains(&kind) {
                    return Err(at(format!("unknown metric type {kind:?}")));
                }
                page.types.insert(name.to_owned(), kind.to_owned());
            }
            continue;
        }
        page.samples.push(sample(line).map_err(at)?);
    }
    Ok(page)
}

/// Parses a float as Prometheus writes them (`+Inf`, `-Inf`, `NaN`, or a decimal number).
pub(super) fn parse_value(s: &str) -> Option<f64> {
    match s {
        "+Inf" | "Inf" | "+inf" | "inf" => Some(f64::INFINITY),
        "-Inf" | "-inf" => Some(f64::NEG_INFINITY),
        "NaN" | "nan" => Some(f64::NAN),
        _ if s
            .bytes()
            .all(|b| b.is_ascii_digit() || b"+-.eE".contains(&b)) =>
        {
            s.parse().ok()
        }
        _ => None,
    }
}

/// A cursor over one sample line.
struct Cursor<'a> {
    rest: &'a str,
}

impl<'a> Cursor<'a> {
    fn skip_blanks(&mut self) {
        self.rest = self.rest.trim_start_matches([' ', '\t']);
    }

    fn eat(&mut self, c: char) -> bool {
        match self.rest.strip_prefix(c) {
            Some(rest) => {
                self.rest = rest;
                true
            }
            None => false,
        }
    }

    fn peek(&self) -> Option<char> {
        self.rest.chars().next()
    }

    /// A bare name: `[a-zA-Z_:][a-zA-Z0-9_:]*` (colons only when `colons`).
    fn name(&mut self, colons: bool) -> Option<&'a str> {
        let ok = |i: usize, c: char| {
            c.is_ascii_alphabetic()
                || c == '_'
                || (colons && c == ':')
                || (i > 0 && c.is_ascii_digit())
        };
        let end = self
            .rest
            .char_indices()
            .find(|&(i, c)| !ok(i, c))
            .map_or(self.rest.len(), |(i, _)| i);
        if end == 0 {
            return None;
        }
        let (name, rest) = self.rest.split_at(end);
        self.rest = rest;
        Some(name)
    }

    /// A double-quoted string with `\\`, `\"` and `\n` escapes.
    fn quoted(&mut self) -> Result<String, String> {
        if !self.eat('"') {
            return Err("expected '\"'".to_owned());
        }
        let mut out = String::new();
        let mut chars = self.rest.char_indices();
        while let Some((i, c)) = chars.next() {
            match c {
                '"' => {
                    self.rest = &self.rest[i + 1..];
                    return Ok(out);
                }
                '\\' => match chars.next() {
                    Some((_, '\\')) => out.push('\\'),
                    Some((_, '"')) => out.push('"'),
                    Some((_, 'n')) => out.push('\n'),
                    Some((_, other)) => return Err(format!("invalid escape \\{other}")),
                    None => break,
                },
                c => out.push(c),
            }
        }
        Err("unterminated quoted string".to_owned())
    }

    /// The next blank-separated token.
    fn token(&mut self) -> Option<&'a str> {
        self.skip_blanks();
        let end = self.rest.find([' ', '\t']).unwrap_or(self.rest.len());
        if end == 0 {
            return None;
        }
        let (token, rest) = self.rest.split_at(end);
        self.rest = rest;
        Some(token)
    }
}

fn sample(line: &str) -> Result<Sample, String> {
    let mut cur = Cursor { rest: line };
    let mut name = cur.name(true).map(str::to_owned);
    cur.skip_blanks();
    let mut labels = Vec::new();
    if cur.eat('{') {
        loop {
            cur.skip_blanks();
            if cur.eat('}') {
                break;
            }
            let label = if cur.peek() == Some('"') {
                let quoted = cur.quoted()?;
                cur.skip_blanks();
                if cur.peek() != Some('=') {
                    // A quoted metric name, `{"my.metric", …}`.
                    if name.is_some() {
                        return Err("metric name given twice".to_owned());
                    }
                    name = Some(quoted);
                    cur.skip_blanks();
                    if !cur.eat(',') && cur.peek() != Some('}') {
                        return Err("expected ',' or '}' after the metric name".to_owned());
                    }
                    continue;
                }
                quoted
            } else {
                cur.name(false)
                    .ok_or_else(|| format!("bad label name at {:?}", cur.rest))?
                    .to_owned()
            };
            cur.skip_blanks();
            if !cur.eat('=') {
                return Err(format!("expected '=' after label {label:?}"));
            }
            cur.skip_blanks();
            let value = cur.quoted()?;
            labels.push((label, value));
            cur.skip_blanks();
            if !cur.eat(',') && cur.peek() != Some('}') {
                return Err("expected ',' or '}' in the label set".to_owned());
            }
        }
    }
    let name = name.ok_or_else(|| "missing metric name".to_owned())?;
    let raw = cur
        .token()
        .ok_or_else(|| format!("missing value for {name}"))?;
    let value = parse_value(raw).ok_or_else(|| format!("bad value {raw:?} for {name}"))?;
    if let Some(ts) = cur.token() {
        ts.parse::<i64>()
            .map_err(|_| format!("bad timestamp {ts:?} for {name}"))?;
    }
    if cur.token().is_some() {
        return Err(format!("unexpected text after the sample of {name}"));
    }
    Ok(Sample {
        name,
        labels,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filters(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const PAGE: &str = r#"# HELP vllm:num_requests_running Number of requests "running".
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m1",pod="a"} 3
vllm:num_requests_running{model_name="m1",pod="b"} 4.5 1712345678000
  vllm:num_requests_running { model_name = "m2" , pod="c", } 7
# a free comment
weird{path="C:\\dir",quote="say \"hi\"",nl="a\nb"} +Inf
nan_metric NaN
neg -Inf 17
# TYPE lat histogram
lat_bucket{le="+Inf"} 9
lat_sum 4.2
lat_count 9
# TYPE rt summary
rt{quantile="0.5"} 0.1
rt_count 3
{"dotted.name",zone="x"} 1e3
plain_counter_total 12
"#;

    #[test]
    fn parses_a_page() {
        let page = parse(PAGE).unwrap();
        let running = "vllm:num_requests_running";
        assert_eq!(page.values(running, &[]), vec![3.0, 4.5, 7.0]);
        assert_eq!(
            page.values(running, &filters(&[("model_name", "m1")])),
            vec![3.0, 4.5]
        );
        assert_eq!(
            page.values(running, &filters(&[("model_name", "m1"), ("pod", "b")])),
            vec![4.5]
        );
        assert!(page.values(running, &filters(&[("pod", "zz")])).is_empty());
        // An absent label is empty, as in Go.
        assert_eq!(
            page.values("plain_counter_total", &filters(&[("x", "")])),
            vec![12.0]
        );

        let weird = &page.samples[3];
        assert_eq!(weird.name, "weird");
        assert_eq!(
            weird.labels,
            filters(&[
                ("path", r"C:\dir"),
                ("quote", r#"say "hi""#),
                ("nl", "a\nb")
            ])
        );
        assert_eq!(weird.value, f64::INFINITY);
        assert!(page.values("nan_metric", &[])[0].is_nan());
        assert_eq!(page.values("neg", &[]), vec![f64::NEG_INFINITY]);
        assert_eq!(
            page.values("dotted.name", &filters(&[("zone", "x")])),
            vec![1000.0]
        );

        // Histogram and summary series belong to their family and never match.
        for name in [
            "lat",
            "lat_bucket",
            "lat_sum",
            "lat_count",
            "rt",
            "rt_count",
        ] {
            assert!(page.values(name, &[]).is_empty(), "{name}");
        }
        assert!(page.values("absent", &[]).is_empty());
    }

    #[test]
    fn rejects_malformed_lines() {
        for (bad, why) in [
            ("m{a=\"x} 1", "unterminated"),
            ("m{a=\"\\t\"} 1", "invalid escape"),
            ("m{a} 1", "expected '='"),
            ("m", "missing value"),
            ("m abc", "bad value"),
            ("m 1 soon", "bad timestamp"),
            ("m 1 2 3", "unexpected text"),
            ("# TYPE m gauges", "unknown metric type"),
            ("{a=\"b\"} 1", "missing metric name"),
        ] {
            let err = parse(&format!("ok 1\n{bad}\n")).unwrap_err();
            assert!(err.starts_with("line 2: "), "{bad}: {err}");
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn special_values() {
        assert_eq!(parse_value("+Inf"), Some(f64::INFINITY));
        assert_eq!(parse_value("-Inf"), Some(f64::NEG_INFINITY));
        assert!(parse_value("NaN").is_some_and(f64::is_nan));
        assert_eq!(parse_value("-1.5e-3"), Some(-0.0015));
        assert_eq!(parse_value("infinity"), None);
        assert_eq!(parse_value(""), None);
    }
}
