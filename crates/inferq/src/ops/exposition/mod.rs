//! The `/metrics` page as the Go processor serves it: Prometheus text format 0.0.4 as
//! client_golang's `promhttp` writes it (controller-runtime does not enable OpenMetrics; its
//! `Content-Type` is [`super::accept`]'s). The registry enters; the page leaves.
//!
//! `prometheus-client` writes the 0.0.4 text (counters' HELP/TYPE under their `_total` name,
//! info metrics as gauges, no `# EOF`, `# UNIT`, `_created` or exemplars); this module reads it
//! back and writes it in Go's order and spelling:
//! - families sorted by name, and a family without a series left out (Go's `Gather`);
//! - a series' labels sorted by name (client_golang's `MakeLabelPairs`), `le` last, and the
//!   series of a family sorted by their label values (Go's `metricSorter`);
//! - every sample value and `le` bound in Go's float spelling ([`super::gofloat`]).
//!
//! HELP text and label values keep the escaping both writers share (backslash and newline;
//! double quote too in label values).

use std::cmp::Ordering;
use std::collections::HashMap;

use prometheus_client::encoding::prometheus_text;
use prometheus_client::registry::Registry;

use super::gofloat::write_go_float;

/// Why the page could not be written.
#[derive(Debug, thiserror::Error)]
pub enum ExpositionError {
    #[error("encoding the registry failed")]
    Encode(#[from] std::fmt::Error),
    #[error("unreadable exposition line {line:?}: {reason}")]
    Line { line: String, reason: &'static str },
}

/// The registry's page in Go's 0.0.4 text.
pub fn encode(registry: &Registry) -> Result<String, ExpositionError> {
    let mut text = String::new();
    prometheus_text::encode(&mut text, registry)?;
    rewrite(&text)
}

/// A series' labels: names and unescaped values.
type Labels<'a> = Vec<(&'a str, String)>;

/// One metric family of the page.
struct Family<'a> {
    name: &'a str,
    /// As written (already escaped).
    help: &'a str,
    kind: &'a str,
    series: Vec<Series<'a>>,
    /// Label set → index in `series`.
    index: HashMap<Labels<'a>, usize>,
}

/// The samples of one label set (a histogram's buckets, sum and count).
struct Series<'a> {
    /// Sorted by name; `le` is not one of them.
    labels: Labels<'a>,
    samples: Vec<Sample<'a>>,
}

struct Sample<'a> {
    name: &'a str,
    le: Option<f64>,
    value: f64,
}

/// Reads `prometheus-client`'s 0.0.4 text and writes it in Go's order and spelling.
fn rewrite(text: &str) -> Result<String, ExpositionError> {
    let mut families = read(text)?;
    families.retain(|f| !f.series.is_empty());
    families.sort_by(|a, b| a.name.cmp(b.name));
    let mut out = String::with_capacity(text.len());
    for family in &mut families {
        family
            .series
            .sort_by(|a, b| go_series_order(&a.labels, &b.labels));
        write_family(&mut out, family);
    }
    Ok(out)
}

fn read(text: &str) -> Result<Vec<Family<'_>>, ExpositionError> {
    let mut families: Vec<Family> = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        let bad = |reason| ExpositionError::Line {
            line: line.to_owned(),
            reason,
        };
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            families.push(Family {
                name,
                help,
                kind: "untyped",
                series: Vec::new(),
                index: HashMap::new(),
            });
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest
                .split_once(' ')
                .ok_or_else(|| bad("a TYPE line without a type"))?;
            match families.last_mut() {
                Some(family) if family.name == name => family.kind = kind,
                _ => families.push(Family {
                    name,
                    help: "",
                    kind,
                    series: Vec::new(),
                    index: HashMap::new(),
                }),
            }
        } else if line.starts_with('#') {
            continue;
        } else {
            let family = families
                .last_mut()
                .ok_or_else(|| bad("a sample before any family"))?;
            let (name, mut labels, value) = sample(line).map_err(bad)?;
            let le = match labels.iter().position(|(k, _)| *k == "le") {
                Some(i) => {
                    Some(number(&labels.remove(i).1).ok_or_else(|| bad("an unreadable le"))?)
                }
                None => None,
            };
            labels.sort_by(|a, b| a.0.cmp(b.0));
            let at = match family.index.get(&labels) {
                Some(&at) => at,
                None => {
                    family.index.insert(labels.clone(), family.series.len());
                    family.series.push(Series {
                        labels,
                        samples: Vec::new(),
                    });
                    family.series.len() - 1
                }
            };
            if let Some(series) = family.series.get_mut(at) {
                series.samples.push(Sample { name, le, value });
            }
        }
    }
    Ok(families)
}

/// `name{k="v",…} value` as its name, its labels (unescaped) and its value.
fn sample(line: &str) -> Result<(&str, Labels<'_>, f64), &'static str> {
    let name_end = line.find(['{', ' ']).ok_or("a sample without a value")?;
    let (name, mut rest) = line.split_at(name_end);
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        rest = inner;
        loop {
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, quoted) = rest
                .split_once("=\"")
                .ok_or("a label without a quoted value")?;
            let (value, after) = unquote(quoted).ok_or("an unterminated label value")?;
            labels.push((key, value));
            rest = after.strip_prefix(',').unwrap_or(after);
        }
    }
    let value = rest
        .strip_prefix(' ')
        .and_then(number)
        .ok_or("an unreadable value")?;
    Ok((name, labels, value))
}

/// The value of a quoted label value (after its opening quote) and what follows its closing one.
fn unquote(s: &str) -> Option<(String, &str)> {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((out, &s[i + 1..])),
            '\\' => match chars.next()?.1 {
                'n' => out.push('\n'),
                other => out.push(other),
            },
            c => out.push(c),
        }
    }
    None
}

fn number(s: &str) -> Option<f64> {
    match s {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        _ => s.parse().ok(),
    }
}

/// Go's `metricSorter`: fewer labels first, then the label values in label-name order.
fn go_series_order(a: &[(&str, String)], b: &[(&str, String)]) -> Ordering {
    a.len()
        .cmp(&b.len())
        .then_with(|| a.iter().map(|(_, v)| v).cmp(b.iter().map(|(_, v)| v)))
}

fn write_family(out: &mut String, family: &Family) {
    for (tag, text) in [("HELP", family.help), ("TYPE", family.kind)] {
        out.push_str("# ");
        out.push_str(tag);
        out.push(' ');
        out.push_str(family.name);
        out.push(' ');
        out.push_str(text);
        out.push('\n');
    }
    for series in &family.series {
        for sample in &series.samples {
            out.push_str(sample.name);
            if !series.labels.is_empty() || sample.le.is_some() {
                let mut separator = '{';
                for (key, value) in &series.labels {
                    out.push(separator);
                    out.push_str(key);
                    out.push_str("=\"");
                    escape_label_value(out, value);
                    out.push('"');
                    separator = ',';
                }
                if let Some(le) = sample.le {
                    out.push(separator);
                    out.push_str("le=\"");
                    write_go_float(out, le);
                    out.push('"');
                }
                out.push('}');
            }
            out.push(' ');
            write_go_float(out, sample.value);
            out.push('\n');
        }
    }
}

/// Appends `value` escaped as a label value of the text format (backslash, double quote,
/// newline); the simulator's page uses it too.
pub fn escape_label_value(out: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests;
